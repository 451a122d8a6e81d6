"""ProbeRunner with real processes, driven as the discovery loop will drive it: select() on fds()
until next_deadline(), then poll(). Healthy, failing with a reason, hanging past the timeout,
crashing, flapping, a missing command, a flood of output, a probe that leaves a child behind;
at most max_in_flight processes at once; a slow probe never delays another, and no poll() waits.
"""

from __future__ import annotations

import os
import select
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from colad.jobs.probes import BASE_ENV, PENDING, Probe, ProbeResult, ProbeRunner

pytestmark = pytest.mark.integration
SH = "/bin/sh"
DEADLINE = 30.0  # generous: the machine is shared
TOKEN = f"probe-test-{os.getpid()}"
MARK = f"COLAD_TEST_TOKEN={TOKEN}".encode()
ENV = {**BASE_ENV, "COLAD_TEST_TOKEN": TOKEN}


class Driver:
    """The discovery loop's share of the work: wait on the fds until the deadline, poll, record."""

    def __init__(self, runner: ProbeRunner) -> None:
        self.runner = runner
        self.history: list[tuple[float, str, ProbeResult]] = []
        self.longest_poll = 0.0

    def step(self, cap: float = 0.5) -> None:
        deadline = self.runner.next_deadline()
        wait = cap if deadline is None else min(cap, max(0.0, deadline - time.monotonic()))
        fds = self.runner.fds()
        if fds:
            select.select(fds, [], [], wait)
        else:
            time.sleep(wait)
        start = time.monotonic()
        changed = self.runner.poll()
        self.longest_poll = max(self.longest_poll, time.monotonic() - start)
        for key, verdict in changed.items():
            self.history.append((time.monotonic(), key, verdict))

    def until(self, predicate: Callable[[], bool], describe: str, timeout: float = DEADLINE) -> None:
        end = time.monotonic() + timeout
        while not predicate():
            if time.monotonic() > end:
                last = f"{self.runner.verdicts()} {self.history[-5:]}"
                raise AssertionError(f"timed out waiting for {describe}: {last}")
            self.step()


@pytest.fixture
def runner() -> Iterator[ProbeRunner]:
    r = ProbeRunner(max_in_flight=4, env=ENV)
    yield r
    r.close()


def sh(script: str, timeout: float = 5.0, interval: float = 0.2) -> Probe:
    return Probe((SH, "-c", script), timeout=timeout, interval=interval)


def test_healthy_failing_crashing_hanging_and_missing(runner: ProbeRunner) -> None:
    runner.set_probes(
        {
            "ok": sh("exit 0"),
            "fail": sh('echo "fan stalled at 0 rpm"; echo detail; exit 3'),
            "crash": sh("kill -SEGV $$"),
            "hang": sh("echo waiting; exec sleep 60", timeout=0.5),
            "missing": Probe(("/nonexistent/probe",)),
        }
    )
    assert set(runner.verdicts().values()) == {ProbeResult(False, PENDING)}  # nothing says Healthy before a run
    driver = Driver(runner)
    driver.until(lambda: PENDING not in {v.reason for v in runner.verdicts().values()}, "every first verdict")
    assert runner.verdicts() == {
        "ok": ProbeResult(True),
        "fail": ProbeResult(False, "fan stalled at 0 rpm"),
        "crash": ProbeResult(False, "killed by SIGSEGV"),
        "hang": ProbeResult(False, "timed out after 0.5s: waiting"),
        "missing": ProbeResult(False, "cannot run '/nonexistent/probe': No such file or directory"),
    }
    assert runner.timeouts >= 1 and runner.spawn_failures >= 1
    assert driver.longest_poll < 0.2, driver.longest_poll


def test_flapping_reports_every_transition(runner: ProbeRunner, tmp_path: Path) -> None:
    flag = tmp_path / "flag"
    # Alternates: fails when the flag exists (and removes it), succeeds and creates it otherwise.
    script = f'if [ -e {flag} ]; then rm {flag}; echo "link down"; exit 1; fi; touch {flag}'
    runner.set_probes({"flap": sh(script, interval=0.05)})
    driver = Driver(runner)
    driver.until(lambda: len(driver.history) >= 7, "seven transitions")
    verdicts = [v for _, _, v in driver.history]
    assert all(a != b for a, b in zip(verdicts, verdicts[1:], strict=False))  # only changes are reported
    assert set(verdicts) == {ProbeResult(True), ProbeResult(False, "link down")}


