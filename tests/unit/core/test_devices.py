"""Unit tests for colad.core.devices: device-ID rules, the devices a listing makes, DeviceSet and diff()."""

from __future__ import annotations

import dataclasses
import itertools
import json
import random

import pytest

from colad.core.constants import HEALTHY, MAX_DEVICE_ID_LENGTH, MAX_REPLICAS, UNHEALTHY
from colad.core.devices import (
    HEALTH_VALUES,
    REPLICA_SEPARATOR,
    Device,
    DeviceDiff,
    DeviceNode,
    DeviceSet,
    Mount,
    SkippedName,
    base_id,
    device_problem,
    diff,
    id_problem,
    replicate,
    request_id_problem,
)
from colad.queue.device_wire import device_from_wire, device_to_wire
from tests.oracles import ScanResult, scan_names

pytestmark = pytest.mark.unit

# --- id_problem ----------------------------------------------------------------------------

ACCEPTED_IDS = [
    pytest.param("cocacola", id="cocacola"),
    pytest.param("peisicola", id="peisicola"),
    pytest.param("gpu-0", id="dash-digit"),
    pytest.param("a.b_c", id="dot-underscore"),
    pytest.param("a", id="single-letter"),
    pytest.param("7", id="single-digit"),
    pytest.param("0cola", id="leading-digit"),
    pytest.param("COLA", id="upper-case"),
    pytest.param("cola.swp", id="inner-dot-swp-suffix"),
    pytest.param("a..b", id="double-inner-dot"),
    pytest.param("cola-", id="trailing-dash"),
    pytest.param("cola.", id="trailing-dot"),
    pytest.param("a" * MAX_DEVICE_ID_LENGTH, id="63-chars"),
]


@pytest.mark.parametrize("name", ACCEPTED_IDS)
def test_id_problem_accepts(name: str) -> None:
    assert id_problem(name) is None


REJECTED_IDS = [
    # (name, fragment of the reason)
    pytest.param("", "empty", id="empty"),
    pytest.param("a" * (MAX_DEVICE_ID_LENGTH + 1), "63", id="64-chars"),
    pytest.param("é" * 64, "63", id="64-non-ascii-chars"),
    pytest.param(".hidden", "hidden", id="dotfile"),
    pytest.param(".x.swp", "hidden", id="vim-swap-file"),
    pytest.param(".", "hidden", id="dot"),
    pytest.param("..", "hidden", id="dot-dot"),
    pytest.param("backup~", "characters", id="backup-tilde"),
    pytest.param("#auto#", "characters", id="emacs-autosave"),
    pytest.param("has space", "characters", id="space"),
    pytest.param(" lead", "characters", id="leading-space"),
    pytest.param("trail ", "characters", id="trailing-space"),
    pytest.param("a,b", "characters", id="comma"),
    pytest.param("a=b", "characters", id="equals"),
    pytest.param("a\x01b", "characters", id="control-char"),
    pytest.param("a\tb", "characters", id="tab"),
    pytest.param("cola\n", "characters", id="trailing-newline"),
    pytest.param("a\x00", "characters", id="nul"),
    pytest.param("café", "characters", id="non-ascii"),
    pytest.param("\udcff", "characters", id="surrogate-escaped-byte"),
    pytest.param("cola\udcff", "characters", id="surrogate-escaped-suffix"),
    pytest.param("-cola", "characters", id="leading-dash"),
    pytest.param("_cola", "characters", id="leading-underscore"),
    pytest.param("a/b", "characters", id="slash"),
    pytest.param("a:b", "characters", id="colon"),
    pytest.param("ｃｏｌａ", "characters", id="fullwidth-letters"),
    pytest.param("cola٣", "characters", id="arabic-indic-digit"),
]


@pytest.mark.parametrize("name, reason", REJECTED_IDS)
def test_id_problem_rejects(name: str, reason: str) -> None:
    problem = id_problem(name)
    assert problem is not None
    assert reason in problem


def test_id_length_limit_is_the_api_limit() -> None:
    # v1beta1 api.proto, Device.ID: "Max length of this field is 63 characters".
    assert MAX_DEVICE_ID_LENGTH == 63


