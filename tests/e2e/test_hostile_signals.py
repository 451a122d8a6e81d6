"""Signals at every moment of a role's start-up, under the real supervisord.

`python -m colad` blocks SIGHUP, SIGTERM and SIGINT at its first instruction and each role takes them once
it can act on them, so a SIGHUP (what `colad reload` sends through supervisord) is a deferred reload and a
SIGTERM a clean exit, never a death by signal. Each test restarts a role through supervisord's XML-RPC and
fires the signal after a seeded random delay of 0-1 s (half in the first 100 ms), many times; the guard
(tests/service.py) fails it on any restart it did not cause or a traceback. Also: supervisord as PID 1.
"""

from __future__ import annotations

import os
import random
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from colad.health.rule import PROGRAMS
from tests.fakes.kubelet import FakeKubelet
from tests.helpers import wait_until
from tests.service import ColadService

pytestmark = pytest.mark.e2e

SEED = 20261216
HUP_ROUNDS = 12  # per role
# Half the rounds aim at the first 100 ms: the interpreter's own start-up, where a role is most exposed.
EARLY = 0.1
TERM_ROUNDS = 5  # per role
DEVICES = {"cocacola", "peisicola"}


def spawn_now(colad: ColadService, role: str) -> int:
    """Stop `role` and start it again without waiting for RUNNING; the new pid, spawned but not yet started."""
    colad.rpc().supervisor.stopProcess(f"colad:{role}")
    colad.rpc().supervisor.startProcess(f"colad:{role}", False)
    pid = int(colad.rpc().supervisor.getProcessInfo(f"colad:{role}")["pid"])
    assert pid, f"{role}: no pid right after startProcess"
    return pid


def wait_running_as(colad: ColadService, role: str, pid: int, timeout: float = 30) -> None:
    """RUNNING (past startsecs) with exactly this pid; any other pid means the role died."""

    def running() -> bool:
        info = colad.rpc().supervisor.getProcessInfo(f"colad:{role}")
        if info["pid"] != pid:
            raise AssertionError(f"{role}: pid {pid} replaced by {info['pid']} ({info['statename']})")
        return bool(info["statename"] == "RUNNING")

    wait_until(running, timeout, f"{role} RUNNING as pid {pid}", logs=[colad.log_path])


def exit_line(colad: ColadService, role: str, pid: int) -> str:
    """supervisord's line for how `pid` ended ("exited: plugin (exit status 0; not expected)")."""
    pattern = re.compile(rf" (?:exited|stopped): {re.escape(role)} \((.*)\)")
    lines = colad.log().splitlines()
    spawned = [i for i, line in enumerate(lines) if f"spawned: '{role}' with pid {pid}" in line]
    assert spawned, f"no spawn line for {role} pid {pid}"
    for line in lines[spawned[-1] + 1 :]:
        if f"spawned: '{role}'" in line:
            break
        if match := pattern.search(line):
            return match.group(1)
    return ""


def test_sighup_at_any_moment_of_start_up_is_never_a_death(colad: ColadService, kubelet: FakeKubelet) -> None:
    rng = random.Random(SEED)
    kubelet.wait_registered(timeout=30)
    kubelet.wait_devices(DEVICES, timeout=30)
    delays: list[float] = []
    for role in PROGRAMS:
        for n in range(HUP_ROUNDS):
            delay = rng.uniform(0.0, EARLY if n % 2 else 1.0)
            colad.expect_restart(role)  # the restart this test causes, and only that one
            pid = spawn_now(colad, role)
            time.sleep(delay)  # the stimulus's timing, not a wait for a condition
            colad.rpc().supervisor.signalProcess(f"colad:{role}", "HUP")  # exactly what `colad reload` sends
            wait_running_as(colad, role, pid)
            delays.append(delay)
            assert colad.guard_check() == [], f"{role} after SIGHUP at {delay:.3f}s"
    assert colad.log().count("Traceback (most recent call last)") == 0
    kubelet.wait_devices(DEVICES, timeout=30)
    print(f"SIGHUP during start-up: {len(delays)} rounds, delays {min(delays):.3f}-{max(delays):.3f}s, seed {SEED}")


