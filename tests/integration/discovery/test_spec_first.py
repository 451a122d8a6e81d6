"""A device reaches the plugin's end of the queue only after colad's CDI spec on disk carries it.

Discovery over real inotify and a real QueueServer: the moment each snapshot arrives (in the
server's own callback, before anything else runs on it), the spec file is read as Allocate
reads it (cdi.SpecReader) and every device of the snapshot must be in it with its current
entry; a removal may linger in the spec until the end of the turn. A change of health alone
leaves the spec file as it is (no write, same inode).
"""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from colad.config.config import Config
from colad.core import namemap
from colad.core.devices import Device
from colad.discovery.main import Discovery
from colad.outputs import cdi
from colad.queue.framing import Peer
from colad.queue.messages import DeviceSnapshot, Message
from colad.queue.server import QueueServer
from tests.helpers import wait_until
from tests.integration.support import RoleRunner, begin, make_config
from tests.oracles import spec_entry

pytestmark = pytest.mark.integration

RESOURCE = "example.com/cola"


class SpecAtArrival:
    """Each snapshot as it arrives, with the spec's entries read from disk in that same moment."""

    def __init__(self, cfg: Config) -> None:
        self.cfg = cfg
        self.lock = threading.Lock()
        self.seen: list[tuple[DeviceSnapshot, dict[str, Any], cdi.Listed]] = []
        self.reader = cdi.SpecReader()

    def on_message(self, message: Message, peer: Peer) -> None:
        if not isinstance(message, DeviceSnapshot):
            return
        listed = self.reader.read(self.cfg.cdi_spec_dir, RESOURCE)
        path = os.path.join(self.cfg.cdi_spec_dir, namemap.cdi_spec_file(RESOURCE))
        try:
            entries = {d["name"]: d for d in json.loads(Path(path).read_bytes())["devices"]}
        except FileNotFoundError:
            entries = {}
        with self.lock:
            self.seen.append((message, entries, listed))

    def latest(self) -> dict[str, Device]:
        with self.lock:
            return {} if not self.seen else {d.device_id: d for d in self.seen[-1][0].devices}

    @staticmethod
    def _same_device_from(
        seen: list[tuple[DeviceSnapshot, dict[str, Any], cdi.Listed]], i: int, device_id: str
    ) -> list[Device]:
        """The device `device_id` as snapshot i and every later one has it."""
        return [d for snapshot, _, _ in seen[i:] for d in snapshot.devices if d.device_id == device_id]

    def check(self) -> int:
        """Every device of every snapshot was in the spec, as the spec oracle has it, when it arrived."""
        with self.lock:
            seen = list(self.seen)
        for i, (snapshot, entries, listed) in enumerate(seen):
            for device in snapshot.devices:
                assert device.device_id in listed.names, (snapshot.seq, device.device_id, listed)
                # Never behind: the entry is this snapshot's device, or (discovery already wrote the
                # next change while this one was on its way) the same device in a later snapshot.
                allowed = [spec_entry(d) for d in self._same_device_from(seen, i, device.device_id)]
                assert entries[device.device_id] in allowed, (snapshot.seq, device.device_id)
        return len(seen)


@pytest.fixture
def arrival(short_tmp: Path) -> Iterator[tuple[Config, SpecAtArrival]]:
    os.mkdir(short_tmp / "devices")
    os.mkdir(short_tmp / "run", 0o700)
    cfg = make_config(short_tmp, resource_name=RESOURCE, cdi_spec_dir=str(short_tmp / "cdi"))
    spy = SpecAtArrival(cfg)
    server = QueueServer(cfg.queue_socket, spy.on_message)
    server.start()
    yield cfg, spy
    server.stop()


def test_a_new_or_changed_device_is_in_the_spec_when_its_snapshot_arrives(
    arrival: tuple[Config, SpecAtArrival], runners: Callable[[Discovery], RoleRunner]
) -> None:
    cfg, spy = arrival
    d = Path(cfg.device_dir)
    (d / "dev-0").write_text('[envs]\nMODE = "fast"\n')
    discovery = Discovery(cfg)
    runner = runners(discovery)
    begin(discovery)
    runner.start()
    wait_until(lambda: "dev-0" in spy.latest(), 10, "the first snapshot")
    for i in range(1, 25):  # one at a time: each is a publish of its own
        (d / f"dev-{i}").write_text(f'[envs]\nN = "{i}"\n' if i % 2 else "")
        wait_until(lambda i=i: f"dev-{i}" in spy.latest(), 10, f"dev-{i}")  # type: ignore[misc]
    for mode in ("slow", "medium", "fast"):  # a changed entry: the new env is in the spec on arrival
        (d / "dev-0").write_text(f'[envs]\nMODE = "{mode}"\n')
        wait_until(lambda m=mode: dict(spy.latest()["dev-0"].envs).get("MODE") == m, 10, mode)  # type: ignore[misc]
    for i in range(1, 25, 3):
        (d / f"dev-{i}").unlink()
    wait_until(lambda: "dev-22" not in spy.latest(), 10, "the removals")
    (d / "dev-99").write_text("")
    wait_until(lambda: "dev-99" in spy.latest(), 10, "dev-99")
    assert spy.check() >= 28


def test_a_change_of_health_alone_leaves_the_spec_file_alone(
    arrival: tuple[Config, SpecAtArrival], runners: Callable[[Discovery], RoleRunner]
) -> None:
    cfg, spy = arrival
    d = Path(cfg.device_dir)
    for i in range(5):
        (d / f"dev-{i}").write_text("")
    discovery = Discovery(cfg)
    runner = runners(discovery)
    begin(discovery)
    runner.start()
    wait_until(lambda: len(spy.latest()) == 5, 10, "the first snapshot")
    path = Path(cfg.cdi_spec_dir, namemap.cdi_spec_file(RESOURCE))
    wait_until(path.exists, 10, "the spec")
    before = path.stat()
    (d / "dev-3").write_text('health = "Unhealthy"\n')
    wait_until(lambda: not spy.latest()["dev-3"].healthy, 10, "dev-3 Unhealthy")
    (d / "dev-4").write_text("")  # one more turn after it: nothing was left to write at its end
    (d / "dev-5").write_text("")
    wait_until(lambda: "dev-5" in spy.latest(), 10, "dev-5")
    after = path.stat()
    assert (after.st_ino, after.st_size) != (before.st_ino, before.st_size)  # dev-5 was written
    runner.stop()
    written = path.stat()
    (d / "dev-2").write_text('health = "Unhealthy"\n')
    runner.start()
    wait_until(lambda: not spy.latest()["dev-2"].healthy, 10, "dev-2 Unhealthy")
    runner.stop()  # the turn has ended: its end-of-turn writes are done
    assert path.stat().st_ino == written.st_ino
    assert spy.check() >= 4
