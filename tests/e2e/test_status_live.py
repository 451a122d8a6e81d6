"""`colad status` and /healthz say the same thing, whatever happens, under the real supervisord.

status asks the plugin on its status socket and judges by the same rule as /healthz; only when the
plugin cannot be asked does it show the state file, with its age and writer, and never as healthy.
The run directory is a small tmpfs of its own here, so a full one is a real ENOSPC: state-file
writes fail while the kubelet goes away and comes back. A seeded sequence of faults (kubelet
away and back, run directory full and freed, a role SIGSTOPped and continued, a role killed and
restarted by supervisord) checks after each step, once both answers are stable, that they agree.
"""

from __future__ import annotations

import errno
import json
import os
import random
import re
import signal
import subprocess
import sys
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.fakes.kubelet import FakeKubelet
from tests.helpers import metrics_address, wait_until
from tests.service import ColadService

pytestmark = pytest.mark.e2e
BASE = {"cocacola", "peisicola"}
RUN_DIR_SIZE = "1m"
SEED = int(os.environ.get("COLAD_TEST_SEED", "0")) or random.randrange(1, 10**6)


@pytest.fixture
def run_tmpfs(short_tmp: Path) -> Iterator[Path]:
    """colad's run directory on a 1 MiB tmpfs of its own, which a test can fill."""
    run = short_tmp / "run"
    run.mkdir(mode=0o700)
    subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={RUN_DIR_SIZE},mode=0700", "colad-run", str(run)], check=True)
    yield run
    subprocess.run(["umount", "-l", str(run)], check=False)


@pytest.fixture
def service(run_tmpfs: Path, short_tmp: Path, kubelet: FakeKubelet) -> Iterator[ColadService]:
    colad = ColadService(short_tmp, extra_env={"COLAD_RESCAN_INTERVAL": "1"})
    assert colad.run_dir == run_tmpfs
    colad.add(*BASE)
    colad.start()
    yield colad
    for pid in colad.pids().values():  # a failing step may leave a role stopped
        if pid:
            os.kill(pid, signal.SIGCONT)
    rc = colad.stop()
    assert rc == 0, f"supervisord exited with {rc}\n" + colad.log()[-4000:]


