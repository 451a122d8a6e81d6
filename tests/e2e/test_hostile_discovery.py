"""Hostile device directories under the real supervisord.

One colad for the module, its device directory a symlink (as /etc/colas often
is) to a directory on an ext2 loop mount where one is possible (one-second
timestamps). Each case ends with the kubelet's list exact, no role restarted
and no traceback in the log.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.fakes.kubelet import FakeKubelet
from tests.helpers import wait_until
from tests.service import ColadService

pytestmark = pytest.mark.e2e
BASE = {"cocacola", "peisicola"}


def _mount_ext2(root: Path, target: Path) -> bool:
    image = root / "ext2.img"
    with open(image, "wb") as f:
        f.truncate(32 << 20)
    if subprocess.run(["mkfs.ext2", "-q", "-F", "-I", "128", str(image)], capture_output=True).returncode != 0:
        return False
    return subprocess.run(["mount", "-o", "loop", str(image), str(target)], capture_output=True).returncode == 0


@pytest.fixture(scope="module")
def shared() -> Iterator[tuple[ColadService, FakeKubelet, Path, bool]]:
    root = Path(tempfile.mkdtemp(prefix="colad-", dir="/tmp"))
    root.chmod(0o755)
    real = root / "real"
    real.mkdir()
    ext2 = _mount_ext2(root, real)
    os.symlink(real.name, root / "colas")
    kubelet = FakeKubelet(root / "kubelet")
    kubelet.start()
    service = ColadService(root)
    service.add(*BASE)
    service.start()
    try:
        yield service, kubelet, real, ext2
    finally:
        assert service.stop() == 0
        kubelet.stop()
        assert kubelet.violations == []
        if ext2:
            subprocess.run(["umount", "-l", str(real)], check=False)
        shutil.rmtree(root, ignore_errors=True)


@pytest.fixture
def colad(shared: tuple[ColadService, FakeKubelet, Path, bool]) -> Iterator[ColadService]:
    service, kubelet, real, _ = shared
    kubelet.wait_devices(BASE, timeout=30)
    service.log_mark = len(service.log())
    pids = service.pids()
    yield service
    assert service.pids() == pids, "a role restarted"
    assert "Traceback" not in service.log()[service.log_mark :]
    for entry in list(os.scandir(os.fsencode(real))):
        if os.fsdecode(entry.name) not in BASE and entry.name != b"lost+found":
            if entry.is_dir(follow_symlinks=False):
                shutil.rmtree(entry.path)
            else:
                os.unlink(entry.path)
    kubelet.wait_devices(BASE, timeout=30)


@pytest.fixture
def kubelet(shared: tuple[ColadService, FakeKubelet, Path, bool]) -> FakeKubelet:
    return shared[1]


def new_lines(colad: ColadService, needle: str) -> list[str]:
    return [line for line in colad.log()[colad.log_mark :].splitlines() if needle in line]


def test_bad_names_in_the_device_dir_are_skipped_once(colad: ColadService, kubelet: FakeKubelet) -> None:
    """Names that are no device IDs: non-UTF-8, too long and control-character names, rewritten for 3 s."""
    names = [b"bad\xff\xfe", b"caf\xe9", b"x" * 70, b"a\x01b"]
    directory = os.fsencode(colad.device_dir)
    deadline = time.monotonic() + 3
    while time.monotonic() < deadline:
        for name in names:
            with open(os.path.join(directory, name), "wb") as f:
                f.write(b"1")
        time.sleep(0.1)  # the storm's pace, not a wait for a result
    colad.add("marker")
    kubelet.wait_devices(BASE | {"marker"}, timeout=30)
    warnings = new_lines(colad, "file skipped: not a valid device ID")
    assert len(warnings) == len(names), warnings


def test_a_slow_device_file_does_not_stall_the_others(colad: ColadService, kubelet: FakeKubelet) -> None:
    """60 KB of `a.a.a...= 1` (15-20 s in tomllib) is Unhealthy at once."""
    (colad.device_dir / "slow").write_bytes(b".".join([b"a"] * 30000) + b" = 1\n")
    colad.add("marker")
    started = time.monotonic()
    kubelet.wait_devices({**dict.fromkeys(BASE | {"marker"}, "Healthy"), "slow": "Unhealthy"}, timeout=30)
    assert time.monotonic() - started < 10
    assert [line for line in new_lines(colad, "device file malformed") if "dotted parts" in line]


def test_non_ascii_content_over_the_queue_frame(colad: ColadService, kubelet: FakeKubelet) -> None:
    """80 files of 'é' (180 KB each as ASCII JSON) exceed the 12 MiB frame; no crash loop."""
    body = "[annotations]\n" + "".join(f'"example.com/k{i}" = "{"é" * 2000}"\n' for i in range(15))
    heavy = {f"heavy{n:02d}" for n in range(80)}
    for name in sorted(heavy):
        (colad.device_dir / name).write_text(body)
    colad.add("marker")
    wait_until(
        lambda: (d := kubelet.devices()) is not None and set(d) == BASE | heavy | {"marker"} and d,
        30,
        "every device listed",
    )
    listed = kubelet.devices() or {}
    assert 0 < sum(1 for n in heavy if listed[n] == "Unhealthy") < len(heavy)
    assert all(listed[n] == "Healthy" for n in BASE | {"marker"})
    assert len(new_lines(colad, "snapshot too large for the queue")) >= 1


def test_a_symlink_loop_device_dir_keeps_the_devices_unhealthy(
    colad: ColadService, kubelet: FakeKubelet, shared: tuple[ColadService, FakeKubelet, Path, bool]
) -> None:
    """A device directory that fails with ELOOP: discovery keeps running, the devices stay, Unhealthy, and heal."""
    link, swap = colad.device_dir, colad.device_dir.with_name("swap")
    os.symlink(link.name, swap)
    os.rename(swap, link)  # colas -> colas
    try:
        kubelet.wait_devices(dict.fromkeys(BASE, "Unhealthy"), timeout=30)
        assert [line for line in new_lines(colad, "device directory unusable") if "ELOOP" in line]
    finally:
        os.symlink(shared[2].name, swap)
        os.rename(swap, link)
    kubelet.wait_devices(BASE, timeout=30)


def test_same_size_rewrite_within_a_second_reaches_the_kubelet(
    colad: ColadService, kubelet: FakeKubelet, shared: tuple[ColadService, FakeKubelet, Path, bool]
) -> None:
    """A same-size rewrite on a filesystem with one-second timestamps: the second write is never lost."""
    if not shared[3]:
        pytest.skip("needs an ext2 loop mount (root, mkfs.ext2, /dev/loop*) for one-second timestamps")
    path = colad.device_dir / "numa"
    for attempt in range(10):
        while time.time() % 1 > 0.2:  # start just after a second boundary: both writes share one stamp
            time.sleep(0.01)
        first, second = (1, 2) if attempt % 2 == 0 else (2, 1)
        path.write_text(f"numa_nodes = [{first}]\n")
        before = os.stat(path)
        wait_until(lambda n=first: kubelet.topology().get("numa") == (n,), 30, f"numa on node {first}")  # type: ignore[misc]
        path.write_text(f"numa_nodes = [{second}]\n")
        after = os.stat(path)
        if (before.st_ino, before.st_size, before.st_mtime_ns, before.st_ctime_ns) == (
            after.st_ino,
            after.st_size,
            after.st_mtime_ns,
            after.st_ctime_ns,
        ):
            break
    else:
        pytest.fail("never managed a same-size rewrite within one timestamp tick")
    wait_until(lambda: kubelet.topology().get("numa") == (second,), 30, f"numa on node {second}")
