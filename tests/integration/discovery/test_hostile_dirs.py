"""Discovery against hostile device directories, with real inotify and a real QueueServer.

Same-size rewrites on a filesystem with one-second timestamps (a real ext2 loop
mount), snapshots whose non-ASCII content exceeds the queue frame, a device
directory that is a symlink loop, and names that are no device IDs: each ends in
an exact snapshot at the plugin side, a counted input.* event, and a live loop.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from colad.config.config import Config
from colad.core.constants import UNHEALTHY
from colad.discovery.main import Discovery
from colad.queue.messages import MAX_MESSAGE_BYTES, DeviceSnapshot, encode
from tests.helpers import wait_until
from tests.integration.support import Inbox, RoleRunner, Serve, begin, make_config

pytestmark = pytest.mark.integration


@pytest.fixture
def cfg(short_tmp: Path) -> Config:
    config = make_config(short_tmp)
    os.mkdir(config.run_dir, 0o700)
    return config


def start(cfg: Config, serve: Serve, runners: Callable[[Discovery], RoleRunner]) -> tuple[Discovery, Inbox]:
    _, inbox = serve(cfg.queue_socket)
    discovery = Discovery(cfg)
    runner = runners(discovery)
    begin(discovery)
    runner.start()
    return discovery, inbox


def snapshot(inbox: Inbox) -> DeviceSnapshot:
    latest = inbox.latest(DeviceSnapshot)
    assert latest is not None
    return latest


def wait_snapshot(
    inbox: Inbox, check: Callable[[DeviceSnapshot], bool], what: str, timeout: float = 10
) -> DeviceSnapshot:
    def ok() -> DeviceSnapshot | None:
        latest = inbox.latest(DeviceSnapshot)
        return latest if latest is not None and check(latest) else None

    return wait_until(ok, timeout, what)


# --- a same-size rewrite in the same timestamp tick -------------------------------------------


@pytest.fixture
def ext2_dir(short_tmp: Path) -> Iterator[Path]:
    """A directory on a real ext2 filesystem with 128-byte inodes: timestamps of one second."""
    image, mount = short_tmp / "ext2.img", short_tmp / "devices"
    mount.mkdir()
    with open(image, "wb") as f:
        f.truncate(8 << 20)
    made = subprocess.run(["mkfs.ext2", "-q", "-F", "-I", "128", str(image)], capture_output=True)
    mounted = (
        made.returncode == 0
        and subprocess.run(["mount", "-o", "loop", str(image), str(mount)], capture_output=True).returncode == 0
    )
    if not mounted:
        pytest.skip("needs mkfs.ext2 and a loop mount (root with /dev/loop*) for one-second timestamps")
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=False)


def _key(path: Path) -> tuple[int, int, int, int]:
    st = os.stat(path)
    return st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns


def test_same_size_rewrite_in_the_same_second_is_not_missed(
    cfg: Config, serve: Serve, runners: Callable[[Discovery], RoleRunner], ext2_dir: Path
) -> None:
    device = ext2_dir / "cola"
    device.write_text("numa_nodes = [1]\n")
    discovery, inbox = start(cfg, serve, runners)
    for attempt in range(10):
        # Start just after a second boundary, so both writes and the read share one timestamp.
        while time.time() % 1 > 0.2:
            time.sleep(0.01)
        first, second = (1, 2) if attempt % 2 == 0 else (2, 1)
        device.write_text(f"numa_nodes = [{first}]\n")
        before = _key(device)
        wait_snapshot(inbox, lambda s, n=first: s.devices.get("cola").numa_nodes == (n,), f"numa {first}")  # type: ignore[misc,union-attr]
        device.write_text(f"numa_nodes = [{second}]\n")
        if _key(device) == before:  # the stat cache cannot tell the two apart
            break
    else:
        pytest.fail("never managed a same-size rewrite within one timestamp tick")
    got = wait_snapshot(inbox, lambda s: s.devices.get("cola").numa_nodes == (second,), f"numa {second}")  # type: ignore[union-attr]
    assert got.devices.get("cola").health == "Healthy"  # type: ignore[union-attr]
    # Once the window has passed, a follow-up rescan trusts the key again: nothing stays racy.
    wait_until(
        lambda: all(c.trusted for c in discovery.watches[cfg.resources[0].name].cache.values()), 10, "settled cache"
    )
    assert discovery.stats.counters.get("rescans.followup", 0) >= 1


# --- non-ASCII content over the frame limit -----------------------------------------------------


def test_non_ascii_content_over_the_frame_limit_is_cut_counted_and_sent(
    cfg: Config, serve: Serve, runners: Callable[[Discovery], RoleRunner]
) -> None:
    device_dir = Path(cfg.device_dir)
    device_dir.mkdir()
    # 60 KiB files of "é": 2 bytes each on disk, 6 in the queue's JSON ("\u00e9"), so 180 KB per device
    # and 80 devices 14.4 MB, over the 12 MiB frame although the files add up to 4.8 MB.
    body = "[annotations]\n" + "".join(f'"example.com/k{i}" = "{"é" * 2000}"\n' for i in range(15))
    for n in range(80):
        (device_dir / f"cola{n:02d}").write_text(body)
    (device_dir / "plain").write_text("")
    discovery, inbox = start(cfg, serve, runners)
    got = wait_snapshot(inbox, lambda s: len(s.devices) == 81, "a snapshot of all 81 devices")
    assert len(encode(got)) <= MAX_MESSAGE_BYTES
    cut = [d for d in got.devices if d.problem.startswith("snapshot too large")]
    assert cut and all(d.health == UNHEALTHY for d in cut)
    assert got.devices.get("plain") is not None and got.devices.get("plain").healthy  # type: ignore[union-attr]
    assert discovery.stats.counters["input.snapshot_too_large"] == 1
    (device_dir / "marker").write_text("")  # still alive, still counting once per change of the cut
    wait_snapshot(inbox, lambda s: "marker" in s.devices, "marker")
    assert discovery.stats.counters["input.snapshot_too_large"] == 1


# --- a device directory that cannot be listed -------------------------------------------------


def test_a_symlink_loop_at_start_reports_no_devices_and_recovers(
    cfg: Config, serve: Serve, runners: Callable[[Discovery], RoleRunner]
) -> None:
    device_dir = Path(cfg.device_dir)
    os.symlink(device_dir.name, device_dir)  # devices -> devices: ELOOP
    discovery, inbox = start(cfg, serve, runners)
    wait_snapshot(inbox, lambda s: len(s.devices) == 0, "an empty snapshot")
    assert discovery.stats.counters["input.dir_unusable"] == 1
    device_dir.unlink()
    device_dir.mkdir()
    (device_dir / "cola").write_text("")
    wait_snapshot(inbox, lambda s: s.devices.ids == ("cola",) and s.devices.get("cola").healthy, "cola")  # type: ignore[union-attr]


def test_a_directory_turned_into_a_symlink_loop_keeps_its_devices_unhealthy(
    cfg: Config, serve: Serve, runners: Callable[[Discovery], RoleRunner]
) -> None:
    device_dir = Path(cfg.device_dir)
    real = device_dir.with_name("real")
    real.mkdir()
    for name in ("cola1", "cola2"):
        (real / name).write_text("")
    os.symlink(real.name, device_dir)  # /etc/colas -> /data/colas, as operators do
    discovery, inbox = start(cfg, serve, runners)
    wait_snapshot(inbox, lambda s: s.devices.ids == ("cola1", "cola2"), "both devices")
    swap = device_dir.with_name("swap")
    os.symlink(device_dir.name, swap)
    os.rename(swap, device_dir)  # atomically: devices -> devices, ELOOP
    got = wait_snapshot(inbox, lambda s: s.devices.count(UNHEALTHY) == 2, "both devices Unhealthy")
    assert got.devices.ids == ("cola1", "cola2")
    assert all("ELOOP" in d.problem for d in got.devices)
    assert discovery.stats.counters["input.dir_unusable"] == 1
    os.symlink(real.name, swap)
    os.rename(swap, device_dir)
    wait_snapshot(inbox, lambda s: s.devices.ids == ("cola1", "cola2") and s.devices.count(UNHEALTHY) == 0, "healed")
    assert discovery.stats.counters["input.dir_unusable"] == 1


# --- names that are no device IDs --------------------------------------------------------------

BAD_NAMES = [b"bad\xff\xfe", b"caf\xc3\xa9", b"x" * 64, b"a\nb", b"a\x07b", b".hidden", b"a,b"]


def test_bad_names_are_skipped_warned_and_counted_once(
    cfg: Config, serve: Serve, runners: Callable[[Discovery], RoleRunner]
) -> None:
    device_dir = Path(cfg.device_dir)
    device_dir.mkdir()
    (device_dir / "cola").write_text("")
    discovery, inbox = start(cfg, serve, runners)
    wait_snapshot(inbox, lambda s: s.devices.ids == ("cola",), "cola")
    for rewrite in range(5):  # rewritten again and again: still one warning, one count per name
        for name in BAD_NAMES:
            with open(os.path.join(os.fsencode(device_dir), name), "wb") as f:
                f.write(b"%d" % rewrite)
        (device_dir / f"marker{rewrite}").write_text("")
        wait_snapshot(inbox, lambda s, r=rewrite: f"marker{r}" in s.devices, f"marker{rewrite}")  # type: ignore[misc]
    final = snapshot(inbox)
    assert set(final.devices.ids) == {"cola", *(f"marker{r}" for r in range(5))}
    assert discovery.stats.counters["input.bad_name"] == len(BAD_NAMES)
    shutil.rmtree(device_dir)
    wait_snapshot(inbox, lambda s: len(s.devices) == 0, "directory gone")


# Run as root without the two capabilities that let root read any directory: a real EACCES.
_EACCES_SCAN = """
import sys
from colad.config.config import Resource
from colad.core.devices import Device, DeviceSet
from colad.watchers.inotify import Inotify
from colad.discovery.scan import ResourceWatch
rw = ResourceWatch(Inotify(), Resource("myway5.com/cola", sys.argv[1]))
rw.current = DeviceSet.of([Device("cola1")])
out = rw.scan(None)
print(out.unusable, [(d.device_id, d.health, d.problem) for d in out.devices])
"""


def test_an_unreadable_directory_keeps_its_devices_unhealthy(short_tmp: Path) -> None:
    setpriv = shutil.which("setpriv")
    if setpriv is None or os.geteuid() != 0:
        pytest.skip("needs root and setpriv to drop CAP_DAC_OVERRIDE/CAP_DAC_READ_SEARCH for a real EACCES")
    locked = short_tmp / "locked"
    locked.mkdir(mode=0)
    caps = "-dac_override,-dac_read_search"
    result = subprocess.run(
        [setpriv, f"--inh-caps={caps}", f"--bounding-set={caps}", sys.executable, "-c", _EACCES_SCAN, str(locked)],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=Path(__file__).resolve().parents[3],
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == (
        "EACCES: Permission denied [('cola1', 'Unhealthy', 'device directory unusable: EACCES Permission denied')]"
    )
