"""QueueClient keeps no full frame once it is sent, and every new connection still starts full.

A real listening Unix socket plays the plugin: the first connection gets the snapshot, a
delta follows on it, and after the peer closes, the next connection gets the full latest
snapshot again, encoded anew from the message the client keeps.
"""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from colad.core.devices import Device, DeviceSet
from colad.queue import messages
from colad.queue.client import QueueClient
from colad.queue.device_wire import set_digest
from colad.queue.framing import HEADER

pytestmark = pytest.mark.integration


def _read_message(conn: socket.socket) -> messages.Message:
    def exactly(size: int) -> bytes:
        data = b""
        while len(data) < size:
            chunk = conn.recv(size - len(data))
            assert chunk, "the client closed mid-frame"
            data += chunk
        return data

    (length,) = HEADER.unpack(exactly(HEADER.size))
    return messages.decode(exactly(length))


def _snapshot(seq: int, count: int) -> messages.DeviceSnapshot:
    return messages.DeviceSnapshot(7, seq, DeviceSet.of(Device(f"cola{i}") for i in range(count)))


def test_a_sent_snapshot_frame_is_dropped_and_a_reconnect_still_gets_the_full_snapshot(short_tmp: Path) -> None:
    path = str(short_tmp / "queue.sock")
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path)
    listener.listen(4)
    listener.settimeout(10)
    client = QueueClient(path, send_timeout=10)
    try:
        first = _snapshot(1, 3000)
        client.publish(first)
        assert client.sent
        conn, _ = listener.accept()
        conn.settimeout(10)
        assert _read_message(conn) == first
        assert all(f is None for f in client._frames.values()), "a sent frame is still kept"

        # A delta on the connection that carried its base: the delta goes, no full frame is made.
        second = _snapshot(2, 3001)
        added = Device("cola3000")
        delta = messages.DeviceDelta(7, 2, 1, (added,), (), set_digest(second.devices))
        client.publish(second, delta=delta)
        assert _read_message(conn) == delta
        assert all(f is None for f in client._frames.values())

        # The plugin restarts: the next connection must start from the full latest snapshot.
        conn.close()
        client.check_alive()
        assert client.sock is None and not client.sent
        assert client.flush(force=True)
        conn, _ = listener.accept()
        conn.settimeout(10)
        assert _read_message(conn) == second
        assert all(f is None for f in client._frames.values())
        conn.close()
    finally:
        client.close()
        listener.close()
