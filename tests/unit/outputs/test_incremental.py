"""The CDI spec and the NFD file built from kept parts equal the full build, byte for byte.

cdi.encode_spec() joins the entries kept on each Device (as discovery holds them from change to
change) and must give exactly cdi_spec(name, replicate(set, replicas)).encode(): random
sequences of adds, edits, health changes and removals over devices with envs, device nodes,
mounts, digit-leading, escaped and non-CDI names, at 1 to 3 replicas. cdi.same_entry() says
when a change leaves the spec alone; nfd.render_features() of Counts equals that of the set.
"""

from __future__ import annotations

import dataclasses
import random

import pytest

from colad.core.constants import HEALTHY, UNHEALTHY
from colad.core.devices import Device, DeviceNode, DeviceSet, Mount, replicate
from colad.outputs import cdi, nfd
from tests.oracles import cdi_spec

pytestmark = pytest.mark.unit

RESOURCE = "example.com/cola"
NAMES = ["a", "b-1", "0dev", "9", "é-gpu", "x.y", "ends-", "ends_", 'q"uote', "back\\slash", "dev" + "7" * 40]


def _device(rng: random.Random, device_id: str) -> Device:
    pick = rng.random()
    health = rng.choice([HEALTHY, UNHEALTHY])
    if pick < 0.15:
        return Device(device_id, UNHEALTHY, problem="malformed: line 1")
    if pick < 0.4:
        return Device(device_id, health)
    envs = tuple(
        sorted({(f"K{rng.randint(0, 3)}", rng.choice(["v", "é", 'a"b', ""])) for _ in range(rng.randint(0, 2))})
    )
    nodes = tuple(
        DeviceNode(f"/dev/h{n}", rng.choice([f"/dev/h{n}", f"/dev/c{n}"]), rng.choice(["rw", "r", "rwm"]))
        for n in range(rng.randint(0, 2))
    )
    mounts = tuple(Mount(f"/srv/m{n}", f"/mnt/m{n}", rng.random() < 0.5) for n in range(rng.randint(0, 2)))
    reason = "probe x: failed" if health == UNHEALTHY and rng.random() < 0.5 else ""
    return Device(device_id, health, device_nodes=nodes, mounts=mounts, envs=envs, reason=reason)


@pytest.mark.parametrize("seed", range(8))
def test_encode_from_kept_entries_equals_the_full_build(seed: int) -> None:
    rng = random.Random(seed)
    replicas = rng.choice([1, 1, 2, 3])
    held: dict[str, Device] = {}
    for _ in range(300):
        pick = rng.random()
        if pick < 0.5 or not held:
            device_id = rng.choice(NAMES) + ("" if rng.random() < 0.5 else str(rng.randint(0, 20)))
            held[device_id] = _device(rng, device_id)
        elif pick < 0.7:  # health or reason alone: the spec's bytes must not change
            device_id = rng.choice(sorted(held))
            before = held[device_id]
            if not before.problem:
                flipped = UNHEALTHY if before.health == HEALTHY else HEALTHY
                after = dataclasses.replace(before, health=flipped, reason="")
                assert cdi.same_entry(before, after)
                held[device_id] = after
        else:
            del held[rng.choice(sorted(held))]
        physical = DeviceSet.of(held.values())  # the same Device objects from change to change
        full = cdi_spec(RESOURCE, replicate(physical, replicas))
        assert cdi.encode_spec(RESOURCE, physical, replicas) == (None if full is None else full.encode())


def test_same_entry_follows_every_field_the_spec_carries() -> None:
    base = Device("a", envs=(("K", "v"),), mounts=(Mount("/srv", "/mnt", True),))
    assert cdi.same_entry(base, Device("a", UNHEALTHY, envs=base.envs, mounts=base.mounts, reason="gone"))
    assert not cdi.same_entry(base, Device("a", envs=(("K", "w"),), mounts=base.mounts))
    assert not cdi.same_entry(base, Device("a", envs=base.envs, mounts=(Mount("/srv", "/mnt", False),)))
    assert not cdi.same_entry(base, Device("b", envs=base.envs, mounts=base.mounts))
    assert not cdi.same_entry(Device("a"), Device("a", device_nodes=(DeviceNode("/dev/x", "/dev/x", "rw"),)))


def test_a_kind_that_is_no_cdi_kind_and_a_set_of_no_cdi_names_give_no_spec() -> None:
    assert cdi.encode_spec("nodomain", DeviceSet.of([Device("a")])) is None
    assert cdi.encode_spec(RESOURCE, DeviceSet.of([Device("ends-")])) is None
    assert cdi.encode_spec(RESOURCE, DeviceSet()) is None


@pytest.mark.parametrize("seed", range(4))
def test_nfd_render_of_counts_equals_that_of_the_set(seed: int) -> None:
    rng = random.Random(seed)
    sets = []
    for r in range(3):
        physical = DeviceSet.of(_device(rng, f"d{i}") for i in range(rng.randint(0, 30)))
        sick = sum(d.health == UNHEALTHY for d in physical)
        sets.append((f"example.com/r{r}", physical, nfd.Counts(len(physical), len(physical) - sick)))
    full = nfd.render_features([(name, s) for name, s, _ in sets], "", "2030-01-01T00:00:00Z")
    assert nfd.render_features([(name, c) for name, _, c in sets], "", "2030-01-01T00:00:00Z") == full
