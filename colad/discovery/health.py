"""Health and outputs for `colad discovery`: what the kubelet is told of each device.

Reads: each device's host paths (hostpaths.py, watched by inotify) and its probe verdicts
(probes.py), through each resource's overlay (colad.discovery.scan.DeviceHealth). Writes: each
resource's CDI spec (cdi.py) and the NFD feature file (nfd.py). `HealthOutputs` is the part of
the Discovery loop (colad/discovery/main.py) that follows host paths and probes and writes the files.
"""

from __future__ import annotations

import ctypes
import errno
import functools
import os
from collections.abc import Callable, Iterable
from datetime import UTC, datetime, timedelta

import pyinotify

from colad.config.config import Config
from colad.core import namemap, trust
from colad.core.device_rules import cdi_device_name_problem, split_cdi_name
from colad.core.devices import Device
from colad.discovery import hostpaths
from colad.jobs.probes import PENDING, ProbeRunner
from colad.outputs import cdi, nfd
from colad.queue.client import StatsReporter
from colad.runtime import log
from colad.watchers import loop
from colad.watchers.inotify import Inotify

TYPE_CHECKING = False  # typing is not loaded at run time: docs/DEVELOPING.md, "Import cost"

if TYPE_CHECKING:
    from colad.discovery.scan import ResourceWatch

# The role's logger: its lines (and the tests matching them) stay those of discovery.
LOG = log.get(__name__)

# What can change a host path's verdict, watched on each path's nearest existing parent.
HOST_PATH_EVENTS = loop.DIR_CHANGE_EVENTS | pyinotify.IN_ONLYDIR
# Every further ancestor: only its own move or removal (which no event below it would tell).
HOST_ANCESTOR_EVENTS = pyinotify.IN_DELETE_SELF | pyinotify.IN_MOVE_SELF | pyinotify.IN_ONLYDIR
# A turn that read this many names (a start, a listing, a burst's follow-up) leaves glibc's heap high with
# the set's transients: malloc_trim hands the free pages back (2 MiB at 10,000 devices; 0.5 ms).
TRIM_AFTER_NAMES = 1000
try:  # ctypes is loaded in this role already: pyinotify binds inotify with it
    _malloc_trim: Callable[[int], int] | None = ctypes.CDLL(None).malloc_trim
except (OSError, AttributeError):  # no glibc (musl): nothing to trim with
    _malloc_trim = None


