"""Per-resource scanning for `colad discovery`: one device directory as a held set of devices.

Reads: the directory's listing and files (devicedir.py, devices.py), and each device's host
paths and probe verdict (DeviceHealth, the resource's health overlay). Writes nothing: a full
re-list gives a ScanOutcome, a rescan of named files a Moved (what came, what went, the size
change); colad/discovery/main.py fits and publishes them as DeviceSnapshots and DeviceDeltas (snapshots.py).
"""

from __future__ import annotations

import errno
import functools
import os
import time
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, replace

import pyinotify

from colad.config.config import Resource
from colad.core import devices, namemap, trust
from colad.core.constants import MAX_DEVICE_ID_LENGTH, UNHEALTHY
from colad.core.devices import Device
from colad.discovery import hostpaths
from colad.discovery.devicedir import Cached as _Cached
from colad.discovery.devicedir import is_regular_file, list_regular_files, read_device
from colad.jobs.probes import PENDING, Probe, ProbeResult, ProbeRunner
from colad.queue import device_wire
from colad.runtime import log
from colad.runtime.pathtrust import directory_problem
from colad.watchers import loop
from colad.watchers.inotify import Inotify

# The role's logger: its lines (and the tests matching them) stay those of discovery.
LOG = log.get(__name__)

DEVICE_EVENTS = (
    pyinotify.IN_CREATE
    | pyinotify.IN_DELETE
    | pyinotify.IN_MOVED_FROM
    | pyinotify.IN_MOVED_TO
    | pyinotify.IN_CLOSE_WRITE
    | pyinotify.IN_ATTRIB
    | pyinotify.IN_DELETE_SELF
    | pyinotify.IN_MOVE_SELF
)


# A parse slower than this is logged: the pre-scan in devicefile.py should make it impossible.
SLOW_READ_S = 0.25


@dataclass(frozen=True)
class ScanOutcome:
    """What a full re-list of the directory found: its devices (health applied), its problems, and
    whether it could be listed, when its racy entries settle, which reads were slow."""

    devices: devices.DeviceSet
    present: bool
    problems: dict[str, str]  # skipped or malformed name -> its problem
    unusable: str | None = None  # why the directory could not be listed ("ELOOP: Too many levels...")
    settles_in: float | None = None  # seconds until the racy entries can be trusted
    slow: tuple[tuple[str, float], ...] = ()  # (name, seconds) of slow reads
    sizes: dict[str, int] = field(default_factory=dict)  # each device's wire size, as advertised


@dataclass
class Moved:
    """What a rescan of some names found changed: `came` (sorted by ID) added or changed, `gone` what they
    replaced or what left, `removed` the IDs that left (sorted); `size` the change in their wire sizes."""

    problems: dict[str, str]  # every problem now: the names rescanned updated
    names: list[str]  # the names rescanned, sorted
    came: list[Device] = field(default_factory=list)
    gone: list[Device] = field(default_factory=list)
    removed: list[str] = field(default_factory=list)
    size: int = 0
    slow: list[tuple[str, float]] = field(default_factory=list)


def _held(before: Device | None, device: Device) -> Device:
    """`before` when `device` equals it: the object the published set holds, rather than an equal copy
    (the health overlay makes a new one at every look)."""
    return before if before is not None and before is not device and before == device else device


def _size(known: _Cached | None, device: Device) -> int:
    """The wire size of `device` as advertised: its read's when the health overlay left it as read."""
    return known.size if known is not None and known.device is device else device_wire.device_wire_size(device)


