"""The queue's streams in order: device sets as full snapshots and deltas, and which messages are news.

Pure: no I/O, clock or logging. Discovery fits a snapshot to the frame (`fit_the_queue`)
and builds a DeviceDelta (`moved_delta()`); the queue
server feeds each device message to a `Receiver` (the exact set now held, "stale", or
"resync": the server drops that connection and the sender starts again with a full
snapshot) and every other message to a `SequenceTracker` ((epoch, seq) must move forward).
`stats_of` counts a set once; a delta carries the counts over in O(change).
"""

from __future__ import annotations

import bisect
import enum
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace

from colad.core.constants import HEALTHY, UNHEALTHY
from colad.core.devices import Device, DeviceSet
from colad.queue import device_wire, messages
from colad.queue.device_wire import moved_digest, set_digest
from colad.queue.messages import DeviceDelta, DeviceSnapshot, Message

# Past this many changed devices, a sorted rebuild is cheaper than one insertion or deletion each.
_REBUILD_AT = 64
_STATS = "stats"  # DeviceSet.memo key of the set's SetStats
UPSERTS = "upserts"  # DeviceSet.memo key: the devices the delta that made the set brought (device_list)


@dataclass(frozen=True)
class SetStats:
    """What the plugin publishes about a set after every event: its devices per health, and how many
    name a prepare of their own (prestart.ignored_prepares looks at the devices only when some do)."""

    healthy: int = 0
    unhealthy: int = 0
    prepares: int = 0

    def moved(self, gone: Sequence[Device], came: Sequence[Device]) -> SetStats:
        """These counts with `gone` taken out and `came` added: O(change)."""
        less, more = _count(gone), _count(came)
        return SetStats(
            self.healthy - less.healthy + more.healthy,
            self.unhealthy - less.unhealthy + more.unhealthy,
            self.prepares - less.prepares + more.prepares,
        )

    def times(self, n: int) -> SetStats:
        """The counts of a set in which each device appears `n` times (devices.replicate)."""
        return SetStats(self.healthy * n, self.unhealthy * n, self.prepares * n)


def _count(devices: Sequence[Device]) -> SetStats:
    healths = [d.health for d in devices]
    prepares = len([d for d in devices if d.prepare])
    return SetStats(healths.count(HEALTHY), healths.count(UNHEALTHY), prepares)


def stats_of(devices: DeviceSet) -> SetStats:
    """The set's SetStats, counted once per set unless a delta or a replication carried them over."""
    return devices.memo(_STATS, lambda s: _count(s.devices))


def keep_stats(devices: DeviceSet, stats: SetStats) -> None:
    """Record `stats` as the counts of `devices` (the caller knows them without a pass over the set)."""
    devices.remember(_STATS, stats)


def moved_delta(
    old_digest: int,
    new: DeviceSnapshot,
    base: int,
    came: Sequence[Device],
    gone: Sequence[Device],
    removed: tuple[str, ...],
) -> tuple[DeviceDelta | None, int]:
    """The delta from the set sent at seq `base` (its digest `old_digest`) to `new`, and the digest of `new`.

    Built in O(change) from what the caller knows changed: `came` (added or changed, sorted by ID),
    `gone` (the devices removed or replaced), `removed` (the IDs gone, sorted). The delta is None
    when it would carry as much as a full snapshot: the caller then sends `new` whole.
    """
    digest = moved_digest(old_digest, gone, came)
    if len(came) + len(removed) >= max(len(new.devices), 1):
        return None, digest
    found = DeviceDelta(new.epoch, new.seq, base, tuple(came), removed, digest, new.dir_present, new.resource)
    return found, digest


# The seq of a snapshot is not known when it is fitted: count it with the widest it can have.
_MAX_SEQ = 2**63 - 1
TOO_LARGE = "snapshot too large: file content left out to fit the queue message limit"


