"""Health is honest and FATAL is not the end, under the real supervisord.

/healthz and `colad status` name any process that is not RUNNING, and a discovery
that stopped reporting; the watchdog (inside supervisord) starts a FATAL role
again after its back-off (tests/e2e/test_watchdog_inprocess.py: its doubling, its faults).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from colad.supervise import watchdog
from tests.fakes.kubelet import FakeKubelet
from tests.helpers import http_get, metrics_address, wait_until
from tests.service import ColadService

pytestmark = pytest.mark.e2e
BASE = {"cocacola", "peisicola"}


@pytest.fixture
def service(short_tmp: Path, request: pytest.FixtureRequest) -> Iterator[ColadService]:
    colad = ColadService(short_tmp, extra_env=getattr(request, "param", None) or {})
    colad.add(*BASE)
    colad.start()
    yield colad
    rc = colad.stop()
    assert rc == 0, f"supervisord exited with {rc}\n" + colad.log()[-4000:]


def status(colad: ColadService) -> tuple[int, str]:
    done = subprocess.run(
        [sys.executable, "-m", "colad", "status"], env=colad.env, capture_output=True, text=True, timeout=30
    )
    return done.returncode, done.stdout


def test_healthz_and_status_name_a_stopped_role(service: ColadService, kubelet: FakeKubelet) -> None:
    kubelet.wait_devices(BASE, timeout=30)
    url = f"http://{metrics_address(service.run_dir)}/healthz"
    wait_until(lambda: http_get(url)[0] == 200, 30, "/healthz 200", logs=[service.log_path])
    service.expect_restart("kubelet-watch")
    service.rpc().supervisor.stopProcess("colad:kubelet-watch")
    code, body = wait_until(lambda: (r := http_get(url))[0] == 503 and r, 10, "/healthz 503 with a role stopped")
    assert "kubelet-watch is STOPPED" in body
    rc, out = status(service)
    assert rc == 1 and "problem: kubelet-watch is STOPPED" in out, out
    # The devices are still with the kubelet: health is about colad, not about the list alone.
    assert kubelet.devices() == dict.fromkeys(BASE, "Healthy")
    service.rpc().supervisor.startProcess("colad:kubelet-watch")
    wait_until(lambda: http_get(url)[0] == 200, 30, "/healthz 200 again", logs=[service.log_path])
    assert status(service)[0] == 0


@pytest.mark.parametrize("service", [{"COLAD_RESCAN_INTERVAL": "1"}], indirect=True)
def test_healthz_says_a_hung_discovery_may_serve_a_stale_list(service: ColadService, kubelet: FakeKubelet) -> None:
    kubelet.wait_devices(BASE, timeout=30)
    url = f"http://{metrics_address(service.run_dir)}/healthz"
    wait_until(lambda: http_get(url)[0] == 200, 30, "/healthz 200", logs=[service.log_path])
    pid = service.pids()["discovery"]
    os.kill(pid, signal.SIGSTOP)  # alive and RUNNING for supervisord, but silent: what a hang looks like
    try:
        _, body = wait_until(lambda: (r := http_get(url))[0] == 503 and r, 40, "/healthz 503 for a silent discovery")
        assert "discovery silent for" in body and "list may be stale" in body
    finally:
        os.kill(pid, signal.SIGCONT)
    wait_until(lambda: http_get(url)[0] == 200, 30, "/healthz 200 once discovery reports", logs=[service.log_path])
    assert service.pids()["discovery"] == pid


def _fatal(colad: ColadService, program: str, deadline: float = 240.0) -> None:
    """Kill `program` every time it starts, before startsecs: supervisord retries, then gives up (FATAL)."""
    end = time.monotonic() + deadline
    killed: set[int] = set()
    while time.monotonic() < end:
        state, pid = colad.states().get(program, ("", 0))
        if state == "FATAL":
            return
        if state == "STARTING" and pid and pid not in killed:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            killed.add(pid)
        elif state == "RUNNING" and pid and pid not in killed:  # the first one: already past startsecs
            os.kill(pid, signal.SIGKILL)
            killed.add(pid)
        time.sleep(0.005)
    raise AssertionError(f"{program} never went FATAL: {colad.states()}")


def test_a_fatal_role_is_started_again_by_the_watchdog(service: ColadService, kubelet: FakeKubelet) -> None:
    kubelet.wait_devices(BASE, timeout=30)
    url = f"http://{metrics_address(service.run_dir)}/healthz"
    old = service.wait_running()
    service.expect_restart("discovery", times=None)
    _fatal(service, "discovery")
    fatal_at = time.monotonic()
    code, body = wait_until(
        lambda: (r := http_get(url))[0] == 503 and "FATAL" in r[1] and r, 10, "/healthz names FATAL"
    )
    assert "discovery is FATAL" in body
    rc, out = status(service)
    assert rc == 1 and "problem: discovery is FATAL" in out and "restart: colad:discovery in " in out, out
    # The plugin keeps the last list while discovery is down; the watchdog starts it after its back-off.
    assert kubelet.devices() == dict.fromkeys(BASE, "Healthy")
    new = service.wait_running(timeout=watchdog.BACKOFF_FIRST + 60, exclude_pids={"discovery": old["discovery"]})
    assert time.monotonic() - fatal_at >= watchdog.BACKOFF_FIRST - 1  # not before the back-off
    assert new["plugin"] == old["plugin"] and new["kubelet-watch"] == old["kubelet-watch"]
    service.add("after-fatal")
    kubelet.wait_devices(BASE | {"after-fatal"}, timeout=30)
    wait_until(lambda: http_get(url)[0] == 200, 30, "/healthz 200 after recovery", logs=[service.log_path])
    log = "\n".join(service.log_lines("proc=watchdog"))
    assert "colad:discovery in 10s (FATAL 1 in a row)" in log and 'msg="role started again" role=colad:discovery' in log
    assert "Traceback" not in log
