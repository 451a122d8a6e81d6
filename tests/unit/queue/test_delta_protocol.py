"""Property tests of the delta protocol (snapshots.py) against a model: random changes, random faults.

A simulated sender follows QueueClient's rule (a delta only on the connection that
carried its base, a full snapshot first on every connection); a lossy channel drops,
duplicates, reorders, replays and corrupts messages; senders and receivers restart.
Every set the receiver applies must be the sender's exact set at that (epoch, seq),
and after the faults each run ends, after one reconnect, in the exact last set.
Seeded: COLAD_SEED=<n> repeats a failing run; the seed is printed.
"""

from __future__ import annotations

import dataclasses
import os
import random
from collections import Counter
from dataclasses import dataclass, field

import pytest

from colad.core.constants import HEALTHY, UNHEALTHY
from colad.core.devices import Device, DeviceSet
from colad.queue.device_wire import set_digest
from colad.queue.messages import DeviceDelta, DeviceSnapshot, decode, encode
from colad.queue.snapshots import Fate, Receiver, apply_delta, apply_full
from tests.oracles import snapshot_delta

pytestmark = pytest.mark.unit

SEED = int(os.environ.get("COLAD_SEED", random.SystemRandom().randrange(2**32)))
RUNS = 400
STEPS = 60
NAMES = [f"cola{i}" for i in range(24)]

Wire = DeviceSnapshot | DeviceDelta


def _random_device(rng: random.Random, name: str) -> Device:
    roll = rng.random()
    if roll < 0.6:
        return Device(name, HEALTHY if rng.random() < 0.8 else UNHEALTHY)
    if roll < 0.8:
        return Device(name, numa_nodes=(rng.randrange(4),))
    return Device(name, envs=(("MODE", rng.choice(["a", "b", "c"])),))


def _change(rng: random.Random, current: DeviceSet) -> DeviceSet:
    """One random level-triggered rescan result: a few files added, removed or rewritten."""
    by_id = dict(current.by_id)
    for _ in range(rng.choice([1, 1, 1, 2, 3, 8, 30])):
        name = rng.choice(NAMES)
        if name in by_id and rng.random() < 0.4:
            del by_id[name]
        else:
            by_id[name] = _random_device(rng, name)
    return DeviceSet.of(by_id.values())


