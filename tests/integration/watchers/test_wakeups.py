"""A wake-up that changes nothing stat()s nothing; every identity change is still seen at once.

Real inotify on temp directories, the watchers stepped by hand (`drain`: until every queued
event is read) with the recheck timer pushed out of reach, so what is seen is seen through
an event, an overflow or a mount change, never through the timer. `stats` counts the
identity stat()s of loop._identity (the real one runs); the timer has a test of its own.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from colad.config.config import Config
from colad.discovery.main import Discovery
from colad.kubelet_watch.main import KubeletWatch
from colad.queue.messages import DeviceSnapshot, KubeletState
from colad.queue.server import QueueServer
from colad.watchers import loop
from tests.helpers import wait_until
from tests.integration.support import Serve, begin, bind_socket, make_config

pytestmark = pytest.mark.integration

CHECKPOINT = "kubelet_internal_checkpoint"


@pytest.fixture
def stats(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Paths loop._identity stat()ed, in order; and no recheck timer within any test's reach."""
    seen: list[str] = []
    real = loop._identity

    def counting(path: str) -> tuple[int, int] | None:
        seen.append(path)
        return real(path)

    monkeypatch.setattr(loop, "_identity", counting)
    monkeypatch.setattr(loop, "RECHECK_INTERVAL", 3600.0)
    return seen


@pytest.fixture
def cfg(short_tmp: Path) -> Config:
    config = make_config(short_tmp, kubelet_dir=str(short_tmp / "kl" / "device-plugins"))
    os.mkdir(config.run_dir, 0o700)
    os.makedirs(config.kubelet_dir)
    bind_socket(Path(config.kubelet_socket))
    return config


@pytest.fixture
def server(cfg: Config, serve: Serve) -> QueueServer:
    return serve(cfg.queue_socket)[0]


@pytest.fixture
def watcher(cfg: Config, server: QueueServer, stats: list[str]) -> Iterator[KubeletWatch]:
    role = KubeletWatch(cfg)
    begin(role)
    drain(role)
    yield role
    role.close()


def drain(role: loop.WatcherLoop) -> None:
    """Step by hand until the inotify queue is empty (every event so far has been read)."""
    role.step(0)  # type: ignore[attr-defined]
    while role.inotify.fileno() in loop.poll([role.inotify.fileno()], 0):
        role.step(0)  # type: ignore[attr-defined]


def stepping(role: loop.WatcherLoop, holds: Callable[[], bool]) -> Callable[[], bool]:
    """For wait_until: one step of `role` (up to 50 ms), then whether `holds` now holds."""

    def once() -> bool:
        role.step(0.05)  # type: ignore[attr-defined]
        return holds()

    return once


def identity(path: Path | str) -> tuple[int, int]:
    st = os.stat(path)
    return (st.st_dev, st.st_ino)


def socket_identity(path: Path) -> str:
    """What the watcher should report for the socket at `path`, computed independently."""
    st = os.stat(path)
    return f"{st.st_dev}:{st.st_ino}:{st.st_ctime_ns}"


def checkpoint(kubelet_dir: Path, i: int) -> None:
    """pkg/kubelet/checkpointmanager: a dot-prefixed temp file renamed over the checkpoint."""
    tmp = kubelet_dir / f".{CHECKPOINT}.{i}"
    tmp.write_text(f'{{"Data":"{i}"}}')
    os.rename(tmp, kubelet_dir / CHECKPOINT)


def test_checkpoint_churn_and_run_dir_entries_stat_no_directory(watcher: KubeletWatch, stats: list[str]) -> None:
    kubelet_dir, run_dir = Path(watcher.cfg.kubelet_dir), Path(watcher.cfg.run_dir)
    seq, stats[:] = watcher.seq, []
    for i in range(30):
        checkpoint(kubelet_dir, i)
        (run_dir / f"other-{i}").write_text("")  # an entry of the run directory that is not queue.sock
        drain(watcher)
    assert stats == [], "a wake-up with nothing but entry events stat()ed a watched directory"
    assert watcher.seq == seq, "the churn made the watcher publish"

    bind_socket(kubelet_dir / "colad-1.sock")  # what matters still goes out, still without a stat()
    drain(watcher)
    assert watcher.last is not None and watcher.last[1] == ("colad-1.sock",)
    assert stats == []


def _removed_and_recreated(d: Path) -> None:
    shutil.rmtree(d)
    d.mkdir()


