"""The CDI spec writer keeps no copy of a spec, and the spec joined from kept bytes stays exact.

SpecWriter's record of what it wrote is the file itself: an unchanged spec is not rewritten, one
edited behind colad's back (same size, other bytes) or replaced by a FIFO is, and no write hangs.
cdi.encode_spec() picks the version from the sorted IDs in O(log n): IDs that sort before the digits
('-', '.') or mix digit-led and letter-led names give build()'s bytes.
"""

from __future__ import annotations

import itertools
import os
from pathlib import Path

import pytest

from colad.core.devices import Device, DeviceNode, DeviceSet, replicate
from colad.outputs import cdi
from tests.oracles import cdi_spec

pytestmark = pytest.mark.unit
RESOURCE = "example.com/cola"


def test_the_writer_keeps_no_copy_and_the_file_is_its_record(tmp_path: Path) -> None:
    writer = cdi.SpecWriter(str(tmp_path / "cdi"))
    data = cdi.encode_spec(RESOURCE, DeviceSet.of(Device(f"d{i:04d}") for i in range(2000)))
    assert data is not None and writer.write_bytes(RESOURCE, data) is True
    assert all(not isinstance(v, (bytes, dict)) for v in vars(writer).values())  # no bytes, no map of them
    path = Path(writer.path(RESOURCE))
    inode = path.stat().st_ino
    assert writer.write_bytes(RESOURCE, data) is False and path.stat().st_ino == inode
    path.write_bytes(data.replace(b"d0000", b"d000X"))  # same size, other bytes, behind its back
    assert writer.write_bytes(RESOURCE, data) is True and path.read_bytes() == data
    path.unlink()
    os.mkfifo(path)  # a FIFO in its place: never opened for a blocking read, replaced
    assert writer.write_bytes(RESOURCE, data) is True and path.read_bytes() == data
    assert cdi.SpecWriter(str(tmp_path / "cdi")).write_bytes(RESOURCE, data) is False  # a restart: same bytes


@pytest.mark.parametrize(
    "ids",
    [
        ("-a1", "b"),
        (".x", "0a"),
        ("-z", ".q", "7", "A", "a"),
        ("1-", "a"),  # the digit-led ID is no CDI name: skipped, and 0.3.0
        ("Z9", "z", "_1"),
    ],
)
def test_the_version_follows_every_name_whatever_sorts_first(ids: tuple[str, ...]) -> None:
    node = (DeviceNode("/dev/h0", "/dev/c0"),)
    for replicas, with_node in itertools.product((1, 2), (False, True)):
        devices = [Device(i, device_nodes=node if with_node and i == ids[-1] else ()) for i in ids]
        physical = DeviceSet.of(devices)
        full = cdi_spec(RESOURCE, replicate(physical, replicas))
        assert cdi.encode_spec(RESOURCE, physical, replicas) == (None if full is None else full.encode())


@pytest.mark.parametrize("resource", ["example.com/cola", "a/b", "V_1.x-y/c_2-z", "nodomain", "v/cl.ass", "/c", "é/c"])
def test_the_parts_kept_per_resource_name_give_builds_bytes_every_time(resource: str) -> None:
    """encode() keeps each resource name's version and JSON (a second call is a cache hit): still build()'s bytes."""
    for ids in (("a", "b"), ("0a", "b"), ("b",)):
        physical = DeviceSet.of(Device(i) for i in ids)
        full = cdi_spec(resource, physical)
        for _ in range(2):
            assert cdi.encode_spec(resource, physical) == (None if full is None else full.encode())
