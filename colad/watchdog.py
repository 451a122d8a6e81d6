"""Role `colad watchdog`: supervisord's event listener; starts again a role supervisord gave up on (FATAL).

Reads supervisord's event-listener protocol on stdin (PROCESS_STATE_FATAL, PROCESS_STATE_RUNNING,
TICK_5); writes only the protocol's answers on stdout (logs go to stderr) and startProcess calls on
supervisord's XML-RPC socket. Why in place, after a back-off (10 s doubling to 10 min), and not by
making supervisord exit: the plugin stays registered with the last list while discovery or the watcher
recovers, where a whole restart would withdraw every device of the node; a lasting fault costs one start
per back-off, and /healthz and `colad status` name the role meanwhile. It idles beside the roles for the
node's whole life, so it imports little: XML-RPC (http.client, email, ssl: ~4 MiB) only when it starts one.
"""

from __future__ import annotations

import logging
import os
import signal
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, BinaryIO

from colad import log, proc

if TYPE_CHECKING:
    from colad.config import Config

LOG = log.get(__name__)

BACKOFF_FIRST = 10.0
BACKOFF_MAX = 600.0
STABLE_AFTER = 300.0  # RUNNING this long, a role's next FATAL starts the back-off from the beginning again
MAX_HEADER_BYTES = 1024
MAX_PAYLOAD_BYTES = 64 * 1024  # supervisord's state payloads are ~100 bytes; more is read and dropped
RPC_TIMEOUT = 5.0
OWN_NAME = "watchdog"  # [eventlistener:watchdog] in conf/supervisord.conf


def parse_fields(text: str) -> dict[str, str]:
    """ "key:value key:value" (supervisord's header and state payloads) as a dict; junk tokens are skipped."""
    fields = {}
    for token in text.split():
        key, sep, value = token.partition(":")
        if sep and key:
            fields[key] = value
    return fields


@dataclass
class _Role:
    failures: int = 0
    restart_at: float | None = None
    running_since: float | None = None


@dataclass
class Watchdog:
    """The pure core: which process to start again, and when. Names are "group:process"."""

    roles: dict[str, _Role] = field(default_factory=dict)

    def on_event(self, eventname: str, payload: dict[str, str], now: float) -> str | None:
        """Take one event; returns a one-line description of what was decided, or None."""
        name, group = payload.get("processname", ""), payload.get("groupname", "")
        if not name or not group or name == OWN_NAME:
            return None
        key = f"{group}:{name}"
        role = self.roles.setdefault(key, _Role())
        if eventname == "PROCESS_STATE_RUNNING":
            role.running_since = now
            return None
        if eventname != "PROCESS_STATE_FATAL":
            return None
        if role.running_since is not None and now - role.running_since >= STABLE_AFTER:
            role.failures = 0
        role.running_since = None
        delay = min(BACKOFF_FIRST * 2**role.failures, BACKOFF_MAX)
        role.failures += 1
        role.restart_at = now + delay
        return f"{key} in {delay:.0f}s (FATAL {role.failures} in a row)"

    def due(self, now: float) -> list[str]:
        """Processes whose restart is due; each is handed out once."""
        names = []
        for key, role in sorted(self.roles.items()):
            if role.restart_at is not None and now >= role.restart_at:
                role.restart_at = None
                names.append(key)
        return names

    def next_due(self) -> float | None:
        times = [r.restart_at for r in self.roles.values() if r.restart_at is not None]
        return min(times) if times else None


def _read_exact(stream: BinaryIO, size: int) -> bytes | None:
    """`size` bytes (at most MAX_PAYLOAD_BYTES kept), or None at EOF."""
    kept = bytearray()
    left = size
    while left > 0:
        chunk = stream.read(min(left, 65536))
        if not chunk:
            return None
        left -= len(chunk)
        if len(kept) < MAX_PAYLOAD_BYTES:
            kept += chunk[: MAX_PAYLOAD_BYTES - len(kept)]
    return bytes(kept)


def serve(
    stdin: BinaryIO,
    stdout: BinaryIO,
    handle: Callable[[str, dict[str, str]], None],
) -> int:
    """The event-listener protocol, until EOF (supervisord is gone). No input ends it.

    READY; one header line; `len` bytes of payload; RESULT 2 OK. A header that cannot
    be parsed is answered OK as well, so supervisord never waits on us, and logged.
    """
    while True:
        stdout.write(b"READY\n")
        stdout.flush()
        line = stdin.readline(MAX_HEADER_BYTES)
        if not line:
            return 0
        text = line.decode("utf-8", "surrogateescape")
        header = parse_fields(text)
        length = header.get("len", "")
        if not line.endswith(b"\n"):  # cut at MAX_HEADER_BYTES: not a header supervisord wrote; trust none of it
            length = ""
            while line and not line.endswith(b"\n"):
                line = stdin.readline(MAX_HEADER_BYTES)
        payload = b""
        if not length.isdigit():
            LOG.warning("event header not understood; acknowledged and dropped", header=text.strip()[:200])
        else:
            read = _read_exact(stdin, int(length))
            if read is None:
                return 0
            payload = read
        stdout.write(b"RESULT 2\nOK")
        stdout.flush()
        if not length.isdigit():
            continue
        eventname = header.get("eventname", "")
        try:
            handle(eventname, parse_fields(payload.decode("utf-8", "surrogateescape")))
        except Exception:  # the loop boundary: one event must never cost the listener
            LOG.exception("watchdog event failed", eventname=eventname)


class Shell:
    """The watchdog with its side effects: the clock and supervisord's XML-RPC interface."""

    def __init__(self, cfg: Config, *, clock: Callable[[], float] = time.monotonic) -> None:
        self.core = Watchdog()
        self.clock = clock
        self.socket_path = cfg.supervisor_socket

    def handle(self, eventname: str, payload: dict[str, str]) -> None:
        decided = self.core.on_event(eventname, payload, self.clock())
        if decided is not None:
            LOG.warning("role gave up by supervisord (FATAL); starting it again after a back-off", restart=decided)
        for name in self.core.due(self.clock()):
            self.start(name)

    def start(self, name: str) -> None:
        import http.client  # here: the rare path pays for XML-RPC, not the idle listener
        import xmlrpc.client

        from colad.status import supervisor_proxy

        try:
            supervisor_proxy(self.socket_path, RPC_TIMEOUT).supervisor.startProcess(name, False)
        except xmlrpc.client.Fault as exc:
            LOG.warning("role not started again", role=name, fault=exc.faultString)
            return
        except (OSError, xmlrpc.client.Error, http.client.HTTPException) as exc:
            LOG.warning("role not started again: supervisord not answering", role=name, error=exc)
            return
        LOG.info("role started again", role=name)


def main(args: object = None, cfg: Config | None = None) -> int:
    assert cfg is not None
    signal.signal(signal.SIGHUP, signal.SIG_IGN)  # a reload is for the roles; the watchdog has nothing to re-read
    # stdout is the protocol channel: keep a private copy of it and point fd 1 at stderr,
    # so a stray print or warning from any library can never corrupt the protocol.
    protocol_out = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)
    log.setup("watchdog", cfg.log_level)
    proc.setup_role()  # root-only umask; dies with supervisord (stdin EOF would end it too)
    for handler in logging.getLogger().handlers:
        if isinstance(handler, logging.StreamHandler):
            handler.setStream(sys.stderr)
    shell = Shell(cfg)
    LOG.info("watchdog starting", supervisor=cfg.supervisor_socket, backoff_first=f"{BACKOFF_FIRST}s")
    return serve(sys.stdin.buffer, protocol_out, shell.handle)
