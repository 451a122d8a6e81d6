"""This node's ResourceSlices: the pools the device model asks for, and the plan that makes the API server hold them.

The one owner of a ResourceSlice's shape (resource.k8s.io/v1): pool() turns a resource's device set into a
pool of slice devices, read_slice() reads what the API server holds, plan() says which slices to delete,
update and create, touching only those that differ. colad/kube/ carries the plan out. Pure: no I/O.
"""

from __future__ import annotations

import re
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass

from colad.core.devices import REPLICA_SEPARATOR, DeviceSet
from colad.core.namemap import dra_device_name
from colad.core.names import is_dns1123_label

TYPE_CHECKING = False  # typing is not loaded at run time: docs/DEVELOPING.md, "Import cost"
if TYPE_CHECKING:
    from typing import Any, Final

API_VERSION: Final = "resource.k8s.io/v1"
KIND: Final = "ResourceSlice"
# k8s.io/api resource/v1 types.go: ResourceSliceMaxDevices (64 once a device has taints, counters or
# list attributes; colad's devices have none of those).
MAX_DEVICES_PER_SLICE: Final = 128
# resource/v1 types.go: DeviceAttributeMaxValueLength, ResourceSliceMaxAttributesAndCapacitiesPerDevice.
MAX_ATTRIBUTE_STRING: Final = 64
# A device's attributes. Names without a domain belong to the driver's domain (types.go, QualifiedName).
FILE_ATTRIBUTE: Final = "file"  # the device file's name, always (a replica's is its device's)
REPLICA_ATTRIBUTE: Final = "replica"  # a shared device's replica number, on replicas only
RESOURCE_ATTRIBUTE: Final = "resource"  # the extended resource the device belongs to, for a DeviceClass selector
NUMA_ATTRIBUTE: Final = "resource.kubernetes.io/numaNode"  # the standard name, compared across drivers
# The slice's index leads its name, so that the API server's generateName truncation (to 58 characters)
# never cuts it, as the Go ResourceSlice controller names its slices (resourceslicecontroller.go).
_INDEX_PREFIX = re.compile(r"([0-9a-f]{5,})-")
_GENERATE_NAME_MAX = 58  # apiserver names.SimpleNameGenerator: 63 minus the 5 random characters
# A generated device name's hash: 8 hex digits, longer only when that name is already taken.
_HASH_LENGTHS = (8, 12, 16, 32)


def device_names(device_ids: Iterable[str]) -> dict[str, str]:
    """Each ID's device name: the ID itself when it is a DNS label, else a generated, stable one.

    Names are unique over the set: an ID that is a DNS label always keeps its name, and a generated
    name that meets a taken one takes a longer hash. A name depends only on its ID (and on a clash,
    which needs two equal hash prefixes), so it stays the same across rescans.
    """
    ids = sorted(set(device_ids))
    names = {i: i for i in ids if is_dns1123_label(i)}
    taken = set(names.values())
    for device_id in ids:
        if device_id in names:
            continue
        for length in _HASH_LENGTHS:
            name = dra_device_name(device_id, length)
            if name not in taken:
                break
        else:  # a clash of 32 hex digits of sha256: not reachable in practice, still never a duplicate
            name = dra_device_name(device_id + "\x00", _HASH_LENGTHS[-1])
        names[device_id] = name
        taken.add(name)
    return names


def published_names(devices: DeviceSet) -> dict[str, str]:
    """The device name of each ID a pool of `devices` lists (its Healthy devices), as pool() names them:
    a prepared claim's device names are read back through this same map."""
    return device_names(d.device_id for d in devices if d.healthy)


def reported_names(devices: DeviceSet) -> dict[str, str]:
    """The device name of every ID in `devices`, as the DRA health stream reports them: a Healthy device
    under its published name (published_names), an Unhealthy one under the name it had when published
    with the Healthy ones (its ID when that is a DNS label, else the shortest free generated name), so a
    claim allocated while it was Healthy still names it."""
    names = published_names(devices)
    taken = set(names.values())
    for device in devices:
        if device.healthy:
            continue
        name = ""
        for length in _HASH_LENGTHS:
            name = dra_device_name(device.device_id, length)
            if name not in taken or name == device.device_id:
                break
        else:
            name = dra_device_name(device.device_id + "\x00", _HASH_LENGTHS[-1])
        names[device.device_id] = name
        taken.add(name)
    return names


def pool_names(node_name: str, resource_names: Sequence[str]) -> dict[str, str]:
    """Each resource's pool: the node's name (the upstream convention for node-local devices) for a
    single resource; with several, "<node>/<label>", the label made from the resource name as a device
    name is made from its ID (pool names are DNS subdomains joined by '/', types.go ResourcePool)."""
    if len(resource_names) == 1:
        return {resource_names[0]: node_name}
    labels = device_names(resource_names)
    return {name: f"{node_name}/{labels[name]}" for name in resource_names}


