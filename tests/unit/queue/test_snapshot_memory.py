"""What a 10,000-device DeviceSnapshot costs its sender and its receiver in memory.

encode() joins a snapshot's (or a delta's) device entries a chunk at a time and must stay byte
for byte what json.dumps of the whole body gives; decode() frees each wire entry once its Device is made.
Both are measured with tracemalloc against fixed bounds (2.6 and 1.6 MB).
"""

from __future__ import annotations

import gc
import random
import tracemalloc

import pytest

from colad.core.constants import HEALTHY, UNHEALTHY
from colad.core.devices import Device, DeviceNode, DeviceSet, Mount
from colad.queue import messages, wire_json
from colad.queue.messages import DeviceSnapshot

pytestmark = pytest.mark.unit

N = 10_000


def _device(rng: random.Random, index: int) -> Device:
    """A bare device mostly; now and then one with content, so both entry forms are joined."""
    health = rng.choice([HEALTHY, UNHEALTHY])
    if rng.random() < 0.8:
        return Device(f"cola{index}", health)
    return Device(
        f"cola{index}",
        health,
        numa_nodes=(rng.randrange(4),),
        device_nodes=(DeviceNode("/dev/null", f"/dev/c{index}"),),
        mounts=(Mount("/tmp", "/mnt", rng.random() < 0.5),),
        envs=(("MODE", 'caf\u00e9 "quoted" \\ \n'),),
        annotations=(("a.b/c", "d"),),
    )


@pytest.mark.parametrize("count", [0, 1, 2, 255, 256, 257, 512, 513, 1000])
def test_snapshot_encoding_is_the_whole_bodys_json(count: int) -> None:
    rng = random.Random(count)
    for present in (True, False):
        snapshot = DeviceSnapshot(
            rng.randrange(1 << 40), rng.randrange(1 << 40), DeviceSet.of(_device(rng, i) for i in range(count)), present
        )
        data = messages.encode(snapshot)
        assert data == wire_json.dumps(messages._body(snapshot))
        assert len(data) == messages.snapshot_size(snapshot)
        assert messages.decode(data) == snapshot


@pytest.mark.parametrize("count", [0, 1, 256, 257, 600])
@pytest.mark.parametrize("removes", [0, 1, 3])
def test_delta_encoding_is_the_whole_bodys_json(count: int, removes: int) -> None:
    rng = random.Random(count * 10 + removes)
    upserts = DeviceSet.of(_device(rng, i) for i in range(count)).devices
    gone = tuple(f"gone{i}" for i in range(removes))
    for present in (True, False):
        delta = messages.DeviceDelta(5, 9, rng.randrange(9), upserts, gone, rng.randrange(1 << 64), present)
        data = messages.encode(delta)
        assert data == wire_json.dumps(messages._body(delta))
        assert messages.decode(data) == delta


def _bare_snapshot() -> DeviceSnapshot:
    return DeviceSnapshot(1, 2, DeviceSet.of(Device(str(i), HEALTHY if i % 7 else UNHEALTHY) for i in range(N)))


def test_encoding_a_large_snapshot_makes_no_object_per_device() -> None:
    snapshot = _bare_snapshot()
    messages.encode(snapshot)  # imports and caches first
    gc.collect()
    tracemalloc.start()
    try:
        data = messages.encode(snapshot)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    # The frame, its growing buffer and a chunk of entries: 0.40 MB for a 189 KB frame (json.dumps: 2.6 MB).
    assert peak < 3 * len(data), (peak, len(data))


def test_decoding_a_large_snapshot_frees_the_wire_entries_as_it_goes() -> None:
    snapshot = _bare_snapshot()
    data = messages.encode(snapshot)
    messages.decode(data)
    gc.collect()
    tracemalloc.start()
    try:
        decoded = messages.decode(data)
        kept, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert decoded == snapshot
    # Beyond the Devices it returns (2.1 MB): the text and a list of None, 0.17 MB (all the entries: 1.6 MB).
    assert peak - kept < 0.5 * 1024 * 1024, (peak, kept)
