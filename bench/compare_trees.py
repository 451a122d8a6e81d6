"""This checkout against another, interleaved in one run: cold start, CPU per change, PSS per role.

Each checkout runs as its own processes: its `python -m colad supervise` (from the checkout, on its
own interpreter: `TREE/.venv/bin/python` where `make setup` made one, byte-compiled and without the
editable install's import hook, as `make bench` runs colad), under the real supervisord, against its
own fake kubelet (bench.subjects). Nothing of the other checkout is imported here, so its module
layout does not matter. Each round starts both, one at a time, in alternating order (old first in
odd rounds, new first in even ones), then measures them alternately change by change: cold start to
Register answered, CPU per change of every process, change latency, PSS of every process once the
changes are done, then re-registration latency and CPU. For "no worse than before" on a shared
machine, where two `make bench` runs differ by more than the change under test. `--colad-env
NAME=VALUE` applies to this checkout only (an older one may refuse variables it lacks).
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import sys
import tempfile
from pathlib import Path

from bench import installed, measure
from bench.subjects import REPO, Colad, Subject, settle

NAMES = {f"cola-{i:02d}" for i in range(10)}
ROLES = ("discovery", "kubelet-watch", "plugin", "supervisord")


def one_round(
    order: list[str], pythons: dict[str, str], trees: dict[str, Path], env: dict[str, str], changes: int, restarts: int
) -> dict[str, dict[str, float]]:
    base = Path(tempfile.mkdtemp(prefix="colad-compare-"))
    subjects = [
        Subject(Colad(pythons[n], env if n == "new" else None, tree=str(trees[n]), name=n), base / n) for n in order
    ]
    out: dict[str, dict[str, float]] = {s.name: {} for s in subjects}
    try:
        for s in subjects:  # one at a time: the other is idle, not starting too
            out[s.name]["registered_ms"] = measure.cold_start(s, NAMES, "first-change")["registered_ms"]
            measure.change(s, "first-change", create=False)
            settle(2.0)
        before = measure.cpu(subjects)
        latency = measure.changes(subjects, changes, "change", 0.025)
        cpu = measure.cpu_per_operation(before, measure.cpu(subjects), changes)
        for s in subjects:
            out[s.name]["cpu_change"] = cpu[s.name]["total"]
            out[s.name].update({f"cpu_change_{p}": cpu[s.name][p] for p in ROLES})
            out[s.name]["change_p50_ms"] = statistics.median(latency[s.name]) * 1000
            out[s.name]["change_p99_ms"] = measure.percentile(latency[s.name], 99) * 1000
        settle(2.0)
        for s in subjects:
            memory = measure.memory(s)
            out[s.name]["pss_mib"] = memory["total"]["pss_mib"]
            out[s.name].update({f"pss_mib_{p}": memory[p]["pss_mib"] for p in ROLES})
        if restarts:
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
    lines = [
        f"{len(rounds)} rounds, median [min-max]; CPU in ms per operation (all processes unless named), PSS in MiB"
    ]
    for key in rounds[0]["new"]:
        old, new = [r["old"][key] for r in rounds], [r["new"][key] for r in rounds]
        mo, mn = statistics.median(old), statistics.median(new)
        ratio = f"{mn / mo:.2f}" if mo else "-"
        lines.append(
            f"{key:24s} old {mo:8.2f} [{min(old):.2f}-{max(old):.2f}]  new {mn:8.2f} [{min(new):.2f}-{max(new):.2f}]"
            f"  new/old {ratio}"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--old", required=True, type=Path, help="the other checkout (e.g. a git worktree)")
    parser.add_argument("--old-python", help="its interpreter (default: its .venv's, else this one)")
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--changes", type=int, default=200)
    parser.add_argument("--restarts", type=int, default=20, help="kubelet restarts per round; 0: none")
    parser.add_argument("--colad-env", action="append", default=[], metavar="NAME=VALUE", help="this checkout only")
    args = parser.parse_args(argv)
    env = dict(item.split("=", 1) for item in args.colad_env)
    trees = {"old": args.old.resolve(), "new": REPO}
    asked = {"old": args.old_python or installed.tree_python(trees["old"]), "new": sys.executable}
    venvs = Path(tempfile.mkdtemp(prefix="colad-compare-venv-"))
    try:
        pythons: dict[str, str] = {}
        for name, tree in trees.items():
            pythons[name], how = installed.prepare(asked[name], venvs / name, tree)
            print(f"{name}: {tree} on {asked[name]}, {how}", file=sys.stderr, flush=True)
        rounds: list[dict[str, dict[str, float]]] = []
        for r in range(args.rounds):
            order = ["old", "new"] if r % 2 == 0 else ["new", "old"]
            rounds.append(one_round(order, pythons, trees, env, args.changes, args.restarts))
            print(f"round {r + 1} ({', '.join(order)}): {rounds[-1]}", file=sys.stderr, flush=True)
    finally:
        shutil.rmtree(venvs, ignore_errors=True)
    print(report(rounds))
    return 0


if __name__ == "__main__":
    sys.exit(main())
