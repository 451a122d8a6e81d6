"""`colad supervise`: render the supervisord template and run supervisord in the foreground.

Reads the Config and the template (conf/supervisord.conf); writes <run_dir>/supervisord.conf
whole or not at all, then execs supervisord, so systemd (or the terminal) sees it as the main
process. Children get the config file's path and the keys set by flags as COLAD_* variables.
A short-lived forked waker ends supervisord's idle first poll at once (see `start_waker`).
This is what the systemd unit runs.
"""

from __future__ import annotations

import configparser
import contextlib
import os
import pwd
import socket
import stat
import string
import sys
import time
from pathlib import Path

from colad.config.config import Config
from colad.core import constants
from colad.core.errors import ConfigError, InstanceError
from colad.runtime import kubeletdir, log

LOG = log.get(__name__)

_STDOUT_LOG = """\
redirect_stderr=true
stdout_logfile=/dev/stdout
stdout_logfile_maxbytes=0"""

# Under systemd, stdout is journald's socket and /dev/stdout cannot be opened
# (ENXIO): children log through syslog instead, which reaches the same journal.
_SYSLOG_LOG = """\
redirect_stderr=true
stdout_logfile=NONE
stdout_syslog=true"""

# ${listener_log}: an event listener's log lines (stderr; its stdout is the event protocol). The
# shipped template has no listener any more (the watchdog runs inside supervisord), but a locally
# edited template from before, kept as a conffile, still names the field: it must still render.
_STDOUT_LISTENER_LOG = """\
stderr_logfile=/dev/stdout
stderr_logfile_maxbytes=0"""
_SYSLOG_LISTENER_LOG = """\
stderr_logfile=NONE
stderr_syslog=true"""


def template_path(cfg: Config) -> Path:
    if cfg.supervisord_template:
        return Path(cfg.supervisord_template)
    candidates = [
        Path(sys.prefix) / "share" / "colad" / constants.SUPERVISOR_CONF_NAME,  # pip and .deb installs
        Path(__file__).resolve().parents[2] / "conf" / constants.SUPERVISOR_CONF_NAME,  # a source checkout
    ]
    for candidate in candidates:
        if candidate.is_file():
            return candidate
    raise ConfigError(f"supervisord_template: no template found in {', '.join(map(str, candidates))}")


def stdout_is_journal() -> bool:
    """True when systemd connected our stdout to the journal (see systemd.exec, $JOURNAL_STREAM)."""
    stream = os.environ.get("JOURNAL_STREAM", "")
    device, _, inode = stream.partition(":")
    try:
        st = os.fstat(1)
    except OSError:
        return False
    return bool(inode) and f"{st.st_dev}:{st.st_ino}" == f"{device}:{inode}"


def user_name() -> str | None:
    """Our user's name, or None when the uid has no passwd entry (a container run as a bare uid)."""
    try:
        return pwd.getpwuid(os.geteuid()).pw_name
    except KeyError:
        return None


def render_conf(cfg: Config, template: str, *, journal: bool, user: str | None = "") -> str:
    """The template with its fields filled in; `user` "" looks our name up, None drops the user= line.

    supervisord refuses a user= that names no passwd entry, even our own uid, and needs
    none when it does not change user.
    """
    if user == "":
        user = user_name()
    if user is None:
        template = "\n".join(line for line in template.split("\n") if line.strip() != "user=${user}")
    fields = {
        "run_dir": cfg.run_dir,
        "python": sys.executable,
        "user": user or "",
        "child_log": _SYSLOG_LOG if journal else _STDOUT_LOG,
        "listener_log": _SYSLOG_LISTENER_LOG if journal else _STDOUT_LISTENER_LOG,
        "log_level": cfg.log_level,
    }
    try:
        return string.Template(template).substitute(fields)
    except (KeyError, ValueError) as exc:
        raise ConfigError(f"supervisord_template: bad placeholder {exc}") from None


