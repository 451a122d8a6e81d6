"""Discovery with real inotify on a temp device directory, publishing to a real QueueServer.

The role runs in-process: `RoleRunner` steps it in a thread as `run()` would, or a test
steps it itself where the order of events matters (the overflow). Every case ends by
waiting for the plugin side to hold an exact snapshot of what is on disk.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from colad.config.config import Config
from colad.discovery.devicedir import list_regular_files
from colad.discovery.main import Discovery
from colad.queue.client import QueueClient
from colad.queue.messages import MAX_MESSAGE_BYTES, DeviceSnapshot, Stats, encode
from tests.helpers import wait_until
from tests.integration.support import Inbox, RoleRunner, Serve, begin, bind_socket, make_config

pytestmark = pytest.mark.integration

MAX_QUEUED_EVENTS = Path("/proc/sys/fs/inotify/max_queued_events")


class CountingDiscovery(Discovery):
    """Discovery that remembers why it rescanned, in order (appended after each rescan finished)."""

    def __init__(self, cfg: Config, **kwargs: object) -> None:
        super().__init__(cfg, **kwargs)  # type: ignore[arg-type]
        self.reasons: list[str] = []

    def rescan(self, reason: str, *args: Any, **kwargs: Any) -> None:
        super().rescan(reason, *args, **kwargs)
        self.reasons.append(reason)


@pytest.fixture
def cfg(short_tmp: Path) -> Config:
    config = make_config(short_tmp)
    os.mkdir(config.run_dir, 0o700)
    os.mkdir(short_tmp / "outside")
    return config


def touch(path: Path, text: str = "") -> None:
    path.write_text(text)


def started(
    cfg: Config,
    serve: Serve,
    runners: Callable[[Discovery], RoleRunner],
    *,
    client: QueueClient | None = None,
    run: bool = True,
) -> tuple[CountingDiscovery, RoleRunner, Inbox]:
    """A plugin-side QueueServer, then a Discovery that has taken its first look (and loops, if `run`)."""
    _, inbox = serve(cfg.queue_socket)
    discovery = CountingDiscovery(cfg, client=client)
    runner = runners(discovery)
    begin(discovery)
    if run:
        runner.start()
    return discovery, runner, inbox


def latest(inbox: Inbox) -> tuple[list[str], bool] | None:
    snap = inbox.latest(DeviceSnapshot)
    return None if snap is None else (list(snap.devices.ids), snap.dir_present)


def wait_for_devices(
    inbox: Inbox,
    ids: list[str] | set[str],
    present: bool = True,
    timeout: float = 5,
    *,
    step: Callable[[], None] | None = None,
) -> None:
    """Wait for the plugin side to hold exactly `ids`; with `step`, drive the role by hand meanwhile."""
    want = (sorted(ids), present)

    def exact() -> bool:
        if step is not None:
            step()
        got = latest(inbox)
        if got != want:
            raise AssertionError(f"latest snapshot (ids, dir_present) = {got}")
        return True

    wait_until(exact, timeout, f"the snapshot {want}")


# ---------------------------------------------------------------- what is a device


def _regular(d: Path, name: str) -> None:
    touch(d / name, "x")


def _empty(d: Path, name: str) -> None:
    touch(d / name)


def _symlink_to_file(d: Path, name: str) -> None:
    os.symlink(d / "dev-0", d / name)


def _dangling_symlink(d: Path, name: str) -> None:
    os.symlink(d / "nowhere", d / name)


def _symlink_to_dir(d: Path, name: str) -> None:
    os.symlink(d.parent / "outside", d / name)


def _subdirectory(d: Path, name: str) -> None:
    os.mkdir(d / name)
    touch(d / name / "inner", "x")


def _fifo(d: Path, name: str) -> None:
    os.mkfifo(d / name)


def _unix_socket(d: Path, name: str) -> None:
    bind_socket(d / name)


def _hard_link(d: Path, name: str) -> None:
    touch(d.parent / "outside" / "source", "x")
    os.link(d.parent / "outside" / "source", d / name)


ENTRIES = [
    pytest.param(_regular, "dev-1", True, id="regular-file"),
    pytest.param(_empty, "dev-1", True, id="empty-regular-file"),
    pytest.param(_hard_link, "dev-1", True, id="hard-link"),
    pytest.param(_regular, "A" * 63, True, id="63-char-name"),
    pytest.param(_regular, "a.b_c-D9", True, id="dots-underscores-dashes"),
    pytest.param(_regular, "A" * 64, False, id="64-char-name"),
    pytest.param(_regular, ".hidden", False, id="dotfile"),
    pytest.param(_regular, "with space", False, id="space-in-name"),
    pytest.param(_regular, "a,b", False, id="comma-in-name"),
    pytest.param(_regular, "dev-1~", False, id="backup-file"),
    pytest.param(_regular, "-dev", False, id="leading-dash"),
    pytest.param(_regular, "caf\u00e9", False, id="non-ascii-name"),
    pytest.param(_symlink_to_file, "dev-1", False, id="symlink-to-file"),
    pytest.param(_dangling_symlink, "dev-1", False, id="dangling-symlink"),
    pytest.param(_symlink_to_dir, "dev-1", False, id="symlink-to-dir"),
    pytest.param(_subdirectory, "dev-1", False, id="subdirectory"),
    pytest.param(_fifo, "dev-1", False, id="fifo"),
    pytest.param(_unix_socket, "dev-1", False, id="unix-socket"),
]


@pytest.mark.parametrize("make, name, is_device", ENTRIES)
def test_entry_present_at_start(
    cfg: Config,
    serve: Serve,
    runners: Callable[[Discovery], RoleRunner],
    make: Callable[[Path, str], None],
    name: str,
    is_device: bool,
) -> None:
    device_dir = Path(cfg.device_dir)
    device_dir.mkdir()
    touch(device_dir / "dev-0")
    make(device_dir, name)
    _, _, inbox = started(cfg, serve, runners, run=False)
    wait_for_devices(inbox, {"dev-0", name} if is_device else {"dev-0"})
    assert len(inbox.of(DeviceSnapshot)) == 1


@pytest.mark.parametrize("make, name, is_device", ENTRIES)
def test_entry_appearing_while_running(
    cfg: Config,
    serve: Serve,
    runners: Callable[[Discovery], RoleRunner],
    make: Callable[[Path, str], None],
    name: str,
    is_device: bool,
) -> None:
    device_dir = Path(cfg.device_dir)
    device_dir.mkdir()
    touch(device_dir / "dev-0")
    _, _, inbox = started(cfg, serve, runners)
    wait_for_devices(inbox, {"dev-0"})
    make(device_dir, name)
    touch(device_dir / "zz-barrier")  # events are ordered: once this shows, `name` has been seen
    final = {"dev-0", "zz-barrier"} | ({name} if is_device else set())
    wait_for_devices(inbox, final)
    for snap in inbox.of(DeviceSnapshot):
        assert set(snap.devices.ids) <= final, f"a snapshot listed a non-device: {snap.devices.ids}"


def test_list_regular_files_reports_a_missing_directory(short_tmp: Path) -> None:
    assert list_regular_files(str(short_tmp / "missing")) == ([], False)
    touch(short_tmp / "file")
    assert list_regular_files(str(short_tmp / "file")) == ([], False)
    assert list_regular_files(str(short_tmp)) == (["file"], True)


# ---------------------------------------------------------------- changes


def _create(d: Path, o: Path) -> None:
    touch(d / "dev-3")


def _create_by_write(d: Path, o: Path) -> None:
    with open(d / "dev-3", "w") as handle:
        handle.write("cola\n")
        handle.flush()


def _delete(d: Path, o: Path) -> None:
    os.unlink(d / "dev-1")


def _delete_all(d: Path, o: Path) -> None:
    for name in ("dev-0", "dev-1", "dev-2"):
        os.unlink(d / name)


def _rename_within(d: Path, o: Path) -> None:
    os.rename(d / "dev-1", d / "dev-9")


def _rename_over_existing(d: Path, o: Path) -> None:
    os.rename(d / "dev-1", d / "dev-2")


def _rename_in(d: Path, o: Path) -> None:
    touch(o / "dev-5")
    os.rename(o / "dev-5", d / "dev-5")


def _rename_out(d: Path, o: Path) -> None:
    os.rename(d / "dev-1", o / "dev-1")


def _rename_to_hidden(d: Path, o: Path) -> None:
    os.rename(d / "dev-1", d / ".dev-1")


def _atomic_create(d: Path, o: Path) -> None:
    touch(d / ".dev-7.tmp", "cola")
    os.rename(d / ".dev-7.tmp", d / "dev-7")


def _replace_by_symlink(d: Path, o: Path) -> None:
    touch(o / "dev-5")
    os.unlink(d / "dev-1")
    os.symlink(o / "dev-5", d / "dev-1")


def _replace_by_directory(d: Path, o: Path) -> None:
    os.unlink(d / "dev-1")
    os.mkdir(d / "dev-1")


def _many(d: Path, o: Path) -> None:
    for i in range(300):
        touch(d / f"many-{i:03d}")


@pytest.mark.parametrize(
    "change, expected",
    [
        pytest.param(_create, {"dev-0", "dev-1", "dev-2", "dev-3"}, id="create"),
        pytest.param(_create_by_write, {"dev-0", "dev-1", "dev-2", "dev-3"}, id="create-by-write"),
        pytest.param(_delete, {"dev-0", "dev-2"}, id="delete"),
        pytest.param(_delete_all, set(), id="delete-all"),
        pytest.param(_rename_within, {"dev-0", "dev-2", "dev-9"}, id="rename-within"),
        pytest.param(_rename_over_existing, {"dev-0", "dev-2"}, id="rename-over-existing"),
        pytest.param(_rename_in, {"dev-0", "dev-1", "dev-2", "dev-5"}, id="rename-in-from-outside"),
        pytest.param(_rename_out, {"dev-0", "dev-2"}, id="rename-out"),
        pytest.param(_rename_to_hidden, {"dev-0", "dev-2"}, id="rename-to-hidden-name"),
        pytest.param(_atomic_create, {"dev-0", "dev-1", "dev-2", "dev-7"}, id="write-hidden-then-rename"),
        pytest.param(_replace_by_symlink, {"dev-0", "dev-2"}, id="replace-by-symlink"),
        pytest.param(_replace_by_directory, {"dev-0", "dev-2"}, id="replace-by-directory"),
        pytest.param(_many, {"dev-0", "dev-1", "dev-2"} | {f"many-{i:03d}" for i in range(300)}, id="300-creates"),
    ],
)
def test_change_ends_with_an_exact_snapshot(
    cfg: Config,
    serve: Serve,
    runners: Callable[[Discovery], RoleRunner],
    change: Callable[[Path, Path], None],
    expected: set[str],
) -> None:
    device_dir = Path(cfg.device_dir)
    device_dir.mkdir()
    for name in ("dev-0", "dev-1", "dev-2"):
        touch(device_dir / name)
    discovery, _, inbox = started(cfg, serve, runners)
    wait_for_devices(inbox, {"dev-0", "dev-1", "dev-2"})
    change(device_dir, device_dir.parent / "outside")
    wait_for_devices(inbox, expected)
    assert discovery.current is not None and set(discovery.current.ids) == expected


def _write(path: Path) -> None:
    with open(path, "w") as handle:
        handle.write("# new contents, still a valid (empty) device file\n")


def _append(path: Path) -> None:
    with open(path, "a") as handle:
        handle.write("# more\n")


def _chmod(path: Path) -> None:
    os.chmod(path, 0o600)


def _utime(path: Path) -> None:
    os.utime(path, (1, 1))


@pytest.mark.parametrize("touch_file", [_write, _append, _chmod, _utime], ids=["write", "append", "chmod", "utime"])
def test_touching_an_existing_file_rescans_but_publishes_nothing_new(
    cfg: Config, serve: Serve, runners: Callable[[Discovery], RoleRunner], touch_file: Callable[[Path], None]
) -> None:
    device_dir = Path(cfg.device_dir)
    device_dir.mkdir()
    touch(device_dir / "dev-0")
    discovery, _, inbox = started(cfg, serve, runners)
    wait_for_devices(inbox, {"dev-0"})
    assert discovery.reasons == ["start"]

    touch_file(device_dir / "dev-0")
    wait_until(lambda: "inotify" in discovery.reasons, 5, "a rescan caused by the change to dev-0")
    touch(device_dir / "zz-barrier")
    wait_for_devices(inbox, {"dev-0", "zz-barrier"})
    assert [s.devices.ids for s in inbox.of(DeviceSnapshot)] == [("dev-0",), ("dev-0", "zz-barrier")]


def test_rescans_reach_the_plugin_as_stats(
    cfg: Config, serve: Serve, runners: Callable[[Discovery], RoleRunner]
) -> None:
    Path(cfg.device_dir).mkdir()
    discovery, _, inbox = started(cfg, serve, runners)
    touch(Path(cfg.device_dir) / "dev-0")
    wait_for_devices(inbox, {"dev-0"})

    def counted() -> dict[str, int]:
        stats = inbox.latest(Stats)
        counters = dict(stats.counters) if stats else {}
        return counters if counters.get("rescans.inotify", 0) >= 1 and counters.get("rescans.start") == 1 else {}

    counters = wait_until(counted, 5, "a Stats message counting the start and inotify rescans")
    assert counters["queue.sent"] >= 2
    assert all(s.role == "discovery" and s.epoch == discovery.epoch for s in inbox.of(Stats))


# ---------------------------------------------------------------- the directory itself


def test_device_directory_missing_removed_recreated_and_replaced(
    cfg: Config, serve: Serve, runners: Callable[[Discovery], RoleRunner]
) -> None:
    device_dir = Path(cfg.device_dir)
    root = device_dir.parent
    discovery, _, inbox = started(cfg, serve, runners)
    wait_for_devices(inbox, [], present=False)

    def steps() -> Iterator[tuple[str, list[str], bool]]:
        device_dir.mkdir()
        touch(device_dir / "dev-a")
        touch(device_dir / "dev-b")
        yield "created late", ["dev-a", "dev-b"], True

        shutil.rmtree(device_dir)
        yield "removed", [], False

        device_dir.mkdir()
        touch(device_dir / "dev-c")
        yield "recreated", ["dev-c"], True

        other = root / "other"
        other.mkdir()
        touch(other / "dev-x")
        touch(other / "dev-y")
        os.symlink(other / "dev-x", other / "link-x")  # a symlink inside is still not a device
        shutil.rmtree(device_dir)
        os.symlink(other, device_dir)
        yield "replaced by a symlink to another directory", ["dev-x", "dev-y"], True

        touch(other / "dev-z")
        yield "a file added in the symlink's target", ["dev-x", "dev-y", "dev-z"], True

        sibling = root / "sibling"
        sibling.mkdir()
        touch(sibling / "dev-s1")
        touch(sibling / "dev-s2")
        os.unlink(device_dir)
        os.rename(sibling, device_dir)
        yield "a sibling renamed over it", ["dev-s1", "dev-s2"], True

        touch(device_dir / "dev-s3")
        yield "a file added in the renamed directory", ["dev-s1", "dev-s2", "dev-s3"], True

        os.rename(device_dir, root / "away")
        yield "renamed away", [], False

        touch(root / "away" / "dev-while-away")
        os.rename(root / "away", device_dir)
        yield "renamed back", ["dev-s1", "dev-s2", "dev-s3", "dev-while-away"], True

        touch(device_dir / "dev-s4")
        yield "a file added after coming back", ["dev-s1", "dev-s2", "dev-s3", "dev-s4", "dev-while-away"], True

        shutil.rmtree(device_dir)
        touch(device_dir, "not a directory")
        yield "replaced by a regular file", [], False

        os.unlink(device_dir)
        device_dir.mkdir()
        yield "an empty directory again", [], True

    for stage, ids, present in steps():
        try:
            wait_for_devices(inbox, ids, present)
        except AssertionError as exc:
            raise AssertionError(f"after stage {stage!r}: {exc}") from None
    assert "directory" in discovery.reasons or "inotify" in discovery.reasons


def test_directory_removed_and_recreated_between_two_steps(
    cfg: Config, serve: Serve, runners: Callable[[Discovery], RoleRunner]
) -> None:
    # ext4 readily hands the freed inode number to the new directory: same (dev, ino), a dead watch.
    device_dir = Path(cfg.device_dir)
    device_dir.mkdir()
    touch(device_dir / "dev-0")
    discovery, _, inbox = started(cfg, serve, runners, run=False)
    wait_for_devices(inbox, {"dev-0"})

    shutil.rmtree(device_dir)
    device_dir.mkdir()
    touch(device_dir / "dev-1")
    wait_for_devices(inbox, {"dev-1"}, step=lambda: discovery.step(0.05))
    touch(device_dir / "dev-2")  # is the new directory itself watched?
    wait_for_devices(inbox, {"dev-1", "dev-2"}, step=lambda: discovery.step(0.05))


# ---------------------------------------------------------------- inotify overflow


@contextlib.contextmanager
def inotify_queue_limit(events: int) -> Iterator[None]:
    """Lower fs.inotify.max_queued_events (read at inotify_init) and always put it back.

    The setting is host-wide: a lock file keeps two test runs from saving each other's low value.
    """
    with open("/tmp/colad-test-max-queued-events.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            old = MAX_QUEUED_EVENTS.read_text()
            MAX_QUEUED_EVENTS.write_text(f"{events}\n")
        except OSError as exc:
            pytest.skip(f"cannot set {MAX_QUEUED_EVENTS}: {exc}")
        try:
            yield
        finally:
            MAX_QUEUED_EVENTS.write_text(old)


def test_overflow_rescans_and_ends_exact(cfg: Config, serve: Serve, runners: Callable[[Discovery], RoleRunner]) -> None:
    device_dir = Path(cfg.device_dir)
    device_dir.mkdir()
    touch(device_dir / "dev-0")
    _, inbox = serve(cfg.queue_socket)
    with inotify_queue_limit(16):
        discovery = CountingDiscovery(cfg)
        low = MAX_QUEUED_EVENTS.read_text()
    assert low == "16\n"
    assert MAX_QUEUED_EVENTS.read_text() != low, "the limit was not restored"
    runners(discovery)  # closed at teardown; stepped by hand here
    begin(discovery)
    wait_for_devices(inbox, {"dev-0"})

    names = {f"flood-{i:03d}" for i in range(500)}
    for name in names:
        touch(device_dir / name)
    discovery.step(5.0)

    assert "overflow" in discovery.reasons, discovery.reasons
    wait_for_devices(inbox, names | {"dev-0"})


# ---------------------------------------------------------------- the plugin end of the queue


def test_restarted_plugin_gets_the_full_current_snapshot_at_once(
    cfg: Config, serve: Serve, runners: Callable[[Discovery], RoleRunner]
) -> None:
    device_dir = Path(cfg.device_dir)
    device_dir.mkdir()
    touch(device_dir / "dev-0")
    touch(device_dir / "dev-1")
    # A long back-off: only the run-directory watch (queue.sock created) can make the resync prompt.
    client = QueueClient(cfg.queue_socket, retry_max=60.0)
    server, _ = serve(cfg.queue_socket)
    discovery = CountingDiscovery(cfg, client=client)
    runner = runners(discovery)
    begin(discovery)
    runner.start()

    server.stop()
    wait_until(lambda: client.sock is None, 5, "discovery to notice the plugin went away")
    runner.stop()
    for _ in range(12):  # as if the plugin had been away a long while: back-off at its cap
        assert not client.flush(force=True)
    assert (client.next_retry() or 0) - time.monotonic() > 30
    runner.start()

    touch(device_dir / "dev-2")
    os.unlink(device_dir / "dev-0")
    wait_until(
        lambda: discovery.current is not None and discovery.current.ids == ("dev-1", "dev-2"),
        5,
        "discovery to see the change while the plugin is away",
    )
    _, inbox = serve(cfg.queue_socket)
    wait_for_devices(inbox, {"dev-1", "dev-2"}, timeout=3)
    snap = inbox.latest(DeviceSnapshot)
    assert snap is not None and snap.epoch == discovery.epoch


def test_seq_increases_and_epoch_is_constant(
    cfg: Config, serve: Serve, runners: Callable[[Discovery], RoleRunner]
) -> None:
    device_dir = Path(cfg.device_dir)
    device_dir.mkdir()
    discovery, _, inbox = started(cfg, serve, runners)
    wait_for_devices(inbox, [])
    for i in range(5):
        touch(device_dir / f"dev-{i}")
        wait_for_devices(inbox, {f"dev-{j}" for j in range(i + 1)})
    snaps = inbox.of(DeviceSnapshot)
    assert len(snaps) == 6
    assert {s.epoch for s in snaps} == {discovery.epoch}
    seqs = [s.seq for s in snaps]
    assert seqs == sorted(set(seqs)), f"seq not strictly increasing: {seqs}"

    later = CountingDiscovery(cfg, client=QueueClient(cfg.queue_socket))
    try:
        assert later.epoch > discovery.epoch
    finally:
        later.inotify.close()


def test_run_returns_zero_when_stopped(cfg: Config, serve: Serve) -> None:
    Path(cfg.device_dir).mkdir()
    touch(Path(cfg.device_dir) / "dev-0")
    _, inbox = serve(cfg.queue_socket)
    discovery = Discovery(cfg)
    runner = RoleRunner(discovery)  # only for its waker: run() is the loop here
    results: list[int] = []
    thread = threading.Thread(target=lambda: results.append(discovery.run()), daemon=True)
    thread.start()
    try:
        wait_for_devices(inbox, {"dev-0"})
        touch(Path(cfg.device_dir) / "dev-1")
        wait_for_devices(inbox, {"dev-0", "dev-1"})
    finally:
        discovery.stopping = True
        runner.waker.wake()
        thread.join(timeout=10)
        runner.waker.close()
    assert results == [0]
    assert discovery.client.sock is None


def test_file_content_sets_health_and_details_and_a_fix_recovers(
    cfg: Config, serve: Serve, runners: Callable[[Discovery], RoleRunner]
) -> None:
    device_dir = Path(cfg.device_dir)
    device_dir.mkdir()
    touch(device_dir / "dev-0")
    touch(device_dir / "dev-1")
    discovery, _, inbox = started(cfg, serve, runners)
    wait_for_devices(inbox, {"dev-0", "dev-1"})

    def latest() -> dict[str, Any]:
        snapshot = inbox.of(DeviceSnapshot)[-1]
        return {d.device_id: d for d in snapshot.devices}

    (device_dir / "dev-0").write_text('numa_nodes = [1]\n[envs]\nFLAVOUR = "cherry"\n')
    wait_until(lambda: latest()["dev-0"].numa_nodes == (1,), 5, "dev-0 with its NUMA node")
    assert latest()["dev-0"].envs == (("FLAVOUR", "cherry"),) and latest()["dev-0"].healthy
    (device_dir / "dev-0").write_text("numa_nodes = [1\n")  # malformed: only dev-0 turns Unhealthy
    wait_until(lambda: not latest()["dev-0"].healthy, 5, "dev-0 Unhealthy")
    assert "invalid TOML" in latest()["dev-0"].problem and latest()["dev-0"].numa_nodes == ()
    assert latest()["dev-1"].healthy
    (device_dir / "dev-0").write_text('health = "Unhealthy"\n')
    wait_until(lambda: latest()["dev-0"].problem == "" and not latest()["dev-0"].healthy, 5, "declared Unhealthy")
    (device_dir / "dev-0").write_bytes(b"")
    wait_until(lambda: latest()["dev-0"].healthy, 5, "dev-0 Healthy again")
    (device_dir / "dev-1").write_bytes(b"x" * 70000)  # over the size limit
    wait_until(lambda: not latest()["dev-1"].healthy, 5, "dev-1 too large")
    assert "larger than" in latest()["dev-1"].problem


def test_an_unreadable_file_is_an_unhealthy_device(
    cfg: Config, serve: Serve, runners: Callable[[Discovery], RoleRunner], tmp_path: Path
) -> None:
    device_dir = Path(cfg.device_dir)
    device_dir.mkdir()
    (device_dir / "dev-0").write_text("numa_nodes = [0]\n")
    (device_dir / "dev-0").chmod(0)
    if os.access(device_dir / "dev-0", os.R_OK):  # root reads anything: make it a read error another way
        os.unlink(device_dir / "dev-0")
        os.mkfifo(device_dir / "dev-0")  # not a regular file: skipped, never opened (no block)
        discovery, _, inbox = started(cfg, serve, runners)
        wait_for_devices(inbox, set())
        return
    discovery, _, inbox = started(cfg, serve, runners)
    wait_until(lambda: bool(inbox.of(DeviceSnapshot)), 5, "a snapshot")
    device = inbox.of(DeviceSnapshot)[-1].devices.get("dev-0")
    assert device is not None and not device.healthy and "cannot read" in device.problem


def test_a_snapshot_too_large_for_the_queue_demotes_the_largest_files_only(
    cfg: Config, serve: Serve, runners: Callable[[Discovery], RoleRunner]
) -> None:
    device_dir = Path(cfg.device_dir)
    device_dir.mkdir()
    # 240 files of ~60 KiB of envs: about 14.4 MB of content, over the 12 MiB frame limit.
    big = "[envs]\n" + "".join(f'K{i} = "{"v" * 460}"\n' for i in range(127))
    for n in range(240):
        (device_dir / f"big-{n:03d}").write_text(big)
    touch(device_dir / "small")
    discovery, _, inbox = started(cfg, serve, runners)
    wait_until(lambda: bool(inbox.of(DeviceSnapshot)), 10, "a snapshot")
    snapshot = inbox.of(DeviceSnapshot)[-1]
    assert len(snapshot.devices) == 241 and snapshot.devices.get("small") is not None
    demoted = [d for d in snapshot.devices if "queue message limit" in d.problem]
    assert demoted and all(not d.healthy for d in demoted)
    assert len(encode(snapshot)) <= MAX_MESSAGE_BYTES
    assert sum(d.healthy for d in snapshot.devices) == 241 - len(demoted)