# --- build ---------------------------------------------------------------------------------

BUILD_CASES = [
    # (names, expected device IDs, expected skipped (name, reason fragment))
    pytest.param([], (), (), id="empty-dir"),
    pytest.param(["cocacola"], ("cocacola",), (), id="one"),
    pytest.param(["peisicola", "cocacola"], ("cocacola", "peisicola"), (), id="sorted"),
    pytest.param(["b", "a", "b", "a"], ("a", "b"), (), id="dedup"),
    pytest.param(["cola10", "cola2", "cola1"], ("cola1", "cola10", "cola2"), (), id="plain-string-order"),
    pytest.param(
        ["cola", ".cola.swp", "cola~", "#cola#"],
        ("cola",),
        (("#cola#", "characters"), (".cola.swp", "hidden"), ("cola~", "characters")),
        id="editor-droppings-skipped",
    ),
    pytest.param(
        ["ok", "x" * 64, "", "bad name"],
        ("ok",),
        (("", "empty"), ("bad name", "characters"), ("x" * 64, "63")),
        id="skipped-sorted-with-reasons",
    ),
    pytest.param([".a", ".a"], (), ((".a", "hidden"),), id="skipped-dedup"),
    pytest.param(["\udcff", "cola"], ("cola",), (("\udcff", "characters"),), id="non-utf8-skipped"),
]


@pytest.mark.parametrize("names, ids, skipped", BUILD_CASES)
def test_build(names: list[str], ids: tuple[str, ...], skipped: tuple[tuple[str, str], ...]) -> None:
    result = scan_names(names)
    assert isinstance(result, ScanResult)
    assert result.devices.ids == ids
    assert all(d.health == HEALTHY for d in result.devices)
    assert [s.name for s in result.skipped] == [name for name, _ in skipped]
    for entry, (_, reason) in zip(result.skipped, skipped, strict=True):
        assert isinstance(entry, SkippedName)
        assert reason in entry.reason


def test_build_accepts_any_iterable() -> None:
    assert scan_names(iter(["b", "a"])).devices.ids == ("a", "b")


def test_build_is_independent_of_listing_order() -> None:
    names = ["cola3", ".hidden", "cola1", "bad~", "cola2"]
    results = {scan_names(p) for p in itertools.permutations(names)}
    assert len(results) == 1


# --- Device and DeviceSet ------------------------------------------------------------------


@pytest.mark.parametrize(
    "health, healthy",
    [pytest.param(HEALTHY, True, id="healthy"), pytest.param(UNHEALTHY, False, id="unhealthy")],
)
def test_device_healthy(health: str, healthy: bool) -> None:
    assert Device("cola", health).healthy is healthy


def test_device_defaults_to_healthy_and_is_frozen() -> None:
    device = Device("cola")
    assert device.health == HEALTHY
    with pytest.raises(dataclasses.FrozenInstanceError):
        device.health = UNHEALTHY  # type: ignore[misc]


def test_health_values_are_the_kubelet_constants() -> None:
    assert HEALTH_VALUES == ("Healthy", "Unhealthy")


def test_deviceset_of_orders_by_id() -> None:
    devices = DeviceSet.of([Device("c"), Device("a", UNHEALTHY), Device("b")])
    assert devices.ids == ("a", "b", "c")
    assert list(devices) == [Device("a", UNHEALTHY), Device("b"), Device("c")]
    assert len(devices) == 3


def test_deviceset_of_keeps_last_entry_per_id() -> None:
    devices = DeviceSet.of([Device("a"), Device("a", UNHEALTHY)])
    assert list(devices) == [Device("a", UNHEALTHY)]


def test_empty_deviceset() -> None:
    empty = DeviceSet.of([])
    assert empty == DeviceSet()
    assert len(empty) == 0
    assert empty.ids == ()
    assert "a" not in empty
    assert empty.get("a") is None