@dataclass(frozen=True)
class Fitted:
    """A snapshot's devices cut to the queue's frame limit, measured on the exact encoded size."""

    devices: DeviceSet
    demoted: tuple[str, ...] = ()  # Unhealthy, content dropped (largest first)
    dropped: tuple[str, ...] = ()  # left out (the last IDs), when even bare entries do not fit
    size: int = 0


def fit_the_queue(snapshot: DeviceSnapshot, sizes: dict[str, int], limit: int = messages.MAX_MESSAGE_BYTES) -> Fitted:
    """Keep `snapshot` (its seq is ignored) under `limit`: the largest devices turn Unhealthy until it fits.

    `sizes` holds device_wire_size of devices already measured. Only many large
    files get there (each is at most 64 KiB). Demoted devices say why (TOO_LARGE);
    when that is still too much (many short devices with reasons), the largest
    become a bare Unhealthy entry, and only when even those cannot fit are the
    last IDs left out. Deterministic: the same set gives the same cut.
    """
    found = snapshot.devices
    wire = {d.device_id: sizes.get(d.device_id) or device_wire.device_wire_size(d) for d in found}
    total = messages.snapshot_size(replace(snapshot, seq=_MAX_SEQ), [wire[d.device_id] for d in found])
    if total <= limit:
        return Fitted(found, size=total)
    kept = {d.device_id: d for d in found}
    demoted: dict[str, None] = {}  # in order of demotion, each once
    for said in (TOO_LARGE, ""):  # first with the reason; then, if still too large, as bare as can be
        for device_id in sorted(wire, key=lambda i: (-wire[i], i)):
            if total <= limit:
                break
            bare = Device(device_id, UNHEALTHY, problem=said)
            smaller = device_wire.device_wire_size(bare)
            if smaller >= wire[device_id]:
                continue
            kept[device_id] = bare
            total -= wire[device_id] - smaller
            wire[device_id] = smaller
            demoted[device_id] = None
    dropped: list[str] = []
    for device_id in sorted(kept, reverse=True):
        if total <= limit:
            break
        total -= wire[device_id] + (1 if len(kept) > 1 else 0)
        del kept[device_id]
        dropped.append(device_id)
    return Fitted(DeviceSet.of(kept.values()), tuple(demoted), tuple(sorted(dropped)), total)


class Fate(enum.Enum):
    """What became of one snapshot or delta at the receiver."""

    APPLIED = "applied"  # `snapshot` is the exact set the sender held at that (epoch, seq)
    STALE = "stale"  # a duplicate or a replay: nothing changes
    RESYNC = "resync"  # cannot be applied: the sender must send a full snapshot


@dataclass(frozen=True)
class Outcome:
    fate: Fate
    snapshot: DeviceSnapshot | None = None
    reason: str = ""


@dataclass(frozen=True)
class Held:
    """One resource's stream as the receiver holds it."""

    snapshot: DeviceSnapshot
    ids: tuple[str, ...]  # snapshot.devices' IDs, in order, for bisect
    digest: int | None  # set_digest(snapshot.devices), computed when the first delta needs it
    source: object  # the connection that delivered it
    synced: bool = True  # False after a resync request: deltas wait for the next full snapshot

    @property
    def position(self) -> tuple[int, int]:
        return self.snapshot.epoch, self.snapshot.seq


def apply_full(held: Held | None, message: DeviceSnapshot, source: object) -> tuple[Held | None, Outcome]:
    """A full snapshot replaces whatever is held unless it is not newer than it."""
    if held is not None and (message.epoch, message.seq) <= held.position:
        return held, Outcome(Fate.STALE, reason="not newer than the set held")
    return Held(message, message.devices.ids, None, source), Outcome(Fate.APPLIED, message)


