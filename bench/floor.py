"""What any plugin started by supervisord pays before it can register, measured in the same run.

Two parts of the design card that no code of colad's can make cheaper:
- supervisord alone, on a minimal config (a Unix socket, its XML-RPC interface, no program), from
  its spawn to its pid file: colad's roles cannot be spawned sooner;
- an interpreter that imports grpc and exits: a role serving the device plugin API cannot
  answer sooner after its spawn.
Their sum is a floor under colad's cold start that has no `colad supervise` step, no contention
for the CPUs and no code of colad's own, printed beside the baseline's cold start.
And the split alone: the baseline cut into colad's three processes (bench/baseline_split.py), one
round beside the baseline (bench/split_floor.py): its cold start, CPU per change, propagation and
PSS against the baseline's, which is what the card's separate processes cost before colad's own
work and supervisord; in the same round the split that also loads what the card and the house style
make each role load (dataclasses everywhere, prometheus_client in the plugin after Register). At
scale.BUDGET_COUNT devices both splits start once more (bench/scale.py). `yardsticks` adds these
up into the floors the budgets read (bench/budgets.py), each part named.
"""

from __future__ import annotations

import statistics
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench import procstat, split_floor
from bench.measure import at
from bench.scale import BUDGET_COUNT
from bench.subjects import Baseline, Split
from colad.supervise.main import user_name
from tests.helpers import wait_until

RUNS = 5
SPLIT_CHANGES = 200
CONFIG = """[supervisord]
nodaemon=true
{user}pidfile={dir}/supervisord.pid
logfile={dir}/supervisord.log
[unix_http_server]
file={dir}/supervisor.sock
[rpcinterface:supervisor]
supervisor.rpcinterface_factory = supervisor.rpcinterface:make_main_rpcinterface
"""


def _pid_written(path: Path, pid: int) -> bool:
    try:
        return path.read_text().strip() == str(pid)
    except OSError:
        return False


def supervisord_start(python: str, base: Path) -> tuple[float, float]:
    """Milliseconds from spawning supervisord (minimal config) to its pid file, and then its PSS in MiB."""
    base.mkdir(parents=True, exist_ok=True)
    user = user_name()  # as colad's template: supervisord refuses a user= that names no passwd entry
    (base / "supervisord.conf").write_text(CONFIG.format(dir=base, user=f"user={user}\n" if user else ""))
    pidfile = base / "supervisord.pid"
    pidfile.unlink(missing_ok=True)
    command = [python, "-m", "supervisor.supervisord", "-c", str(base / "supervisord.conf")]
    started = time.monotonic()
    proc = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_until(lambda: _pid_written(pidfile, proc.pid), 20, "supervisord's pid file", interval=0.001)
        return (time.monotonic() - started) * 1000, procstat.memory(proc.pid)["pss_mib"]
    finally:
        proc.terminate()
        proc.wait(20)


def grpc_import(python: str) -> float:
    """Milliseconds for an interpreter to start, import grpc and exit."""
    started = time.monotonic()
    subprocess.run([python, "-c", "import grpc"], check=True)
    return (time.monotonic() - started) * 1000


def measure(python: str, base: Path, runs: int = RUNS, changes: int = SPLIT_CHANGES) -> dict[str, Any]:
    """Median of `runs` of each, alternated; their sum; and one round of the split beside the baseline."""
    starts, pss, imports = [], [], []
    for i in range(runs):
        started, memory = supervisord_start(python, base / f"floor-{i}")
        starts.append(started)
        pss.append(memory)
        imports.append(grpc_import(python))
    start, imported = statistics.median(starts), statistics.median(imports)
    split = split_floor.one_round([Baseline(python), Split(python), Split(python, card=True)], changes)
    return {
        "supervisord_ms": round(start, 1),
        "supervisord_pss_mib": round(statistics.median(pss), 1),
        "grpc_import_ms": round(imported, 1),
        "sum_ms": round(start + imported, 1),
        "split": split,
    }


