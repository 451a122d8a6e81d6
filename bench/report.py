"""Renders bench results as the plain-text table `make bench` prints (docs/PERFORMANCE.md reads it).

One row per figure with colad, the single-process baseline and their ratio
(colad / baseline: below 1 means colad is faster or smaller), then memory and
idle cost per process with the threads that woke, then DRA mode beside device-plugin mode
(bench/dra.py), then the budgets. Only the sections of the phases that ran.
"""

from __future__ import annotations

from typing import Any

from bench import dra, floor, scale
from bench.budgets import HEADER, Verdict, summary_line
from bench.measure import at

Row = tuple[str, float | None, float | None]


FIGURES: tuple[tuple[str, str], ...] = (
    ("cold start -> Register answered, ms", "cold_start.registered_ms"),
    ("cold start -> full list at kubelet, ms", "cold_start.full_list_ms"),
    ("first change right after Register, ms", "cold_start.first_change_ms"),
    ("Allocate sequential p50, ms", "allocate_sequential.p50_ms"),
    ("Allocate sequential p99, ms", "allocate_sequential.p99_ms"),
    ("Allocate sequential max, ms", "allocate_sequential.max_ms"),
    ("Allocate 16 callers p50, ms", "allocate_concurrent.p50_ms"),
    ("Allocate 16 callers p99, ms", "allocate_concurrent.p99_ms"),
    ("Allocate 16 callers max, ms", "allocate_concurrent.max_ms"),
    ("Allocate 16 callers: refused, made again", "allocate_concurrent.refused"),
    ("change propagation p50, ms", "propagation.p50_ms"),
    ("change propagation p99, ms", "propagation.p99_ms"),
    ("change propagation max, ms", "propagation.max_ms"),
    ("change propagation back to back p50, ms", "propagation_back_to_back.p50_ms"),
    ("change propagation back to back p99, ms", "propagation_back_to_back.p99_ms"),
    ("change propagation back to back max, ms", "propagation_back_to_back.max_ms"),
    ("re-registration -> Register p50, ms", "reregistration.p50_ms"),
    ("re-registration -> Register p99, ms", "reregistration.p99_ms"),
    ("re-registration -> full list p50, ms", "reregistration_full_list.p50_ms"),
    ("re-registration -> full list p99, ms", "reregistration_full_list.p99_ms"),
    ("memory, 10 devices: total RSS, MiB", "memory.total.rss_mib"),
    ("memory, 10 devices: total PSS, MiB", "memory.total.pss_mib"),
    ("memory, 10 devices: alone (pages once), MiB", "memory.total.alone_mib"),
    ("10,000 devices: start -> Register, ms", "scale.10000.registered_ms"),
    ("10,000 devices: start -> full list, ms", "scale.10000.full_list_ms"),
    ("10,000 devices: ListAndWatch message, KiB", "scale.10000.message_kib"),
    ("10,000 devices: one more change p50, ms", "scale.10000.one_more_change.p50_ms"),
    ("10,000 devices: one more change max, ms", "scale.10000.one_more_change.max_ms"),
    ("10,000 devices: CPU per change, ms", "scale.10000.cpu_ms_per_change.total"),
    ("10,000 devices: total RSS, MiB", "scale.10000.memory.total.rss_mib"),
    ("10,000 devices: total PSS, MiB", "scale.10000.memory.total.pss_mib"),
    ("10,000 devices: alone (pages once), MiB", "scale.10000.memory.total.alone_mib"),
    ("10,000-file burst: files created in, ms (median)", "burst.create_ms"),
    ("10,000-file burst: settled at kubelet, ms (median)", "burst.settled_ms"),
    ("10,000-file burst: settled, fastest run, ms", "burst.settled_min_ms"),
    ("10,000-file burst: settled, slowest run, ms", "burst.settled_max_ms"),
    ("10,000-file burst: ListAndWatch messages (median)", "burst.messages"),
    ("CPU per change, all processes, ms", "cpu_ms.change.total"),
    ("CPU per Allocate, sequential, ms", "cpu_ms.allocate_sequential.total"),
    ("CPU per Allocate, 16 callers, ms", "cpu_ms.allocate_concurrent.total"),
    ("CPU per re-registration, ms", "cpu_ms.reregistration.total"),
    ("CPU per 10,000-file burst, ms (median)", "cpu_ms.burst.total"),
    ("idle: CPU seconds per minute, all processes", "idle_total.cpu_s_per_min"),
    ("idle: wake-ups per minute, all processes", "idle_total.wakeups_per_min"),
    ("idle: wake-ups per minute, busiest process", "idle_total.busiest_wakeups_per_min"),
)


def ratio(colad: float | None, baseline: float | None) -> float | None:
    if colad is None or baseline is None or baseline == 0:
        return None
    return round(colad / baseline, 2)


def rows(results: dict[str, Any]) -> list[Row]:
    return [(label, at(results["colad"], path), at(results["baseline"], path)) for label, path in FIGURES]


