"""Allocate's answers kept per device set (allocation.answer) and its per-device series kept (Metrics.allocated).

answer() must be allocate() exactly, whatever the set and the request (random sets, random
requests, every CDI mode and spec listing), a refusal raised each time and never kept, a new
set worked out afresh, and at most MAX_ANSWERS_PER_SET kept. The per-device series a dict keeps
must stay the ones the registry exports across forget_devices, remove_resource and bind.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from typing import Any

import pytest

from colad.core import allocation
from colad.core.constants import UNHEALTHY
from colad.core.devices import Device, DeviceNode, DeviceSet, Mount
from colad.core.errors import AllocationError
from colad.core.names import CDI_MODES
from colad.metrics.registry import Metrics
from colad.outputs.statefile import PluginState

pytestmark = pytest.mark.unit
COLA = "myway5.com/cola"


def random_set(rng: random.Random) -> DeviceSet:
    def n(top: int) -> int:
        return rng.randint(0, top)

    devices = []
    for i in range(rng.randint(1, 12)):
        device_id = f"cola{i}" + rng.choice(["", "::1", "::2", "-", "_x"])
        devices.append(
            Device(
                device_id,
                rng.choice(["Healthy", "Healthy", "Healthy", UNHEALTHY]),
                device_nodes=tuple(DeviceNode(f"/dev/n{n(3)}", f"/dev/c{n(3)}") for _ in range(n(2))),
                mounts=tuple(Mount(f"/opt/m{n(3)}", f"/m{n(3)}") for _ in range(n(1))),
                envs=tuple(sorted({f"K{n(2)}": str(n(2)) for _ in range(n(2))}.items())),
                cdi_devices=tuple(f"vendor.com/gpu=g{n(2)}" for _ in range(n(1))),
            )
        )
    return DeviceSet.of(devices)


def outcome(call: Callable[..., object], *args: object, **kwargs: Any) -> object:
    try:
        return call(*args, **kwargs)
    except AllocationError as exc:
        return ("refused", str(exc), exc.not_found)


def test_answer_is_allocate_for_random_sets_and_requests() -> None:
    rng = random.Random(14)
    calls = 0
    for _ in range(300):
        devices = random_set(rng)
        ids = [d.device_id for d in devices] + ["nope"]
        for _ in range(12):
            requested = tuple(rng.choice(ids) for _ in range(rng.randint(0, 4)))
            mode = rng.choice(CDI_MODES)
            listed = rng.choice([None, frozenset(), frozenset(rng.sample(ids, rng.randint(0, len(ids))))])
            kwargs = {"resource_name": rng.choice([COLA, "no-slash"]), "cdi_mode": mode, "cdi_listed": listed}
            want = outcome(allocation.allocate, devices, requested, **kwargs)
            for _ in range(2):  # the first works it out, the second finds it kept
                got = outcome(allocation.answer, devices, requested, lambda r: ("enc", r), **kwargs)
                if isinstance(want, tuple) and want[0] == "refused":
                    assert got == want
                else:
                    assert got == (want, ("enc", want))
                calls += 1
    assert calls == 300 * 12 * 2


def test_an_answer_is_kept_on_its_set_a_refusal_never() -> None:
    devices = DeviceSet.of([Device("a"), Device("b", UNHEALTHY)])
    encoded: list[allocation.ContainerAllocation] = []

    def encode(result: allocation.ContainerAllocation) -> int:
        encoded.append(result)
        return len(encoded)

    first = allocation.answer(devices, ("a",), encode)
    assert allocation.answer(devices, ("a",), encode) is first
    assert len(encoded) == 1
    for _ in range(2):
        with pytest.raises(AllocationError, match="Unhealthy"):
            allocation.answer(devices, ("b",), encode)
    assert len(encoded) == 1
    # Another set (the next change) knows nothing of the first's answers.
    again = DeviceSet.of([Device("a")])
    assert allocation.answer(again, ("a",), encode) == (first[0], 2)
    # Other CDI arguments are other answers.
    assert allocation.answer(devices, ("a",), encode, cdi_mode="both", resource_name=COLA)[1] == 3


def test_at_most_max_answers_are_kept_per_set_and_the_rest_still_answered(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(allocation, "MAX_ANSWERS_PER_SET", 3)
    devices = DeviceSet.of([Device(f"d{i}") for i in range(6)])
    made: list[str] = []
    for _round in range(2):
        for i in range(6):
            result, _ = allocation.answer(devices, (f"d{i}",), lambda r: made.append(r.device_ids[0]))
            assert result.envs["COLA_DEVICES"] == f"d{i}"
    assert made == [f"d{i}" for i in range(6)] + ["d3", "d4", "d5"]


def test_per_device_series_stay_the_exported_ones_across_forget_remove_and_bind() -> None:
    metrics = Metrics(snapshot=lambda: PluginState(pid=1))
    metrics.add_resource(COLA)
    metrics.allocated(COLA, ["a", "b"])  # before bind: kept by the families, replayed at bind
    metrics.allocated(COLA, ["a"])
    value = metrics.registry.get_sample_value

    def allocations(device_id: str) -> float | None:
        return value("colad_device_allocations_total", {"resource": COLA, "device_id": device_id})

    assert (allocations("a"), allocations("b")) == (2, 1)
    metrics.allocated(COLA, ["a"])
    assert allocations("a") == 3
    metrics.forget_devices(COLA, {"b"})
    assert allocations("a") is None
    metrics.allocated(COLA, ["a", "b"])
    assert (allocations("a"), allocations("b")) == (1, 2)
    metrics.remove_resource(COLA)
    assert (allocations("a"), allocations("b")) == (None, None)
    metrics.add_resource(COLA)
    metrics.allocated(COLA, ["b"])
    assert (allocations("a"), allocations("b")) == (None, 1)
    metrics.forget_devices(COLA, set())
    assert allocations("b") is None


def test_per_device_off_keeps_no_series() -> None:
    metrics = Metrics(snapshot=lambda: PluginState(pid=1), per_device=False)
    metrics.add_resource(COLA)
    metrics.allocated(COLA, ["a"])
    value = metrics.registry.get_sample_value
    assert value("colad_device_allocations_total", {"resource": COLA, "device_id": "a"}) is None
    assert value("colad_allocated_devices_total", {"resource": COLA}) == 1
