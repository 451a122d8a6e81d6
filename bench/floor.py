"""What any plugin started by supervisord pays before it can register, measured in the same run.

Two parts of the design card that no code of colad's can make cheaper:
- supervisord alone, on a minimal config (a Unix socket, its XML-RPC interface, no program), from
  its spawn to its pid file: colad's roles cannot be spawned sooner;
- an interpreter that imports grpc and exits: a role serving the device plugin API cannot
  answer sooner after its spawn.
Their sum is a floor under colad's cold start that has no `colad supervise` step, no contention
for the CPUs and no code of colad's own. It is printed beside the baseline's cold start, so the
cold-start budget can be read against it in every run.
And the split alone: the baseline cut into colad's three processes (bench/baseline_split.py), one
round beside the baseline (bench/split_floor.py): its cold start, CPU per change, propagation and
PSS against the baseline's, which is what the card's separate processes cost before colad's own
work and supervisord. In the same round the split that also loads what the card and the house style
make each role load (dataclasses everywhere, prometheus_client in the plugin after Register): its
PSS with supervisord's is the floor under the 10-device PSS budget. No budget uses any of it.
"""

from __future__ import annotations

import statistics
import subprocess
import time
from pathlib import Path
from typing import Any

from bench import procstat, split_floor
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
        # The card's supervisord comes on top: its start before the roles' (in series), its PSS beside them.
        # colad's own supervisord, measured in this run, where there is one (a bare one, just started,
        # shares its pages with fewer processes and reads higher).
        started = both["registered_ms"] + figures["supervisord_ms"]
        label = "  + supervisord's start: cold start, ms"
        lines.append(f"  {label:<50}{started:>11.2f}{started / alone['registered_ms']:>22.2f}")
        colad_supervisord = results.get("colad", {}).get("memory", {}).get("supervisord", {}).get("pss_mib")
        whose = "colad's" if colad_supervisord else "a bare"
        total = both["pss_mib"] + (colad_supervisord or figures["supervisord_pss_mib"])
        label = f"  + {whose} supervisord: PSS, MiB"
        lines.append(f"  {label:<50}{total:>11.1f}{total / alone['pss_mib']:>22.2f}")
        if card := split.get("split+card"):  # what the card and the house style load in each role, unused
            total = card["pss_mib"] + (colad_supervisord or figures["supervisord_pss_mib"])
            label = "  + dataclasses, prometheus_client: PSS, MiB"
            lines.append(f"  {label:<50}{total:>11.1f}{total / alone['pss_mib']:>22.2f}")
    return "\n".join(lines)
