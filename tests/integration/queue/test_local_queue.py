"""The local queue over real AF_UNIX sockets: delivery, peer checks, bad peers, replays, reconnects.

A real QueueServer collects into an Inbox (tests/integration/support.py); peers are
QueueClients or raw sockets speaking the 4-byte length + JSON frame by hand. Where a
test needs to know that the server has *processed* something it did not deliver, it
waits for the rejection (on_reject "stale" or "bad_message") or, for a hang-up, for the
server's own DEBUG log line "queue peer gone".
"""

from __future__ import annotations

import errno
import logging
import os
import socket
import stat
import struct
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from colad.core.constants import UNHEALTHY
from colad.core.devices import Device, DeviceSet
from colad.core.errors import InstanceError
from colad.outputs.socketpath import claim_socket_path
from colad.queue.client import QueueClient
from colad.queue.framing import Peer, frame, peer_of
from colad.queue.messages import MAX_MESSAGE_BYTES, DeviceSnapshot, KubeletState, Message, Stats
from colad.watchers.loop import poll
from tests.helpers import wait_until
from tests.integration.support import Serve, bind_socket

pytestmark = pytest.mark.integration

NOBODY = 65534
HEADER = struct.Struct("!I")  # the wire contract: a 4-byte big-endian payload length


def snapshot(epoch: int, seq: int, *ids: str, present: bool = True) -> DeviceSnapshot:
    return DeviceSnapshot(epoch, seq, DeviceSet.of(Device(i) for i in ids), present)


def many_devices(count: int = 10_000) -> DeviceSnapshot:
    ids = [f"{i:05d}-" + "c" * 57 for i in range(count)]
    assert all(len(i) == 63 for i in ids)
    return snapshot(1, 1, *ids)


def framed(payload: bytes) -> bytes:
    return HEADER.pack(len(payload)) + payload


def connect(path: Path) -> socket.socket:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.settimeout(5.0)
    sock.connect(str(path))
    return sock


def closed_by_peer(sock: socket.socket) -> bool:
    """Block (up to the socket's timeout) until the other end closes; True if it did."""
    try:
        return sock.recv(1) == b""
    except ConnectionResetError:
        return True
    except TimeoutError:
        return False


def log_count(caplog: pytest.LogCaptureFixture, text: str) -> int:
    return sum(text in record.getMessage() for record in caplog.records)


# ---------------------------------------------------------------- delivery


@pytest.mark.parametrize(
    "message",
    [
        pytest.param(
            DeviceSnapshot(1, 1, DeviceSet.of([Device("cola-1"), Device("cola-2", UNHEALTHY)])), id="snapshot"
        ),
        pytest.param(snapshot(1, 1, present=False), id="snapshot-dir-absent"),
        pytest.param(KubeletState(1, 1), id="kubelet-state"),
        pytest.param(Stats(1, 1, "discovery", (("queue.sent", 2), ("rescans.inotify", 3))), id="stats"),
        pytest.param(many_devices(), id="10000-devices-63-char-ids"),
    ],
)
def test_published_message_arrives_decoded_and_equal(short_tmp: Path, serve: Serve, message: Message) -> None:
    path = short_tmp / "q.sock"
    _, inbox = serve(path)
    client = QueueClient(str(path))
    try:
        client.publish(message)
        assert client.sent
        wait_until(lambda: inbox.messages, 10, "the message to arrive")
        assert inbox.messages == [message]
        assert inbox.peers == [Peer(os.getpid(), os.geteuid(), os.getegid())]
        assert inbox.rejects == []
    finally:
        client.close()


def test_the_big_snapshot_is_bigger_than_one_socket_buffer() -> None:
    # Otherwise the 10,000-device case above would not prove that frames are reassembled.
    assert len(frame(many_devices())) > 700_000


def test_both_message_types_arrive_in_order_on_one_connection(short_tmp: Path, serve: Serve) -> None:
    path = short_tmp / "q.sock"
    _, inbox = serve(path)
    first, second = snapshot(5, 1, "cola-1"), KubeletState(6, 1)
    client = QueueClient(str(path))
    try:
        client.publish(first)
        client.publish(second)
        wait_until(lambda: len(inbox.messages) >= 2, 5, "both messages")
        assert inbox.messages == [first, second]
    finally:
        client.close()


# ---------------------------------------------------------------- who may talk


