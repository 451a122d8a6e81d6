"""Discovery's NFD feature file, end to end in-process: real inotify, a real QueueServer.

The file is written at start, rewritten on every change of the counts, and only ever replaced
whole: a reader hammering it never sees a part, and the kernel reports the name only as a
rename into features.d (never created, modified or written in place). The counts follow a
device going Unhealthy (a host path gone, a declared health, a malformed file) and one removed,
replicas folded into their physical device. The safety rescan is an hour away.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from pathlib import Path

import pyinotify
import pytest

from colad.core import namemap
from colad.discovery.main import Discovery
from colad.watchers.inotify import Inotify, InotifyEvent
from tests.helpers import wait_until
from tests.integration.support import RoleRunner, Serve, begin, make_config
from tests.oracles import nfd_labels

pytestmark = pytest.mark.integration

RESOURCE = "example.com/cola"
BASE = "example.com-cola"
# Every way a name in features.d can come to hold new bytes (reads left out: the hammer's own).
WRITES = (
    pyinotify.IN_CREATE
    | pyinotify.IN_MODIFY
    | pyinotify.IN_CLOSE_WRITE
    | pyinotify.IN_ATTRIB
    | pyinotify.IN_MOVED_TO
    | pyinotify.IN_MOVED_FROM
    | pyinotify.IN_DELETE
)


class Hammer:
    """Reads the feature file as fast as it can, in a thread; keeps every read that was not whole."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.reads = 0
        self.broken: list[bytes] = []
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self.stop.is_set():
            try:
                data = self.path.read_bytes()
            except FileNotFoundError:
                continue
            self.reads += 1
            labels = nfd_labels(data)
            if not data.endswith(b"\n") or set(labels) != {f"{BASE}.{s}" for s in namemap.NFD_LABEL_SUFFIXES}:
                self.broken.append(data)


def test_the_feature_file_follows_the_counts_and_is_only_ever_replaced_whole(
    short_tmp: Path, serve: Serve, runners: Callable[[Discovery], RoleRunner]
) -> None:
    devices, host, features = short_tmp / "devices", short_tmp / "host", short_tmp / "features.d" / "colad"
    for d in (devices, host / "present", features.parent):
        d.mkdir(parents=True)
    os.mkdir(short_tmp / "run", 0o700)
    mount = '[[mounts]]\nhost_path = "{}"\ncontainer_path = "/m"\n'
    (devices / "dev-0").write_text("")
    (devices / "dev-1").write_text(mount.format(host / "present"))
    (devices / "dev-2").write_text(mount.format(host / "absent"))
    cfg = make_config(
        short_tmp, resource_name=RESOURCE, replicas=2, cdi="off", nfd_features_file=str(features), nfd_expiry=600.0
    )
    events = Inotify()
    events.add(str(features.parent), WRITES)
    hammer = Hammer(features)
    hammer.thread.start()
    _, inbox = serve(cfg.queue_socket)
    discovery = Discovery(cfg)
    runner = runners(discovery)
    begin(discovery)
    runner.start()
    seen: list[InotifyEvent] = []

    def labels(present: str, count: int, healthy: int, what: str) -> None:
        want = {f"{BASE}.present": present, f"{BASE}.devices": str(count), f"{BASE}.healthy": str(healthy)}

        def exact() -> bool:
            got = nfd_labels(features.read_bytes())
            if got != want:
                raise AssertionError(f"labels: {got}")
            return True

        wait_until(exact, 10, f"{what}: {want}")
        seen.extend(events.read())

    try:
        labels("true", 3, 2, "written at start")  # dev-2's mount source is missing; replicas fold
        text = features.read_text()
        assert text.startswith("# Written by colad") and "# +expiry-time=20" in text, text
        inode = features.stat().st_ino
        (host / "present").rmdir()
        labels("true", 3, 1, "dev-1 Unhealthy (its mount source gone)")
        assert features.stat().st_ino != inode  # a new file renamed over the old one
        (devices / "dev-0").unlink()
        labels("true", 2, 0, "dev-0 removed")
        (devices / "dev-3").write_text('health = "Unhealthy"\n')
        (devices / "dev-4").write_text("numa_nodes = 7\n")  # malformed: Unhealthy, still counted
        labels("true", 4, 0, "a declared-Unhealthy and a malformed device")
        (host / "absent").mkdir()
        (host / "present").mkdir()
        labels("true", 4, 2, "both mount sources there")
        for name in os.listdir(devices):
            (devices / name).unlink()
        labels("false", 0, 0, "no device left")
    finally:
        hammer.stop.set()
        hammer.thread.join(10)
        runner.stop()
    assert discovery.stats.counters.get("rescans.periodic", 0) == 0  # inotify told, not the timer
    assert hammer.reads > 0 and hammer.broken == [], hammer.broken[:3]
    named = [e for e in seen if e.name == features.name]
    assert named and all(e.mask & WRITES == pyinotify.IN_MOVED_TO for e in named), [hex(e.mask) for e in named]
    assert os.listdir(features.parent) == [features.name]  # no temporary left behind
    events.close()
