"""Unit tests for colad.core.slices: device names, pools, and the plan from existing slices to desired ones."""

from __future__ import annotations

import itertools

import pytest

from colad.core.constants import HEALTHY, UNHEALTHY
from colad.core.devices import Device, DeviceSet, replicate
from colad.core.names import is_dns1123_label
from colad.core.slices import (
    FILE_ATTRIBUTE,
    MAX_DEVICES_PER_SLICE,
    NUMA_ATTRIBUTE,
    REPLICA_ATTRIBUTE,
    DesiredSlice,
    ExistingSlice,
    Pool,
    SlicePlan,
    device_names,
    generate_name,
    plan,
    pool,
    pool_names,
    published_names,
    read_slice,
    reported_names,
    slice_object,
)

pytestmark = pytest.mark.unit

DRIVER = "cola.myway5.com"
NODE = "node-1"
RESOURCE = "myway5.com/cola"


def devices(n: int, health: str = HEALTHY) -> DeviceSet:
    return DeviceSet.of(Device(f"cola{i:03d}", health) for i in range(n))


class FakeStore:
    """Applies plans the way the API server would: names from generateName, resourceVersions, round trips."""

    def __init__(self) -> None:
        self.objects: dict[str, dict[str, object]] = {}
        self.counter = itertools.count(1)
        self.writes = 0

    def existing(self) -> list[ExistingSlice]:
        return [read_slice(obj) for obj in self.objects.values()]

    def apply(self, todo: SlicePlan) -> None:
        for gone in todo.delete:
            del self.objects[gone.name]
        for held, desired in todo.update:
            self.put(slice_object(desired, DRIVER, NODE, "uid-1", held), held.name)
        for desired in todo.create:
            obj = slice_object(desired, DRIVER, NODE, "uid-1")
            name = obj["metadata"]["generateName"] + f"x{next(self.counter):04d}"  # type: ignore[index]
            self.put(obj, name)
        self.writes += len(todo.delete) + len(todo.update) + len(todo.create)

    def put(self, obj: dict[str, object], name: str) -> None:
        metadata = dict(obj["metadata"])  # type: ignore[call-overload]
        metadata.update(name=name, uid=f"uid-{name}", resourceVersion=str(next(self.counter)))
        self.objects[name] = {**obj, "metadata": metadata}

    def sync(self, pools: list[Pool]) -> SlicePlan:
        todo = plan(DRIVER, NODE, pools, self.existing())
        self.apply(todo)
        assert not plan(DRIVER, NODE, pools, self.existing()), "a second plan after applying one must be empty"
        return todo

    def published(self) -> dict[str, set[str]]:
        """Device names per pool, checking each pool is consistent (one generation, the right count)."""
        result: dict[str, set[str]] = {}
        slices = self.existing()
        for name in {s.pool for s in slices}:
            members = [s for s in slices if s.pool == name]
            assert {s.generation for s in members} == {members[0].generation}
            assert {s.count for s in members} == {len(members)}
            assert all(len(s.devices) <= MAX_DEVICES_PER_SLICE for s in members)
            listed = [d.name for s in members for d in s.devices]
            assert len(listed) == len(set(listed)), "a device in two slices"
            result[name] = set(listed)
        return result


@pytest.mark.parametrize(
    ("device_id", "kept"),
    [("cola1", True), ("a-b", True), ("Cola1", False), ("a.b", False), ("a_b", False), ("x" * 63, True), ("a-", False)],
)
def test_a_dns_label_id_is_its_own_name_and_any_other_gets_a_label(device_id: str, kept: bool) -> None:
    name = device_names([device_id])[device_id]
    assert is_dns1123_label(name)
    assert (name == device_id) is kept


def test_generated_names_do_not_collide_with_each_other_or_with_literal_names() -> None:
    ids = ["cola1", "Cola1", "COLA1", "a.b", "a_b", "a-b", "A.B"]
    names = device_names(ids)
    assert len(set(names.values())) == len(ids)
    assert names["cola1"] == "cola1" and names["a-b"] == "a-b"
    assert names["Cola1"].startswith("cola1-") and names["a.b"].startswith("a-b-")


def test_a_literal_name_equal_to_a_generated_one_keeps_it_and_the_generated_one_takes_a_longer_hash() -> None:
    generated = device_names(["Cola1"])["Cola1"]
    names = device_names(["Cola1", generated])
    assert names[generated] == generated
    assert names["Cola1"] != generated and is_dns1123_label(names["Cola1"])
    assert names["Cola1"].startswith(generated)  # the same stem and the same hash, longer


def test_names_are_stable_across_rescans_and_other_files() -> None:
    first = device_names(["Cola1", "b.c", "x"])
    again = device_names(["zz", "b.c", "Cola1", "new_file"])
    assert first["Cola1"] == again["Cola1"] and first["b.c"] == again["b.c"]


def test_a_long_id_gets_a_name_within_63_characters() -> None:
    long_id = "A" * 63
    assert len(device_names([long_id])[long_id]) <= 63


