"""The queue server's reused receive chunk: frames arrive whole, whatever the reads cut them into.

One byte stream of stats, snapshots (one larger than the chunk) and a bad frame at the end goes to a
real QueueServer over a real socket, split at random points with a pause at each, so reads end
inside headers, inside payloads and between frames. Every frame before the bad one is delivered in
order, the bad one drops the peer, and a new peer is still served: one chunk serves every connection.
"""

from __future__ import annotations

import random
import socket
import struct
import time
from pathlib import Path

import pytest

from colad.core.devices import Device, DeviceSet
from colad.queue import server
from colad.queue.framing import frame
from colad.queue.messages import DeviceSnapshot, Message, Stats
from tests.helpers import wait_until
from tests.integration.support import Serve

pytestmark = pytest.mark.integration


def _stream(rng: random.Random) -> list[Message]:
    messages: list[Message] = []
    for seq in range(1, 9):
        if rng.random() < 0.5:
            messages.append(Stats(1, seq, "discovery", (("rescans.inotify", seq),)))
        else:
            count = rng.choice([0, 1, 10, 3_000])  # 3,000 63-character IDs: ~2 chunks
            ids = [f"{i:05d}-" + "c" * 57 for i in range(count)]
            messages.append(DeviceSnapshot(1, seq, DeviceSet.of(Device(i) for i in ids), True, f"example.com/r{seq}"))
    return messages


@pytest.mark.parametrize("seed", range(6))
def test_frames_cut_anywhere_arrive_whole_and_in_order(short_tmp: Path, serve: Serve, seed: int) -> None:
    rng = random.Random(seed)
    sent = _stream(rng)
    data = b"".join(frame(m) for m in sent) + struct.pack("!I", 5) + b"{bad}"
    assert max(len(frame(m)) for m in sent) < 10 * server.RECV_CHUNK
    path = short_tmp / "q.sock"
    _server, inbox = serve(path)
    cuts = sorted(rng.sample(range(1, len(data)), 40))
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as raw:
        raw.settimeout(30)
        raw.connect(str(path))
        for start, end in zip([0, *cuts], [*cuts, len(data)], strict=True):
            raw.sendall(data[start:end])
            time.sleep(0.002)  # most pieces are a read of their own
        wait_until(lambda: "bad_message" in inbox.rejects, 30, "the bad frame's refusal")
    assert inbox.messages == sent
    # The chunk serves the next peer too, from a clean start.
    after = Stats(2, 1, "discovery", (("rescans.inotify", 1),))
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as raw:
        raw.connect(str(path))
        raw.sendall(frame(after))
        wait_until(lambda: len(inbox.messages) == len(sent) + 1, 30, "the next peer's message")
    assert inbox.messages[-1] == after
