"""supervisord's XML-RPC, as colad asks it: over the run directory's unix socket, with a timeout on
every call. The plugin's health reads the roles' states from it (RoleHealth, for /healthz and
`colad status`); `colad status` and `colad reload` use the same proxy.
"""

from __future__ import annotations

import http.client
import os
import socket
import threading
import time
import xmlrpc.client
from collections.abc import Callable
from typing import Any

from colad.config.config import Config
from colad.health.rule import RoleView, role_view

ROLE_CHECK_TIMEOUT = 1.0  # /healthz must answer fast even when supervisord is busy
ROLE_CHECK_CACHE = 2.0  # seconds a role check is reused: probes and scrapes must not hammer supervisord


class _UnixHTTPConnection(http.client.HTTPConnection):
    """HTTP to supervisord over its unix socket: only connect() differs from a TCP connection."""

    def __init__(self, socket_path: str, timeout: float) -> None:
        super().__init__("localhost", timeout=timeout)
        self.socket_path = socket_path

    def connect(self) -> None:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(self.timeout)
        try:
            sock.connect(self.socket_path)
        except OSError:
            sock.close()
            raise
        self.sock = sock


class _UnixTransport(xmlrpc.client.Transport):
    """XML-RPC over supervisord's unix socket, with a timeout on every call (SupervisorTransport has none)."""

    def __init__(self, socket_path: str, timeout: float) -> None:
        super().__init__()
        self.socket_path = socket_path
        self.timeout = timeout

    def make_connection(self, host: Any) -> http.client.HTTPConnection:
        self.close()
        connection = _UnixHTTPConnection(self.socket_path, self.timeout)
        self._connection = host, connection
        return connection


def supervisor_proxy(socket_path: str, timeout: float = 10.0) -> Any:
    return xmlrpc.client.ServerProxy("http://localhost", transport=_UnixTransport(socket_path, timeout))


class RoleHealth:
    """For the plugin's health: supervisord's view of colad's processes (`colad.health.rule.role_view`).

    Asked over XML-RPC with a short timeout and cached briefly. A plugin that is not a
    child of the supervisord of its run directory (run alone, as the integration tests
    do) has no roles to check and says so; under supervisord, no answer is a problem.
    """

    def __init__(self, cfg: Config, *, clock: Callable[[], float] = time.monotonic) -> None:
        self.socket_path = cfg.supervisor_socket
        self.pid_file = cfg.supervisor_pid_file
        self.clock = clock
        self._lock = threading.Lock()
        self._cached: tuple[float, RoleView | None] | None = None

    def supervised(self) -> bool:
        try:
            with open(self.pid_file, encoding="ascii") as handle:
                return int(handle.read().strip() or 0) == os.getppid()
        except (OSError, ValueError):
            return False

    def view(self, *, fresh: bool = False) -> RoleView | None:
        """None when there is no supervisord to ask; else what its answer means (or why there is none).

        `fresh` (the status socket) asks now and refreshes the cache /healthz reads.
        """
        with self._lock:
            now = self.clock()
            if not fresh and self._cached is not None and now - self._cached[0] < ROLE_CHECK_CACHE:
                return self._cached[1]
            result = self._ask()
            self._cached = (self.clock(), result)
            return result

    def _ask(self) -> RoleView | None:
        if not self.supervised():
            return None
        proxy = supervisor_proxy(self.socket_path, ROLE_CHECK_TIMEOUT)
        try:
            infos = proxy.supervisor.getAllProcessInfo()
        except (OSError, xmlrpc.client.Error, http.client.HTTPException) as exc:
            return RoleView((f"supervisord not answering on {self.socket_path}: {exc}",))
        if not isinstance(infos, list):
            return RoleView((f"supervisord answered {type(infos).__name__}, not a process list",))
        return role_view([i for i in infos if isinstance(i, dict)], watchdog=restarts(proxy)[1])


def restarts(proxy: Any) -> tuple[list[dict[str, Any]], str]:
    """The watchdog's coming starts of FATAL roles (the watchdog's getRestarts call, inside supervisord), and why a
    FATAL role would stay down ("" when it would not): no watchdog in supervisord, or none answering."""
    try:
        coming = proxy.colad.getRestarts()
    except xmlrpc.client.Fault:  # UNKNOWN_METHOD: a template without [rpcinterface:colad]
        return [], "no watchdog in supervisord (no [rpcinterface:colad]): a FATAL role stays down"
    except (OSError, xmlrpc.client.Error, http.client.HTTPException) as exc:
        return [], f"watchdog not answering in supervisord: {exc}"
    return ([r for r in coming if isinstance(r, dict)] if isinstance(coming, list) else []), ""
