"""Health for `colad discovery`: what makes a device Unhealthy besides its file.

Reads: each device's host paths (hostpaths.py, watched by inotify) and its probe verdicts
(probes.py), through each resource's overlay (colad.discovery.scan.DeviceHealth). `HealthFollower`
keeps the host-path watches and the probes to run in step with the devices, and tells the Discovery
loop (colad/discovery/main.py) which devices to read again; it writes no file.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping

import pyinotify

from colad.core import trust
from colad.core.device_rules import split_cdi_name
from colad.discovery import hostpaths
from colad.jobs.probes import PENDING, ProbeRunner
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


class HealthFollower:
    """The host-path watches (in their own inotify) and the probes to run, kept in step with the devices.

    The Discovery loop asks it each turn which devices an event or a verdict concerns
    (host_path_rescans(), probe_rescans()), reads those again, and hands it each scan's health notes
    (after_scan()).
    """

    def __init__(self, runner: ProbeRunner, stats: StatsReporter) -> None:
        self.runner = runner
        self.stats = stats
        self.leftovers_counted = 0  # runner.leftovers already counted as input.command_leftovers
        # Host-path watches in their own inotify: a shared one would merge them with the device
        # directories' watches (one wd per inode) and a removal would end both.
        self.host_inotify = Inotify(stats.count)
        self.host_wds: dict[str, tuple[int, int]] = {}  # directory -> (wd, mask)
        self.host_recheck = False  # a watch was added: look at the host paths again

    def host_path_rescans(self, watches: Mapping[str, ResourceWatch]) -> dict[str, set[str]] | None:
        """The devices, per resource, that host-path events concern (O(change)): only those with a
        path in a directory that had an event, or under one that moved or went; after an overflow or
        a watch just added, every device that names a path. None when there was nothing to look at;
        otherwise the loop reads them again, then calls sync()."""
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
        if not events and not self.host_recheck:
            return None
        named: dict[str, set[str]] = {}
        every = self.host_recheck or any(e.overflow for e in events)
        self.host_recheck = False
        touched = {e.path for e in events}
        gone = tuple(e.path.rstrip("/") + "/" for e in events if e.mask & loop.SELF_GONE)

        def concerned(dirs: frozenset[str]) -> bool:
            return every or not dirs.isdisjoint(touched) or any(d.startswith(gone) for d in dirs)

        for n, rw in watches.items():
            ids = {i for i, dirs in rw.health.dirs.items() if concerned(dirs)}
            if ids:
                named[n] = ids
        return named

    def probe_rescans(self, watches: Mapping[str, ResourceWatch]) -> dict[str, set[str]]:
        """The devices, per resource, whose probe verdict changed; counts what probes left behind."""
        changed = self.runner.poll()
        if self.runner.leftovers != self.leftovers_counted:  # a probe's fault: it left processes behind
            self.stats.count("input.command_leftovers", self.runner.leftovers - self.leftovers_counted)
            self.leftovers_counted = self.runner.leftovers
        by_resource: dict[str, set[str]] = {}
        if changed:
            for key in changed:
                resource, device_id = split_cdi_name(key)  # key(): the kind is the resource name
                if resource in watches:
                    by_resource.setdefault(resource, set()).add(device_id)
        return by_resource

    def after_scan(self, targets: Iterable[ResourceWatch], watches: Mapping[str, ResourceWatch]) -> None:
        """Log and count the health reasons of `targets` that changed; follow the host paths'
        directories and the probes to run of all `watches`."""
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
            self.sync(watches)
        if probes:
            wanted = {rw.health.key(i): p for rw in watches.values() for i, p in rw.health.probes.items()}
            self.runner.set_probes(wanted)

    def sync(self, watches: Mapping[str, ResourceWatch]) -> None:
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
        for rw in watches.values():
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

    def fds(self) -> list[int | None]:
        return [self.host_inotify.fileno(), *self.runner.fds()]

    def close(self) -> None:
        """Each probe killed with what it started; the host-path watches let go of."""
        self.runner.close()
        self.host_inotify.close()
