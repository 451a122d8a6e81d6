"""The /metrics, /healthz and /readyz HTTP server of the plugin process, on the configured address.

A small threaded WSGI server (stdlib wsgiref) serving prometheus_client's
exposition of one registry and the health and readiness callbacks' one line (200 or 503).
It wakes only when a client connects; stop() wakes it with a connection.
Neighbours: metrics.py (the registry), plugin.py (health and the address).
"""

from __future__ import annotations

import socket
import socketserver
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Protocol
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

from colad import log
from colad.metrics import parse_address

if TYPE_CHECKING:
    from prometheus_client import CollectorRegistry

LOG = log.get(__name__)
__all__ = ["MetricsServer", "parse_address"]


class HasRegistry(Protocol):
    """Anything that carries the registry to expose (colad.metrics.Metrics)."""

    @property
    def registry(self) -> CollectorRegistry: ...


class _Handler(WSGIRequestHandler):
    def log_message(self, format: str, *args: object) -> None:  # noqa: A002 - stdlib signature
        LOG.debug("http request", line=format % args)


class _ThreadingServer(socketserver.ThreadingMixIn, WSGIServer):
    daemon_threads = True


class _ThreadingServer6(_ThreadingServer):
    address_family = socket.AF_INET6


class MetricsServer:
    """Serves /metrics, /healthz and /readyz on the configured address; `health()`, `ready()` say (ok, reason)."""

    def __init__(
        self,
        metrics: HasRegistry,
        address: str,
        health: Callable[[], tuple[bool, str]],
        ready: Callable[[], tuple[bool, str]] | None = None,
    ) -> None:
        self.metrics = metrics
        self.address = address
        self.health = health
        self.ready = ready or health
        self.server: WSGIServer | None = None
        self.bound = ""
        self._stopping = False
        self._thread: threading.Thread | None = None
        self.failures = 0
        from prometheus_client import make_wsgi_app

        self._metrics_app = make_wsgi_app(metrics.registry)

    def app(self, environ: dict[str, object], start_response: Callable[..., object]) -> list[bytes]:
        path = str(environ.get("PATH_INFO", "/"))
        if path in ("/healthz", "/readyz"):
            ok, reason = self.health() if path == "/healthz" else self.ready()
            status = "200 OK" if ok else "503 Service Unavailable"
            start_response(status, [("Content-Type", "text/plain; charset=utf-8")])
            return [(reason + "\n").encode()]
        if path == "/metrics":
            return self._metrics_app(environ, start_response)  # type: ignore[no-any-return]
        start_response("404 Not Found", [("Content-Type", "text/plain; charset=utf-8")])
        return [b"colad: see /metrics, /healthz and /readyz\n"]

    def start(self) -> bool:
        """Bind and serve in a thread; False (logged) if the address cannot be bound."""
        host, port = parse_address(self.address)
        server_class = _ThreadingServer6 if ":" in host else _ThreadingServer
        try:
            self.server = make_server(host, port, self.app, server_class=server_class, handler_class=_Handler)
        except (OSError, UnicodeError) as exc:  # UnicodeError: getaddrinfo's idna codec on a bad host name
            self.failures += 1
            if self.failures == 1:  # then retried quietly on the plugin's safety timer
                LOG.error("metrics endpoint not available; retrying", address=self.address, error=exc)
            return False
        if self.failures:
            LOG.info("metrics endpoint available after retries", address=self.address, failures=self.failures)
        bound_host, bound_port = str(self.server.server_address[0]), int(self.server.server_address[1])
        self.bound = f"[{bound_host}]:{bound_port}" if ":" in bound_host else f"{bound_host}:{bound_port}"
        self._thread = threading.Thread(target=self._serve, name="metrics", daemon=True)
        self._thread.start()
        LOG.info("metrics listening", address=self.bound)
        return True

    def _serve(self) -> None:
        # handle_request() blocks until a client comes: an idle colad never wakes up here
        # (serve_forever would poll every 0.5 s). stop() wakes it with a connection.
        assert self.server is not None
        self.server.timeout = None
        while not self._stopping:
            self.server.handle_request()

    def stop(self) -> None:
        if self.server is None:
            return
        self._stopping = True
        host, port = parse_address(self.bound)
        host = {"0.0.0.0": "127.0.0.1", "::": "::1"}.get(host, host)
        try:
            socket.create_connection((host, port), timeout=1).close()
        except OSError:
            pass
        if self._thread is not None:
            self._thread.join(timeout=2)
        self.server.server_close()
        self.server = None
