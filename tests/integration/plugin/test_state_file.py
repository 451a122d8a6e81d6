"""The plugin shell's state file: coalesced, never lost, exact at the end (in-process, against the fake kubelet).

A change does not cost a write per published event (received, then sent): the shell writes
at once after a quiet spell and at most once per STATE_FILE_INTERVAL otherwise. The plugin's clock
is the test's, so "within the interval" is a step of that clock, never a wall-clock wait.
"""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from colad.core.devices import Device, DeviceSet
from colad.deviceplugin.service import build_server
from colad.outputs import statefile
from colad.plugin.main import STATE_FILE_INTERVAL, Plugin
from colad.plugin.registrar import Servers
from colad.queue.framing import Peer
from colad.queue.messages import DeviceSnapshot
from tests.fakes.kubelet import FakeKubelet
from tests.helpers import wait_until
from tests.integration.support import make_config

pytestmark = pytest.mark.integration

RESOURCE = "myway5.com/cola"
DEADLINE = 30.0


class Clock:
    """A monotonic clock the test moves; thread-safe enough for one float."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class Shell:
    """A Plugin on the test's clock, its state-file writes counted, and a fake kubelet."""

    def __init__(self, root: Path, monkeypatch: pytest.MonkeyPatch) -> None:
        self.cfg = make_config(root, metrics_address="", pod_resources_socket="")
        self.clock = Clock()
        self.plugin = Plugin(self.cfg, clock=self.clock, servers=Servers(build=build_server))
        self.kubelet = FakeKubelet(self.cfg.kubelet_dir, dial_timeout=5.0)
        self.writes: list[statefile.PluginState] = []
        real_write = statefile.write

        def counted(path: str, state: statefile.PluginState) -> str:
            written = real_write(path, state)
            self.writes.append(state)  # after the write: a test that saw the count reads this file
            return written

        monkeypatch.setattr(statefile, "write", counted)
        self.result: list[int] = []
        self.thread = threading.Thread(target=lambda: self.result.append(self.plugin.run()), name="life-cycle")
        self.seq = 0

    def send(self, *ids: str) -> None:
        self.seq += 1
        snapshot = DeviceSnapshot(1, self.seq, DeviceSet.of([Device(i) for i in ids]), True, RESOURCE)
        self.plugin.on_message(snapshot, Peer(os.getpid(), 0, 0))

    def wait_held(self, ids: list[str]) -> None:
        wanted = dict.fromkeys(ids, "Healthy")
        wait_until(lambda: self.kubelet.devices(RESOURCE) == wanted, DEADLINE, f"the kubelet to hold {len(ids)}")

    def on_disk(self) -> statefile.PluginState:
        return statefile.read(self.cfg.plugin_state_file)

    def settled(self) -> bool:
        """Registered, one stream, and the list the kubelet holds is the one published."""
        [r] = self.plugin.snapshot.state.resources
        return r.registered and r.streams == 1 and r.list_sent


@contextlib.contextmanager
def running(root: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Shell]:
    """A started Shell; on the way out it stops, and must have exited 0 with no kubelet violation."""
    s = Shell(root, monkeypatch)
    s.kubelet.start()
    s.thread.start()
    yield s
    s.plugin.stop()
    s.thread.join(15)
    s.kubelet.stop()
    assert not s.thread.is_alive() and s.result == [0]
    assert s.kubelet.violations == []


@pytest.fixture
def shell(short_tmp: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Shell]:
    with running(short_tmp, monkeypatch) as s:
        yield s


def test_a_burst_of_changes_costs_one_write_and_the_file_catches_up(shell: Shell) -> None:
    shell.send("cola-0")
    wait_until(shell.settled, DEADLINE, "registered, streamed, list sent")
    shell.clock.now += STATE_FILE_INTERVAL  # a quiet spell: the file catches up at once
    wait_until(lambda: shell.on_disk() == shell.plugin.snapshot.state, DEADLINE, "the file up to date")
    before = len(shell.writes)
    shell.clock.now += STATE_FILE_INTERVAL  # quiet since that write

    for n in range(1, 11):  # ten changes, each received and sent: twenty published snapshots, clock still
        ids = [f"cola-{i}" for i in range(n + 1)]
        shell.send(*ids)
        shell.wait_held(ids)
        wait_until(shell.settled, DEADLINE, "the change sent")
    assert len(shell.writes) - before == 1, "the first change is written at once, the rest wait for the interval"
    assert shell.on_disk().resources[0].devices == 2, "the file holds the first change, not yet the last"

    shell.clock.now += STATE_FILE_INTERVAL
    wait_until(lambda: len(shell.writes) - before == 2, DEADLINE, "the one write the interval allows")
    assert shell.on_disk() == shell.plugin.snapshot.state
    assert shell.on_disk().resources[0].devices == 11 and shell.on_disk().resources[0].list_sent


def test_stop_writes_the_final_state_at_once(shell: Shell) -> None:
    shell.send("cola-0", "cola-1")
    wait_until(shell.settled, DEADLINE, "registered, streamed, list sent")
    shell.send("cola-0")  # published, not yet written: the clock does not move
    shell.wait_held(["cola-0"])
    shell.plugin.stop()
    shell.thread.join(15)
    on_disk = shell.on_disk()
    assert on_disk == shell.plugin.snapshot.state
    assert on_disk.resources[0].state == "stopped" and on_disk.resources[0].devices == 0
