"""The metrics/health HTTP server's bounds: connection cap, fairness between sources, request deadline, size
cap, fixed threads, fd shortage.

Real sockets on loopback against one MetricsServer in this process; the refusals are read from
the Metrics registry they are counted in.
"""

from __future__ import annotations

import errno
import functools
import multiprocessing
import os
import random
import resource
import socket
import threading
import time
from collections.abc import Callable, Iterator

import pytest

from colad.metrics import httpserver, registry
from colad.metrics.httpserver import MAX_CONNECTIONS, MAX_PER_SOURCE, MAX_REQUEST_BYTES, MetricsServer, parse_head
from colad.metrics.registry import Metrics
from tests.helpers import http_get, wait_until

pytestmark = pytest.mark.integration


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

    def connect(self, first: bytes = b"GET /healthz HTTP/1.1\r\n", source: str = "127.0.0.1") -> socket.socket:
        sock = socket.create_connection(self.address, timeout=5, source_address=(source, 0))
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
            metrics,
            "127.0.0.1:0",
            health,
            on_refuse=lambda r: refused.labels(r).inc(),
            request_timeout=request_timeout,
        )
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


def test_one_source_past_its_share_is_refused_at_accept_and_starts_no_thread(serve: Callable[..., Served]) -> None:
    served = serve()
    threads = threading.active_count()
    socks = [served.connect(source="127.0.0.2") for _ in range(MAX_PER_SOURCE * 3)]
    assert threading.active_count() == threads
    held, past = socks[:MAX_PER_SOURCE], socks[MAX_PER_SOURCE:]
    wait_until(lambda: all(closed_by_server(s) for s in past), 5, "the source's connections past its share closed")
    assert not any(closed_by_server(s) for s in held)
    assert served.refused("source_cap") == 2 * MAX_PER_SOURCE and served.refused("evicted") == 0
    assert http_get(served.url + "/healthz") == (200, "ok\n")  # another source is served at once