def apply_delta(held: Held | None, message: DeviceDelta, source: object) -> tuple[Held | None, Outcome]:
    """A delta applies to exactly the set it names as its base, and must land on its digest."""
    if held is not None and (message.epoch, message.seq) <= held.position:
        return held, Outcome(Fate.STALE, reason="not newer than the set held")
    if held is None or not held.synced:
        return held, Outcome(Fate.RESYNC, reason="no base set held")
    if (message.epoch, message.base) != held.position:
        return _unsynced(held), Outcome(Fate.RESYNC, reason=f"gap: base {message.base}, held {held.snapshot.seq}")
    found = _moved(held, message)
    if isinstance(found, str):
        return _unsynced(held), Outcome(Fate.RESYNC, reason=found)
    devices, ids, gone = found
    base_digest = held.digest if held.digest is not None else set_digest(held.snapshot.devices)
    digest = moved_digest(base_digest, gone, message.upserts)
    if digest != message.digest:
        return _unsynced(held), Outcome(Fate.RESYNC, reason="digest mismatch")
    moved = DeviceSet(tuple(devices))
    moved.remember(UPSERTS, message.upserts)  # the only devices new to the set: encoded alone (device_list)
    if (base_stats := held.snapshot.devices.known(_STATS)) is not None:
        keep_stats(moved, base_stats.moved(gone, message.upserts))
    snapshot = DeviceSnapshot(message.epoch, message.seq, moved, message.dir_present, message.resource)
    return Held(snapshot, tuple(ids), digest, source), Outcome(Fate.APPLIED, snapshot)


def _moved(held: Held, message: DeviceDelta) -> tuple[list[Device], list[str], list[Device]] | str:
    """The held devices and IDs with `message` applied, and the devices it replaced; or why it cannot apply."""
    devices, ids = list(held.snapshot.devices), list(held.ids)
    gone: list[Device] = []
    if len(message.removes) + len(message.upserts) > _REBUILD_AT:
        by_id = dict(zip(ids, devices, strict=True))
        for device_id in message.removes:
            if device_id not in by_id:
                return f"removed device {device_id} not held"
            gone.append(by_id.pop(device_id))
        for device in message.upserts:
            if device.device_id in by_id:
                gone.append(by_id[device.device_id])
            by_id[device.device_id] = device
        ids = sorted(by_id)
        return [by_id[i] for i in ids], ids, gone
    # A few changes: copy the sorted lists (C speed) and move only the changed entries.
    found = move_sorted(devices, ids, message.removes, message.upserts)
    return found if isinstance(found, str) else (devices, ids, found)


def move_sorted(
    devices: list[Device], ids: list[str], removes: Iterable[str], upserts: Iterable[Device]
) -> list[Device] | str:
    """Remove then upsert, in place, in the ID-sorted `devices` and their `ids`: the devices that left
    or were replaced, or why the change does not apply. O(log n) per change, plus the list moves."""
    gone: list[Device] = []
    for device_id in removes:
        at = bisect.bisect_left(ids, device_id)
        if at == len(ids) or ids[at] != device_id:
            return f"removed device {device_id} not held"
        gone.append(devices[at])
        del devices[at], ids[at]
    for device in upserts:
        at = bisect.bisect_left(ids, device.device_id)
        if at < len(ids) and ids[at] == device.device_id:
            gone.append(devices[at])
            devices[at] = device
        else:
            devices.insert(at, device)
            ids.insert(at, device.device_id)
    return gone


def _unsynced(held: Held) -> Held:
    return Held(held.snapshot, held.ids, held.digest, held.source, synced=False)


class Receiver:
    """Every resource's stream as the plugin's queue server holds it: feed it each device message in turn."""

    def __init__(self) -> None:
        self.held: dict[str, Held] = {}

    def apply(self, message: DeviceSnapshot | DeviceDelta, source: object = None) -> Outcome:
        held = self.held.get(message.key)
        if isinstance(message, DeviceSnapshot):
            after, outcome = apply_full(held, message, source)
        else:
            after, outcome = apply_delta(held, message, source)
        if after is not None:
            self.held[message.key] = after
        return outcome

    def forget_source(self, source: object) -> None:
        """Forget every stream last delivered by `source` (a closed connection): its sender starts afresh."""
        for key in [k for k, h in self.held.items() if h.source is source]:
            del self.held[key]

    def forget(self, key: str) -> None:
        self.held.pop(key, None)


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
