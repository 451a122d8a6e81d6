"""Thin inotify shell shared by discovery and the kubelet watcher, and their common loop.

`Inotify` (inotify.py) reads the events of a pyinotify WatchManager in our own poll loop.
`DirWatch` keeps a watch on a directory that may be missing, vanish, come back,
or be replaced by another directory, symlink target or mount: it watches the
parent for the name and re-adds the watch whenever the directory's identity
changes, which it stat()s again only when an event, a mount change or a timer
gives a reason. Callers treat every event as "look again" (level-triggered).
"""

from __future__ import annotations

import os
import select
import signal
import stat
import time
from collections.abc import Callable, Iterable

import pyinotify

from colad.config import config
from colad.config.config import Config
from colad.core import constants
from colad.core.errors import ConfigError
from colad.queue.client import QueueClient, StatsReporter
from colad.runtime import dirpath, log, proc
from colad.watchers.inotify import INSTANCES, WATCHES, Inotify, InotifyEvent

LOG = log.get(__name__)

# Events that mean "the watched directory itself is gone or no longer the same".
SELF_GONE = pyinotify.IN_IGNORED | pyinotify.IN_DELETE_SELF | pyinotify.IN_MOVE_SELF | pyinotify.IN_UNMOUNT
NAME_EVENTS = pyinotify.IN_CREATE | pyinotify.IN_DELETE | pyinotify.IN_MOVED_FROM | pyinotify.IN_MOVED_TO
# A directory whose entries, their attributes, or the directory itself changed.
DIR_CHANGE_EVENTS = NAME_EVENTS | pyinotify.IN_ATTRIB | pyinotify.IN_DELETE_SELF | pyinotify.IN_MOVE_SELF
# A wake-up stat()s every watched directory after this many seconds: a change above a parent sends no event.
RECHECK_INTERVAL = 1.0


def poll(fds: Iterable[int | None], timeout: float | None, *, priority: Iterable[int | None] = ()) -> set[int]:
    """Wait until one of `fds` is readable, one of `priority` has a priority event, or `timeout` passes.

    `priority` is for /proc/self/mountinfo, which is always readable and reports
    a mount-table change as POLLPRI|POLLERR: polling it for POLLIN would spin.
    """
    poller = select.poll()
    for fd in fds:
        if fd is not None:
            poller.register(fd, select.POLLIN | select.POLLHUP | select.POLLERR)
    for fd in priority:
        if fd is not None:
            poller.register(fd, select.POLLPRI)
    ms = None if timeout is None else max(0, int(timeout * 1000))
    try:
        return {fd for fd, _ in poller.poll(ms)}
    except InterruptedError:
        return set()


def _identity(path: str) -> tuple[int, int] | None:
    try:
        st = os.stat(path)
    except (OSError, ValueError):  # ValueError: an embedded NUL; such a path is never there
        return None
    return (st.st_dev, st.st_ino) if stat.S_ISDIR(st.st_mode) else None  # one stat(), as isdir() would follow


class DirWatch:
    """A watch on the directory `configured` leads to, resolved by dirpath's one rule at every look."""

    def __init__(self, inotify: Inotify, path: str, mask: int) -> None:
        self.inotify = inotify
        self.configured = path
        self.path = dirpath.resolve(path)  # what is watched, and what the role lists and reads
        self.parent, self.name = dirpath.entry(path)
        self.mask = mask | pyinotify.IN_ONLYDIR
        self.wd: int | None = None
        self.parent_wd: int | None = None
        self.identity: tuple[int, int] | None = None
        self.stale = True  # note() saw an event that may mean a new identity: stat() it again
        self.checked = -1  # the inotify generation of the last stat()

    @property
    def present(self) -> bool:
        return self.identity is not None

    def ensure(self) -> bool:
        """(Re)establish the watches; True when the directory's identity changed."""
        if not self.stale and self.checked == self.inotify.generation and None not in (self.wd, self.parent_wd):
            return False  # both watches hold, and no event, mount change or timer since the last stat()
        self.stale, self.checked = False, self.inotify.generation
        # Resolved again: a link on the way may point elsewhere now (an event on its name, or the timer).
        path, parent = dirpath.resolve(self.configured), dirpath.entry(self.configured)
        if parent != (self.parent, self.name):
            self.inotify.forget(self.parent)
            self.parent, self.name = parent
            self.parent_wd = None  # the old one is left to the kernel: another DirWatch may share it
        moved = path != self.path
        if moved:
            self.inotify.forget(self.path)
            self.path = path
            if self.wd is not None:
                self.inotify.remove(self.wd)
                self.wd = None
        if self.parent_wd is None:
            self.parent_wd = self.inotify.add(self.parent, NAME_EVENTS | pyinotify.IN_ONLYDIR)
        identity = _identity(self.path)
        if not moved and identity == self.identity and (identity is None or self.wd is not None):
            return False
        if self.wd is not None:
            self.inotify.remove(self.wd)
            self.wd = None
        if identity is not None:
            self.wd = self.inotify.add(self.path, self.mask)
            if self.wd is None and self.inotify.limit is None:
                identity = None  # vanished between stat and add_watch; the parent watch will tell us
        if identity is None:
            self.inotify.forget(self.path)  # nothing to watch there now: the parent's watch tells when there is
        changed = moved or identity != self.identity
        if changed:
            LOG.info(
                "watching directory" if identity else "directory absent", path=self.path, configured=self.configured
            )
        self.identity = identity
        return changed

    def concerns(self, event: InotifyEvent) -> bool:
        """Is this event about our directory or its contents (or an overflow)?"""
        if event.overflow:
            return True
        if event.wd == self.wd:
            return True
        return event.wd == self.parent_wd and event.name == self.name

    def close(self) -> None:
        """Stop watching the directory. The parent's watch stays: another DirWatch may share it."""
        if self.wd is not None:
            self.inotify.remove(self.wd)
            self.wd = None
        self.inotify.forget(self.path)
        self.identity = None

    def note(self, event: InotifyEvent) -> None:
        """Mark the directory stale on an event that may mean a new identity (about the directory itself,
        its name in the parent, an overflow); drop a watch the kernel has removed, so ensure() re-adds it."""
        gone = event.mask & SELF_GONE
        if event.wd == self.wd:
            self.stale = self.stale or not event.name  # an entry's event leaves the identity as it was
            if gone:
                if not event.mask & pyinotify.IN_IGNORED:
                    self.inotify.remove(event.wd)  # moved away, the kernel still watches it: let go
                self.wd, self.identity = None, None
        elif event.wd == self.parent_wd:
            self.stale = self.stale or event.name == self.name or bool(gone)
            if gone:
                self.parent_wd = None
        elif event.overflow:
            self.stale = True


