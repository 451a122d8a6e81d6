"""`make bench`: colad against a single-process plugin, through the same harness, in the same run.

Starts the real `colad supervise` (supervisord + three processes + the local
queue) and bench/baseline_plugin.py, each against its own fake kubelet from
tests/fakes, and measures both: cold start, Allocate latency, change
propagation (each change after a quiet gap, and back to back), re-registration,
memory, three bursts, idle cost, the floor (bench/floor.py) and the scale table
(bench/scale.py); then colad in DRA mode beside colad in device-plugin mode
(bench/dra.py); all run as installed (bench/installed.py). --phases picks them.
Prints a table with colad / baseline ratios and a PASS/FAIL line per budget
(bench/budgets.py); exits 0 whatever the verdicts. --json PATH also writes the
results. Progress goes to stderr. See docs/PERFORMANCE.md.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench import budgets, dra, floor, installed, measure, procstat, report, scale, subjects
from bench.subjects import REPO, Baseline, Colad, Subject, settle

ROLES = {
    "discovery": "colad.discovery.main",
    "kubelet-watch": "colad.kubelet_watch.main",
    "plugin": "colad.plugin.main",
}
HEAVY = ("grpc", "prometheus_client", "google.protobuf")
# --phases: the device plugin's (the main phase, the floor, the scale table, the imports) and the DRA mode's.
DEVICE_PLUGIN, DRA = "device-plugin", "dra"
PHASES = (DEVICE_PLUGIN, DRA)


def progress(text: str) -> None:
    print(f"bench: {text}", file=sys.stderr, flush=True)


def role_imports(python: str) -> dict[str, list[str]]:
    """Which heavy packages each role imports on its way to main(), as `colad <role>` does."""
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    found = {}
    for role, module in ROLES.items():
        code = f"import sys, colad.cli.main, colad.cli.args, {module}; print(' '.join(sys.modules))"
        loaded = subprocess.run([python, "-c", code], capture_output=True, text=True, check=True, cwd=REPO, env=env)
        found[role] = sorted(h for h in HEAVY if h in loaded.stdout.split())
    return found


class CpuMeter:
    """CPU per operation of every process of every subject, phase by phase, into results[subject]["cpu_ms"]."""

    def __init__(self, subjects: list[Subject], results: dict[str, Any]) -> None:
        self.subjects, self.results = subjects, results

    def measure(self, phase: str, operations: int, run: Callable[[], None]) -> None:
        before = measure.cpu(self.subjects)
        run()
        spent = measure.cpu_per_operation(before, measure.cpu(self.subjects), operations)
        for name, figures in spent.items():
            self.results[name].setdefault("cpu_ms", {})[phase] = figures


def phase_small(base: Path, args: argparse.Namespace, results: dict[str, Any]) -> None:
    """Both plugins at `args.devices` devices, measured alternately; then a burst each."""
    subjects = [
        Subject(Colad(args.python, args.colad_env), base / "colad"),
        Subject(Baseline(args.python), base / "baseline"),
    ]
    names = {f"cola-{i:02d}" for i in range(args.devices)}
    meter = CpuMeter(subjects, results)
    try:
        for s in subjects:
            progress(f"{s.name}: cold start")
            results[s.name]["cold_start"] = measure.cold_start(s, names, "first-change")
        progress(f"change propagation: {args.changes} changes each")
        # The first change is the one made right after Register (cold start); the second removes it.
        series = {s.name: [results[s.name]["cold_start"]["first_change_ms"] / 1000] for s in subjects}

        def propagate() -> None:
            for s in subjects:
                measure.quiet(subjects, args.gap)
                series[s.name].append(measure.change(s, "first-change", create=False))
            for name, values in measure.changes(subjects, args.changes - 2, "change", args.gap).items():
                series[name] += values

        meter.measure("change", args.changes - 1, propagate)
        for s in subjects:
            results[s.name]["propagation"] = measure.summary(series[s.name])
        progress(f"change propagation back to back: {args.back_to_back} changes each")
        for name, values in measure.back_to_back(subjects, args.back_to_back, "b2b").items():
            results[name]["propagation_back_to_back"] = measure.summary(values)
        progress(f"Allocate: {args.allocations} sequential calls each")
        devices = sorted(names)

        def sequential() -> None:
            for name, values in measure.allocate_sequential(subjects, devices, args.allocations).items():
                results[name]["allocate_sequential"] = measure.summary(values)

        meter.measure("allocate_sequential", args.allocations, sequential)
        progress(f"Allocate: {args.allocations} calls each from {args.callers} callers")

        def concurrent() -> None:
            calls = measure.allocate_concurrent(subjects, devices, args.allocations, args.callers)
            for name, (values, refused) in calls.items():
                results[name]["allocate_concurrent"] = {**measure.summary(values), "refused": refused}

        meter.measure("allocate_concurrent", args.allocations, concurrent)
        progress(f"re-registration: {args.restarts} kubelet restarts each")

        def restarts() -> None:
            for name, figures in measure.reregistrations(subjects, names, args.restarts).items():
                results[name]["reregistration"] = measure.summary(figures["registered"])
                results[name]["reregistration_full_list"] = measure.summary(figures["full_list"])
                results[name]["kubelet_start"] = measure.summary(figures["kubelet_start"])

        meter.measure("reregistration", args.restarts, restarts)
        for s in subjects:
            results[s.name]["memory"] = measure.memory(s)
        settle(3.0)  # let the last restart's stragglers (stats reports, stream checks) pass
        progress(f"idle: {args.idle:g} s, both plugins at once")
        for name, costs in measure.idle(subjects, args.idle).items():
            results[name]["idle"] = costs
        runs: dict[str, list[dict[str, Any]]] = {s.name: [] for s in subjects}
        for r in range(args.bursts):
            for s in subjects if r % 2 == 0 else reversed(subjects):
                progress(f"{s.name}: {args.burst}-file burst {r + 1} of {args.bursts}")
                before = measure.cpu([s])
                figures = measure.burst(s, args.burst, "burst")
                figures["cpu_ms"] = measure.cpu_per_operation(before, measure.cpu([s]), 1)[s.name]
                runs[s.name].append(figures)
                settle(2.0)
                if r < args.bursts - 1:
                    measure.unburst(s, args.burst, "burst")
                    settle(1.0)
                else:  # the last burst stays: memory with its files listed
                    results[s.name]["memory_after_burst"] = measure.memory(s)
        for s in subjects:
            results[s.name]["burst"] = burst_summary(runs[s.name])
            per_run = [run["cpu_ms"] for run in runs[s.name]]
            results[s.name].setdefault("cpu_ms", {})["burst"] = {
                proc: statistics.median(cpu[proc] for cpu in per_run) for proc in per_run[0]
            }
    finally:
        for s in subjects:
            s.close()


def burst_summary(runs: list[dict[str, float]]) -> dict[str, Any]:
    """Median of the runs, with the spread (min, max) of the settled time; each run kept."""
    settled = [run["settled_ms"] for run in runs if run["settled_ms"] is not None]
    if len(settled) < len(runs):  # a run that never settled is the slowest: no median hides it
        return {"runs": runs, "files": runs[0]["files"], "create_ms": statistics.median(r["create_ms"] for r in runs)}
    return {
        "runs": runs,
        "files": runs[0]["files"],
        "create_ms": statistics.median(run["create_ms"] for run in runs),
        "settled_ms": statistics.median(settled),
        "settled_min_ms": min(settled),
        "settled_max_ms": max(settled),
        "messages": statistics.median(run["messages"] for run in runs),
    }


def idle_totals(figures: dict[str, Any]) -> dict[str, float]:
    costs = figures["idle"].values()
    return {
        "cpu_s_per_min": round(sum(c["cpu_s_per_min"] for c in costs), 3),
        "wakeups_per_min": round(sum(c["wakeups_per_min"] for c in costs), 1),
        "busiest_wakeups_per_min": max(c["wakeups_per_min"] for c in costs),
    }


def quiet_check() -> float:
    """How busy the machine is before the bench starts (%, all CPUs, over one second)."""
    before = procstat.machine_busy()
    time.sleep(1.0)
    busy = procstat.busy_percent(before, procstat.machine_busy())
    if busy > 10:
        progress(f"warning: the machine is {busy:g}% busy before the bench starts; absolute figures will suffer")
    return busy


def measure_all(args: argparse.Namespace) -> dict[str, Any]:
    busy_before = quiet_check()
    started, machine = time.monotonic(), procstat.machine_busy()
    results: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="colad-bench-", dir="/tmp") as tmp:
        base = Path(tmp)
        base.chmod(0o755)
        asked = args.python
        args.python, how = installed.prepare(asked, base)
        progress(f"subjects run on {asked}, {how}")
        if DEVICE_PLUGIN in args.phases:
            device_plugin(base, args, results)
        if DRA in args.phases:
            progress(f"DRA phase: colad in DRA mode beside colad in device-plugin mode, {args.devices} devices")
            dra.phase(base, args, results, progress)
        versions = runtime(args.python, shown=asked)
        args.python = asked
    results["meta"] = {
        "date": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "cpus": os.cpu_count(),
        "kernel": platform.release(),
        **versions,
        "interpreter": how,
        "runtime_dirs": "tmpfs" if subjects._fstype(Path(subjects.RUNTIME_TMPFS)) == "tmpfs" else "the temporary dir",
        "machine_busy_pct_before": busy_before,
        "machine_busy_pct_during": procstat.busy_percent(machine, procstat.machine_busy()),
        "idle_window_s": args.idle,
        "parameters": {k: v for k, v in vars(args).items() if k != "json"},
        "runtime_s": round(time.monotonic() - started, 1),
    }
    return results


def device_plugin(base: Path, args: argparse.Namespace, results: dict[str, Any]) -> None:
    """colad against the baseline, the floor, the scale table and the roles' imports."""
    results.update({"colad": {}, "baseline": {}})
    phase_small(base, args, results)
    progress(
        f"floor: supervisord alone and an interpreter importing grpc, {floor.RUNS} runs each;"
        f" the split beside the baseline, {floor.SPLIT_CHANGES} changes"
    )
    results["floor"] = floor.measure(args.python, base / "floor")
    scale.phase(base, args, results, progress)
    results["imports"] = role_imports(args.python)
    for name in ("colad", "baseline"):
        results[name]["idle_total"] = idle_totals(results[name])


