"""Role `colad discovery`: turns each resource's device directory into DeviceSnapshots on the queue.

Reads: each resource's device directory (inotify, a periodic safety rescan) and its files
(devicedir.py). Writes, over the local queue to the plugin (plugin.py owns it): a full
DeviceSnapshot after every (re)connect, then what changed as a DeviceDelta (snapshots.py).
Level-triggered: an event that names files reads those files again and moves them in the held
set (O(change)); any other event, an overflow, the timer or a reload re-list the directory.
Each device as read gets its host-path health and probe verdict (DeviceHealth); each change
rewrites the resource's CDI spec and the NFD feature file.
"""

from __future__ import annotations

import errno
import functools
import os
import time
import traceback
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta

import pyinotify

from colad import cdi, devices, hostpaths, log, messages, nfd, snapshots, watch
from colad import config as config_mod
from colad.config import Config, Resource
from colad.constants import MAX_DEVICE_ID_LENGTH, UNHEALTHY
from colad.devicedir import RACY_WINDOW_NS as RACY_WINDOW_NS
from colad.devicedir import Cached as _Cached
from colad.devicedir import is_regular_file, read_device
from colad.devicedir import list_regular_files as list_regular_files
from colad.devicedir import racy as racy
from colad.devices import Device
from colad.probes import PENDING, Probe, ProbeRunner, Verdict
from colad.queue import QueueClient
from colad.snapshots import TOO_LARGE as TOO_LARGE
from colad.snapshots import Fitted, fit_the_queue

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


# What can change a host path's verdict, watched on each path's nearest existing parent.
HOST_PATH_EVENTS = (
    pyinotify.IN_CREATE
    | pyinotify.IN_DELETE
    | pyinotify.IN_MOVED_FROM
    | pyinotify.IN_MOVED_TO
    | pyinotify.IN_ATTRIB
    | pyinotify.IN_DELETE_SELF
    | pyinotify.IN_MOVE_SELF
    | pyinotify.IN_ONLYDIR
)
# Every further ancestor: only its own move or removal (which no event below it would tell).
HOST_ANCESTOR_EVENTS = pyinotify.IN_DELETE_SELF | pyinotify.IN_MOVE_SELF | pyinotify.IN_ONLYDIR
# A directory that cannot be listed (ELOOP, EACCES, EIO...) may send no event when it heals.
UNUSABLE_RETRY_S = 2.0
# A parse slower than this is logged: the pre-scan in devicefile.py should make it impossible.
SLOW_READ_S = 0.25


@dataclass(frozen=True)
class ScanOutcome:
    devices: devices.DeviceSet
    present: bool
    problems: dict[str, str]  # skipped or malformed name -> its problem
    unusable: str | None = None  # why the directory could not be listed ("ELOOP: Too many levels...")
    settles_in: float | None = None  # seconds until the racy entries can be trusted
    slow: tuple[tuple[str, float], ...] = ()  # (name, seconds) of slow reads


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