Handler = Callable[[int, object], None]


class SignalWaker:
    """Makes a blocking poll() return when a signal arrives (PEP 475 would resume it), or on wake().

    `handlers` are installed, then their signals unblocked: `colad` blocks them at its
    first instruction, so a SIGHUP or SIGTERM sent during start-up waits, pending, and
    is handled here instead of killing the role. `signals=False` gives the bare pipe,
    for a loop run outside the main thread (tests).
    """

    def __init__(self, *, signals: bool = True, handlers: dict[int, Handler] | None = None) -> None:
        self.read_fd, self.write_fd = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        if signals:
            signal.set_wakeup_fd(self.write_fd, warn_on_full_buffer=False)
            for signum, handler in (handlers or {}).items():
                signal.signal(signum, handler)
            if handlers:
                # Harmless when nothing was blocked; a pending signal runs its handler now.
                signal.pthread_sigmask(signal.SIG_UNBLOCK, set(handlers))

    def wake(self) -> None:
        os.write(self.write_fd, b"x")

    def close(self) -> None:
        os.close(self.read_fd)
        os.close(self.write_fd)

    def fileno(self) -> int:
        return self.read_fd

    def drain(self) -> None:
        try:
            while os.read(self.read_fd, 512):
                pass
        except BlockingIOError:
            pass


class MountWatch:
    """Readable (POLLPRI/POLLERR) whenever the mount table changes, as /proc/self/mountinfo promises.

    A filesystem mounted over a watched directory sends no inotify event into
    it; this is how the watcher learns to look at the directory's identity again.
    """

    def __init__(self, path: str = "/proc/self/mountinfo") -> None:
        try:
            self.handle: object = open(path, "rb")  # noqa: SIM115 - kept open for poll()
        except OSError:
            self.handle = None

    def fileno(self) -> int | None:
        return self.handle.fileno() if self.handle is not None else None  # type: ignore[attr-defined]

    def drain(self) -> None:
        """Re-read the table, which re-arms the notification."""
        if self.handle is not None:
            try:
                self.handle.seek(0)  # type: ignore[attr-defined]
                self.handle.read()  # type: ignore[attr-defined]
            except OSError as exc:  # the next identity check still happens; the table is only a hint
                LOG.warning("cannot re-read the mount table", error=exc)