def test_the_pool_of_a_single_resource_is_the_node_name_and_several_get_one_pool_each() -> None:
    assert pool_names(NODE, [RESOURCE]) == {RESOURCE: NODE}
    several = pool_names(NODE, [RESOURCE, "example.com/Other_Dev"])
    assert several[RESOURCE].startswith(NODE + "/") and len(set(several.values())) == 2


def test_unhealthy_devices_are_left_out_and_the_file_name_is_an_attribute() -> None:
    held = DeviceSet.of([Device("Cola1"), Device("cola2", UNHEALTHY), Device("n", numa_nodes=(1,))])
    made = pool(NODE, RESOURCE, held)
    by_file = {dict((k, v) for k, _, v in d.attributes)[FILE_ATTRIBUTE]: d for d in made.devices}
    assert set(by_file) == {"Cola1", "n"}
    assert (NUMA_ATTRIBUTE, "int", 1) in by_file["n"].attributes
    assert all(k != NUMA_ATTRIBUTE for k, _, _ in by_file["Cola1"].attributes)


def test_a_replica_carries_its_file_name_and_number() -> None:
    made = pool(NODE, RESOURCE, replicate(DeviceSet.of([Device("cola1")]), 2))
    assert [dict((k, v) for k, _, v in d.attributes) for d in made.devices] == [
        {FILE_ATTRIBUTE: "cola1", REPLICA_ATTRIBUTE: n, "resource": RESOURCE} for n in (0, 1)
    ]
    assert all(is_dns1123_label(d.name) for d in made.devices)


def test_300_devices_make_three_slices_of_at_most_128() -> None:
    store = FakeStore()
    todo = store.sync([pool(NODE, RESOURCE, devices(300))])
    assert len(todo.create) == 3 and not todo.update and not todo.delete
    assert sorted(len(s.devices) for s in store.existing()) == [44, 128, 128]
    assert len(store.published()[NODE]) == 300


def test_an_empty_pool_still_has_one_slice() -> None:
    store = FakeStore()
    store.sync([pool(NODE, RESOURCE, DeviceSet())])
    assert [len(s.devices) for s in store.existing()] == [0]
    store.sync([pool(NODE, RESOURCE, devices(3))])
    store.sync([pool(NODE, RESOURCE, DeviceSet())])
    assert [len(s.devices) for s in store.existing()] == [0]


def test_a_change_in_one_slice_updates_that_slice_only_and_keeps_the_generation() -> None:
    store = FakeStore()
    store.sync([pool(NODE, RESOURCE, devices(300))])
    generation = store.existing()[0].generation
    changed = DeviceSet.of([*(d for d in devices(300) if d.device_id != "cola200"), Device("cola200", UNHEALTHY)])
    todo = store.sync([pool(NODE, RESOURCE, changed)])
    assert (len(todo.delete), len(todo.update), len(todo.create)) == (0, 1, 0)
    assert {s.generation for s in store.existing()} == {generation}
    assert "cola200" not in store.published()[NODE] and len(store.published()[NODE]) == 299


def test_a_device_added_where_there_is_room_touches_one_slice() -> None:
    store = FakeStore()
    store.sync([pool(NODE, RESOURCE, devices(300))])
    todo = store.sync([pool(NODE, RESOURCE, DeviceSet.of([*devices(300), Device("aaa-new")]))])
    assert (len(todo.delete), len(todo.update), len(todo.create)) == (0, 1, 0)
    assert "aaa-new" in store.published()[NODE]


def test_a_new_slice_raises_the_generation_and_rewrites_the_count_everywhere() -> None:
    store = FakeStore()
    store.sync([pool(NODE, RESOURCE, devices(256))])
    before = store.existing()[0].generation
    todo = store.sync([pool(NODE, RESOURCE, devices(257))])
    assert (len(todo.update), len(todo.create)) == (2, 1)
    assert {s.generation for s in store.existing()} == {before + 1}
    assert {s.count for s in store.existing()} == {3}


def test_an_emptied_slice_is_deleted_and_the_rest_move_to_a_new_generation() -> None:
    store = FakeStore()
    store.sync([pool(NODE, RESOURCE, devices(300))])
    todo = store.sync([pool(NODE, RESOURCE, DeviceSet.of(d for d in devices(300) if d.device_id < "cola256"))])
    assert (len(todo.delete), len(todo.update), len(todo.create)) == (1, 2, 0)
    assert len(store.published()[NODE]) == 256


def test_rescanning_the_same_devices_plans_nothing() -> None:
    store = FakeStore()
    store.sync([pool(NODE, RESOURCE, devices(300))])
    assert not plan(DRIVER, NODE, [pool(NODE, RESOURCE, devices(300))], store.existing())


def test_wiped_slices_are_created_again() -> None:
    store = FakeStore()
    store.sync([pool(NODE, RESOURCE, devices(130))])
    store.objects.clear()
    todo = store.sync([pool(NODE, RESOURCE, devices(130))])
    assert len(todo.create) == 2 and len(store.published()[NODE]) == 130