CONTAINS_CASES = [
    pytest.param("a", True, id="present"),
    pytest.param("b", True, id="present-unhealthy"),
    pytest.param("c", False, id="absent"),
    pytest.param("", False, id="empty"),
    pytest.param(Device("a"), False, id="device-object-is-not-an-id"),
    pytest.param(1, False, id="int"),
]


@pytest.mark.parametrize("item, expected", CONTAINS_CASES)
def test_deviceset_contains(item: object, expected: bool) -> None:
    devices = DeviceSet.of([Device("a"), Device("b", UNHEALTHY)])
    assert (item in devices) is expected


@pytest.mark.parametrize(
    "device_id, expected",
    [
        pytest.param("a", Device("a"), id="healthy"),
        pytest.param("b", Device("b", UNHEALTHY), id="unhealthy"),
        pytest.param("z", None, id="absent"),
    ],
)
def test_deviceset_get(device_id: str, expected: Device | None) -> None:
    devices = DeviceSet.of([Device("a"), Device("b", UNHEALTHY)])
    assert devices.get(device_id) == expected


@pytest.mark.parametrize(
    "devices, healthy, unhealthy",
    [
        pytest.param([], 0, 0, id="empty"),
        pytest.param([Device("a"), Device("b")], 2, 0, id="all-healthy"),
        pytest.param([Device("a", UNHEALTHY)], 0, 1, id="all-unhealthy"),
        pytest.param([Device("a"), Device("b", UNHEALTHY), Device("c")], 2, 1, id="mixed"),
    ],
)
def test_deviceset_count(devices: list[Device], healthy: int, unhealthy: int) -> None:
    device_set = DeviceSet.of(devices)
    assert device_set.count(HEALTHY) == healthy
    assert device_set.count(UNHEALTHY) == unhealthy
    assert device_set.count("Sick") == 0


def test_deviceset_equal_whatever_the_build_order() -> None:
    devices = [Device("cola3"), Device("cola1", UNHEALTHY), Device("cola2")]
    sets = [DeviceSet.of(p) for p in itertools.permutations(devices)]
    assert all(s == sets[0] for s in sets)
    assert len({hash(s) for s in sets}) == 1


def test_deviceset_equality_ignores_lookup_cache() -> None:
    warm, cold = DeviceSet.of([Device("a")]), DeviceSet.of([Device("a")])
    assert "a" in warm  # fills warm's by_id cache
    assert warm == cold
    assert hash(warm) == hash(cold)


@pytest.mark.parametrize(
    "other",
    [
        pytest.param([Device("a")], id="fewer"),
        pytest.param([Device("a"), Device("b", UNHEALTHY)], id="other-health"),
        pytest.param([Device("a"), Device("c")], id="other-id"),
    ],
)
def test_deviceset_inequality(other: list[Device]) -> None:
    assert DeviceSet.of([Device("a"), Device("b")]) != DeviceSet.of(other)


def test_deviceset_is_frozen() -> None:
    devices = DeviceSet.of([Device("a")])
    with pytest.raises(dataclasses.FrozenInstanceError):
        devices.devices = ()  # type: ignore[misc]


# --- diff ----------------------------------------------------------------------------------


def _set(**health: str) -> DeviceSet:
    return DeviceSet.of(Device(k, v) for k, v in health.items())


H, U = HEALTHY, UNHEALTHY

DIFF_CASES = [
    # (old, new, added, removed, changed)
    pytest.param(_set(), _set(), (), (), (), id="both-empty"),
    pytest.param(_set(a=H, b=U), _set(b=U, a=H), (), (), (), id="identical"),
    pytest.param(_set(), _set(b=H, a=H), ("a", "b"), (), (), id="all-added"),
    pytest.param(_set(b=H, a=U), _set(), (), ("a", "b"), (), id="all-removed"),
    pytest.param(_set(a=H), _set(a=U), (), (), ("a",), id="became-unhealthy"),
    pytest.param(_set(a=U), _set(a=H), (), (), ("a",), id="became-healthy"),
    pytest.param(
        _set(a=H, b=H, c=H, d=U),
        _set(b=H, c=U, d=H, e=H, f=U),
        ("e", "f"),
        ("a",),
        ("c", "d"),
        id="mixed",
    ),
]