def fill(run_dir: Path) -> None:
    """Fill the run directory's file system: the next write there fails with ENOSPC."""
    chunk = b"\0" * 65536
    fd = os.open(run_dir / "filler", os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    try:
        while True:
            try:
                os.write(fd, chunk)
            except OSError as exc:
                if exc.errno != errno.ENOSPC:
                    raise
                if len(chunk) == 1:
                    return
                chunk = chunk[: len(chunk) // 2]
    finally:
        os.close(fd)


def free(run_dir: Path) -> None:
    (run_dir / "filler").unlink(missing_ok=True)


def run_status(colad: ColadService, *flags: str) -> tuple[int, str]:
    done = subprocess.run(
        [sys.executable, "-m", "colad", "status", *flags], env=colad.env, capture_output=True, text=True, timeout=60
    )
    assert done.stderr == "", done.stderr
    return done.returncode, done.stdout


def status_json(colad: ColadService) -> tuple[int, dict[str, object]]:
    rc, out = run_status(colad, "--json")
    return rc, json.loads(out)


def status(colad: ColadService) -> tuple[int, dict[str, object], str]:
    """Exit code, the --json report and the table of `colad status` (the same exit code both times)."""
    rc, report = status_json(colad)
    rc_table, table = run_status(colad)
    assert rc == rc_table, (rc, rc_table, table)
    return rc, report, table


def healthz(address: str) -> tuple[bool, str]:
    """(ok, reason) of /healthz; a plugin that does not answer is not healthy."""
    try:
        with urllib.request.urlopen(f"http://{address}/healthz", timeout=4) as response:
            return response.status == 200, response.read().decode().strip()
    except urllib.error.HTTPError as exc:
        return False, exc.read().decode().strip()
    except OSError as exc:
        return False, f"no answer: {exc}"


def _shape(text: str) -> str:
    return re.sub(r"\d+", "N", text)  # "silent for 14s" and "for 15s" are the same problem


def observe(colad: ColadService, address: str) -> tuple[tuple[bool, str], tuple[int, str, bool]]:
    ok, reason = healthz(address)
    rc, report = status_json(colad)
    told = "; ".join(map(str, [*report["waiting"], *report["problems"]]))  # type: ignore[misc]
    live = bool((report.get("source") or {}).get("live"))  # type: ignore[attr-defined]
    return (ok, _shape(reason)), (rc, _shape(told), live)


def agreed(colad: ColadService, address: str, what: str, timeout: float = 60) -> tuple[bool, str, int]:
    """Poll /healthz and status until both give the same answer twice in a row, then check they agree."""
    last: list[object] = [None]

    def stable() -> object:
        seen = observe(colad, address)
        steady = seen == last[0]
        last[0] = seen
        return seen if steady else None

    (ok, reason), (rc, told, live) = wait_until(stable, timeout, f"stable answers after {what}", interval=0.2)
    assert ok == (rc == 0), f"after {what}: /healthz {'200' if ok else '503'} {reason!r}, status exit {rc} {told!r}"
    assert rc in (0, 1, 4), f"after {what}: status exit {rc} with supervisord running"
    if live:  # the same rule on the same snapshot: the same reasons
        assert ok or reason == told, f"after {what}: /healthz says {reason!r}, status says {told!r}"
    return ok, reason, rc


def test_a_full_run_dir_and_the_kubelet_gone_is_not_registered_in_status_as_on_healthz(
    service: ColadService, kubelet: FakeKubelet
) -> None:
    kubelet.wait_devices(BASE, timeout=30)
    address = metrics_address(service.run_dir)
    wait_until(lambda: healthz(address)[0], 30, "/healthz 200", logs=[service.log_path])
    rc, report, table = status(service)
    assert rc == 0 and "registered: yes" in table and "source:     the plugin (pid" in table, table

    fill(service.run_dir)
    kubelet.stop()
    ok, reason = wait_until(
        lambda: r if not (r := healthz(address))[0] and "not registered" in r[1] else None,
        30,
        "/healthz 503 not registered",
        logs=[service.log_path],
    )
    assert "state file not written" in reason and "No space left on device" in reason, reason
    rc, report, table = status(service)
    assert rc == 1, table
    assert "registered: yes" not in table and "registered: no" in table, table
    assert any("not registered" in p for p in report["problems"]), report  # type: ignore[attr-defined]
    assert any("state file not written" in p for p in report["problems"]), report  # type: ignore[attr-defined]
    # The file on disk still says registered: status did not read it.
    on_disk = json.loads((service.run_dir / "state" / "plugin.json").read_text())
    assert on_disk["registered"] is True
    agreed(service, address, "run dir full, kubelet gone")
    service.wait_log("state file not written; retrying")
    assert len(service.log_lines("state file not written; retrying")) == 1  # said once, retried quietly
    # `colad reload` learns how its reload was taken from the plugin too, not from the frozen file.
    done = subprocess.run(
        [sys.executable, "-m", "colad", "reload"], env=service.env, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0 and "colad reload: applied" in done.stdout, (done.stdout, done.stderr)

    # Space back, kubelet back: healthy again, and the file caught up.
    free(service.run_dir)
    kubelet.start()
    kubelet.wait_devices(BASE, timeout=30)
    wait_until(lambda: healthz(address)[0], 30, "/healthz 200 again", logs=[service.log_path])
    ok, _, rc = agreed(service, address, "space and kubelet back")
    assert ok and rc == 0
    service.wait_log("state file written again")
    scraped = urllib.request.urlopen(f"http://{address}/metrics", timeout=5).read().decode()
    failures = re.search(r"^colad_state_file_write_failures_total (\S+)$", scraped, re.M)
    assert failures and float(failures.group(1)) >= 1, scraped[-2000:]


def test_status_of_a_stopped_plugin_reads_the_state_file_and_says_it_is_not_live(
    service: ColadService, kubelet: FakeKubelet
) -> None:
    kubelet.wait_devices(BASE, timeout=30)
    address = metrics_address(service.run_dir)
    wait_until(lambda: healthz(address)[0], 30, "/healthz 200", logs=[service.log_path])
    service.kill("plugin", signal.SIGSTOP)
    try:
        ok, reason = healthz(address)
        assert not ok and "no answer" in reason, reason
        rc, report, table = status(service)
    finally:
        service.kill("plugin", signal.SIGCONT)
    assert rc == 1, table
    assert "NOT LIVE" in table and "the running plugin" in table and "; from the state file, not live)" in table, table
    assert any("plugin not answering" in p and "stopped" in p for p in report["problems"]), report  # type: ignore[attr-defined]
    age = report["source"]["age_s"]  # type: ignore[index]
    assert isinstance(age, float) and age >= 0, report["source"]
    ok, _, rc = agreed(service, address, "SIGCONT")
    assert ok and rc == 0


def test_status_asks_the_plugin_when_the_metrics_endpoint_is_disabled(short_tmp: Path, kubelet: FakeKubelet) -> None:
    colad = ColadService(short_tmp, extra_env={"COLAD_METRICS_ADDRESS": ""})
    colad.add(*BASE)
    colad.start()
    try:
        kubelet.wait_devices(BASE, timeout=30)
        rc, report, table = wait_until(lambda: (r := status(colad))[0] == 0 and r, 30, "status 0")
        assert report["source"]["live"] is True, report  # type: ignore[index]
        assert report["health"]["ok"] is True  # type: ignore[index]
    finally:
        assert colad.stop() == 0


def _fault_steps(rng: random.Random, length: int = 9) -> list[str]:
    """A seeded walk over the faults that applies each at least once; every fault is undone by its end."""
    undo = {
        "kubelet_away": "kubelet_back",
        "run_dir_full": "run_dir_freed",
        "discovery_stopped": "discovery_cont",
        "plugin_stopped": "plugin_cont",
        "kubelet_watch_stopped": "kubelet_watch_cont",
        "device_dir_untrusted": "device_dir_trusted",
    }
    steps: list[str] = []
    active: set[str] = set()
    while len(steps) < length or not {*undo, "discovery_killed"} <= set(steps):
        fresh = [f for f in [*undo, "discovery_killed"] if f not in steps and f not in active]
        choices = fresh or [f for f in undo if f not in active] + [undo[f] for f in sorted(active)] + [
            "discovery_killed"
        ]
        step = rng.choice(choices)
        steps.append(step)
        for fault, back in undo.items():
            if step == fault:
                active.add(fault)
            elif step == back:
                active.discard(fault)
        if rng.random() < 0.4 and active:  # undo one now and then, so faults overlap and also stand alone
            fault = rng.choice(sorted(active))
            steps.append(undo[fault])
            active.discard(fault)
    return steps + [undo[f] for f in sorted(active)]


def test_status_and_healthz_agree_across_a_sequence_of_faults(service: ColadService, kubelet: FakeKubelet) -> None:
    rng = random.Random(SEED)
    steps = _fault_steps(rng)
    print(f"seed={SEED} steps={steps}")
    kubelet.wait_devices(BASE, timeout=30)
    address = metrics_address(service.run_dir)
    wait_until(lambda: healthz(address)[0], 30, "/healthz 200", logs=[service.log_path])
    agreed(service, address, "start")
    verdicts = []
    for step in steps:
        match step:
            case "kubelet_away":
                kubelet.stop()
            case "kubelet_back":
                kubelet.start()
            case "run_dir_full":
                fill(service.run_dir)
            case "run_dir_freed":
                free(service.run_dir)
            case "device_dir_untrusted":
                service.device_dir.chmod(0o777)  # others may write: trust.py refuses the directory
            case "device_dir_trusted":
                service.device_dir.chmod(0o755)
            case "discovery_killed":
                old = service.kill("discovery")
                service.wait_running(exclude_pids={"discovery": old})
            case _:
                role = step.rsplit("_", 1)[0].replace("_", "-")
                service.kill(role, signal.SIGSTOP if step.endswith("_stopped") else signal.SIGCONT)
        verdicts.append((step, agreed(service, address, f"{step} (seed {SEED}, steps {steps})")[0]))
    # Everything undone: healthy again, and both say so.
    wait_until(lambda: healthz(address)[0], 60, f"/healthz 200 at the end {verdicts}", logs=[service.log_path])
    ok, reason, rc = agreed(service, address, "the end")
    assert ok and rc == 0, (reason, verdicts)
