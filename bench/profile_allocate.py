"""The plugin process' CPU per change and per Allocate in whole colad, this checkout against another, one run.

Both trees run under the real supervisord with their own fake kubelet (bench.subjects), round by
round in alternating order: plugin and supervisord CPU per one-device change, per sequential
Allocate and per Allocate from 16 callers, and the Allocate p50/p99. `--devices N` holds N device
files; `--profile` records the new tree's plugin with py-spy (GIL holders only) and prints its top frames.
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

from bench import ab, measure
from bench.subjects import Colad, Subject, settle

PHASES = ("change", "allocate", "allocate16")
PY_SPY = Path(sys.executable).parent / "py-spy"
REPO = Path(__file__).resolve().parent.parent


def _spy(pid: int, raw: str | None) -> subprocess.Popen[bytes] | None:
    if raw is None or not PY_SPY.exists():
        return None
    args = [str(PY_SPY), "record", "--pid", str(pid), "--format", "raw", "-o", raw, "--rate", "500", "--gil"]
    spy = subprocess.Popen([*args, "--nonblocking"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    settle(1.0)  # attached
    return spy


def one_round(
    trees: dict[str, str], devices: int, count: int, spy_dir: str | None, env: dict[str, str] | None = None
) -> dict[str, dict[str, float]]:
    base = Path(tempfile.mkdtemp(prefix="colad-pa-"))
    names = {f"cola-{i:05d}" for i in range(devices)}
    subjects = []
    for name, tree in trees.items():
        # This tree's own code, not whatever the installed colad is; --colad-env for this tree only.
        colad = Colad(tree=tree or str(REPO), extra_env=env if name == "new" else None)
        colad.name = name
        subjects.append(Subject(colad, base / name))
    out: dict[str, dict[str, float]] = {s.name: {} for s in subjects}
    try:
        for s in subjects:
            measure.cold_start(s, names, "first-change")
        wanted = sorted(names)[:8]
        for phase in PHASES:
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
                seconds = measure.allocate_concurrent(subjects, wanted, count, 16)
            cpu = measure.cpu_per_operation(before, measure.cpu(subjects), count)
            for spy in spies.values():
                if spy is not None:
                    spy.send_signal(signal.SIGINT)
                    spy.wait(30)
            for s in subjects:
                out[s.name][f"{phase}_plugin_ms"] = cpu[s.name]["plugin"]
                out[s.name][f"{phase}_supervisord_ms"] = cpu[s.name]["supervisord"]
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
    args = parser.parse_args(argv)
    trees = {"new": ""} | ({"old": str(Path(args.old).resolve())} if args.old else {})
    spy_dir = tempfile.mkdtemp(prefix="pa-spy-") if args.profile else None
    rounds = []
    for r in range(args.rounds):
        order = dict(reversed(trees.items())) if r % 2 else trees
        spy = spy_dir if r == args.rounds - 1 else None
        rounds.append(one_round(order, args.devices, args.count, spy, dict(e.split("=", 1) for e in args.colad_env)))
        print(f"round {r + 1}: {rounds[-1]}", file=sys.stderr, flush=True)
    print(f"{args.devices} devices, {args.count} operations per phase; {args.rounds} rounds, median [min..max]")
    for key in rounds[0]["new"]:
        row, medians = [], {}
        for name in trees:
            values = [r[name][key] for r in rounds]
            medians[name] = statistics.median(values)
            row.append(f"{name} {medians[name]:8.3f} [{min(values):.3f}..{max(values):.3f}]")
        if "old" in medians and medians["old"]:
            row.append(f"new/old {medians['new'] / medians['old']:.2f}")
        print(f"  {key:24} " + "   ".join(row))
    if spy_dir:
        for raw in sorted(Path(spy_dir).glob("pa-*.txt")):
            print(f"\n== py-spy {raw.stem}: inclusive samples per frame, GIL held ({raw})")
            for n, frame in ab.top_frames(str(raw), 40):
                print(f"  {n:6d} {frame}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
