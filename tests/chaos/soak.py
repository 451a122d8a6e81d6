"""`make soak`: the fuzzers, then colad under fault injection for a long while; prints a summary.

    python -m tests.chaos.soak --minutes 10 [--seed N] [--fuzz-seconds 60]

Faults are those of tests/chaos/driver.py at soak scale: 10,000-file bursts
(which overflow the inotify queue), hostile input (bad-name storms, oversized
and slow device files, aliased directories via reload), and once per run a
kubelet that stays away for two minutes. Ends with `faults=N recovered=N
lost_devices=0 unasked_exits=0 tracebacks=0` and the fuzzers' results; exits
non-zero if any fault did not recover, the guard saw a role exit the soak did
not cause or a traceback, or a fuzzer crashed.
"""

from __future__ import annotations

import argparse
import random
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from tests.chaos.driver import Chaos
from tests.fuzz.targets import TARGETS


def soak(minutes: float, seed: int, long_away: float) -> Chaos:
    root = Path(tempfile.mkdtemp(prefix="colad-soak-", dir="/tmp"))
    root.chmod(0o755)
    chaos = Chaos(root, seed, burst=10_000, away_max=5.0, deadline=120.0)
    chaos.start()
    try:
        until = time.monotonic() + minutes * 60
        for fault in sorted(chaos.faults):  # every kind at least once
            chaos.inject(fault)
        if long_away:  # the kubelet away for minutes, once
            chaos.away_max, saved = long_away, chaos.away_max
            chaos.pause = lambda low, high: time.sleep(high)  # type: ignore[method-assign]
            chaos.inject("kubelet_away")
            del chaos.pause
            chaos.away_max = saved
        chaos.run(until=until)
    finally:
        chaos.stop()
        shutil.rmtree(root, ignore_errors=True)
    return chaos


def fuzz(seconds: int) -> dict[str, int]:
    results = {}
    for name in TARGETS:
        run = subprocess.run(
            [sys.executable, "-m", "tests.fuzz.run_atheris", name, f"-max_total_time={seconds}"],
            capture_output=True,
            text=True,
        )
        done = [line for line in run.stderr.splitlines() if "DONE" in line or line.startswith("Done ")]
        if run.returncode and not done:  # say why (no atheris: `make soak` installs it)
            done = run.stderr.strip().splitlines()[-1:]
        if run.returncode:  # the whole report, for the crash's input and stack
            report = Path(tempfile.gettempdir()) / f"colad-fuzz-{name}.log"
            report.write_text(run.stderr)
            done.append(f"report: {report}")
        print(f"fuzz target={name} rc={run.returncode} {' | '.join(done[-2:])}")
        results[name] = run.returncode
    return results


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--minutes", type=float, default=10.0)
    parser.add_argument("--seed", type=int, default=random.SystemRandom().randrange(2**32))
    parser.add_argument("--long-away", type=float, default=120.0, help="seconds the kubelet stays away once")
    parser.add_argument("--fuzz-seconds", type=int, default=60)
    args = parser.parse_args()
    print(f"soak: {args.minutes} minutes, seed {args.seed}", flush=True)
    # The fuzzers first: a child's peak RSS starts at this process's size (fork copies it, exec keeps the
    # peak), and after the faults this process has read logs of hundreds of MB, past libFuzzer's 2 GB.
    fuzzed = fuzz(args.fuzz_seconds) if args.fuzz_seconds else {}
    chaos = soak(args.minutes, args.seed, args.long_away)
    print(chaos.summary())
    for record in chaos.records:
        if record.recovery_s is None:
            print(f"LOST {record.fault}: {record.detail}")
        for problem in record.guard:
            print(f"GUARD after {record.fault}: {problem}")
    for problem in chaos.shutdown_guard:
        print(f"GUARD at shutdown: {problem}")
    for violation in chaos.kubelet.violations:
        print(f"KUBELET VIOLATION: {violation}")
    crashed = [name for name, rc in fuzzed.items() if rc != 0]
    print(f"fuzz: {len(fuzzed) - len(crashed)} targets clean, {len(crashed)} crashed {crashed or ''}".rstrip())
    return 0 if chaos.clean() and not crashed else 1


if __name__ == "__main__":
    raise SystemExit(main())