def test_slices_of_other_drivers_and_nodes_are_never_touched() -> None:
    other = ExistingSlice("00000-x-y-abcde", "u", "5", "other.example.com", NODE, NODE, 0, 1, 0, ())
    elsewhere = ExistingSlice("00000-x-y-fghij", "u", "6", DRIVER, "node-2", "node-2", 0, 1, 0, ())
    todo = plan(DRIVER, NODE, [pool(NODE, RESOURCE, devices(1))], [other, elsewhere])
    assert not todo.delete and not todo.update and len(todo.create) == 1


def test_slices_of_an_unwanted_pool_without_an_index_or_repeating_one_are_deleted() -> None:
    store = FakeStore()
    store.sync([pool(NODE, RESOURCE, devices(3))])
    held = store.existing()[0]
    store.put(slice_object(DesiredSlice("gone-pool", 0, 0, 1, ()), DRIVER, NODE, ""), "00000-gone")
    store.put(slice_object(DesiredSlice(NODE, 0, held.generation, 1, ()), DRIVER, NODE, ""), "00000-twice")
    store.put(slice_object(DesiredSlice(NODE, 0, held.generation, 1, ()), DRIVER, NODE, ""), "no-index")
    todo = store.sync([pool(NODE, RESOURCE, devices(3))])
    assert sorted(s.name for s in todo.delete) == ["00000-gone", "00000-twice", "no-index"]
    assert store.published() == {NODE: {f"cola{i:03d}" for i in range(3)}}


def test_a_device_with_fields_colad_never_sets_is_rewritten() -> None:
    store = FakeStore()
    store.sync([pool(NODE, RESOURCE, devices(2))])
    (name,) = store.objects
    store.objects[name]["spec"]["devices"][0]["taints"] = [{"key": "k", "effect": "NoSchedule"}]  # type: ignore[index]
    todo = store.sync([pool(NODE, RESOURCE, devices(2))])
    assert len(todo.update) == 1


def test_several_pools_are_planned_apart() -> None:
    store = FakeStore()
    names = pool_names(NODE, [RESOURCE, "example.com/other"])
    store.sync([pool(names[RESOURCE], RESOURCE, devices(200)), pool(names["example.com/other"], "x", devices(5))])
    published = store.published()
    assert len(published[names[RESOURCE]]) == 200 and len(published[names["example.com/other"]]) == 5
    todo = store.sync([pool(names[RESOURCE], RESOURCE, devices(200))])
    assert len(todo.delete) == 1 and not todo.update and not todo.create


def test_a_pool_whose_devices_are_unknown_is_left_as_held_and_a_known_empty_one_is_emptied() -> None:
    store = FakeStore()
    names = pool_names(NODE, [RESOURCE, "example.com/other"])
    cola, other = names[RESOURCE], names["example.com/other"]
    store.sync([pool(cola, RESOURCE, devices(200)), pool(other, "x", devices(5))])
    store.put(slice_object(DesiredSlice(cola, 0, 0, 1, ()), DRIVER, NODE, ""), "00000-twice")
    held = {s.name: s for s in store.existing()}
    assert not plan(DRIVER, NODE, [], store.existing(), unknown=[cola, other])  # a start: nothing known yet
    todo = plan(DRIVER, NODE, [pool(other, "x", DeviceSet())], store.existing(), unknown=[cola])
    assert not todo.delete and not todo.create
    assert [(h.pool, len(d.devices)) for h, d in todo.update] == [(other, 0)]
    store.apply(todo)
    assert {n: s for n, s in ((s.name, s) for s in store.existing()) if s.pool == cola} == {
        n: s for n, s in held.items() if s.pool == cola
    }
    withdrawn = plan(DRIVER, NODE, [], store.existing())  # nothing unknown, nothing wanted: every slice goes
    assert len(withdrawn.delete) == len(store.objects) and not withdrawn.update and not withdrawn.create


def test_the_generate_name_keeps_its_index_within_what_the_server_keeps() -> None:
    name = generate_name(3, DRIVER, "n" * 250)
    assert name.startswith("00003-") and len(name) <= 58 and name.endswith("-") and ".-" not in name
    assert read_slice({"metadata": {"name": name + "abcde"}}).index == 3


@pytest.mark.parametrize(
    "ids",
    [
        pytest.param(("cola-a", "cola-b", "cola-c"), id="dns-labels"),
        pytest.param(("Cola_A", "cola_a", "x.y", "cola-a"), id="generated"),
    ],
)
def test_reported_names_name_a_healthy_device_as_published_and_an_unhealthy_one_as_when_it_was_healthy(
    ids: tuple[str, ...],
) -> None:
    for sick in ids:
        now = DeviceSet.of(Device(i, UNHEALTHY if i == sick else HEALTHY) for i in ids)
        before = DeviceSet.of(Device(i) for i in ids)
        names = reported_names(now)
        assert set(names) == set(ids)
        assert {i: names[i] for i in ids if i != sick} == published_names(now)
        assert names[sick] == published_names(before)[sick]
        assert len(set(names.values())) == len(ids)