class DeviceHealth:
    """One resource's health overlay: a device as read, made Unhealthy with the reason on it
    (Device.reason, on the wire) where a required host path is missing or its probe fails;
    missing optional entries left out.

    Per device it keeps the reason, the directories to watch and the probe to run, so a
    change costs only the devices it touches. `notes` are the reason changes to log and count.
    """

    def __init__(
        self,
        resource: Resource,
        check_paths: bool,
        runner: ProbeRunner | None,
        trusted: frozenset[int] = trust.ROOT_ONLY,
    ) -> None:
        self.resource = resource
        self.check_paths = check_paths
        self.trusted = trusted
        self.runner = runner
        self.reasons: dict[str, str] = {}
        self.dirs: dict[str, frozenset[str]] = {}  # device ID -> the directories its host paths need watched
        self.probes: dict[str, Probe] = {}  # device ID -> its probe
        self.notes: list[tuple[str, str, str]] = []  # (device ID, reason before, reason now)
        self.dir_refs: Counter[str] = Counter()
        self.dirs_changed = False
        self.probes_changed = False

    def key(self, device_id: str) -> str:
        return namemap.cdi_device_name(self.resource.name, device_id)

    def probe_of(self, raw: Device) -> Probe | None:
        own = getattr(raw, "probe", None)  # the device file's override: None = the resource's, () = none
        command = tuple(self.resource.probe) if own is None else own
        if not command or raw.problem or self.runner is None:
            return None
        env = (("COLA_DEVICE_ID", raw.device_id), ("COLA_RESOURCE_NAME", self.resource.name))
        return Probe(command, self.resource.probe_timeout, self.resource.probe_interval, env)

    def advertise(self, raw: Device) -> Device:
        """`raw` as the kubelet should see it now."""
        device_id, device, reason = raw.device_id, raw, ""
        dirs: frozenset[str] = frozenset()
        if raw.device_nodes or raw.mounts:  # trusted always; present only with host_path_check
            only_trust = None if self.check_paths else functools.partial(hostpaths.trust_path, trusted=self.trusted)
            checked = hostpaths.check(devices.DeviceSet((raw,)), only_trust, self.trusted)
            device, dirs = checked.devices.devices[0], checked.watch_dirs
            reason = checked.reasons[0][1] if checked.reasons else ""
        if dirs != self.dirs.get(device_id, frozenset()):
            self._set_dirs(device_id, dirs)
        probe = self.probe_of(raw)
        if probe != self.probes.get(device_id):
            self.probes_changed = True
            if probe is None:
                del self.probes[device_id]
            else:
                self.probes[device_id] = probe
        if probe is not None and self.runner is not None:
            verdict = self.runner.verdict(self.key(device_id)) or ProbeResult(False, PENDING)
            if not verdict.healthy:
                reason = reason or f"probe {os.path.basename(probe.command[0])}: {verdict.reason}"
        reason = devices.clip_reason(reason) if reason else ""
        if reason and not device.problem:  # the plugin's state file and `colad status` show it
            device = replace(device, health=UNHEALTHY, reason=reason)
        self._set_reason(device_id, reason)
        return device

    def forget(self, device_id: str) -> None:
        """`device_id` left the directory."""
        if device_id in self.dirs:
            self._set_dirs(device_id, frozenset())
        if self.probes.pop(device_id, None) is not None:
            self.probes_changed = True
        self._set_reason(device_id, "")

    def forget_all_but(self, ids: set[str]) -> None:
        for device_id in [i for i in {*self.dirs, *self.probes, *self.reasons} if i not in ids]:
            self.forget(device_id)

    @property
    def watched(self) -> list[str]:
        """The devices whose verdict a host-path event can change."""
        return sorted(self.dirs)

    def _set_dirs(self, device_id: str, dirs: frozenset[str]) -> None:
        self.dir_refs.subtract(self.dirs.pop(device_id, frozenset()))
        if dirs:
            self.dirs[device_id] = dirs
            self.dir_refs.update(dirs)
        self.dirs_changed = True

    def _set_reason(self, device_id: str, reason: str) -> None:
        before = self.reasons.get(device_id, "")
        if reason != before:
            self.notes.append((device_id, before, reason))
            if reason:
                self.reasons[device_id] = reason
            else:
                del self.reasons[device_id]


