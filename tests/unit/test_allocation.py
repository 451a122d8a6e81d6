"""Unit tests for colad.allocation: Allocate validation and GetPreferredAllocation policy."""

from __future__ import annotations

import itertools
import random

import pytest

from colad.allocation import ContainerAllocation, allocate, preferred
from colad.constants import COLA_DEVICES_ENV, HEALTHY, UNHEALTHY
from colad.devices import Device, DeviceSet
from colad.errors import AllocationError, ColadError

pytestmark = pytest.mark.unit

DEVICES = DeviceSet.of(
    [
        Device("cola1"),
        Device("cola2"),
        Device("cola3"),
        Device("cola10"),
        Device("sick", UNHEALTHY),
    ]
)

# --- allocate ------------------------------------------------------------------------------

ALLOCATE_OK = [
    pytest.param(["cola1"], id="one"),
    pytest.param(["cola3", "cola1"], id="keeps-request-order"),
    pytest.param(["cola10", "cola2", "cola1", "cola3"], id="all-healthy-unsorted"),
]


@pytest.mark.parametrize("requested", ALLOCATE_OK)
def test_allocate_success(requested: list[str]) -> None:
    result = allocate(DEVICES, requested)
    assert isinstance(result, ContainerAllocation)
    assert result.device_ids == tuple(requested)
    assert result.envs == {COLA_DEVICES_ENV: ",".join(requested)}


def test_allocate_env_name() -> None:
    assert allocate(DEVICES, ("cola2", "cola1")).envs == {"COLA_DEVICES": "cola2,cola1"}


def test_allocate_accepts_tuple_and_returns_tuple() -> None:
    result = allocate(DEVICES, ("cola2",))
    assert result.device_ids == ("cola2",)
    assert isinstance(result.device_ids, tuple)


ALLOCATE_ERRORS = [
    # (devices, requested, not_found, fragments the message must contain)
    pytest.param(DEVICES, [], False, ["no devices"], id="empty-request"),
    pytest.param(DEVICES, ["cola1", "cola1"], False, ["'cola1'", "twice"], id="duplicate"),
    pytest.param(DEVICES, ["cola1", "cola2", "cola1"], False, ["'cola1'", "twice"], id="duplicate-later"),
    pytest.param(DEVICES, ["nope"], True, ["'nope'", "unknown"], id="unknown"),
    pytest.param(DEVICES, ["cola1", "nope"], True, ["'nope'"], id="unknown-after-known"),
    pytest.param(DeviceSet(), ["cola1"], True, ["'cola1'"], id="no-devices-at-all"),
    pytest.param(DEVICES, ["sick"], False, ["'sick'", UNHEALTHY], id="unhealthy"),
    pytest.param(DEVICES, ["cola1", "sick"], False, ["'sick'", UNHEALTHY], id="unhealthy-after-healthy"),
    pytest.param(DEVICES, ["COLA1"], True, ["'COLA1'"], id="case-sensitive"),
]


@pytest.mark.parametrize("devices, requested, not_found, fragments", ALLOCATE_ERRORS)
def test_allocate_errors(devices: DeviceSet, requested: list[str], not_found: bool, fragments: list[str]) -> None:
    with pytest.raises(AllocationError) as caught:
        allocate(devices, requested)
    assert caught.value.not_found is not_found
    for fragment in fragments:
        assert fragment in str(caught.value)


def test_allocation_error_is_a_colad_error() -> None:
    assert issubclass(AllocationError, ColadError)
    assert AllocationError("x").not_found is False


def test_allocate_health_is_read_from_the_set() -> None:
    devices = DeviceSet.of([Device("a", HEALTHY)])
    assert allocate(devices, ["a"]).device_ids == ("a",)
    with pytest.raises(AllocationError):
        allocate(DeviceSet.of([Device("a", UNHEALTHY)]), ["a"])


# --- preferred -----------------------------------------------------------------------------

FIVE = ["cola1", "cola2", "cola3", "cola4", "cola5"]

