"""The /metrics, /healthz and /readyz HTTP server of the plugin process, on the configured address.

Bounded, since every pod may reach it: one selector thread accepts and reads at most
MAX_CONNECTIONS request heads (each within REQUEST_TIMEOUT and MAX_REQUEST_BYTES), and two fixed
lanes, one thread each, answer them. Fair between sources: one source address holds at most
MAX_PER_SOURCE of those heads (its next connection is closed at accept), and a newcomer past the cap
takes the place of a connection of the source holding the most (see `choose_victim`), so a flood from
one pod never takes the kubelet's probes' place. The lanes: health (the callbacks' one line, 200 or 503) and metrics
(prometheus_client's exposition of one registry). No thread is started per connection.
Neighbours: colad/metrics/registry.py (the registry and the refusal counter), colad/plugin/main.py
(health and the address).
"""

from __future__ import annotations

import errno
import os
import queue
import resource
import selectors
import socket
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol
from urllib.parse import unquote

from colad.metrics.registry import parse_address
from colad.runtime import log

if TYPE_CHECKING:
    from prometheus_client import CollectorRegistry

LOG = log.get(__name__)

# Scrapers and probes send one small GET and wait: anything slower or larger is not one of them.
MAX_CONNECTIONS = 32  # request heads being read at once; a new connection past it closes one (choose_victim)
MAX_PER_SOURCE = MAX_CONNECTIONS // 4  # request heads one source address may have read at once
REQUEST_TIMEOUT = 5.0  # seconds from accept to a whole request head (the kubelet's probes time out at 5 s)
MAX_REQUEST_BYTES = 8192  # a request head larger than this is answered 431 and closed
LANE_BACKLOG = 8  # whole requests waiting for a lane; past it the request is answered 503 at once
WRITE_TIMEOUT = 5.0  # seconds a lane waits for a client to take its answer
# File descriptors left to the rest of the plugin (gRPC's server and the Register call after a kubelet
# restart, the queue, the state file): a connection that lands within this many of the soft limit
# replaces the oldest one being read, or is closed at once.
FD_RESERVE = 32
ACCEPT_BACKOFF = (0.05, 1.0)  # after accept(2) fails for want of a resource: first pause, cap (doubling)
LISTEN_BACKLOG = 1024  # a burst waits in the kernel, not dropped; accept drains it cheaply
ACCEPT_BATCH = 64  # connections accepted per wake at most: the lanes and deadlines get their turn
# accept(2) errors that leave the listener readable: retrying at once would spin.
SHORTAGE = frozenset({errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM})

STATUS = {
    200: "OK",
    400: "Bad Request",
    404: "Not Found",
    405: "Method Not Allowed",
    431: "Request Header Fields Too Large",
    500: "Internal Server Error",
    503: "Service Unavailable",
}


class HasRegistry(Protocol):
    """Anything that carries the registry to expose (colad.metrics.registry.Metrics)."""

    @property
    def registry(self) -> CollectorRegistry: ...


@dataclass
class _Reading:
    """A connection whose request head is still arriving."""

    sock: socket.socket
    deadline: float
    source: str = ""  # the peer's address, without its port
    buffer: bytearray = field(default_factory=bytearray)


def choose_victim(reading: Iterable[_Reading], newcomer: str) -> _Reading | None:
    """The connection a newcomer from `newcomer` replaces when the server is full.

    One of the source holding the most heads: the newcomer's own source when it is among them (a source
    never takes from one holding no more than it does), else the one whose oldest head came first. At
    the cap the most any source holds is at least its fair share (MAX_CONNECTIONS / sources), so no
    source under it loses a connection. Within that source: its oldest connection that has sent
    nothing, else its oldest. `reading` is in accept order, oldest first; None when it is empty.
    """
    held: dict[str, list[_Reading]] = {}
    for r in reading:
        held.setdefault(r.source, []).append(r)
    if not held:
        return None
    most = max(len(rs) for rs in held.values())
    if len(held.get(newcomer, ())) == most:
        source = newcomer
    else:  # the source whose oldest connection came first, among those holding the most
        source = next(s for s, rs in held.items() if len(rs) == most)
    mine = held[source]
    return next((r for r in mine if not r.buffer), mine[0])


@dataclass(frozen=True)
class Request:
    method: str
    path: str
    query: str
    headers: dict[str, str]


def parse_head(head: bytes) -> Request | None:
    """The request line and headers of one HTTP/1.x request head (CRLF CRLF excluded); None if malformed."""
    try:
        text = head.decode("latin-1")
    except UnicodeDecodeError:  # pragma: no cover - latin-1 decodes every byte
        return None
    lines = text.split("\r\n")
    parts = lines[0].split(" ")
    if len(parts) != 3 or not parts[2].startswith("HTTP/1."):
        return None
    method, target, _ = parts
    path, _, query = target.partition("?")
    headers: dict[str, str] = {}
    for line in lines[1:]:
        name, sep, value = line.partition(":")
        if not sep or not name or name != name.strip():
            return None
        headers[name.lower()] = value.strip()
    return Request(method, unquote(path), query, headers)