class ResourceWatch:
    """One resource's device directory: its watch, its files' parsed devices, its last snapshot."""

    def __init__(
        self,
        inotify: Inotify,
        resource: Resource,
        health: DeviceHealth | None = None,
        trusted: frozenset[int] = trust.ROOT_ONLY,
    ) -> None:
        self.resource = resource
        self.trusted_uids = trusted  # whose device files and directories are honoured (trust.py)
        self.health = health or DeviceHealth(resource, False, None)
        self.shown: dict[str, Device] = {}  # what is advertised per ID of the last scan (health applied)
        self.dir = loop.DirWatch(inotify, resource.device_dir, DEVICE_EVENTS)
        self.current: devices.DeviceSet | None = None
        self.seq = 0  # the seq `current` was published with: the base of the next delta
        self.digest: int | None = None  # device_wire.set_digest(current), from the first delta on
        self.present: bool | None = None
        self.warned: dict[str, str] = {}  # name -> the problem last logged for it
        self.cache: dict[str, _Cached] = {}
        self.unusable: str | None = None  # why the directory could not be listed last time
        self.cut: tuple[tuple[str, ...], tuple[str, ...]] = ((), ())  # the last fit's (demoted, dropped)
        self.ids: tuple[str, ...] = ()  # current's IDs, for bisect
        self.size = 0  # the exact encoded size of the last fitted snapshot (its seq the widest)
        self.unhealthy = 0  # current.count(UNHEALTHY)
        self.racy: dict[str, int] = {}  # name -> settles_ns of the cache entries not trusted yet
        self.follow_up: float | None = None  # monotonic time of a rescan that racy entries or a retry need
        self.pending: set[str] = set()  # names events gave, not rescanned yet
        self.pending_whole = False  # an event named no file in the directory: list it again
        self.retry_whole = False  # a rescan failed: its retry (follow_up) stats every file
        # Longest file name that still leaves room for the replica suffix "::<n>".
        suffix = len(f"{devices.REPLICA_SEPARATOR}{resource.replicas - 1}") if resource.replicas > 1 else 0
        self.max_id = MAX_DEVICE_ID_LENGTH - suffix

    def note(self, name: str | None) -> None:
        """An event named `name` in the directory (None: named no file in it)."""
        if name is None:
            self.pending_whole = True
        else:
            self.pending.add(name)

    @property
    def due(self) -> bool:
        """Are there changes to rescan?"""
        return bool(self.pending) or self.pending_whole

    def take_pending(self) -> tuple[set[str], bool]:
        """The names to rescan and whether to list the directory."""
        names, whole = self.pending, self.pending_whole
        self.pending, self.pending_whole = set(), False
        return names, whole

    def scan(self, dirty: set[str] | None, *, clock: Callable[[], float] = time.monotonic) -> ScanOutcome:
        """List the directory and build its devices; only `dirty` names (None: all) are stat()ed again.

        Racy entries are always read again. A directory that cannot be listed, or that
        trust.py's rule refuses (it or a directory on the way to it), keeps the last devices,
        each Unhealthy with the reason (and its cache); nothing new is read from it.
        """
        untrusted = self.untrusted()
        if untrusted is not None:
            return self._refuse(untrusted, untrusted)
        try:
            names, present = list_regular_files(self.dir.path)
        except OSError as exc:
            code = errno.errorcode.get(exc.errno or 0, str(exc.errno))
            return self._refuse(f"device directory unusable: {code} {exc.strerror}", f"{code}: {exc.strerror}")
        # Not devices.build(names): its Device per name would be made to be dropped (10,000 objects).
        ids, problems = devices.valid_ids(names)
        found: list[Device] = []
        cache: dict[str, _Cached] = {}
        sizes: dict[str, int] = {}
        shown: dict[str, Device] = {}
        slow: list[tuple[str, float]] = []
        settles: list[int] = []
        for device_id in ids:
            if len(device_id) > self.max_id:
                problems[device_id] = f"longer than {self.max_id} characters (room for the replica suffix)"
                continue
            known = self.cache.get(device_id)
            if known is None or not known.trusted or dirty is None or device_id in dirty:
                started = clock()
                path = os.path.join(self.dir.path, device_id)
                known = read_device(device_id, path, known, trusted=self.trusted_uids)
                took = clock() - started
                if took > SLOW_READ_S:
                    slow.append((device_id, took))
            if known is None:
                continue
            cache[device_id] = known
            device = self.health.advertise(known.device)
            sizes[device_id] = known.size if device is known.device else device_wire.device_wire_size(device)
            device = shown[device_id] = _held(self.shown.get(device_id), device)
            found.append(device)
            if known.settles_ns is not None:
                settles.append(known.settles_ns)
            if known.device.problem:
                problems[device_id] = known.device.problem
        self.cache, self.shown = cache, shown  # no sizes kept: a cache entry's, or measured (200 KiB at 10,000)
        self.health.forget_all_but(set(cache))
        self.racy = {i: c.settles_ns for i, c in cache.items() if c.settles_ns is not None}
        found_set = devices.DeviceSet.of(found)
        return ScanOutcome(found_set, present, problems, settles_in=self.settles_in(), slow=tuple(slow), sizes=sizes)

    def untrusted(self) -> str | None:
        """Why the device directory or one on the way to it is not trusted now, or None (a few lstats)."""
        return directory_problem(self.resource.device_dir, self.trusted_uids)

    def _refuse(self, problem: str, unusable: str) -> ScanOutcome:
        problem = devices.clip_reason(problem)  # a path may be long: one bounded line
        kept = [Device(d.device_id, UNHEALTHY, problem=problem) for d in self.current or ()]
        self.shown = {}
        return ScanOutcome(devices.DeviceSet.of(kept), True, dict(self.warned), unusable=unusable)

    def settles_in(self) -> float | None:
        """Seconds until every racy entry can be trusted; None when none is racy."""
        return max(0.0, (max(self.racy.values()) - time.time_ns()) / 1e9) if self.racy else None

    @property
    def whole(self) -> bool:
        """Is `current` all of the directory as listed (listed, usable, nothing cut)? Then a rescan may
        read only the names the events gave."""
        return self.current is not None and self.present is True and self.unusable is None and self.cut == ((), ())

    def rescan_names(self, names: Iterable[str], *, clock: Callable[[], float] = time.monotonic) -> Moved:
        """Read again only `names` (what inotify named, or the racy entries): what changed against `current`.

        The level-triggered rule per name: whatever the events said, the file is
        looked at now; a name that is not a regular file is no device.
        """
        moved = Moved(problems=dict(self.warned), names=sorted(set(names)))
        for name in moved.names:
            moved.problems.pop(name, None)
            known, path = self.cache.get(name), os.path.join(self.dir.path, name)
            problem = devices.id_problem(name)
            if problem is None and len(name) > self.max_id:
                problem = f"longer than {self.max_id} characters (room for the replica suffix)"
            found = None
            if problem is not None:
                if is_regular_file(path):
                    moved.problems[name] = problem
            else:
                started = clock()
                found = read_device(name, path, known, trusted=self.trusted_uids)
                if clock() - started > SLOW_READ_S:
                    moved.slow.append((name, clock() - started))
            self.racy.pop(name, None)
            before = self.shown.get(name)
            before_size = 0 if before is None else _size(known, before)
            if found is None:
                if known is not None:
                    del self.cache[name]
                    self.health.forget(name)
                if before is not None:
                    del self.shown[name]
                    moved.removed.append(name)
                    moved.gone.append(before)
                    moved.size -= before_size
                continue
            device = _held(before, self.health.advertise(found.device))
            size = _size(found, device)
            self.cache[name], self.shown[name] = found, device
            if found.settles_ns is not None:
                self.racy[name] = found.settles_ns
            if found.device.problem:
                moved.problems[name] = found.device.problem
            if before is not device:
                moved.came.append(device)
                moved.size += size
                if before is not None:
                    moved.gone.append(before)
                    moved.size -= before_size
        if not self.racy:
            self.racy = {}  # a dict keeps its table when emptied: 200 KiB after a 10,000-file burst settles
        return moved

    def report(self, problems: dict[str, str], names: Iterable[str] | None = None) -> dict[str, int]:
        """Log what changed in this scan's problems (once per problem, again if it comes back later).

        Only `names` (None: all) can have changed. Returns the counts to add: names newly
        skipped as not valid IDs (`input.bad_name`), files newly refused as untrusted.
        """
        skipped = refused = 0
        for name in sorted(problems) if names is None else [n for n in names if n in problems]:
            problem = problems[name]
            if self.warned.get(name) != problem:
                if name in self.cache and problem.startswith(trust.UNTRUSTED):
                    refused += 1
                    LOG.warning(
                        "device file untrusted: its content is ignored and the device is Unhealthy",
                        resource=self.resource.name,
                        device=name,
                        reason=problem[len(trust.UNTRUSTED) :],
                    )
                elif name in self.cache:
                    LOG.warning(
                        "device file malformed: device is Unhealthy",
                        resource=self.resource.name,
                        device=name,
                        reason=problem,
                    )
                else:
                    skipped += 1
                    LOG.warning(
                        "file skipped: not a valid device ID", resource=self.resource.name, name=name, reason=problem
                    )
        for name in sorted(self.warned.keys() - problems.keys()):
            if name in self.cache:
                LOG.info("device file valid again", resource=self.resource.name, device=name)
        self.warned = problems  # a problem that goes and comes back is logged again
        return {"input.bad_name": skipped, **({"input.untrusted_file": refused} if refused else {})}