PREFERRED_CASES = [
    # (available, must_include, size, expected)
    pytest.param(FIVE, [], 2, ("cola1", "cola2"), id="fill-natural-order"),
    pytest.param(FIVE, ["cola4", "cola2"], 3, ("cola4", "cola2", "cola1"), id="must-include-first-in-given-order"),
    pytest.param(FIVE, ["cola5"], 1, ("cola5",), id="must-include-only"),
    pytest.param(FIVE, ["nope", "cola3"], 2, ("cola3", "cola1"), id="must-include-not-available-ignored"),
    pytest.param(FIVE, ["nope"], 1, ("cola1",), id="only-unavailable-must-include"),
    pytest.param(FIVE, ["cola2", "cola2"], 2, ("cola2", "cola1"), id="must-include-duplicates-ignored"),
    pytest.param(["cola2", "cola1", "cola2"], [], 2, ("cola1", "cola2"), id="available-duplicates-ignored"),
    pytest.param(["cola10", "cola2", "cola1"], [], 3, ("cola1", "cola2", "cola10"), id="cola2-before-cola10"),
    pytest.param(["gpu-10", "gpu-02", "gpu-1"], [], 3, ("gpu-1", "gpu-02", "gpu-10"), id="zero-padded-natural"),
    pytest.param(["b1", "a10", "a9"], [], 3, ("a9", "a10", "b1"), id="prefix-then-number"),
    pytest.param(["cola1", "cola"], [], 2, ("cola", "cola1"), id="bare-prefix-first"),
    pytest.param(["1b", "1a", "2"], [], 3, ("1a", "1b", "2"), id="leading-digits"),
    pytest.param(["a1b2", "a1b10", "a1b1"], [], 3, ("a1b1", "a1b2", "a1b10"), id="several-numbers"),
    pytest.param(FIVE, [], 0, (), id="size-0"),
    pytest.param(FIVE, ["cola3"], 0, (), id="size-0-with-must-include"),
    pytest.param(FIVE, ["cola3"], -1, (), id="negative-size"),
    pytest.param(["cola3", "cola1"], [], 5, ("cola1", "cola3"), id="size-larger-than-available"),
    pytest.param(FIVE, ["cola5", "cola4", "cola3"], 2, ("cola5", "cola4"), id="size-smaller-than-must-include"),
    pytest.param([], [], 3, (), id="nothing-available"),
    pytest.param([], ["cola1"], 1, (), id="nothing-available-with-must-include"),
]


@pytest.mark.parametrize("available, must_include, size, expected", PREFERRED_CASES)
def test_preferred(available: list[str], must_include: list[str], size: int, expected: tuple[str, ...]) -> None:
    assert preferred(available, must_include, size) == expected


@pytest.mark.parametrize("size", range(0, 8))
def test_preferred_invariants(size: int) -> None:
    available = ["cola10", "cola2", "cola1", "cola7", "cola3", "cola9"]
    must_include = ["cola7", "cola9"]
    result = preferred(available, must_include, size)
    assert len(result) == min(size, len(available))
    assert len(set(result)) == len(result)
    assert set(result) <= set(available)
    head = must_include[: len(result)]
    assert list(result[: len(head)]) == head


def test_preferred_deterministic_across_permutations() -> None:
    available = ["cola10", "cola2", "cola1", "gpu-3", "cola20", "a"]
    must_include = ["cola20"]
    answers = {preferred(p, must_include, 4) for p in itertools.permutations(available)}
    assert answers == {("cola20", "a", "cola1", "cola2")}


def test_preferred_large_input_natural_order() -> None:
    ids = [f"cola{i}" for i in range(1000)]
    shuffled = ids[:]
    random.Random(1).shuffle(shuffled)
    assert preferred(shuffled, ["cola999"], 4) == ("cola999", "cola0", "cola1", "cola2")
    assert preferred(shuffled, [], 1000) == tuple(ids)


def test_preferred_ties_in_natural_order_are_broken_deterministically() -> None:
    # cola1, cola01, cola001, ... all have the natural key ("cola", 1, ""); every
    # one is a valid device ID. A deterministic answer needs a tie-break, the
    # plain string being the obvious one: the most zeros sort first.
    rng = random.Random(3)
    for prefix in ("a", "b", "c", "d", "e", "f", "g", "h"):
        ids = [prefix + "0" * zeros + "1" for zeros in range(40)]
        rng.shuffle(ids)
        assert preferred(ids, [], 1) == (min(ids),)


def test_preferred_never_raises_on_odd_ids() -> None:
    assert preferred(["x1\u00b2", "x2"], [], 2) == ("x1\u00b2", "x2")
