"""The guard itself must be able to fail: roles killed behind the service's back, supervisord
killed unasked and tracebacks in a colad log are each reported, naming the role and the pids;
restarts the test declares (kill, restart, expect_restart) are not, and become the baseline."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests.fakes.kubelet import FakeKubelet
from tests.helpers import wait_until
from tests.service import ColadService, Guard, traceback_excerpts

pytestmark = pytest.mark.e2e

FAKE_TRACEBACK = """\
ts=2026-01-01T00:00:00.000Z level=info proc=discovery msg="device set changed"
Traceback (most recent call last):
  File "/x/colad/discovery.py", line 1, in main
    raise UnicodeDecodeError("utf-8", b"\\xff", 0, 1, "invalid start byte")
UnicodeDecodeError: 'utf-8' codec can't decode byte 0xff in position 0: invalid start byte
2026-01-01 00:00:00,000 WARN exited: discovery (exit status 1; not expected)
"""


def test_a_role_killed_behind_the_services_back_is_reported(colad: ColadService, kubelet: FakeKubelet) -> None:
    kubelet.wait_registered()
    old = colad.pids()["discovery"]
    os.kill(old, signal.SIGKILL)  # not colad.kill: the guard was not told
    new = colad.wait_running(exclude_pids={"discovery": old})["discovery"]
    problems = colad.take_problems()
    assert any(
        "role discovery restarted without the test asking" in p
        and f"pid {old} -> {new}" in p
        and "terminated by SIGKILL" in p
        for p in problems
    ), problems
    assert not any("plugin" in p or "kubelet-watch" in p for p in problems[:-1]), problems
    assert colad.take_problems() == []  # reported once, and the new pid is the baseline


def test_declared_restarts_pass_and_become_the_baseline(colad: ColadService, kubelet: FakeKubelet) -> None:
    kubelet.wait_registered()
    old = colad.pids()
    colad.kill("plugin")
    colad.wait_running(exclude_pids={"plugin": old["plugin"]})
    restarted = colad.restart("kubelet-watch")
    assert colad.guard_check() == []
    # A second, undeclared exit of the same role is caught: the declaration was used up.
    os.kill(restarted, signal.SIGTERM)
    colad.wait_running(exclude_pids={"kubelet-watch": restarted})
    problems = colad.take_problems()
    assert len(problems) == 2, problems
    assert f"role kubelet-watch restarted without the test asking: pid {restarted}" in problems[0]


def test_a_role_down_at_check_time_is_reported(colad: ColadService, kubelet: FakeKubelet) -> None:
    kubelet.wait_registered()
    pid = colad.pids()["kubelet-watch"]
    os.kill(pid, signal.SIGKILL)
    wait_until(lambda: colad.states()["kubelet-watch"][1] != pid, 10, "supervisord to see the exit")
    problems = colad.guard_check()  # the respawn may not have happened yet: down or restarted, both fail
    assert any("role kubelet-watch" in p and str(pid) in p for p in problems), problems
    colad.wait_running(exclude_pids={"kubelet-watch": pid})
    colad.take_problems()


def test_supervisord_killed_unasked_is_reported(colad: ColadService, kubelet: FakeKubelet) -> None:
    kubelet.wait_registered()
    pid = colad.supervisord_pid()
    os.kill(pid, signal.SIGKILL)
    assert colad.proc is not None
    colad.proc.wait(10)
    colad.start()
    problems = colad.take_problems()
    assert any(f"role supervisord exited (rc -9) without the test asking: pid {pid}" in p for p in problems), problems
    # Declared, the same fault passes.
    colad.kill("supervisord")
    colad.proc.wait(10)
    colad.start()
    assert colad.take_problems() == []


def test_a_traceback_in_the_colad_log_or_a_child_log_is_reported(colad: ColadService, kubelet: FakeKubelet) -> None:
    kubelet.wait_registered()
    colad.guard_check()
    with open(colad.log_path, "a") as log:  # what a role's uncaught exception writes to its stdout
        log.write(FAKE_TRACEBACK)
    problems = colad.take_problems()
    assert len(problems) == 2 and "traceback in colad.log" in problems[0], problems
    assert "UnicodeDecodeError: 'utf-8' codec" in problems[0]
    assert 'proc=discovery msg="device set changed"' in problems[0]  # the context names the role
    assert "exited: discovery" not in problems[0]  # the excerpt ends with the exception line
    (colad.run_dir / "listener-stderr---colad-x.log").write_text(FAKE_TRACEBACK)
    problems = colad.take_problems()
    assert any("traceback in listener-stderr---colad-x.log" in p for p in problems), problems
    assert colad.take_problems() == []  # each traceback is reported once


def test_a_second_service_on_the_same_root_is_not_blamed_for_the_firsts_log(
    short_tmp: Path, kubelet: FakeKubelet
) -> None:
    first = ColadService(short_tmp)
    first.log_path.write_text(FAKE_TRACEBACK)  # an earlier run's traceback, already reported then
    first.run_dir.mkdir(mode=0o700)
    (first.run_dir / "plugin-stderr---colad-old.log").write_text(FAKE_TRACEBACK)
    first.add("cocacola")
    first.start()
    try:
        kubelet.wait_registered()
    finally:
        assert first.stop() == 0
    assert first.take_problems() == []


@pytest.mark.unit
@pytest.mark.parametrize(
    ("lines", "state", "pid", "budget", "problem"),
    [
        ([("plugin", 10)], "RUNNING", 10, 0, None),
        ([("plugin", 10), ("plugin", 11)], "RUNNING", 11, 0, "restarted without the test asking: pid 10 -> 11"),
        ([("plugin", 10), ("plugin", 11)], "RUNNING", 11, 1, None),
        ([("plugin", 10)], "BACKOFF", 0, 0, "is BACKOFF without the test asking: pid 10 gone"),
        ([("plugin", 10)], "EXITED", 0, 1, None),
        ([("plugin", 10)], "RUNNING", 12, 0, "pid changed without a spawn line: 10 -> 12"),
    ],
    ids=["steady", "unasked-restart", "declared-restart", "down-unasked", "down-declared", "no-spawn-line"],
)
def test_guard_rules(lines: list[tuple[str, int]], state: str, pid: int, budget: int, problem: str | None) -> None:
    guard = Guard()
    guard.new_start()
    guard.expect("plugin", budget)
    found = [p for name, spawned in lines if (p := guard.spawned(name, spawned))]
    found += [p for p in [guard.checked_state("plugin", state, pid)] if p]
    assert (problem is None and found == []) or (problem is not None and any(problem in p for p in found)), found


@pytest.mark.unit
def test_traceback_excerpts_cover_chained_exceptions() -> None:
    text = "a\nb\n" + FAKE_TRACEBACK.replace(
        "UnicodeDecodeError:",
        "KeyError: 'x'\n\nDuring handling of the above exception, another exception occurred:"
        '\n\nTraceback (most recent call last):\n  File "y", line 2\nUnicodeDecodeError:',
    )
    (excerpt,) = traceback_excerpts(text, "colad.log")
    assert "KeyError: 'x'" in excerpt and excerpt.rstrip().endswith("invalid start byte") and "exited:" not in excerpt


UNASKED = """
import os, signal
def test_kills_discovery_unasked(colad, kubelet):
    kubelet.wait_registered()
    old = colad.pids()["discovery"]
    os.kill(old, signal.SIGKILL)
    colad.wait_running(exclude_pids={"discovery": old})
"""


def test_the_guard_fails_a_test_at_teardown(short_tmp: Path) -> None:
    """The fixtures, not only the check: a test that kills a role unasked ends in an error."""
    (short_tmp / "test_unasked.py").write_text(UNASKED)
    root = Path(__file__).resolve().parent.parent.parent
    run = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-p",
            "tests.conftest",
            "-p",
            "tests.e2e.conftest",
            "--rootdir",
            str(short_tmp),
            str(short_tmp / "test_unasked.py"),
        ],
        cwd=root,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert run.returncode == 1, run.stdout + run.stderr
    assert "1 passed, 1 error" in run.stdout, run.stdout
    assert "colad guard:" in run.stdout and "role discovery restarted without the test asking" in run.stdout
