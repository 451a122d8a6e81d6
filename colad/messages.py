"""The local queue's messages, and the only module that knows their wire format.

A resource's devices travel as a full DeviceSnapshot on every (re)connect and as DeviceDeltas
against the previous (epoch, seq) in between, each with a digest of the whole set (snapshots.py
rebuilds the exact sets). ASCII JSON with a type and a version field and a hard size limit, which
the *_size() functions let a sender meet exactly before it sends; nothing is unpickled.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from colad.config import resource_name_problem
from colad.constants import (
    HEALTHY,
    KUBELET_MAX_RECV_MESSAGE_BYTES,
    MAX_DEVICE_LIST_ENTRIES,
    MAX_DEVICE_MAP_ENTRIES,
)
from colad.device_rules import MAX_COMMAND_ARGS
from colad.errors import MessageError

if TYPE_CHECKING:  # at run time bound by _load_model(), on the first device a process encodes or decodes
    from hashlib import blake2b

    from colad import devices
    from colad.devices import Device, DeviceSet

WIRE_VERSION = 1
# The queue must carry any list the kubelet can take (#14). What the kubelet sees of a device is
# its ID, health and NUMA nodes, and such a device's JSON entry is at most 2.45 times its
# ListAndWatch protobuf entry (the worst: a 1-character Unhealthy ID on NUMA node 0, 49 bytes
# against 20; a bare 1-character ID 16 against 14; tests/unit/test_wire_frames.py measures them).
# So 3x the kubelet's 4 MiB: 226,600 short IDs (the kubelet's most) are 4.4 MiB here. File content
# (paths, envs) beyond the frame is demoted by snapshots.fit_the_queue. A reader holds one frame.
JSON_PER_PROTOBUF = 3
MAX_MESSAGE_BYTES = JSON_PER_PROTOBUF * KUBELET_MAX_RECV_MESSAGE_BYTES  # 12 MiB
# Counter names: "rescans.inotify", "queue.sent" ... a bounded, label-safe alphabet.
_COUNTER_NAME = re.compile(r"[a-z][a-z_]{0,31}(\.[a-z][a-z_]{0,31})?\Z")
_DIGEST = re.compile(r"[0-9a-f]{16}\Z")
DIGEST_MOD = 1 << 64  # set_digest() is a sum of 64-bit device hashes
_model_loaded = False


def _load_model() -> None:
    """Bind the device model and hashlib: kubelet-watch only encodes a KubeletState and never pays for them."""
    global devices, Device, DeviceSet, blake2b, _model_loaded  # noqa: PLW0603 - a lazy import, bound once
    from hashlib import blake2b

    from colad import devices
    from colad.devices import Device, DeviceSet

    _model_loaded = True


@dataclass(frozen=True)
class DeviceSnapshot:
    """Discovery -> plugin: every device now in one resource's device directory, with its file's content."""

    epoch: int
    seq: int
    devices: DeviceSet
    dir_present: bool = True
    resource: str = "myway5.com/cola"
    type: str = field(default="device_snapshot", init=False)

    @property
    def key(self) -> str:
        """Each resource's snapshots are a stream of their own."""
        return snapshot_key(self.resource)


@dataclass(frozen=True)
class DeviceDelta:
    """Discovery -> plugin: how one resource's set moved from (epoch, `base`) to (epoch, `seq`).

    `upserts` are the devices added or changed, `removes` the IDs gone;
    `digest` is set_digest() of the whole set after the change, so a receiver
    that applied it to anything but the exact base set notices and resyncs.
    """

    epoch: int
    seq: int
    base: int
    upserts: tuple[Device, ...] = ()
    removes: tuple[str, ...] = ()
    digest: int = 0
    dir_present: bool = True
    resource: str = "myway5.com/cola"
    type: str = field(default="device_delta", init=False)

    @property
    def key(self) -> str:
        """A resource's deltas and snapshots are one stream."""
        return snapshot_key(self.resource)


def snapshot_key(resource: str) -> str:
    """The stream key of a resource's DeviceSnapshots."""
    return f"device_snapshot:{resource}"


@dataclass(frozen=True)
class KubeletState:
    """Kubelet watcher -> plugin: the kubelet directory changed; look at it again.

    No payload beyond the envelope: the plugin stats the directory itself before acting.
    An older watcher's kubelet_socket and plugin_sockets fields decode and are ignored.
    """

    epoch: int
    seq: int
    type: str = field(default="kubelet_state", init=False)

    @property
    def key(self) -> str:
        return self.type


@dataclass(frozen=True)
class Stats:
    """Discovery or watcher -> plugin: the sender's counters since it started, for /metrics.

    Cumulative, so a lost message costs nothing; a restarted sender starts from
    zero again, which Prometheus reads as a counter reset.
    """

    epoch: int
    seq: int
    role: str
    counters: tuple[tuple[str, int], ...] = ()
    type: str = field(default="stats", init=False)

    @property
    def key(self) -> str:
        """Each sender's stats are a stream of their own."""
        return f"{self.type}:{self.role}"


ROLES = ("discovery", "kubelet-watch")
MAX_COUNTERS = 64