def prepare_run_dir(cfg: Config) -> None:
    """Create the run directory root-only, and refuse to start over a live instance."""
    try:
        os.makedirs(cfg.run_dir, mode=0o700, exist_ok=True)
        st = os.stat(cfg.run_dir)
    except OSError as exc:
        raise InstanceError(f"run_dir {cfg.run_dir}: cannot create it: {exc.strerror or exc}") from None
    if not stat.S_ISDIR(st.st_mode):
        raise InstanceError(f"run_dir {cfg.run_dir}: not a directory")
    if st.st_uid != os.geteuid():
        raise InstanceError(f"run directory {cfg.run_dir} is owned by uid {st.st_uid}, not us")
    if stat.S_IMODE(st.st_mode) != 0o700:
        os.chmod(cfg.run_dir, 0o700)
    sock_path = cfg.supervisor_socket
    if os.path.lexists(sock_path):
        if kubeletdir.dial(sock_path, 1.0).live:
            raise InstanceError(f"colad is already running here (supervisord answers on {sock_path})")
        os.unlink(sock_path)  # left by a dead supervisord


def read_template(cfg: Config) -> str:
    path = template_path(cfg)
    try:
        return path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        raise ConfigError(f"supervisord_template: cannot read {path}: {reason}") from None


def write_conf(path: str, text: str) -> None:
    """Write `path` whole or not at all: a temporary file beside it, fsync, then rename."""
    tmp = f"{path}.{os.getpid()}.tmp"
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
        with os.fdopen(fd, "wb") as handle:
            handle.write(text.encode("utf-8"))
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except (OSError, UnicodeError):
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


# supervisord takes ~0.15 s from exec to its pid file; far past this something is wrong, and the
# waker's absence costs only supervisord's own one-second tick.
WAKE_DEADLINE = 10.0
WAKE_POLL_S = 0.05  # how often it looks for the pid file when no inotify watch could be added


def _parsed(conf_text: str) -> configparser.RawConfigParser:
    parser = configparser.RawConfigParser(inline_comment_prefixes=(";",), strict=False)
    parser.read_string(conf_text)
    return parser


WATCHDOG_FACTORY = "colad.supervise.watchdog:make_rpcinterface"


def has_watchdog(conf_text: str) -> bool:
    """Whether a rendered supervisord.conf loads the watchdog into supervisord ([rpcinterface:colad])."""
    try:
        parser = _parsed(conf_text)
    except configparser.Error:
        return False
    return any(
        section.startswith("rpcinterface:")
        and parser.get(section, "supervisor.rpcinterface_factory", fallback="").strip() == WATCHDOG_FACTORY
        for section in parser.sections()
    )


def wake_paths(conf_text: str) -> tuple[str, str] | None:
    """(pid file, control socket) of a rendered supervisord.conf; None when it names no literal pair."""
    try:
        parser = _parsed(conf_text)
        pidfile = parser.get("supervisord", "pidfile")
        sock = parser.get("unix_http_server", "file")
    except configparser.Error:
        return None
    if "%(" in pidfile + sock or not os.path.isabs(pidfile):  # supervisord's own expansions: not ours to guess
        return None
    return pidfile, sock


def start_waker(conf_text: str) -> int | None:
    """Fork the waker, which connects once to supervisord's control socket when supervisord is ready.

    supervisord 4.2 spawns the autostart programs in runforever() only after its first
    poll(timeout=1 s) returns, which nothing wakes on a cold start: every start waited ~1 s.
    supervisord writes its pid file after its control socket listens and its signal handlers
    are set, just before that first poll, so one connect() then ends the poll and the programs
    start. The waker is supervisord's child (we exec in place) and exits within WAKE_DEADLINE.
    """
    paths = wake_paths(conf_text)
    if paths is None:
        LOG.info("supervisord start not woken: no literal pidfile and unix_http_server file")
        return None
    sys.stdout.flush()
    parent = os.getpid()
    pid = os.fork()
    if pid:
        return pid
    code = 1
    try:
        code = wait_and_wake(parent, *paths)
    except BaseException as exc:  # a stop signal (SystemExit) or anything else: only this process ends
        LOG.warning("supervisord waker failed", error=exc)
    finally:
        sys.stdout.flush()
        os._exit(code)


