"""The queue and the socket claim against hostile input.

Bad frames, a callback that fails, and every kind of object at a socket path:
a real QueueServer on a real Unix socket, real files on disk. Also the
`input.*` counters peers send, as /metrics exports them, checked by promtool.
"""

from __future__ import annotations

import os
import resource
import shutil
import socket
import struct
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from colad.core.errors import InstanceError
from colad.metrics.registry import Metrics
from colad.outputs.socketpath import ForeignPathError, SocketRecord, claim_socket_path
from colad.queue import messages
from colad.queue.client import QueueClient
from colad.queue.framing import frame
from colad.queue.server import MAX_PEERS, QueueServer
from tests.helpers import wait_until
from tests.integration.conftest import Serve
from tests.integration.support import Inbox, bind_socket

pytestmark = pytest.mark.integration


def stats(seq: int, **counters: int) -> messages.Stats:
    return messages.Stats(1, seq, "discovery", tuple(sorted(counters.items())))


HOSTILE_FRAMES: dict[str, bytes] = {
    "oversized_length": struct.pack("!I", messages.MAX_MESSAGE_BYTES + 1),
    "max_length_header": struct.pack("!I", 0xFFFFFFFF),
    "not_json": struct.pack("!I", 5) + b"\xff\xfe{[x",
    "json_not_object": struct.pack("!I", 2) + b"[]",
    "unknown_type": struct.pack("!I", 30) + b'{"v":1,"type":"evil","seq":1}'.ljust(30),
    "deep_nesting": (lambda b: struct.pack("!I", len(b)) + b)(b"[" * 100_000 + b"]" * 100_000),
    "empty_frame": struct.pack("!I", 0),
}


@pytest.mark.parametrize("raw", list(HOSTILE_FRAMES.values()), ids=list(HOSTILE_FRAMES))
def test_a_bad_frame_drops_only_its_sender(short_tmp: Path, serve: Serve, raw: bytes) -> None:
    path = short_tmp / "queue.sock"
    server, inbox = serve(path)
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as evil:
        evil.connect(str(path))
        evil.sendall(raw)
        wait_until(lambda: inbox.rejects, 10, "the bad frame rejected")
        evil.settimeout(10)
        assert evil.recv(1) == b""  # disconnected
    client = QueueClient(str(path))
    client.publish(stats(1, **{"rescans.start": 1}))
    wait_until(lambda: inbox.of(messages.Stats), 10, "a good peer still heard")
    assert server.intact()
    client.close()


def test_a_failing_callback_is_logged_and_the_peer_kept(short_tmp: Path) -> None:
    inbox = Inbox()
    calls: list[int] = []

    def on_message(message: messages.Message, peer: object) -> None:
        calls.append(message.seq)
        if len(calls) == 1:
            raise ValueError("the handler's own bug")
        inbox.on_message(message, peer)  # type: ignore[arg-type]

    server = QueueServer(str(short_tmp / "q.sock"), on_message, on_reject=inbox.on_reject)
    server.start()
    try:
        client = QueueClient(str(short_tmp / "q.sock"))
        client.publish(stats(1, **{"rescans.start": 1}))
        wait_until(lambda: inbox.rejects == ["handler_error"], 10, "the failure counted")
        client.publish(stats(2, **{"rescans.start": 2}))
        wait_until(lambda: inbox.of(messages.Stats), 10, "the next message from the same connection")
        assert client.sock is not None  # never disconnected
        client.close()
    finally:
        server.stop()


def _dir(p: Path) -> None:
    p.mkdir()


def _file(p: Path) -> None:
    p.write_text("precious\n")


def _symlink_to_socket(p: Path) -> None:
    bind_socket(p.with_name("elsewhere.sock"))
    p.symlink_to(p.with_name("elsewhere.sock"))


def _dangling(p: Path) -> None:
    p.symlink_to(p.with_name("nothing"))


def _fifo(p: Path) -> None:
    os.mkfifo(p)


FOREIGN: dict[str, Callable[[Path], None]] = {
    "directory": _dir,
    "regular_file": _file,
    "symlink_to_a_stale_socket": _symlink_to_socket,
    "dangling_symlink": _dangling,
    "fifo": _fifo,
}


@pytest.mark.parametrize("make", list(FOREIGN.values()), ids=list(FOREIGN))
def test_claim_leaves_anything_but_a_stale_socket_of_ours_alone(short_tmp: Path, make: Callable[[Path], None]) -> None:
    path = short_tmp / "colad-1.sock"
    make(path)
    before = os.lstat(path)
    with pytest.raises(ForeignPathError, match="left alone"):
        claim_socket_path(str(path))
    after = os.lstat(path)
    assert (after.st_ino, after.st_mode) == (before.st_ino, before.st_mode)


def test_claim_removes_a_stale_recorded_socket_and_refuses_a_live_one(short_tmp: Path) -> None:
    record = SocketRecord(str(short_tmp / "state" / "sockets.json"))
    stale, unrecorded = short_tmp / "colad-1.sock", short_tmp / "colad-2.sock"
    bind_socket(stale)
    bind_socket(unrecorded)
    record.add(str(stale))
    reread = SocketRecord(record.path)  # what the next plugin finds in the run directory
    claim_socket_path(str(stale), owns=lambda st: reread.owns(str(stale), st))
    assert not stale.exists()
    with pytest.raises(ForeignPathError, match="no record"):
        claim_socket_path(str(unrecorded), owns=lambda st: reread.owns(str(unrecorded), st))
    assert unrecorded.is_socket()
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as live:
        live.bind(str(short_tmp / "live.sock"))
        live.listen(1)
        with pytest.raises(InstanceError, match="live process"):
            claim_socket_path(str(short_tmp / "live.sock"))
    (short_tmp / "state" / "sockets.json").write_text("{not json")
    assert SocketRecord(record.path).entries == {}  # a damaged record: nothing is ours, nothing removed