def burst_runs(results: dict[str, Any]) -> str:
    """Each burst's settled time, in the order run, so the spread behind the median shows."""
    parts = []
    for subject in ("colad", "baseline"):
        runs = results[subject].get("burst", {}).get("runs", [])
        parts.append(f"{subject} " + " / ".join(f"{run['settled_ms']}" for run in runs))
    return "burst runs, settled ms: " + "; ".join(parts)


def _cell(value: float | None, width: int) -> str:
    return f"{'-' if value is None else f'{value:g}':>{width}}"


def table(results: dict[str, Any]) -> str:
    lines = [f"{'figure':<52}{'colad':>11}{'baseline':>11}{'ratio':>8}"]
    for label, mine, theirs in rows(results):
        lines.append(f"{label:<52}{_cell(mine, 11)}{_cell(theirs, 11)}{_cell(ratio(mine, theirs), 8)}")
    lines.append(burst_runs(results))
    return "\n".join(lines)


def memory_table(results: dict[str, Any]) -> str:
    columns = (
        ("memory", "10 devices"),
        ("scale.10000.memory", "10,000 devices"),
        ("memory_after_burst", "after burst"),
    )
    kinds = ("rss_mib", "pss_mib", "uss_mib")
    header = f"{'memory, MiB':<26}" + "".join(f"{title:>24}" for _, title in columns)
    lines = [header, f"{'':<26}" + f"{'RSS':>8}{'PSS':>8}{'USS':>8}" * len(columns)]
    for subject in ("colad", "baseline"):
        for proc in results[subject]["memory"]:
            cells = "".join(
                _cell(at(results[subject], f"{path}.{proc}.{kind}"), 8) for path, _ in columns for kind in kinds
            )
            lines.append(f"{subject + ' ' + proc:<26}{cells}")
    lines.append('(USS: pages no other process maps; the "alone" rows above count each page of a plugin once)')
    return "\n".join(lines)


def cpu_table(results: dict[str, Any]) -> str:
    phases = ("change", "allocate_sequential", "allocate_concurrent", "reregistration", "burst")
    titles = ("change", "Allocate", "Allocate x16", "re-register", "burst")
    lines = [f"{'CPU ms per operation':<26}" + "".join(f"{t:>13}" for t in titles)]
    for subject in ("colad", "baseline"):
        for proc in results[subject]["cpu_ms"]["change"]:
            cells = "".join(_cell(at(results[subject], f"cpu_ms.{phase}.{proc}"), 13) for phase in phases)
            lines.append(f"{subject + ' ' + proc:<26}{cells}")
    return "\n".join(lines)


def idle_table(results: dict[str, Any]) -> str:
    seconds = results["meta"]["idle_window_s"]
    lines = [f"{f'idle, {seconds:g} s window':<26}  cpu s/min  wake-ups/min  of which gRPC  threads"]
    for subject in ("colad", "baseline"):
        for proc, cost in results[subject]["idle"].items():
            lines.append(
                f"{subject + ' ' + proc:<26}{cost['cpu_s_per_min']:>11g}{cost['wakeups_per_min']:>14g}"
                f"{cost['grpc_runtime_wakeups_per_min']:>14g}{cost['threads']:>9}"
            )
            for name, n in cost["waking_threads"].items():
                lines.append(f"    {n:>8g}/min  {name}")
    return "\n".join(lines)


def budgets(verdicts: list[Verdict]) -> str:
    """A Markdown table, as docs/PERFORMANCE.md shows it."""
    return "\n".join([HEADER] + [v.row() for v in verdicts] + [summary_line(verdicts)])


def render(results: dict[str, Any], verdicts: list[Verdict]) -> str:
    meta = results["meta"]
    head = (
        f"colad bench {meta['date']}, {meta['cpus']} CPUs, Linux {meta['kernel']}, bench ran {meta['runtime_s']:g} s; "
        f"machine {meta['machine_busy_pct_before']:g}% busy before, {meta['machine_busy_pct_during']:g}% during\n"
        f"both plugins on Python {meta['python']}, grpcio {meta['grpcio']}, protobuf {meta['protobuf']}, "
        f"supervisor {meta['supervisor']}; {meta['interpreter']}"
    )
    if "runtime_dirs" in meta:
        head += f"\ncolad's run dir and CDI spec dir on {meta['runtime_dirs']} (a host's /run is tmpfs)"
    colad_env = meta.get("parameters", {}).get("colad_env")
    if colad_env:
        head += "\ncolad's processes with " + " ".join(f"{k}={v}" for k, v in sorted(colad_env.items()))
    sections = [head]
    if "colad" in results:
        sections += [
            table(results),
            floor.table(results),
            scale.table(results),
            memory_table(results),
            cpu_table(results),
            idle_table(results),
        ]
    if "dra" in results:
        sections.append(dra.table(results))
    return "\n\n".join(sections + [budgets(verdicts)])
