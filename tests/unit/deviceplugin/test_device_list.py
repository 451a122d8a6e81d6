"""encoded_list's C-speed join gives protobuf's own bytes for every set a delta makes, or not.

A set snapshots.Receiver builds from a delta names the devices it brought (UPSERTS): they are encoded
first and the rest is joined with no Python step per device. Random delta sequences, with the base
set encoded before or never, with replicas (fit_list) and cut lists, must each encode byte for byte
as protobuf serializes the ListAndWatchResponse of the same devices. Seeded: COLAD_SEED=<n> repeats.
"""

from __future__ import annotations

import os
import random

import pytest

from colad.core.constants import HEALTHY, UNHEALTHY
from colad.core.devices import Device, DeviceSet
from colad.deviceplugin.device_list import encoded_list, fit_list
from colad.queue.messages import DeviceSnapshot
from colad.queue.snapshots import UPSERTS, Receiver
from tests.oracles import list_and_watch_bytes, snapshot_delta

pytestmark = pytest.mark.unit

SEED = int(os.environ.get("COLAD_SEED", random.SystemRandom().randrange(2**32)))
NAMES = [f"cola{i:03d}" for i in range(60)]


def _protobuf(devices: DeviceSet) -> bytes:
    wire: bytes = list_and_watch_bytes(devices)
    return wire


def _device_of(rng: random.Random, name: str) -> Device:
    numa = tuple(sorted(rng.sample(range(3), rng.randint(0, 2))))
    return Device(name, rng.choice([HEALTHY, UNHEALTHY]), numa_nodes=numa, reason=rng.choice(["", "probe"]))


@pytest.mark.parametrize("encode_base", [True, False], ids=["base-encoded", "base-never-encoded"])
def test_every_set_a_delta_makes_encodes_as_protobuf_does(encode_base: bool) -> None:
    rng = random.Random(SEED)
    print(f"COLAD_SEED={SEED}")
    for _run in range(40):
        receiver = Receiver()
        held = DeviceSet.of(_device_of(rng, n) for n in rng.sample(NAMES, rng.randrange(len(NAMES))))
        outcome = receiver.apply(DeviceSnapshot(1, 1, held, True, "r"))
        assert outcome.snapshot is not None
        if encode_base:
            assert encoded_list(outcome.snapshot.devices) == _protobuf(held)
        digest = None
        for seq in range(2, 20):
            by_id = dict(held.by_id)
            for name in rng.sample(NAMES, rng.choice([1, 1, 2, 5])):
                if name in by_id and rng.random() < 0.4:
                    del by_id[name]
                else:
                    by_id[name] = _device_of(rng, name)
            new = DeviceSnapshot(1, seq, DeviceSet.of(by_id.values()), True, "r")
            message, digest = snapshot_delta(held, digest, new, seq - 1)
            outcome = receiver.apply(message if message is not None else new)
            assert outcome.snapshot is not None
            got = outcome.snapshot.devices
            assert (got.known(UPSERTS) is not None) == (message is not None)
            replicas = rng.choice([1, 1, 2])
            limit = rng.choice([4 * 1024 * 1024, 200])  # some lists cut to fit
            fitted = fit_list(got, replicas, limit)
            assert encoded_list(fitted.devices) == _protobuf(fitted.devices)
            assert encoded_list(got) == _protobuf(new.devices)
            held = new.devices
