"""Unit tests for colad.core.allocation: Allocate validation and GetPreferredAllocation policy."""

from __future__ import annotations

import itertools
import random

import pytest

from colad.core.allocation import EXACT_NUMA_SEARCH_LIMIT, ContainerAllocation, allocate, preferred
from colad.core.constants import COLA_DEVICES_ENV, COLA_REPLICAS_ENV, HEALTHY, UNHEALTHY
from colad.core.devices import Device, DeviceNode, DeviceSet, Mount, replicate
from colad.core.errors import AllocationError, ColadError
from colad.core.names import REPLICA_POLICIES

pytestmark = pytest.mark.unit

NO_INFO = DeviceSet()  # preferred() treats IDs it does not know as devices without NUMA info

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
    assert preferred(NO_INFO, available, must_include, size) == expected


@pytest.mark.parametrize("size", range(0, 8))
def test_preferred_invariants(size: int) -> None:
    available = ["cola10", "cola2", "cola1", "cola7", "cola3", "cola9"]
    must_include = ["cola7", "cola9"]
    result = preferred(NO_INFO, available, must_include, size)
    assert len(result) == min(size, len(available))
    assert len(set(result)) == len(result)
    assert set(result) <= set(available)
    head = must_include[: len(result)]
    assert list(result[: len(head)]) == head


def test_preferred_deterministic_across_permutations() -> None:
    available = ["cola10", "cola2", "cola1", "gpu-3", "cola20", "a"]
    must_include = ["cola20"]
    answers = {preferred(NO_INFO, p, must_include, 4) for p in itertools.permutations(available)}
    assert answers == {("cola20", "a", "cola1", "cola2")}


def test_preferred_large_input_natural_order() -> None:
    ids = [f"cola{i}" for i in range(1000)]
    shuffled = ids[:]
    random.Random(1).shuffle(shuffled)
    assert preferred(NO_INFO, shuffled, ["cola999"], 4) == ("cola999", "cola0", "cola1", "cola2")
    assert preferred(NO_INFO, shuffled, [], 1000) == tuple(ids)


def test_preferred_ties_in_natural_order_are_broken_deterministically() -> None:
    # cola1, cola01, cola001, ... all have the natural key ("cola", 1, ""); every
    # one is a valid device ID. A deterministic answer needs a tie-break, the
    # plain string being the obvious one: the most zeros sort first.
    rng = random.Random(3)
    for prefix in ("a", "b", "c", "d", "e", "f", "g", "h"):
        ids = [prefix + "0" * zeros + "1" for zeros in range(40)]
        rng.shuffle(ids)
        assert preferred(NO_INFO, ids, [], 1) == (min(ids),)


def test_preferred_never_raises_on_odd_ids() -> None:
    assert preferred(NO_INFO, ["x1\u00b2", "x2"], [], 2) == ("x1\u00b2", "x2")


@pytest.mark.parametrize(
    ("available", "expected"),
    [
        (["a", "1" * 5000], ("1" * 5000, "a")),  # a digit run past int()'s 4300-digit limit
        (["x" + "9" * 4400, "x" + "1" + "0" * 4400, "x8"], ("x8", "x" + "9" * 4400, "x" + "1" + "0" * 4400)),
        (["c" + "0" * 5000 + "2", "c10", "c1"], ("c1", "c" + "0" * 5000 + "2", "c10")),  # leading zeros: the number
    ],
    ids=["digits-only", "long-runs-by-value", "leading-zeros"],
)
def test_preferred_orders_digit_runs_of_any_length_by_value(available: list[str], expected: tuple[str, ...]) -> None:
    assert preferred(NO_INFO, available, [], len(available)) == expected


# --- allocate: what the container gets ------------------------------------------------------

