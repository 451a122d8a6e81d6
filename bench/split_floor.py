"""What the design card's split alone costs: the baseline, the baseline in three processes, and colad, in one run.

bench/baseline_split.py is the baseline plugin with its two watches moved into processes of their own
and a Unix-socket queue between them, nothing else. Against the baseline it measures the floor under
colad's CPU-per-change, propagation and cold-start ratios that no code of colad's can go below while
the roles are separate processes; colad, measured alongside, shows what is left above that floor.
Rounds interleave the three; each figure is the median over rounds, with min and max. Run from the
checkout: python -m bench.split_floor [--rounds N] [--changes N]
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import sys
import tempfile
from pathlib import Path

from bench import installed, measure
from bench.subjects import Baseline, Colad, PluginUnderTest, Split, Subject, settle

NAMES = {f"cola-{i:02d}" for i in range(10)}
FIGURES = (
    ("registered_ms", "cold start -> Register answered, ms"),
    ("cpu_change", "CPU per change, all processes, ms"),
    ("change_p50_ms", "change propagation p50, ms"),
    ("change_p99_ms", "change propagation p99, ms"),
    ("pss_mib", "total PSS, 10 devices, MiB"),
)


def start_all(subjects: list[Subject]) -> dict[str, float]:
    """Cold-start each over NAMES, one at a time (no other shares the CPUs), and let all settle; ms to Register."""
    registered = {}
    for s in subjects:
        registered[s.name] = measure.cold_start(s, NAMES, "first-change")["registered_ms"]
        measure.change(s, "first-change", create=False)
        settle(1.0)
    settle(2.0)
    return registered


def one_round(plugins: list[PluginUnderTest], changes: int) -> dict[str, dict[str, float]]:
    base = Path(tempfile.mkdtemp(prefix="colad-split-"))
    subjects = [Subject(p, base / p.name) for p in plugins]
    out: dict[str, dict[str, float]] = {s.name: {} for s in subjects}
    try:
        for name, registered in start_all(subjects).items():
            out[name]["registered_ms"] = registered
        before = measure.cpu(subjects)
        latency = measure.changes(subjects, changes, "change", 0.025)
        cpu = measure.cpu_per_operation(before, measure.cpu(subjects), changes)
        for s in subjects:
            out[s.name]["cpu_change"] = cpu[s.name]["total"]
            out[s.name].update({f"cpu_change_{p}": v for p, v in cpu[s.name].items() if p != "total"})
            out[s.name]["change_p50_ms"] = statistics.median(latency[s.name]) * 1000
            out[s.name]["change_p99_ms"] = measure.percentile(latency[s.name], 99) * 1000
            memory = measure.memory(s)
            out[s.name].update({f"pss_mib_{p}": m["pss_mib"] for p, m in memory.items() if p != "total"})
            out[s.name]["pss_mib"] = memory["total"]["pss_mib"]
    finally:
        for s in subjects:
            s.close()
        shutil.rmtree(base, ignore_errors=True)
    return out


def report(rounds: list[dict[str, dict[str, float]]], names: list[str]) -> str:
    lines = [f"{len(rounds)} rounds, median [min-max]; ratios to the baseline's median in the same run"]
    lines.append(f"{'':40s}" + "".join(f"{n:>24s}" for n in names))
    for key, label in FIGURES:
        cells, medians = [], {}
        for n in names:
            values = [r[n][key] for r in rounds]
            medians[n] = statistics.median(values)
            cells.append(f"{medians[n]:8.2f} [{min(values):.2f}-{max(values):.2f}]")
        ratios = "  ".join(f"{n} {medians[n] / medians['baseline']:.2f}x" for n in names if n != "baseline")
        lines.append(f"{label:40s}" + "".join(f"{c:>24s}" for c in cells) + f"   {ratios}")
    for prefix, label in (("cpu_change_", "CPU per change, ms"), ("pss_mib_", "PSS, MiB")):
        lines.append(f"{label} by process (median over rounds):")
        for n in names:
            procs = sorted(k for k in rounds[0][n] if k.startswith(prefix))
            cells = [f"{k.removeprefix(prefix)} {statistics.median(r[n][k] for r in rounds):.2f}" for k in procs]
            lines.append(f"  {n:10s} " + ", ".join(cells))
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--changes", type=int, default=300)
    parser.add_argument("--no-colad", action="store_true", help="the baseline and the split only")
    parser.add_argument(
        "--card", action="store_true", help="also the split loading what the card and the house style make colad load"
    )
    args = parser.parse_args(argv)
    rounds = []
    venv = Path(tempfile.mkdtemp(prefix="colad-split-venv-"))
    python, how = installed.prepare(sys.executable, venv)  # as make bench runs them
    print(f"subjects run on {sys.executable}, {how}", file=sys.stderr)
    for r in range(args.rounds):
        plugins: list[PluginUnderTest] = [Baseline(python), Split(python)]
        if args.card:
            plugins.append(Split(python, card=True))
        if not args.no_colad:
            plugins.append(Colad(python))
        if r % 2:
            plugins.reverse()
        rounds.append(one_round(plugins, args.changes))
        print(f"round {r + 1}: {rounds[-1]}", file=sys.stderr, flush=True)
    shutil.rmtree(venv, ignore_errors=True)
    names = ["baseline", "split"] + (["split+card"] if args.card else []) + ([] if args.no_colad else ["colad"])
    print(report(rounds, names))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
