"""Role `colad discovery`: turns each resource's device directory into DeviceSnapshots on the queue.

Reads: every resource's device directory (inotify, plus a periodic safety
rescan) and the content of its files (devicefile.py parses it; a file is read
again only when its inode, size or times changed). Writes: a full
DeviceSnapshot per resource to the plugin over the local queue whenever that
resource's devices change, and again after every reconnect. Level-triggered:
any event, an inotify queue overflow or the timer all mean "list the directory
again, build a new set, compare". Reload (SIGHUP) adds and drops directories.
Neighbours: plugin.py (the queue's owner).
"""

from __future__ import annotations

import json
import os
import stat
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass

import pyinotify

from colad import config as config_mod
from colad import devicefile, devices, log, messages, watch
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


def list_regular_files(path: str) -> tuple[list[str], bool]:
    """Names of the regular files directly in `path` (symlinks, dirs, FIFOs and sockets are not devices)."""
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
    except (FileNotFoundError, NotADirectoryError):
        return [], False
    return names, True


@dataclass(frozen=True)
class _Cached:
    key: tuple[int, int, int, int] | None  # (ino, size, mtime_ns, ctime_ns); None: read again next time
    device: Device


def read_device(device_id: str, path: str, known: _Cached | None) -> _Cached | None:
    """The device in file `path`, re-read only when its identity, size or times changed; None if gone.

    An empty file is a bare healthy device (no open). Anything unreadable is an
    Unhealthy device with the reason, never an exception.
    """
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return None
    except OSError as exc:
        return _Cached(None, Device(device_id, UNHEALTHY, problem=f"cannot stat: {exc.strerror}"))
    if not stat.S_ISREG(st.st_mode):
        return None
    key = (st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)
    if known is not None and known.key == key:
        return known
    if st.st_size == 0:
        return _Cached(key, devicefile.parse(device_id, b""))
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
        return _Cached(key, Device(device_id, UNHEALTHY, problem=f"cannot read: {exc.strerror}"))
    return _Cached(key, devicefile.parse(device_id, data))


# Below this estimate a snapshot cannot reach the queue's frame limit, so it is not encoded twice.
_SAFE_ESTIMATE = messages.MAX_MESSAGE_BYTES // 2


def fit_the_queue(rw: ResourceWatch, found: devices.DeviceSet) -> tuple[devices.DeviceSet, dict[str, str]]:
    """Keep a snapshot under the queue's frame limit: the largest device files turn Unhealthy until it fits.

    Only many large files can get there (each is at most 64 KiB); the other
    devices are never dropped. Returns the set and the problem of each device demoted.
    """
    estimate = 200 * len(found) + sum(c.key[1] for c in rw.cache.values() if c.key is not None)
    if estimate < _SAFE_ESTIMATE:
        return found, {}
    sizes = {d.device_id: len(json.dumps(devices.device_to_wire(d))) for d in found}
    budget = messages.MAX_MESSAGE_BYTES - 4096
    total = sum(sizes.values()) + 2 * len(sizes)
    if total <= budget:
        return found, {}
    problem = "file content too large to send with the other devices (queue message limit)"
    demoted: dict[str, Device] = {}
    for device_id in sorted(sizes, key=lambda i: (-sizes[i], i)):
        if total <= budget:
            break
        demoted[device_id] = Device(device_id, UNHEALTHY, problem=problem)
        total -= sizes[device_id] - len(json.dumps(devices.device_to_wire(demoted[device_id])))
    return devices.DeviceSet.of([demoted.get(d.device_id, d) for d in found]), {i: problem for i in demoted}


class ResourceWatch:
    """One resource's device directory: its watch, its files' parsed devices, its last snapshot."""

    def __init__(self, inotify: watch.Inotify, resource: Resource) -> None:
        self.resource = resource
        self.dir = watch.DirWatch(inotify, resource.device_dir, DEVICE_EVENTS)
        self.current: devices.DeviceSet | None = None
        self.present: bool | None = None
        self.warned: dict[str, str] = {}  # name -> the problem last logged for it
        self.cache: dict[str, _Cached] = {}
        # Longest file name that still leaves room for the replica suffix "::<n>".
        suffix = len(f"{devices.REPLICA_SEPARATOR}{resource.replicas - 1}") if resource.replicas > 1 else 0
        self.max_id = MAX_DEVICE_ID_LENGTH - suffix

    def scan(self, dirty: set[str] | None) -> tuple[devices.DeviceSet, bool, dict[str, str]]:
        """List the directory and build its devices; only `dirty` names (None: all) are stat()ed again.

        Returns the devices, whether the directory exists, and each skipped or malformed name's problem.
        """
        names, present = list_regular_files(self.resource.device_dir)
        result = devices.build(names)
        problems = {s.name: s.reason for s in result.skipped}
        found: list[Device] = []
        cache: dict[str, _Cached] = {}
        for device_id in result.devices.ids:
            if len(device_id) > self.max_id:
                problems[device_id] = f"longer than {self.max_id} characters (room for the replica suffix)"
                continue
            known = self.cache.get(device_id)
            if known is None or known.key is None or dirty is None or device_id in dirty:
                known = read_device(device_id, os.path.join(self.resource.device_dir, device_id), known)
            if known is None:
                continue
            cache[device_id] = known
            found.append(known.device)
            if known.device.problem:
                problems[device_id] = known.device.problem
        self.cache = cache
        return devices.DeviceSet.of(found), present, problems

    def report(self, problems: dict[str, str]) -> None:
        """Log what changed in this scan's problems (once per problem, again if it comes back later)."""
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
                    LOG.warning(
                        "file skipped: not a valid device ID", resource=self.resource.name, name=name, reason=problem
                    )
        for name in sorted(self.warned.keys() - problems.keys()):
            if name in self.cache:
                LOG.info("device file valid again", resource=self.resource.name, device=name)
        self.warned = problems  # a problem that goes and comes back is logged again


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
        """`reason` is one of start, inotify, overflow, periodic, directory (a metrics label).

        `watches` (default: all) are listed again; `dirty` names the files, per
        resource, whose content may have changed (None: stat every file).
        """
        self.stats.count(f"rescans.{reason}")
        LOG.debug("rescan", reason=reason)
        targets = list(self.watches.values()) if watches is None else list(watches)
        if watches is None:
            self.next_rescan = self.clock() + self.cfg.rescan_interval
        for rw in targets:
            self._rescan_one(rw, reason, None if dirty is None else dirty.get(rw.resource.name, set()))

    def _rescan_one(self, rw: ResourceWatch, reason: str, dirty: set[str] | None) -> None:
        found, present, problems = rw.scan(dirty)
        found, too_large = fit_the_queue(rw, found)
        rw.report(problems | too_large)
        if found == rw.current and present == rw.present:
            return
        previous = rw.current or devices.DeviceSet()
        rw.current, rw.present = found, present
        seq = self.next_seq()
        # Send first, log after: the log line is not on the path to the kubelet.
        self.client.publish(messages.DeviceSnapshot(self.epoch, seq, found, present, rw.resource.name))
        change = devices.diff(previous, found)
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
        self.finish(self.clock())

    def timeout(self) -> float:
        return max(0.0, min([self.next_rescan, *self.due()]) - self.clock())

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
