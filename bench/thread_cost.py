"""CPU per change by thread: which thread of which process spends what, for the split and colad in one run.

bench/split_floor.py gives CPU per change by process; this splits it by thread, read from
/proc/<pid>/task/<tid>/stat before and after the same interleaved changes (measure.changes), with the
Python thread's name and its innermost frame from `py-spy dump` after the window. Threads under
0.005 ms per change are left out. Run from the checkout:
python -m bench.thread_cost [--changes N] [--subjects split,colad,baseline]
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

from bench import installed, measure, procstat, split_floor
from bench.subjects import Baseline, Colad, PluginUnderTest, Split, Subject

SUBJECTS: dict[str, Callable[[str], PluginUnderTest]] = {"baseline": Baseline, "split": Split, "colad": Colad}
SHOWN_MS = 0.005  # threads below this per change are left out of the report


def thread_cpu(pid: int) -> dict[int, tuple[str, float]]:
    """Thread id -> (comm, CPU seconds so far) for every thread of `pid`."""
    found: dict[int, tuple[str, float]] = {}
    for tid, thread in procstat.threads(pid).items():
        try:
            found[tid] = (thread.comm, procstat.cpu_seconds(pid, tid))
        except OSError:
            continue  # the thread ended while we looked
    return found


def report(subject: Subject, before: dict[str, dict[int, tuple[str, float]]], changes: int) -> list[str]:
    lines, total = [], 0.0
    for role, pid in subject.plugin.pids().items():
        names = procstat.python_threads(pid)
        rows = []
        for tid, (comm, seconds) in thread_cpu(pid).items():
            spent = (seconds - before[role].get(tid, (comm, 0.0))[1]) / changes * 1000
            rows.append((spent, comm, names.get(tid, "")))
        role_ms = sum(r[0] for r in rows)
        total += role_ms
        lines.append(f"  {role}: {role_ms:.3f} ms per change")
        lines += [
            f"     {ms:.3f}  {comm:16s} {name[:90]}" for ms, comm, name in sorted(rows, reverse=True) if ms >= SHOWN_MS
        ]
    lines.append(f"  all processes: {total:.3f} ms per change")
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--changes", type=int, default=1000, help="changes per subject (CPU is read in 10 ms ticks)")
    parser.add_argument("--subjects", default="split,colad", help=f"comma-separated, of {','.join(SUBJECTS)}")
    args = parser.parse_args(argv)
    venv = Path(tempfile.mkdtemp(prefix="colad-threads-venv-"))
    base = Path(tempfile.mkdtemp(prefix="colad-threads-"))
    subjects: list[Subject] = []
    try:
        python, how = installed.prepare(sys.executable, venv)  # as make bench runs them
        print(f"subjects run on {sys.executable}, {how}", file=sys.stderr)
        plugins: list[PluginUnderTest] = [SUBJECTS[name](python) for name in args.subjects.split(",")]
        subjects = [Subject(p, base / p.name) for p in plugins]
        split_floor.start_all(subjects)
        before = {s.name: {role: thread_cpu(pid) for role, pid in s.plugin.pids().items()} for s in subjects}
        latency = measure.changes(subjects, args.changes, "change", 0.025)
        for s in subjects:
            p50 = statistics.median(latency[s.name]) * 1000
            p99 = measure.percentile(latency[s.name], 99) * 1000
            print(f"{s.name}: {args.changes} changes, propagation p50 {p50:.2f} ms, p99 {p99:.2f} ms")
            print("\n".join(report(s, before[s.name], args.changes)))
    finally:
        for s in subjects:
            s.close()
        shutil.rmtree(base, ignore_errors=True)
        shutil.rmtree(venv, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
