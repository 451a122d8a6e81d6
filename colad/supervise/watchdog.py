"""The watchdog, inside supervisord: starts again a role supervisord gave up on (FATAL), after a back-off.

supervisord calls `make_rpcinterface` once at start ([rpcinterface:colad] in conf/supervisord.conf);
it subscribes to supervisord's own events (FATAL, RUNNING, TICK_5) and starts the role in place as
startProcess does, 10 s doubling to 10 min: the plugin keeps the last list meanwhile, where a whole
restart would withdraw every device of the node. In supervisord's process, each callback catches
everything and logs one line (a bug here must never end supervisord), never blocks, imports little.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from typing import Any

from colad.runtime import log

LOG = log.get(__name__)

BACKOFF_FIRST = 10.0
RESTART_BACKOFF_MAX = 600.0
STABLE_AFTER = 300.0  # RUNNING this long, a role's next FATAL starts the back-off from the beginning again


class _Role:
    """One process' record: FATALs in a row, when its start is due, since when it runs."""

    __slots__ = ("failures", "restart_at", "running_since")  # no dataclass: inspect and ast would load in supervisord

    def __init__(self) -> None:
        self.failures = 0
        self.restart_at: float | None = None
        self.running_since: float | None = None


class Watchdog:
    """The pure core: which process to start again, and when. Names are "group:process"."""

    def __init__(self) -> None:
        self.roles: dict[str, _Role] = {}

    def running(self, name: str, now: float) -> None:
        self.roles.setdefault(name, _Role()).running_since = now

    def fatal(self, name: str, now: float) -> str:
        """Take a FATAL; returns a one-line description of what was decided."""
        role = self.roles.setdefault(name, _Role())
        if role.running_since is not None and now - role.running_since >= STABLE_AFTER:
            role.failures = 0
        role.running_since = None
        delay = min(BACKOFF_FIRST * 2**role.failures, RESTART_BACKOFF_MAX)
        role.failures += 1
        role.restart_at = now + delay
        return f"{name} in {delay:.0f}s (FATAL {role.failures} in a row)"

    def due(self, now: float) -> list[str]:
        """Processes whose restart is due; each is handed out once."""
        names = []
        for name, role in sorted(self.roles.items()):
            if role.restart_at is not None and now >= role.restart_at:
                role.restart_at = None
                names.append(name)
        return names

    def pending(self, now: float) -> list[dict[str, Any]]:
        """Each restart still to come: name, seconds until it, FATALs in a row (XML-RPC-safe values)."""
        return [
            {"name": name, "in_s": round(max(0.0, r.restart_at - now), 1), "fatal_in_a_row": r.failures}
            for name, r in sorted(self.roles.items())
            if r.restart_at is not None
        ]


def raised_at(exc: BaseException) -> str:
    """file:line where `exc` was raised: one log line names it, no traceback module, no multi-line dump."""
    tb = exc.__traceback__
    while tb is not None and tb.tb_next is not None:
        tb = tb.tb_next
    return f"{os.path.basename(tb.tb_frame.f_code.co_filename)}:{tb.tb_lineno}" if tb is not None else "-"


class InProcess:
    """The core wired into supervisord: its events in, a process start out, one log line per decision."""

    def __init__(self, supervisord: Any, core: Watchdog, *, clock: Callable[[], float] = time.monotonic) -> None:
        from supervisor import events, rpcinterface  # supervisord has them loaded already: nothing new

        self.events = events
        self.supervisord = supervisord
        self.core = core
        self.clock = clock
        self.rpc = rpcinterface.SupervisorNamespaceRPCInterface(supervisord)

    def subscribe(self) -> None:
        """Subscribe, once: supervisord's restart (its SIGHUP) clears every subscription, then asks again."""
        events = self.events
        for kind, callback in (
            (events.ProcessStateFatalEvent, self.on_state),
            (events.ProcessStateRunningEvent, self.on_state),
            (events.Tick5Event, self.on_tick),
        ):
            if (kind, callback) not in events.callbacks:
                events.subscribe(kind, callback)

    def on_state(self, event: Any) -> None:
        """FATAL or RUNNING, called inside supervisord's state change: record only, never start here."""
        try:
            process = event.process
            group = process.group.config.name if process.group is not None else process.config.name
            name = f"{group}:{process.config.name}"
            if isinstance(event, self.events.ProcessStateFatalEvent):
                decided = self.core.fatal(name, self.clock())
                LOG.warning("role gave up by supervisord (FATAL); starting it again after a back-off", restart=decided)
            else:
                self.core.running(name, self.clock())
        except Exception as exc:  # the boundary: supervisord goes on, whatever broke here
            failed("state event", exc)

    def on_tick(self, _event: Any) -> None:
        """Every 5 s, from supervisord's main loop (outside any state change): start what is due."""
        try:
            due = self.core.due(self.clock())
        except Exception as exc:
            failed("tick", exc)
            return
        for name in due:
            try:
                self.start(name)
            except Exception as exc:  # one role's failure must not cost the others their start
                failed("start", exc, role=name)

    def start(self, name: str) -> None:
        from supervisor.xmlrpc import RPCError

        try:
            self.rpc.startProcess(name, False)  # spawns, reaps, transitions; never waits (wait=False)
        except RPCError as exc:
            LOG.warning("role not started again", role=name, fault=exc.text)
            return
        LOG.info("role started again", role=name)


def failed(what: str, exc: Exception, **fields: object) -> None:
    """The one line a callback's failure costs; even a failing log call stays inside this function."""
    try:
        LOG.error(
            "watchdog callback failed; supervisord goes on",
            callback=what,
            error=repr(exc),
            where=raised_at(exc),
            **fields,
        )
    except Exception:  # noqa: S110 - nothing is left to report it with
        pass


class ColadNamespaceRPCInterface:
    """`colad.*` on supervisord's XML-RPC socket: read-only. Every public method here is callable by a client."""

    def __init__(self, watchdog: InProcess) -> None:
        self._watchdog = watchdog

    def getRestarts(self) -> list[dict[str, Any]]:  # noqa: N802 - supervisord's method names are camelCase
        """Each FATAL role's coming start: name, in_s, fatal_in_a_row.

        @return array restarts
        """
        return self._watchdog.core.pending(self._watchdog.clock())


_INSTALLED: InProcess | None = None


def make_rpcinterface(
    supervisord: Any, log_level: str = "INFO", *, core: Watchdog | None = None
) -> ColadNamespaceRPCInterface:
    """supervisord's factory for [rpcinterface:colad], its keys as arguments; called per start and HTTP server.

    One watchdog per supervisord, subscribed once. `core`: another core, for a test's fault injection.
    """
    global _INSTALLED
    if _INSTALLED is None or _INSTALLED.supervisord is not supervisord:
        try:
            log.setup("watchdog", log_level)
        except ValueError:  # a level logging does not know: the watchdog still runs, at INFO
            log.setup("watchdog", "INFO")
            LOG.warning("log_level not understood; INFO", log_level=log_level)
        _INSTALLED = InProcess(supervisord, core or Watchdog())
        LOG.info("watchdog starting", inside="supervisord", pid=os.getpid(), backoff_first=f"{BACKOFF_FIRST}s")
    _INSTALLED.subscribe()
    return ColadNamespaceRPCInterface(_INSTALLED)