class DeviceHealth:
    """One resource's health overlay: a device as read, made Unhealthy (with a reason) where a
    required host path is missing or its probe fails; missing optional entries left out.

    Per device it keeps the reason, the directories to watch and the probe to run, so a
    change costs only the devices it touches. `notes` are the reason changes to log and count.
    """

    def __init__(self, resource: Resource, check_paths: bool, runner: ProbeRunner | None) -> None:
        self.resource = resource
        self.check_paths = check_paths
        self.runner = runner
        self.reasons: dict[str, str] = {}
        self.dirs: dict[str, frozenset[str]] = {}  # device ID -> the directories its host paths need watched
        self.probes: dict[str, Probe] = {}  # device ID -> its probe
        self.notes: list[tuple[str, str, str]] = []  # (device ID, reason before, reason now)
        self.dir_refs: Counter[str] = Counter()
        self.dirs_changed = False
        self.probes_changed = False

    def key(self, device_id: str) -> str:
        return cdi.device_name(self.resource.name, device_id)

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
        if self.check_paths and (raw.device_nodes or raw.mounts):
            checked = hostpaths.check(devices.DeviceSet((raw,)))
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
            verdict = self.runner.verdict(self.key(device_id)) or Verdict(False, PENDING)
            if not verdict.healthy:
                reason = reason or f"probe {os.path.basename(probe.command[0])}: {verdict.reason}"
                device = replace(device, health=UNHEALTHY)
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

    def __init__(self, inotify: watch.Inotify, resource: Resource, health: DeviceHealth | None = None) -> None:
        self.resource = resource
        self.health = health or DeviceHealth(resource, False, None)
        self.shown: dict[str, Device] = {}  # what is advertised per ID of the last scan (health applied)
        self.dir = watch.DirWatch(inotify, resource.device_dir, DEVICE_EVENTS)
        self.current: devices.DeviceSet | None = None
        self.seq = 0  # the seq `current` was published with: the base of the next delta
        self.digest: int | None = None  # messages.set_digest(current), from the first delta on
        self.present: bool | None = None
        self.warned: dict[str, str] = {}  # name -> the problem last logged for it
        self.cache: dict[str, _Cached] = {}
        self.sizes: dict[str, int] = {}  # wire size of each device of the last scan, as advertised
        self.unusable: str | None = None  # why the directory could not be listed last time
        self.cut: tuple[tuple[str, ...], tuple[str, ...]] = ((), ())  # the last fit's (demoted, dropped)
        self.ids: tuple[str, ...] = ()  # current's IDs, for bisect
        self.size = 0  # the exact encoded size of the last fitted snapshot (its seq the widest)
        self.unhealthy = 0  # current.count(UNHEALTHY)
        self.racy: dict[str, int] = {}  # name -> settles_ns of the cache entries not trusted yet
        self.follow_up: float | None = None  # monotonic time of a rescan that racy entries or a retry need
        # Longest file name that still leaves room for the replica suffix "::<n>".
        suffix = len(f"{devices.REPLICA_SEPARATOR}{resource.replicas - 1}") if resource.replicas > 1 else 0
        self.max_id = MAX_DEVICE_ID_LENGTH - suffix

    def scan(self, dirty: set[str] | None, *, clock: Callable[[], float] = time.monotonic) -> ScanOutcome:
        """List the directory and build its devices; only `dirty` names (None: all) are stat()ed again.

        Racy entries are always read again. A directory that cannot be listed
        keeps the last devices, each Unhealthy with the reason (and its cache).
        """
        try:
            names, present = list_regular_files(self.resource.device_dir)
        except OSError as exc:
            code = errno.errorcode.get(exc.errno or 0, str(exc.errno))
            problem = f"device directory unusable: {code} {exc.strerror}"
            kept = [Device(d.device_id, UNHEALTHY, problem=problem) for d in self.current or ()]
            self.sizes, self.shown = {}, {}
            return ScanOutcome(devices.DeviceSet.of(kept), True, dict(self.warned), unusable=f"{code}: {exc.strerror}")
        result = devices.build(names)
        problems = {s.name: s.reason for s in result.skipped}
        found: list[Device] = []
        cache: dict[str, _Cached] = {}
        sizes: dict[str, int] = {}
        shown: dict[str, Device] = {}
        slow: list[tuple[str, float]] = []
        settles: list[int] = []
        for device_id in result.devices.ids:
            if len(device_id) > self.max_id:
                problems[device_id] = f"longer than {self.max_id} characters (room for the replica suffix)"
                continue
            known = self.cache.get(device_id)
            if known is None or not known.trusted or dirty is None or device_id in dirty:
                started = clock()
                known = read_device(device_id, os.path.join(self.resource.device_dir, device_id), known)
                took = clock() - started
                if took > SLOW_READ_S:
                    slow.append((device_id, took))
            if known is None:
                continue
            cache[device_id] = known
            device = shown[device_id] = self.health.advertise(known.device)
            sizes[device_id] = known.size if device is known.device else messages.device_wire_size(device)
            found.append(device)
            if known.settles_ns is not None:
                settles.append(known.settles_ns)
            if known.device.problem:
                problems[device_id] = known.device.problem
        self.cache, self.sizes, self.shown = cache, sizes, shown
        self.health.forget_all_but(set(cache))
        self.racy = {i: c.settles_ns for i, c in cache.items() if c.settles_ns is not None}
        found_set = devices.DeviceSet.of(found)
        return ScanOutcome(found_set, present, problems, settles_in=self.settles_in(), slow=tuple(slow))

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
            known, path = self.cache.get(name), os.path.join(self.resource.device_dir, name)
            problem = devices.id_problem(name)
            if problem is None and len(name) > self.max_id:
                problem = f"longer than {self.max_id} characters (room for the replica suffix)"
            found = None
            if problem is not None:
                if is_regular_file(path):
                    moved.problems[name] = problem
            else:
                started = clock()
                found = read_device(name, path, known)
                if clock() - started > SLOW_READ_S:
                    moved.slow.append((name, clock() - started))
            self.racy.pop(name, None)
            before, before_size = self.shown.get(name), self.sizes.get(name, 0)
            if found is None:
                if known is not None:
                    del self.cache[name]
                    self.health.forget(name)
                if before is not None:
                    del self.sizes[name], self.shown[name]
                    moved.removed.append(name)
                    moved.gone.append(before)
                    moved.size -= before_size
                continue
            device = self.health.advertise(found.device)
            size = found.size if device is found.device else messages.device_wire_size(device)
            self.cache[name], self.sizes[name], self.shown[name] = found, size, device
            if found.settles_ns is not None:
                self.racy[name] = found.settles_ns
            if found.device.problem:
                moved.problems[name] = found.device.problem
            if before is None or before != device:
                moved.came.append(device)
                moved.size += size
                if before is not None:
                    moved.gone.append(before)
                    moved.size -= before_size
        return moved

    def report(self, problems: dict[str, str], names: Iterable[str] | None = None) -> int:
        """Log what changed in this scan's problems (once per problem, again if it comes back later).

        Only `names` (None: all) can have changed. Returns how many names were newly skipped as not valid IDs.
        """
        skipped = 0
        for name in sorted(problems) if names is None else [n for n in names if n in problems]:
            problem = problems[name]
            if self.warned.get(name) != problem:
                if name in self.cache:
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
        return skipped


