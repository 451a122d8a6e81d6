"""DRA mode's /readyz and /healthz (health.rule): registered with the plugin watcher, slices published and current.

Each row is one state of the DRA side as the plugin publishes it: the registration's phase and the slice
publisher's view. Ready needs both; a reason names what is missing and why, never a bare "not ready".
"""

from __future__ import annotations

import pytest

from colad.dra.registration import RegistrationPhase
from colad.health import rule
from colad.health.rule import PluginSnapshot, RoleView, assess, dra_readiness, readiness
from colad.outputs.statefile import PluginState, SliceStatus

pytestmark = pytest.mark.unit
NOW = 1000.0
DRIVER = "cola.myway5.com"
CURRENT = SliceStatus(wanted=True, published=True, slices=1, devices=2)


def state(registration: str = "registered", slices: SliceStatus = CURRENT, **fields: object) -> PluginState:
    return PluginState(pid=1, dra_driver=DRIVER, dra_registration=registration, dra_slices=slices, **fields)  # type: ignore[arg-type]


def test_the_phases_the_rule_reads_are_the_registrations_own() -> None:
    assert rule.DRA_REGISTERED == RegistrationPhase.REGISTERED.value
    assert rule.DRA_REFUSED == RegistrationPhase.REFUSED.value
    assert rule.DRA_SERVING == RegistrationPhase.SERVING.value


def test_registered_with_current_slices_is_ready() -> None:
    assert dra_readiness(state()) == (True, f"ready: driver {DRIVER} registered; 2 devices in 1 slices")


@pytest.mark.parametrize(
    ("published", "reason"),
    [
        (
            state("serving"),
            "not registered with the kubelet plugin watcher (the registration socket is served; "
            "no word from the kubelet yet)",
        ),
        (
            state("refused", dra_registration_error="plugin name already taken"),
            "not registered with the kubelet plugin watcher (refused: plugin name already taken)",
        ),
        (
            state("stopped", dra_problem="/p/dra.sock: cannot listen"),
            "not registered with the kubelet plugin watcher (/p/dra.sock: cannot listen)",
        ),
        (
            state("", SliceStatus()),
            "not registered with the kubelet plugin watcher (not started); "
            "slices not current: no device list from discovery yet",
        ),
        (state(slices=SliceStatus(wanted=True)), "slices not current: not yet published"),
        (
            state(slices=SliceStatus(wanted=True, published=True, pending=True)),
            "slices not current: a change not yet written",
        ),
        (
            state(slices=SliceStatus(wanted=True, published=True, pending=True, failing="list: connection refused")),
            "slices not current: API server failing (list: connection refused); a change waits to be written",
        ),
        (
            state(slices=SliceStatus(wanted=True, published=True, failing="watch: connection reset")),
            "slices not current: API server failing (watch: connection reset); changes unseen",
        ),
        (
            state(slices=SliceStatus(wanted=True, failing="create: 403 Forbidden")),
            "slices not current: API server failing (create: 403 Forbidden); a change waits to be written",
        ),
    ],
    ids=[
        "no-word-yet",
        "refused",
        "socket-not-served",
        "nothing-yet",
        "never-published",
        "change-pending",
        "outage-with-a-change",
        "outage-without-a-change",
        "refused-by-rbac",
    ],
)
def test_each_missing_part_is_not_ready_with_its_reason(published: PluginState, reason: str) -> None:
    assert dra_readiness(published) == (False, reason)


def test_readyz_in_dra_mode_is_the_dra_rule_with_a_silent_discovery_too() -> None:
    heard = PluginSnapshot(state(), discovery_heard=NOW - 1, rescan_interval=30.0)
    assert readiness(heard, NOW) == dra_readiness(state())
    silent = PluginSnapshot(state(), discovery_heard=NOW - 1000, rescan_interval=30.0)
    ok, why = readiness(silent, NOW)
    assert not ok and why.startswith("discovery silent for 1000s"), why


@pytest.mark.parametrize(
    ("published", "problems", "waiting"),
    [
        (state(), (), ()),
        (state(slices=SliceStatus(wanted=True, failing="list: refused")), (), ()),  # readiness, not health
        (state("serving"), (), ("not registered with the kubelet plugin watcher",)),
        (state("refused", dra_registration_error="no"), ("not registered with the kubelet plugin watcher",), ()),
        (state("stopped", dra_problem="API server: no kubeconfig"), ("not registered",), ()),
    ],
    ids=["healthy", "api-outage-is-healthy", "serving-is-waiting", "refused-is-a-problem", "not-served-is-a-problem"],
)
def test_health_in_dra_mode(published: PluginState, problems: tuple[str, ...], waiting: tuple[str, ...]) -> None:
    found = assess(PluginSnapshot(published, NOW - 1, 30.0), RoleView(), NOW)
    assert len(found.problems) == len(problems) and len(found.waiting) == len(waiting), found
    assert all(p.startswith(want) for p, want in zip(found.problems, problems, strict=True)), found
    assert all(w.startswith(want) for w, want in zip(found.waiting, waiting, strict=True)), found
    if found.ok:
        assert found.line().startswith(f"ok: registered as DRA driver {DRIVER}, "), found