def _renamed_away_and_another_renamed_in(d: Path) -> None:
    os.rename(d, d.parent / "old")
    (d.parent / "new").mkdir()
    os.rename(d.parent / "new", d)


def _renamed_over_an_empty_one(d: Path) -> None:
    for entry in d.iterdir():
        entry.unlink()
    (d.parent / "new").mkdir()
    os.rename(d.parent / "new", d)  # one rename(2): the old directory is never seen missing


def _replaced_by_a_symlink(d: Path) -> None:
    (d.parent / "elsewhere").mkdir()
    shutil.rmtree(d)
    os.symlink(d.parent / "elsewhere", d)


def _symlink_retargeted(d: Path) -> None:
    _replaced_by_a_symlink(d)
    (d.parent / "second").mkdir()
    os.symlink(d.parent / "second", d.parent / "link.tmp")
    os.rename(d.parent / "link.tmp", d)  # as `ln -sfn` does it


def _renamed_away_during_an_overflow(d: Path) -> None:
    limit = int(Path("/proc/sys/fs/inotify/max_queued_events").read_text())
    for i in range(limit // 2 + 10):  # two events each: the queue overflows, later events are lost
        (d / f"churn-{i}").write_text("")
        os.unlink(d / f"churn-{i}")
    _renamed_away_and_another_renamed_in(d)


REPLACEMENTS = [
    pytest.param(_removed_and_recreated, id="removed-recreated"),
    pytest.param(_renamed_away_and_another_renamed_in, id="renamed-away-another-in"),
    pytest.param(_renamed_over_an_empty_one, id="renamed-over"),
    pytest.param(_replaced_by_a_symlink, id="symlink"),
    pytest.param(_symlink_retargeted, id="symlink-retargeted"),
    pytest.param(_renamed_away_during_an_overflow, id="overflow"),
]


@pytest.mark.parametrize("replace", REPLACEMENTS)
def test_a_replaced_kubelet_directory_is_followed_at_the_first_wake_up(
    watcher: KubeletWatch, replace: Callable[[Path], None]
) -> None:
    kubelet_dir = Path(watcher.cfg.kubelet_dir)
    for i in range(3):
        checkpoint(kubelet_dir, i)  # churn first: the fast path is what is being left
        drain(watcher)
    replace(kubelet_dir)
    drain(watcher)
    assert watcher.kubelet_dir.identity == identity(kubelet_dir)
    bind_socket(kubelet_dir / "kubelet.sock")  # is the new directory itself watched?
    bind_socket(kubelet_dir / "colad-2.sock")
    drain(watcher)
    assert watcher.last == (socket_identity(kubelet_dir / "kubelet.sock"), ("colad-2.sock",))


def test_a_retargeted_symlink_is_followed_with_only_its_name_event_in_the_parent(watcher: KubeletWatch) -> None:
    kubelet_dir = Path(watcher.cfg.kubelet_dir)
    _replaced_by_a_symlink(kubelet_dir)
    drain(watcher)
    assert watcher.kubelet_dir.identity == identity(kubelet_dir.parent / "elsewhere")
    (kubelet_dir.parent / "second").mkdir()
    bind_socket(kubelet_dir.parent / "second" / "kubelet.sock")
    os.symlink(kubelet_dir.parent / "second", kubelet_dir.parent / "link.tmp")
    os.rename(kubelet_dir.parent / "link.tmp", kubelet_dir)  # "elsewhere" itself stays: no event on its watch
    drain(watcher)
    assert watcher.kubelet_dir.identity == identity(kubelet_dir.parent / "second")
    assert watcher.last == (socket_identity(kubelet_dir / "kubelet.sock"), ())


def test_the_kubelet_directory_renamed_away_is_absent_then_back(watcher: KubeletWatch) -> None:
    kubelet_dir = Path(watcher.cfg.kubelet_dir)
    os.rename(kubelet_dir, kubelet_dir.parent / "away")
    drain(watcher)
    assert watcher.kubelet_dir.identity is None and watcher.last == ("", ())
    os.rename(kubelet_dir.parent / "away", kubelet_dir)
    drain(watcher)
    assert watcher.kubelet_dir.identity == identity(kubelet_dir)
    assert watcher.last == (socket_identity(kubelet_dir / "kubelet.sock"), ())


@pytest.mark.skipif(os.geteuid() != 0, reason="mounting needs root")
def test_a_filesystem_mounted_over_the_kubelet_directory_is_seen_without_any_inotify_event(
    watcher: KubeletWatch,
) -> None:
    kubelet_dir = Path(watcher.cfg.kubelet_dir)
    before = watcher.kubelet_dir.identity
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "colad-test", str(kubelet_dir)], check=True)
    try:
        # No inotify event: the mount table's POLLPRI alone wakes the watcher and sends it to stat().
        wait_until(stepping(watcher, lambda: watcher.kubelet_dir.identity != before), 10, "the mount seen")
        assert watcher.kubelet_dir.identity == identity(kubelet_dir)
        assert watcher.last == ("", ())  # the mount hides kubelet.sock
        bind_socket(kubelet_dir / "kubelet.sock")
        drain(watcher)
        assert watcher.last == (socket_identity(kubelet_dir / "kubelet.sock"), ())
    finally:
        subprocess.run(["umount", "-l", str(kubelet_dir)], check=True)