def test_socket_file_is_a_0600_socket_owned_by_the_server_uid(short_tmp: Path, serve: Serve) -> None:
    path = short_tmp / "q.sock"
    serve(path)
    st = os.stat(path)
    assert stat.S_ISSOCK(st.st_mode)
    assert stat.S_IMODE(st.st_mode) == 0o600
    assert st.st_uid == os.geteuid()


def _as_nobody_send(path: str, data: bytes) -> int:
    """Child side: drop to nobody, connect, send a valid frame, wait for the server to hang up.

    0 = connected and the server closed on us; 1 = connect refused by permissions;
    2 = the server kept the connection open; 3 = anything else.
    """
    os.setgroups([])
    os.setgid(NOBODY)
    os.setuid(NOBODY)
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.settimeout(5.0)
    try:
        sock.connect(path)
    except PermissionError:
        return 1
    try:
        sock.sendall(data)
    except (BrokenPipeError, ConnectionResetError):
        return 0
    return 0 if closed_by_peer(sock) else 2


def run_as_child(body: Callable[[], int]) -> int:
    pid = os.fork()
    if pid == 0:  # never return into pytest from the child
        code = 3
        try:
            code = body()
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(status)


@pytest.mark.parametrize("loosen", [False, True], ids=["socket-as-created-0600", "socket-loosened-to-0666"])
def test_peer_of_another_uid_is_not_delivered_and_others_still_are(short_tmp: Path, serve: Serve, loosen: bool) -> None:
    path = short_tmp / "q.sock"
    _, inbox = serve(path)
    if loosen:  # let the kernel admit nobody, so only SO_PEERCRED stands in the way
        os.chmod(path, 0o666)
    data = frame(snapshot(1, 1, "intruder"))

    code = run_as_child(lambda: _as_nobody_send(str(path), data))

    assert code in ((0,) if loosen else (0, 1)), f"child outcome {code}"
    if code == 0:
        wait_until(lambda: inbox.rejects == ["peer_uid"], 5, "the server to refuse uid 65534")
    ours = snapshot(2, 1, "ours")
    client = QueueClient(str(path))
    try:
        client.publish(ours)
        wait_until(lambda: inbox.messages, 5, "our own message")
        assert inbox.messages == [ours]
    finally:
        client.close()


def test_uid_outside_allowed_uids_is_refused_even_for_root(short_tmp: Path, serve: Serve) -> None:
    path = short_tmp / "q.sock"
    _, inbox = serve(path, allowed_uids=frozenset({12345}))
    raw = connect(path)
    try:
        raw.sendall(frame(snapshot(1, 1, "cola-1")))
    except BrokenPipeError:
        pass  # the server may already have refused and closed us: that is the point
    assert closed_by_peer(raw), "the server kept a connection from a refused uid"
    raw.close()
    client = QueueClient(str(path))
    try:
        client.publish(snapshot(1, 2, "cola-1"))
        wait_until(lambda: inbox.rejects == ["peer_uid", "peer_uid"], 5, "both peers refused")
        # The server closes a refused peer before reading from it: nothing can still be in flight.
        assert inbox.messages == []
    finally:
        client.close()


def _serve_as_nobody(directory: Path, ready_w: int, result_w: int) -> int:
    """Child side: a queue 'server' owned by nobody that reports how many bytes it was sent."""
    os.setgroups([])
    os.setgid(NOBODY)
    os.setuid(NOBODY)
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(str(directory / "q.sock"))
    listener.listen(1)
    listener.settimeout(5.0)
    os.write(ready_w, b"r")
    conn, _ = listener.accept()
    conn.settimeout(5.0)
    received = 0
    while chunk := conn.recv(65536):
        received += len(chunk)
    os.write(result_w, str(received).encode())
    return 0


def test_client_refuses_a_queue_owned_by_another_uid(short_tmp: Path) -> None:
    directory = short_tmp / "foreign"
    directory.mkdir()
    directory.chmod(0o777)
    ready_r, ready_w = os.pipe()
    result_r, result_w = os.pipe()
    pid = os.fork()
    if pid == 0:
        code = 3
        try:
            code = _serve_as_nobody(directory, ready_w, result_w)
        finally:
            os._exit(code)
    os.close(ready_w)
    os.close(result_w)
    try:
        assert os.read(ready_r, 1) == b"r", "the child server did not start"
        client = QueueClient(str(directory / "q.sock"))
        client.publish(snapshot(1, 1, "secret"))
        assert client.sock is None
        assert not client.sent
        assert client.next_retry() is not None
        assert os.read(result_r, 32) == b"0", "the client sent bytes to a queue owned by uid 65534"
    finally:
        _, status = os.waitpid(pid, 0)
        os.close(ready_r)
        os.close(result_r)
    assert os.waitstatus_to_exitcode(status) == 0


