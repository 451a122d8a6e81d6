"""The local queue's messages and their wire format (a device's entry in them: device_wire.py).

A resource's devices travel as a full DeviceSnapshot on every (re)connect and as DeviceDeltas
against the previous (epoch, seq) in between, each with a digest of the whole set (snapshots.py
rebuilds the exact sets). ASCII JSON with a type and a version field and a hard size limit, which
snapshot_size() lets a sender meet exactly before it sends; nothing is unpickled.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from itertools import islice

from colad.core.constants import KUBELET_MAX_RECV_MESSAGE_BYTES
from colad.core.device_rules import show
from colad.core.errors import MessageError
from colad.core.names import resource_name_problem
from colad.core.roles import QUEUE_PEERS
from colad.queue.wire_json import dumps

TYPE_CHECKING = False  # typing is not loaded at run time: docs/DEVELOPING.md, "Import cost"

if TYPE_CHECKING:  # the device model is imported where a device is encoded or decoded (device_wire.py)
    from typing import Any

    from colad.core.devices import Device, DeviceSet

WIRE_VERSION = 1
# The queue must carry any list the kubelet can take. What the kubelet sees of a device is
# its ID, health and NUMA nodes, and such a device's JSON entry is at most 2.45 times its
# ListAndWatch protobuf entry (the worst: a 1-character Unhealthy ID on NUMA node 0, 49 bytes
# against 20; a bare 1-character ID 16 against 14; tests/unit/queue/test_wire_limits.py measures them).
# So 3x the kubelet's 4 MiB: 226,600 short IDs (the kubelet's most) are 4.4 MiB here. File content
# (paths, envs) beyond the frame is demoted by snapshots.fit_the_queue. A reader holds one frame.
JSON_PER_PROTOBUF = 3
MAX_MESSAGE_BYTES = JSON_PER_PROTOBUF * KUBELET_MAX_RECV_MESSAGE_BYTES  # 12 MiB
# Counter names: "rescans.inotify", "queue.sent" ... a bounded, label-safe alphabet.
_COUNTER_NAME = re.compile(r"[a-z][a-z_]{0,31}(\.[a-z][a-z_]{0,31})?\Z")
_DIGEST = re.compile(r"[0-9a-f]{16}\Z")


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


MAX_COUNTERS = 64

Message = DeviceSnapshot | DeviceDelta | KubeletState | Stats


# --- whole messages ------------------------------------------------------------------------


def _body(message: Message, devices: list[Any] | None = None) -> dict[str, Any]:
    from colad.queue.device_wire import device_to_wire  # the device model: not for a KubeletState's sender

    body: dict[str, Any] = {"v": WIRE_VERSION, "type": message.type, "epoch": message.epoch, "seq": message.seq}
    if isinstance(message, DeviceSnapshot):
        body["resource"] = message.resource
        body["dir_present"] = message.dir_present
        body["devices"] = [device_to_wire(d) for d in message.devices] if devices is None else devices
    elif isinstance(message, DeviceDelta):
        body["base"] = message.base
        body["resource"] = message.resource
        body["dir_present"] = message.dir_present
        body["upsert"] = [device_to_wire(d) for d in message.upserts] if devices is None else devices
        body["remove"] = list(message.removes)
        body["digest"] = f"{message.digest:016x}"
    elif isinstance(message, Stats):
        body["role"] = message.role
        body["counters"] = dict(message.counters)
    return body


def _device_message_bytes(message: DeviceSnapshot | DeviceDelta) -> bytes:
    """dumps(_body(message)) byte for byte, its devices joined from their entries (as snapshot_size counts).

    json.dumps of the whole body would make a two-item list per device and the encoder's chunks: +2.5 MiB
    at 10,000 devices, most of it kept by Python's allocator afterwards. Here a few hundred entries
    live at a time and the frame grows in one buffer (malloc's, given back when freed).
    """
    from colad.queue.device_wire import device_entry

    body = _body(message, [])
    # The device list is a snapshot's last key, a delta's before "remove" and "digest": those follow it.
    rest = {key: body.pop(key) for key in ("remove", "digest") if key in body}
    buf = bytearray(dumps(body)[:-2])  # without the empty list's "]}"
    devices = iter(message.devices if isinstance(message, DeviceSnapshot) else message.upserts)
    separator = b""  # none before the first entry
    while chunk := b",".join(map(device_entry, islice(devices, 256))):  # an entry is never empty
        buf += separator
        buf += chunk
        separator = b","
    buf += b"]," + dumps(rest)[1:] if rest else b"]}"  # rest's object without its "{"
    return bytes(buf)


def encode(message: Message) -> bytes:
    """The message's wire bytes; MessageError if over MAX_MESSAGE_BYTES or not encodable."""
    if isinstance(message, (DeviceSnapshot, DeviceDelta)):
        data = _device_message_bytes(message)
    else:
        data = dumps(_body(message))
    if len(data) > MAX_MESSAGE_BYTES:
        raise MessageError(f"{message.type} is {len(data)} bytes, over the {MAX_MESSAGE_BYTES} byte limit")
    return data


def snapshot_size(snapshot: DeviceSnapshot, device_sizes: Sequence[int] | None = None) -> int:
    """Exact length of encode(snapshot), without its size check.

    `device_sizes` (device_wire_size of each device, in order) saves encoding the devices again.
    """
    from colad.queue.device_wire import device_wire_size

    sizes = [device_wire_size(d) for d in snapshot.devices] if device_sizes is None else device_sizes
    if len(sizes) != len(snapshot.devices):
        raise ValueError("one size per device")
    # The devices list is "[" + ",".join(entries) + "]"; the empty list's "[]" is already counted.
    return len(dumps(_body(snapshot, []))) + sum(sizes) + max(len(sizes) - 1, 0)


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
    if kind in ("device_snapshot", "device_delta"):
        return _decode_devices(body, kind == "device_snapshot", epoch, seq)
    if kind == "kubelet_state":
        # Fields beyond the envelope (an older watcher's socket names) are not read.
        return KubeletState(epoch, seq)
    if kind == "stats":
        role = _need(body, "role", str)
        if role not in QUEUE_PEERS:
            raise MessageError(f"unknown role {role!r}")
        counters = _need(body, "counters", dict)
        if len(counters) > MAX_COUNTERS:
            raise MessageError(f"more than {MAX_COUNTERS} counters")
        for name, value in counters.items():
            if not _COUNTER_NAME.match(name) or type(value) is not int or value < 0:
                raise MessageError(f"bad counter {name!r}")
        return Stats(epoch, seq, role, tuple(sorted(counters.items())))
    raise MessageError(f"unknown message type {kind!r}")


def _decode_devices(body: dict[str, Any], snapshot: bool, epoch: int, seq: int) -> DeviceSnapshot | DeviceDelta:
    """A DeviceSnapshot or DeviceDelta body: the device model is imported here, on the first one."""
    from colad.queue.device_wire import DeviceSet, devices_from_wire, id_problem

    resource = _need_resource(body)
    if snapshot:
        found = devices_from_wire(_need(body, "devices", list), consume=True)  # the body is ours alone
        return DeviceSnapshot(epoch, seq, DeviceSet(found), _need(body, "dir_present", bool), resource)
    base = _need(body, "base", int)
    if not 0 <= base < seq:
        raise MessageError("base is not before seq")
    upserts, removes = devices_from_wire(_need(body, "upsert", list), consume=True), _need(body, "remove", list)
    for device_id in removes:
        if not isinstance(device_id, str) or id_problem(device_id) is not None:
            raise MessageError(f"invalid removed device ID {show(device_id)}")
    if len(set(removes)) != len(removes) or not {d.device_id for d in upserts}.isdisjoint(removes):
        raise MessageError("a device ID removed twice, or both removed and upserted")
    digest = _need(body, "digest", str)
    if not _DIGEST.match(digest):
        raise MessageError("digest is not 16 lowercase hex digits")
    present = _need(body, "dir_present", bool)
    return DeviceDelta(epoch, seq, base, upserts, tuple(sorted(removes)), int(digest, 16), present, resource)