@dataclass(frozen=True)
class Yardstick:
    """A floor a budget reads: figures measured in this run, each named, and their sum."""

    parts: tuple[tuple[str, float], ...]
    unit: str

    @property
    def value(self) -> float:
        return round(sum(v for _, v in self.parts), 2)

    def text(self) -> str:
        named = " + ".join(f"{label} {v:g}" for label, v in self.parts)
        return f"{named}{self.unit}" if len(self.parts) == 1 else f"{named} = {self.value:g}{self.unit}"


# The floors, by the name bench/budgets.py reads them under.
COLD_START = "cold start"
FULL_LIST_AT_SCALE = "start -> full list at scale"
CPU_PER_CHANGE = "CPU per change"
CPU_PER_CHANGE_RELAYED = "CPU per change, supervisord's relay counted"
PSS = "PSS"
PSS_AT_SCALE = "PSS at scale"


def yardsticks(results: dict[str, Any]) -> dict[str, Yardstick | None]:
    """Each floor from its parts; None where a part was not measured in this run.

    supervisord's start comes in series before the roles'; its PSS and its CPU beside theirs, as
    colad's own supervisord measured them in this run (a bare one, just started, shares its pages
    with fewer processes). Its CPU per change is the relay of colad's log line per change.
    """
    n = str(BUDGET_COUNT)
    parts = {
        COLD_START: (("the split", "floor.split.split.registered_ms"), ("supervisord's start", "floor.supervisord_ms")),
        FULL_LIST_AT_SCALE: (
            (f"the split at {BUDGET_COUNT:,}", f"floor.scale.{n}.split.full_list_ms"),
            ("supervisord's start", "floor.supervisord_ms"),
        ),
        CPU_PER_CHANGE: (("the split", "floor.split.split.cpu_change"),),
        CPU_PER_CHANGE_RELAYED: (
            ("the split", "floor.split.split.cpu_change"),
            ("supervisord's relay", "colad.cpu_ms.change.supervisord"),
        ),
        PSS: (
            ("the split with the card's imports", "floor.split.split+card.pss_mib"),
            ("colad's supervisord", "colad.memory.supervisord.pss_mib"),
        ),
        PSS_AT_SCALE: (
            (
                f"the split with the card's imports at {BUDGET_COUNT:,}",
                f"floor.scale.{n}.split+card.memory.total.pss_mib",
            ),
            (f"colad's supervisord at {BUDGET_COUNT:,}", f"colad.scale.{n}.memory.supervisord.pss_mib"),
        ),
    }
    units = {CPU_PER_CHANGE: " ms", CPU_PER_CHANGE_RELAYED: " ms", PSS: " MiB", PSS_AT_SCALE: " MiB"}
    found: dict[str, Yardstick | None] = {}
    for name, named in parts.items():
        values = [(label, at(results, path)) for label, path in named]
        measured = [(label, round(v, 2)) for label, v in values if v is not None]
        found[name] = Yardstick(tuple(measured), units.get(name, " ms")) if len(measured) == len(values) else None
    return found


def table(results: dict[str, Any]) -> str:
    figures = results.get("floor")
    baseline = results["baseline"].get("cold_start", {}).get("registered_ms")
    if not figures or not baseline:
        return "floor: not measured"
    rows = [
        ("supervisord alone, spawn -> pid file, ms", figures["supervisord_ms"], ""),
        ("interpreter + import grpc, to exit, ms", figures["grpc_import_ms"], ""),
        ("sum, before any code of colad's, ms", figures["sum_ms"], f"{figures['sum_ms'] / baseline:.2f}"),
    ]
    lines = [f"{f'floor under a supervised plugin (median of {RUNS})':<52}{'':>11}{'x baseline cold start':>22}"]
    lines += [f"  {label:<50}{value:>11}{ratio:>22}" for label, value, ratio in rows]
    split = figures.get("split")
    if split:
        title = "the baseline in three processes, no supervisord (one round)"
        lines.append(f"{title:<63}{'x baseline, same round':>22}")
        both, alone = split["split"], split["baseline"]
        for key, label in split_floor.FIGURES:
            lines.append(f"  {label:<50}{both[key]:>11.2f}{both[key] / alone[key]:>22.2f}")
    lines.append("floors the budgets read")
    for name, yardstick in yardsticks(results).items():
        lines.append(f"  {name}: {yardstick.text() if yardstick else 'not measured'}")
    return "\n".join(lines)
