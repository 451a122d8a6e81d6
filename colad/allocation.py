"""Pure allocation rules: what Allocate answers and which devices GetPreferredAllocation picks.

Input is the current DeviceSet and the IDs the kubelet sent; output is plain
values or an AllocationError naming the offending device. No gRPC types here.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, field

from colad.constants import COLA_DEVICES_ENV
from colad.devices import DeviceSet
from colad.errors import AllocationError


@dataclass(frozen=True)
class ContainerAllocation:
    device_ids: tuple[str, ...]
    envs: dict[str, str] = field(default_factory=dict)


def allocate(devices: DeviceSet, requested: Sequence[str]) -> ContainerAllocation:
    """Validate one container request and say what the container gets.

    Every ID must be known and Healthy, and listed once. COLA_DEVICES keeps the
    kubelet's order, so the container sees the IDs it was assigned, as assigned.
    """
    if not requested:
        raise AllocationError("container request names no devices")
    seen: set[str] = set()
    for device_id in requested:
        if device_id in seen:
            raise AllocationError(f"device {device_id!r} is requested twice")
        seen.add(device_id)
        device = devices.get(device_id)
        if device is None:
            raise AllocationError(f"unknown device {device_id!r}", not_found=True)
        if not device.healthy:
            raise AllocationError(f"device {device_id!r} is {device.health}")
    ids = tuple(requested)
    return ContainerAllocation(ids, {COLA_DEVICES_ENV: ",".join(ids)})


def _natural_key(device_id: str) -> tuple[object, ...]:
    # "cola2" before "cola10": operators number devices and expect that order.
    # Ties ("cola1" and "cola01") are broken by the plain ID, so the order never depends on set order.
    parts = re.split(r"([0-9]+)", device_id)
    return (tuple((1, int(p), "") if p.isdigit() and p.isascii() else (0, 0, p) for p in parts), device_id)


def preferred(available: Sequence[str], must_include: Sequence[str], size: int) -> tuple[str, ...]:
    """A deterministic preferred allocation; never raises.

    The answer is advisory (the kubelet intersects it with its own candidates and
    fills any gap), and an error here would fail the pod, so odd input gets a
    best-effort answer: must_include first (those that are available, in the
    kubelet's order), then the other available IDs in natural order, never more
    than `size`.
    """
    available_set = set(available)
    chosen: list[str] = []
    for device_id in must_include:
        if device_id in available_set and device_id not in chosen:
            chosen.append(device_id)
    if size <= len(chosen):
        return tuple(chosen[: max(size, 0)])
    taken = set(chosen)
    for device_id in sorted(available_set - taken, key=_natural_key):
        if len(chosen) >= size:
            break
        chosen.append(device_id)
    return tuple(chosen)