def test_peer_of_reports_the_connecting_process(short_tmp: Path, serve: Serve) -> None:
    path = short_tmp / "q.sock"
    serve(path)
    raw = connect(path)
    try:
        assert peer_of(raw).uid == os.geteuid()
        assert peer_of(raw).pid == os.getpid()  # the server lives in this process too
    finally:
        raw.close()


# ---------------------------------------------------------------- bad peers

GOOD = snapshot(1, 1, "cola-1")


@pytest.mark.parametrize(
    "data, hang_up, delivered, rejects",
    [
        pytest.param(framed(b"not json"), False, [], ["bad_message"], id="not-json"),
        pytest.param(framed(b"\xff\xfe\xfd"), False, [], ["bad_message"], id="not-utf8"),
        pytest.param(framed(b"[1, 2, 3]"), False, [], ["bad_message"], id="json-not-an-object"),
        pytest.param(
            framed(b'{"v":1,"type":"gossip","epoch":1,"seq":1}'), False, [], ["bad_message"], id="unknown-type"
        ),
        pytest.param(
            framed(b'{"v":2,"type":"kubelet_state","epoch":1,"seq":1,"kubelet_socket":"","plugin_sockets":[]}'),
            False,
            [],
            ["bad_message"],
            id="future-version",
        ),
        pytest.param(
            framed(
                b'{"v":1,"type":"device_snapshot","epoch":1,"seq":1,"dir_present":true,"devices":[["a b","Healthy"]]}'
            ),
            False,
            [],
            ["bad_message"],
            id="invalid-device-id",
        ),
        pytest.param(HEADER.pack(MAX_MESSAGE_BYTES + 1), False, [], ["bad_message"], id="header-over-the-limit"),
        pytest.param(HEADER.pack(0xFFFFFFFF) + b"x" * 100, False, [], ["bad_message"], id="header-4GiB"),
        pytest.param(HEADER.pack(100) + b"0123456789", True, [], [], id="truncated-then-eof"),
        pytest.param(HEADER.pack(100)[:2], True, [], [], id="half-a-header-then-eof"),
        pytest.param(frame(GOOD) + framed(b"{[}"), False, [GOOD], ["bad_message"], id="valid-then-garbage"),
    ],
)
def test_bad_peer_is_dropped_and_a_good_one_still_gets_through(
    short_tmp: Path,
    serve: Serve,
    caplog: pytest.LogCaptureFixture,
    data: bytes,
    hang_up: bool,
    delivered: list[Message],
    rejects: list[str],
) -> None:
    caplog.set_level(logging.DEBUG, logger="colad.queue.server")
    path = short_tmp / "q.sock"
    _, inbox = serve(path)
    raw = connect(path)
    raw.sendall(data)
    if hang_up:
        raw.close()
    else:
        assert closed_by_peer(raw), "the server kept talking to a peer that sent garbage"
        raw.close()
    wait_until(lambda: log_count(caplog, "queue peer gone"), 5, "the server to drop the peer")
    assert inbox.rejects == rejects

    good = snapshot(2, 1, "cola-2")
    client = QueueClient(str(path))
    try:
        client.publish(good)
        wait_until(lambda: good in inbox.messages, 5, "the good client's message")
        assert inbox.messages == [*delivered, good]
        assert inbox.rejects == rejects
        assert client.sock is not None
    finally:
        client.close()


# ---------------------------------------------------------------- replays and restarts

CLOSE = None
S = snapshot


def K(epoch: int, seq: int) -> KubeletState:  # noqa: N802 - reads like S(...) in the tables
    return KubeletState(epoch, seq)


