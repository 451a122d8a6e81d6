"""Where colad's cold start goes: a timeline per run, from the colad log and the fake kubelet.

Starts `colad supervise` as bench/measure.py's cold start does (bench.subjects.Colad, its fake
kubelet) and puts every step on one clock, in ms after the spawn: supervisord up and woken, each
role spawned and its first line, discovery's first snapshot, the plugin's, Register at the kubelet,
the first full list. `--old TREE` interleaves another checkout round by round; `--baseline` adds it.
"""

from __future__ import annotations

import argparse
import re
import shutil
import statistics
import sys
import tempfile
import time
from calendar import timegm
from pathlib import Path
from typing import Any

from bench import installed
from bench.measure import cold_start
from bench.subjects import Baseline, Colad, Subject

DEVICES = 10  # device files at the start (--devices): 10,000 gives the scale table's "start -> full list"
_COLAD = re.compile(r"^ts=(\S+)Z level=\S+ proc=(\S+) msg=(\"[^\"]*\"|\S+)(.*)$")
_SUPERVISORD = re.compile(r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d),(\d{3}) \w+ (.*)$")


def wall_of(stamp: str, fmt: str, millis: str) -> float:
    return timegm(time.strptime(stamp, fmt)) + int(millis) / 1000


def timeline(text: str) -> dict[str, float]:
    """Each step's first wall time (s) in a colad log; supervisord stamps in local time, colad in UTC."""
    steps: dict[str, float] = {}
    for line in text.splitlines():
        if m := _COLAD.match(line):
            stamp, millis = m[1].split(".")
            at, role, msg = wall_of(stamp, "%Y-%m-%dT%H:%M:%S", millis), m[2], m[3].strip('"')
            steps.setdefault(f"{role}: first line", at)
            if role == "discovery" and msg == "device set changed":
                steps.setdefault("discovery: first snapshot sent", at)
            elif role == "plugin" and msg == "devices updated":
                steps.setdefault("plugin: first snapshot taken", at)
            elif role == "plugin" and msg == "serving":
                steps.setdefault("plugin: serving", at)
            elif role == "plugin" and msg == "metrics listening":
                steps.setdefault("plugin: metrics listening", at)
            elif role == "supervise" and msg == "supervisord woken":
                steps.setdefault("supervisord woken", at)
        elif m := _SUPERVISORD.match(line):
            at = time.mktime(time.strptime(m[1], "%Y-%m-%d %H:%M:%S")) + int(m[2]) / 1000
            if m[3].startswith("supervisord started"):
                steps.setdefault("supervisord started", at)
            elif spawned := re.match(r"spawned: '([^']+)'", m[3]):
                steps.setdefault(f"{spawned[1]}: spawned", at)
    return steps


def one_run(name: str, tree: str | None, devices: int = DEVICES) -> dict[str, float]:
    """One cold start of `name` ("new", "old" or "baseline") over `devices` files: its steps in ms after the spawn."""
    names = {f"dev-{i}" for i in range(devices)}
    root = Path(tempfile.mkdtemp(prefix=f"coldstart-{name}-"))
    plugin: Any = Baseline()
    if name != "baseline":  # a checkout's own `colad supervise`, on its own interpreter
        plugin = Colad(installed.tree_python(Path(tree)) if tree else sys.executable, tree=tree)
    subject = Subject(plugin, root)
    clocks: list[float] = []  # the wall and monotonic time of the spawn, after the files are made
    spawn = plugin.start

    def start(where: Path) -> None:
        clocks.extend((time.time(), time.monotonic()))
        spawn(where)

    plugin.start = start
    try:
        cold_start(subject, names, "first")
        wall0, mono0 = clocks
        reg = subject.kubelet.successful_registrations()[0]
        steps = {"Register sent": reg.at - mono0, "Register answered": reg.answered_at - mono0}
        steps["first full list"] = subject.full_list_after(0, names).at - mono0
        if name != "baseline":
            for step, at in timeline((root / "colad.log").read_text(errors="replace")).items():
                steps[step] = at - wall0
        return {step: round(at * 1000, 1) for step, at in steps.items()}
    finally:
        subject.close()
        shutil.rmtree(root, ignore_errors=True)


def report(runs: dict[str, list[dict[str, float]]]) -> None:
    for name, results in runs.items():
        steps = sorted({s for r in results for s in r}, key=lambda s: statistics.median(r.get(s, 1e9) for r in results))
        print(f"\n{name}: median of {len(results)} runs, ms after the spawn of `colad supervise` [min-max]")
        for step in steps:
            values = [r[step] for r in results if step in r]
            print(f"  {step:34s} {statistics.median(values):8.1f}  [{min(values):.1f}-{max(values):.1f}]")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--old", help="another checkout of colad, interleaved run by run")
    parser.add_argument("--baseline", action="store_true", help="also the single-process baseline plugin")
    parser.add_argument("--devices", type=int, default=DEVICES, help=f"device files at the start (default {DEVICES})")
    args = parser.parse_args(argv)
    subjects: list[tuple[str, str | None]] = [("new", None)]
    if args.old:
        subjects.append(("old", str(Path(args.old).resolve())))
    if args.baseline:
        subjects.append(("baseline", None))
    runs: dict[str, list[dict[str, float]]] = {name: [] for name, _ in subjects}
    for round_ in range(args.runs):
        for name, tree in subjects if round_ % 2 == 0 else reversed(subjects):
            runs[name].append(one_run(name, tree, args.devices))
            print(
                f"round {round_ + 1} {name}: Register answered {runs[name][-1]['Register answered']} ms",
                file=sys.stderr,
            )
    report(runs)
    return 0


if __name__ == "__main__":
    sys.exit(main())
