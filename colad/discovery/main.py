"""Role `colad discovery`: turns each resource's device directory into DeviceSnapshots on the queue.

Reads: each resource's device directory (inotify, a periodic safety rescan) and its files
(devicedir.py). Writes, over the local queue to the plugin (colad/plugin/main.py owns it): a full
DeviceSnapshot after every (re)connect, then what changed as a DeviceDelta (snapshots.py).
Level-triggered: an event that names files reads those files again and moves them in the held
set (O(change)); any other event, an overflow, the timer or a reload re-list the directory.
No timer holds a change back; changes go together only by backpressure (docs/DEVELOPING.md, the data path).
Each device as read gets its host-path health and probe verdict (DeviceHealth); each change
rewrites the resource's CDI spec and the NFD feature file. Neighbours: colad/discovery/scan.py (one
directory's scans), colad/discovery/health.py (host-path watches and probes: HealthFollower),
colad/discovery/writers.py (CDI and NFD files: OutputWriter).
"""

from __future__ import annotations

import ctypes
import os
import signal
import time
import traceback
from collections.abc import Callable, Iterable

from colad.config import config
from colad.config.config import Config, Resource
from colad.core import constants, devices, trust
from colad.core.constants import UNHEALTHY
from colad.core.devices import Device
from colad.core.roles import DISCOVERY
from colad.discovery.health import HealthFollower
from colad.discovery.scan import DeviceHealth, ResourceWatch
from colad.discovery.writers import OutputWriter
from colad.jobs import commands
from colad.jobs.probes import ProbeRunner
from colad.queue import device_wire, messages, snapshots
from colad.queue.client import QueueClient
from colad.queue.snapshots import Fitted, fit_the_queue
from colad.runtime import log
from colad.watchers import loop
from colad.watchers.inotify import Inotify

LOG = log.get(__name__)
# A directory that cannot be listed (ELOOP, EACCES, EIO...) may send no event when it heals.
UNUSABLE_RETRY_S = 2.0
# More known names than this (and than half the set) in one rescan: list the directory instead.
RELIST_NAMES = 1000
# A turn that read this many names (a start, a listing, a burst's follow-up) leaves glibc's heap high with
# the set's transients: malloc_trim hands the free pages back (2 MiB at 10,000 devices; 0.5 ms).
TRIM_AFTER_NAMES = 1000
try:  # ctypes is loaded in this role already: pyinotify binds inotify with it
    _malloc_trim: Callable[[int], int] | None = ctypes.CDLL(None).malloc_trim
except (OSError, AttributeError):  # no glibc (musl): nothing to trim with
    _malloc_trim = None


