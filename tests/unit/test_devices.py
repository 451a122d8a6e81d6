"""Unit tests for colad.devices: device-ID rules, build(), DeviceSet and diff()."""

from __future__ import annotations

import dataclasses
import itertools

import pytest

from colad.constants import HEALTHY, MAX_DEVICE_ID_LENGTH, UNHEALTHY
from colad.devices import (
    HEALTH_VALUES,
    Device,
    DeviceDiff,
    DeviceSet,
    ScanResult,
    SkippedName,
    build,
    diff,
    id_problem,
)

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
    result = build(names)
    assert isinstance(result, ScanResult)
    assert result.devices.ids == ids
    assert all(d.health == HEALTHY for d in result.devices)
    assert [s.name for s in result.skipped] == [name for name, _ in skipped]
    for entry, (_, reason) in zip(result.skipped, skipped, strict=True):
        assert isinstance(entry, SkippedName)
        assert reason in entry.reason


def test_build_accepts_any_iterable() -> None:
    assert build(iter(["b", "a"])).devices.ids == ("a", "b")


def test_build_is_independent_of_listing_order() -> None:
    names = ["cola3", ".hidden", "cola1", "bad~", "cola2"]
    results = {build(p) for p in itertools.permutations(names)}
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
