"""The queue frame limit follows from the kubelet's: JSON against protobuf, entry by entry, measured.

Whatever the kubelet sees of a device (ID, health, NUMA nodes) must fit the queue for every
list the kubelet's 4 MiB takes, so messages.JSON_PER_PROTOBUF must bound the ratio of a device's
queue entry to its ListAndWatch entry; file content beyond that is fit_the_queue's to demote.
"""

from __future__ import annotations

import itertools

import pytest

from colad.core.constants import HEALTHY, KUBELET_MAX_RECV_MESSAGE_BYTES, MAX_DEVICE_ID_LENGTH, UNHEALTHY
from colad.core.devices import Device, DeviceSet
from colad.deviceplugin.device_list import fit_list, list_entry
from colad.queue.device_wire import device_entry
from colad.queue.messages import JSON_PER_PROTOBUF, MAX_MESSAGE_BYTES, DeviceSnapshot, snapshot_size
from colad.queue.snapshots import fit_the_queue

pytestmark = pytest.mark.unit
NUMA = [(), (0,), (1,), (127,), (128,), (1023,), (0, 1), tuple(range(64)), tuple(range(960, 1024))]


def ratio(device: Device) -> float:
    return (len(device_entry(device)) + 1) / len(list_entry(device))  # the queue's separating comma counted


def test_the_worst_json_per_protobuf_ratio_is_under_the_bound() -> None:
    shapes = [
        Device("a" * n, health, numa_nodes=numa)
        for n, health, numa in itertools.product((1, 2, 6, 10, MAX_DEVICE_ID_LENGTH), (HEALTHY, UNHEALTHY), NUMA)
    ]
    worst = max(shapes, key=ratio)
    assert worst == Device("a", UNHEALTHY, numa_nodes=(0,)) and ratio(worst) == 49 / 20 < JSON_PER_PROTOBUF
    assert ratio(Device("0")) == 16 / 14
    assert MAX_MESSAGE_BYTES == JSON_PER_PROTOBUF * KUBELET_MAX_RECV_MESSAGE_BYTES


@pytest.mark.parametrize(
    "shape",
    [Device("x", UNHEALTHY, numa_nodes=(0,)), Device("x", UNHEALTHY), Device("x", numa_nodes=tuple(range(64)))],
    ids=["worst-ratio", "bare-unhealthy", "64-numa-nodes"],
)
def test_a_full_kubelet_list_of_any_shape_fits_the_queue_whole(shape: Device) -> None:
    # Exactly the list the kubelet's 4 MiB takes of this shape, with the shortest IDs.
    per = len(list_entry(Device("0", shape.health, numa_nodes=shape.numa_nodes)))
    offered = DeviceSet.of(
        Device(str(i), shape.health, numa_nodes=shape.numa_nodes)
        for i in range(KUBELET_MAX_RECV_MESSAGE_BYTES // per + 1)
    )
    taken = fit_list(offered, 1)
    assert taken.dropped > 0  # the kubelet's limit, not the offer, decided the list
    snapshot = DeviceSnapshot(1, 2**63 - 1, taken.devices)
    assert snapshot_size(snapshot) <= MAX_MESSAGE_BYTES
    fitted = fit_the_queue(snapshot, {})
    assert (fitted.devices, fitted.demoted, fitted.dropped) == (taken.devices, (), ())