RICH = DeviceSet.of(
    [
        Device(
            "a",
            numa_nodes=(0,),
            device_nodes=(DeviceNode("/dev/a", "/dev/a"),),
            mounts=(Mount("/opt/shared", "/opt/shared"),),
            envs=(("SHARED", "s"), ("X", "1")),
            annotations=(("example.com/k", "va"),),
            cdi_devices=("v.com/c=a",),
        ),
        Device(
            "b",
            device_nodes=(DeviceNode("/dev/b", "/dev/b", "r"),),
            mounts=(Mount("/opt/shared", "/opt/shared"),),
            envs=(("SHARED", "s"), ("X", "2")),
            annotations=(("example.com/k", "vb"), ("only-b", "1")),
            cdi_devices=("v.com/c=b", "v.com/c=a"),
        ),
        Device("c", envs=(("X", "1"),)),
        Device("bare"),
        Device("node-clash", device_nodes=(DeviceNode("/dev/other", "/dev/a"),)),
        Device("perm-clash", device_nodes=(DeviceNode("/dev/a", "/dev/a", "rwm"),)),
        Device("mount-on-node", mounts=(Mount("/dev/a", "/dev/a"),)),
        Device("mount-clash", mounts=(Mount("/opt/shared", "/opt/shared", False),)),
        Device("declared-sick", UNHEALTHY, device_nodes=(DeviceNode("/dev/s", "/dev/s"),)),
    ]
)


def test_allocate_merges_in_request_order() -> None:
    result = allocate(RICH, ["a", "b"])
    assert result == ContainerAllocation(
        device_ids=("a", "b"),
        envs={"SHARED": "s", "X": "1,2", COLA_DEVICES_ENV: "a,b"},
        device_nodes=(DeviceNode("/dev/a", "/dev/a"), DeviceNode("/dev/b", "/dev/b", "r")),
        mounts=(Mount("/opt/shared", "/opt/shared"),),
        annotations={"example.com/k": "va,vb", "only-b": "1"},
        cdi_devices=("v.com/c=a", "v.com/c=b"),
    )
    reverse = allocate(RICH, ["b", "a"])
    assert reverse.envs["X"] == "2,1"
    assert reverse.annotations["example.com/k"] == "vb,va"
    assert reverse.device_nodes == (DeviceNode("/dev/b", "/dev/b", "r"), DeviceNode("/dev/a", "/dev/a"))
    assert reverse.cdi_devices == ("v.com/c=b", "v.com/c=a")


def test_allocate_joins_distinct_values_in_order_of_first_appearance() -> None:
    assert allocate(RICH, ["a", "b", "c"]).envs["X"] == "1,2"
    assert allocate(RICH, ["c", "b", "a"]).envs["X"] == "1,2"
    assert allocate(RICH, ["b", "c", "a"]).envs["X"] == "2,1"


def test_allocate_bare_devices_get_only_cola_devices() -> None:
    result = allocate(RICH, ["bare"])
    assert result == ContainerAllocation(("bare",), {COLA_DEVICES_ENV: "bare"})
    assert COLA_REPLICAS_ENV not in allocate(RICH, ["bare", "a"]).envs


CONFLICTS = [
    pytest.param(["a", "node-clash"], id="node-vs-node"),
    pytest.param(["a", "perm-clash"], id="node-vs-node-other-permissions"),
    pytest.param(["a", "mount-on-node"], id="node-vs-mount"),
    pytest.param(["mount-clash", "a"], id="mount-vs-mount"),
]


@pytest.mark.parametrize("requested", CONFLICTS)
def test_allocate_refuses_two_entries_for_one_container_path(requested: list[str]) -> None:
    with pytest.raises(AllocationError) as caught:
        allocate(RICH, requested)
    message = str(caught.value)
    assert caught.value.not_found is False
    assert f"{requested[0]!r}" in message and f"{requested[1]!r}" in message
    assert "/dev/a" in message or "/opt/shared" in message


def test_allocate_refuses_declared_unhealthy_device() -> None:
    with pytest.raises(AllocationError, match="'declared-sick' is Unhealthy"):
        allocate(RICH, ["declared-sick"])


REPLICATED = replicate(DeviceSet.of([d for d in RICH if d.device_id in ("a", "b", "bare")]), 2)


