"""One device's entry in the queue's messages: its JSON form, exact size, hash and the set digest.

messages.py defines the messages and their envelope; this module is the one that knows how a
device is written in them (a bare device is the compact [id, health] pair, any other an object of
the fields that differ from their defaults) and checks every entry a peer sends. messages.py
imports it on the first device it encodes or decodes: a KubeletState's sender never loads it.
"""

from __future__ import annotations

from collections.abc import Iterable

try:
    # hashlib's blake2b is this builtin (hashlib never takes OpenSSL's blake2); importing hashlib would
    # load _hashlib and libcrypto into discovery and kubelet-watch: 0.75-1 MiB PSS each.
    from _blake2 import blake2b
except ImportError:  # an interpreter without the builtin module: the same function through hashlib
    from hashlib import blake2b

from colad.core.constants import HEALTHY, MAX_DEVICE_LIST_ENTRIES, MAX_DEVICE_MAP_ENTRIES, UNHEALTHY
from colad.core.device_rules import MAX_COMMAND_ARGS, show
from colad.core.devices import (
    HEALTH_VALUES,
    MAX_REASON_BYTES,
    Device,
    DeviceNode,
    DeviceSet,
    Mount,
    device_problem,
    id_problem,
)
from colad.core.errors import MessageError
from colad.queue.wire_json import dumps

TYPE_CHECKING = False  # typing is not loaded at run time: docs/DEVELOPING.md, "Import cost"
if TYPE_CHECKING:
    from typing import Any

__all__ = [
    "DIGEST_MOD",
    "DeviceSet",
    "device_entry",
    "device_from_wire",
    "device_hash",
    "device_to_wire",
    "device_wire_size",
    "devices_from_wire",
    "id_problem",
    "moved_digest",
    "set_digest",
]
DIGEST_MOD = 1 << 64  # set_digest() is a sum of 64-bit device hashes


_WIRE_KEYS = frozenset(
    (
        "id",
        "health",
        "numa_nodes",
        "device_nodes",
        "mounts",
        "envs",
        "annotations",
        "cdi_devices",
        "problem",
        "reason",
        "prepare",
    )
)


def device_to_wire(device: Device) -> list[str] | dict[str, Any]:
    """The JSON-ready form of `device`.

    A bare device stays the compact [id, health] pair the queue always carried,
    so bare snapshots do not grow; any other device is a dict holding "id" and
    only the fields that differ from their defaults.
    """
    if device.bare:
        return [device.device_id, device.health]
    wire: dict[str, Any] = {"id": device.device_id}
    if device.health != HEALTHY:
        wire["health"] = device.health
    if device.numa_nodes:
        wire["numa_nodes"] = list(device.numa_nodes)
    if device.device_nodes:
        wire["device_nodes"] = [[n.host_path, n.container_path, n.permissions] for n in device.device_nodes]
    if device.mounts:
        wire["mounts"] = [[m.host_path, m.container_path, m.read_only] for m in device.mounts]
    if device.envs:
        wire["envs"] = dict(device.envs)
    if device.annotations:
        wire["annotations"] = dict(device.annotations)
    if device.cdi_devices:
        wire["cdi_devices"] = list(device.cdi_devices)
    if device.problem:
        wire["problem"] = device.problem
    if device.reason:
        wire["reason"] = device.reason
    if device.prepare is not None:  # [] is "none for this device"; absent is "the resource's"
        wire["prepare"] = list(device.prepare)
    return wire


def _wire_list(obj: dict[str, Any], key: str) -> list[Any]:
    value = obj.get(key, [])
    if not isinstance(value, list):
        raise ValueError(f"{key} is not a list")
    if len(value) > MAX_DEVICE_LIST_ENTRIES:
        raise ValueError(f"{key} has more than {MAX_DEVICE_LIST_ENTRIES} entries")
    return value


def _wire_triple(item: object, key: str, third: type) -> tuple[str, str, Any]:
    if not (
        isinstance(item, list)
        and len(item) == 3
        and isinstance(item[0], str)
        and isinstance(item[1], str)
        and type(item[2]) is third
    ):
        raise ValueError(f"{key} entry is not [host_path, container_path, {third.__name__}]")
    return item[0], item[1], item[2]


def _wire_pairs(obj: dict[str, Any], key: str) -> tuple[tuple[str, str], ...]:
    value = obj.get(key, {})
    if not isinstance(value, dict) or len(value) > MAX_DEVICE_MAP_ENTRIES:
        raise ValueError(f"{key} is not an object of at most {MAX_DEVICE_MAP_ENTRIES} entries")
    if not all(isinstance(v, str) for v in value.values()):
        raise ValueError(f"{key} has a value that is not a string")
    return tuple(sorted(value.items()))


