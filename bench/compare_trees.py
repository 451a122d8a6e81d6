"""Whole colad against another checkout of it, interleaved in one run: per change and per re-registration.

Both run under the real supervisord against their own fake kubelet (bench.subjects), measured
alternately round by round: CPU per change of every process, change latency, re-registration latency
and CPU. For "no worse than before" on a shared machine, where two `make bench` runs differ by more
than the change under test. `--old TREE` is the other checkout (e.g. a `git worktree` of an older
commit); `--colad-env NAME=VALUE` applies to this tree only (an old tree refuses variables it lacks).
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

from bench import measure
from bench.subjects import Colad, Subject, settle

NAMES = {f"cola-{i:02d}" for i in range(10)}
FIGURES = ("cpu_change", "cpu_change_plugin", "change_p50_ms", "change_p99_ms", "cpu_reregister", "reregister_p50_ms")


def _named(colad: Colad, name: str) -> Colad:
    colad.name = name  # the figures' key, and the Subject's
    return colad


def one_round(old: str, env: dict[str, str], changes: int, restarts: int) -> dict[str, dict[str, float]]:
    base = Path(tempfile.mkdtemp(prefix="colad-compare-"))
    subjects = [
        Subject(_named(Colad(tree=old), "old"), base / "old"),
        Subject(_named(Colad(extra_env=env), "new"), base / "new"),
    ]
    out: dict[str, dict[str, float]] = {s.name: {} for s in subjects}
    try:
        for s in subjects:
            measure.cold_start(s, NAMES, "first-change")
            measure.change(s, "first-change", create=False)
        settle(2.0)
        before = measure.cpu(subjects)
        latency = measure.changes(subjects, changes, "change", 0.025)
        cpu = measure.cpu_per_operation(before, measure.cpu(subjects), changes)
        for s in subjects:
            out[s.name].update(cpu_change=cpu[s.name]["total"], cpu_change_plugin=cpu[s.name]["plugin"])
            out[s.name]["change_p50_ms"] = statistics.median(latency[s.name]) * 1000
            out[s.name]["change_p99_ms"] = measure.percentile(latency[s.name], 99) * 1000
        settle(2.0)
        before = measure.cpu(subjects)
        again = measure.reregistrations(subjects, NAMES, restarts)
        cpu = measure.cpu_per_operation(before, measure.cpu(subjects), restarts)
        for s in subjects:
            out[s.name]["cpu_reregister"] = cpu[s.name]["total"]
            out[s.name]["reregister_p50_ms"] = statistics.median(again[s.name]["registered"]) * 1000
    finally:
        for s in subjects:
            s.close()
        shutil.rmtree(base, ignore_errors=True)
    return out


def report(rounds: list[dict[str, dict[str, float]]]) -> str:
    lines = [f"{len(rounds)} rounds, median [min-max]; CPU in ms per operation, all processes unless named"]
    for key in FIGURES:
        old: list[Any] = [r["old"][key] for r in rounds]
        new: list[Any] = [r["new"][key] for r in rounds]
        mo, mn = statistics.median(old), statistics.median(new)
        lines.append(
            f"{key:18s} old {mo:7.2f} [{min(old):.2f}-{max(old):.2f}]  new {mn:7.2f} [{min(new):.2f}-{max(new):.2f}]"
            f"  new/old {mn / mo:.2f}"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--old", required=True, help="the other checkout")
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--changes", type=int, default=200)
    parser.add_argument("--restarts", type=int, default=20)
    parser.add_argument("--colad-env", action="append", default=[], metavar="NAME=VALUE")
    args = parser.parse_args(argv)
    env = dict(item.split("=", 1) for item in args.colad_env)
    rounds = [one_round(str(Path(args.old).resolve()), env, args.changes, args.restarts) for _ in range(args.rounds)]
    print(report(rounds))
    return 0


if __name__ == "__main__":
    sys.exit(main())
