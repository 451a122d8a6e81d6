"""The plugin process' CPU per change and per Allocate in whole colad, this checkout against another, one run.

Both trees run under the real supervisord with their own fake kubelet (bench.subjects), round by
round in alternating order: plugin and supervisord CPU per one-device change, per sequential
Allocate and per Allocate from 16 callers, and the Allocate p50/p99. `--baseline` adds
bench/baseline_plugin.py to the rounds; `--devices N` holds N device files; `--profile` records each
plugin with py-spy (GIL holders only) and prints its top frames.
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from bench import installed, measure
from bench.phases import top_frames
from bench.subjects import Baseline, Colad, PluginUnderTest, Subject, settle

PHASES = ("change", "allocate", "allocate16")
PY_SPY = Path(sys.executable).parent / "py-spy"
REPO = Path(__file__).resolve().parent.parent


def _spy(pid: int, raw: str | None) -> subprocess.Popen[bytes] | None:
    if raw is None or not PY_SPY.exists():
        return None
    if os.environ.get("PROFILE_ALLOCATE_PERF") and shutil.which("perf"):  # native: which library spends the CPU
        args = ["perf", "record", "-F", "2000", "-o", raw.replace(".txt", ".perf"), "-p", str(pid)]
    else:
        args = [str(PY_SPY), "record", "--pid", str(pid), "--format", "raw", "-o", raw, "--rate", "500", "--gil"]
        args.append("--nonblocking")
    spy = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    settle(1.0)  # attached
    return spy


def one_round(
    trees: dict[str, str],
    devices: int,
    count: int,
    spy_dir: str | None,
    env: dict[str, str] | None = None,
    phases: tuple[str, ...] = PHASES,
) -> dict[str, dict[str, float]]:
    base = Path(tempfile.mkdtemp(prefix="colad-pa-"))
    names = {f"cola-{i:05d}" for i in range(devices)}
    subjects = []
    for name, tree in trees.items():
        plugin: PluginUnderTest
        if name == "baseline":
            plugin = Baseline()
        else:
            # The tree's own code on its own interpreter, not whatever the installed colad is; --colad-env
            # for this tree only.
            path = Path(tree) if tree else REPO
            plugin = Colad(installed.tree_python(path), env if name == "new" else None, tree=str(path), name=name)
        subjects.append(Subject(plugin, base / name))
    out: dict[str, dict[str, float]] = {s.name: {} for s in subjects}
    try:
        for s in subjects:
            measure.cold_start(s, names, "first-change")
        wanted = sorted(names)[:8]
        for phase in phases:
            settle(1.5)
            spies = {
                s.name: _spy(s.plugin.pids()["plugin"], os.path.join(spy_dir, f"pa-{s.name}-{phase}.txt"))
                for s in subjects
                if spy_dir
            }
            before = measure.cpu(subjects)
            if phase == "change":
                measure.changes(subjects, count, "change", 0.025)
            elif phase == "allocate":
                seconds = measure.allocate_sequential(subjects, wanted, count)
            else:
                seconds = {
                    n: answered for n, (answered, _) in measure.allocate_concurrent(subjects, wanted, count, 16).items()
                }
            cpu = measure.cpu_per_operation(before, measure.cpu(subjects), count)
            for spy in spies.values():
                if spy is not None:
                    spy.send_signal(signal.SIGINT)
                    spy.wait(30)
            for s in subjects:
                out[s.name][f"{phase}_plugin_ms"] = cpu[s.name]["plugin"]
                out[s.name][f"{phase}_supervisord_ms"] = cpu[s.name].get("supervisord", 0.0)
                out[s.name][f"{phase}_total_ms"] = cpu[s.name]["total"]
                if phase != "change":
                    out[s.name][f"{phase}_p50_ms"] = measure.percentile(seconds[s.name], 50) * 1000
                    out[s.name][f"{phase}_p99_ms"] = measure.percentile(seconds[s.name], 99) * 1000
            for s in subjects:
                out[s.name]["pss_mib"] = measure.memory(s)["plugin"]["pss_mib"]
    finally:
        for s in subjects:
            s.close()
        shutil.rmtree(base, ignore_errors=True)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--old", help="the other checkout (e.g. a git worktree of an older commit)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--devices", type=int, default=10)
    parser.add_argument("--count", type=int, default=400, help="changes and Allocate calls per phase")
    parser.add_argument("--profile", action="store_true", help="py-spy on each tree's plugin, top frames per phase")
    parser.add_argument("--colad-env", action="append", default=[], metavar="NAME=VALUE", help="this tree only")
    parser.add_argument("--baseline", action="store_true", help="bench/baseline_plugin.py in every round too")
    parser.add_argument("--phases", default=",".join(PHASES), help=f"comma-separated, of {','.join(PHASES)}")
    args = parser.parse_args(argv)
    trees = {"new": ""} | ({"old": str(Path(args.old).resolve())} if args.old else {})
    trees |= {"baseline": ""} if args.baseline else {}
    phases = tuple(p for p in args.phases.split(",") if p in PHASES)
    spy_dir = tempfile.mkdtemp(prefix="pa-spy-") if args.profile else None
    rounds = []
    for r in range(args.rounds):
        order = dict(reversed(trees.items())) if r % 2 else trees
        spy = spy_dir if r == args.rounds - 1 else None
        env = dict(e.split("=", 1) for e in args.colad_env)
        rounds.append(one_round(order, args.devices, args.count, spy, env, phases))
        print(f"round {r + 1}: {rounds[-1]}", file=sys.stderr, flush=True)
    print(f"{args.devices} devices, {args.count} operations per phase; {args.rounds} rounds, median [min..max]")
    for key in rounds[0]["new"]:
        row, medians = [], {}
        for name in trees:
            values = [r[name][key] for r in rounds]
            medians[name] = statistics.median(values)
            row.append(f"{name} {medians[name]:8.3f} [{min(values):.3f}..{max(values):.3f}]")
        for other in ("old", "baseline"):
            if medians.get(other):
                row.append(f"new/{other} {medians['new'] / medians[other]:.2f}")
        print(f"  {key:24} " + "   ".join(row))
    if spy_dir:
        for data in sorted(Path(spy_dir).glob("pa-*.perf")):
            print(f"\n== perf {data.stem}: CPU per library (perf report -i {data} --sort dso)")
        for raw in sorted(Path(spy_dir).glob("pa-*.txt")):
            print(f"\n== py-spy {raw.stem}: inclusive samples per frame, GIL held ({raw})")
            for n, frame in top_frames(str(raw), 40):
                print(f"  {n:6d} {frame}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
