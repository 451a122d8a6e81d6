"""The queue frame carries any list the kubelet can take, over a real QueueServer and QueueClient.

226,600 short IDs ("0".."226599") are the most whose ListAndWatch protobuf fits the kubelet's
4 MiB; the old 4 MiB JSON frame held only 203,806 of them. Now the whole snapshot crosses, sender
(fit_the_queue) and reader agree on one limit, and a frame over it is refused without harm.
"""

from __future__ import annotations

import logging
import socket
import struct
from pathlib import Path

import pytest

from colad.core.constants import UNHEALTHY
from colad.core.devices import Device, DeviceSet
from colad.core.errors import MessageError
from colad.deviceplugin.device_list import fit_list
from colad.queue.client import QueueClient
from colad.queue.device_wire import set_digest
from colad.queue.framing import frame
from colad.queue.messages import MAX_MESSAGE_BYTES, DeviceDelta, DeviceSnapshot, encode
from colad.queue.snapshots import TOO_LARGE, fit_the_queue
from tests.helpers import wait_until
from tests.integration.support import Serve

pytestmark = pytest.mark.integration
HEADER = struct.Struct("!I")
KUBELET_MOST = 226_600


@pytest.fixture(scope="module")
def largest() -> DeviceSnapshot:
    return DeviceSnapshot(7, 1, DeviceSet.of(Device(str(i)) for i in range(KUBELET_MOST)))


def test_the_largest_kubelet_list_is_the_case(largest: DeviceSnapshot) -> None:
    assert fit_list(largest.devices, 1).dropped == 0
    one_more = DeviceSet.of(Device(str(i)) for i in range(KUBELET_MOST + 1))
    assert fit_list(one_more, 1).dropped == 1  # the kubelet's 4 MiB takes no more
    assert 4 * 1024 * 1024 < len(encode(largest)) <= MAX_MESSAGE_BYTES  # over the old frame, inside the new


def test_the_largest_kubelet_list_survives_the_queue_whole(
    short_tmp: Path, serve: Serve, largest: DeviceSnapshot
) -> None:
    fitted = fit_the_queue(largest, {})
    assert (fitted.devices, fitted.demoted, fitted.dropped) == (largest.devices, (), ())
    path = short_tmp / "q.sock"
    _, inbox = serve(path)
    client = QueueClient(str(path), send_timeout=30)
    try:
        client.publish(largest)
        assert client.sent and client.counters["input.oversized_message"] == 0
        wait_until(lambda: inbox.messages, 60, "the 226,600-device snapshot", interval=0.05)
        assert inbox.messages == [largest] and inbox.rejects == []
        # A delta on top of it: the receiver held the exact set, so the digest matches.
        after = DeviceSet.of([*largest.devices.devices[1:], Device("0", UNHEALTHY)])
        next_one = DeviceSnapshot(7, 2, after)
        delta = DeviceDelta(7, 2, 1, (Device("0", UNHEALTHY),), (), set_digest(after))
        client.publish(next_one, delta=delta)
        wait_until(lambda: len(inbox.messages) == 2, 60, "the delta", interval=0.05)
        assert inbox.messages[1] == next_one and inbox.rejects == []
    finally:
        client.close()


def _padded_snapshot(size: int) -> bytes:
    """A valid snapshot body of exactly `size` bytes (JSON allows trailing whitespace)."""
    body = encode(DeviceSnapshot(1, 1, DeviceSet.of([Device("cola-1")])))
    return body + b" " * (size - len(body))


def test_a_frame_at_the_limit_is_read_and_one_over_is_refused_without_harm(
    short_tmp: Path, serve: Serve, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG, logger="colad.queue.server")
    path = short_tmp / "q.sock"
    server, inbox = serve(path)
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as raw:
        raw.settimeout(30)
        raw.connect(str(path))
        raw.sendall(HEADER.pack(MAX_MESSAGE_BYTES) + _padded_snapshot(MAX_MESSAGE_BYTES))
        wait_until(lambda: inbox.messages, 60, "the frame of exactly the limit", interval=0.05)
        # One byte over: refused from the header alone, before any of it is buffered.
        raw.sendall(HEADER.pack(MAX_MESSAGE_BYTES + 1) + b" " * 65536)
        wait_until(lambda: inbox.rejects, 30, "the refusal")
        assert raw.recv(1) == b""  # the bad peer is dropped
    assert inbox.rejects == ["bad_message"]
    assert any(f"frame of {MAX_MESSAGE_BYTES + 1} bytes over the limit" in r.getMessage() for r in caplog.records)
    # The sender refuses to frame what the reader would refuse, counts it and goes on.
    client = QueueClient(str(path))
    try:
        huge = DeviceSnapshot(2, 1, DeviceSet.of([Device(f"d{i}", UNHEALTHY, reason="r" * 512) for i in range(25_000)]))
        with pytest.raises(MessageError, match="over the"):
            frame(huge)
        client.publish(huge)
        assert client.counters["input.oversized_message"] == 1
        good = DeviceSnapshot(2, 2, DeviceSet.of([Device("cola-2")]))
        client.publish(good)
        wait_until(lambda: good in inbox.messages, 10, "a good message after both refusals")
        assert server.intact() and inbox.rejects == ["bad_message"]
    finally:
        client.close()


def test_content_is_still_demoted_to_fit_and_the_frame_is_what_the_reader_takes() -> None:
    # Sick short devices with the longest reasons: first demoted with TOO_LARGE, then (still too
    # large) bare Unhealthy; every device stays listed, none is withdrawn.
    count = MAX_MESSAGE_BYTES // 80  # ~157,000: over the frame even with TOO_LARGE's shorter text
    sick = DeviceSnapshot(1, 1, DeviceSet.of(Device(str(i), UNHEALTHY, reason="r" * 512) for i in range(count)))
    fitted = fit_the_queue(sick, {})
    assert fitted.dropped == () and fitted.devices.ids == sick.devices.ids
    assert fitted.size == len(encode(DeviceSnapshot(1, 2**63 - 1, fitted.devices))) <= MAX_MESSAGE_BYTES
    assert all(not d.healthy and not d.reason for d in fitted.devices)
    assert {d.problem for d in fitted.devices} == {"", TOO_LARGE}  # as many as fit still say why
    assert set(fitted.demoted) == set(sick.devices.ids)