Message = DeviceSnapshot | DeviceDelta | KubeletState | Stats


def _dumps(body: object) -> bytes:
    # ASCII on the wire (tests/unit/test_messages.py): any str encodes, a surrogate-escaped name too,
    # at the price of 6 bytes per non-ASCII character, which snapshot_size() counts exactly.
    return json.dumps(body, separators=(",", ":"), ensure_ascii=True).encode("ascii")


# --- one device on the wire ----------------------------------------------------------------


def _show(value: object, limit: int = 60) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


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
    if not _model_loaded:
        _load_model()
    return _from_wire(obj)


def _from_wire(obj: object) -> Device:
    if isinstance(obj, list):
        if not (len(obj) == 2 and all(isinstance(x, str) for x in obj)):
            raise ValueError("device entry is not [id, health] or an object")
        # The bare pair is most of a large snapshot: an ID and a health are all there is to check.
        if obj[1] in devices.HEALTH_VALUES and devices.id_problem(obj[0]) is None:
            return Device(obj[0], obj[1])
        obj = {"id": obj[0], "health": obj[1]}  # a defect: the general path names it
    if not isinstance(obj, dict):
        raise ValueError("device entry is not [id, health] or an object")
    unknown = obj.keys() - _WIRE_KEYS
    if unknown:
        raise ValueError(f"unknown device keys {_show(sorted(map(str, unknown)))}")
    device_id, health, problem = obj.get("id"), obj.get("health", HEALTHY), obj.get("problem", "")
    reason = obj.get("reason", "")
    if not isinstance(device_id, str) or devices.id_problem(device_id) is not None:
        raise ValueError(f"invalid device ID {_show(device_id)}")
    if not isinstance(health, str) or not isinstance(problem, str) or not isinstance(reason, str):
        raise ValueError(f"device {device_id!r}: health, problem or reason is not a string")
    if len(reason) > devices.MAX_REASON_BYTES:
        # Before any encoding: a peer cannot make us measure a huge string twice.
        raise ValueError(f"device {device_id!r}: reason is longer than {devices.MAX_REASON_BYTES} bytes")
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
        device_nodes=tuple(devices.DeviceNode(*_wire_triple(i, "device_nodes", str)) for i in _wire_list(obj, nodes)),
        mounts=tuple(devices.Mount(*_wire_triple(i, "mounts", bool)) for i in _wire_list(obj, "mounts")),
        envs=_wire_pairs(obj, "envs"),
        annotations=_wire_pairs(obj, "annotations"),
        cdi_devices=tuple(cdi),
        problem=problem,
        reason=reason,
        prepare=prepare,
    )
    problem = devices.device_problem(device)
    if problem is not None:
        raise ValueError(f"device {device_id!r}: {problem}")
    return device


def device_entry(device: Device) -> bytes:
    """The exact bytes `device` takes in an encoded list (without the separating comma)."""
    if device.bare:
        # ["<id>","<health>"]: IDs (devices.id_problem) and health values need no JSON escapes.
        return b'["%s","%s"]' % (device.device_id.encode("ascii"), device.health.encode("ascii"))
    return _dumps(device_to_wire(device))


def device_wire_size(device: Device) -> int:
    """Exact bytes `device` takes in an encoded DeviceSnapshot's list (without the separating comma)."""
    return len(device_entry(device))


def device_hash(device: Device) -> int:
    """A 64-bit hash of the device's wire entry: the same in every process (str hash() is not)."""
    if not _model_loaded:
        _load_model()
    return _hash(device)


def _hash(device: Device) -> int:
    return int.from_bytes(blake2b(device_entry(device), digest_size=8).digest(), "big")


def set_digest(devices_: Iterable[Device]) -> int:
    """The digest of a set: the sum of its devices' hashes mod 2**64, so a change updates it in O(change)."""
    if not _model_loaded:
        _load_model()
    return sum(_hash(d) for d in devices_) % DIGEST_MOD


def moved_digest(digest: int, gone: Iterable[Device], came: Iterable[Device]) -> int:
    """`digest` after the devices `gone` left the set and the devices `came` joined it."""
    if not _model_loaded:
        _load_model()
    return (digest - sum(_hash(d) for d in gone) + sum(_hash(d) for d in came)) % DIGEST_MOD


# --- whole messages ------------------------------------------------------------------------


def _body(message: Message, devices: list[Any] | None = None) -> dict[str, Any]:
    body: dict[str, Any] = {"v": WIRE_VERSION, "type": message.type, "epoch": message.epoch, "seq": message.seq}
    if isinstance(message, DeviceSnapshot):
        body["resource"] = message.resource
        body["dir_present"] = message.dir_present
        body["devices"] = [device_to_wire(d) for d in message.devices] if devices is None else devices
    elif isinstance(message, DeviceDelta):
        body["base"] = message.base
        body["resource"] = message.resource
        body["dir_present"] = message.dir_present
        body["upsert"] = [device_to_wire(d) for d in message.upserts]
        body["remove"] = list(message.removes)
        body["digest"] = f"{message.digest:016x}"
    elif isinstance(message, Stats):
        body["role"] = message.role
        body["counters"] = dict(message.counters)
    return body


