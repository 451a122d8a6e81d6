"""Pure allocation rules: what Allocate answers and which devices GetPreferredAllocation picks.

Input is the advertised DeviceSet (replica IDs "<id>::<n>" included) and the IDs
the kubelet sent; output is plain values or an AllocationError naming the
offending device. No gRPC types here. The rules are documented in docs/DEVICES.md.
"""

from __future__ import annotations

import heapq
import re
from collections import Counter
from collections.abc import Callable, Container, Iterable, Sequence
from dataclasses import dataclass, field
from itertools import combinations
from typing import TypeVar

from colad.core import namemap
from colad.core.constants import COLA_DEVICES_ENV, COLA_REPLICAS_ENV
from colad.core.device_rules import cdi_device_name_problem
from colad.core.devices import Device, DeviceNode, DeviceSet, Mount, base_id
from colad.core.errors import AllocationError
from colad.core.names import CDI_MODES, DEFAULT_REPLICA_POLICY

# Up to this many NUMA nodes besides those of must_include, preferred() tries every
# combination (at most 2**8 = 256); above it, it adds nodes greedily.
EXACT_NUMA_SEARCH_LIMIT = 8
CDI_NAMING = CDI_MODES[:2]  # the modes that name colad's CDI devices
# Answers kept per device set (answer()): a set lives until the next change, and beyond this many
# different requests on one set each is worked out again (~1.5 KiB an answer of two devices: ~200 KiB a set).
MAX_ANSWERS_PER_SET = 128
_E = TypeVar("_E")  # what the caller makes of an answer (the servicer: its wire bytes and its log line)


@dataclass(frozen=True)
class ContainerAllocation:
    """What one container gets for the devices it was allocated (one ContainerAllocateResponse)."""

    device_ids: tuple[str, ...]  # as requested, in request order
    envs: dict[str, str] = field(default_factory=dict)
    device_nodes: tuple[DeviceNode, ...] = ()
    mounts: tuple[Mount, ...] = ()
    annotations: dict[str, str] = field(default_factory=dict)
    cdi_devices: tuple[str, ...] = ()
    cdi_unlisted: tuple[str, ...] = ()  # would have had a CDI name, but the spec written does not list them


def allocate(
    devices: DeviceSet,
    requested: Sequence[str],
    *,
    resource_name: str = "",
    cdi_mode: str = "off",
    cdi_listed: Container[str] | None = None,
) -> ContainerAllocation:
    """Validate one container request and say what the container gets.

    Every ID must be known and Healthy, and listed once (two replicas of one
    physical device are two IDs: that is sharing). Then, in request order:

    - COLA_DEVICES: the physical IDs (base_id), each once. When any requested ID
      is a replica, COLA_REPLICAS: the requested IDs as given.
    - device nodes, mounts, CDI names: concatenated, identical entries once. Two
      different entries for one container path (node/node, mount/mount or
      node/mount) raise AllocationError naming both devices and the path.
    - envs, annotations: the union; a key several devices set gets their distinct
      values, in order of first appearance, joined with ",".

    With `cdi_mode` "both", each requested ID that is a CDI device of the spec colad writes
    (cdi.encode_spec: the resource a CDI kind, the ID a CDI name) also gets its CDI name
    `<resource_name>=<id>`, first among the CDI names. With "only", such a device contributes
    its CDI name in place of its device nodes, mounts and envs (the spec carries them); COLA_*,
    annotations and the device files' own cdi_devices stay, and a device without a CDI name
    keeps the classic answer. `cdi_listed` (None: not known) are the names the spec file really
    lists (cdi.SpecReader): a device it does not list gets the classic answer in either mode,
    and is named in `cdi_unlisted`. The path-conflict check covers every device either way.
    """
    if not requested:
        raise AllocationError("container request names no devices")
    chosen: list[Device] = []
    seen: set[str] = set()
    for device_id in requested:
        if device_id in seen:
            raise AllocationError(f"device {device_id!r} is requested twice")
        seen.add(device_id)
        device = devices.get(device_id)
        if device is None:
            raise AllocationError(f"unknown device {device_id!r}", not_found=True)
        if not device.healthy:
            raise AllocationError(f"device {device_id!r} is {device.health}")
        chosen.append(device)

    claimed: dict[str, tuple[DeviceNode | Mount, str]] = {}  # container path -> (entry, device ID)
    for device in chosen:
        device_entries: tuple[DeviceNode | Mount, ...] = (*device.device_nodes, *device.mounts)
        for entry in device_entries:
            held = claimed.setdefault(entry.container_path, (entry, device.device_id))
            if held[0] != entry:
                raise AllocationError(
                    f"devices {held[1]!r} and {device.device_id!r} need different entries "
                    f"for container path {entry.container_path!r}"
                )
    in_spec = [d.device_id for d in chosen if cdi_mode in CDI_NAMING and _in_spec(resource_name, d)]
    own_cdi = {i: namemap.cdi_device_name(resource_name, i) for i in in_spec if cdi_listed is None or i in cdi_listed}
    unlisted = tuple(i for i in in_spec if i not in own_cdi)
    classic = [d for d in chosen if cdi_mode != "only" or d.device_id not in own_cdi]
    # The classic devices' entries, identical ones once (the check above made one entry per path).
    entries = list(dict.fromkeys(e for d in classic for e in (*d.device_nodes, *d.mounts)))

    # The parser refuses COLA_* keys in device files; colad's own still win, should one slip in.
    envs = _merge(d.envs for d in classic)
    envs[COLA_DEVICES_ENV] = ",".join(dict.fromkeys(base_id(i) for i in requested))
    if any(base_id(i) != i for i in requested):
        envs[COLA_REPLICAS_ENV] = ",".join(requested)
    return ContainerAllocation(
        device_ids=tuple(requested),
        envs=envs,
        device_nodes=tuple(e for e in entries if isinstance(e, DeviceNode)),
        mounts=tuple(e for e in entries if isinstance(e, Mount)),
        annotations=_merge(d.annotations for d in chosen),
        cdi_devices=tuple(dict.fromkeys([*own_cdi.values(), *(name for d in chosen for name in d.cdi_devices)])),
        cdi_unlisted=unlisted,
    )


