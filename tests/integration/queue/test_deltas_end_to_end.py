"""The delta protocol end to end in one process: real discovery, real inotify, a real QueueServer socket.

What crosses the socket is recorded (a Receiver that remembers each wire message), so
the tests see deltas on the wire and exact snapshots on the plugin side: one change is
one small delta, every (re)connect starts with a full snapshot, a digest mismatch ends
in a resync, and a sender of the old version (full snapshots only) is still followed.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from pathlib import Path

import pytest

from colad.config.config import Config
from colad.core.devices import Device, DeviceSet
from colad.discovery.main import Discovery
from colad.queue import messages
from colad.queue.client import QueueClient
from colad.queue.messages import DeviceDelta, DeviceSnapshot
from colad.queue.server import QueueServer
from colad.queue.snapshots import Held, Outcome, Receiver
from tests.helpers import wait_until
from tests.integration.support import Inbox, RoleRunner, Serve, begin, discovery_config

pytestmark = pytest.mark.integration


class WireLog(Receiver):
    """A Receiver that keeps every device message as it came off the socket, with its outcome."""

    def __init__(self) -> None:
        super().__init__()
        self.lock = threading.Lock()
        self.wire: list[tuple[DeviceSnapshot | DeviceDelta, Outcome]] = []

    def apply(self, message: DeviceSnapshot | DeviceDelta, source: object = None) -> Outcome:
        outcome = super().apply(message, source)
        with self.lock:
            self.wire.append((message, outcome))
        return outcome

    def kinds(self) -> list[str]:
        with self.lock:
            return [type(m).__name__ for m, _ in self.wire]

    def last(self) -> DeviceSnapshot | DeviceDelta:
        with self.lock:
            return self.wire[-1][0]


@pytest.fixture
def cfg(short_tmp: Path) -> Config:
    return discovery_config(short_tmp)


def _serve(serve: Serve, cfg: Config) -> tuple[QueueServer, Inbox, WireLog]:
    log = WireLog()
    server, inbox = serve(cfg.queue_socket, receiver=log)
    return server, inbox, log


@pytest.fixture
def discovery(cfg: Config) -> Discovery:
    """A discovery (not started: `_start`) over 200 empty device files."""
    for i in range(200):
        (Path(cfg.device_dir) / f"cola{i:03d}").write_text("")
    return Discovery(cfg)


def _start(role: Discovery, runners: Callable[[Discovery], RoleRunner]) -> RoleRunner:
    begin(role)
    return runners(role).start()


def _exact(inbox: Inbox, cfg: Config) -> Callable[[], bool]:
    """A wait_until predicate: the plugin side holds exactly the files on disk."""

    def check() -> bool:
        snap = inbox.latest(DeviceSnapshot)
        return snap is not None and snap.devices.ids == tuple(sorted(os.listdir(cfg.device_dir)))

    return check


def test_one_change_is_one_small_delta(
    cfg: Config, serve: Serve, runners: Callable[[Discovery], RoleRunner], discovery: Discovery
) -> None:
    _, inbox, log = _serve(serve, cfg)
    _start(discovery, runners)
    wait_until(_exact(inbox, cfg), 10, "the first full snapshot")
    assert log.kinds() == ["DeviceSnapshot"]
    full_size = len(messages.encode(log.last()))
    (Path(cfg.device_dir) / "cola999").write_text("")
    os.unlink(Path(cfg.device_dir) / "cola000")
    wait_until(_exact(inbox, cfg), 10, "the change to reach the plugin")
    assert set(log.kinds()[1:]) == {"DeviceDelta"}, log.kinds()
    deltas = [m for m, _ in log.wire[1:] if isinstance(m, DeviceDelta)]  # one or two: inotify may split them
    assert [r for d in deltas for r in d.removes] == ["cola000"]
    assert [u.device_id for d in deltas for u in d.upserts] == ["cola999"]
    assert all(len(messages.encode(d)) < 256 < full_size // 10 for d in deltas)
    assert "resync" not in inbox.rejects


def test_digest_mismatch_ends_in_a_resync_and_the_exact_list(
    cfg: Config, serve: Serve, runners: Callable[[Discovery], RoleRunner], discovery: Discovery
) -> None:
    _, inbox, log = _serve(serve, cfg)
    _start(discovery, runners)
    wait_until(_exact(inbox, cfg), 10, "the first full snapshot")
    # Corrupt what the plugin side holds, keeping its position: the next delta's digest cannot match.
    key = messages.snapshot_key(cfg.resources[0].name)
    with log.lock:
        held = log.held[key]
        wrong = DeviceSet.of([*held.snapshot.devices, Device("ghost")])
        log.held[key] = Held(
            DeviceSnapshot(held.snapshot.epoch, held.snapshot.seq, wrong), wrong.ids, None, held.source
        )
    (Path(cfg.device_dir) / "cola500").write_text("")
    wait_until(_exact(inbox, cfg), 10, "the resync to bring the exact list")
    assert "resync" in inbox.rejects
    kinds = log.kinds()
    assert kinds[-2:] == ["DeviceDelta", "DeviceSnapshot"], kinds  # refused, then the full one on reconnect
    assert all("ghost" not in s.devices for s in inbox.of(DeviceSnapshot))
    (Path(cfg.device_dir) / "cola501").write_text("")  # and deltas flow again on the new connection
    wait_until(_exact(inbox, cfg), 10, "the next change")
    assert log.kinds()[-1] == "DeviceDelta"


def test_restarted_plugin_gets_a_full_snapshot_then_deltas(
    cfg: Config, serve: Serve, runners: Callable[[Discovery], RoleRunner], discovery: Discovery
) -> None:
    server, inbox, _ = _serve(serve, cfg)
    _start(discovery, runners)
    wait_until(_exact(inbox, cfg), 10, "the first full snapshot")
    server.stop()
    wait_until(lambda: discovery.client.sock is None, 10, "discovery to notice the plugin went away")
    os.unlink(Path(cfg.device_dir) / "cola007")  # changed while the plugin is away
    wait_until(lambda: "cola007" not in (discovery.current or DeviceSet()), 10, "discovery to see it")
    _, inbox, log = _serve(serve, cfg)
    wait_until(_exact(inbox, cfg), 10, "the new plugin to hold the exact list")
    assert log.kinds()[0] == "DeviceSnapshot"
    (Path(cfg.device_dir) / "cola007").write_text("")
    wait_until(_exact(inbox, cfg), 10, "the next change")
    assert log.kinds()[1:] == ["DeviceDelta"]


def test_restarted_discovery_starts_with_a_full_snapshot(
    cfg: Config, serve: Serve, runners: Callable[[Discovery], RoleRunner], discovery: Discovery
) -> None:
    _, inbox, log = _serve(serve, cfg)
    runner = _start(discovery, runners)
    wait_until(_exact(inbox, cfg), 10, "the first full snapshot")
    runner.stop()
    discovery.client.close()
    os.unlink(Path(cfg.device_dir) / "cola100")
    second = Discovery(cfg)
    _start(second, runners)
    wait_until(_exact(inbox, cfg), 10, "the restarted discovery's list")
    assert log.kinds()[-1] == "DeviceSnapshot" and log.last().epoch >= discovery.epoch
    (Path(cfg.device_dir) / "cola100").write_text("")
    wait_until(_exact(inbox, cfg), 10, "the next change")
    assert log.kinds()[-1] == "DeviceDelta"


def _count_is(inbox: Inbox, count: int) -> Callable[[], bool]:
    return lambda: len(inbox.of(DeviceSnapshot)) == count


def test_an_old_sender_of_full_snapshots_only_is_followed(cfg: Config, serve: Serve) -> None:
    _, inbox, log = _serve(serve, cfg)
    client = QueueClient(cfg.queue_socket)
    try:
        for seq, count in enumerate([3, 5, 4], start=1):
            found = DeviceSet.of(Device(f"cola{i}") for i in range(count))
            client.publish(DeviceSnapshot(1, seq, found))
            wait_until(_count_is(inbox, seq), 10, f"snapshot {seq}")
            assert inbox.of(DeviceSnapshot)[-1].devices == found
    finally:
        client.close()
    assert log.kinds() == ["DeviceSnapshot"] * 3
    assert "resync" not in inbox.rejects
