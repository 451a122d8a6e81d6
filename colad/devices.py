"""The pure device core: device IDs, immutable device sets, scan results and diffs.

Discovery hands in the names it listed; this module decides which are devices
and returns values. No I/O, no logging, no clock: the shells do that.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

from colad.constants import HEALTHY, MAX_DEVICE_ID_LENGTH, UNHEALTHY

# A device ID must be safe for the kubelet (valid UTF-8, at most 63 characters,
# stable) and for the value of COLA_DEVICES, a comma-separated env list. So:
# ASCII letters and digits, then also '.', '_' and '-', 1 to 63 characters,
# starting with a letter or digit. This leaves out dotfiles (hidden files and
# editor swap files), backup files ending in '~', '#autosave#' files, names
# with spaces, commas, '=' or control characters, and non-UTF-8 names.
_DEVICE_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*\Z")
HEALTH_VALUES = (HEALTHY, UNHEALTHY)


def id_problem(name: str) -> str | None:
    """Why `name` cannot be a device ID, or None when it can."""
    if not name:
        return "empty name"
    if len(name) > MAX_DEVICE_ID_LENGTH:
        return f"longer than {MAX_DEVICE_ID_LENGTH} characters"
    if name.startswith("."):
        return "hidden file"
    if not _DEVICE_ID.match(name):
        return "characters other than A-Z a-z 0-9 . _ - (or not starting with a letter or digit)"
    return None


@dataclass(frozen=True, order=True)
class Device:
    device_id: str
    health: str = HEALTHY

    @property
    def healthy(self) -> bool:
        return self.health == HEALTHY


@dataclass(frozen=True)
class DeviceSet:
    """An immutable set of devices, ordered by ID."""

    devices: tuple[Device, ...] = ()

    @staticmethod
    def of(devices: Iterable[Device]) -> DeviceSet:
        by_id = {d.device_id: d for d in devices}
        return DeviceSet(tuple(by_id[k] for k in sorted(by_id)))

    def __len__(self) -> int:
        return len(self.devices)

    def __iter__(self) -> Iterator[Device]:
        return iter(self.devices)

    def __contains__(self, device_id: object) -> bool:
        return device_id in self.by_id

    @property
    def by_id(self) -> dict[str, Device]:
        # Cached on the frozen instance: sets are built once and read often.
        cached = self.__dict__.get("_by_id")
        if cached is None:
            cached = {d.device_id: d for d in self.devices}
            object.__setattr__(self, "_by_id", cached)
        return cached

    def get(self, device_id: str) -> Device | None:
        return self.by_id.get(device_id)

    @property
    def ids(self) -> tuple[str, ...]:
        return tuple(d.device_id for d in self.devices)

    def count(self, health: str) -> int:
        return sum(1 for d in self.devices if d.health == health)


@dataclass(frozen=True)
class SkippedName:
    name: str
    reason: str


@dataclass(frozen=True)
class ScanResult:
    devices: DeviceSet
    skipped: tuple[SkippedName, ...] = ()


def build(names: Iterable[str]) -> ScanResult:
    """Turn the regular-file names found in the device directory into a ScanResult."""
    devices: list[Device] = []
    skipped: list[SkippedName] = []
    for name in sorted(set(names)):
        problem = id_problem(name)
        if problem is None:
            devices.append(Device(name))
        else:
            skipped.append(SkippedName(name, problem))
    return ScanResult(DeviceSet.of(devices), tuple(skipped))


@dataclass(frozen=True)
class DeviceDiff:
    added: tuple[str, ...] = ()
    removed: tuple[str, ...] = ()
    changed: tuple[str, ...] = ()

    def __bool__(self) -> bool:
        return bool(self.added or self.removed or self.changed)


def diff(old: DeviceSet, new: DeviceSet) -> DeviceDiff:
    """What changed from `old` to `new`: IDs added, removed, or with a new health."""
    old_ids, new_ids = old.by_id, new.by_id
    return DeviceDiff(
        added=tuple(sorted(new_ids.keys() - old_ids.keys())),
        removed=tuple(sorted(old_ids.keys() - new_ids.keys())),
        changed=tuple(sorted(k for k in new_ids.keys() & old_ids.keys() if new_ids[k] != old_ids[k])),
    )