def test_a_full_server_takes_from_the_source_holding_the_most_and_spares_the_others(
    serve: Callable[..., Served],
) -> None:
    served = serve()
    sources = [f"127.0.0.{n}" for n in range(2, 2 + MAX_CONNECTIONS // MAX_PER_SOURCE)]
    held = {source: [served.connect(source=source) for _ in range(MAX_PER_SOURCE)] for source in sources}
    wait_until(lambda: len(served.server._reading) == MAX_CONNECTIONS, 5, "the server full")
    quiet = served.connect(b"", source="127.0.0.2")  # refused: its source holds its share already
    newcomers = [served.connect(b"", source="127.0.0.100") for _ in range(MAX_PER_SOURCE)]
    wait_until(lambda: served.refused("evicted") == MAX_PER_SOURCE, 5, "one eviction per newcomer")
    assert b"".join(iter(lambda: quiet.recv(4096), b"")) == b""  # closed at accept, nothing read or sent
    assert served.refused("source_cap") == 1
    held["127.0.0.100"] = newcomers
    left = {source: sum(not closed_by_server(s) for s in socks) for source, socks in held.items()}
    # Taken evenly from the sources holding the most; the newcomer's own once it held as many as they.
    assert sum(left.values()) == MAX_CONNECTIONS and max(left.values()) - min(left.values()) <= 1, left
    assert left["127.0.0.100"] == max(left.values()), left
    for socks in held.values():  # each source lost its oldest
        assert closed_by_server(socks[0]) and not closed_by_server(socks[-1])
    assert http_get(served.url + "/healthz") == (200, "ok\n")


def _flood(host: str, port: int, source: str, until: float) -> None:
    """Idle connections from `source` at full speed until `until`, never a byte; at most 400 held.

    At the lowest CPU priority, as a pod's CPU limit keeps it from starving the node's daemons: what is
    tested is the server's fairness, not the scheduler's (a flood that outruns accept fills the kernel's
    accept queue for every source).
    """
    os.nice(19)
    held: list[socket.socket] = []
    opened = 0
    while time.monotonic() < until and opened < 50_000:
        sock = socket.socket()
        try:
            sock.setblocking(False)
            sock.bind((source, 0))
            sock.connect_ex((host, port))
        except OSError:
            sock.close()
            time.sleep(0.001)
            continue
        opened += 1
        held.append(sock)
        if len(held) > 400:
            held.pop(0).close()
    for sock in held:
        sock.close()


def test_an_idle_connection_flood_from_other_sources_never_fails_a_probe(serve: Callable[..., Served]) -> None:
    served = serve()
    host, port = served.address
    fork = multiprocessing.get_context("fork")
    until = time.monotonic() + 12
    floods = [fork.Process(target=_flood, args=(host, port, f"127.0.0.{n}", until), daemon=True) for n in (2, 3, 4)]
    for flood in floods:
        flood.start()
    try:
        wait_until(lambda: served.refused("source_cap") >= 100, 5, "the flood under way")
        slowest_probe = slowest_connect = 0.0
        for _ in range(20):
            started = time.monotonic()
            socket.create_connection(served.address, timeout=1, source_address=("127.0.0.1", 0)).close()
            slowest_connect = max(slowest_connect, time.monotonic() - started)
            started = time.monotonic()
            probe = served.connect(b"GET /healthz HTTP/1.1\r\nHost: colad\r\n\r\n")
            probe.settimeout(1)
            answer = b"".join(iter(functools.partial(probe.recv, 4096), b""))
            slowest_probe = max(slowest_probe, time.monotonic() - started)
            assert answer.startswith(b"HTTP/1.1 200 "), answer
            time.sleep(0.2)
        flooding = all(flood.is_alive() for flood in floods)
    finally:
        for flood in floods:
            flood.join(15)
            if flood.is_alive():
                flood.kill()
    assert flooding, "the flood ended before the probes did"
    assert slowest_probe < 1.0 and slowest_connect < 0.5, (slowest_probe, slowest_connect)
    print(
        f"flood: {served.refused('source_cap'):.0f} refused at accept, {served.refused('evicted'):.0f} evicted;"
        f" slowest probe {slowest_probe * 1000:.0f} ms, slowest connect {slowest_connect * 1000:.0f} ms"
    )


def _reading(source: str, sent: bytes = b"") -> httpserver._Reading:
    return httpserver._Reading(socket.socket(), 0.0, source, bytearray(sent))


@pytest.mark.parametrize(
    ("held", "newcomer", "expected"),
    [
        (["a", "a", "b"], "c", 0),  # the biggest holder's oldest
        (["b", "a", "a", "b", "b"], "c", 0),  # b holds the most
        (["a", "b", "a", "b"], "c", 0),  # a tie: the one whose oldest came first
        (["a", "b", "a", "b"], "b", 1),  # a tie with the newcomer's own source: its own
        (["a", "a", "b"], "b", 0),  # the newcomer holds less: never its own
        (["a", "a+", "a"], "c", 0),
        (["a+", "a", "a"], "c", 1),  # the oldest that sent nothing before an older one that did
        (["a+", "a+"], "c", 0),  # all sent something: the oldest
        ([], "c", None),
    ],
)
def test_choose_victim(held: list[str], newcomer: str, expected: int | None) -> None:
    readings = [_reading(h.rstrip("+"), b"G" if h.endswith("+") else b"") for h in held]
    try:
        victim = httpserver.choose_victim(readings, newcomer)
        assert (None if victim is None else readings.index(victim)) == expected
    finally:
        for r in readings:
            r.sock.close()


def test_choose_victim_never_takes_from_a_source_under_its_fair_share() -> None:
    seed = random.randrange(2**32)
    rng = random.Random(seed)
    sock = socket.socket()
    try:
        for _ in range(2000):
            sources = [f"s{n}" for n in range(rng.randint(1, 12))]
            readings = [
                httpserver._Reading(sock, 0.0, rng.choice(sources), bytearray(rng.choice([b"", b"G"])))
                for _ in range(MAX_CONNECTIONS)
            ]
            newcomer = rng.choice([*sources, "new"])
            counts = {s: sum(r.source == s for r in readings) for s in sources}
            victim = httpserver.choose_victim(readings, newcomer)
            assert victim is not None, seed
            fair = MAX_CONNECTIONS / len(set(counts) | {newcomer})
            assert counts[victim.source] == max(counts.values()) >= fair, seed
            assert counts[victim.source] >= counts.get(newcomer, 0), seed
            if victim.source != newcomer:
                assert counts[victim.source] > counts.get(newcomer, 0), seed
            same = [r for r in readings if r.source == victim.source]
            assert victim is next((r for r in same if not r.buffer), same[0]), seed
    finally:
        sock.close()


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
    assert sum(served.refused(r) for r in registry.HTTP_REFUSAL_REASONS) == 1


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
