"""Role `colad discovery`: turns the device directory into DeviceSnapshots on the queue.

Reads: the device directory (inotify, plus a periodic safety rescan).
Writes: a full DeviceSnapshot to the plugin over the local queue whenever the
device set changes, and again after every reconnect. Level-triggered: any
event, an inotify queue overflow or the timer all mean "list the directory
again, build a new set, compare". Neighbours: plugin.py (the queue's owner).
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable

import pyinotify

from colad import config as config_mod
from colad import devices, log, messages, watch
from colad.config import Config
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
        self.device_dir = watch.DirWatch(self.inotify, cfg.device_dir, DEVICE_EVENTS)
        self.current: devices.DeviceSet | None = None
        self.present: bool | None = None
        self.warned: set[str] = set()
        self.next_rescan = 0.0

    def rescan(self, reason: str) -> None:
        """`reason` is one of start, inotify, overflow, periodic, directory (a metrics label)."""
        self.stats.count(f"rescans.{reason}")
        LOG.debug("rescan", reason=reason)
        names, present = list_regular_files(self.cfg.device_dir)
        result = devices.build(names)
        for skipped in result.skipped:
            if skipped.name not in self.warned:
                self.warned.add(skipped.name)
                LOG.warning("file skipped: not a valid device ID", name=skipped.name, reason=skipped.reason)
        self.warned &= {s.name for s in result.skipped}  # warn again if it comes back later
        self.next_rescan = self.clock() + self.cfg.rescan_interval
        if result.devices == self.current and present == self.present:
            return
        previous = self.current or devices.DeviceSet()
        self.current, self.present = result.devices, present
        seq = self.next_seq()
        # Send first, log after: the log line is not on the path to the kubelet.
        self.client.publish(messages.DeviceSnapshot(self.epoch, seq, result.devices, present))
        change = devices.diff(previous, result.devices)
        LOG.info(
            "device set changed",
            reason=reason,
            devices=len(result.devices),
            added=len(change.added),
            removed=len(change.removed),
            dir_present=present,
            seq=seq,
        )
        if change and len(change.added) + len(change.removed) <= 20:
            LOG.debug("device changes", added=",".join(change.added), removed=",".join(change.removed))

    def step(self, timeout: float) -> None:
        """One turn of the loop: wait for events, then rescan if anything may have changed."""
        events = self.wait(timeout)
        if events is None:
            return
        reason = None
        for event in events:
            self.device_dir.note(event)
            if event.overflow:
                reason = "overflow"
            elif self.device_dir.concerns(event):
                reason = reason or "inotify"
        if self.device_dir.ensure():
            reason = reason or "directory"
        if reason is None and self.clock() >= self.next_rescan:
            reason = "periodic"
        if reason:
            self.rescan(reason)
        self.finish(self.clock())

    def timeout(self) -> float:
        return max(0.0, min([self.next_rescan, *self.due()]) - self.clock())

    def run(self) -> int:
        self.run_dir.ensure()
        self.device_dir.ensure()
        self.rescan("start")
        while not self.stopping:
            self.step(self.timeout())
        self.close()
        LOG.info("discovery stopped")
        return 0


def main(args: object = None, cfg: Config | None = None) -> int:
    cfg = cfg or config_mod.load()
    return watch.run_role("discovery", lambda: Discovery(cfg), cfg, device_dir=cfg.device_dir)
