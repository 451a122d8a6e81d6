"""Probe and prepare programs that someone untrusted could have written are never run as root.

Real files and modes: a script in a directory others can write (a non-sticky 0777, where the
script could be swapped), a script others can write, a script owned by uid 65534; each run
would leave a marker. ProbeRunner gives the device a failing verdict that says why, and
prestart.run a failed Result; trusted_owners makes the same program run.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from colad.core.trust import ROOT_ONLY, UNTRUSTED, trusted_uids
from colad.jobs import prestart
from colad.jobs.probes import Probe, ProbeResult, ProbeRunner
from tests.helpers import wait_until

pytestmark = pytest.mark.integration

pytestmark = [pytest.mark.integration, pytest.mark.skipif(os.geteuid() != 0, reason="chown needs root")]
NOBODY = 65534


def script(directory: Path, marker: Path) -> Path:
    directory.mkdir(exist_ok=True)
    path = directory / "run.sh"
    path.write_text(f"#!/bin/sh\ntouch {marker}\n")
    path.chmod(0o755)
    return path


def open_dir(root: Path) -> tuple[Path, str]:
    path = script(root / "open", root / "ran")
    (root / "open").chmod(0o777)
    return path, f"{UNTRUSTED}directory {root / 'open'} is writable by group and others (mode 0777)"


def open_file(root: Path) -> tuple[Path, str]:
    path = script(root / "bin", root / "ran")
    path.chmod(0o757)
    return path, f"{UNTRUSTED}{path} is writable by others (mode 0757)"


def nobody_file(root: Path) -> tuple[Path, str]:
    path = script(root / "bin", root / "ran")
    os.chown(path, NOBODY, -1)
    return path, f"{UNTRUSTED}{path} is owned by uid 65534, which is neither root nor in trusted_owners"


CASES = [open_dir, open_file, nobody_file]


@pytest.fixture
def runner() -> Iterator[ProbeRunner]:
    made = ProbeRunner(trusted=ROOT_ONLY)
    yield made
    made.close()


def verdict(runner: ProbeRunner, key: str) -> ProbeResult | None:
    runner.poll()
    found = runner.verdict(key)
    return found if found is not None and found.reason != "probe has not completed yet" else None


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.__name__)
def test_an_untrusted_probe_program_never_runs(short_tmp: Path, runner: ProbeRunner, case) -> None:  # type: ignore[no-untyped-def]
    path, why = case(short_tmp)
    good = script(short_tmp / "good", short_tmp / "good-ran")
    runner.set_probes({"r=bad": Probe((str(path),), interval=0.1), "r=good": Probe((str(good),), interval=0.1)})
    assert wait_until(lambda: verdict(runner, "r=bad"), 10, "the verdict") == ProbeResult(False, f"not run: {why}")
    wait_until(lambda: verdict(runner, "r=good") == ProbeResult(True), 10, "the trusted probe to pass")
    wait_until(lambda: runner.poll() is not None and runner.refused >= 3, 10, "the probe refused at each interval")
    assert not (short_tmp / "ran").exists()
    assert runner.started >= 1  # the trusted one, only


def test_trusted_owners_let_a_delegated_probe_program_run(short_tmp: Path) -> None:
    path, _ = nobody_file(short_tmp)
    runner = ProbeRunner(trusted=trusted_uids([NOBODY]))
    try:
        runner.set_probes({"r=d": Probe((str(path),), interval=60)})
        wait_until(lambda: verdict(runner, "r=d") == ProbeResult(True), 10, "the delegated probe to pass")
    finally:
        runner.close()
    assert (short_tmp / "ran").exists() and runner.refused == 0


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.__name__)
def test_an_untrusted_prepare_program_never_runs(short_tmp: Path, case) -> None:  # type: ignore[no-untyped-def]
    path, why = case(short_tmp)
    step = prestart.Step((str(path), "cola1"), ("cola1",), ())
    assert prestart.run(step, 5.0) == prestart.Result(False, f"not run: {why}", refused=True)
    assert not (short_tmp / "ran").exists()
    os.chown(path, NOBODY, -1)
    if case is not open_dir:  # owned by a trusted uid now, mode fixed: it runs
        path.chmod(0o755)
        assert prestart.run(step, 5.0, trusted_uids([NOBODY])) == prestart.Result(True)
        assert (short_tmp / "ran").exists()