def answer(
    devices: DeviceSet,
    requested: tuple[str, ...],
    encode: Callable[[ContainerAllocation], _E],
    *,
    resource_name: str = "",
    cdi_mode: str = "off",
    cdi_listed: frozenset[str] | None = None,
) -> tuple[ContainerAllocation, _E]:
    """allocate() and encode() of its result, worked out once per device set for each distinct request.

    allocate() is a pure function of its arguments and a set is immutable, so an answer kept on the
    set (DeviceSet.memo) is the answer: a kubelet asking for the same devices again, or many pods
    being given the same few, costs one lookup. A refusal is never kept (it raises each time).
    `encode` must be pure too (the servicer's wire bytes and log fields); the cache is shared by gRPC threads:
    one dict, entries added whole, a race makes the same answer twice.
    """
    kept: dict[tuple[object, ...], tuple[ContainerAllocation, _E]] = devices.memo("answers", lambda _: {})
    key = (requested, resource_name, cdi_mode, cdi_listed)
    found = kept.get(key)
    if found is None:
        result = allocate(devices, requested, resource_name=resource_name, cdi_mode=cdi_mode, cdi_listed=cdi_listed)
        found = (result, encode(result))
        if len(kept) < MAX_ANSWERS_PER_SET:
            kept[key] = found
    return found


def _in_spec(resource_name: str, device: Device) -> bool:
    """Whether cdi.encode_spec puts `device` into the resource's spec, so its CDI name resolves."""
    return namemap.cdi_kind_problem(resource_name) is None and cdi_device_name_problem(device.device_id) is None


def _merge(tables: Iterable[tuple[tuple[str, str], ...]]) -> dict[str, str]:
    values: dict[str, dict[str, None]] = {}  # key -> distinct values in order (a dict as an ordered set)
    for pairs in tables:
        for key, value in pairs:
            values.setdefault(key, {})[value] = None
    return {key: ",".join(vs) for key, vs in values.items()}


def _natural_key(device_id: str) -> tuple[object, ...]:
    # "cola2" before "cola10": operators number devices and expect that order.
    # Ties ("cola1" and "cola01") are broken by the plain ID, so the order never depends on set order.
    # A run of digits compares as a number by (length, digits) once its leading zeros are gone: int()
    # would refuse a run past Python's 4300-digit limit, and an ID here is not bounded yet.
    parts = re.split(r"([0-9]+)", device_id)
    return (tuple(_number_key(p) if p.isdigit() and p.isascii() else (0, 0, p) for p in parts), device_id)


def _number_key(digits: str) -> tuple[int, int, str]:
    significant = digits.lstrip("0") or "0"
    return (1, len(significant), significant)


