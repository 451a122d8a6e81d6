"""The metrics/health HTTP server's bounds: connection cap, request deadline, size cap, fixed threads, fd shortage.

Real sockets on loopback against one MetricsServer in this process; the refusals are read from
the Metrics registry they are counted in.
"""

from __future__ import annotations

import errno
import functools
import os
import resource
import socket
import threading
import time
from collections.abc import Callable, Iterator

import pytest

from colad import httpserver
from colad import metrics as metrics_mod
from colad.httpserver import MAX_CONNECTIONS, MAX_REQUEST_BYTES, MetricsServer, parse_head
from colad.metrics import Metrics
from tests.helpers import http_get, wait_until


class Served:
    def __init__(self, server: MetricsServer, metrics: Metrics) -> None:
        self.server, self.metrics = server, metrics
        host, _, port = server.bound.rpartition(":")
        self.address = (host, int(port))
        self.url = f"http://{server.bound}"
        self.open: list[socket.socket] = []

    def refused(self, reason: str) -> float:
        value = self.metrics.registry.get_sample_value("colad_http_connections_refused_total", {"reason": reason})
        return value or 0.0

    def connect(self, first: bytes = b"GET /healthz HTTP/1.1\r\n") -> socket.socket:
        sock = socket.create_connection(self.address, timeout=5)
        if first:
            sock.sendall(first)
        self.open.append(sock)
        return sock

    def thread_of(self, name: str) -> threading.Thread:
        return next(t for t in threading.enumerate() if t.name == name)


def closed_by_server(sock: socket.socket) -> bool:
    sock.setblocking(False)
    try:
        return sock.recv(65536) == b""  # anything sent back before the close is read first
    except BlockingIOError:
        return False
    except OSError:
        return True
    finally:
        sock.setblocking(True)


@pytest.fixture
def serve() -> Iterator[Callable[..., Served]]:
    made: list[Served] = []

    def make(
        health: Callable[[], tuple[bool, str]] = lambda: (True, "ok"),
        request_timeout: float = httpserver.REQUEST_TIMEOUT,
    ) -> Served:
        metrics = Metrics()
        refused = metrics.http_refused
        server = MetricsServer(
            metrics, "127.0.0.1:0", health,
            on_refuse=lambda r: refused.labels(r).inc(), request_timeout=request_timeout,
        )  # fmt: skip
        assert server.start()
        made.append(Served(server, metrics))
        return made[-1]

    yield make
    for served in made:
        for sock in served.open:
            sock.close()
        served.server.stop()