def runtime(python: str, shown: str) -> dict[str, str]:
    """Versions of what both plugins run on: the interpreter, grpcio, protobuf, supervisor."""
    code = (
        "import platform, grpc, google.protobuf as p, importlib.metadata as m; "
        "print(platform.python_version(), grpc.__version__, p.__version__, m.version('supervisor'))"
    )
    out = subprocess.run([python, "-c", code], capture_output=True, text=True, check=True).stdout.split()
    if shown.startswith(os.getcwd() + os.sep):
        shown = os.path.relpath(shown)  # no machine paths
    return {"python": f"{out[0]} ({shown})", "grpcio": out[1], "protobuf": out[2], "supervisor": out[3]}


def parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--devices", type=int, default=10, help="devices in the main phase (default 10)")
    parser.add_argument("--changes", type=int, default=200, help="device changes per plugin (default 200)")
    parser.add_argument(
        "--gap", type=float, default=0.025, help="pause before each device change, seconds (default 0.025)"
    )
    parser.add_argument(
        "--back-to-back",
        type=int,
        default=100,
        help="device changes per plugin, each as soon as the kubelet has the one before (default 100)",
    )
    parser.add_argument("--allocations", type=int, default=2000, help="Allocate calls per plugin and mode")
    parser.add_argument("--callers", type=int, default=16, help="concurrent Allocate callers (default 16)")
    parser.add_argument("--restarts", type=int, default=20, help="kubelet restarts per plugin (default 20)")
    parser.add_argument("--idle", type=float, default=30.0, help="idle window in seconds (default 30)")
    parser.add_argument(
        "--scale",
        default="1000,10000,50000,max",
        help="device counts of the scale table; max: the most that fit the kubelet's 4 MiB (default %(default)s)",
    )
    parser.add_argument("--burst", type=int, default=10_000, help="files in the burst (default 10,000)")
    parser.add_argument("--bursts", type=int, default=3, help="bursts per plugin; the median is shown (default 3)")
    parser.add_argument(
        "--more", type=int, default=20, help="single changes once settled at scale, up to 10,000 devices (default 20)"
    )
    parser.add_argument(
        "--phases",
        default=",".join(PHASES),
        help="which phases run, comma-separated: device-plugin (colad against the baseline, the floor, the scale"
        " table), dra (colad in DRA mode beside colad in device-plugin mode) (default %(default)s)",
    )
    parser.add_argument(
        "--prepares",
        type=int,
        default=200,
        help="DRA phase: claims prepared and unprepared per mode, one at a time and again from --callers"
        " callers; as many Allocate calls beside them (default 200)",
    )
    parser.add_argument(
        "--dra-starts", type=int, default=3, help="DRA phase: starts of each mode at --devices devices (default 3)"
    )
    parser.add_argument(
        "--dra-scale",
        type=int,
        default=scale.BUDGET_COUNT,
        help="DRA phase: devices of the start at scale, each mode alone; 0 skips it (default %(default)s)",
    )
    parser.add_argument(
        "--python",
        default=sys.executable,
        help="interpreter both plugins run on (default: this one); /usr/bin/python3 runs them on Debian's packages",
    )
    parser.add_argument(
        "--colad-env",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="an environment variable for colad's processes, e.g. COLAD_CDI=off (no CDI spec)",
    )
    parser.add_argument("--json", type=Path, help="also write the results here")
    args = parser.parse_args(argv)
    bad = [item for item in args.colad_env if "=" not in item or not item.split("=", 1)[0]]
    if bad:
        parser.error(f"--colad-env takes NAME=VALUE, not {bad[0]!r}")
    args.colad_env = dict(item.split("=", 1) for item in args.colad_env)
    args.phases = [p.strip() for p in args.phases.split(",") if p.strip()]
    unknown = sorted(set(args.phases) - set(PHASES))
    if unknown or not args.phases:
        parser.error(f"--phases takes one or more of {', '.join(PHASES)}, comma-separated")
    if args.dra_starts < 1 or args.prepares < 4:
        parser.error("--dra-starts takes at least 1, --prepares at least 4 (the calls at once run in 4 rounds)")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    results = measure_all(args)
    verdicts = budgets.check(results)
    results["budgets"] = [v.as_dict() for v in verdicts]
    print(report.render(results, verdicts))
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(results, indent=2) + "\n")
        progress(f"results written to {args.json}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