def test_a_change_above_the_parent_is_seen_at_the_first_wake_up_after_the_timer(watcher: KubeletWatch) -> None:
    kubelet_dir = Path(watcher.cfg.kubelet_dir)
    top = kubelet_dir.parent  # the parent: its own replacement sends nothing to its watch (no IN_MOVE_SELF asked)
    os.rename(top, top.parent / "kl-old")
    fresh = top.parent / "kl-new" / kubelet_dir.name
    fresh.mkdir(parents=True)
    bind_socket(fresh / "kubelet.sock")
    os.rename(top.parent / "kl-new", top)
    old_dir = top.parent / "kl-old" / kubelet_dir.name
    checkpoint(old_dir, 1)  # the kubelet of the old tree still writes: wake-ups without a reason
    drain(watcher)
    assert watcher.kubelet_dir.identity == identity(old_dir), "seen without the timer: the test proves nothing"
    watcher.recheck_at = 0.0  # the timer's time has come
    checkpoint(old_dir, 2)
    drain(watcher)
    assert watcher.kubelet_dir.identity == identity(kubelet_dir)
    assert watcher.last == (socket_identity(kubelet_dir / "kubelet.sock"), ())


def test_the_timer_rechecks_once_per_interval_not_per_wake_up(
    watcher: KubeletWatch, stats: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(loop, "RECHECK_INTERVAL", 60.0)
    watcher.recheck_at, stats[:] = 0.0, []
    for i in range(5):
        checkpoint(Path(watcher.cfg.kubelet_dir), i)
        drain(watcher)
    assert sorted(stats) == sorted([watcher.cfg.run_dir, watcher.cfg.kubelet_dir])


def test_the_run_directory_removed_and_recreated_is_watched_again_at_once(
    cfg: Config, serve: Serve, server: QueueServer, watcher: KubeletWatch
) -> None:
    run_dir = Path(cfg.run_dir)
    server.stop()
    wait_until(stepping(watcher, lambda: watcher.client.sock is None), 5, "the plugin's end gone")
    shutil.rmtree(run_dir)
    drain(watcher)
    assert watcher.run_dir.identity is None
    run_dir.mkdir(0o700)
    drain(watcher)
    assert watcher.run_dir.identity == identity(run_dir)
    _, inbox = serve(cfg.queue_socket)  # queue.sock's IN_CREATE in the new directory: reconnect now
    wait_until(stepping(watcher, lambda: inbox.latest(KubeletState) is not None), 5, "a state on the new queue")


def test_discovery_follows_a_replaced_device_directory_at_the_first_wake_up(
    cfg: Config, serve: Serve, stats: list[str]
) -> None:
    device_dir = Path(cfg.device_dir)
    device_dir.mkdir()
    (device_dir / "dev-0").write_text("")
    _, inbox = serve(cfg.queue_socket)
    discovery = Discovery(cfg)
    try:
        begin(discovery)
        drain(discovery)
        stats[:] = []
        (device_dir / "dev-1").write_text("")
        drain(discovery)
        assert cfg.device_dir not in stats, "a device file's event stat()ed the device directory"
        (device_dir.parent / "new").mkdir()
        (device_dir.parent / "new" / "dev-7").write_text("")
        os.rename(device_dir, device_dir.parent / "old")
        os.rename(device_dir.parent / "new", device_dir)
        drain(discovery)
        assert next(iter(discovery.watches.values())).dir.identity == identity(device_dir)

        def shows_dev_7() -> bool:
            discovery.step(0.05)
            snapshot = inbox.latest(DeviceSnapshot)
            return snapshot is not None and list(snapshot.devices.ids) == ["dev-7"]

        wait_until(shows_dev_7, 5, "the new directory's devices")
    finally:
        discovery.close()
