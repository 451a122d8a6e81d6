"""Where colad's cold start goes: a timeline per run, from the colad log and the fake kubelet.

Starts `colad supervise` as bench/measure.py's cold start does (bench.subjects.Colad, its fake
kubelet) and puts every step on one clock, in ms after the spawn: supervisord up and woken, each
role spawned and its first line, discovery's first snapshot, the plugin's, Register at the kubelet,
the first full list; and the CPU each process has spent when Register is answered (its threads'
on-CPU time from /proc/<pid>/task/*/schedstat, in ns: the 10 ms ticks of /proc/<pid>/stat are too
coarse), which says who shares the CPUs on the way to Register. `--old TREE` interleaves another
checkout round by round; `--baseline` adds it.
"""

from __future__ import annotations

import argparse
import contextlib
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
from tests.fakes.kubelet import Registration

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


def on_cpu_ms(pid: int) -> float:
    """The on-CPU time so far of every thread of `pid`, in ms (0 once it has gone)."""
    total = 0
    try:
        for task in Path(f"/proc/{pid}/task").iterdir():
            with contextlib.suppress(OSError):
                total += int((task / "schedstat").read_text().split()[0])
    except OSError:
        return 0.0
    return total / 1e6


def tree_cpu(root: int) -> dict[str, float]:
    """`cpu <name>` -> on-CPU ms of `root` ("supervisord", or the baseline's "plugin") and each process
    under it, named by its colad role (the last word of its command line)."""
    parents: dict[int, int] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            with contextlib.suppress(OSError, ValueError):
                text = (entry / "stat").read_text()
                parents[int(entry.name)] = int(text[text.rindex(")") + 2 :].split()[1])
    found = {root: "supervisord"}
    for pid in sorted(parents):  # children come after their parents, but for pid wrap-around
        if parents[pid] in found:
            with contextlib.suppress(OSError):
                words = (Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0") or [b""])[:-1]
                found[pid] = words[-1].decode(errors="replace") if words else str(pid)
    return {f"cpu {name}": on_cpu_ms(pid) for pid, name in found.items()}


def one_run(name: str, tree: str | None, python: str, devices: int = DEVICES) -> dict[str, float]:
    """One cold start of `name` ("new", "old" or "baseline") on `python` over `devices` files: its steps
    in ms after the spawn."""
    names = {f"dev-{i}" for i in range(devices)}
    root = Path(tempfile.mkdtemp(prefix=f"coldstart-{name}-"))
    plugin: Any = Baseline(python)
    if name != "baseline":  # a checkout's own `colad supervise`, on its own interpreter
        plugin = Colad(python, tree=tree)
    subject = Subject(plugin, root)
    clocks: list[float] = []  # the wall and monotonic time of the spawn, after the files are made
    spawn = plugin.start

    def start(where: Path) -> None:
        clocks.extend((time.time(), time.monotonic()))
        spawn(where)

    plugin.start = start
    cpu: dict[str, float] = {}
    registered = subject.registered

    def registered_then_cpu(count: int = 1, timeout: float = 30.0) -> Registration:
        found = registered(count, timeout)
        service = getattr(plugin, "service", None)
        root = service.proc.pid if service is not None and service.proc is not None else plugin.proc.pid
        cpu.update(tree_cpu(root))
        if name == "baseline":
            cpu["cpu plugin"] = cpu.pop("cpu supervisord")
        return found

    subject.registered = registered_then_cpu  # type: ignore[method-assign]
    try:
        cold_start(subject, names, "first")
        wall0, mono0 = clocks
        reg = subject.kubelet.successful_registrations()[0]
        steps = {"Register sent": reg.at - mono0, "Register answered": reg.answered_at - mono0}
        steps["first full list"] = subject.full_list_after(0, names).at - mono0
        if name != "baseline":
            for step, at in timeline((root / "colad.log").read_text(errors="replace")).items():
                steps[step] = at - wall0
        figures = {step: round(at * 1000, 1) for step, at in steps.items()}
        figures.update({key: round(ms, 1) for key, ms in cpu.items()})
        figures["cpu, all processes"] = round(sum(cpu.values()), 1)
        return figures
    finally:
        subject.close()
        shutil.rmtree(root, ignore_errors=True)


def report(runs: dict[str, list[dict[str, float]]]) -> None:
    for name, results in runs.items():
        keys = {s for r in results for s in r}
        steps = sorted(
            (k for k in keys if not k.startswith("cpu")),
            key=lambda s: statistics.median(r.get(s, 1e9) for r in results),
        )
        steps += sorted(k for k in keys if k.startswith("cpu"))
        print(f"\n{name}: median of {len(results)} runs, ms after the spawn of `colad supervise` [min-max];")
        print("  cpu: on-CPU ms of each process when Register is answered")
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
    venvs = Path(tempfile.mkdtemp(prefix="coldstart-venv-"))
    try:
        pythons: dict[str, str] = {}
        for name, tree in subjects:  # as make bench runs them: byte-compiled, without the editable hook
            path = Path(tree) if tree else installed.REPO
            asked = installed.tree_python(path) if tree else sys.executable
            pythons[name], how = installed.prepare(asked, venvs / name, path)
            print(f"{name}: {path} on {asked}, {how}", file=sys.stderr, flush=True)
        for round_ in range(args.runs):
            for name, tree in subjects if round_ % 2 == 0 else reversed(subjects):
                runs[name].append(one_run(name, tree, pythons[name], args.devices))
                print(
                    f"round {round_ + 1} {name}: Register answered {runs[name][-1]['Register answered']} ms",
                    file=sys.stderr,
                )
    finally:
        shutil.rmtree(venvs, ignore_errors=True)
    report(runs)
    return 0


if __name__ == "__main__":
    sys.exit(main())
