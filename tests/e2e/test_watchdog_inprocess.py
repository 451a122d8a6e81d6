"""The watchdog inside supervisord (colad/supervise/watchdog.py, [rpcinterface:colad]), under the real supervisord.

A role whose command keeps failing goes FATAL; the watchdog starts it again after 10 s, then 20 s,
while `colad status` and /healthz name it; once its command works it stays. A callback that raises
costs one log line and never supervisord; no watchdog process exists. The template is the shipped
one, with discovery's command made to fail while a marker file exists (and one retry, for speed).
"""

from __future__ import annotations

import calendar
import os
import re
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from colad.health.rule import PROGRAMS
from colad.supervise import main, watchdog
from tests.fakes.kubelet import FakeKubelet
from tests.helpers import http_get, metrics_address, wait_until
from tests.service import ColadService

pytestmark = pytest.mark.e2e
REPO = Path(__file__).resolve().parents[2]
TEMPLATE = (REPO / "conf" / "supervisord.conf").read_text()
BASE = {"cocacola", "peisicola"}
DISCOVERY = "command=/usr/bin/env --block-signal=HUP,INT,TERM ${python} -m colad discovery\n"
_TS = re.compile(r"^ts=(\S+)\.(\d{3})Z ")


class FaultyCore(watchdog.Watchdog):
    """A core that raises where supervisord calls in: on every RUNNING event and on the first tick."""

    ticks = 0

    def running(self, name: str, now: float) -> None:
        raise RuntimeError(f"injected: running {name}")

    def due(self, now: float) -> list[str]:
        FaultyCore.ticks += 1
        if FaultyCore.ticks == 1:
            raise RuntimeError("injected: tick")
        return super().due(now)


def make_faulty_rpcinterface(supervisord: Any, **keys: str) -> watchdog.ColadNamespaceRPCInterface:
    """[rpcinterface:colad] of the fault test: colad's own glue around FaultyCore."""
    return watchdog.make_rpcinterface(supervisord, core=FaultyCore(), **keys)


def failing_template(root: Path, *, factory: str = main.WATCHDOG_FACTORY) -> Path:
    """The shipped template, discovery failing (exit 3) while `root`/discovery-fails exists, one retry."""
    head, rest = TEMPLATE.split("[program:discovery]\n", 1)
    section, tail = rest.split("\n[", 1)
    assert DISCOVERY in section and "startretries=10\n" in section and main.WATCHDOG_FACTORY in head
    marker = root / "discovery-fails"
    failing = f"command=/bin/sh -c '[ -e {marker} ] && exit 3; exec {DISCOVERY.split('=', 1)[1].strip()}'\n"
    section = section.replace(DISCOVERY, failing).replace("startretries=10\n", "startretries=1\n")
    path = root / "supervisord.conf.in"
    path.write_text(f"{head.replace(main.WATCHDOG_FACTORY, factory)}[program:discovery]\n{section}\n[{tail}")
    return path


def start(root: Path, factory: str = main.WATCHDOG_FACTORY, python: str = sys.executable) -> ColadService:
    env = {"COLAD_SUPERVISORD_TEMPLATE": str(failing_template(root, factory=factory)), "PYTHONPATH": str(REPO)}
    service = ColadService(root, extra_env=env, python=python)
    service.add(*BASE)
    service.start()
    return service


@pytest.fixture
def failing(short_tmp: Path, kubelet: FakeKubelet) -> Iterator[ColadService]:
    service = start(short_tmp)
    yield service
    assert service.stop() == 0, service.log()[-4000:]


def status(colad: ColadService) -> tuple[int, str]:
    done = subprocess.run(
        [sys.executable, "-m", "colad", "status"], env=colad.env, capture_output=True, text=True, timeout=30
    )
    return done.returncode, done.stdout


def at(line: str) -> float:
    m = _TS.match(line)
    assert m, line
    return calendar.timegm(time.strptime(m[1], "%Y-%m-%dT%H:%M:%S")) + int(m[2]) / 1000


def watchdog_lines(colad: ColadService, needle: str, count: int, timeout: float) -> list[str]:
    return [line for line in colad.wait_log(needle, timeout, count) if "proc=watchdog" in line]


def make_discovery_fail(colad: ColadService) -> int:
    (colad.root / "discovery-fails").touch()
    colad.expect_restart("discovery", times=None)
    return colad.kill("discovery")


def test_no_watchdog_process_runs_and_supervisord_hosts_it(failing: ColadService, kubelet: FakeKubelet) -> None:
    kubelet.wait_devices(BASE, timeout=30)
    supervisord = failing.supervisord_pid()
    assert sorted(failing.states()) == sorted(PROGRAMS)  # no event listener beside the roles
    children = []
    for entry in os.listdir("/proc"):
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
            if int(stat.rsplit(")", 1)[1].split()[1]) == supervisord:
                children.append(Path(f"/proc/{entry}/cmdline").read_bytes().replace(b"\0", b" "))
        except (OSError, ValueError):
            continue
    assert len(children) == 3 and not [c for c in children if b"watchdog" in c], children
    started = failing.log_lines('proc=watchdog msg="watchdog starting"')
    assert len(started) == 1 and f"inside=supervisord pid={supervisord} " in started[0]
    assert failing.rpc().colad.getRestarts() == []
    assert status(failing)[0] == 0 or "restart:" not in status(failing)[1]