def _written_by(pidfile: str, pid: int) -> bool:
    try:
        with open(pidfile, "rb") as handle:
            return handle.read(32).strip() == str(pid).encode()
    except OSError:
        return False


def wait_and_wake(parent: int, pidfile: str, sock_path: str) -> int:
    """The waker's body: wait (inotify on the pid file's directory, bounded) for `parent`'s pid file."""
    import pyinotify  # only the waker needs these, after the fork: never on the path to exec

    from colad.watchers import loop
    from colad.watchers.inotify import Inotify

    started = time.monotonic()
    inotify = Inotify()
    watched = inotify.add(
        os.path.dirname(pidfile), pyinotify.IN_CLOSE_WRITE | pyinotify.IN_MOVED_TO | pyinotify.IN_ONLYDIR
    )
    # An inotify limit in the way (shared with every root process): look at the pid file this often.
    every = WAKE_DEADLINE if watched is not None else WAKE_POLL_S
    try:
        gone: int | None = os.pidfd_open(parent)  # readable once supervisord exited
    except ProcessLookupError:
        LOG.info("supervisord waker done: supervisord exited before it started")
        return 1
    except OSError:  # no pidfd here (an old kernel, a syscall filter): the deadline alone bounds the wait
        gone = None
    while not _written_by(pidfile, parent):  # checked after the watch is added: no write can slip past
        remaining = started + WAKE_DEADLINE - time.monotonic()
        ready = loop.poll([inotify.fileno(), gone], min(remaining, every)) if remaining > 0 else set()
        if gone is not None and gone in ready:
            LOG.info("supervisord waker done: supervisord exited before it started")
            return 1
        if not ready and remaining > every:
            continue
        if not ready:
            LOG.warning("supervisord not woken: no pid file in time", pidfile=pidfile, waited_s=WAKE_DEADLINE)
            return 1
        inotify.read()
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(1.0)
        try:
            sock.connect(sock_path)
        except OSError as exc:
            LOG.warning("supervisord not woken: cannot connect", socket=sock_path, error=exc.strerror or exc)
            return 1
    waited_ms = round((time.monotonic() - started) * 1000, 1)
    LOG.info("supervisord woken", waited_ms=waited_ms, socket=sock_path, waker_pid=os.getpid())
    return 0


def main(args: object = None, cfg: Config | None = None) -> int:
    assert cfg is not None
    log.setup("supervise", cfg.log_level)
    os.umask(0o077)
    conf_path = cfg.supervisor_conf_file
    try:
        rendered = render_conf(cfg, read_template(cfg), journal=stdout_is_journal())
        prepare_run_dir(cfg)
        write_conf(conf_path, rendered)
    except (ConfigError, InstanceError) as exc:
        print(f"colad: {exc}", file=sys.stderr)
        return 2 if isinstance(exc, ConfigError) else 1
    except (OSError, UnicodeError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        print(f"colad: cannot write {conf_path}: {reason}", file=sys.stderr)
        return 1
    env = dict(os.environ)
    # Only what the environment and flags set: the children read the file themselves,
    # so a reload (re-reading it) sees its changes; flags and variables still win.
    env.update(cfg.environment(pinned_only=True))
    env["PYTHONUNBUFFERED"] = "1"
    command = [sys.executable, "-m", "supervisor.supervisord", "--nodaemon", "--configuration", conf_path]
    LOG.info("starting supervisord", config=conf_path, run_dir=cfg.run_dir)
    if not has_watchdog(rendered):  # an edited template from before the watchdog moved into supervisord
        LOG.warning(
            "no watchdog: the supervisord template has no [rpcinterface:colad]; a FATAL role stays down",
            template=str(template_path(cfg)),
            factory=WATCHDOG_FACTORY,
        )
    start_waker(rendered)
    sys.stdout.flush()
    try:
        os.execve(sys.executable, command, env)
    except OSError as exc:
        print(f"colad: cannot run supervisord ({sys.executable}): {exc.strerror or exc}", file=sys.stderr)
    return 1  # reached only when execve failed
