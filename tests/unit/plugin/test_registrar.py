"""Unit tests for colad.plugin.registrar's effect boundary: however an effect fails, the registration hears of it.

`ResourceRegistrar.carry_out` is the one place every effect of registration.step is carried out: a test
registrar whose `_execute` raises stands in for each way the real one can fail (a thread that cannot
start, a file limit, memory), for every effect type the machine has, read from the module.
"""

from __future__ import annotations

import dataclasses
import logging
from pathlib import Path

import pytest

from colad.config.config import Resource
from colad.core import registration as reg
from colad.metrics.registry import Metrics
from colad.outputs.socketpath import SocketRecord
from colad.plugin.registrar import Context, ResourceRegistrar, Servers

pytestmark = pytest.mark.unit

RESOURCE = "myway5.com/cola"
SAMPLE_VALUES = {"int": 1, "float": 1.0, "str": "x", "Phase": reg.Phase.REGISTERED}
FAILURES = [
    pytest.param(RuntimeError("can't start new thread"), "RuntimeError: can't start new thread", id="no-thread"),
    pytest.param(OSError(24, "Too many open files"), "OSError: [Errno 24] Too many open files", id="emfile"),
    pytest.param(MemoryError(), "MemoryError", id="no-memory"),
    pytest.param(TimeoutError("deadline"), "TimeoutError: deadline", id="timeout"),
]


def sample(kind: type) -> reg.Effect:
    """An instance of an effect type, its fields filled by their declared types."""
    fields = {f.name: SAMPLE_VALUES.get(str(f.type), ()) for f in dataclasses.fields(kind)}
    effect: reg.Effect = kind(**fields)
    return effect


class FailingRegistrar(ResourceRegistrar):
    """Carries out nothing itself: each effect raises `failure` if it is of a type in `failing`."""

    def __init__(self, ctx: Context, failure: BaseException, failing: tuple[type, ...]) -> None:
        super().__init__(ctx, Resource(name=RESOURCE, device_dir="/dev/colas"), 0.0)
        self.failure, self.failing = failure, failing
        self.done: list[reg.Effect] = []

    def _execute(self, effect: reg.Effect, now: float) -> reg.Event | None:
        self.done.append(effect)
        if isinstance(effect, self.failing):
            raise self.failure
        return None


def context(tmp_path: Path, metrics: Metrics) -> Context:
    return Context(
        str(tmp_path / "kubelet"),
        str(tmp_path / "kubelet" / "kubelet.sock"),
        1.0,
        metrics,
        SocketRecord(str(tmp_path / "sockets.json")),
        lambda _event: None,
        lambda: 0.0,
        Servers(),
        set,
    )


def failures(metrics: Metrics, effect: str) -> float | None:
    labels = {"resource": RESOURCE, "effect": effect}
    return metrics.registry.get_sample_value("colad_registration_effect_failures_total", labels)


@pytest.mark.parametrize(("failure", "error"), FAILURES)
@pytest.mark.parametrize("kind", reg.EFFECTS, ids=reg.effect_name)
def test_any_failure_of_any_effect_is_an_event_one_line_and_a_count(
    kind: type, failure: BaseException, error: str, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    metrics = Metrics()
    registrar = FailingRegistrar(context(tmp_path, metrics), failure, (kind,))
    effect = sample(kind)
    assert failures(metrics, reg.effect_name(kind)) == 0.0  # the series is there from the start
    with caplog.at_level(logging.WARNING):
        answer = registrar.carry_out(effect, 5.0)
    assert answer == reg.EffectFailed(effect, error)
    assert failures(metrics, reg.effect_name(kind)) == 1.0
    lines = [r for r in caplog.records if "registration effect failed" in r.getMessage()]
    assert len(lines) == 1 and not lines[0].exc_info
    assert f"effect={reg.effect_name(kind)}" in lines[0].getMessage() and RESOURCE in lines[0].getMessage()


def test_the_effects_after_a_failed_one_are_dropped_and_the_registration_backs_off(tmp_path: Path) -> None:
    metrics = Metrics()
    registrar = FailingRegistrar(context(tmp_path, metrics), RuntimeError("can't start new thread"), (reg.StopServer,))
    registrar.state = reg.Registration(
        started=0.0,
        phase=reg.Phase.REGISTERED,
        generation=1,
        endpoint="colad-1.sock",
        calls=1,
        kubelet_identity="1:2:3",
        have_devices=True,
        streams=((1, 1),),
    )
    registrar.apply(reg.KubeletSeen("1:9:9", True, "watcher"), 10.0)
    error = "stop_server failed: RuntimeError: can't start new thread"
    # Serve(2) assumed the old server had stopped: never carried out; the machine's answer to the failure is.
    assert registrar.done == [
        reg.StopServer(1),
        reg.RetryAt(10.0 + reg.BACKOFF_MIN, reg.BACKOFF_MIN, error),
        reg.Transition(reg.Phase.REGISTERED, reg.Phase.BACKOFF, error),
    ]
    assert registrar.state.phase is reg.Phase.BACKOFF and registrar.state.last_error == error
    assert registrar.resource_state().last_error == error
