"""Role `colad discovery`: turns each resource's device directory into DeviceSnapshots on the queue.

Reads: every resource's device directory (inotify, plus a periodic safety
rescan) and the content of its files (devicefile.py parses it; a file is read
again only when its inode, size or times changed). Writes: per resource, what
changed as a DeviceDelta (snapshots.py), a full DeviceSnapshot after every
(re)connect, over the local queue to the plugin. Level-triggered:
any event, an inotify queue overflow or the timer all mean "list the directory
again, build a new set, compare". Reload (SIGHUP) adds and drops directories.
Neighbours: plugin.py (the queue's owner).
"""

from __future__ import annotations

import errno
import os
import stat
import time
import traceback
from collections.abc import Callable, Iterable
from dataclasses import dataclass, replace

import pyinotify

from colad import config as config_mod
from colad import devicefile, devices, log, messages, snapshots, watch
from colad.config import Config, Resource
from colad.constants import MAX_DEVICE_ID_LENGTH, UNHEALTHY
from colad.devices import Device
from colad.queue import QueueClient

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


# Timestamps of a file written within one tick of our read may not change at the next write:
# ext2/ext3 and FAT keep seconds (FAT's mtime: 2 s), and before Linux 6.13 every filesystem stamps
# files from the coarse clock (one jiffy, up to 10 ms) whatever its resolution. Like git's "racily
# clean" index entries, a file whose mtime or ctime is not older than the read by this window is
# read again at every scan, and once more when the window has passed (a follow-up rescan).
RACY_WINDOW_NS = 2_000_000_000
# A directory that cannot be listed (ELOOP, EACCES, EIO...) may send no event when it heals.
UNUSABLE_RETRY_S = 2.0
# A parse slower than this is logged: the pre-scan in devicefile.py should make it impossible.
SLOW_READ_S = 0.25
# The seq of a snapshot is not known when it is fitted: count it with the widest it can have.
_MAX_SEQ = 2**63 - 1


def list_regular_files(path: str) -> tuple[list[str], bool]:
    """Names of the regular files directly in `path` (symlinks, dirs, FIFOs and sockets are not devices).

    Returns ([], False) when `path` is missing or not a directory; any other
    failure to list it (ELOOP, EACCES, EIO...) raises the OSError.
    """
    names: list[str] = []
    try:
        with os.scandir(path) as entries:
            for entry in entries:
                try:
                    # d_type from getdents: no stat() per file (lstat only where d_type is unknown).
                    if entry.is_file(follow_symlinks=False):
                        names.append(entry.name)
                except FileNotFoundError:
                    continue  # removed while we listed: the next event rescans
                except OSError:
                    names.append(entry.name)  # cannot tell: read_device makes it Unhealthy with the reason
    except (FileNotFoundError, NotADirectoryError):
        return [], False
    return names, True


def racy(mtime_ns: int, ctime_ns: int, read_ns: int, window_ns: int = RACY_WINDOW_NS) -> bool:
    """May a write after a read at `read_ns` leave these timestamps unchanged (git's racily clean)?"""
    return max(mtime_ns, ctime_ns) >= read_ns - window_ns


@dataclass(frozen=True)
class _Cached:
    key: tuple[int, int, int, int] | None  # (ino, size, mtime_ns, ctime_ns); None: read again next time
    device: Device
    size: int  # messages.device_wire_size(device)
    settles_ns: int | None = None  # racy until this wall-clock time: read again at every scan until then

    @property
    def trusted(self) -> bool:
        """May the next scan skip this file unless an event names it?"""
        return self.key is not None and self.settles_ns is None

    @staticmethod
    def of(key: tuple[int, int, int, int] | None, device: Device, read_ns: int) -> _Cached:
        settles = None
        if key is not None and racy(key[2], key[3], read_ns):
            settles = max(key[2], key[3]) + RACY_WINDOW_NS + 1
        return _Cached(key, device, messages.device_wire_size(device), settles)