def test_health_readiness_metrics_and_unknown_paths_are_answered(serve: Callable[..., Served]) -> None:
    served = serve(lambda: (False, "not registered"))
    assert http_get(served.url + "/healthz") == (503, "not registered\n")
    assert http_get(served.url + "/readyz") == (503, "not registered\n")
    code, body = http_get(served.url + "/metrics")
    assert code == 200 and "colad_http_connections_refused_total" in body
    assert http_get(served.url + "/nothing")[0] == 404
    sock = served.connect(b"HEAD /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
    head = b"".join(iter(lambda: sock.recv(4096), b""))
    assert head.startswith(b"HTTP/1.1 503 ") and head.endswith(b"\r\n\r\n")


@pytest.mark.parametrize(
    ("request_bytes", "status"),
    [
        (b"POST /healthz HTTP/1.1\r\n\r\n", b"405"),
        (b"GET /healthz\r\n\r\n", b"400"),
        (b"\x00\xff garbage \r\n\r\n", b"400"),
        (b"GET /healthz HTTP/1.1\r\nno colon here\r\n\r\n", b"400"),
        (b"GET /healthz HTTP/1.1\r\nX: " + b"a" * MAX_REQUEST_BYTES + b"\r\n\r\n", b"431"),
        (b"GET /healthz HTTP/1.1\r\nX: " + b"a" * (2 * MAX_REQUEST_BYTES), b"431"),
    ],
    ids=["post", "http-0.9", "binary", "bad-header", "head-too-large", "endless-head"],
)
def test_a_bad_request_gets_its_status_and_the_connection_is_closed(
    serve: Callable[..., Served], request_bytes: bytes, status: bytes
) -> None:
    served = serve()
    sock = served.connect(b"")
    try:
        sock.sendall(request_bytes)
    except OSError:  # the server may close before the last bytes of an endless head arrive
        pass
    try:
        answer = b"".join(iter(lambda: sock.recv(4096), b""))
    except ConnectionResetError:  # closed with the rest of an endless head unread: the answer may be lost
        answer = b"HTTP/1.1 431 reset"
    assert answer.split(b" ")[1] == status
    reason = {b"431": "too_large"}.get(status, "bad_request")
    assert served.refused(reason) == 1
    assert http_get(served.url + "/healthz")[0] == 200


def test_idle_connections_past_the_cap_close_the_oldest_and_start_no_thread(serve: Callable[..., Served]) -> None:
    served = serve()
    threads = threading.active_count()
    socks = [served.connect() for _ in range(MAX_CONNECTIONS * 3)]
    assert threading.active_count() == threads
    oldest, newest = socks[: 2 * MAX_CONNECTIONS], socks[2 * MAX_CONNECTIONS :]
    wait_until(lambda: all(closed_by_server(s) for s in oldest), 5, "the oldest half-sent requests closed")
    assert not any(closed_by_server(s) for s in newest)
    assert served.refused("evicted") >= 2 * MAX_CONNECTIONS
    assert http_get(served.url + "/healthz") == (200, "ok\n")  # a whole request among them is served at once


def test_a_request_head_must_arrive_whole_within_the_deadline_however_it_trickles(
    serve: Callable[..., Served],
) -> None:
    served = serve(request_timeout=1.0)
    sock = served.connect(b"G")
    started = time.monotonic()
    sent = 1
    with pytest.raises(OSError):
        while time.monotonic() - started < 5:  # a byte every 0.1 s: each read is prompt, the whole is not
            sock.sendall(b"E" if sent == 1 else b"x")
            sent += 1
            time.sleep(0.1)
            if closed_by_server(sock):
                raise ConnectionResetError
    assert 0.9 <= time.monotonic() - started < 2.5
    assert served.refused("timeout") == 1


def test_a_blocked_health_check_neither_grows_threads_nor_delays_metrics(serve: Callable[..., Served]) -> None:
    entered, release = threading.Event(), threading.Event()

    def health() -> tuple[bool, str]:
        entered.set()
        return release.wait(10), "ok"

    served = serve(health)
    threads = threading.active_count()
    waiting = [served.connect(b"GET /healthz HTTP/1.1\r\n\r\n")]
    assert entered.wait(5), "the health lane took the first request"
    waiting += [served.connect(b"GET /healthz HTTP/1.1\r\n\r\n") for _ in range(httpserver.LANE_BACKLOG)]
    wait_until(lambda: served.server._lanes["health"].queue.full(), 5, "the health lane's backlog full")
    busy = served.connect(b"GET /readyz HTTP/1.1\r\n\r\n")
    assert b"".join(iter(lambda: busy.recv(4096), b"")).startswith(b"HTTP/1.1 503 ")
    assert served.refused("busy") == 1
    assert http_get(served.url + "/metrics")[0] == 200
    assert threading.active_count() == threads
    release.set()
    for sock in waiting:
        answer = b"".join(iter(functools.partial(sock.recv, 4096), b""))
        assert answer.startswith(b"HTTP/1.1 200 ")


def _cpu_seconds(stat_fd: int) -> float:
    """user + system CPU of the thread whose /proc/self/task/<tid>/stat is open as `stat_fd`."""
    fields = os.pread(stat_fd, 4096, 0).decode().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _fill_holes() -> list[int]:
    """Descriptors that fill every gap in this process's table: the next one opened is past all in use."""
    highest = max(int(fd) for fd in os.listdir("/proc/self/fd"))
    filler = [os.open("/dev/null", os.O_RDONLY)]
    while filler[-1] < highest:
        filler.append(os.open("/dev/null", os.O_RDONLY))
    return filler


def test_accept_without_a_free_descriptor_backs_off_and_recovers(serve: Callable[..., Served]) -> None:
    served = serve()
    loop = served.thread_of("http")
    assert loop.native_id is not None
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    stat_fd = os.open(f"/proc/self/task/{loop.native_id}/stat", os.O_RDONLY)
    filler = _fill_holes()
    client = None
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (filler[-1] + 64, hard))
        client = socket.socket()  # made while a descriptor is free; the server's accept then finds none
        while True:
            try:
                filler.append(os.open("/dev/null", os.O_RDONLY))
            except OSError as exc:
                assert exc.errno == errno.EMFILE
                break
        client.settimeout(5)
        client.connect(served.address)
        client.sendall(b"GET /healthz HTTP/1.1\r\n\r\n")
        wait_until(lambda: served.refused("accept_failed") >= 1, 5, "accept(2) to fail with EMFILE")
        before = _cpu_seconds(stat_fd)
        time.sleep(1.0)
        spent = _cpu_seconds(stat_fd) - before
        assert spent < 0.2, f"the accept loop used {spent:.2f} s of CPU in 1 s without descriptors"
        assert served.refused("accept_failed") <= 10  # paused with a doubling back-off, not retried at once
    finally:
        for fd in [*filler, stat_fd]:
            os.close(fd)
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    assert client is not None
    answer = b"".join(iter(lambda: client.recv(4096), b""))  # served once descriptors are back
    client.close()
    assert answer.startswith(b"HTTP/1.1 200 ")
    assert http_get(served.url + "/healthz") == (200, "ok\n")


