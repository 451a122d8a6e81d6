"""The local queue's messages, and the only module that knows their wire format.

Every message is a full snapshot (never a delta) with the sender's epoch and a
per-sender increasing sequence number, so a lost, dropped, duplicated or
replayed message costs latency, never correctness. Encoding is ASCII JSON with
a type and a version field and a hard size limit, which snapshot_size() lets a
sender meet exactly before it sends; nothing is ever unpickled.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from colad.config import resource_name_problem
from colad.devices import Device, DeviceSet, device_from_wire, device_to_wire
from colad.errors import MessageError

WIRE_VERSION = 1
# A snapshot of 10,000 devices with 63-character IDs is about 0.8 MB of JSON;
# 4 MiB leaves room and still bounds what a peer can make us buffer.
MAX_MESSAGE_BYTES = 4 * 1024 * 1024
# Counter names: "rescans.inotify", "queue.sent" ... a bounded, label-safe alphabet.
_COUNTER_NAME = re.compile(r"[a-z][a-z_]{0,31}(\.[a-z][a-z_]{0,31})?\Z")


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


def snapshot_key(resource: str) -> str:
    """The stream key of a resource's DeviceSnapshots."""
    return f"device_snapshot:{resource}"


@dataclass(frozen=True)
class KubeletState:
    """Kubelet watcher -> plugin: what the kubelet directory looks like now.

    `kubelet_socket` identifies the current kubelet.sock ("dev:ino:ctime_ns"),
    or is empty when there is none; `plugin_sockets` are colad's sockets there.
    """

    epoch: int
    seq: int
    kubelet_socket: str
    plugin_sockets: tuple[str, ...] = ()
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

Message = DeviceSnapshot | KubeletState | Stats


def _dumps(body: object) -> bytes:
    # ASCII on the wire (tests/unit/test_messages.py): any str encodes, a surrogate-escaped name too,
    # at the price of 6 bytes per non-ASCII character, which snapshot_size() counts exactly.
    return json.dumps(body, separators=(",", ":"), ensure_ascii=True).encode("ascii")


def _body(message: Message, devices: list[Any] | None = None) -> dict[str, Any]:
    body: dict[str, Any] = {"v": WIRE_VERSION, "type": message.type, "epoch": message.epoch, "seq": message.seq}
    if isinstance(message, DeviceSnapshot):
        body["resource"] = message.resource
        body["dir_present"] = message.dir_present
        body["devices"] = [device_to_wire(d) for d in message.devices] if devices is None else devices
    elif isinstance(message, KubeletState):
        body["kubelet_socket"] = message.kubelet_socket
        body["plugin_sockets"] = list(message.plugin_sockets)
    else:
        body["role"] = message.role
        body["counters"] = dict(message.counters)
    return body


def encode(message: Message) -> bytes:
    """The message's wire bytes; MessageError if over MAX_MESSAGE_BYTES or not encodable."""
    data = _dumps(_body(message))
    if len(data) > MAX_MESSAGE_BYTES:
        raise MessageError(f"{message.type} is {len(data)} bytes, over the {MAX_MESSAGE_BYTES} byte limit")
    return data


def device_wire_size(device: Device) -> int:
    """Exact bytes `device` takes in an encoded DeviceSnapshot's list (without the separating comma)."""
    if device.bare:
        # ["<id>","<health>"]: IDs (devices.id_problem) and health values need no JSON escapes.
        return len(device.device_id) + len(device.health) + 7
    return len(_dumps(device_to_wire(device)))


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


def decode(data: bytes) -> Message:
    """Parse and validate one message; any defect raises MessageError."""
    if len(data) > MAX_MESSAGE_BYTES:
        raise MessageError(f"message of {len(data)} bytes is over the {MAX_MESSAGE_BYTES} byte limit")
    try:
        body = json.loads(data.decode("utf-8"))
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
    if kind == "device_snapshot":
        resource = _need(body, "resource", str)
        if resource_name_problem(resource) is not None:
            raise MessageError(f"invalid resource name {resource!r}")
        devices = []
        for item in _need(body, "devices", list):
            try:
                devices.append(device_from_wire(item))
            except ValueError as exc:
                raise MessageError(f"invalid device entry: {exc}") from None
        if len({d.device_id for d in devices}) != len(devices):
            raise MessageError("duplicate device IDs")
        return DeviceSnapshot(epoch, seq, DeviceSet.of(devices), _need(body, "dir_present", bool), resource)
    if kind == "kubelet_state":
        sockets = _need(body, "plugin_sockets", list)
        if not all(isinstance(s, str) for s in sockets):
            raise MessageError("plugin_sockets is not a list of strings")
        return KubeletState(epoch, seq, _need(body, "kubelet_socket", str), tuple(sockets))
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


class SequenceTracker:
    """Decides which messages are news: per stream (message `key`), (epoch, seq) must move forward.

    A sender's epoch is fixed at its start, so a restarted sender overtakes the
    old one. Each stream remembers which connection (`source`) delivered its
    last accepted message; when that connection closes, the receiver calls
    `forget`, so a restarted sender is accepted even if the clock stepped back
    between the two starts. A connection whose messages were all stale cannot
    make the receiver forget the live sender's position.
    """

    def __init__(self) -> None:
        self._last: dict[str, tuple[int, int, object]] = {}

    def accept(self, message: Message, source: object = None) -> bool:
        position = (message.epoch, message.seq)
        last = self._last.get(message.key)
        if last is not None and position <= last[:2]:
            return False
        self._last[message.key] = (*position, source)
        return True

    def forget(self, key: str, source: object = None) -> None:
        """Forget the stream `key` if its last accepted message came from `source`."""
        last = self._last.get(key)
        if last is not None and last[2] is source:
            del self._last[key]

    def forget_source(self, source: object) -> None:
        """Forget every stream whose last accepted message came from `source` (a closed connection)."""
        for key in [k for k, v in self._last.items() if v[2] is source]:
            del self._last[key]
