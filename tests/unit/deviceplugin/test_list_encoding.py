"""The ListAndWatch message built from cached entries is protobuf's own serialization, byte for byte.

device_list.encoded_list joins each device's cached entry; these tests compare it with a message
built the plain way (one pb.Device per device) over random sets and random change sequences
that keep unchanged Device objects (as snapshots.Receiver does), with topology, health changes,
removals, replicas and the 4 MiB cut (against the cut computed with ByteSize()).
"""

from __future__ import annotations

import random
from dataclasses import replace

import pytest

from colad.api import deviceplugin_pb2 as pb
from colad.core.constants import HEALTHY, MAX_NUMA_NODE, UNHEALTHY
from colad.core.devices import Device, DeviceSet, replicate
from colad.deviceplugin import device_list
from colad.deviceplugin.broadcast import DeviceBroadcast

pytestmark = pytest.mark.unit

SEEDS = range(40)


def _plain(devices: DeviceSet) -> bytes:
    """The message as service.py built it before entries were cached: one protobuf object per device."""
    return pb.ListAndWatchResponse(
        devices=[
            pb.Device(
                ID=d.device_id,
                health=d.health,
                topology=pb.TopologyInfo(nodes=[pb.NUMANode(ID=n) for n in d.numa_nodes]) if d.numa_nodes else None,
            )
            for d in devices
        ]
    ).SerializeToString()


def _random_device(rng: random.Random, device_id: str) -> Device:
    health = rng.choice([HEALTHY, HEALTHY, UNHEALTHY])
    if rng.random() < 0.1:
        return Device(device_id, UNHEALTHY, problem="malformed: " + "x" * rng.randint(0, 300))
    numa: tuple[int, ...] = ()
    if rng.random() < 0.4:
        # Up to 64 nodes of up to MAX_NUMA_NODE: entries past 127 bytes take a two-byte length.
        numa = tuple(sorted(rng.sample(range(MAX_NUMA_NODE + 1), rng.randint(1, 64))))
    envs = (("A", "1"),) if rng.random() < 0.2 else ()  # not in the message: must not change the entry
    return Device(device_id, health, numa_nodes=numa, envs=envs)


def _random_id(rng: random.Random) -> str:
    length = rng.choice([1, 5, 12, 63])
    return rng.choice("abcXYZ019") + "".join(rng.choice("abz09._-") for _ in range(length - 1))


def _random_set(rng: random.Random, count: int) -> DeviceSet:
    return DeviceSet.of(_random_device(rng, _random_id(rng)) for _ in range(count))


def _changed(rng: random.Random, held: DeviceSet) -> DeviceSet:
    """`held` after a few adds, removals, health and topology changes, unchanged devices kept as objects."""
    by_id = dict(held.by_id)
    for _ in range(rng.randint(1, 5)):
        action = rng.random()
        if action < 0.3 or not by_id:
            device_id = _random_id(rng)
            by_id[device_id] = _random_device(rng, device_id)
        elif action < 0.55:
            del by_id[rng.choice(sorted(by_id))]
        elif action < 0.8:
            device_id = rng.choice(sorted(by_id))
            old = by_id[device_id]
            by_id[device_id] = replace(old, health=UNHEALTHY if old.health == HEALTHY else HEALTHY)
        else:
            device_id = rng.choice(sorted(by_id))
            by_id[device_id] = replace(by_id[device_id], numa_nodes=tuple(sorted(rng.sample(range(8), 2))), problem="")
    return DeviceSet(tuple(by_id[i] for i in sorted(by_id)))


@pytest.mark.parametrize("seed", SEEDS)
def test_the_encoded_list_is_protobufs_own_through_a_sequence_of_changes(seed: int) -> None:
    rng = random.Random(seed)
    held = _random_set(rng, rng.randint(0, 60))
    for _ in range(30):
        expected = _plain(held)
        assert device_list.encoded_list(held) == expected
        assert device_list.to_response(held).SerializeToString() == expected
        measured = pb.ListAndWatchResponse.FromString(expected).ByteSize()
        assert device_list.fit_list(held, 1).size == len(expected) == measured
        held = _changed(rng, held)