class Discovery(loop.WatcherLoop):
    """The discovery role's loop: inotify and timer turns rescan the resources that may have
    changed and publish what changed; a reload watches the new config's resources."""

    def __init__(
        self,
        cfg: Config,
        *,
        client: QueueClient | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        super().__init__(cfg, DISCOVERY.name, client=client)
        self.clock = clock
        self.health = HealthFollower(ProbeRunner(cfg.probe_max_in_flight, trusted=cfg.trusted_uids), self.stats)
        self.outputs = OutputWriter(cfg, self.stats, clock)
        self.watches: dict[str, ResourceWatch] = {r.name: self._watch(r) for r in cfg.resources}
        self.next_rescan = 0.0
        self.trim_due = False  # this turn read TRIM_AFTER_NAMES names or more: trimmed after its outputs

    def _watch(self, resource: Resource) -> ResourceWatch:
        health = DeviceHealth(resource, self.cfg.host_path_check, self.health.runner, self.cfg.trusted_uids)
        return ResourceWatch(self.inotify, resource, health, self.cfg.trusted_uids)

    @property
    def current(self) -> devices.DeviceSet | None:
        """The first resource's device set (the only one in a single-resource config)."""
        return next(iter(self.watches.values())).current

    def rescan(
        self,
        reason: str,
        watches: Iterable[ResourceWatch] | None = None,
        dirty: dict[str, set[str]] | None = None,
        whole: Iterable[str] = ("*",),
    ) -> None:
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
        if watches is None:  # the degraded mode (no inotify for some watch) polls instead
            every = self.cfg.rescan_interval if self.degraded is None else constants.DEGRADED_POLL_S
            self.next_rescan = self.clock() + min(every, self.cfg.rescan_interval)
            if self.degraded is not None:
                self.health.sync(self.watches)  # and the host-path watches the limit refused are tried again
        for rw in targets:
            names = None
            try:
                name = rw.resource.name
                names = None if dirty is None else dirty.get(name, set())
                rw.retry_whole = rw.retry_whole and names is not None  # stat()ing every file is the retry
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
                rw.follow_up, rw.retry_whole = self.clock() + UNUSABLE_RETRY_S, True
        if watches is None:  # the periodic pass also retries a spec or feature file that could not be written
            self.outputs.changed(rw.resource.name for rw in targets)
        self.health.after_scan(targets, self.watches)

    def _rescan_one(self, rw: ResourceWatch, reason: str, dirty: set[str] | None, whole: bool = True) -> None:
        """Rescan `rw`: only the `dirty` names when the events named them all (not `whole`) and the set
        held is the whole directory, else list it again (re-reading `dirty` and the untrusted entries)."""
        # A directory on the way that stopped being trusted sends no event here (only the device
        # directory's own chmod does): the O(change) path looks too, and lists anew if so.
        if dirty is not None and not whole and rw.whole and rw.untrusted() is None:
            self._rescan_named(rw, reason, dirty)
            return
        scanned = rw.scan(dirty, clock=self.clock)
        self.trim_due = self.trim_due or len(rw.cache) >= TRIM_AFTER_NAMES
        self._note_directory(rw, scanned.unusable)
        self._note_slow(rw, scanned.slow)
        if scanned.unusable is None:
            self._count(rw.report(scanned.problems))
        self._schedule(rw, scanned.unusable, scanned.settles_in)
        present = scanned.present
        unsized = messages.DeviceSnapshot(self.epoch, 0, scanned.devices, present, rw.resource.name)
        fitted = fit_the_queue(unsized, scanned.sizes)
        self._note_cut(rw, fitted)
        found = fitted.devices
        rw.size = fitted.size
        if found == rw.current and present == rw.present:
            return
        # On copies: a set keeps its by_id, and `found` is held until the next change (200 KiB at 10,000).
        previous, new = devices.DeviceSet(rw.current.devices if rw.current else ()), devices.DeviceSet(found.devices)
        change = devices.diff(previous, new)
        came = [new.by_id[i] for i in sorted((*change.added, *change.changed))]
        gone = [previous.by_id[i] for i in (*change.removed, *change.changed)]
        self._publish(rw, reason, found, found.ids, present, change, came, gone, found.count(UNHEALTHY))

    def _rescan_named(self, rw: ResourceWatch, reason: str, names: set[str]) -> None:
        """The O(change) rescan: read `names` again, move them in the held set, fit by arithmetic."""
        assert rw.current is not None
        moved = rw.rescan_names(names, clock=self.clock)
        self.trim_due = self.trim_due or len(names) >= TRIM_AFTER_NAMES
        self._note_slow(rw, moved.slow)
        self._count(rw.report(moved.problems, moved.names))
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
        self,
        rw: ResourceWatch,
        reason: str,
        found: devices.DeviceSet,
        ids: tuple[str, ...],
        present: bool,
        change: devices.DeviceDiff,
        came: list[Device],
        gone: list[Device],
        unhealthy: int,
    ) -> None:
        """Send `found` (`came` sorted by ID, `gone` what they replaced or what left), then log it."""
        seq = self.next_seq()
        snapshot = messages.DeviceSnapshot(self.epoch, seq, found, present, rw.resource.name)
        delta = None
        if rw.current is not None:
            digest = device_wire.set_digest(rw.current) if rw.digest is None else rw.digest
            delta, rw.digest = snapshots.moved_delta(digest, snapshot, rw.seq, came, gone, change.removed)
        rw.current, rw.ids, rw.present, rw.seq, rw.unhealthy = found, ids, present, seq, unhealthy
        self.outputs.spec_before_publish(rw, came, gone, change.removed)
        # Send first, log after: the log line is not on the path to the kubelet.
        self.client.publish(snapshot, delta=delta)
        self.outputs.changed()
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

    def _count(self, counts: dict[str, int]) -> None:
        for name, by in counts.items():
            self.stats.count(name, by)

    def _note_slow(self, rw: ResourceWatch, slow: Iterable[tuple[str, float]]) -> None:
        for name, took in slow:
            LOG.warning("device file slow to read", resource=rw.resource.name, device=name, seconds=round(took, 3))
            self.stats.count("input.slow_read")

    def _schedule(self, rw: ResourceWatch, unusable: str | None, settles_in: float | None) -> None:
        """The follow-up rescan an unusable directory (a retry) or racy entries (a re-read) need."""
        if unusable is not None:
            rw.follow_up = self.clock() + UNUSABLE_RETRY_S
        elif rw.retry_whole:  # a failed rescan's retry stands; racy entries may bring it forward
            if settles_in is not None:
                soon = self.clock() + settles_in
                rw.follow_up = soon if rw.follow_up is None else min(rw.follow_up, soon)
        elif settles_in is not None:
            rw.follow_up = self.clock() + min(settles_in, self.cfg.rescan_interval)
        else:
            rw.follow_up = None

    def _note_directory(self, rw: ResourceWatch, unusable: str | None) -> None:
        """One line when a directory becomes unusable or untrusted (or fails differently), one when it heals."""
        if unusable is not None and unusable != rw.unusable and unusable.startswith(trust.UNTRUSTED):
            LOG.error(
                "device directory untrusted: refused, its devices are Unhealthy until it is fixed",
                resource=rw.resource.name,
                device_dir=rw.resource.device_dir,
                reason=unusable[len(trust.UNTRUSTED) :],
                devices=len(rw.current or ()),
            )
            self.stats.count("input.untrusted_dir")
        elif unusable is not None and unusable != rw.unusable:
            LOG.error(
                "device directory unusable: its devices are Unhealthy until it can be listed",
                resource=rw.resource.name,
                device_dir=rw.resource.device_dir,
                error=unusable,
                devices=len(rw.current or ()),
            )
            self.stats.count("input.dir_unusable")
        elif unusable is None and rw.unusable is not None:
            again = "trusted" if rw.unusable.startswith(trust.UNTRUSTED) else "usable"
            LOG.info(f"device directory {again} again", resource=rw.resource.name, device_dir=rw.resource.device_dir)
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
        for event in events:  # everything that came during the last turn: read again as one change
            overflow = overflow or event.overflow
            for rw in self.watches.values():
                rw.dir.note(event)
                if not event.overflow and rw.dir.concerns(event):
                    rw.note(event.name if event.wd == rw.dir.wd and event.name else None)
        moved = [rw for rw in self.watches.values() if rw.dir.ensure()]
        if overflow or self.clock() >= self.next_rescan:
            for rw in self.watches.values():
                rw.take_pending()  # every name is stat()ed again
            self.rescan("overflow" if overflow else "periodic")
        else:
            for rw in moved:
                rw.take_pending()
            ready = [rw for rw in self.watches.values() if rw.due]
            if ready:
                taken = {rw.resource.name: rw.take_pending() for rw in ready}
                touched = {name: names for name, (names, _) in taken.items()}
                whole = {name for name, (names, listed) in taken.items() if listed or self._relist(name, names)}
                self.rescan("inotify", ready, touched, whole)
            if moved:
                self.rescan("directory", moved)
        now = self.clock()
        due = [rw for rw in self.watches.values() if rw.follow_up is not None and rw.follow_up <= now]
        # Racy entries are read again whatever `dirty` says; a directory that was unusable is stat()ed in full.
        full = [rw for rw in due if rw.unusable is not None or rw.retry_whole]
        racy_only = [rw for rw in due if rw not in full]
        if racy_only:
            self.rescan("followup", racy_only, {rw.resource.name: set(rw.racy) for rw in racy_only}, ())
        if full:
            self.rescan("followup", full)
        self._health_step()
        self.outputs.write_turn(self.watches)
        self._trim_heap()
        self.finish(self.clock())

    def _health_step(self) -> None:
        """Read again the devices whose host paths or probe verdicts changed: only those (O(change)), never waiting."""
        named = self.health.host_path_rescans(self.watches)
        if named is not None:
            if named:
                self.rescan("hostpath", [self.watches[n] for n in named], named, ())
            self.health.sync(self.watches)
        by_resource = self.health.probe_rescans(self.watches)
        if by_resource:
            self.rescan("probe", [self.watches[n] for n in by_resource], by_resource, ())

    def _trim_heap(self) -> None:
        """After a turn that read TRIM_AFTER_NAMES names or more, the heap goes back to the system."""
        if self.trim_due and _malloc_trim is not None:
            _malloc_trim(0)
        self.trim_due = False

    def _relist(self, name: str, names: set[str]) -> bool:
        """List the directory rather than stat each name? When the names hold many known devices (a
        mass removal: one listing beats thousands of failed lstat()s); new names are cheaper one by one
        (a listing would read every racy file of the burst again)."""
        cache = self.watches[name].cache
        return len(names) > RELIST_NAMES and sum(n in cache for n in names) > max(RELIST_NAMES, len(cache) // 2)

    def extra_fds(self) -> list[int | None]:
        return self.health.fds()

    def inotifies(self) -> list[Inotify]:
        return [self.inotify, self.health.host_inotify]

    def degraded_changed(self) -> None:
        """Into the degraded mode: poll from now on; out of it: one full rescan for what no event told."""
        self.next_rescan = self.clock()

    def timeout(self) -> float:
        if self.health.host_recheck or self.outputs.due_now():
            return 0.0
        # One pass, no lists: it runs every turn (lists would be 4 % of a one-file change's turn).
        soonest = self.next_rescan
        for rw in self.watches.values():
            if rw.follow_up is not None and rw.follow_up < soonest:
                soonest = rw.follow_up
            if rw.due:
                return 0.0
        for at in (self.health.runner.next_deadline(), self.outputs.next_refresh()):
            if at is not None and at < soonest:
                soonest = at
        return max(0.0, min([soonest, *self.due()]) - self.clock())

    def apply_config(self, previous: Config) -> None:
        """A reload: stop watching removed resources, watch and scan new or changed ones."""
        self.health.runner.max_in_flight = max(1, self.cfg.probe_max_in_flight)
        self.health.runner.trusted = self.cfg.trusted_uids  # the next run of each probe judges its program anew
        self.outputs.configure(self.cfg, self.watches)
        wanted = {r.name: r for r in self.cfg.resources}
        # Every device is looked at anew.
        recheck = (self.cfg.host_path_check, self.cfg.trusted_uids) != (previous.host_path_check, previous.trusted_uids)
        for name in [n for n, rw in self.watches.items() if recheck or wanted.get(n) != rw.resource]:
            rw = self.watches.pop(name)
            rw.dir.close()
            rw.shown = {}  # not "healthy again": the resource is dropped or watched anew
            rw.health.forget_all_but(set())
            self.health.after_scan([rw], self.watches)
            if name not in wanted:
                self.client.withdraw(messages.snapshot_key(name))
                self.outputs.remove_spec(name)
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

    def close(self) -> None:
        """Each probe killed with what it started (what discovery adopted, reaped); every watch let go of."""
        self.health.close()
        super().close()

    def run(self) -> int:
        self.run_dir.ensure()
        for rw in self.watches.values():
            rw.dir.ensure()
        self.rescan("start")
        self._trim_heap()
        while not self.stopping:
            self.step(self.timeout())
        # A graceful stop takes the specs away (no colad, no devices to resolve); a crash leaves them.
        for name in self.watches:
            self.outputs.remove_spec(name)
        self.close()
        LOG.info("discovery stopped")
        return 0


def main(args: object = None, cfg: Config | None = None) -> int:
    cfg = cfg or config.load()
    dirs = ",".join(r.device_dir for r in cfg.resources)
    commands.become_subreaper()  # a probe's orphans are re-parented here, to be found and reaped
    signal.signal(signal.SIGCHLD, commands.child_exited)  # wakes the loop (the waker's fd), which sweeps
    return loop.run_role(DISCOVERY.name, lambda: Discovery(cfg), cfg, device_dirs=dirs)