@pytest.mark.parametrize("old, new, added, removed, changed", DIFF_CASES)
def test_diff(
    old: DeviceSet, new: DeviceSet, added: tuple[str, ...], removed: tuple[str, ...], changed: tuple[str, ...]
) -> None:
    result = diff(old, new)
    assert result == DeviceDiff(added=added, removed=removed, changed=changed)
    assert bool(result) is bool(added or removed or changed)


@pytest.mark.parametrize(
    "result, truthy",
    [
        pytest.param(DeviceDiff(), False, id="empty"),
        pytest.param(DeviceDiff(added=("a",)), True, id="added"),
        pytest.param(DeviceDiff(removed=("a",)), True, id="removed"),
        pytest.param(DeviceDiff(changed=("a",)), True, id="changed"),
    ],
)
def test_diff_truthiness(result: DeviceDiff, truthy: bool) -> None:
    assert bool(result) is truthy


def test_diff_is_antisymmetric() -> None:
    old, new = _set(a=H, b=H, c=U), _set(b=U, c=U, d=H)
    forward, backward = diff(old, new), diff(new, old)
    assert forward.added == backward.removed == ("d",)
    assert forward.removed == backward.added == ("a",)
    assert forward.changed == backward.changed == ("b",)


def test_diff_sees_a_changed_device_file() -> None:
    old = DeviceSet.of([Device("a", numa_nodes=(0,))])
    new = DeviceSet.of([Device("a", numa_nodes=(1,))])
    assert diff(old, new) == DeviceDiff(changed=("a",))


# --- the richer device model -----------------------------------------------------------------


def test_device_positional_fields_unchanged() -> None:
    device = Device("a", UNHEALTHY)
    assert (device.device_id, device.health, device.problem) == ("a", UNHEALTHY, "")
    assert device.numa_nodes == device.device_nodes == device.mounts == device.envs == ()
    assert device.annotations == device.cdi_devices == ()
    assert Device("a").bare and Device("a", UNHEALTHY).bare
    assert not Device("a", numa_nodes=(0,)).bare
    assert not Device("a", UNHEALTHY, problem="x").bare


def test_bare_names_every_field_that_is_on_the_wire() -> None:
    """`bare` checks field by field: a field added to Device must be named there (or be local-only)."""
    import dataclasses

    local_only = {"device_id", "health", "probe"}  # the ID and health are the bare pair itself
    for f in dataclasses.fields(Device):
        if f.name in local_only:
            continue
        value: object = {
            "numa_nodes": (0,),
            "device_nodes": (DeviceNode("/dev/a", "/dev/a"),),
            "mounts": (Mount("/a", "/a"),),
            "envs": (("A", "b"),),
            "annotations": (("a", "b"),),
            "cdi_devices": ("x.com/y=z",),
            "prepare": (),
        }.get(f.name, "x")
        device = dataclasses.replace(Device("a", UNHEALTHY), **{f.name: value})
        assert not device.bare, f.name
        assert dataclasses.replace(device, probe=None) != Device("a", UNHEALTHY)  # the old definition agrees
    assert Device("a", UNHEALTHY, probe=("/bin/p",)).bare


def test_device_node_and_mount_defaults() -> None:
    assert DeviceNode("/dev/a", "/dev/b").permissions == "rw"
    assert Mount("/a", "/b").read_only is True


def test_devices_still_order_by_id() -> None:
    devices = [Device("b"), Device("a", numa_nodes=(3,)), Device("a")]
    assert sorted(devices)[0] == Device("a")


# --- replicas ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "device_id, expected",
    [
        pytest.param("cola1", "cola1", id="plain"),
        pytest.param("cola1::0", "cola1", id="replica"),
        pytest.param("cola1::12", "cola1", id="replica-two-digits"),
        pytest.param("a.b-c::3", "a.b-c", id="dots-and-dashes"),
        pytest.param("", "", id="empty"),
        pytest.param("::1", "", id="no-base"),
        pytest.param("a::1::2", "a", id="first-separator"),
    ],
)
def test_base_id(device_id: str, expected: str) -> None:
    assert base_id(device_id) == expected