class Discovery(watch.WatcherLoop):
    def __init__(
        self,
        cfg: Config,
        *,
        client: QueueClient | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        super().__init__(cfg, "discovery", client=client)
        self.clock = clock
        self.runner = ProbeRunner(cfg.probe_max_in_flight)
        # Host-path watches in their own inotify: a shared one would merge them with the device
        # directories' watches (one wd per inode) and a removal would end both.
        self.host_inotify = watch.Inotify(self.stats.count)
        self.host_wds: dict[str, tuple[int, int]] = {}  # directory -> (wd, mask)
        self.spec_writer = cdi.SpecWriter(cfg.cdi_spec_dir) if cfg.cdi != "off" and cfg.cdi_spec_dir else None
        self.features = nfd.FeatureFileWriter(cfg.nfd_features_file) if cfg.nfd_features_file else None
        self.nfd_expires = ""  # the expiry-time the feature file carries until its next refresh
        self.nfd_refresh = 0.0
        self.nfd_dirty = False
        self.failed_writes: dict[str, str] = {}  # file -> the error last logged for it
        self.host_recheck = False  # a watch was added: look at the host paths again
        self.specs_dirty: set[str] = set()  # resources whose CDI spec is written at the end of this turn
        self.watches: dict[str, ResourceWatch] = {r.name: self._watch(r) for r in cfg.resources}
        self.next_rescan = 0.0

    def _watch(self, resource: Resource) -> ResourceWatch:
        return ResourceWatch(self.inotify, resource, DeviceHealth(resource, self.cfg.host_path_check, self.runner))

    @property
    def current(self) -> devices.DeviceSet | None:
        """The first resource's device set (the only one in a single-resource config)."""
        return next(iter(self.watches.values())).current

    def rescan(
        self, reason: str, watches: Iterable[ResourceWatch] | None = None, dirty: dict[str, set[str]] | None = None,
        whole: Iterable[str] = ("*",),
    ) -> None:  # fmt: skip
        """`reason` is one of start, inotify, overflow, periodic, directory, followup, hostpath, probe
        (a metrics label).

        `watches` (default: all) are listed again; `dirty` names the files, per
        resource, whose content may have changed (None: stat every file); a resource
        not in `whole` (default "*": all) has had only those files changed. The
        loop boundary of one resource: whatever its rescan raises is logged in
        one line and counted, and the resource is tried again soon.
        """
        self.stats.count(f"rescans.{reason}")
        LOG.debug("rescan", reason=reason)
        targets = list(self.watches.values()) if watches is None else list(watches)
        listed = set(whole)
        if watches is None:
            self.next_rescan = self.clock() + self.cfg.rescan_interval
        for rw in targets:
            try:
                name = rw.resource.name
                names = None if dirty is None else dirty.get(name, set())
                self._rescan_one(rw, reason, names, "*" in listed or name in listed)
            except Exception as exc:  # noqa: BLE001 - the loop boundary: one resource must not stop the others
                frame = traceback.extract_tb(exc.__traceback__)[-1]
                LOG.error(
                    "rescan failed; will retry",
                    resource=rw.resource.name,
                    device_dir=rw.resource.device_dir,
                    error=f"{type(exc).__name__}: {exc}",
                    at=f"{os.path.basename(frame.filename)}:{frame.lineno}",
                )
                self.stats.count("input.rescan_failed")
                rw.follow_up = self.clock() + UNUSABLE_RETRY_S
        if watches is None:  # the periodic pass also retries a spec or feature file that could not be written
            self.specs_dirty.update(rw.resource.name for rw in targets)
            self.nfd_dirty = self.features is not None
        self._after_scan(targets)

    def _after_scan(self, targets: Iterable[ResourceWatch]) -> None:
        """Log and count the health reasons that changed, follow the host paths' directories and
        the probes to run, write the feature file."""
        dirs = probes = False
        for rw in targets:
            health = rw.health
            for device_id, before, reason in health.notes:
                if reason and PENDING not in reason:
                    LOG.warning("device unhealthy", resource=rw.resource.name, device=device_id, reason=reason)
                    self.stats.count("health.probe" if reason.startswith("probe ") else "health.host_path")
                elif not reason and device_id in rw.shown and PENDING not in before:
                    LOG.info("device healthy again", resource=rw.resource.name, device=device_id, was=before)
                    self.stats.count("health.recovered")
            health.notes.clear()
            dirs, probes = dirs or health.dirs_changed, probes or health.probes_changed
            health.dirs_changed = health.probes_changed = False
        if dirs:
            self._sync_host_watches()
        if probes:
            wanted = {rw.health.key(i): p for rw in self.watches.values() for i, p in rw.health.probes.items()}
            self.runner.set_probes(wanted)

    def _write_outputs(self) -> None:
        """The CDI specs and the feature file of what changed this turn, once per turn: each is
        O(devices) to build (36 ms and 1.2 MB for 10,000), so a burst of changes costs one write."""
        for name in sorted(self.specs_dirty):
            if name in self.watches:
                self._write_spec(self.watches[name])
        self.specs_dirty.clear()
        if self.nfd_dirty:
            self._write_features()

    def _sync_host_watches(self) -> None:
        """Watch exactly the directories the devices' host paths need (at most MAX_WATCH_DIRS).

        Each path's nearest existing parent gets the name events; its further ancestors only
        their own move or removal (renaming /a moves /a/b/x away without an event in /a/b). A
        directory newly watched may have changed before its watch existed (mkdir -p): the
        devices are looked at again next turn, until the set of watches stops changing.
        """
        parents: set[str] = set()
        for rw in self.watches.values():
            parents.update(d for d, n in rw.health.dir_refs.items() if n > 0)
        masks: dict[str, int] = {}
        for path in parents:
            up = os.path.dirname(path)
            while up not in ("/", "") and up not in masks:
                masks[up] = HOST_ANCESTOR_EVENTS
                up = os.path.dirname(up)
        masks.update(dict.fromkeys(parents, HOST_PATH_EVENTS))
        keep = sorted(masks, key=lambda d: (d.count("/"), d))[: hostpaths.MAX_WATCH_DIRS]
        wanted = {path: masks[path] for path in keep}
        for path, (wd, mask) in list(self.host_wds.items()):
            if wanted.get(path) != mask:
                del self.host_wds[path]
                self.host_inotify.remove(wd)
        for path in sorted(wanted.keys() - self.host_wds.keys()):
            added = self.host_inotify.add(path, wanted[path])
            if added is not None:  # gone meanwhile: its event is on the way, or the periodic rescan sees it
                self.host_wds[path] = (added, wanted[path])
                self.host_recheck = True

    def _write_spec(self, rw: ResourceWatch) -> None:
        """The resource's CDI spec, one device per advertised ID (replicas included)."""
        if self.spec_writer is None or rw.current is None:
            return
        name, writer = rw.resource.name, self.spec_writer
        spec = cdi.build(name, devices.replicate(rw.current, rw.resource.replicas))
        self._write(f"cdi {name}", writer.path(name), lambda: writer.write(name, spec))

    def _remove_spec(self, name: str) -> None:
        if self.spec_writer is not None:
            self._write(f"cdi {name}", self.spec_writer.path(name), functools.partial(self.spec_writer.remove, name))

    def _write_features(self) -> None:
        """The NFD feature file; a new expiry-time every third of nfd_expiry."""
        if self.features is None:
            return
        self.nfd_dirty = False
        now = self.clock()
        if now >= self.nfd_refresh:
            expires = datetime.now(UTC) + timedelta(seconds=self.cfg.nfd_expiry)
            self.nfd_expires = expires.strftime("%Y-%m-%dT%H:%M:%SZ")
            self.nfd_refresh = now + self.cfg.nfd_expiry / 3
        sets = [(rw.resource.name, rw.current or devices.DeviceSet()) for rw in self.watches.values()]
        data = nfd.render(sets, self.cfg.nfd_label_prefix, self.nfd_expires)
        features = self.features
        self._write("nfd", features.path, lambda: features.write(data))

    def _write(self, what: str, path: str, write: Callable[[], object]) -> None:
        """One line (and one count) when writing `what` starts failing or fails differently, one when it works again."""
        try:
            write()
        except OSError as exc:
            error = f"{errno.errorcode.get(exc.errno or 0, str(exc.errno))}: {exc.strerror}"
            if self.failed_writes.get(what) != error:
                LOG.error("cannot write file; retried at the next change or rescan", file=what, path=path, error=error)
                self.stats.count("write.cdi_failed" if what.startswith("cdi") else "write.nfd_failed")
            self.failed_writes[what] = error
            return
        if self.failed_writes.pop(what, None) is not None:
            LOG.info("file written again", file=what, path=path)

    def _rescan_one(self, rw: ResourceWatch, reason: str, dirty: set[str] | None, whole: bool = True) -> None:
        """Rescan `rw`: only the `dirty` names when the events named them all (not `whole`) and the set
        held is the whole directory, else list it again (re-reading `dirty` and the untrusted entries)."""
        if dirty is not None and not whole and rw.whole:
            self._rescan_named(rw, reason, dirty)
            return
        scanned = rw.scan(dirty, clock=self.clock)
        self._note_directory(rw, scanned.unusable)
        self._note_slow(rw, scanned.slow)
        if scanned.unusable is None:
            self.stats.count("input.bad_name", rw.report(scanned.problems))
        self._schedule(rw, scanned.unusable, scanned.settles_in)
        present = scanned.present
        unsized = messages.DeviceSnapshot(self.epoch, 0, scanned.devices, present, rw.resource.name)
        fitted = fit_the_queue(unsized, rw.sizes)
        self._note_cut(rw, fitted)
        found = fitted.devices
        rw.size = fitted.size
        if found == rw.current and present == rw.present:
            return
        previous = rw.current or devices.DeviceSet()
        change = devices.diff(previous, found)
        came = [found.by_id[i] for i in sorted((*change.added, *change.changed))]
        gone = [previous.by_id[i] for i in (*change.removed, *change.changed)]
        self._publish(rw, reason, found, found.ids, present, change, came, gone, found.count(UNHEALTHY))

    def _rescan_named(self, rw: ResourceWatch, reason: str, names: set[str]) -> None:
        """The O(change) rescan: read `names` again, move them in the held set, fit by arithmetic."""
        assert rw.current is not None
        moved = rw.rescan_names(names, clock=self.clock)
        self._note_slow(rw, moved.slow)
        self.stats.count("input.bad_name", rw.report(moved.problems, moved.names))
        self._schedule(rw, None, rw.settles_in())
        if not moved.came and not moved.removed:
            return
        held, ids = list(rw.current.devices), list(rw.ids)
        snapshots.move_sorted(held, ids, moved.removed, moved.came)
        found = devices.DeviceSet(tuple(held))
        # snapshot_size(): the header, each entry, a comma between two entries.
        size = rw.size + moved.size + max(len(held) - 1, 0) - max(len(rw.current) - 1, 0)
        if size > messages.MAX_MESSAGE_BYTES:  # the cut is computed over the whole set, as at a full scan
            self._rescan_one(rw, reason, set())
            return
        rw.size = size
        upserted = {d.device_id for d in moved.came}
        change = devices.DeviceDiff(
            added=tuple(sorted(upserted - {d.device_id for d in moved.gone})),
            removed=tuple(moved.removed),
            changed=tuple(sorted(upserted & {d.device_id for d in moved.gone})),
        )
        sick = sum(d.health == UNHEALTHY for d in moved.came) - sum(d.health == UNHEALTHY for d in moved.gone)
        self._publish(rw, reason, found, tuple(ids), True, change, moved.came, moved.gone, rw.unhealthy + sick)

    def _publish(
        self, rw: ResourceWatch, reason: str, found: devices.DeviceSet, ids: tuple[str, ...], present: bool,
        change: devices.DeviceDiff, came: list[Device], gone: list[Device], unhealthy: int,
    ) -> None:  # fmt: skip
        """Send `found` (`came` sorted by ID, `gone` what they replaced or what left), then log it."""
        seq = self.next_seq()
        snapshot = messages.DeviceSnapshot(self.epoch, seq, found, present, rw.resource.name)
        delta = None
        if rw.current is not None:
            digest = messages.set_digest(rw.current) if rw.digest is None else rw.digest
            delta, rw.digest = snapshots.moved_delta(digest, snapshot, rw.seq, came, gone, change.removed)
        rw.current, rw.ids, rw.present, rw.seq, rw.unhealthy = found, ids, present, seq, unhealthy
        # Send first, log after: the log line is not on the path to the kubelet.
        self.client.publish(snapshot, delta=delta)
        self.specs_dirty.add(rw.resource.name)
        self.nfd_dirty = self.features is not None
        LOG.info(
            "device set changed",
            resource=rw.resource.name,
            reason=reason,
            devices=len(found),
            unhealthy=unhealthy,
            added=len(change.added),
            removed=len(change.removed),
            changed=len(change.changed),
            dir_present=present,
            seq=seq,
        )
        if change and len(change.added) + len(change.removed) + len(change.changed) <= 20:
            LOG.debug(
                "device changes",
                added=",".join(change.added),
                removed=",".join(change.removed),
                changed=",".join(change.changed),
            )

    def _note_slow(self, rw: ResourceWatch, slow: Iterable[tuple[str, float]]) -> None:
        for name, took in slow:
            LOG.warning("device file slow to read", resource=rw.resource.name, device=name, seconds=round(took, 3))
            self.stats.count("input.slow_read")

    def _schedule(self, rw: ResourceWatch, unusable: str | None, settles_in: float | None) -> None:
        """The follow-up rescan an unusable directory (a retry) or racy entries (a re-read) need."""
        if unusable is not None:
            rw.follow_up = self.clock() + UNUSABLE_RETRY_S
        elif settles_in is not None:
            rw.follow_up = self.clock() + min(settles_in, self.cfg.rescan_interval)
        else:
            rw.follow_up = None

    def _note_directory(self, rw: ResourceWatch, unusable: str | None) -> None:
        """One line when a directory becomes unusable (or fails differently), one when it heals."""
        if unusable is not None and unusable != rw.unusable:
            LOG.error(
                "device directory unusable: its devices are Unhealthy until it can be listed",
                resource=rw.resource.name,
                device_dir=rw.resource.device_dir,
                error=unusable,
                devices=len(rw.current or ()),
            )
            self.stats.count("input.dir_unusable")
        elif unusable is None and rw.unusable is not None:
            LOG.info("device directory usable again", resource=rw.resource.name, device_dir=rw.resource.device_dir)
        rw.unusable = unusable

    def _note_cut(self, rw: ResourceWatch, fitted: Fitted) -> None:
        """One line (and one count) whenever what the queue limit cuts from a snapshot changes."""
        cut = (fitted.demoted, fitted.dropped)
        if cut != rw.cut and (fitted.demoted or fitted.dropped):
            LOG.warning(
                "snapshot too large for the queue: largest devices Unhealthy",
                resource=rw.resource.name,
                demoted=len(fitted.demoted),
                dropped=len(fitted.dropped),
                first=(fitted.demoted or fitted.dropped)[0],
                bytes=fitted.size,
                limit=messages.MAX_MESSAGE_BYTES,
            )
            self.stats.count("input.snapshot_too_large")
        rw.cut = cut

    def step(self, timeout: float) -> None:
        """One turn of the loop: wait for events, then rescan what may have changed."""
        events = self.wait(timeout)
        if events is None:
            return
        overflow = False
        touched: dict[str, set[str]] = {}
        whole: set[str] = set()  # resources with an event that names no file in them: list them again
        for event in events:
            overflow = overflow or event.overflow
            for name, rw in self.watches.items():
                rw.dir.note(event)
                if not event.overflow and rw.dir.concerns(event):
                    names = touched.setdefault(name, set())
                    if event.wd == rw.dir.wd and event.name:
                        names.add(event.name)
                    else:
                        whole.add(name)
        moved = [rw for rw in self.watches.values() if rw.dir.ensure()]
        if overflow:
            self.rescan("overflow")
        elif self.clock() >= self.next_rescan:
            self.rescan("periodic")
        else:
            if touched:
                self.rescan("inotify", [self.watches[n] for n in touched], touched, whole)
            if moved:
                self.rescan("directory", moved)
        now = self.clock()
        due = [rw for rw in self.watches.values() if rw.follow_up is not None and rw.follow_up <= now]
        # Racy entries are read again whatever `dirty` says; a directory that was unusable is stat()ed in full.
        racy_only, unusable = [rw for rw in due if rw.unusable is None], [rw for rw in due if rw.unusable is not None]
        if racy_only:
            self.rescan("followup", racy_only, {rw.resource.name: set(rw.racy) for rw in racy_only}, ())
        if unusable:
            self.rescan("followup", unusable)
        self._health_step()
        self._write_outputs()
        self.finish(self.clock())

    def _health_step(self) -> None:
        """Host-path events re-check the devices that name host paths; probe verdicts that changed
        re-check their devices; both only those devices (O(change)), never waiting."""
        events = self.host_inotify.read()
        for event in events:
            if event.mask & watch.SELF_GONE:
                # That path, and every path under it, no longer names the inode watched (the watches
                # below a moved directory followed it): let go of them all; the sync adds them by path.
                under = event.path.rstrip("/") + "/"
                for path, (wd, _) in list(self.host_wds.items()):
                    if wd == event.wd or path.startswith(under):
                        del self.host_wds[path]
                        self.host_inotify.remove(wd)
        if events or self.host_recheck:
            # Only the devices with a path in a directory that had an event, or under one that
            # moved or went; an overflow or a watch just added: every device that names a path.
            every = self.host_recheck or any(e.overflow for e in events)
            self.host_recheck = False
            touched = {e.path for e in events}
            gone = tuple(e.path.rstrip("/") + "/" for e in events if e.mask & watch.SELF_GONE)

            def concerned(dirs: frozenset[str]) -> bool:
                return every or not dirs.isdisjoint(touched) or any(d.startswith(gone) for d in dirs)

            named = {}
            for n, rw in self.watches.items():
                ids = {i for i, dirs in rw.health.dirs.items() if concerned(dirs)}
                if ids:
                    named[n] = ids
            if named:
                self.rescan("hostpath", [self.watches[n] for n in named], named, ())
            self._sync_host_watches()
        changed = self.runner.poll()
        if changed:
            by_resource: dict[str, set[str]] = {}
            for key in changed:
                resource, _, device_id = key.partition("=")
                if resource in self.watches:
                    by_resource.setdefault(resource, set()).add(device_id)
            if by_resource:
                self.rescan("probe", [self.watches[n] for n in by_resource], by_resource, ())
        if self.features is not None and self.clock() >= self.nfd_refresh:
            self._write_features()

    def extra_fds(self) -> list[int]:
        return [self.host_inotify.fileno(), *self.runner.fds()]

    def timeout(self) -> float:
        follow_ups = [rw.follow_up for rw in self.watches.values() if rw.follow_up is not None]
        if self.host_recheck or (self.specs_dirty and self.spec_writer is not None) or self.nfd_dirty:
            return 0.0
        probe = self.runner.next_deadline()
        extra = [t for t in (probe, self.nfd_refresh if self.features is not None else None) if t is not None]
        return max(0.0, min([self.next_rescan, *follow_ups, *extra, *self.due()]) - self.clock())

    def apply_config(self, previous: Config) -> None:
        """A reload: stop watching removed resources, watch and scan new or changed ones."""
        self._apply_outputs(previous)
        wanted = {r.name: r for r in self.cfg.resources}
        recheck = self.cfg.host_path_check != previous.host_path_check  # every device is looked at anew
        for name in [n for n, rw in self.watches.items() if recheck or wanted.get(n) != rw.resource]:
            rw = self.watches.pop(name)
            rw.dir.close()
            rw.shown = {}  # not "healthy again": the resource is dropped or watched anew
            rw.health.forget_all_but(set())
            self._after_scan([rw])
            if name not in wanted:
                self.client.withdraw(messages.snapshot_key(name))
                self._remove_spec(name)
                LOG.info("resource removed", resource=name)
        added = []
        for name, resource in wanted.items():
            if name not in self.watches:
                rw = self.watches[name] = self._watch(resource)
                rw.dir.ensure()
                added.append(rw)
                LOG.info("resource watched", resource=name, device_dir=resource.device_dir)
        self.watches = {name: self.watches[name] for name in wanted}  # config order
        if added:
            self.rescan("start", added)

    def _apply_outputs(self, previous: Config) -> None:
        """A reload's new spec directory, CDI mode, feature file, label prefix or probe limit."""
        cfg = self.cfg
        self.runner.max_in_flight = max(1, cfg.probe_max_in_flight)
        if (cfg.cdi, cfg.cdi_spec_dir) != (previous.cdi, previous.cdi_spec_dir):
            for name in self.watches:  # out of the old directory (or CDI off): no stale spec left behind
                self._remove_spec(name)
            self.spec_writer = cdi.SpecWriter(cfg.cdi_spec_dir) if cfg.cdi != "off" and cfg.cdi_spec_dir else None
            self.specs_dirty.update(self.watches)
        nfd_keys = ("nfd_features_file", "nfd_label_prefix", "nfd_expiry")
        if cfg.nfd_features_file != previous.nfd_features_file:
            if self.features is not None:
                self._write("nfd", self.features.path, self.features.remove)
            self.features = nfd.FeatureFileWriter(cfg.nfd_features_file) if cfg.nfd_features_file else None
        if any(getattr(cfg, k) != getattr(previous, k) for k in nfd_keys):
            self.nfd_refresh, self.nfd_dirty = 0.0, self.features is not None

    def run(self) -> int:
        self.run_dir.ensure()
        for rw in self.watches.values():
            rw.dir.ensure()
        self.rescan("start")
        while not self.stopping:
            self.step(self.timeout())
        self.runner.close()
        # A graceful stop takes the specs away (no colad, no devices to resolve); a crash leaves them.
        for name in self.watches:
            self._remove_spec(name)
        self.host_inotify.close()
        self.close()
        LOG.info("discovery stopped")
        return 0


def main(args: object = None, cfg: Config | None = None) -> int:
    cfg = cfg or config_mod.load()
    dirs = ",".join(r.device_dir for r in cfg.resources)
    return watch.run_role("discovery", lambda: Discovery(cfg), cfg, device_dirs=dirs)
