"""The in-use view, pure core: which pod, namespace and container holds each colad device now.

Reads plain tuples made from a kubelet PodResources List answer (podresources.py converts the
protobuf); returns the holders of each (resource_name, device_id), the changes between two views
for the "device changed hands" log lines, and the rows of the state file that `colad status`
reads. No I/O, logging, threads or clock reads here.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from colad.core.devices import base_id

# (namespace, pod, container, resource_name, device_ids) for one ContainerDevices entry of List.
Assignment = tuple[str, str, str, str, Sequence[str]]
# (resource_name, physical device_id)
Key = tuple[str, str]


@dataclass(frozen=True, order=True)
class Holder:
    """One container that holds a device."""

    namespace: str
    pod: str
    container: str


Holders = Mapping[Key, frozenset[Holder]]
# (resource_name, device_id, namespace, pod, container): one holder of one device, as /metrics labels it.
HolderRow = tuple[str, str, str, str, str]


@dataclass(frozen=True)
class InUse:
    """The in-use view as published for /metrics: replaced whole, never changed in place.

    While the view is down `counts` and `holders` are empty: unknown is absent, not zero.
    """

    up: bool
    counts: tuple[tuple[str, int], ...] = ()  # (resource_name, devices held), per served resource
    holders: tuple[HolderRow, ...] = ()


DOWN = InUse(False)


@dataclass(frozen=True)
class Change:
    """One line of the hand-over log: kind is "in_use", "released" or "changed_hands"."""

    kind: str
    resource_name: str
    device_id: str
    holder: Holder  # the new holder; for "released" the one that let go
    previous: Holder | None = None  # for "changed_hands": the one before


def holders(assignments: Iterable[Assignment], resources: Collection[str]) -> dict[Key, frozenset[Holder]]:
    """Holders of each physical device (a replica counts as its device) of the served `resources`.

    Other resources do not count.
    """
    found: dict[Key, set[Holder]] = {}
    for namespace, pod, container, resource_name, device_ids in assignments:
        if resource_name not in resources:
            continue
        holder = Holder(namespace, pod, container)
        for device_id in device_ids:
            found.setdefault((resource_name, base_id(device_id)), set()).add(holder)
    return {key: frozenset(held) for key, held in found.items() if held}


def diff(old: Holders, new: Holders) -> list[Change]:
    """What changed between two views, in a stable order.

    Per device, a holder that left and one that came are paired as "changed_hands" (sorted, so
    the pairing is deterministic with shared devices); the rest are "in_use" or "released".
    """
    changes: list[Change] = []
    for resource_name, device_id in sorted(set(old) | set(new)):
        before = old.get((resource_name, device_id), frozenset())
        after = new.get((resource_name, device_id), frozenset())
        gone, came = sorted(before - after), sorted(after - before)
        paired = min(len(gone), len(came))
        for previous, holder in zip(gone[:paired], came[:paired], strict=True):
            changes.append(Change("changed_hands", resource_name, device_id, holder, previous))
        changes += [Change("in_use", resource_name, device_id, h) for h in came[paired:]]
        changes += [Change("released", resource_name, device_id, h) for h in gone[paired:]]
    return changes


def in_use_counts(view: Holders, resources: Iterable[str]) -> dict[str, int]:
    """Physical devices held by at least one container, per served resource (0 when none)."""
    counts = dict.fromkeys(resources, 0)
    for resource_name, _ in view:
        if resource_name in counts:
            counts[resource_name] += 1
    return counts


def rows(view: Holders) -> list[dict[str, str]]:
    """The view as sorted rows: one per (device, holder), as the state file and `colad status` show it."""
    return [
        {
            "resource": resource_name,
            "device_id": device_id,
            "namespace": h.namespace,
            "pod": h.pod,
            "container": h.container,
        }
        for (resource_name, device_id), held in sorted(view.items())
        for h in sorted(held)
    ]


def in_use_of(view: Holders, resources: Iterable[str]) -> InUse:
    """The view of the served `resources` as an up InUse snapshot."""
    counts = tuple(sorted(in_use_counts(view, resources).items()))
    holders = tuple((r["resource"], r["device_id"], r["namespace"], r["pod"], r["container"]) for r in rows(view))
    return InUse(True, counts, holders)


def state(view: Holders, *, available: bool, reason: str, updated: float) -> dict[str, Any]:
    """The content of the state file."""
    return {"updated": updated, "available": available, "reason": reason, "holders": rows(view)}


def parse_rows(raw: object) -> list[dict[str, str]]:
    """Rows read back from a state file, keeping only well-formed ones (the file may be from any version)."""
    if not isinstance(raw, list):
        return []
    keys = ("resource", "device_id", "namespace", "pod", "container")
    return [
        {k: row[k] for k in keys}
        for row in raw
        if isinstance(row, dict) and all(isinstance(row.get(k), str) for k in keys)
    ]