def test_a_fresh_set_of_the_same_devices_encodes_the_same() -> None:
    devices = [Device("a", numa_nodes=(0, 3)), Device("b", UNHEALTHY), Device("c" * 63)]
    first = DeviceSet.of(devices)
    again = DeviceSet.of(Device(d.device_id, d.health, numa_nodes=d.numa_nodes) for d in devices)
    assert device_list.encoded_list(first) == device_list.encoded_list(again) == _plain(first)
    assert device_list.encoded_list(DeviceSet()) == b"" == _plain(DeviceSet())


def test_a_changed_device_is_a_new_object_with_its_own_entry() -> None:
    healthy = Device("dev")
    assert device_list.list_entry(healthy) == _plain(DeviceSet.of([healthy]))
    sick = replace(healthy, health=UNHEALTHY)  # dataclasses.replace never carries the cached entry over
    assert device_list.list_entry(sick) == _plain(DeviceSet.of([sick])) != device_list.list_entry(healthy)


def _reference_fit(physical: DeviceSet, replicas: int, limit: int) -> tuple[DeviceSet, int]:
    """device_list.fit_list as it was, measuring every candidate with ByteSize()."""
    wanted = replicate(physical, replicas)
    size = pb.ListAndWatchResponse.FromString(_plain(wanted)).ByteSize()
    if size <= limit:
        return wanted, size
    order = [
        (replace(d, device_id=f"{d.device_id}::{n}") if replicas > 1 else d)
        for n in range(max(1, replicas))
        for d in physical
    ]
    kept: list[Device] = []
    for device in order:
        if len(_plain(DeviceSet.of([*kept, device]))) > limit:
            break
        kept.append(device)
    fitted = DeviceSet.of(kept)
    return fitted, len(_plain(fitted))


@pytest.mark.parametrize("seed", range(20))
def test_fit_list_matches_the_cut_measured_with_protobuf(seed: int) -> None:
    rng = random.Random(1000 + seed)
    physical = _random_set(rng, rng.randint(1, 25))
    replicas = rng.choice([1, 1, 2, 3, 11])
    full = len(_plain(replicate(physical, replicas)))
    for limit in (full, full - 1, rng.randint(0, full), 0):
        fitted = device_list.fit_list(physical, replicas, limit)
        devices, size = _reference_fit(physical, replicas, limit)
        assert fitted.devices == devices and fitted.size == size <= limit
        assert fitted.wanted == len(physical) * max(1, replicas)
        assert device_list.encoded_list(fitted.devices) == _plain(devices)


def test_replicas_are_kept_on_the_physical_device_and_follow_the_replica_count() -> None:
    physical = DeviceSet.of([Device("a"), Device("a-b", numa_nodes=(1,)), Device("b")])
    for replicas in (2, 11, 2, 1):
        fitted = device_list.fit_list(physical, replicas)
        assert fitted.devices == replicate(physical, replicas)
        assert device_list.encoded_list(fitted.devices) == _plain(replicate(physical, replicas))
    again = device_list.fit_list(physical, 2).devices
    assert all(x is y for x, y in zip(again, device_list.fit_list(physical, 2).devices, strict=True))


def test_the_broadcast_wakes_streams_only_for_what_the_kubelet_sees() -> None:
    """A new env or a probe's new reason reaches Allocate (broadcast.devices) without a resend."""
    broadcast = DeviceBroadcast()
    sick = Device("cola0", UNHEALTHY, reason="probe p: temperature 81")
    assert broadcast.update(DeviceSet.of([sick, Device("cola1")]))
    version, _ = broadcast.snapshot()
    hotter = replace(sick, reason="probe p: temperature 82", envs=(("MODE", "hot"),))
    assert broadcast.update(DeviceSet.of([hotter, Device("cola1")]))
    assert broadcast.snapshot() == (version, DeviceSet.of([hotter, Device("cola1")]))
    assert not broadcast.update(DeviceSet.of([hotter, Device("cola1")]))
    for visible in (replace(hotter, health=HEALTHY, reason=""), replace(hotter, numa_nodes=(0,))):
        assert broadcast.update(DeviceSet.of([visible, Device("cola1")]))
        assert broadcast.snapshot()[0] == version + 1
        version += 1
    assert broadcast.update(DeviceSet.of([Device("cola1")]))
    assert broadcast.snapshot()[0] == version + 1