@pytest.mark.parametrize(
    "steps, delivered",
    [
        pytest.param([("a", S(1, 5)), ("a", S(1, 5))], [S(1, 5)], id="same-frame-twice"),
        pytest.param([("a", S(1, 5)), ("a", S(1, 4))], [S(1, 5)], id="lower-seq"),
        pytest.param([("a", S(1, 5)), ("a", S(0, 9))], [S(1, 5)], id="lower-epoch-higher-seq"),
        pytest.param([("a", S(1, 5)), ("a", S(1, 6))], [S(1, 5), S(1, 6)], id="higher-seq"),
        pytest.param([("a", S(1, 5)), ("a", S(2, 0))], [S(1, 5), S(2, 0)], id="higher-epoch-lower-seq"),
        pytest.param([("a", S(1, 5)), ("a", K(0, 1))], [S(1, 5), K(0, 1)], id="types-tracked-apart"),
        pytest.param([("a", S(100, 5)), ("b", S(50, 1))], [S(100, 5)], id="lower-epoch-while-old-sender-connected"),
        pytest.param(
            [("a", S(100, 5)), ("a", CLOSE), ("b", S(50, 1)), ("b", S(50, 1)), ("b", S(50, 2))],
            [S(100, 5), S(50, 1), S(50, 2)],
            id="lower-epoch-after-old-sender-closed",
        ),
        pytest.param(
            [("a", S(100, 5)), ("a", K(100, 1)), ("a", CLOSE), ("b", S(50, 1)), ("b", K(50, 1))],
            [S(100, 5), K(100, 1), S(50, 1), K(50, 1)],
            id="old-sender-closed-forgets-every-type-it-sent",
        ),
        pytest.param(
            [("a", S(100, 5)), ("b", S(50, 1)), ("b", CLOSE), ("c", S(50, 2)), ("a", S(100, 5))],
            [S(100, 5)],
            id="stale-sender-hanging-up-keeps-live-sender-position",
        ),
        pytest.param(
            [("a", Stats(9, 1, "discovery")), ("a", Stats(1, 1, "kubelet-watch")), ("a", Stats(9, 1, "discovery"))],
            [Stats(9, 1, "discovery"), Stats(1, 1, "kubelet-watch")],
            id="stats-tracked-per-role",
        ),
    ],
)
def test_sequence_rules(
    short_tmp: Path,
    serve: Serve,
    caplog: pytest.LogCaptureFixture,
    steps: list[tuple[str, Message | None]],
    delivered: list[Message],
) -> None:
    caplog.set_level(logging.DEBUG, logger="colad.queue.server")
    path = short_tmp / "q.sock"
    _, inbox = serve(path)
    conns: dict[str, socket.socket] = {}
    sent = hung_up = 0
    try:
        # Lock-step: each frame is delivered or rejected as stale (each hang-up logged) before the next step.
        for name, message in steps:
            if message is CLOSE:
                conns.pop(name).close()
                hung_up += 1
                wait_until(
                    lambda n=hung_up: log_count(caplog, "queue peer gone") >= n, 5, f"the server to see {name} go"
                )
                continue
            if name not in conns:
                conns[name] = connect(path)
            conns[name].sendall(frame(message))
            sent += 1
            wait_until(
                lambda n=sent: len(inbox.messages) + len(inbox.rejects) >= n,
                5,
                f"the server to process {message}",
            )
        assert inbox.messages == delivered
        assert inbox.rejects == ["stale"] * (sent - len(delivered))
    finally:
        for sock in conns.values():
            sock.close()


# ---------------------------------------------------------------- claiming the socket path


def _nothing(path: Path, keep: list[socket.socket]) -> None:
    pass


def _stale(path: Path, keep: list[socket.socket]) -> None:
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(str(path))
    listener.listen(1)
    listener.close()  # the file stays, nothing answers: what a killed process leaves


def _live(path: Path, keep: list[socket.socket]) -> None:
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(str(path))
    listener.listen(8)
    keep.append(listener)


def _live_with_full_backlog(path: Path, keep: list[socket.socket]) -> None:
    """A live listener that is not accepting right now (busy or stopped) and whose queue is full."""
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(str(path))
    listener.listen(0)
    keep.append(listener)
    for _ in range(64):
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.setblocking(False)
        keep.append(sock)
        try:
            sock.connect(str(path))
        except BlockingIOError as exc:
            assert exc.errno == errno.EAGAIN
            return
    raise AssertionError("could not fill the listen backlog")


@pytest.mark.parametrize(
    "setup, live",
    [
        pytest.param(_nothing, False, id="absent"),
        pytest.param(_stale, False, id="stale-socket"),
        pytest.param(_live, True, id="live-listener"),
        pytest.param(
            _live_with_full_backlog,
            True,
            id="live-listener-with-full-backlog",
        ),
    ],
)
def test_claim_socket_path(short_tmp: Path, setup: Callable[[Path, list[socket.socket]], None], live: bool) -> None:
    path = short_tmp / "q.sock"
    keep: list[socket.socket] = []
    try:
        setup(path, keep)
        if live:
            with pytest.raises(InstanceError):
                claim_socket_path(str(path))
            assert stat.S_ISSOCK(os.lstat(path).st_mode), "a live instance's socket was removed"
        else:
            claim_socket_path(str(path))
            assert not os.path.lexists(path)
            bind_socket(path)  # and the path really is free for bind()
    finally:
        for sock in keep:
            sock.close()