@dataclass(frozen=True, order=True)
class SliceDevice:
    """One device as a ResourceSlice lists it: a name and attributes (name, kind, value), sorted by name.

    `foreign` marks a device read from the API server with fields colad never sets (it is rewritten).
    """

    name: str
    attributes: tuple[tuple[str, str, int | str], ...] = ()
    foreign: bool = False

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "attributes": {key: {kind: value} for key, kind, value in self.attributes}}


@dataclass(frozen=True)
class Pool:
    """One resource's devices on this node, as slices list them (sorted by name)."""

    name: str
    devices: tuple[SliceDevice, ...]


def pool(name: str, resource_name: str, devices: DeviceSet) -> Pool:
    """The pool `name` of a resource's device set: its Healthy devices only.

    An Unhealthy device is left out rather than tainted: a device taint is feature-gated before 1.37
    (an API server without the gate drops the field, so a tainted device would be published as
    allocatable), and a taint halves a slice's limit to 64 devices. Left out, it cannot be allocated
    on any cluster; pods already running with it are not touched (only a NoExecute taint would evict).
    """
    healthy = [d for d in devices if d.healthy]
    names = published_names(devices)
    listed = []
    for device in healthy:
        file_name, replica, number = device.device_id.partition(REPLICA_SEPARATOR)
        attributes: list[tuple[str, str, int | str]] = [(FILE_ATTRIBUTE, "string", file_name)]
        if replica:
            attributes.append((REPLICA_ATTRIBUTE, "int", int(number)))
        if len(resource_name) <= MAX_ATTRIBUTE_STRING:
            attributes.append((RESOURCE_ATTRIBUTE, "string", resource_name))
        if len(device.numa_nodes) == 1:  # a device on several NUMA nodes has no one node to match
            attributes.append((NUMA_ATTRIBUTE, "int", device.numa_nodes[0]))
        listed.append(SliceDevice(names[device.device_id], tuple(sorted(attributes))))
    return Pool(name, tuple(sorted(listed)))


@dataclass(frozen=True)
class DesiredSlice:
    """One slice as it must be: its pool, its index in the pool, the pool's generation and slice count."""

    pool: str
    index: int
    generation: int
    count: int
    devices: tuple[SliceDevice, ...]

    def spec(self, driver: str, node_name: str) -> dict[str, Any]:
        return {
            "driver": driver,
            "nodeName": node_name,
            "pool": {"name": self.pool, "generation": self.generation, "resourceSliceCount": self.count},
            "devices": [d.to_json() for d in self.devices],
        }


@dataclass(frozen=True)
class ExistingSlice:
    """A slice the API server holds, as read_slice() reads it; index is None when its name carries none."""

    name: str
    uid: str
    resource_version: str
    driver: str
    node_name: str
    pool: str
    generation: int
    count: int
    index: int | None
    devices: tuple[SliceDevice, ...]


def _read_device(raw: object) -> SliceDevice:
    if not isinstance(raw, dict):
        return SliceDevice("", foreign=True)
    attributes: list[tuple[str, str, int | str]] = []
    foreign = set(raw) - {"name", "attributes"} != set()
    raw_attributes = raw.get("attributes") or {}
    if not isinstance(raw_attributes, dict):
        raw_attributes, foreign = {}, True
    for key, value in raw_attributes.items():
        if isinstance(value, dict) and len(value) == 1:
            ((kind, item),) = value.items()
            if kind in ("string", "int") and isinstance(item, int | str):
                attributes.append((str(key), kind, item))
                continue
        foreign = True
    name = raw.get("name")
    return SliceDevice(name if isinstance(name, str) else "", tuple(sorted(attributes)), foreign)


def read_slice(obj: Mapping[str, Any]) -> ExistingSlice:
    """A ResourceSlice object as the API server returns it (missing fields read as empty)."""
    metadata = obj.get("metadata") or {}
    spec = obj.get("spec") or {}
    pool_spec = spec.get("pool") or {}
    name = str(metadata.get("name") or "")
    match = _INDEX_PREFIX.match(name)
    devices = spec.get("devices") or []
    return ExistingSlice(
        name=name,
        uid=str(metadata.get("uid") or ""),
        resource_version=str(metadata.get("resourceVersion") or ""),
        driver=str(spec.get("driver") or ""),
        node_name=str(spec.get("nodeName") or ""),
        pool=str(pool_spec.get("name") or ""),
        generation=int(pool_spec.get("generation") or 0),
        count=int(pool_spec.get("resourceSliceCount") or 0),
        index=int(match.group(1), 16) if match else None,
        devices=tuple(_read_device(d) for d in devices) if isinstance(devices, list) else (SliceDevice("", (), True),),
    )


def generate_name(index: int, driver: str, node_name: str) -> str:
    """metadata.generateName of a pool's slice `index`: the index first, cut to what the server keeps."""
    return f"{index:05x}-{driver}-{node_name}"[: _GENERATE_NAME_MAX - 1].rstrip("-.") + "-"


