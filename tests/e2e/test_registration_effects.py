"""A kubelet restart while the plugin cannot start a thread, under the real supervisord and a real task limit.

The plugin is moved into a pids cgroup of its own (cgroup v1, /sys/fs/cgroup/pids) whose limit is at or
below the number of tasks it has: every effect that needs a new thread then fails as it would at the
unit's TasksMax. The failure must show in `colad status` while it lasts, the plugin must neither exit nor log
a traceback (the guard), and once the limit is lifted the kubelet must get a registration and the whole
list back within seconds.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from colad.config.config import Config
from colad.core.registration import REGISTER_BACKOFF_MAX
from colad.plugin.registrar import CALL_SLACK
from tests.fakes.kubelet import FakeKubelet
from tests.helpers import http_get, metrics_address, wait_until
from tests.service import ColadService

pytestmark = pytest.mark.e2e

PIDS = Path("/sys/fs/cgroup/pids")
NO_THREAD = "can't start new thread"
# Usually under a second. At worst a Register call made while gRPC's core could not start its own threads
# is never answered, not even at its deadline (register_timeout, 15 s by default): CALL_SLACK later the
# plugin exits 1 and the one supervisord starts registers.
RECOVERY = Config.register_timeout + CALL_SLACK + REGISTER_BACKOFF_MAX + 10.0
GRPC_BROKEN = "gRPC no longer answers; exiting so supervisord restarts the plugin"


@contextmanager
def task_limit(pid: int, tasks: int) -> Iterator[Path]:
    """`pid` (all its threads) in a pids cgroup of its own, limited to `tasks`; lifted on exit.

    Below the tasks it has, no new one starts, even after some of its threads end (at the limit itself,
    a thread that ends, as the old server's do, makes room for the next).
    """
    group = PIDS / f"colad-test-{os.getpid()}-{pid}"
    group.mkdir()
    try:
        (group / "cgroup.procs").write_text(f"{pid}\n")
        (group / "pids.max").write_text(f"{tasks}\n")
        yield group
    finally:
        (group / "pids.max").write_text("max\n")
        for task in (group / "cgroup.procs").read_text().split():
            try:
                (PIDS / "cgroup.procs").write_text(f"{task}\n")
            except ProcessLookupError:
                pass
        group.rmdir()


def failures(colad: ColadService) -> list[str]:
    lines = colad.log_lines("registration effect failed") + colad.log_lines("thread ended with an error")
    return [line for line in lines if "proc=plugin" in line]


def status(colad: ColadService) -> tuple[int, str]:
    result = subprocess.run(
        [sys.executable, "-m", "colad", "status"], env=colad.env, capture_output=True, text=True, timeout=30
    )
    return result.returncode, result.stdout + result.stderr


@pytest.fixture
def colad(short_tmp: Path, kubelet: FakeKubelet) -> Iterator[ColadService]:
    service = ColadService(short_tmp)
    service.add("cocacola", "peisicola")
    service.start()
    yield service
    rc = service.stop()
    assert rc == 0, f"supervisord exited with {rc}\n" + service.log()[-4000:]


@pytest.mark.skipif(not (PIDS / "cgroup.procs").is_file(), reason="needs the cgroup v1 pids controller")
@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to make a pids cgroup")
def test_a_kubelet_restart_at_the_task_limit_is_shown_then_registration_returns_once_lifted(
    colad: ColadService, kubelet: FakeKubelet
) -> None:
    kubelet.wait_devices({"cocacola", "peisicola"}, timeout=30)
    url = f"http://{metrics_address(colad.run_dir)}/healthz"
    wait_until(lambda: http_get(url)[0] == 200, 20, "/healthz 200", logs=[colad.log_path])
    pids = colad.wait_running()
    colad.expect_restart("plugin")  # allowed only for the reason GRPC_BROKEN names: checked below
    registrations = len(kubelet.successful_registrations())
    # Not for long: gRPC's core aborts the process when it cannot start a thread of its own for ~10 s.
    with task_limit(pids["plugin"], tasks=1) as group:
        kubelet.restart()
        rc, out = wait_until(
            lambda: (r := status(colad))[0] == 1 and NO_THREAD in r[1] and r,
            8,
            "colad status names the failure",
            logs=[colad.log_path],
        )
        assert "registered: no (" in out and f"RuntimeError: {NO_THREAD}" in out, out
        # Whichever thread the limit refuses first (the old server's stop, the new server's, a call's, or a
        # gRPC worker once the kubelet dials), each failure is one line, then a back-off and a retry.
        failed = failures(colad)
        assert failed and all(NO_THREAD in line for line in failed), failed
        assert int((group / "pids.events").read_text().split()[1]) > 0, "the limit was what refused the threads"
        assert len(kubelet.successful_registrations()) == registrations
    lifted = time.monotonic()
    kubelet.wait_registered(count=registrations + 1, timeout=RECOVERY)
    kubelet.wait_devices({"cocacola", "peisicola"}, timeout=10)
    assert set(kubelet.devices().values()) == {"Healthy"}
    assert time.monotonic() - lifted < RECOVERY
    assert kubelet.stream_alive()
    healthz = lambda: http_get(f"http://{metrics_address(colad.run_dir)}/healthz")[0]  # noqa: E731 - a new plugin: a new port
    wait_until(lambda: healthz() == 200, 20, "/healthz 200 again", logs=[colad.log_path])
    rc, out = wait_until(lambda: (r := status(colad))[0] == 0 and r, 20, "colad status 0 again")
    restarted = {role for role, pid in colad.pids().items() if pid != pids[role]}
    assert restarted <= {"plugin"}, restarted
    assert not restarted or colad.log_lines(GRPC_BROKEN), "the plugin exited for no reason it gave"
    assert "Traceback" not in colad.log()


@pytest.mark.skipif(not (PIDS / "cgroup.procs").is_file(), reason="needs the cgroup v1 pids controller")
@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to make a pids cgroup")
def test_the_queue_socket_lost_at_the_task_limit_is_listened_again_once_lifted(
    colad: ColadService, kubelet: FakeKubelet
) -> None:
    kubelet.wait_devices({"cocacola", "peisicola"}, timeout=30)
    url = f"http://{metrics_address(colad.run_dir)}/healthz"
    wait_until(lambda: http_get(url)[0] == 200, 20, "/healthz 200", logs=[colad.log_path])
    pids = colad.wait_running()
    with task_limit(pids["plugin"], tasks=1):
        (colad.run_dir / "queue.sock").unlink()
        lines = colad.wait_log("queue not listening; retrying", timeout=20)
        assert NO_THREAD in lines[0], lines
    colad.wait_log("queue listening", timeout=20, count=2)
    colad.add("fanta")  # discovery reaches the plugin again: the kubelet holds the new device
    kubelet.wait_devices({"cocacola", "peisicola", "fanta"}, timeout=30)
    assert colad.pids() == pids, "no role exited"
    assert "Traceback" not in colad.log()