def encode(message: Message) -> bytes:
    """The message's wire bytes; MessageError if over MAX_MESSAGE_BYTES or not encodable."""
    data = _dumps(_body(message))
    if len(data) > MAX_MESSAGE_BYTES:
        raise MessageError(f"{message.type} is {len(data)} bytes, over the {MAX_MESSAGE_BYTES} byte limit")
    return data


def snapshot_size(snapshot: DeviceSnapshot, device_sizes: Sequence[int] | None = None) -> int:
    """Exact length of encode(snapshot), without its size check.

    `device_sizes` (device_wire_size of each device, in order) saves encoding the devices again.
    """
    sizes = [device_wire_size(d) for d in snapshot.devices] if device_sizes is None else device_sizes
    if len(sizes) != len(snapshot.devices):
        raise ValueError("one size per device")
    # The devices list is "[" + ",".join(entries) + "]"; the empty list's "[]" is already counted.
    return len(_dumps(_body(snapshot, []))) + sum(sizes) + max(len(sizes) - 1, 0)


def _need(body: dict[str, Any], key: str, kind: type | tuple[type, ...]) -> Any:
    value = body.get(key)
    # bool is an int in Python; never accept one for the other.
    if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
        raise MessageError(f"field {key!r} missing or not {getattr(kind, '__name__', kind)}")
    return value


def _need_resource(body: dict[str, Any]) -> str:
    resource: str = _need(body, "resource", str)
    if resource_name_problem(resource) is not None:
        raise MessageError(f"invalid resource name {resource!r}")
    return resource


def _devices(items: list[Any]) -> tuple[Device, ...]:
    """The devices of a wire list, sorted by ID; MessageError names the first bad entry or a duplicate."""
    found = []
    for item in items:
        try:
            found.append(_from_wire(item))
        except ValueError as exc:
            raise MessageError(f"invalid device entry: {exc}") from None
    found.sort(key=lambda d: d.device_id)
    if any(a.device_id == b.device_id for a, b in zip(found, found[1:], strict=False)):
        raise MessageError("duplicate device IDs")
    return tuple(found)


def decode(data: bytes | memoryview) -> Message:
    """Parse and validate one message (a view of the reader's buffer will do: no copy); MessageError if bad."""
    if len(data) > MAX_MESSAGE_BYTES:
        raise MessageError(f"message of {len(data)} bytes is over the {MAX_MESSAGE_BYTES} byte limit")
    try:
        body = json.loads(str(data, "utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:
        raise MessageError(f"not JSON: {exc}") from None
    if not isinstance(body, dict):
        raise MessageError("not a JSON object")
    if type(body.get("v")) is not int or body.get("v") != WIRE_VERSION:
        raise MessageError(f"unsupported version {body.get('v')!r}")
    kind = body.get("type")
    epoch, seq = _need(body, "epoch", int), _need(body, "seq", int)
    if epoch < 0 or seq < 0:
        raise MessageError("negative epoch or seq")
    if kind in ("device_snapshot", "device_delta") and not _model_loaded:
        _load_model()
    if kind == "device_snapshot":
        resource = _need_resource(body)
        found = _devices(_need(body, "devices", list))
        return DeviceSnapshot(epoch, seq, DeviceSet(found), _need(body, "dir_present", bool), resource)
    if kind == "device_delta":
        resource, base = _need_resource(body), _need(body, "base", int)
        if not 0 <= base < seq:
            raise MessageError("base is not before seq")
        upserts, removes = _devices(_need(body, "upsert", list)), _need(body, "remove", list)
        for device_id in removes:
            if not isinstance(device_id, str) or devices.id_problem(device_id) is not None:
                raise MessageError(f"invalid removed device ID {_show(device_id)}")
        if len(set(removes)) != len(removes) or not {d.device_id for d in upserts}.isdisjoint(removes):
            raise MessageError("a device ID removed twice, or both removed and upserted")
        digest = _need(body, "digest", str)
        if not _DIGEST.match(digest):
            raise MessageError("digest is not 16 lowercase hex digits")
        present = _need(body, "dir_present", bool)
        return DeviceDelta(epoch, seq, base, upserts, tuple(sorted(removes)), int(digest, 16), present, resource)
    if kind == "kubelet_state":
        # Fields beyond the envelope (an older watcher's socket names) are not read.
        return KubeletState(epoch, seq)
    if kind == "stats":
        role = _need(body, "role", str)
        if role not in ROLES:
            raise MessageError(f"unknown role {role!r}")
        counters = _need(body, "counters", dict)
        if len(counters) > MAX_COUNTERS:
            raise MessageError(f"more than {MAX_COUNTERS} counters")
        for name, value in counters.items():
            if not _COUNTER_NAME.match(name) or type(value) is not int or value < 0:
                raise MessageError(f"bad counter {name!r}")
        return Stats(epoch, seq, role, tuple(sorted(counters.items())))
    raise MessageError(f"unknown message type {kind!r}")