def slice_object(
    desired: DesiredSlice, driver: str, node_name: str, node_uid: str, existing: ExistingSlice | None = None
) -> dict[str, Any]:
    """The whole ResourceSlice to create (existing None) or to update `existing` with.

    Owned by the Node (controller), as the Go helper does, so that the slices go with the node.
    """
    metadata: dict[str, Any]
    if existing is None:
        metadata = {"generateName": generate_name(desired.index, driver, node_name)}
    else:
        metadata = {"name": existing.name, "resourceVersion": existing.resource_version}
    if node_uid:
        metadata["ownerReferences"] = [
            {"apiVersion": "v1", "kind": "Node", "name": node_name, "uid": node_uid, "controller": True}
        ]
    return {"apiVersion": API_VERSION, "kind": KIND, "metadata": metadata, "spec": desired.spec(driver, node_name)}


@dataclass(frozen=True)
class SlicePlan:
    """What to do, in this order: delete, then update, then create. Empty when the slices are exact."""

    delete: tuple[ExistingSlice, ...] = ()
    update: tuple[tuple[ExistingSlice, DesiredSlice], ...] = ()
    create: tuple[DesiredSlice, ...] = ()

    def __bool__(self) -> bool:
        return bool(self.delete or self.update or self.create)


def _layout(devices: Sequence[SliceDevice], held: Mapping[int, Sequence[str]]) -> dict[int, list[SliceDevice]]:
    """Devices per slice index: each stays in the slice that holds it, new ones fill slices with room
    (lowest index first), then new slices. A pool keeps at least one slice, even empty."""
    wanted = {d.name: d for d in devices}
    slots: dict[int, list[SliceDevice]] = {}
    placed: set[str] = set()
    for index in sorted(held):
        slots[index] = []
        for name in held[index]:
            if name in wanted and name not in placed and len(slots[index]) < MAX_DEVICES_PER_SLICE:
                slots[index].append(wanted[name])
                placed.add(name)
    waiting = [d for d in devices if d.name not in placed]
    for index in sorted(slots):
        room = MAX_DEVICES_PER_SLICE - len(slots[index])
        slots[index].extend(waiting[:room])
        waiting = waiting[room:]
    index = 0
    while waiting:
        while index in slots:
            index += 1
        slots[index], waiting = waiting[:MAX_DEVICES_PER_SLICE], waiting[MAX_DEVICES_PER_SLICE:]
    kept = {i: sorted(ds) for i, ds in slots.items() if ds}
    if not kept:
        kept = {min(slots, default=0): []}
    return kept


def plan(
    driver: str,
    node_name: str,
    pools: Sequence[Pool],
    existing: Iterable[ExistingSlice],
    unknown: Collection[str] = (),
) -> SlicePlan:
    """The changes that turn `existing` (this node's slices of this driver) into `pools`.

    `unknown` names pools whose devices are not known yet (no device set heard since a start): their
    slices are left exactly as held, neither emptied nor deleted. A known pool with no devices is not
    unknown: it is published empty.

    Only slices whose content differs are written. The pool's generation goes up when its set of slices
    changes (a slice created or deleted): every slice then carries the new generation and count, so a
    consumer sees either the old pool or, once it is complete, the new one. Devices never move between
    slices, so an update of a few slices needs no new generation. Slices of another driver or node,
    of a pool no longer wanted, without an index, or repeating one, are deleted.
    """
    ours = sorted(
        (s for s in existing if s.driver == driver and s.node_name == node_name and s.pool not in unknown),
        key=lambda s: s.name,
    )
    by_pool: dict[str, dict[int, ExistingSlice]] = {}
    obsolete: dict[str, list[ExistingSlice]] = {}
    wanted_pools = {p.name for p in pools}
    for held in ours:
        slots = by_pool.setdefault(held.pool, {})
        if held.pool not in wanted_pools or held.index is None or held.index in slots:
            obsolete.setdefault(held.pool, []).append(held)
        else:
            slots[held.index] = held
    delete = [s for name in sorted(obsolete.keys() - wanted_pools) for s in obsolete[name]]
    update: list[tuple[ExistingSlice, DesiredSlice]] = []
    create: list[DesiredSlice] = []
    for wanted in pools:
        slots = by_pool.get(wanted.name, {})
        layout = _layout(wanted.devices, {i: [d.name for d in s.devices] for i, s in slots.items()})
        gone = obsolete.get(wanted.name, []) + [s for i, s in slots.items() if i not in layout]
        changed_set = bool(gone) or any(i not in slots for i in layout)
        generation = max((s.generation for s in [*slots.values(), *gone]), default=0)
        if (slots or gone) and (changed_set or any(s.count != len(layout) for s in slots.values())):
            generation += 1
        delete.extend(sorted(gone, key=lambda s: s.name))
        for index in sorted(layout):
            desired = DesiredSlice(wanted.name, index, generation, len(layout), tuple(layout[index]))
            held_slice = slots.get(index)
            if held_slice is None:
                create.append(desired)
            elif (held_slice.generation, held_slice.count, held_slice.devices) != (
                desired.generation,
                desired.count,
                desired.devices,
            ):
                update.append((held_slice, desired))
    return SlicePlan(tuple(delete), tuple(update), tuple(create))