def test_replica_ids_never_clash_with_file_ids() -> None:
    assert REPLICA_SEPARATOR == "::"
    assert id_problem("cola1::0") is not None


@pytest.mark.parametrize(
    "device_id", ["cola1", "a" * MAX_DEVICE_ID_LENGTH, "cola1::0", "cola1::7", f"cola1::{MAX_REPLICAS - 1}", "1"]
)
def test_request_id_problem_accepts_every_id_colad_advertises(device_id: str) -> None:
    assert request_id_problem(device_id) is None


@pytest.mark.parametrize(
    ("device_id", "problem"),
    [
        ("", "not a device ID: empty name"),
        ("a" * (MAX_DEVICE_ID_LENGTH + 1), "not a device ID: longer than"),
        ("1" * 5000, "not a device ID: longer than"),
        (".cola", "not a device ID: hidden file"),
        ("co la", "not a device ID: characters"),
        ("cola\u202e", "not a device ID: characters"),
        ("cola\x00", "not a device ID: characters"),
        ("\u0663", "not a device ID: characters"),
        ("::0", "not a device ID: empty name"),
        ("cola::", "replica index"),
        ("cola::01", "replica index"),
        (f"cola::{MAX_REPLICAS}", "replica index"),
        ("cola::" + "0" * 5000, "replica index"),
        ("cola::\u0663", "replica index"),
        ("cola::1::2", "replica index"),
        ("cola::-1", "replica index"),
    ],
)
def test_request_id_problem_refuses_what_colad_never_advertises(device_id: str, problem: str) -> None:
    found = request_id_problem(device_id)
    assert found is not None and found.startswith(problem)


@pytest.mark.parametrize("replicas", [-1, 0, 1])
def test_replicate_one_or_fewer_is_identity(replicas: int) -> None:
    devices = DeviceSet.of([Device("a"), Device("b", UNHEALTHY)])
    assert replicate(devices, replicas) is devices


def test_replicate() -> None:
    rich = Device("cola1", UNHEALTHY, numa_nodes=(1,), device_nodes=(DeviceNode("/dev/c", "/dev/c"),))
    result = replicate(DeviceSet.of([rich, Device("cola2")]), 3)
    assert result.ids == ("cola1::0", "cola1::1", "cola1::2", "cola2::0", "cola2::1", "cola2::2")
    for n in range(3):
        assert result.get(f"cola1::{n}") == dataclasses.replace(rich, device_id=f"cola1::{n}")
    assert {base_id(i) for i in result.ids} == {"cola1", "cola2"}


def test_replicate_is_stable_and_not_zero_padded() -> None:
    first = replicate(DeviceSet.of([Device("a")]), 12)
    assert first == replicate(DeviceSet.of([Device("a")]), 12)
    assert "a::10" in first and "a::0" in first and "a::00" not in first
    assert replicate(DeviceSet(), 4) == DeviceSet()


# --- wire form ---------------------------------------------------------------------------------

RICH = Device(
    "cola1",
    HEALTHY,
    numa_nodes=(0, 3),
    device_nodes=(DeviceNode("/dev/cola1", "/dev/cola1", "rw"), DeviceNode("/dev/ctl", "/dev/c", "rwm")),
    mounts=(Mount("/opt/cola", "/opt/cola", True), Mount("/var/cola", "/state", False)),
    envs=(("A", "1"), ("B", "x,y")),
    annotations=(("example.com/k", "v"), ("plain", "")),
    cdi_devices=("vendor.com/cola=cola1", "nvidia.com/gpu=0"),
)

