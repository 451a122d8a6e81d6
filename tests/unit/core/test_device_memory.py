"""Footprint of the per-device objects every role holds: a Device keeps no dict of its own.

Measured with tracemalloc over 10,000 devices (what a large node holds, once in discovery and once
in the plugin), and checked that what other modules keep on a Device (replicas, the CDI entry)
stays outside its fields: never compared, hashed, ordered or encoded.
"""

from __future__ import annotations

import dataclasses
import gc
import os
import tracemalloc
from pathlib import Path

import pytest

from colad.core import devices
from colad.core.devices import Device
from colad.deviceplugin import device_list
from colad.discovery import devicedir
from colad.outputs import cdi

pytestmark = pytest.mark.unit

COUNT = 10_000


def bytes_per(make: object) -> float:
    """Bytes tracemalloc sees allocated per object made by `make(i)`, the holding list left out."""
    assert callable(make)
    ids = [f"cola{i}" for i in range(COUNT)]
    gc.collect()
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        held = [make(i) for i in ids]
        after = tracemalloc.get_traced_memory()[0]
    finally:
        tracemalloc.stop()
    list_bytes = 8 * len(held) + 56
    return (after - before - list_bytes) / COUNT


def test_a_bare_device_costs_at_most_its_slots() -> None:
    # 176 bytes with a __dict__ (its values array besides the object); 152 in slots (12 fields, 3 kept).
    assert bytes_per(Device) <= 160


def test_reading_what_is_kept_makes_no_dict() -> None:
    device = Device("cola1")
    devices.replicas_of(device, 2)
    cdi.encode_spec("myway5.com/cola", devices.DeviceSet.of([device]))
    assert getattr(device, "_colad_replicas", None) is not None
    assert getattr(device, "_cdi_encoded", None) is not None
    device_list.list_entry(device)
    assert getattr(device, "_colad_list_entry", None) is not None
    assert not hasattr(device, "__dict__")  # all kept in slots


def test_kept_values_are_no_part_of_the_device() -> None:
    a, b = Device("cola1", numa_nodes=(0,)), Device("cola1", numa_nodes=(0,))
    devices.replicas_of(a, 3)
    cdi.encode_spec("myway5.com/cola", devices.DeviceSet.of([a]))
    assert a == b and hash(a) == hash(b) and not a < b and not b < a
    assert repr(a) == repr(b)
    assert dataclasses.asdict(a) == dataclasses.asdict(b)
    assert dataclasses.replace(a, device_id="cola2") == Device("cola2", numa_nodes=(0,))


def test_a_device_stays_frozen() -> None:
    device = Device("cola1")
    with pytest.raises(dataclasses.FrozenInstanceError):
        device.health = "Unhealthy"  # type: ignore[misc]


def test_a_file_time_past_2262_is_kept_as_a_tuple_and_read_once(tmp_path: Path) -> None:
    """A stat key that does not fit 64-bit nanoseconds never raises: it is kept unpacked (hostile input)."""

    assert devicedir.pack_key((1, 2, 2**63, -(2**63) - 1)) == (1, 2, 2**63, -(2**63) - 1)
    assert isinstance(devicedir.pack_key((1, 2, 3, 4)), bytes)
    path = tmp_path / "far"
    path.write_text("")
    far = 400 * 365 * 86400 * 10**9  # ~2370: past int64 nanoseconds where the file system keeps it
    os.utime(path, ns=(far, far))
    first = devicedir.read_device("far", str(path), None, now_ns=lambda: far + 10 * devicedir.RACY_WINDOW_NS)
    assert first is not None and first.device.device_id == "far"
    again = devicedir.read_device("far", str(path), first, now_ns=lambda: far + 10 * devicedir.RACY_WINDOW_NS)
    assert again is first  # unchanged file: the cached entry, whatever form its key has