def test_bounded_in_flight_and_a_hung_probe_never_delays_another(runner: ProbeRunner) -> None:
    runner = ProbeRunner(max_in_flight=3, env=ENV)
    try:
        hung = {f"hang{i}": sh("exec sleep 60", timeout=4.0, interval=10) for i in range(2)}
        runner.set_probes({**hung, "fast": sh("exit 0", interval=0.05)})
        driver = Driver(runner)
        peak = 0
        started = time.monotonic()
        driver.until(lambda: runner.started >= 22, "20 runs of the fast probe")
        while runner.started < 40 and time.monotonic() - started < 3.5:
            driver.step()
            peak = max(peak, runner.in_flight)
        took = time.monotonic() - started
        # The fast probe ran ~20+ times while both hung ones were still within their 4 s timeout.
        assert took < 4.0 and runner.verdicts()["fast"] == ProbeResult(True), took
        assert {runner.verdicts()[k].reason for k in hung} == {PENDING}
        assert peak <= 3 and runner.in_flight <= 3
        assert driver.longest_poll < 0.2
    finally:
        runner.close()


def test_more_hung_probes_than_slots_queue_and_are_all_timed_out(tmp_path: Path) -> None:
    runner = ProbeRunner(max_in_flight=2, env=ENV)
    try:
        runner.set_probes({f"h{i}": sh("exec sleep 60", timeout=0.3, interval=30) for i in range(6)})
        driver = Driver(runner)
        peak = 0

        def all_timed_out() -> bool:
            nonlocal peak
            peak = max(peak, runner.in_flight, _children())
            return all(v.reason.startswith("timed out") for v in runner.verdicts().values())

        driver.until(all_timed_out, "six time-outs through two slots")
        assert peak <= 2
        driver.until(lambda: runner.in_flight == 0, "every killed probe reaped")
        assert _children() == 0
    finally:
        runner.close()


def test_a_left_behind_child_and_a_flood_of_output_do_not_wedge(runner: ProbeRunner) -> None:
    runner.set_probes(
        {
            "daemon": sh("sleep 60 & echo started; exit 0"),  # the child holds the pipe open
            "flood": sh("head -c 5000000 /dev/zero | tr '\\0' x; echo; exit 1"),
        }
    )
    driver = Driver(runner)
    driver.until(lambda: PENDING not in {v.reason for v in runner.verdicts().values()}, "both verdicts", timeout=20)
    assert runner.verdicts()["daemon"] == ProbeResult(True)  # judged at its exit, not at the pipe's EOF
    assert runner.verdicts()["flood"].reason.startswith("xxx") and runner.verdicts()["flood"].reason.endswith("...")
    driver.until(lambda: runner.in_flight == 0 and _children() == 0, "no process left", timeout=10)


def test_environment_is_minimal_and_carries_the_device(runner: ProbeRunner, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COLAD_SECRET", "x")
    script = 'echo "$COLA_DEVICE_ID ${COLAD_SECRET:-none} $(pwd)"; exit 1'
    probe = Probe((SH, "-c", script), env=(("COLA_DEVICE_ID", "cola1"),))
    runner.set_probes({"cola1": probe})
    driver = Driver(runner)
    driver.until(lambda: runner.verdicts()["cola1"].reason != PENDING, "a verdict")
    assert runner.verdicts()["cola1"] == ProbeResult(False, "cola1 none /")


def test_a_changed_or_removed_probe_is_stopped(runner: ProbeRunner) -> None:
    runner.set_probes({"a": sh("exec sleep 60", timeout=30)})
    driver = Driver(runner)
    driver.until(lambda: runner.in_flight == 1, "the probe running")
    runner.set_probes({"a": sh("exit 0")})  # changed: the running one is killed, the new one runs
    driver.until(lambda: runner.verdicts().get("a") == ProbeResult(True), "the new probe's verdict")
    runner.set_probes({})
    assert runner.verdicts() == {}
    driver.until(lambda: runner.in_flight == 0 and _children() == 0, "nothing left")
    assert runner.next_deadline() is None


def _children() -> int:
    """Live processes started by a probe (or by its children): they carry TOKEN in their environment."""
    count = 0
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            environ = Path(f"/proc/{pid}/environ").read_bytes()
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except (OSError, IndexError):
            continue
        if MARK in environ.split(b"\0") and state != "Z":
            count += 1
    return count


if sys.platform != "linux":  # pragma: no cover
    pytestmark = pytest.mark.skip(reason="Linux only (pidfd, /proc)")