def read_device(
    device_id: str, path: str, known: _Cached | None, *, now_ns: Callable[[], int] = time.time_ns
) -> _Cached | None:
    """The device in file `path`, re-read only when its identity, size or times changed; None if gone.

    A key read within RACY_WINDOW_NS of its file's last change is not trusted:
    the file is read again. An empty file is a bare healthy device (no open).
    Anything unreadable is an Unhealthy device with the reason, never an exception.
    """
    read_ns = now_ns()  # before the stat: an earlier read time only makes more entries racy
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return None
    except OSError as exc:
        return _Cached.of(None, Device(device_id, UNHEALTHY, problem=f"cannot stat: {exc.strerror}"), read_ns)
    if not stat.S_ISREG(st.st_mode):
        return None
    key = (st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)
    if known is not None and known.key == key and known.settles_ns is None:
        return known
    if st.st_size == 0:
        return _Cached.of(key, devicefile.parse(device_id, b""), read_ns)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
        try:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                return None
            data = os.read(fd, devicefile.MAX_FILE_BYTES + 1)
        finally:
            os.close(fd)
    except FileNotFoundError:
        return None
    except OSError as exc:
        return _Cached.of(key, Device(device_id, UNHEALTHY, problem=f"cannot read: {exc.strerror}"), read_ns)
    return _Cached.of(key, devicefile.parse(device_id, data), read_ns)


TOO_LARGE = "snapshot too large: file content left out to fit the queue message limit"


@dataclass(frozen=True)
class Fitted:
    """A snapshot's devices cut to the queue's frame limit, measured on the exact encoded size."""

    devices: devices.DeviceSet
    demoted: tuple[str, ...] = ()  # Unhealthy, content dropped (largest first)
    dropped: tuple[str, ...] = ()  # left out (the last IDs), when even bare entries do not fit
    size: int = 0


def fit_the_queue(
    snapshot: messages.DeviceSnapshot, sizes: dict[str, int], limit: int = messages.MAX_MESSAGE_BYTES
) -> Fitted:
    """Keep `snapshot` (its seq is ignored) under `limit`: the largest devices turn Unhealthy until it fits.

    `sizes` holds device_wire_size of devices already measured. Only many large
    files get there (each is at most 64 KiB); if even their bare entries cannot
    fit, the last IDs are left out. Deterministic: the same set gives the same cut.
    """
    found = snapshot.devices
    wire = {d.device_id: sizes.get(d.device_id) or messages.device_wire_size(d) for d in found}
    total = messages.snapshot_size(replace(snapshot, seq=_MAX_SEQ), [wire[d.device_id] for d in found])
    if total <= limit:
        return Fitted(found, size=total)
    kept = {d.device_id: d for d in found}
    demoted: list[str] = []
    for device_id in sorted(wire, key=lambda i: (-wire[i], i)):
        if total <= limit:
            break
        bare = Device(device_id, UNHEALTHY, problem=TOO_LARGE)
        smaller = messages.device_wire_size(bare)
        if smaller >= wire[device_id]:
            continue
        kept[device_id] = bare
        total -= wire[device_id] - smaller
        wire[device_id] = smaller
        demoted.append(device_id)
    dropped: list[str] = []
    for device_id in sorted(kept, reverse=True):
        if total <= limit:
            break
        total -= wire[device_id] + (1 if len(kept) > 1 else 0)
        del kept[device_id]
        dropped.append(device_id)
    return Fitted(devices.DeviceSet.of(kept.values()), tuple(demoted), tuple(sorted(dropped)), total)


@dataclass(frozen=True)
class ScanOutcome:
    devices: devices.DeviceSet
    present: bool
    problems: dict[str, str]  # skipped or malformed name -> its problem
    unusable: str | None = None  # why the directory could not be listed ("ELOOP: Too many levels...")
    settles_in: float | None = None  # seconds until the racy entries can be trusted
    slow: tuple[tuple[str, float], ...] = ()  # (name, seconds) of slow reads