def response(code: int, body: bytes, headers: Iterable[tuple[str, str]] = (), *, head_only: bool = False) -> bytes:
    lines = [f"HTTP/1.1 {code} {STATUS.get(code, 'Unknown')}", "Connection: close"]
    names = set()
    for name, value in headers:
        names.add(name.lower())
        lines.append(f"{name}: {value}")
    if "content-type" not in names:
        lines.append("Content-Type: text/plain; charset=utf-8")
    lines.append(f"Content-Length: {len(body)}")
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + (b"" if head_only else body)


class _Lane:
    """One fixed thread answering whole requests from a bounded queue."""

    def __init__(self, name: str, answer: Callable[[Request], bytes]) -> None:
        self.name = name
        self.answer = answer
        self.queue: queue.Queue[tuple[socket.socket, Request] | None] = queue.Queue(maxsize=LANE_BACKLOG)
        self.thread = threading.Thread(target=self._run, name=f"http-{name}", daemon=True)

    def offer(self, sock: socket.socket, request: Request) -> bool:
        try:
            self.queue.put_nowait((sock, request))
        except queue.Full:
            return False
        return True

    def stop(self) -> None:
        while True:  # make room for the stop mark: whatever still waits is closed unanswered
            try:
                item = self.queue.get_nowait()
            except queue.Empty:
                break
            if item is not None:
                item[0].close()
        self.queue.put_nowait(None)

    def _run(self) -> None:
        while (item := self.queue.get()) is not None:
            sock, request = item
            try:
                data = self.answer(request)
            except Exception as exc:  # the lane's boundary: one line, a 500, the lane goes on
                LOG.error("http request failed", path=request.path, error=repr(exc))
                data = response(500, b"colad: internal error\n")
            try:
                sock.settimeout(WRITE_TIMEOUT)  # sendall's whole duration since Python 3.5
                sock.sendall(data)
            except OSError as exc:
                LOG.debug("http answer not sent", path=request.path, error=exc)
            finally:
                sock.close()


