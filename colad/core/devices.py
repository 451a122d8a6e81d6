"""The pure device core: device IDs, the device model, device sets, skipped names and diffs.

Discovery hands in the names it listed (and devicefile.py the parsed files);
this module decides which are devices and what a valid device is (how one
crosses the local queue is messages.py's business). No I/O, no logging, no
clock: the shells do that.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, replace

from colad.core.constants import (
    HEALTHY,
    MAX_DEVICE_ID_LENGTH,
    MAX_DEVICE_LIST_ENTRIES,
    MAX_DEVICE_MAP_ENTRIES,
    MAX_NUMA_NODE,
    MAX_REPLICAS,
    UNHEALTHY,
)
from colad.core.device_rules import (
    annotation_key_problem,
    cdi_name_problem,
    command_problem,
    device_string_problem,
    env_name_problem,
    normalised_path_problem,
    show,
)

TYPE_CHECKING = False  # typing is not loaded at run time: docs/DEVELOPING.md, "Import cost"
if TYPE_CHECKING:
    from typing import Any, TypeVar

# A device ID must be safe for the kubelet (valid UTF-8, at most 63 characters,
# stable) and for the value of COLA_DEVICES, a comma-separated env list. So:
# ASCII letters and digits, then also '.', '_' and '-', 1 to 63 characters,
# starting with a letter or digit. This leaves out dotfiles (hidden files and
# editor swap files), backup files ending in '~', '#autosave#' files, names
# with spaces, commas, '=' or control characters, and non-UTF-8 names.
_DEVICE_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*\Z")
HEALTH_VALUES = (HEALTHY, UNHEALTHY)
if TYPE_CHECKING:
    _T = TypeVar("_T")

# Replica IDs are "<id>::<n>". ':' is never allowed in a file name ID, so a
# replica ID cannot clash with a device file, and it is a pure function of the
# file name and n, so it is stable across restarts (the kubelet's checkpoint
# still matches).
REPLICA_SEPARATOR = "::"

# Permissions of a device node (cgroup device rules), in canonical order.
PERMISSIONS = ("r", "w", "m", "rw", "rm", "wm", "rwm")


# A reason is one line for a log, the state file and `colad status` (a probe's first line of output,
# a missing path): 512 bytes keeps it readable and bounds what the queue and the state file carry.
MAX_REASON_BYTES = 512


def clip_reason(text: str) -> str:
    """`text` as a reason: its first line, at most MAX_REASON_BYTES of UTF-8 (cut at a character)."""
    line = text.split("\n", 1)[0].replace("\x00", "")
    data = line.encode("utf-8", "replace")
    if len(data) <= MAX_REASON_BYTES:
        return data.decode("utf-8")
    return data[: MAX_REASON_BYTES - 3].decode("utf-8", "ignore") + "..."


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


# The longest replica index: MAX_REPLICAS - 1 ("::999").
_MAX_INDEX_DIGITS = len(str(MAX_REPLICAS - 1))


def request_id_problem(device_id: str) -> str | None:
    """Why an ID a request names cannot be one colad advertises, or None when it can.

    An advertised ID is a device ID or a replica ID "<id>::<n>" (n a canonical decimal below
    MAX_REPLICAS). Whether the device exists is the caller's question; this bounds the shape, so
    nothing beyond it (sorting, logging, a CDI name) meets an ID of any other length or alphabet.
    """
    base, separator, index = device_id.partition(REPLICA_SEPARATOR)
    problem = id_problem(base)
    if problem is not None:
        return f"not a device ID: {problem}"
    if separator and not (
        0 < len(index) <= _MAX_INDEX_DIGITS
        and index.isascii()
        and index.isdigit()
        and (index == "0" or index[0] != "0")
        and int(index) < MAX_REPLICAS
    ):
        return f"replica index is not a whole number from 0 to {MAX_REPLICAS - 1}"
    return None


@dataclass(frozen=True, order=True)
class DeviceNode:
    """A host device node exposed to the container (v1beta1 DeviceSpec)."""

    host_path: str
    container_path: str
    permissions: str = "rw"  # one of PERMISSIONS
    # Left out (not Unhealthy) when the host path is missing (hostpaths.py); not on the queue.
    optional: bool = False


@dataclass(frozen=True, order=True)
class Mount:
    """A host path mounted into the container (v1beta1 Mount)."""

    host_path: str
    container_path: str
    read_only: bool = True
    optional: bool = False  # as DeviceNode.optional


class _Kept:
    """What other modules keep on a Device outside its fields (never compared, hashed or encoded):
    slots, so that a Device has no __dict__ (176 -> 152 bytes, and no 64-byte dict made by a read)."""

    __slots__ = ("_colad_replicas", "_cdi_encoded", "_colad_list_entry")  # devices, cdi, device_list


@dataclass(frozen=True, order=True, slots=True)
class Device(_Kept):
    """One advertised device and what a container that gets it receives.

    `problem` says why a device file is malformed (the device is then Unhealthy
    and every other field is empty); it is "" for a well-formed file, also for
    one that declares `health = "Unhealthy"`. `reason` says why discovery made a
    well-formed device Unhealthy (a missing host path, a failing probe); "" otherwise.
    """

    device_id: str
    health: str = HEALTHY
    numa_nodes: tuple[int, ...] = ()  # sorted, unique, each 0..MAX_NUMA_NODE
    device_nodes: tuple[DeviceNode, ...] = ()
    mounts: tuple[Mount, ...] = ()
    envs: tuple[tuple[str, str], ...] = ()  # sorted by key
    annotations: tuple[tuple[str, str], ...] = ()  # sorted by key
    cdi_devices: tuple[str, ...] = ()  # fully qualified CDI names vendor.com/class=name
    problem: str = ""
    reason: str = ""  # only on an Unhealthy, well-formed device; bounded by MAX_REASON_BYTES
    # The device file's own probe / prepare command: None = the resource's, () = none for this
    # device. The probe is discovery's alone and never on the queue (left out of `bare`); the
    # prepare crosses it to the plugin's PreStartContainer (prestart.plan), which honours it only
    # on a resource with a prepare of its own (only those register with pre_start_required).
    probe: tuple[str, ...] | None = None
    prepare: tuple[str, ...] | None = None

    @property
    def healthy(self) -> bool:
        return self.health == HEALTHY

    @property
    def bare(self) -> bool:
        """Only an ID and a health: a device file with no content, on the wire.

        The local-only fields (probe, an entry's `optional`) do not count: the queue's
        encoding of a bare device must be the same on both ends.
        """
        # Field by field, not replace() and ==: this is on the path of every device's wire entry
        # (ten times faster at 226,600 devices); test_devices checks that every field is named.
        return not (
            self.numa_nodes
            or self.device_nodes
            or self.mounts
            or self.envs
            or self.annotations
            or self.cdi_devices
            or self.problem
            or self.reason
            or self.prepare is not None
        )


def base_id(device_id: str) -> str:
    """The physical device ID of a replica ID ("cola1::3" -> "cola1"); other IDs unchanged."""
    return device_id.split(REPLICA_SEPARATOR, 1)[0]


def replica_id(device_id: str, n: int) -> str:
    """The ID of replica `n` of device `device_id` ("cola1", 3 -> "cola1::3")."""
    return f"{device_id}{REPLICA_SEPARATOR}{n}"


def replica_suffix_length(replicas: int) -> int:
    """Characters the longest replica ID adds to its device ID ("::<replicas - 1>"); 0 when not shared."""
    return len(replica_id("", replicas - 1)) if replicas > 1 else 0


_REPLICAS = "_colad_replicas"  # kept on a frozen Device outside its fields: never compared, hashed or encoded


def replicate(devices: DeviceSet, replicas: int) -> DeviceSet:
    """Each device as `replicas` devices "<id>::0" .. "<id>::<replicas-1>" with the same fields.

    replicas <= 1 returns `devices` unchanged.
    """
    if replicas <= 1:
        return devices
    return DeviceSet.of(r for d in devices for r in replicas_of(d, replicas))


def replicas_of(device: Device, replicas: int) -> tuple[Device, ...]:
    """replicate()'s replicas of one device, kept on it: the next change reuses them, and with them
    what the ListAndWatch encoding (device_list) and the CDI spec (cdi) cached on each replica."""
    cached: tuple[int, tuple[Device, ...]] | None = getattr(device, _REPLICAS, None)  # not __dict__ (cdi.py)
    if cached is None or cached[0] != replicas:
        made = tuple(replace(device, device_id=replica_id(device.device_id, n)) for n in range(replicas))
        cached = (replicas, made)
        object.__setattr__(device, _REPLICAS, cached)
    return cached[1]


# --- validation ----------------------------------------------------------------------------


def device_problem(device: Device) -> str | None:
    """Why the fields of `device` (all but the ID) are not valid, or None; the text names the field.

    Assumes the field types are right (the callers check types while building).
    Also refuses two entries for one container path: such a device could never
    be allocated.
    """
    if device.health not in HEALTH_VALUES:
        return f"health {show(device.health)} is not one of {', '.join(HEALTH_VALUES)}"
    if device.problem:
        if device != Device(device.device_id, UNHEALTHY, problem=device.problem):
            return "problem: a malformed device must be Unhealthy and carry nothing else"
        problem = device_string_problem(device.problem)
        return None if problem is None else f"problem {problem}"
    if device.reason:
        if device.healthy:
            return "reason: only an Unhealthy device carries one"
        problem = device_string_problem(device.reason)
        if problem is None and len(device.reason.encode("utf-8")) > MAX_REASON_BYTES:
            problem = f"is longer than {MAX_REASON_BYTES} bytes"
        if problem is None and "\n" in device.reason:
            problem = "is more than one line"
        if problem is not None:
            return f"reason {problem}"
    for key, count, limit in (
        ("numa_nodes", len(device.numa_nodes), MAX_DEVICE_LIST_ENTRIES),
        ("device_nodes", len(device.device_nodes), MAX_DEVICE_LIST_ENTRIES),
        ("mounts", len(device.mounts), MAX_DEVICE_LIST_ENTRIES),
        ("cdi_devices", len(device.cdi_devices), MAX_DEVICE_LIST_ENTRIES),
        ("envs", len(device.envs), MAX_DEVICE_MAP_ENTRIES),
        ("annotations", len(device.annotations), MAX_DEVICE_MAP_ENTRIES),
    ):
        if count > limit:
            return f"{key} has more than {limit} entries"
    for node in device.numa_nodes:
        if not 0 <= node <= MAX_NUMA_NODE:
            return f"numa_nodes: {node} is not in 0..{MAX_NUMA_NODE}"
    if list(device.numa_nodes) != sorted(set(device.numa_nodes)):
        return "numa_nodes are not sorted and unique"
    seen: dict[str, str] = {}  # container path -> the key that claimed it
    entries: list[tuple[str, str, str]] = [
        (f"device_nodes[{i}]", n.host_path, n.container_path) for i, n in enumerate(device.device_nodes)
    ] + [(f"mounts[{i}]", m.host_path, m.container_path) for i, m in enumerate(device.mounts)]
    for key, host_path, container_path in entries:
        for suffix, path in (("host_path", host_path), ("container_path", container_path)):
            problem = normalised_path_problem(path)
            if problem is not None:
                return f"{key}.{suffix} {problem}"
        if container_path in seen:
            return f"{key}.container_path {show(container_path)} is already used by {seen[container_path]}"
        seen[container_path] = key
    for key, command in (("probe", device.probe), ("prepare", device.prepare)):
        if command is not None and (problem := command_problem(command)) is not None:
            return f"{key} {problem}"
    for i, dn in enumerate(device.device_nodes):
        if dn.permissions not in PERMISSIONS:
            return f"device_nodes[{i}].permissions {show(dn.permissions)} is not a non-empty combination of r, w, m"
    for i, name in enumerate(device.cdi_devices):
        problem = cdi_name_problem(name)
        if problem is not None:
            return f"cdi_devices[{i}] {problem}"
        if name in device.cdi_devices[:i]:
            return f"cdi_devices[{i}] {show(name)} is listed twice"
    for table, pairs, key_problem in (
        ("envs", device.envs, env_name_problem),
        ("annotations", device.annotations, annotation_key_problem),
    ):
        keys = [k for k, _ in pairs]
        if keys != sorted(set(keys)):
            return f"{table} keys are not sorted and unique"
        for key, value in pairs:
            problem = key_problem(key)
            if problem is not None:
                return f"{table}: {problem}"
            problem = device_string_problem(value)
            if problem is not None:
                return f"{table}.{key} value {problem}"
    return None


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

    def memo(self, key: str, build: Callable[[DeviceSet], _T]) -> _T:
        """build(self), computed once per set (as by_id): a view of a set held and published often."""
        name = f"_memo_{key}"
        if name not in self.__dict__:
            object.__setattr__(self, name, build(self))
        value: _T = self.__dict__[name]
        return value

    def remember(self, key: str, value: object) -> None:
        """Set memo(key) to `value`: the caller knows it without a pass over the set (a delta's counts)."""
        object.__setattr__(self, f"_memo_{key}", value)

    def known(self, key: str) -> Any:
        """memo(key) if it was made or remembered, else None: never computed here."""
        return self.__dict__.get(f"_memo_{key}")

    @property
    def ids(self) -> tuple[str, ...]:
        return tuple(d.device_id for d in self.devices)

    def count(self, health: str) -> int:
        return sum(1 for d in self.devices if d.health == health)


@dataclass(frozen=True)
class SkippedName:
    """A name in a watched directory that is not a device (or a device file refused), and why."""

    name: str
    reason: str


def valid_ids(names: Iterable[str]) -> tuple[list[str], dict[str, str]]:
    """The names that are device IDs, sorted and once each, and why each other name is not one."""
    ids: list[str] = []
    problems: dict[str, str] = {}
    for name in sorted(set(names)):
        problem = id_problem(name)
        if problem is None:
            ids.append(name)
        else:
            problems[name] = problem
    return ids, problems


@dataclass(frozen=True)
class DeviceDiff:
    """The IDs that came, went, or changed between two device sets (see diff); false when none did."""

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