ROUND_TRIP = [
    pytest.param(Device("a"), id="bare-healthy"),
    pytest.param(Device("a", UNHEALTHY), id="bare-unhealthy"),
    pytest.param(Device("a", UNHEALTHY, problem="unknown key 'x'"), id="malformed"),
    pytest.param(Device("a", numa_nodes=(0,)), id="numa"),
    pytest.param(Device("a", numa_nodes=(0, 1023)), id="numa-bounds"),
    pytest.param(Device("a", device_nodes=(DeviceNode("/dev/a", "/dev/b", "m"),)), id="device-node"),
    pytest.param(Device("a", mounts=(Mount("/a", "/b", False),)), id="mount"),
    pytest.param(Device("a", envs=(("E", ""),)), id="env-empty-value"),
    pytest.param(Device("a", annotations=(("k", "\u00e9\n"),)), id="annotation-unicode"),
    pytest.param(Device("a", cdi_devices=("a.com/b=c",)), id="cdi"),
    pytest.param(RICH, id="rich"),
    pytest.param(dataclasses.replace(RICH, health=UNHEALTHY), id="rich-declared-unhealthy"),
    pytest.param(Device("a" * 63, mounts=(Mount("/" + "m" * 4095, "/m"),)), id="long-strings"),
    pytest.param(Device("a", numa_nodes=tuple(range(64))), id="64-numa-nodes"),
]


@pytest.mark.parametrize("device", ROUND_TRIP)
def test_wire_round_trip(device: Device) -> None:
    assert device_problem(device) is None
    wire = device_to_wire(device)
    assert json.loads(json.dumps(wire)) == wire  # JSON-ready
    assert device_from_wire(json.loads(json.dumps(wire))) == device


def test_wire_bare_device_is_the_old_pair() -> None:
    assert device_to_wire(Device("a")) == ["a", HEALTHY]
    assert device_to_wire(Device("a", UNHEALTHY)) == ["a", UNHEALTHY]


def test_wire_dict_holds_only_non_default_keys() -> None:
    assert device_to_wire(Device("a", numa_nodes=(1,))) == {"id": "a", "numa_nodes": [1]}
    assert device_to_wire(Device("a", UNHEALTHY, problem="p")) == {"id": "a", "health": UNHEALTHY, "problem": "p"}
    assert device_to_wire(Device("a", mounts=(Mount("/a", "/b"),))) == {"id": "a", "mounts": [["/a", "/b", True]]}


def test_wire_round_trip_many_generated_devices() -> None:
    # hypothesis is not installed in the venv: a seeded generator over every field instead.
    rng = random.Random(7)
    for _ in range(300):
        nodes = tuple(
            DeviceNode(f"/dev/n{i}", f"/dev/c{i}", rng.choice(("r", "w", "m", "rw", "rm", "wm", "rwm")))
            for i in range(rng.randrange(3))
        )
        mounts = tuple(Mount(f"/h/{i}", f"/m/{i}", rng.random() < 0.5) for i in range(rng.randrange(3)))
        envs = tuple(
            sorted({f"E{rng.randrange(9)}": rng.choice(("", "x", "ü,€")) for _ in range(rng.randrange(4))}.items())
        )
        annotations = tuple(sorted({f"x.io/k{rng.randrange(9)}": "v" for _ in range(rng.randrange(4))}.items()))
        device = Device(
            f"d{rng.randrange(1000)}",
            rng.choice(HEALTH_VALUES),
            numa_nodes=tuple(sorted(rng.sample(range(1024), rng.randrange(4)))),
            device_nodes=nodes,
            mounts=mounts,
            envs=envs,
            annotations=annotations,
            cdi_devices=tuple(f"v.com/c=n{i}" for i in range(rng.randrange(3))),
        )
        assert device_problem(device) is None, device
        assert device_from_wire(json.loads(json.dumps(device_to_wire(device)))) == device