def test_allocate_replicas() -> None:
    result = allocate(REPLICATED, ["a::1", "b::0", "a::0"])
    assert result.device_ids == ("a::1", "b::0", "a::0")
    assert result.envs[COLA_DEVICES_ENV] == "a,b"
    assert result.envs[COLA_REPLICAS_ENV] == "a::1,b::0,a::0"
    assert result.device_nodes == (DeviceNode("/dev/a", "/dev/a"), DeviceNode("/dev/b", "/dev/b", "r"))
    assert result.mounts == (Mount("/opt/shared", "/opt/shared"),)
    assert result.cdi_devices == ("v.com/c=a", "v.com/c=b")
    assert result.envs["X"] == "1,2"


def test_allocate_two_replicas_of_one_device_is_sharing() -> None:
    result = allocate(REPLICATED, ["bare::1", "bare::0"])
    assert result.envs == {COLA_DEVICES_ENV: "bare", COLA_REPLICAS_ENV: "bare::1,bare::0"}


@pytest.mark.parametrize(
    "requested, not_found, fragment",
    [
        pytest.param(["a"], True, "'a'", id="physical-id-not-advertised"),
        pytest.param(["a::2"], True, "'a::2'", id="replica-out-of-range"),
        pytest.param(["a::0", "a::0"], False, "twice", id="same-replica-twice"),
    ],
)
def test_allocate_replica_errors(requested: list[str], not_found: bool, fragment: str) -> None:
    with pytest.raises(AllocationError) as caught:
        allocate(REPLICATED, requested)
    assert caught.value.not_found is not_found
    assert fragment in str(caught.value)


# --- preferred: topology ------------------------------------------------------------------------

TOPO = DeviceSet.of(
    [
        Device("g0", numa_nodes=(0,)),
        Device("g1", numa_nodes=(0,)),
        Device("g2", numa_nodes=(1,)),
        Device("g3", numa_nodes=(1,)),
        Device("g4", numa_nodes=(1,)),
        Device("g5", numa_nodes=(2,)),
        Device("w0", numa_nodes=(0, 1)),
        Device("x0"),
        Device("sick", UNHEALTHY, numa_nodes=(2,)),  # the kubelet never offers it; it is just data here
    ]
)
ALL = ["g0", "g1", "g2", "g3", "g4", "g5", "w0", "x0"]

TOPOLOGY_CASES = [
    # (available, must_include, size, expected)
    pytest.param(ALL, [], 2, ("g2", "g3"), id="one-node-the-one-with-more-free"),
    pytest.param(ALL, [], 3, ("g2", "g3", "g4"), id="one-node-exactly-full"),
    pytest.param(ALL, [], 4, ("g2", "g3", "g4", "x0"), id="no-numa-fills-after-aligned"),
    pytest.param(ALL, [], 5, ("g0", "g1", "g2", "g3", "g4"), id="fewest-nodes-then-most-free"),
    pytest.param(ALL, [], 8, ("g0", "g1", "g2", "g3", "g4", "g5", "w0", "x0"), id="everything"),
    pytest.param(ALL, [], 20, ("g0", "g1", "g2", "g3", "g4", "g5", "w0", "x0"), id="size-over-available"),
    pytest.param(ALL, ["g0"], 2, ("g0", "g1"), id="must-include-node-first"),
    pytest.param(ALL, ["g0"], 4, ("g0", "g1", "g2", "g3"), id="must-include-node-plus-one"),
    pytest.param(ALL, ["g5"], 2, ("g5", "x0"), id="must-include-lone-node-then-no-numa"),
    pytest.param(ALL, ["g5", "g0"], 3, ("g5", "g0", "g1"), id="must-include-two-nodes"),
    pytest.param(["w0", "g5"], [], 1, ("g5",), id="multi-node-device-needs-all-its-nodes"),
    pytest.param(["w0", "g0", "g5"], [], 2, ("g0", "w0"), id="multi-node-device-fits-its-nodes"),
    pytest.param(["w0", "g0"], ["w0"], 2, ("w0", "g0"), id="must-include-multi-node"),
    pytest.param(["g0", "g2"], [], 1, ("g0",), id="tie-lowest-node"),
    pytest.param(["x0", "g5"], [], 1, ("g5",), id="aligned-before-no-numa"),
    pytest.param(["x0", "zz"], [], 1, ("x0",), id="no-numa-at-all-natural-order"),
    pytest.param(["zz", "g2"], [], 1, ("g2",), id="unknown-id-has-no-numa"),
    pytest.param(["zz", "g2", "g0"], [], 2, ("g0", "zz"), id="unknown-id-fits-anywhere"),
    pytest.param(["g2", "g2", "g3", "g0"], [], 2, ("g2", "g3"), id="duplicates-in-available"),
    pytest.param(["g2", "g3"], ["g2", "g2"], 2, ("g2", "g3"), id="duplicates-in-must-include"),
    pytest.param(ALL, ["nope"], 1, ("g2",), id="must-include-not-available"),
    pytest.param(ALL, [], 0, (), id="size-0"),
    pytest.param(ALL, ["g0"], -3, (), id="negative-size"),
    pytest.param([], [], 2, (), id="nothing-available"),
]


