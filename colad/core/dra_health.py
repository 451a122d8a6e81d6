"""Device health as a DRA driver reports it to the kubelet: the complete list of its devices, pure values.

The kubelet's DRAResourceHealth stream (colad/dra/health.py serves it) carries, per device, its pool and
device name, Healthy or Unhealthy, and a message; the kubelet puts the health of each allocated device
in the pod's status. This module makes that list from the device sets the slices are made of
(colad/core/slices.py names the pools and devices), with the reason colad knows as the message. No I/O.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from colad.core.devices import Device, DeviceSet
from colad.core.slices import reported_names

TYPE_CHECKING = False  # typing is not loaded at run time: docs/DEVELOPING.md, "Import cost"
if TYPE_CHECKING:
    from typing import Final

# kubernetes/kubelet pkg/apis/dra-health/v1/api.proto DeviceHealth.message: at most 1024 characters; a
# longer one is cut to 1021 characters with "..." appended.
MAX_MESSAGE_LENGTH: Final = 1024
ELLIPSIS: Final = "..."
# The message of an Unhealthy device whose file says so and nothing else does.
DECLARED_UNHEALTHY: Final = "its device file declares it Unhealthy"


def health_message(text: str) -> str:
    """`text` as a DeviceHealth message: valid UTF-8 (protobuf refuses anything else), cut as upstream cuts."""
    text = text.encode("utf-8", "replace").decode("utf-8")
    if len(text) <= MAX_MESSAGE_LENGTH:
        return text
    return text[: MAX_MESSAGE_LENGTH - len(ELLIPSIS)] + ELLIPSIS


def health_reason(device: Device) -> str:
    """Why `device` is Unhealthy as colad knows it ("" for a Healthy one): a malformed file's problem,
    discovery's reason (a missing host path, a probe's first line), else the file's own word."""
    if device.healthy:
        return ""
    return device.problem or device.reason or DECLARED_UNHEALTHY


@dataclass(frozen=True, order=True)
class ReportedHealth:
    """One device in a NodeWatchResourcesResponse: its pool and name as the slices publish them."""

    pool: str
    device: str
    healthy: bool
    message: str = ""


def health_report(device_sets: Mapping[str, DeviceSet], pools: Mapping[str, str]) -> tuple[ReportedHealth, ...]:
    """Every device of every resource in `pools` (resource -> pool name), sorted: a complete list, as the
    kubelet wants each response to be. A resource without a device set yet has no devices."""
    report = []
    for resource, pool in pools.items():
        devices = device_sets.get(resource)
        if devices is None:
            continue
        names = reported_names(devices)
        for device in devices:
            message = health_message(health_reason(device))
            report.append(ReportedHealth(pool, names[device.device_id], device.healthy, message))
    return tuple(sorted(report))