WIRE_ERRORS = [
    # (wire object, fragment of the ValueError)
    pytest.param(None, "not [id, health]", id="none"),
    pytest.param("a", "not [id, health]", id="string"),
    pytest.param(["a"], "not [id, health]", id="short-list"),
    pytest.param(["a", HEALTHY, 1], "not [id, health]", id="long-list"),
    pytest.param(["a", 1], "not [id, health]", id="health-int"),
    pytest.param(["a", "Sick"], "health 'Sick'", id="health-unknown"),
    pytest.param(["a b", HEALTHY], "invalid device ID", id="bad-id"),
    pytest.param(["a::0", HEALTHY], "invalid device ID", id="replica-id"),
    pytest.param({"health": HEALTHY}, "invalid device ID", id="no-id"),
    pytest.param({"id": 1}, "invalid device ID", id="id-int"),
    pytest.param({"id": "a", "colour": 1}, "unknown device keys", id="unknown-key"),
    pytest.param({"id": "a", "health": None}, "not a string", id="health-null"),
    pytest.param({"id": "a", "numa_nodes": 0}, "numa_nodes is not a list", id="numa-int"),
    pytest.param({"id": "a", "numa_nodes": [True]}, "numa_nodes is not a list of integers", id="numa-bool"),
    pytest.param({"id": "a", "numa_nodes": [1, 0]}, "sorted and unique", id="numa-unsorted"),
    pytest.param({"id": "a", "numa_nodes": [0, 0]}, "sorted and unique", id="numa-duplicate"),
    pytest.param({"id": "a", "numa_nodes": [1024]}, "not in 0..1023", id="numa-range"),
    pytest.param({"id": "a", "numa_nodes": list(range(65))}, "more than 64", id="numa-many"),
    pytest.param({"id": "a", "device_nodes": [["/a", "/b"]]}, "device_nodes entry", id="node-short"),
    pytest.param({"id": "a", "device_nodes": [["/a", "/b", True]]}, "device_nodes entry", id="node-perm-bool"),
    pytest.param({"id": "a", "device_nodes": [["/a", "/b", "x"]]}, "permissions 'x'", id="node-perm-bad"),
    pytest.param({"id": "a", "device_nodes": [["/a", "/b", "wr"]]}, "permissions 'wr'", id="node-perm-order"),
    pytest.param({"id": "a", "device_nodes": [["a", "/b", "r"]]}, "device_nodes[0].host_path", id="node-relative"),
    pytest.param({"id": "a", "mounts": [["/a", "/b", 1]]}, "mounts entry", id="mount-ro-int"),
    pytest.param({"id": "a", "mounts": [["/a", "/../b", True]]}, "mounts[0].container_path", id="mount-dotdot"),
    pytest.param(
        {"id": "a", "mounts": [["/a", "/b", True], ["/c", "/b", True]]}, "already used by mounts[0]", id="mount-dup"
    ),
    pytest.param({"id": "a", "envs": [["A", "1"]]}, "envs is not an object", id="envs-list"),
    pytest.param({"id": "a", "envs": {"A": 1}}, "not a string", id="env-value-int"),
    pytest.param({"id": "a", "envs": {"COLA_DEVICES": "x"}}, "reserved", id="env-reserved"),
    pytest.param({"id": "a", "envs": {"A": "\udcff"}}, "not valid UTF-8", id="env-value-surrogate"),
    pytest.param({"id": "a", "annotations": {"A/b": "v"}}, "annotations: 'A/b'", id="annotation-key"),
    pytest.param({"id": "a", "cdi_devices": "a.com/b=c"}, "cdi_devices is not a list", id="cdi-string"),
    pytest.param({"id": "a", "cdi_devices": [1]}, "not a list of strings", id="cdi-int"),
    pytest.param({"id": "a", "cdi_devices": ["nope"]}, "cdi_devices[0]", id="cdi-bad"),
    pytest.param({"id": "a", "problem": 1}, "not a string", id="problem-int"),
    pytest.param({"id": "a", "problem": "p"}, "must be Unhealthy", id="problem-on-healthy"),
    pytest.param(
        {"id": "a", "health": UNHEALTHY, "problem": "p", "numa_nodes": [0]}, "carry nothing else", id="problem-fields"
    ),
    pytest.param({"id": "a", "health": UNHEALTHY, "problem": "p" * 4097}, "longer than 4096", id="problem-long"),
]


@pytest.mark.parametrize("obj, fragment", WIRE_ERRORS)
def test_device_from_wire_rejects(obj: object, fragment: str) -> None:
    with pytest.raises(ValueError) as caught:
        device_from_wire(obj)
    assert fragment in str(caught.value)