def test_sigterm_during_start_up_is_a_clean_exit(colad: ColadService, kubelet: FakeKubelet) -> None:
    rng = random.Random(SEED + 1)
    kubelet.wait_registered(timeout=30)
    for role in PROGRAMS:
        for _ in range(TERM_ROUNDS):
            delay = rng.uniform(0.0, 1.0)
            colad.expect_restart(role, times=2)  # the restart here, and supervisord's after the exit
            pid = spawn_now(colad, role)
            time.sleep(delay)
            colad.rpc().supervisor.signalProcess(f"colad:{role}", "TERM")
            ended = wait_until(
                lambda r=role, p=pid: exit_line(colad, r, p), 30, f"{role} pid {pid} to exit", logs=[colad.log_path]
            )
            assert ended.startswith("exit status 0"), f"{role} after SIGTERM at {delay:.3f}s: {ended}"
            colad.wait_running(30, exclude_pids={role: pid})
    kubelet.wait_devices(DEVICES, timeout=30)


def test_colad_reload_right_after_colad_supervise_starts(short_tmp: Path, kubelet: FakeKubelet) -> None:
    service = ColadService(short_tmp)
    service.add(*DEVICES)
    socket_path = service.run_dir / "supervisor.sock"
    results: list[int] = []
    stop = threading.Event()

    def reload_early() -> None:
        # As soon as supervisord answers, and then repeatedly through the roles' first 1.5 s.
        while not stop.is_set() and not socket_path.exists():
            time.sleep(0.005)
        deadline = time.monotonic() + 1.5
        while not stop.is_set() and time.monotonic() < deadline:
            done = subprocess.run(
                [sys.executable, "-m", "colad", "reload"], env=service.env, capture_output=True, text=True, timeout=30
            )
            results.append(done.returncode)
            assert "Traceback" not in done.stderr, done.stderr

    thread = threading.Thread(target=reload_early, name="reload-early", daemon=True)
    thread.start()
    try:
        service.start()
        thread.join(30)
        assert results, "no colad reload ran"
        time.sleep(1.5)  # past startsecs once more: a role killed by the last reload would show now
        pids = service.wait_running(30)
        assert service.guard_check() == []
        assert service.pids()["plugin"] == pids["plugin"]
        kubelet.wait_devices(DEVICES, timeout=30)
    finally:
        stop.set()
        rc = service.stop()
    assert rc == 0, service.log()[-4000:]
    print(f"colad reload during start-up: {len(results)} runs, exit codes {sorted(set(results))}")


@pytest.mark.skipif(not hasattr(os, "geteuid") or os.geteuid() != 0, reason="unshare --pid needs root")
def test_a_role_whose_parent_is_pid_1_does_not_stop_itself(short_tmp: Path) -> None:
    """In a container supervisord is PID 1: the guard must not take getppid() == 1 for a dead parent."""
    service = ColadService(short_tmp)
    service.add(*DEVICES)
    out = short_tmp / "discovery.log"
    script = (
        f"{sys.executable} -m colad discovery >{out} 2>&1 & child=$!; "
        f"n=0; until grep -q 'discovery starting' {out} || [ $n -ge 300 ]; do sleep 0.1; n=$((n+1)); done; "
        "sleep 1; kill -0 $child && echo alive; kill $child; wait"
    )
    # A new PID namespace: sh is its PID 1 and discovery's parent, as supervisord is in the pod.
    done = subprocess.run(
        ["unshare", "--pid", "--fork", "--kill-child", "sh", "-c", script],
        env=service.env,
        capture_output=True,
        text=True,
        timeout=90,
    )
    log = out.read_text(errors="replace")
    assert "alive" in done.stdout, done.stdout + done.stderr + log
    assert "discovery starting" in log and "parent died" not in log and "Traceback" not in log, log


def test_a_role_still_dies_with_its_parent(short_tmp: Path) -> None:
    service = ColadService(short_tmp)
    service.add(*DEVICES)
    parent = subprocess.Popen(
        ["sh", "-c", f"{sys.executable} -m colad discovery & echo $!; wait"],
        env=service.env,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        start_new_session=True,
    )
    assert parent.stdout is not None
    child = int(parent.stdout.readline())
    wait_until(
        lambda: Path(f"/proc/{child}/status").read_text().count("SigCgt") and _caught(child),
        20,
        "discovery's handlers installed",
    )
    parent.kill()
    parent.wait(10)
    wait_until(lambda: not Path(f"/proc/{child}").exists() or _zombie(child), 20, "discovery gone with its parent")


def _caught(pid: int) -> bool:
    lines = Path(f"/proc/{pid}/status").read_text().splitlines()
    fields = dict(line.split(":\t", 1) for line in lines if ":\t" in line)
    return bool(int(fields["SigCgt"], 16) & (1 << (signal.SIGTERM - 1)))


def _zombie(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except OSError:
        return True