def preferred(
    devices: DeviceSet,
    available: Sequence[str],
    must_include: Sequence[str],
    size: int,
    policy: str = DEFAULT_REPLICA_POLICY,
) -> tuple[str, ...]:
    """A deterministic preferred allocation; never raises.

    The answer is advisory (the kubelet intersects it with its own candidates and
    fills any gap), and an error here would fail the pod, so odd input gets a
    best-effort answer: never more than `size` IDs, all from `available`;
    must_include first (those that are available, in the kubelet's order).

    The rest come from the smallest set of NUMA nodes (always including those of
    must_include) whose devices cover the need: tried exactly up to
    EXACT_NUMA_SEARCH_LIMIT other nodes (ties: more usable devices, then lower
    node IDs), greedily above. A device on several nodes needs all of them; a
    device without NUMA info (or not in `devices`) fits anywhere but is taken
    after the aligned ones. Among those, `policy` orders replicas: "spread" takes
    the physical device with the fewest replicas chosen so far (then the most
    free), "pack" fills one physical device before the next (the one with the
    fewest free first); an unknown policy counts as "spread". Natural order
    ("cola2" before "cola10") breaks the remaining ties.
    """
    available_set = set(available)
    chosen: list[str] = []
    for device_id in must_include:
        if device_id in available_set and device_id not in chosen:
            chosen.append(device_id)
    if size <= len(chosen):
        return tuple(chosen[: max(size, 0)])
    need = size - len(chosen)
    candidates = sorted(available_set.difference(chosen), key=_natural_key)
    numa = {device_id: _numa(devices, device_id) for device_id in (*chosen, *candidates)}
    required = frozenset(node for device_id in chosen for node in numa[device_id])
    nodes = _choose_nodes(Counter(numa[c] for c in candidates), required, need)
    aligned = [c for c in candidates if numa[c] and numa[c] <= nodes]
    unaligned = [c for c in candidates if not numa[c]]
    return tuple(chosen + _pick((aligned, unaligned), chosen, need, policy))


def _numa(devices: DeviceSet, device_id: str) -> frozenset[int]:
    device = devices.get(device_id)
    return frozenset(device.numa_nodes) if device is not None else frozenset()


def _choose_nodes(groups: Counter[frozenset[int]], required: frozenset[int], need: int) -> frozenset[int]:
    """The NUMA nodes to take devices from: `groups` counts candidates by their node set."""
    universe = required.union(*groups)

    def usable(nodes: frozenset[int]) -> int:
        return sum(count for node_set, count in groups.items() if node_set <= nodes)

    if usable(universe) <= need:
        return universe
    optional = sorted(universe - required)
    # Devices without NUMA info fit the empty combination too, but aligned devices come first:
    # with no must_include node to start from, take at least one node when there is one.
    fewest = 0 if required or not optional else 1
    if len(optional) <= EXACT_NUMA_SEARCH_LIMIT:
        for k in range(fewest, len(optional) + 1):
            best: tuple[tuple[int, tuple[int, ...]], frozenset[int]] | None = None
            for extra in combinations(optional, k):
                nodes = required.union(extra)
                count = usable(nodes)
                if count >= need:
                    key = (-count, tuple(sorted(nodes)))
                    if best is None or key < best[0]:
                        best = (key, nodes)
            if best is not None:
                return best[1]
        return universe  # not reached: all of universe is usable and covers the need
    on_node: Counter[int] = Counter()
    for node_set, count in groups.items():
        for node in node_set:
            on_node[node] += count
    nodes = required
    while usable(nodes) < need or len(nodes) < fewest:
        # The node that makes the most devices usable, then the one with most devices, then the lowest.
        nodes = nodes | {max(universe - nodes, key=lambda n: (usable(nodes | {n}), on_node[n], -n))}
    return nodes


def _pick(tiers: Sequence[Sequence[str]], chosen: Sequence[str], need: int, policy: str) -> list[str]:
    """Up to `need` IDs from `tiers` (each in natural order), one tier after the other, by replica policy."""
    taken = Counter(base_id(i) for i in chosen)  # replicas chosen so far, per physical device
    picks: list[str] = []
    for tier in tiers:
        free: dict[str, list[str]] = {}  # physical ID -> its free replicas, last one first
        for device_id in reversed(tier):
            free.setdefault(base_id(device_id), []).append(device_id)
        heap = [(_policy_key(policy, taken[p], len(replicas), p), p) for p, replicas in free.items()]
        heapq.heapify(heap)
        while heap and len(picks) < need:
            # Only the popped device's key changes, so the heap never holds a stale entry.
            _, physical = heapq.heappop(heap)
            picks.append(free[physical].pop())
            taken[physical] += 1
            if free[physical]:
                heapq.heappush(heap, (_policy_key(policy, taken[physical], len(free[physical]), physical), physical))
    return picks


def _policy_key(policy: str, taken: int, free: int, physical: str) -> tuple[object, ...]:
    if policy == "pack":
        # A device already in use first, then the one with the fewest free replicas: whole devices stay free.
        return (taken == 0, free, _natural_key(physical))
    # spread: the device with the fewest replicas chosen, then the most free ones.
    return (taken, -free, _natural_key(physical))