@pytest.mark.parametrize("available, must_include, size, expected", TOPOLOGY_CASES)
def test_preferred_topology(
    available: list[str], must_include: list[str], size: int, expected: tuple[str, ...]
) -> None:
    for policy in REPLICA_POLICIES:
        assert preferred(TOPO, available, must_include, size, policy) == expected


def _combination_trap(extra_nodes: int) -> DeviceSet:
    # Node 0 has 3 devices, nodes 1 and 2 one each, and 3 devices sit on both 1 and 2: five
    # devices fit on {1, 2}, which adding nodes one at a time never finds (it starts with 0).
    devices = [Device(f"a{i}", numa_nodes=(0,)) for i in range(3)]
    devices += [Device("b0", numa_nodes=(1,)), Device("c0", numa_nodes=(2,))]
    devices += [Device(f"bc{i}", numa_nodes=(1, 2)) for i in range(3)]
    devices += [Device(f"f{n}", numa_nodes=(n,)) for n in range(3, 3 + extra_nodes)]
    return DeviceSet.of(devices)


def test_preferred_exact_search_finds_the_smallest_combination() -> None:
    devices = _combination_trap(EXACT_NUMA_SEARCH_LIMIT - 3)  # 8 nodes in all
    assert set(preferred(devices, devices.ids, [], 5)) == {"b0", "c0", "bc0", "bc1", "bc2"}


def test_preferred_greedy_above_the_limit() -> None:
    devices = _combination_trap(EXACT_NUMA_SEARCH_LIMIT - 2)  # 9 nodes: greedy from node 0
    result = preferred(devices, devices.ids, [], 5)
    assert len(result) == 5
    assert result == ("a0", "a1", "a2", "b0", "bc0")


def test_preferred_greedy_many_nodes_is_fast_and_valid() -> None:
    devices = DeviceSet.of(Device(f"d{n}x{i}", numa_nodes=(n,)) for n in range(64) for i in range(n % 5 + 1))
    result = preferred(devices, devices.ids, [], 12)
    assert len(result) == 12
    nodes = {devices.by_id[d].numa_nodes[0] for d in result}
    assert len(nodes) == 3  # 5 + 5 + 5 covers 12; two nodes hold at most 10


# --- preferred: replica policies ----------------------------------------------------------------

REPLICAS = replicate(DeviceSet.of([Device("c1"), Device("c2"), Device("c3")]), 4)
UNEVEN = ["c1::3", "c2::0", "c2::1", "c2::2", "c3::0", "c3::1", "c3::2", "c3::3"]  # free: c1 1, c2 3, c3 4