class WatcherLoop:
    """What discovery and kubelet-watch share: one poll over inotify, the queue link, signals
    and the mount table; the run-directory watch that reconnects as soon as queue.sock
    reappears; the epoch and sequence of the role's messages; stats and flushing.

    A role calls `wait()` for this turn's inotify events (None when stopping), handles
    its own, then `finish()`. `run_role()` is the common main().
    """

    def __init__(self, cfg: Config, role: str, *, client: QueueClient | None = None) -> None:
        self.cfg = cfg
        self.role = role
        self.client = client or QueueClient(cfg.queue_socket)
        self.epoch = time.time_ns()
        self.seq = 0
        self.stats = StatsReporter(self.client, role, self.epoch)
        self.inotify = Inotify(self.stats.count)
        self.run_dir = DirWatch(self.inotify, cfg.run_dir, pyinotify.IN_CREATE | pyinotify.IN_MOVED_TO)
        self.mounts = MountWatch()
        self.mounts.drain()
        self.stopping = False
        self.reload_requested = False
        self.waker: SignalWaker | None = None
        self.recheck_at = 0.0  # monotonic time after which a wake-up stat()s every watched directory
        self.degraded: str | None = None  # the inotify limit that keeps a watch out: the role polls

    def inotifies(self) -> list[Inotify]:
        """Every inotify instance of the role (discovery has a second, for host paths)."""
        return [self.inotify]

    def note_limits(self) -> bool:
        """Try again what a kernel inotify limit refused; enter or leave the degraded mode, in which the
        role looks at its directories every DEGRADED_POLL_S: one WARNING (counted) in, one INFO out.
        True when the mode changed (the Stats that say so are due)."""
        for inotify in self.inotifies():
            inotify.retry()
        held = next((i for i in self.inotifies() if i.limit is not None), None)
        limit = held.limit if held is not None else None
        if limit == self.degraded:
            return False
        for name in (INSTANCES, WATCHES):
            self.stats.counters[constants.INOTIFY_DEGRADED + name] = int(name == limit)
        if limit is not None and self.degraded is None:
            self.stats.count(constants.INOTIFY_LIMIT_REACHED)
            LOG.warning(
                "inotify limit reached: polling the watched directories instead",
                role=self.role,
                limit=f"fs.inotify.{limit}",
                error=held.error if held is not None else "",
                poll_interval_s=constants.DEGRADED_POLL_S,
            )
        elif limit is None:
            LOG.info("inotify available again: watching", role=self.role, was=f"fs.inotify.{self.degraded}")
        self.degraded = limit
        self.degraded_changed()
        return True

    def degraded_changed(self) -> None:
        """Hook: the degraded mode began, changed or ended (`self.degraded`)."""

    def wait(self, timeout: float | None) -> list[InotifyEvent] | None:
        if self.note_limits():
            timeout = 0.0  # the role's timeout came before the news: this turn reports it
        if self.degraded is not None:  # nothing would wake us for a change: look again soon
            timeout = constants.DEGRADED_POLL_S if timeout is None else min(timeout, constants.DEGRADED_POLL_S)
        waker_fd = self.waker.fileno() if self.waker else None
        fds = [self.inotify.fd, self.client.fileno(), waker_fd, *self.extra_fds()]
        readable = poll(fds, timeout, priority=[self.mounts.fileno()])
        if waker_fd in readable and self.waker:
            self.waker.drain()
        if self.stopping:
            return None
        mounted = self.mounts.fileno() in readable
        if mounted:
            self.mounts.drain()  # something was (un)mounted: every ensure() looks at identities again
        now = time.monotonic()
        if mounted or self.reload_requested or now >= self.recheck_at:  # the timer: what no event reports
            self.inotify.generation, self.recheck_at = self.inotify.generation + 1, now + RECHECK_INTERVAL
        if self.reload_requested:
            self.reload_requested = False
            self.reload()
        events = self.inotify.read() if self.inotify.fd in readable else []
        for event in events:
            self.run_dir.note(event)
            if event.wd == self.run_dir.wd and event.name == constants.QUEUE_SOCKET_NAME:
                self.client.reconnect_now()
        if self.client.fileno() in readable:
            self.client.check_alive()
        self.run_dir.ensure()
        return events

    def reload(self) -> None:
        """Re-read the config (SIGHUP): validate all of it, then apply it, or keep the running one."""
        try:
            applied, deferred = config.reload_config(self.cfg)
        except ConfigError:
            return
        previous, self.cfg = self.cfg, applied
        self.apply_config(previous)
        LOG.info("config reloaded", resources=",".join(r.name for r in applied.resources), deferred=len(deferred))

    def apply_config(self, previous: Config) -> None:
        """Hook: the role adopts `self.cfg`, which replaced `previous`."""

    def extra_fds(self) -> list[int | None]:
        """Hook: more fds whose readiness ends the wait (the role reads them itself after wait())."""
        return []

    def next_seq(self) -> int:
        self.seq += 1
        return self.seq

    def finish(self, now: float) -> None:
        """End of a turn: report counters if due, send whatever the plugin has not had yet."""
        self.seq = self.stats.report(now, self.seq + 1) - 1
        self.client.flush()

    def due(self) -> list[float]:
        return [m for m in (self.client.next_retry(), self.stats.due()) if m is not None]

    def close(self) -> None:
        self.client.close()
        self.inotify.close()


def run_role(name: str, build: Callable[[], WatcherLoop], cfg: Config, **fields: object) -> int:
    """main() of a watcher role: logging, root-only umask, die with supervisord, signals, run."""
    log.setup(name, cfg.log_level)
    proc.setup_role()
    role = build()

    def stop(signum: int, _frame: object) -> None:
        role.stopping = True

    def reload(signum: int, _frame: object) -> None:
        role.reload_requested = True

    role.waker = SignalWaker(handlers={signal.SIGTERM: stop, signal.SIGINT: stop, signal.SIGHUP: reload})
    LOG.info(f"{name} starting", queue=cfg.queue_socket, **fields)
    return int(role.run())  # type: ignore[attr-defined]
