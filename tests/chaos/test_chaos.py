"""A short fault-injection run in `make test`; `make soak` runs the long one (tests/chaos/soak.py)."""

from __future__ import annotations

import os
import random
import subprocess
import sys
from pathlib import Path

import pytest

from tests.chaos.driver import Chaos
from tests.fakes.kubelet import FakeKubelet
from tests.service import ColadService

pytestmark = [pytest.mark.chaos, pytest.mark.skipif(os.geteuid() != 0, reason="mounts and setuid need root")]


def test_every_fault_once_then_random_faults(short_tmp: Path) -> None:
    seed = int(os.environ.get("CHAOS_SEED", random.SystemRandom().randrange(2**32)))
    print(f"CHAOS_SEED={seed}")
    chaos = Chaos(short_tmp, seed)
    chaos.start()
    try:
        for fault in sorted(chaos.faults):  # each kind at least once
            chaos.inject(fault)
        chaos.run(count=int(os.environ.get("CHAOS_FAULTS", "15")))
    finally:
        chaos.stop()
        print(chaos.summary())
    lost = [r for r in chaos.records if r.recovery_s is None]
    assert not lost, f"seed {seed}: " + "\n\n".join(f"{r.fault}: {r.detail}" for r in lost)
    guarded = [f"after {r.fault}: {p}" for r in chaos.records for p in r.guard]
    assert not guarded, f"seed {seed}: the guard:\n" + "\n".join(guarded)
    assert chaos.kubelet.violations == []
    assert "intruder" not in chaos.colad.log() or "queue peer refused" in chaos.colad.log()


def test_read_only_run_dir_at_start_fails_clearly_and_recovers(short_tmp: Path) -> None:
    kubelet = FakeKubelet(short_tmp / "kubelet")
    kubelet.start()
    service = ColadService(short_tmp)
    service.add("cocacola")
    service.run_dir.mkdir(mode=0o700)
    subprocess.run(["mount", "-t", "tmpfs", "-o", "ro,size=1m,mode=0700", "ro-run", str(service.run_dir)], check=True)
    try:
        refused = subprocess.run(
            [sys.executable, "-m", "colad", "supervise"], env=service.env, capture_output=True, text=True, timeout=30
        )
        assert refused.returncode == 1
        assert len(refused.stderr.splitlines()) == 1 and "Read-only file system" in refused.stderr
        assert "Traceback" not in refused.stderr
    finally:
        subprocess.run(["umount", str(service.run_dir)], check=True)
    try:
        service.start()
        kubelet.wait_registered()
        kubelet.wait_devices({"cocacola"})
    finally:
        service.stop()
        kubelet.stop()