def test_a_failing_role_is_started_again_after_a_doubling_backoff(failing: ColadService, kubelet: FakeKubelet) -> None:
    kubelet.wait_devices(BASE, timeout=30)
    url = f"http://{metrics_address(failing.run_dir)}/healthz"
    old = failing.wait_running()
    make_discovery_fail(failing)
    first = watchdog_lines(failing, "colad:discovery in 10s (FATAL 1 in a row)", 1, 60)[0]
    # Meanwhile: FATAL is named by /healthz and `colad status`, with the watchdog's coming start.
    code, body = wait_until(
        lambda: (r := http_get(url))[0] == 503 and "FATAL" in r[1] and r, 15, "/healthz names FATAL"
    )
    assert "discovery is FATAL" in body
    rc, out = status(failing)
    assert rc == 1 and "problem: discovery is FATAL" in out, out
    assert re.search(r"^restart: colad:discovery in \d+(\.\d)?s by the watchdog \(FATAL 1 in a row\)$", out, re.M), out
    [pending] = failing.rpc().colad.getRestarts()
    assert pending["name"] == "colad:discovery" and pending["fatal_in_a_row"] == 1
    assert 0 <= pending["in_s"] <= watchdog.BACKOFF_FIRST
    assert kubelet.devices() == dict.fromkeys(BASE, "Healthy")  # the plugin keeps the last list
    # Started again, fails again: the next back-off is twice as long.
    second = watchdog_lines(failing, "colad:discovery in 20s (FATAL 2 in a row)", 1, watchdog.BACKOFF_FIRST + 60)[0]
    (failing.root / "discovery-fails").unlink()
    new = failing.wait_running(timeout=2 * watchdog.BACKOFF_FIRST + 60, exclude_pids={"discovery": old["discovery"]})
    starts = watchdog_lines(failing, 'msg="role started again" role=colad:discovery', 2, 10)
    assert at(starts[0]) - at(first) >= watchdog.BACKOFF_FIRST - 0.01
    assert at(starts[1]) - at(second) >= 2 * watchdog.BACKOFF_FIRST - 0.01
    assert at(first) < at(starts[0]) < at(second) < at(starts[1])
    assert new["plugin"] == old["plugin"] and new["kubelet-watch"] == old["kubelet-watch"]
    failing.add("after-fatal")
    kubelet.wait_devices(BASE | {"after-fatal"}, timeout=30)
    wait_until(lambda: status(failing)[0] == 0, 30, "colad status 0 after recovery", logs=[failing.log_path])
    assert failing.rpc().colad.getRestarts() == []


def test_supervisord_survives_a_callback_that_raises(short_tmp: Path, kubelet: FakeKubelet) -> None:
    FaultyCore.ticks = 0
    service = start(short_tmp, factory=f"{__name__}:make_faulty_rpcinterface")
    try:
        supervisord = service.supervisord_pid()
        kubelet.wait_devices(BASE, timeout=30)
        # Every RUNNING event raised inside supervisord's state change, and its first tick: one line each.
        failed = 'proc=watchdog msg="watchdog callback failed; supervisord goes on"'
        lines = service.wait_log(failed, 30, count=4)
        assert sum('callback="state event"' in line and "injected: running colad:" in line for line in lines) == 3
        assert sum("callback=tick" in line and "injected: tick" in line for line in lines) == 1
        assert all(f"where={Path(__file__).name}:" in line for line in lines)
        # Later callbacks still work: a FATAL role is started again after its back-off.
        old = service.wait_running()
        make_discovery_fail(service)
        watchdog_lines(service, "colad:discovery in 10s (FATAL 1 in a row)", 1, 60)
        (service.root / "discovery-fails").unlink()
        service.wait_running(timeout=watchdog.BACKOFF_FIRST + 60, exclude_pids={"discovery": old["discovery"]})
        assert service.supervisord_pid() == supervisord and service.proc is not None and service.proc.poll() is None
    finally:
        assert service.stop() == 0, service.log()[-4000:]


@pytest.mark.debian
def test_on_bookworms_supervisor_a_fatal_role_is_started_again(short_tmp: Path, kubelet: FakeKubelet) -> None:
    service = start(short_tmp, python="/usr/bin/python3")
    try:
        assert service.rpc().supervisor.getSupervisorVersion() == "4.2.5"
        kubelet.wait_devices(BASE, timeout=30)
        old = service.wait_running()
        make_discovery_fail(service)
        watchdog_lines(service, "colad:discovery in 10s (FATAL 1 in a row)", 1, 60)
        assert [r["name"] for r in service.rpc().colad.getRestarts()] == ["colad:discovery"]
        (service.root / "discovery-fails").unlink()
        service.wait_running(timeout=watchdog.BACKOFF_FIRST + 60, exclude_pids={"discovery": old["discovery"]})
        watchdog_lines(service, 'msg="role started again" role=colad:discovery', 1, 10)
    finally:
        assert service.stop() == 0, service.log()[-4000:]
