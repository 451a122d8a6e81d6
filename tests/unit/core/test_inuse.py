"""The in-use view's pure core: holders from List tuples, replicas, foreign resources, the hand-over diff."""

from __future__ import annotations

import pytest

from colad.core import inuse
from colad.core.devices import base_id
from colad.core.inuse import Change, Holder

pytestmark = pytest.mark.unit

COLA = "myway5.com/cola"
GPU = "nvidia.com/gpu"
A = Holder("default", "a", "main")
B = Holder("default", "b", "main")
C = Holder("prod", "c", "side")


@pytest.mark.parametrize(
    ("assignments", "resources", "expected"),
    [
        pytest.param([], {COLA}, {}, id="nothing-assigned"),
        pytest.param(
            [("default", "a", "main", COLA, ["cocacola"])],
            {COLA},
            {(COLA, "cocacola"): {A}},
            id="one-device",
        ),
        pytest.param(
            [("default", "a", "main", COLA, ["cocacola", "peisicola"])],
            {COLA},
            {(COLA, "cocacola"): {A}, (COLA, "peisicola"): {A}},
            id="two-devices-one-container",
        ),
        pytest.param(
            [("default", "a", "main", GPU, ["GPU-1"]), ("default", "b", "main", COLA, ["cocacola"])],
            {COLA},
            {(COLA, "cocacola"): {B}},
            id="foreign-resource-ignored",
        ),
        pytest.param(
            [("default", "a", "main", COLA, ["cocacola"])],
            set(),
            {},
            id="no-resource-served",
        ),
        pytest.param(
            [("default", "a", "main", COLA, ["cocacola::0"]), ("default", "b", "main", COLA, ["cocacola::1"])],
            {COLA},
            {(COLA, "cocacola"): {A, B}},
            id="replicas-share-one-physical-device",
        ),
        pytest.param(
            [("default", "a", "main", COLA, ["cocacola::0", "cocacola::1"])],
            {COLA},
            {(COLA, "cocacola"): {A}},
            id="two-replicas-one-holder",
        ),
        pytest.param(
            [("default", "a", "main", COLA, ["a::b::3"])],
            {COLA},
            {(COLA, "a"): {A}},
            id="split-on-first-separator",
        ),
        pytest.param(
            [("default", "a", "main", COLA, []), ("prod", "c", "side", "other.io/x", ["cocacola"])],
            {COLA},
            {},
            id="empty-device-list-and-same-id-in-another-resource",
        ),
        pytest.param(
            [("default", "a", "main", COLA, ["cocacola"]), ("default", "a", "main", "x.io/y", ["cocacola"])],
            {COLA, "x.io/y"},
            {(COLA, "cocacola"): {A}, ("x.io/y", "cocacola"): {A}},
            id="two-served-resources",
        ),
    ],
)
def test_holders(
    assignments: list[inuse.Assignment], resources: set[str], expected: dict[inuse.Key, set[Holder]]
) -> None:
    assert inuse.holders(assignments, resources) == {k: frozenset(v) for k, v in expected.items()}


@pytest.mark.parametrize(
    ("device_id", "physical"),
    [("cocacola", "cocacola"), ("cocacola::0", "cocacola"), ("x::", "x"), ("a::b::c", "a")],
)
def test_physical_id(device_id: str, physical: str) -> None:
    # The replica split is devices.base_id's; the in-use view keys holders by it.
    assert base_id(device_id) == physical
    assert set(inuse.holders([("ns", "p", "c", COLA, [device_id])], {COLA})) == {(COLA, physical)}


K = (COLA, "cocacola")
K2 = (COLA, "peisicola")


@pytest.mark.parametrize(
    ("old", "new", "expected"),
    [
        pytest.param({}, {}, [], id="nothing"),
        pytest.param({K: {A}}, {K: {A}}, [], id="unchanged"),
        pytest.param({}, {K: {A}}, [Change("in_use", COLA, "cocacola", A)], id="taken"),
        pytest.param({K: {A}}, {}, [Change("released", COLA, "cocacola", A)], id="released"),
        pytest.param({K: {A}}, {K: {B}}, [Change("changed_hands", COLA, "cocacola", B, A)], id="changed-hands"),
        pytest.param(
            {K: {A}},
            {K: {A, B}},
            [Change("in_use", COLA, "cocacola", B)],
            id="second-holder-of-shared-device",
        ),
        pytest.param(
            {K: {A, B}},
            {K: {C}},
            [Change("changed_hands", COLA, "cocacola", C, A), Change("released", COLA, "cocacola", B)],
            id="two-leave-one-comes",
        ),
        pytest.param(
            {K: {A}, K2: {B}},
            {K2: {A}},
            [Change("released", COLA, "cocacola", A), Change("changed_hands", COLA, "peisicola", A, B)],
            id="sorted-by-device",
        ),
    ],
)
def test_diff(old: dict[inuse.Key, set[Holder]], new: dict[inuse.Key, set[Holder]], expected: list[Change]) -> None:
    freeze = lambda view: {k: frozenset(v) for k, v in view.items()}  # noqa: E731
    assert inuse.diff(freeze(old), freeze(new)) == expected


def test_counts_cover_every_served_resource() -> None:
    view = {K: frozenset({A, B}), K2: frozenset({C}), ("x.io/y", "d"): frozenset({A})}
    assert inuse.in_use_counts(view, [COLA, "z.io/idle"]) == {COLA: 2, "z.io/idle": 0}


def test_rows_and_state_are_sorted_and_round_trip() -> None:
    view = {K2: frozenset({A}), K: frozenset({B, A})}
    state = inuse.state(view, available=True, reason="", updated=12.5)
    assert state["updated"] == 12.5 and state["available"] is True and state["reason"] == ""
    assert [(r["device_id"], r["pod"]) for r in state["holders"]] == [
        ("cocacola", "a"),
        ("cocacola", "b"),
        ("peisicola", "a"),
    ]
    assert state["holders"][0] == {
        "resource": COLA,
        "device_id": "cocacola",
        "namespace": "default",
        "pod": "a",
        "container": "main",
    }
    assert inuse.parse_rows(state["holders"]) == state["holders"]


@pytest.mark.parametrize(
    "raw",
    [
        None,
        "x",
        3,
        [1, "a", None],
        [{"resource": COLA}],
        [{"resource": COLA, "device_id": 1, "namespace": "n", "pod": "p", "container": "c"}],
    ],
    ids=["none", "string", "number", "junk-items", "missing-keys", "wrong-type"],
)
def test_parse_rows_drops_malformed(raw: object) -> None:
    assert inuse.parse_rows(raw) == []