def test_live_listener_still_answers_after_a_refused_claim(short_tmp: Path, serve: Serve) -> None:
    path = short_tmp / "q.sock"
    _, inbox = serve(path)
    with pytest.raises(InstanceError):
        claim_socket_path(str(path))
    client = QueueClient(str(path))
    try:
        client.publish(GOOD)
        wait_until(lambda: inbox.messages == [GOOD], 5, "delivery after the refused claim")
    finally:
        client.close()


# ---------------------------------------------------------------- client resilience


def test_client_survives_absent_and_restarted_server_and_sends_only_the_latest(short_tmp: Path, serve: Serve) -> None:
    path = short_tmp / "q.sock"
    client = QueueClient(str(path))
    try:
        first, second, third = (snapshot(7, seq, f"cola-{seq}") for seq in (1, 2, 3))
        state = KubeletState(8, 1)
        client.publish(first)  # no server: must not raise
        assert client.sock is None
        assert not client.sent
        assert client.next_retry() is not None
        client.publish(second)
        client.publish(state)
        client.publish(third)
        assert not client.sent
        assert client.counters["queue.dropped"] == 2  # first and second were superseded unsent

        server, inbox = serve(path)
        assert client.flush(force=True)
        assert client.sent
        assert client.next_retry() is None
        wait_until(lambda: len(inbox.messages) >= 2, 5, "the latest of each type")
        # One connection, each type's latest sent once: nothing older can follow.
        assert sorted(inbox.messages, key=lambda m: m.type) == [third, state]

        server.stop()
        _, inbox2 = serve(path)
        fd = client.fileno()
        assert fd is not None
        assert fd in poll([fd], 5.0), "the client socket never polled readable after the server stopped"
        client.check_alive()
        assert client.sock is None
        assert not client.sent
        assert client.flush(force=True)
        wait_until(lambda: len(inbox2.messages) >= 2, 5, "the resend to the new server")
        assert sorted(inbox2.messages, key=lambda m: m.type) == [third, state]

        fourth = snapshot(7, 4, "cola-4")
        client.publish(fourth)
        wait_until(lambda: len(inbox2.messages) >= 3, 5, "the next snapshot")
        assert inbox2.messages[2:] == [fourth]
    finally:
        client.close()


def test_check_alive_on_a_quiet_healthy_connection_neither_blocks_nor_disconnects(
    short_tmp: Path, serve: Serve
) -> None:
    path = short_tmp / "q.sock"
    serve(path)
    client = QueueClient(str(path), send_timeout=0.5)
    try:
        client.publish(GOOD)
        sock = client.sock
        assert sock is not None and client.sent
        started = time.monotonic()
        client.check_alive()  # nothing to read: a quiet plugin is not a dead one
        elapsed = time.monotonic() - started
        assert (client.sock is sock, client.sent) == (True, True), "a healthy connection was dropped"
        assert elapsed < 0.25, f"check_alive blocked for {elapsed:.2f}s"
    finally:
        client.close()


def test_publish_to_a_server_that_never_reads_gives_up_after_send_timeout(short_tmp: Path, serve: Serve) -> None:
    path = short_tmp / "q.sock"
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(str(path))
    listener.listen(1)  # accepts nothing, reads nothing: a hung plugin
    client = QueueClient(str(path), send_timeout=0.5)
    big = many_devices()
    try:
        # In a thread, so that a publish that blocks for ever fails this test instead of hanging the run.
        started = time.monotonic()
        publisher = threading.Thread(target=client.publish, args=(big,), daemon=True)
        publisher.start()
        publisher.join(timeout=5.0)
        elapsed = time.monotonic() - started
        assert not publisher.is_alive(), "publish was still blocked after 5 s"
        assert elapsed >= 0.4, f"publish returned after {elapsed:.2f}s: did the send ever block?"
        assert client.sock is None
        assert not client.sent

        listener.close()
        os.unlink(path)
        _, inbox = serve(path)
        assert client.flush(force=True)
        wait_until(lambda: inbox.messages, 10, "the pending snapshot at the real server")
        assert inbox.messages == [big]
    finally:
        listener.close()
        client.close()