def device_from_wire(obj: object) -> Device:
    """The device `obj` (from device_to_wire, through JSON) describes; ValueError names any defect.

    Physical devices only: the ID must pass id_problem, so replica IDs are refused.
    """
    if isinstance(obj, list):
        if not (len(obj) == 2 and all(isinstance(x, str) for x in obj)):
            raise ValueError("device entry is not [id, health] or an object")
        # The bare pair is most of a large snapshot: an ID and a health are all there is to check.
        if obj[1] in HEALTH_VALUES and id_problem(obj[0]) is None:
            # The constant, not the decoded string: JSON makes a new 56-byte str per entry.
            return Device(obj[0], HEALTHY if obj[1] == HEALTHY else UNHEALTHY)
        obj = {"id": obj[0], "health": obj[1]}  # a defect: the general path names it
    if not isinstance(obj, dict):
        raise ValueError("device entry is not [id, health] or an object")
    unknown = obj.keys() - _WIRE_KEYS
    if unknown:
        raise ValueError(f"unknown device keys {show(sorted(map(str, unknown)))}")
    device_id, health, problem = obj.get("id"), obj.get("health", HEALTHY), obj.get("problem", "")
    reason = obj.get("reason", "")
    if not isinstance(device_id, str) or id_problem(device_id) is not None:
        raise ValueError(f"invalid device ID {show(device_id)}")
    if not isinstance(health, str) or not isinstance(problem, str) or not isinstance(reason, str):
        raise ValueError(f"device {device_id!r}: health, problem or reason is not a string")
    if len(reason) > MAX_REASON_BYTES:
        # Before any encoding: a peer cannot make us measure a huge string twice.
        raise ValueError(f"device {device_id!r}: reason is longer than {MAX_REASON_BYTES} bytes")
    numa = _wire_list(obj, "numa_nodes")
    if not all(type(n) is int for n in numa):
        raise ValueError(f"device {device_id!r}: numa_nodes is not a list of integers")
    cdi = _wire_list(obj, "cdi_devices")
    if not all(isinstance(n, str) for n in cdi):
        raise ValueError(f"device {device_id!r}: cdi_devices is not a list of strings")
    prepare = obj.get("prepare")
    if prepare is not None:
        if not isinstance(prepare, list) or len(prepare) > MAX_COMMAND_ARGS:
            raise ValueError(f"device {device_id!r}: prepare is not a list of at most {MAX_COMMAND_ARGS} arguments")
        if not all(isinstance(a, str) for a in prepare):
            raise ValueError(f"device {device_id!r}: prepare is not a list of strings")
        prepare = tuple(prepare)  # device_problem applies device_rules.command_problem
    nodes = "device_nodes"
    device = Device(
        device_id,
        health,
        numa_nodes=tuple(numa),
        device_nodes=tuple(DeviceNode(*_wire_triple(i, "device_nodes", str)) for i in _wire_list(obj, nodes)),
        mounts=tuple(Mount(*_wire_triple(i, "mounts", bool)) for i in _wire_list(obj, "mounts")),
        envs=_wire_pairs(obj, "envs"),
        annotations=_wire_pairs(obj, "annotations"),
        cdi_devices=tuple(cdi),
        problem=problem,
        reason=reason,
        prepare=prepare,
    )
    problem = device_problem(device)
    if problem is not None:
        raise ValueError(f"device {device_id!r}: {problem}")
    return device


def device_entry(device: Device) -> bytes:
    """The exact bytes `device` takes in an encoded list (without the separating comma)."""
    if device.bare:
        # ["<id>","<health>"]: IDs (id_problem) and health values need no JSON escapes.
        return b'["%s","%s"]' % (device.device_id.encode("ascii"), device.health.encode("ascii"))
    return dumps(device_to_wire(device))


def device_wire_size(device: Device) -> int:
    """Exact bytes `device` takes in an encoded DeviceSnapshot's list (without the separating comma)."""
    return len(device_entry(device))


def device_hash(device: Device) -> int:
    """A 64-bit hash of the device's wire entry: the same in every process (str hash() is not)."""
    return int.from_bytes(blake2b(device_entry(device), digest_size=8).digest(), "big")


def set_digest(devices_: Iterable[Device]) -> int:
    """The digest of a set: the sum of its devices' hashes mod 2**64, so a change updates it in O(change)."""
    return sum(device_hash(d) for d in devices_) % DIGEST_MOD


def moved_digest(digest: int, gone: Iterable[Device], came: Iterable[Device]) -> int:
    """`digest` after the devices `gone` left the set and the devices `came` joined it."""
    return (digest - sum(device_hash(d) for d in gone) + sum(device_hash(d) for d in came)) % DIGEST_MOD


def devices_from_wire(items: list[Any], *, consume: bool = False) -> tuple[Device, ...]:
    """The devices of a wire list, sorted by ID; MessageError names the first bad entry or a duplicate.

    `consume` frees each entry of `items` once its Device is made (the list is left holding None):
    a decoded snapshot's entries and its Devices are then never all alive at once.
    """
    found = []
    for index, item in enumerate(items):
        if consume:
            items[index] = None
        try:
            found.append(device_from_wire(item))
        except ValueError as exc:
            raise MessageError(f"invalid device entry: {exc}") from None
    found.sort(key=lambda d: d.device_id)
    if any(a.device_id == b.device_id for a, b in zip(found, found[1:], strict=False)):
        raise MessageError("duplicate device IDs")
    return tuple(found)