POLICY_CASES = [
    # (available, must_include, size, spread, pack)
    pytest.param(
        REPLICAS.ids, [], 3, ("c1::0", "c2::0", "c3::0"), ("c1::0", "c1::1", "c1::2"), id="three-of-three-devices"
    ),
    pytest.param(
        REPLICAS.ids,
        [],
        5,
        ("c1::0", "c2::0", "c3::0", "c1::1", "c2::1"),
        ("c1::0", "c1::1", "c1::2", "c1::3", "c2::0"),
        id="five",
    ),
    pytest.param(UNEVEN, [], 2, ("c3::0", "c2::0"), ("c1::3", "c2::0"), id="uneven-free"),
    pytest.param(UNEVEN, [], 1, ("c3::0",), ("c1::3",), id="uneven-free-one"),
    pytest.param(
        REPLICAS.ids,
        ["c2::1"],
        3,
        ("c2::1", "c1::0", "c3::0"),
        ("c2::1", "c2::0", "c2::2"),
        id="must-include-counts-as-chosen",
    ),
    pytest.param(
        REPLICAS.ids,
        ["c2::1", "c2::3"],
        3,
        ("c2::1", "c2::3", "c1::0"),
        ("c2::1", "c2::3", "c2::0"),
        id="must-include-two-replicas",
    ),
    pytest.param(["c1::0", "c1::1"], [], 2, ("c1::0", "c1::1"), ("c1::0", "c1::1"), id="one-device-only"),
]


@pytest.mark.parametrize("available, must_include, size, spread, pack", POLICY_CASES)
def test_preferred_replica_policy(
    available: list[str], must_include: list[str], size: int, spread: tuple[str, ...], pack: tuple[str, ...]
) -> None:
    assert preferred(REPLICAS, available, must_include, size, "spread") == spread
    assert preferred(REPLICAS, available, must_include, size) == spread  # the default
    assert preferred(REPLICAS, available, must_include, size, "pack") == pack


def test_preferred_replicas_in_natural_order() -> None:
    devices = replicate(DeviceSet.of([Device("c1")]), 12)
    assert preferred(devices, devices.ids, [], 3, "pack") == ("c1::0", "c1::1", "c1::2")
    assert preferred(devices, devices.ids, [], 12, "pack")[-2:] == ("c1::10", "c1::11")


def test_preferred_topology_before_policy() -> None:
    devices = replicate(DeviceSet.of([Device("p0", numa_nodes=(0,)), Device("p1", numa_nodes=(1,))]), 2)
    # spread would like two physical devices, but they sit on two NUMA nodes.
    assert preferred(devices, devices.ids, [], 2, "spread") == ("p0::0", "p0::1")


def test_preferred_unknown_policy_is_spread() -> None:
    assert preferred(REPLICAS, REPLICAS.ids, [], 3, "nonsense") == ("c1::0", "c2::0", "c3::0")


def test_replica_policies() -> None:
    assert REPLICA_POLICIES == ("spread", "pack")


@pytest.mark.parametrize("size", range(0, 7))
def test_preferred_policy_irrelevant_without_replicas(size: int) -> None:
    available = ["cola10", "cola2", "cola1", "cola7", "cola3"]
    assert preferred(DEVICES, available, ["cola7"], size, "spread") == preferred(
        DEVICES, available, ["cola7"], size, "pack"
    )


def test_preferred_invariants_random() -> None:
    rng = random.Random(11)
    for _ in range(300):
        base = [
            Device(f"r{i}", numa_nodes=tuple(sorted(rng.sample(range(12), rng.choice((0, 1, 1, 2))))))
            for i in range(rng.randrange(1, 8))
        ]
        devices = replicate(DeviceSet.of(base), rng.choice((1, 2, 3)))
        available = rng.sample(devices.ids, rng.randrange(len(devices) + 1)) + ["unknown"] * rng.randrange(2)
        must_include = rng.sample(available, min(len(available), rng.randrange(3))) + ["gone"]
        size = rng.randrange(-1, len(devices) + 3)
        for policy in REPLICA_POLICIES:
            result = preferred(devices, available, must_include, size, policy)
            assert len(result) == max(0, min(size, len(set(available))))
            assert len(set(result)) == len(result)
            assert set(result) <= set(available)
            head = [d for d in dict.fromkeys(must_include) if d in available][: len(result)]
            assert list(result[: len(head)]) == head
            assert preferred(devices, list(reversed(available)), must_include, size, policy) == result
