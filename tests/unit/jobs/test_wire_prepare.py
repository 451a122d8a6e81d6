"""A device's own prepare after the queue: prestart.plan runs it only on a resource with a prepare.

The resource's `prepare` alone decides pre_start_required (fixed at Register), so on a resource
without one the kubelet never calls PreStartContainer; a device file's prepare there is ignored
(plan runs nothing, ignored_prepares names the device for a warning). Decoded from real wire bytes.
"""

from __future__ import annotations

import pytest

from colad.core.devices import Device, DeviceSet, replicate
from colad.jobs import prestart
from colad.queue.messages import DeviceSnapshot, decode, encode

pytestmark = pytest.mark.unit
R = "example.com/cola"
CMD = ("/usr/bin/reset",)


def through_the_queue(*devices: Device) -> DeviceSet:
    snapshot = decode(encode(DeviceSnapshot(1, 1, DeviceSet.of(devices), resource=R)))
    assert isinstance(snapshot, DeviceSnapshot)
    return snapshot.devices


def test_a_device_prepare_that_crossed_the_queue_replaces_the_resource_one() -> None:
    got = through_the_queue(Device("a"), Device("b", prepare=("/opt/fw", "--load")), Device("c", prepare=()))
    steps = prestart.plan(R, CMD, replicate(got, 2), ["b::1", "a::0", "c::0", "b::0"])
    assert [(s.argv, s.device_ids) for s in steps] == [
        (("/opt/fw", "--load", "b"), ("b::1", "b::0")),
        (("/usr/bin/reset", "a"), ("a::0",)),
    ]
    assert prestart.ignored_prepares(CMD, got) == ()


def test_without_a_resource_prepare_a_device_prepare_is_ignored_and_named() -> None:
    got = through_the_queue(Device("a"), Device("b", prepare=("/opt/fw",)), Device("c", prepare=()))
    assert prestart.plan(R, (), got, ["a", "b", "c"]) == []
    assert prestart.ignored_prepares((), got) == ("b",)  # () is "none for this device": nothing ignored
