"""Faults that must not wedge colad: its own supervisord killed, its queue socket deleted,
a dead instance's sockets left behind, a filesystem mounted over the device directory."""

from __future__ import annotations

import os
import socket
import subprocess
import threading
from pathlib import Path

import pytest

from tests.fakes.kubelet import FakeKubelet
from tests.helpers import wait_until
from tests.service import ColadService

pytestmark = pytest.mark.e2e


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as handle:
            return handle.read().rsplit(")", 1)[-1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def test_supervisord_sigkill_takes_the_roles_down_and_a_new_start_recovers(
    colad: ColadService, kubelet: FakeKubelet
) -> None:
    kubelet.wait_registered()
    kubelet.wait_devices({"cocacola", "peisicola"})
    children = list(colad.pids().values())
    colad.kill("supervisord")
    for pid in children:  # PR_SET_PDEATHSIG: no orphan keeps the sockets
        wait_until(lambda pid=pid: not _alive(pid), 10, f"role pid {pid} to exit with supervisord")
    assert colad.proc is not None
    colad.proc.wait(10)
    colad.add("while-down")
    colad.start()  # what systemd's Restart=on-failure does
    kubelet.wait_registered(count=2, timeout=15)
    kubelet.wait_devices({"cocacola", "peisicola", "while-down"}, timeout=15)


def test_a_deleted_queue_socket_is_recreated_and_nothing_is_lost(colad: ColadService, kubelet: FakeKubelet) -> None:
    kubelet.wait_registered()
    old = colad.pids()
    (colad.run_dir / "queue.sock").unlink()
    colad.wait_log("queue socket removed or replaced; listening again", timeout=15)
    wait_until(lambda: (colad.run_dir / "queue.sock").exists(), 5, "a new queue socket")
    colad.add("after-queue-loss")
    kubelet.wait_devices({"cocacola", "peisicola", "after-queue-loss"}, timeout=10)
    colad.kill("discovery")  # a restarted sender must find the new socket
    colad.wait_running(exclude_pids={"discovery": old["discovery"]})
    colad.remove("cocacola")
    kubelet.wait_devices({"peisicola", "after-queue-loss"}, timeout=10)


def test_only_sockets_colad_recorded_are_removed_and_live_ones_are_never_touched(
    short_tmp: Path, kubelet: FakeKubelet
) -> None:
    # A socket named like ours that colad has no record of creating may be anybody's: left alone.
    unrecorded = kubelet.plugin_dir / "colad-1000.sock"
    with socket.socket(socket.AF_UNIX) as dead:
        dead.bind(str(unrecorded))  # bound, never listening: what a SIGKILLed process leaves
    live = kubelet.plugin_dir / "colad-2000.sock"
    with socket.socket(socket.AF_UNIX) as other:
        other.bind(str(live))
        other.listen(1)
        service = ColadService(short_tmp)
        service.add("cocacola")
        try:
            service.start()
            kubelet.wait_registered()
            kubelet.wait_devices({"cocacola"})
            service.wait_log("kubelet directory entry left alone", count=2)
            # The plugin's own socket, left behind by a SIGKILL, is on its record: the next plugin removes it.
            own = kubelet.plugin_dir / str(kubelet.current_endpoint())
            assert own.is_socket() and own not in (unrecorded, live)
            old_pids = service.pids()
            service.kill("plugin")
            service.wait_running(exclude_pids={"plugin": old_pids["plugin"]})
            kubelet.wait_devices({"cocacola"})
            wait_until(lambda: not own.exists(), 10, "the dead plugin's own socket to be removed")
        finally:
            service.stop()
        assert unrecorded.exists() and live.exists(), "a socket colad did not create was removed"


@pytest.mark.skipif(os.geteuid() != 0, reason="mounting needs root")
def test_a_filesystem_mounted_over_the_device_directory_is_followed(colad: ColadService, kubelet: FakeKubelet) -> None:
    kubelet.wait_devices({"cocacola", "peisicola"})
    # mode=0755: a tmpfs is 1777 by default, and a device directory anyone can write is refused (trust.py).
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m,mode=0755", "colad-test", str(colad.device_dir)], check=True)
    try:
        kubelet.wait_devices(set(), timeout=10)  # the mount hides the files below it
        colad.add("on-tmpfs")
        kubelet.wait_devices({"on-tmpfs"}, timeout=10)
    finally:
        subprocess.run(["umount", str(colad.device_dir)], check=True)
    kubelet.wait_devices({"cocacola", "peisicola"}, timeout=10)


def _cpu_seconds(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as handle:
        fields = handle.read().rsplit(")", 1)[-1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def test_idle_roles_sleep(colad: ColadService, kubelet: FakeKubelet) -> None:
    """Idle roles use no CPU, though /proc/self/mountinfo polled for POLLIN is always readable."""
    kubelet.wait_devices({"cocacola", "peisicola"})
    pids = colad.pids()
    before = {role: _cpu_seconds(pid) for role, pid in pids.items()}
    # An idle window: nothing changes, so nothing may run. (A spin would use the whole window.)
    threading.Event().wait(3.0)
    used = {role: _cpu_seconds(pid) - before[role] for role, pid in pids.items()}
    assert all(seconds < 0.3 for seconds in used.values()), used