@dataclass
class Sender:
    """Discovery and its QueueClient, reduced to what the protocol depends on."""

    epoch: int
    current: DeviceSet = field(default_factory=DeviceSet)
    present: bool = True
    seq: int = 0
    digest: int | None = None
    published: bool = False
    sent_at: int | None = None  # seq of the last message sent on the current connection
    history: dict[tuple[int, int], tuple[DeviceSet, bool]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.history[(self.epoch, self.seq)] = (self.current, self.present)  # what a reconnect before any scan sends

    def change(self, devices: DeviceSet, present: bool) -> Wire:
        """The next message on the current connection: a delta if it carried the base, else a full snapshot."""
        base = self.seq
        self.seq += 1 + (self.seq % 3 == 0)  # other streams share the counter: seqs are not contiguous
        snapshot = DeviceSnapshot(self.epoch, self.seq, devices, present)
        found = None
        if self.published:
            found, self.digest = snapshot_delta(self.current, self.digest, snapshot, base)
        self.current, self.present, self.published = devices, present, True
        self.history[(self.epoch, self.seq)] = (devices, present)
        if found is not None and self.sent_at == base:
            self.sent_at = self.seq
            return found
        return self.reconnect()

    def reconnect(self) -> DeviceSnapshot:
        """A new connection: the latest full snapshot first."""
        self.sent_at = self.seq
        return DeviceSnapshot(self.epoch, self.seq, self.current, self.present)


def _corrupt(rng: random.Random, message: DeviceDelta, held: DeviceSet) -> DeviceDelta:
    kind = rng.randrange(3)
    if kind == 0 and message.upserts:
        first = message.upserts[0]
        flipped = dataclasses.replace(first, health=UNHEALTHY if first.health == HEALTHY else HEALTHY)
        return dataclasses.replace(message, upserts=(flipped, *message.upserts[1:]))
    if kind == 1:
        return dataclasses.replace(message, digest=(message.digest + 1) % 2**64)
    named = {*message.removes, *(d.device_id for d in message.upserts)}
    missing = [n for n in NAMES if n not in held and n not in named]
    if missing:
        return dataclasses.replace(message, removes=tuple(sorted({*message.removes, missing[0]})))
    return dataclasses.replace(message, digest=message.digest ^ 1)


def _run(rng: random.Random, tally: Counter[str]) -> None:
    sender = Sender(epoch=1000)
    receiver = Receiver()
    conn = object()  # the connection the sender's messages currently travel on
    history = dict(sender.history)  # every (epoch, seq) any sender ever held -> (devices, dir_present)
    sent: list[Wire] = []  # everything ever sent, for replays
    channel: list[tuple[Wire, object, bool]] = []  # (message, connection, corrupted)
    applied_last: tuple[int, int] | None = None

    def deliver(message: Wire, source: object, corrupted: bool) -> None:
        nonlocal conn, applied_last
        held = receiver.held.get(message.key)
        outcome = receiver.apply(message, source)
        tally[f"{type(message).__name__}:{outcome.fate.value}"] += 1
        if outcome.fate is Fate.APPLIED:
            assert not corrupted, f"a corrupted delta was applied: {message}"
            assert outcome.snapshot is not None
            position = (outcome.snapshot.epoch, outcome.snapshot.seq)
            assert history[position] == (outcome.snapshot.devices, outcome.snapshot.dir_present), position
            assert outcome.snapshot.devices == DeviceSet.of(outcome.snapshot.devices)  # sorted, unique
            if applied_last is not None and held is not None:
                assert position > applied_last, "went back in time without a forget"
            applied_last = position
        elif outcome.fate is Fate.RESYNC:
            # The plugin drops the connection; the sender reconnects with a full snapshot.
            receiver.forget_source(source)
            if source is conn:
                conn = object()
                channel.append((sender.reconnect(), conn, False))

    for _ in range(STEPS):
        roll = rng.random()
        if roll < 0.45:
            present = sender.present if rng.random() < 0.9 else not sender.present
            message = sender.change(_change(rng, sender.current), present)
            history.update(sender.history)
            sent.append(message)
            corrupted = False
            if isinstance(message, DeviceDelta) and rng.random() < 0.08:
                held = receiver.held.get(message.key)
                message = _corrupt(rng, message, held.snapshot.devices if held else DeviceSet())
                corrupted = True
                tally["fault:corrupt"] += 1
            channel.append((message, conn, corrupted))
        elif roll < 0.55 and channel:
            channel.pop(rng.randrange(len(channel)))
            tally["fault:drop"] += 1
        elif roll < 0.62 and channel:
            channel.insert(rng.randrange(len(channel) + 1), rng.choice(channel))
            tally["fault:duplicate"] += 1
        elif roll < 0.69 and len(channel) > 1:
            i = rng.randrange(len(channel) - 1)
            channel[i], channel[i + 1] = channel[i + 1], channel[i]
            tally["fault:reorder"] += 1
        elif roll < 0.75 and sent:
            channel.append((rng.choice(sent), object() if rng.random() < 0.5 else conn, False))
            tally["fault:replay"] += 1
        elif roll < 0.78:
            # A restarted discovery: a later epoch, a fresh scan, a new connection.
            old = sender
            sender = Sender(epoch=old.epoch + rng.randrange(1, 5))
            message = sender.change(old.current if rng.random() < 0.5 else _change(rng, old.current), old.present)
            history.update(sender.history)
            receiver.forget_source(conn)  # the old connection's close
            conn = object()
            channel.append((message, conn, False))
            tally["fault:restart_sender"] += 1
        elif roll < 0.81:
            # A restarted plugin: nothing held; every sender reconnects with a full snapshot.
            receiver = Receiver()
            applied_last = None
            channel.clear()
            conn = object()
            channel.append((sender.reconnect(), conn, False))
            tally["fault:restart_receiver"] += 1
        elif channel:
            message, source, corrupted = channel.pop(0)
            deliver(message, source, corrupted)
    # The faults end; the connection ends too (a stream loses nothing without a close), so the
    # sender reconnects and the receiver must end in the exact last set.
    for message, source, corrupted in channel:
        deliver(message, source, corrupted)
    receiver.forget_source(conn)
    conn = object()
    deliver(sender.reconnect(), conn, False)
    held = receiver.held[DeviceSnapshot(0, 0, DeviceSet()).key]
    assert (held.snapshot.devices, held.snapshot.dir_present) == (sender.current, sender.present)


def test_random_changes_and_faults_end_in_the_exact_list() -> None:
    print(f"delta protocol seed: COLAD_SEED={SEED}")
    rng = random.Random(SEED)
    tally: Counter[str] = Counter()
    for _ in range(RUNS):
        _run(rng, tally)
    print(dict(sorted(tally.items())))
    # The run must have exercised every fault and every fate, or it proves little.
    for fault in ("drop", "duplicate", "reorder", "replay", "corrupt", "restart_sender", "restart_receiver"):
        assert tally[f"fault:{fault}"] > 0, fault
    for fate in ("applied", "stale", "resync"):
        assert tally[f"DeviceDelta:{fate}"] > 0, fate
    assert tally["DeviceSnapshot:applied"] > 0 and tally["DeviceSnapshot:stale"] > 0


def test_deltas_survive_the_wire() -> None:
    rng = random.Random(SEED)
    old = DeviceSet()
    digest = set_digest(old)
    receiver = Receiver()
    receiver.apply(DeviceSnapshot(7, 1, old))
    for seq in range(2, 200):
        new = _change(rng, old)
        found, digest = snapshot_delta(old, digest, DeviceSnapshot(7, seq, new), seq - 1)
        message: Wire = found if found is not None else DeviceSnapshot(7, seq, new)
        assert decode(encode(message)) == message
        outcome = receiver.apply(decode(encode(message)))
        assert outcome.fate is Fate.APPLIED and outcome.snapshot is not None
        assert outcome.snapshot.devices == new
        assert digest == set_digest(new)
        old = new


# --- the rules, one case each ---------------------------------------------------------------

A = Device("a")
B = Device("b", UNHEALTHY)
C = Device("c", numa_nodes=(1,))
AB = DeviceSet.of([A, B])


def _delta(base: int, seq: int, upserts: tuple[Device, ...], removes: tuple[str, ...], new: DeviceSet) -> DeviceDelta:
    return DeviceDelta(1, seq, base, upserts, removes, set_digest(new))


def test_a_delta_on_its_base_applies() -> None:
    held, _ = apply_full(None, DeviceSnapshot(1, 5, AB), "c1")
    new = DeviceSet.of([A, C])
    _, outcome = apply_delta(held, _delta(5, 6, (C,), ("b",), new), "c1")
    assert outcome.fate is Fate.APPLIED and outcome.snapshot is not None
    assert outcome.snapshot.devices == new


@pytest.mark.parametrize(
    ("message", "fate", "reason"),
    [
        pytest.param(_delta(4, 6, (C,), (), DeviceSet.of([A, B, C])), Fate.RESYNC, "gap", id="gap"),
        pytest.param(_delta(5, 6, (C,), (), AB), Fate.RESYNC, "digest mismatch", id="digest-mismatch"),
        pytest.param(_delta(5, 6, (), ("c",), AB), Fate.RESYNC, "not held", id="remove-unknown"),
        pytest.param(_delta(4, 5, (C,), (), AB), Fate.STALE, "not newer", id="duplicate"),
        pytest.param(_delta(1, 2, (C,), (), AB), Fate.STALE, "not newer", id="replay"),
        pytest.param(dataclasses.replace(_delta(5, 6, (), (), AB), epoch=2), Fate.RESYNC, "gap", id="new-epoch-delta"),
    ],
)
def test_a_delta_that_cannot_apply(message: DeviceDelta, fate: Fate, reason: str) -> None:
    held, _ = apply_full(None, DeviceSnapshot(1, 5, AB), "c1")
    after, outcome = apply_delta(held, message, "c1")
    assert (outcome.fate, outcome.snapshot) == (fate, None)
    assert reason in outcome.reason
    assert after is not None and after.snapshot.devices == AB


def test_after_a_resync_only_a_full_snapshot_applies() -> None:
    receiver = Receiver()
    receiver.apply(DeviceSnapshot(1, 5, AB), "c1")
    assert receiver.apply(_delta(6, 7, (C,), (), DeviceSet.of([A, B, C])), "c1").fate is Fate.RESYNC
    # The next delta would fit the held set, but the stream is out of sync until a full snapshot.
    assert receiver.apply(_delta(5, 8, (C,), (), DeviceSet.of([A, B, C])), "c1").fate is Fate.RESYNC
    assert receiver.apply(DeviceSnapshot(1, 9, DeviceSet.of([C])), "c2").fate is Fate.APPLIED
    assert receiver.apply(_delta(9, 10, (A,), (), DeviceSet.of([A, C])), "c2").fate is Fate.APPLIED


def test_a_delta_without_a_base_asks_for_a_resync() -> None:
    assert Receiver().apply(_delta(5, 6, (C,), (), DeviceSet.of([C]))).fate is Fate.RESYNC


def test_forget_source_lets_a_restarted_sender_with_an_earlier_clock_in() -> None:
    receiver = Receiver()
    receiver.apply(DeviceSnapshot(100, 5, AB), "old")
    assert receiver.apply(DeviceSnapshot(90, 1, DeviceSet()), "new").fate is Fate.STALE
    receiver.forget_source("old")
    assert receiver.apply(DeviceSnapshot(90, 1, DeviceSet()), "new").fate is Fate.APPLIED


def test_a_big_change_is_sent_whole() -> None:
    new = DeviceSet.of([C])
    found, digest = snapshot_delta(AB, None, DeviceSnapshot(1, 6, new), 5)
    assert found is None and digest == set_digest(new)


@pytest.mark.parametrize("count", [3, 200], ids=["few-changes", "many-changes"])
def test_apply_keeps_the_set_sorted(count: int) -> None:
    old = DeviceSet.of(Device(f"d{i:04d}") for i in range(0, 1000, 2))
    new = DeviceSet.of([*old, *(Device(f"d{i:04d}") for i in range(1, 2 * count, 2))])
    found, _ = snapshot_delta(old, None, DeviceSnapshot(1, 2, new), 1)
    assert found is not None and len(found.upserts) == count
    held, _ = apply_full(None, DeviceSnapshot(1, 1, old), None)
    _, outcome = apply_delta(held, found, None)
    assert outcome.snapshot is not None and outcome.snapshot.devices == new
