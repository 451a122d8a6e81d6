"""The plugin's life-cycle thread per change: no work that changes nothing.

Every device change is a DevicesSeen for the registration: after the first it leaves the record
as it was (the same object, no effects), from any state a random event sequence reaches. And
SentBroadcast.snapshot_version, read without the lock, is always the version snapshot() gives.
"""

from __future__ import annotations

import random
from dataclasses import replace

import pytest

from colad.core import registration as reg
from colad.core.devices import Device, DeviceSet
from colad.plugin.registrar import SentBroadcast

pytestmark = pytest.mark.unit


def random_event(rng: random.Random, state: reg.Registration) -> reg.Event:
    g, call = state.generation, state.call
    choices: list[reg.Event] = [
        reg.DevicesSeen(),
        reg.Served(g, f"colad-{g}.sock"),
        reg.EffectFailed(reg.Serve(g, "start"), "OSError: bind"),
        reg.SocketChecked(rng.random() < 0.8),
        reg.RegisterSent(call, rng.choice(["", "kubelet-1"])),
        reg.RegisterDone(call, rng.choice([None, None, "refused"]), rng.random() < 0.2),
        reg.StreamOpened(g),
        reg.StreamClosed(g),
        reg.KubeletSeen(rng.choice(["", "kubelet-1", "kubelet-2"]), rng.random() < 0.8, "watcher"),
        reg.Timer(),
        reg.OptionsChanged(),
    ]
    return rng.choice(choices)


@pytest.mark.parametrize("seed", range(40))
def test_devices_seen_after_the_first_is_the_same_record_and_no_effect(seed: int) -> None:
    rng = random.Random(seed)
    state, now, checked = reg.Registration(started=0.0), 0.0, 0
    for _ in range(200):
        now += rng.random() * 3
        if state.have_devices and state.phase is not reg.Phase.STOPPED:
            again, effects = reg.step(state, reg.DevicesSeen(), now)
            assert again is state and effects == []
            assert replace(state, have_devices=True) == state  # an equal copy per change would be work for nothing
            checked += 1
        state, _ = reg.step(state, random_event(rng, state), now)
    first, effects = reg.step(reg.Registration(started=0.0), reg.DevicesSeen(), 0.0)
    assert first.have_devices and effects  # the first set starts the registration
    assert checked


def test_snapshot_version_is_snapshot_s_version_through_updates() -> None:
    broadcast = SentBroadcast()
    rng = random.Random(7)
    sets = [
        DeviceSet(tuple(Device(f"d{i}", health=rng.choice(["Healthy", "Unhealthy"])) for i in range(n)))
        for n in range(6)
    ]
    for _ in range(300):
        broadcast.update(rng.choice(sets))
        assert broadcast.snapshot_version() == broadcast.snapshot()[0]
    assert broadcast.snapshot_version() > 0