class ResourceWatch:
    """One resource's device directory: its watch, its files' parsed devices, its last snapshot."""

    def __init__(self, inotify: watch.Inotify, resource: Resource) -> None:
        self.resource = resource
        self.dir = watch.DirWatch(inotify, resource.device_dir, DEVICE_EVENTS)
        self.current: devices.DeviceSet | None = None
        self.seq = 0  # the seq `current` was published with: the base of the next delta
        self.digest: int | None = None  # messages.set_digest(current), from the first delta on
        self.present: bool | None = None
        self.warned: dict[str, str] = {}  # name -> the problem last logged for it
        self.cache: dict[str, _Cached] = {}
        self.sizes: dict[str, int] = {}  # wire size of each device of the last scan, as scanned
        self.unusable: str | None = None  # why the directory could not be listed last time
        self.cut: tuple[tuple[str, ...], tuple[str, ...]] = ((), ())  # the last fit's (demoted, dropped)
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
            self.sizes = {}
            return ScanOutcome(devices.DeviceSet.of(kept), True, dict(self.warned), unusable=f"{code}: {exc.strerror}")
        result = devices.build(names)
        problems = {s.name: s.reason for s in result.skipped}
        found: list[Device] = []
        cache: dict[str, _Cached] = {}
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
            found.append(known.device)
            if known.settles_ns is not None:
                settles.append(known.settles_ns)
            if known.device.problem:
                problems[device_id] = known.device.problem
        self.cache = cache
        self.sizes = {i: c.size for i, c in cache.items()}
        settles_in = max(0.0, (max(settles) - time.time_ns()) / 1e9) if settles else None
        return ScanOutcome(devices.DeviceSet.of(found), present, problems, settles_in=settles_in, slow=tuple(slow))

    def report(self, problems: dict[str, str]) -> int:
        """Log what changed in this scan's problems (once per problem, again if it comes back later).

        Returns how many names were newly skipped as not valid device IDs.
        """
        skipped = 0
        for name, problem in sorted(problems.items()):
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
        self.watches: dict[str, ResourceWatch] = {r.name: ResourceWatch(self.inotify, r) for r in cfg.resources}
        self.next_rescan = 0.0

    @property
    def current(self) -> devices.DeviceSet | None:
        """The first resource's device set (the only one in a single-resource config)."""
        return next(iter(self.watches.values())).current

    def rescan(
        self, reason: str, watches: Iterable[ResourceWatch] | None = None, dirty: dict[str, set[str]] | None = None
    ) -> None:
        """`reason` is one of start, inotify, overflow, periodic, directory, followup (a metrics label).

        `watches` (default: all) are listed again; `dirty` names the files, per
        resource, whose content may have changed (None: stat every file). The
        loop boundary of one resource: whatever its rescan raises is logged in
        one line and counted, and the resource is tried again soon.
        """
        self.stats.count(f"rescans.{reason}")
        LOG.debug("rescan", reason=reason)
        targets = list(self.watches.values()) if watches is None else list(watches)
        if watches is None:
            self.next_rescan = self.clock() + self.cfg.rescan_interval
        for rw in targets:
            try:
                self._rescan_one(rw, reason, None if dirty is None else dirty.get(rw.resource.name, set()))
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

    def _rescan_one(self, rw: ResourceWatch, reason: str, dirty: set[str] | None) -> None:
        scanned = rw.scan(dirty, clock=self.clock)
        self._note_directory(rw, scanned.unusable)
        for name, took in scanned.slow:
            LOG.warning("device file slow to read", resource=rw.resource.name, device=name, seconds=round(took, 3))
            self.stats.count("input.slow_read")
        if scanned.unusable is None:
            self.stats.count("input.bad_name", rw.report(scanned.problems))
        if scanned.unusable is not None:
            rw.follow_up = self.clock() + UNUSABLE_RETRY_S
        elif scanned.settles_in is not None:
            rw.follow_up = self.clock() + min(scanned.settles_in, self.cfg.rescan_interval)
        else:
            rw.follow_up = None
        present = scanned.present
        unsized = messages.DeviceSnapshot(self.epoch, 0, scanned.devices, present, rw.resource.name)
        fitted = fit_the_queue(unsized, rw.sizes)
        self._note_cut(rw, fitted)
        found = fitted.devices
        if found == rw.current and present == rw.present:
            return
        previous = rw.current or devices.DeviceSet()
        seq = self.next_seq()
        snapshot = messages.DeviceSnapshot(self.epoch, seq, found, present, rw.resource.name)
        change = devices.diff(previous, found)
        delta = None
        if rw.current is not None:
            delta, rw.digest = snapshots.delta(previous, rw.digest, snapshot, rw.seq, change)
        rw.current, rw.present, rw.seq = found, present, seq
        # Send first, log after: the log line is not on the path to the kubelet.
        self.client.publish(snapshot, delta=delta)
        LOG.info(
            "device set changed",
            resource=rw.resource.name,
            reason=reason,
            devices=len(found),
            unhealthy=found.count(UNHEALTHY),
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
        for event in events:
            overflow = overflow or event.overflow
            for name, rw in self.watches.items():
                rw.dir.note(event)
                if not event.overflow and rw.dir.concerns(event):
                    names = touched.setdefault(name, set())
                    if event.wd == rw.dir.wd and event.name:
                        names.add(event.name)
        moved = [rw for rw in self.watches.values() if rw.dir.ensure()]
        if overflow:
            self.rescan("overflow")
        elif self.clock() >= self.next_rescan:
            self.rescan("periodic")
        else:
            if touched:
                self.rescan("inotify", [self.watches[n] for n in touched], touched)
            if moved:
                self.rescan("directory", moved)
        now = self.clock()
        due = [rw for rw in self.watches.values() if rw.follow_up is not None and rw.follow_up <= now]
        # Racy entries are read again whatever `dirty` says; a directory that was unusable is stat()ed in full.
        racy_only, unusable = [rw for rw in due if rw.unusable is None], [rw for rw in due if rw.unusable is not None]
        if racy_only:
            self.rescan("followup", racy_only, {rw.resource.name: set() for rw in racy_only})
        if unusable:
            self.rescan("followup", unusable)
        self.finish(self.clock())

    def timeout(self) -> float:
        follow_ups = [rw.follow_up for rw in self.watches.values() if rw.follow_up is not None]
        return max(0.0, min([self.next_rescan, *follow_ups, *self.due()]) - self.clock())

    def apply_config(self, previous: Config) -> None:
        """A reload: stop watching removed resources, watch and scan new or changed ones."""
        wanted = {r.name: r for r in self.cfg.resources}
        for name in [n for n, rw in self.watches.items() if wanted.get(n) != rw.resource]:
            rw = self.watches.pop(name)
            rw.dir.close()
            if name not in wanted:
                self.client.withdraw(messages.snapshot_key(name))
                LOG.info("resource removed", resource=name)
        added = []
        for name, resource in wanted.items():
            if name not in self.watches:
                rw = self.watches[name] = ResourceWatch(self.inotify, resource)
                rw.dir.ensure()
                added.append(rw)
                LOG.info("resource watched", resource=name, device_dir=resource.device_dir)
        self.watches = {name: self.watches[name] for name in wanted}  # config order
        if added:
            self.rescan("start", added)

    def run(self) -> int:
        self.run_dir.ensure()
        for rw in self.watches.values():
            rw.dir.ensure()
        self.rescan("start")
        while not self.stopping:
            self.step(self.timeout())
        self.close()
        LOG.info("discovery stopped")
        return 0


def main(args: object = None, cfg: Config | None = None) -> int:
    cfg = cfg or config_mod.load()
    dirs = ",".join(r.device_dir for r in cfg.resources)
    return watch.run_role("discovery", lambda: Discovery(cfg), cfg, device_dirs=dirs)