class HealthOutputs:
    """The Discovery loop's health and output half: the host-path watches, the probes to run, the
    CDI specs and the feature file. A mixin: the attributes are Discovery's (set in its __init__)."""

    cfg: Config
    stats: StatsReporter
    clock: Callable[[], float]
    watches: dict[str, ResourceWatch]
    runner: ProbeRunner
    leftovers_counted: int  # runner.leftovers already counted as input.command_leftovers
    host_inotify: Inotify
    host_wds: dict[str, tuple[int, int]]
    host_recheck: bool
    spec_writer: cdi.SpecWriter | None
    features: nfd.FeatureFileWriter | None
    nfd_expires: str
    nfd_refresh: float
    nfd_dirty: bool
    failed_writes: dict[str, str]
    specs_dirty: set[str]
    trim_due: bool

    def rescan(
        self,
        reason: str,
        watches: Iterable[ResourceWatch] | None = None,
        dirty: dict[str, set[str]] | None = None,
        whole: Iterable[str] = ("*",),
    ) -> None:
        raise NotImplementedError  # Discovery.rescan

    def _health_step(self) -> None:
        """Host-path events re-check the devices that name host paths; probe verdicts that changed
        re-check their devices; both only those devices (O(change)), never waiting."""
        events = self.host_inotify.read()
        for event in events:
            if event.mask & loop.SELF_GONE:
                # That path, and every path under it, no longer names the inode watched (the watches
                # below a moved directory followed it): let go of them all; the sync adds them by path.
                # The event's own watch may already be no path's (the sync watched the new inode at
                # the path): a moved inode stays watched by the kernel until let go of.
                under = event.path.rstrip("/") + "/"
                if event.mask & pyinotify.IN_MOVE_SELF:
                    self.host_inotify.remove(event.wd)
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
            gone = tuple(e.path.rstrip("/") + "/" for e in events if e.mask & loop.SELF_GONE)

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
        if self.runner.leftovers != self.leftovers_counted:  # a probe's fault: it left processes behind
            self.stats.count("input.command_leftovers", self.runner.leftovers - self.leftovers_counted)
            self.leftovers_counted = self.runner.leftovers
        if changed:
            by_resource: dict[str, set[str]] = {}
            for key in changed:
                resource, device_id = split_cdi_name(key)  # key(): the kind is the resource name
                if resource in self.watches:
                    by_resource.setdefault(resource, set()).add(device_id)
            if by_resource:
                self.rescan("probe", [self.watches[n] for n in by_resource], by_resource, ())
        if self.features is not None and self.clock() >= self.nfd_refresh:
            self._write_features()

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
                    if f": not run: {trust.UNTRUSTED}" in reason:  # a probe program someone untrusted can write
                        self.stats.count("input.untrusted_program")
                    elif reason.startswith(hostpaths.HOST_PATH_KEYS) and f" {trust.UNTRUSTED}" in reason:
                        self.stats.count("input.untrusted_host_path")  # a way to it someone untrusted can redirect
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
        O(devices) to build (36 ms and 1.2 MB for 10,000), so a burst of changes costs one write.
        Then, after a turn of TRIM_AFTER_NAMES names, the heap is trimmed."""
        for name in sorted(self.specs_dirty):
            if name in self.watches:
                self._write_spec(self.watches[name])
        self.specs_dirty.clear()
        if self.nfd_dirty:
            self._write_features()
        self._trim_heap()

    def _trim_heap(self) -> None:
        if self.trim_due and _malloc_trim is not None:
            _malloc_trim(0)
        self.trim_due = False

    def _sync_host_watches(self) -> None:
        """Watch exactly the directories the devices' host paths need (at most MAX_WATCH_DIRS).

        Each path's nearest existing parent gets the name events; its further ancestors only
        their own move or removal (renaming /a moves /a/b/x away without an event in /a/b). The
        check came before the watch: after a watch is added (or its mask widened), or could not
        be because its directory went, the devices are looked at again next turn, until the
        set of watches stops changing. A new mask is set on the watch in place, never by
        removing it: the events queued on it (its own move, which tells that the watches below
        it are stale) would go with it.
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
        for path in self.host_inotify.short - wanted.keys():
            self.host_inotify.forget(path)  # a watch the limit refused, no longer wanted
        for path, (wd, _) in list(self.host_wds.items()):
            if path not in wanted:  # nothing under it is wanted either (ancestors sort first)
                del self.host_wds[path]
                self.host_inotify.remove(wd)
        for path in sorted(p for p, mask in wanted.items() if self.host_wds.get(p, (0, 0))[1] != mask):
            added = self.host_inotify.add(path, wanted[path])
            if added is not None:
                # Same inode: the same wd, its mask replaced. Another inode (the directory was moved or
                # made again): a new wd; the old one's own event is still to come and lets go of it.
                self.host_wds[path] = (added, wanted[path])
                self.host_recheck = True
            elif not os.path.isdir(path):
                # Gone since the check (an existing directory that cannot be watched, EACCES or ENOSPC,
                # is left to the periodic rescan: looking again would find the same and spin).
                self.host_recheck = True

    def _write_spec(self, rw: ResourceWatch) -> None:
        """The resource's CDI spec, one device per advertised ID (replicas included)."""
        if self.spec_writer is None or rw.current is None:
            return
        name, writer = rw.resource.name, self.spec_writer
        data = cdi.encode_spec(name, rw.current, rw.resource.replicas)  # cdi.build's bytes, from kept entries
        self._write(f"cdi {name}", writer.path(name), lambda: writer.write_bytes(name, data))

    def _spec_before_publish(
        self, rw: ResourceWatch, came: list[Device], gone: list[Device], removed: Iterable[str]
    ) -> None:
        """A device that came, or whose spec entry changed, is in the spec before the kubelet hears of
        it (an Allocate of it then finds its CDI name); a removal alone waits for the end of the turn,
        a change of health or reason alone (no part of the spec) writes nothing."""
        if self.spec_writer is None:
            return
        before = {d.device_id: d for d in gone}
        self._note_unnamed(rw, [d.device_id for d in came if d.device_id not in before])
        if any(d.device_id not in before or not cdi.same_entry(d, before[d.device_id]) for d in came):
            self.specs_dirty.discard(rw.resource.name)
            self._write_spec(rw)
        elif removed:
            self.specs_dirty.add(rw.resource.name)

    def _note_unnamed(self, rw: ResourceWatch, added: list[str]) -> None:
        """One line and one count for each new ID the spec cannot carry. Its CDI name is the ID itself
        (namemap.cdi_device_name: never rewritten, so two IDs never share one); an ID that is no CDI name
        gets none rather than a rewritten one, which could be another file's ID."""
        if rw.resource.replicas > 1 or namemap.cdi_kind_problem(rw.resource.name) is not None:
            return  # a replica ID "<id>::<n>" ends in a digit; a resource that is no CDI kind has no spec
        for device_id in added:
            if (problem := cdi_device_name_problem(device_id)) is not None:
                LOG.warning(
                    "device left out of the CDI spec: Allocate gives it the classic answer",
                    resource=rw.resource.name,
                    device=device_id,
                    reason=problem,
                )
                self.stats.count("input.no_cdi_name")

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
        # Counts.of(rw.current) without a pass over the set: a file name ID holds no ':', so no
        # physical device folds into another, and rw.unhealthy is kept per change.
        sets = [
            (rw.resource.name, nfd.Counts(len(rw.current or ()), len(rw.current or ()) - rw.unhealthy))
            for rw in self.watches.values()
        ]
        data = nfd.render_features(sets, self.cfg.nfd_label_prefix, self.nfd_expires)
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