class MetricsServer:
    """Serves /metrics, /healthz and /readyz on the configured address; `health()`, `ready()` say (ok, reason)."""

    def __init__(
        self,
        metrics: HasRegistry,
        address: str,
        health: Callable[[], tuple[bool, str]],
        ready: Callable[[], tuple[bool, str]] | None = None,
        *,
        on_refuse: Callable[[str], None] = lambda reason: None,
        clock: Callable[[], float] = time.monotonic,
        request_timeout: float = REQUEST_TIMEOUT,
    ) -> None:
        self.metrics = metrics
        self.address = address
        self.health = health
        self.ready = ready or health
        self.on_refuse = on_refuse
        self.clock = clock
        self.request_timeout = request_timeout
        self.server: socket.socket | None = None  # the listener while serving
        self.bound = ""
        self.failures = 0
        self._stopping = False
        self._thread: threading.Thread | None = None
        self._lanes: dict[str, _Lane] = {}
        self._selector: selectors.BaseSelector | None = None
        self._wake_r = self._wake_w = -1
        self._reading: dict[int, _Reading] = {}  # by fd, in accept order (oldest first)
        self._per_source: dict[str, int] = {}  # heads being read, by source address
        self._paused_until: float | None = None  # listener out of the selector after a failed accept
        self._backoff = ACCEPT_BACKOFF[0]
        self._accept_failures = 0
        from prometheus_client import make_wsgi_app

        self._metrics_app = make_wsgi_app(metrics.registry)

    # The answers, on the lanes' threads.
    def answer_health(self, request: Request) -> bytes:
        head_only = request.method == "HEAD"
        if request.path in ("/healthz", "/readyz"):
            ok, reason = self.health() if request.path == "/healthz" else self.ready()
            return response(200 if ok else 503, (reason + "\n").encode(), head_only=head_only)
        return response(404, b"colad: see /metrics, /healthz and /readyz\n", head_only=head_only)

    def answer_metrics(self, request: Request) -> bytes:
        environ: dict[str, object] = {
            "REQUEST_METHOD": request.method,
            "PATH_INFO": request.path,
            "QUERY_STRING": request.query,
        }
        for name in ("accept", "accept-encoding"):
            if name in request.headers:
                environ["HTTP_" + name.upper().replace("-", "_")] = request.headers[name]
        started: list[object] = []

        def start_response(status: str, headers: list[tuple[str, str]], exc_info: object = None) -> None:
            started[:] = [status, headers]

        body = b"".join(self._metrics_app(environ, start_response))
        status, headers = started
        code = int(str(status).split(" ", 1)[0])
        kept = [(k, v) for k, v in headers if k.lower() not in ("content-length", "connection")]  # type: ignore[attr-defined]
        return response(code, body, kept, head_only=request.method == "HEAD")

    # The life cycle, on the plugin's thread.
    def start(self) -> bool:
        """Bind and serve; False (logged) if the address cannot be bound or the threads cannot start."""
        host, port = parse_address(self.address)
        family = socket.AF_INET6 if ":" in host else socket.AF_INET  # "[::]" is dual-stack (bindv6only=0)
        try:
            infos = socket.getaddrinfo(host or None, port, family, socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
            family, _, _, _, sockaddr = infos[0]
            listener = socket.socket(family, socket.SOCK_STREAM)
            try:
                listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                listener.bind(sockaddr)
                listener.listen(LISTEN_BACKLOG)
                listener.setblocking(False)
            except OSError:
                listener.close()
                raise
        except (OSError, UnicodeError) as exc:  # UnicodeError: getaddrinfo's idna codec on a bad host name
            return self._failed(exc)
        self._stopping = False
        self._selector = selectors.DefaultSelector()
        self._wake_r, self._wake_w = os.pipe()
        os.set_blocking(self._wake_w, False)
        self._selector.register(listener, selectors.EVENT_READ, "listen")
        self._selector.register(self._wake_r, selectors.EVENT_READ, "wake")
        self.server = listener
        self._lanes = {"health": _Lane("health", self.answer_health), "metrics": _Lane("metrics", self.answer_metrics)}
        self._thread = threading.Thread(target=self._serve, name="http", daemon=True)
        try:
            for lane in self._lanes.values():
                lane.thread.start()
            self._thread.start()
        except RuntimeError as exc:  # "can't start new thread": a task limit; retried like a failed bind
            self.stop()
            return self._failed(exc)
        if self.failures:
            LOG.info("metrics endpoint available after retries", address=self.address, failures=self.failures)
        self.failures = 0
        bound_host, bound_port = str(listener.getsockname()[0]), int(listener.getsockname()[1])
        self.bound = f"[{bound_host}]:{bound_port}" if ":" in bound_host else f"{bound_host}:{bound_port}"
        LOG.info("metrics listening", address=self.bound)
        return True

    def _failed(self, exc: BaseException) -> bool:
        self.failures += 1
        if self.failures == 1:  # then retried quietly on the plugin's safety timer
            LOG.error("metrics endpoint not available; retrying", address=self.address, error=exc)
        return False

    def stop(self) -> None:
        if self.server is None:
            return
        self._stopping = True
        if self._thread is not None and self._thread.is_alive():
            try:
                os.write(self._wake_w, b"x")
            except OSError:
                pass
            self._thread.join(timeout=2)
        for lane in self._lanes.values():
            if lane.thread.is_alive():
                lane.stop()
                lane.thread.join(timeout=WRITE_TIMEOUT + 1)
        for reading in self._reading.values():
            reading.sock.close()
        self._reading.clear()
        self._per_source.clear()
        assert self._selector is not None
        self._selector.close()
        os.close(self._wake_r)
        os.close(self._wake_w)
        self.server.close()
        self.server = None
        self._thread = None

    # The selector thread: accept, read request heads, expire, hand whole requests to a lane.
    def _serve(self) -> None:
        assert self._selector is not None
        while not self._stopping:
            try:
                for key, _ in self._selector.select(self._wait()):
                    if key.data == "listen":
                        self._accept()
                    elif key.data == "wake":
                        os.read(self._wake_r, 64)
                    else:
                        self._read(key.data)
                self._expire()
            except Exception as exc:  # the loop's boundary: one line, a short pause, serving goes on
                LOG.error("http server error", error=repr(exc))
                time.sleep(ACCEPT_BACKOFF[0])

    def _wait(self) -> float | None:
        """Seconds until the next deadline (an idle server sleeps until a client comes)."""
        due = [r.deadline for r in self._reading.values()]
        if self._paused_until is not None:
            due.append(self._paused_until)
        return max(0.0, min(due) - self.clock()) if due else None

    def _refuse(self, sock: socket.socket, reason: str, answer: bytes = b"") -> None:
        self.on_refuse(reason)  # counted first: a client that sees the close may read the count at once
        if answer:
            try:
                sock.send(answer)  # small: fits the socket buffer of a fresh connection
            except OSError:
                pass
        sock.close()
        LOG.debug("http connection refused", reason=reason)

    def _accept(self) -> None:
        assert self.server is not None and self._selector is not None
        soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
        for _ in range(ACCEPT_BATCH):  # until EAGAIN, bounded: the lanes and deadlines get their turn
            try:
                # The descriptor alone (what accept() wraps): a refusal makes no socket object.
                fd, peer = self.server._accept()  # type: ignore[attr-defined]
            except (BlockingIOError, InterruptedError):
                break
            except ConnectionAbortedError:
                continue
            except OSError as exc:
                if exc.errno not in SHORTAGE:
                    raise
                self._pause(exc)
                return
            if self._accept_failures:
                LOG.info("metrics accepting again", failures=self._accept_failures)
                self._accept_failures, self._backoff = 0, ACCEPT_BACKOFF[0]
            source = str(peer[0])
            if self._per_source.get(source, 0) >= MAX_PER_SOURCE:  # the cheapest answer: no read, no log
                self.on_refuse("source_cap")
                os.close(fd)
                continue
            sock = socket.socket(self.server.family, self.server.type, self.server.proto, fileno=fd)
            # Near the file limit the cap shrinks to what the server holds already: a newcomer takes the
            # place of an unfinished request (choose_victim), or is refused when there is none.
            short = soft != resource.RLIM_INFINITY and sock.fileno() >= soft - FD_RESERVE
            if short and not self._reading:
                self._refuse(sock, "fd_reserve", response(503, b"colad: busy\n"))
                continue
            if short or len(self._reading) >= MAX_CONNECTIONS:
                victim = choose_victim(self._reading.values(), source)
                assert victim is not None
                self._close(victim, "evicted")
            sock.setblocking(False)
            reading = _Reading(sock, self.clock() + self.request_timeout, source)
            self._reading[sock.fileno()] = reading
            self._per_source[source] = self._per_source.get(source, 0) + 1
            self._selector.register(sock, selectors.EVENT_READ, reading)

    def _pause(self, exc: OSError) -> None:
        """Stop accepting for a while: the listener stays readable, so retrying now would spin."""
        assert self.server is not None and self._selector is not None
        self._accept_failures += 1
        self.on_refuse("accept_failed")
        if self._accept_failures == 1:
            LOG.warning("metrics accept failed; pausing", error=exc, seconds=self._backoff)
        victim = choose_victim(self._reading.values(), "")  # the one fd we can give back now
        if victim is not None:
            self._close(victim, "evicted")
        self._selector.unregister(self.server)
        self._paused_until = self.clock() + self._backoff
        self._backoff = min(self._backoff * 2, ACCEPT_BACKOFF[1])

    def _forget(self, reading: _Reading) -> None:
        assert self._selector is not None
        self._selector.unregister(reading.sock)
        del self._reading[reading.sock.fileno()]
        left = self._per_source[reading.source] - 1
        if left:
            self._per_source[reading.source] = left
        else:
            del self._per_source[reading.source]

    def _close(self, reading: _Reading, reason: str) -> None:
        self._forget(reading)
        self._refuse(reading.sock, reason)

    def _expire(self) -> None:
        assert self.server is not None and self._selector is not None
        now = self.clock()
        for reading in [r for r in self._reading.values() if r.deadline <= now]:
            self._close(reading, "timeout")
        if self._paused_until is not None and now >= self._paused_until:
            self._paused_until = None
            self._selector.register(self.server, selectors.EVENT_READ, "listen")

    def _read(self, reading: _Reading) -> None:
        try:
            data = reading.sock.recv(4096)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            data = b""
        if not data:
            if reading.buffer:
                self._close(reading, "bad_request")
            else:  # connected and closed without a word: a TCP check (the DaemonSet's liveness probe)
                self._forget(reading)
                reading.sock.close()
            return
        reading.buffer += data
        end = reading.buffer.find(b"\r\n\r\n")
        if end < 0:
            if len(reading.buffer) > MAX_REQUEST_BYTES:
                self._hand_back(reading, "too_large", response(431, b"colad: request too large\n"))
            return
        if end > MAX_REQUEST_BYTES:
            self._hand_back(reading, "too_large", response(431, b"colad: request too large\n"))
            return
        request = parse_head(bytes(reading.buffer[:end]))
        if request is None:
            self._hand_back(reading, "bad_request", response(400, b"colad: bad request\n"))
            return
        if request.method not in ("GET", "HEAD"):
            self._hand_back(
                reading, "bad_request", response(405, b"colad: GET or HEAD only\n", [("Allow", "GET, HEAD")])
            )
            return
        self._forget(reading)
        lane = self._lanes["metrics" if request.path == "/metrics" else "health"]
        if not lane.offer(reading.sock, request):
            self._refuse(reading.sock, "busy", response(503, b"colad: busy\n"))

    def _hand_back(self, reading: _Reading, reason: str, answer: bytes) -> None:
        self._forget(reading)
        self._refuse(reading.sock, reason, answer)