def test_a_directory_at_queue_sock_is_refused_not_removed(short_tmp: Path) -> None:
    path = short_tmp / "queue.sock"
    path.mkdir()
    server = QueueServer(str(path), lambda m, p: None)
    with pytest.raises(ForeignPathError):
        server.start()
    server.stop()
    assert path.is_dir()


def test_input_counters_from_peers_are_exported_and_promtool_clean(short_tmp: Path) -> None:
    metrics = Metrics()
    server = QueueServer(
        str(short_tmp / "q.sock"),
        lambda m, p: metrics.peers.update(m.role, p.pid, m.counters),  # type: ignore[union-attr]
    )
    server.start()
    try:
        client = QueueClient(str(short_tmp / "q.sock"))
        client.publish(stats(1, **{"input.bad_name": 3, "input.snapshot_too_large": 1, "rescans.start": 1}))
        reg = metrics.registry
        value = lambda reason: reg.get_sample_value(  # noqa: E731
            "colad_input_rejected_total", {"role": "discovery", "reason": reason}
        )
        wait_until(lambda: value("bad_name") == 3, 10, "input.bad_name exported")
        assert value("snapshot_too_large") == 1
        assert value("start") is None  # only input.* counters
        assert reg.get_sample_value("colad_input_rejected_total", {"role": "plugin", "reason": "foreign_path"}) == 0
        client.close()
    finally:
        server.stop()
    from prometheus_client import generate_latest

    if shutil.which("promtool") is None:
        pytest.skip("promtool not installed")
    exposition = generate_latest(reg)
    check = subprocess.run(["promtool", "check", "metrics"], input=exposition, capture_output=True, timeout=30)
    assert check.returncode == 0, check.stdout + check.stderr


def _connect(path: Path) -> socket.socket:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.connect(str(path))
    return sock


def test_peers_past_the_cap_are_closed_at_once_and_the_others_kept(short_tmp: Path, serve: Serve) -> None:
    path = short_tmp / "queue.sock"
    server, inbox = serve(path)
    held = [_connect(path) for _ in range(MAX_PEERS)]
    extra = _connect(path)
    try:
        extra.settimeout(10)
        assert extra.recv(1) == b""
        assert inbox.rejects.count("too_many_peers") == 1
        held[0].sendall(frame(stats(1, **{"rescans.start": 1})))
        wait_until(lambda: inbox.of(messages.Stats), 10, "a peer under the cap still heard")
        held.pop().close()  # a place comes free: the next publisher is served
        client = QueueClient(str(path))
        client.publish(stats(2, **{"rescans.start": 2}))
        wait_until(lambda: len(inbox.of(messages.Stats)) == 2, 10, "a new peer heard once one left")
        client.close()
    finally:
        for sock in [*held, extra]:
            sock.close()


def test_a_peer_that_stops_half_way_through_a_frame_is_dropped(short_tmp: Path, serve: Serve) -> None:
    path = short_tmp / "queue.sock"
    server, inbox = serve(path, partial_frame_timeout=0.5)
    whole = frame(stats(1, **{"rescans.start": 1}))
    with _connect(path) as slow, _connect(path) as idle:
        slow.sendall(whole + whole[: len(whole) // 2])  # one frame, then half of the next
        wait_until(lambda: inbox.of(messages.Stats), 10, "the whole frame heard")
        slow.settimeout(10)
        started = time.monotonic()
        assert slow.recv(1) == b""
        assert 0.3 <= time.monotonic() - started < 5
        assert inbox.rejects.count("bad_message") == 1
        idle.setblocking(False)  # a peer that sends nothing holds no buffer: it stays
        with pytest.raises(BlockingIOError):
            idle.recv(1)


def test_accept_without_a_free_descriptor_pauses_and_keeps_reading_peers(short_tmp: Path, serve: Serve) -> None:
    path = short_tmp / "queue.sock"
    server, inbox = serve(path)
    peer = _connect(path)
    wait_until(lambda: server._peers == 1, 5, "the first peer accepted")
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    highest = max(int(fd) for fd in os.listdir("/proc/self/fd"))
    filler = [os.open("/dev/null", os.O_RDONLY)]
    late = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        while filler[-1] < highest:
            filler.append(os.open("/dev/null", os.O_RDONLY))
        resource.setrlimit(resource.RLIMIT_NOFILE, (filler[-1] + 1, hard))
        late.connect(str(path))  # made before the limit, so the server's accept is the one that fails
        wait_until(lambda: "accept_failed" in inbox.rejects, 5, "accept(2) to fail with EMFILE")
        peer.sendall(frame(stats(1, **{"rescans.start": 1})))
        wait_until(lambda: inbox.of(messages.Stats), 5, "a connected peer read during the pause")
        time.sleep(1.0)  # two pauses at most, not a spin
        assert 1 <= inbox.rejects.count("accept_failed") <= 4
    finally:
        for fd in filler:
            os.close(fd)
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    wait_until(lambda: server._peers == 2, 5, "the waiting peer accepted once descriptors are back")
    late.sendall(frame(stats(2, **{"rescans.start": 2})))
    wait_until(lambda: len(inbox.of(messages.Stats)) == 2, 5, "the late peer heard")
    peer.close()
    late.close()