def test_a_connection_near_the_descriptor_limit_is_refused_to_keep_the_reserve(serve: Callable[..., Served]) -> None:
    served = serve()
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    filler = _fill_holes()
    try:
        # The client takes the next descriptor, the server's accept the one after: within the reserve.
        resource.setrlimit(resource.RLIMIT_NOFILE, (filler[-1] + 2 + httpserver.FD_RESERVE, hard))
        sock = served.connect(b"")
        answer = b"".join(iter(lambda: sock.recv(4096), b""))
    finally:
        for fd in filler:
            os.close(fd)
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    assert answer.startswith(b"HTTP/1.1 503 ")
    assert served.refused("fd_reserve") == 1
    assert http_get(served.url + "/healthz") == (200, "ok\n")


@pytest.mark.parametrize(
    ("head", "expected"),
    [
        (b"GET /metrics?name[]=a HTTP/1.1\r\nAccept-Encoding: gzip", ("GET", "/metrics", "name[]=a")),
        (b"HEAD /ready%7A HTTP/1.0", ("HEAD", "/readyz", "")),
        (b"GET / HTTP/2.0", None),
        (b"GET  / HTTP/1.1", None),
        (b"GET / HTTP/1.1\r\n : x", None),
    ],
    ids=["query-and-header", "escaped-path", "http2", "double-space", "empty-header-name"],
)
def test_parse_head(head: bytes, expected: tuple[str, str, str] | None) -> None:
    request = parse_head(head)
    assert (request and (request.method, request.path, request.query)) == expected


def test_near_the_descriptor_limit_a_newcomer_takes_the_place_of_the_oldest_unfinished_request(
    serve: Callable[..., Served],
) -> None:
    served = serve()
    stalled = [served.connect() for _ in range(4)]
    wait_until(lambda: len(served.server._reading) == 4, 5, "four half-sent requests held")
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    filler = _fill_holes()
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (filler[-1] + 2 + httpserver.FD_RESERVE, hard))
        code, body = http_get(served.url + "/healthz")
        code_again, _ = http_get(served.url + "/healthz")
    finally:
        for fd in filler:
            os.close(fd)
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    assert (code, body, code_again) == (200, "ok\n", 200)
    assert served.refused("evicted") >= 1 and served.refused("fd_reserve") == 0
    assert closed_by_server(stalled[0])
    assert not closed_by_server(stalled[-1])


def test_a_tcp_check_that_connects_and_closes_is_not_counted_as_refused(serve: Callable[..., Served]) -> None:
    served = serve()
    for _ in range(5):
        served.connect(b"").close()
    served.connect(b"GET /heal").close()
    wait_until(lambda: served.refused("bad_request") == 1, 5, "the half-sent request counted")
    assert not served.server._reading
    assert sum(served.refused(r) for r in metrics_mod.HTTP_REFUSAL_REASONS) == 1


def test_an_address_in_use_is_a_false_start_with_no_thread_left_and_a_later_start_serves(
    serve: Callable[..., Served],
) -> None:
    served = serve()
    threads = threading.active_count()
    second = MetricsServer(Metrics(), served.server.bound, lambda: (True, "second"))
    assert second.start() is False and second.server is None
    assert threading.active_count() == threads
    served.server.stop()
    assert second.start() is True
    try:
        assert http_get(f"http://{second.bound}/healthz") == (200, "second\n")
    finally:
        second.stop()
