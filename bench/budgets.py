"""colad's performance budgets, each against its yardstick: the single-process baseline of the same run,
the design card's floor measured in the same run (bench/floor.py), or an absolute size.

What a user feels (Allocate, a change reaching the kubelet, re-registration, a change and a burst at
scale) is held to the baseline; what the card itself costs (cold start, the start at scale, CPU per
change, PSS) to the floor. DRA mode is held to colad's own device-plugin mode of the same phase
(bench/dra.py). Reads the results dict bench/run.py builds and returns one Verdict per budget.
Nothing here fails a build: `make bench` is a report, `make test` asserts no timing.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from bench import dra, floor
from bench.floor import Yardstick
from bench.measure import at
from bench.scale import BUDGET_COUNT
from colad.core.constants import KUBELET_MAX_RECV_MESSAGE_BYTES

IDLE_WAKEUPS_PER_MIN = 60.0  # "no thread of colad's own wakes more than once a second"
# supervisord's main loop polls with a 1 s timeout: 60 a minute is its floor, whatever colad does.
SUPERVISORD_LOOP_PER_MIN = 60.0
SINGLE = "single process"
ABSOLUTE = "absolute"


def _number(value: float) -> str:
    if isinstance(value, int):
        return f"{value:,}"
    return f"{value:g}"


@dataclass(frozen=True)
class Verdict:
    """One budget: `value` against `limit`, both in `unit`; `above`: both are sizes above the yardstick."""

    budget: str
    yardstick: str
    value: float
    limit: float
    unit: str
    now: str = ""  # the figures behind `value`, as "colad / yardstick"
    note: str = ""
    above: bool = False
    base: str = "floor"  # what an `above` size is above

    @property
    def passed(self) -> bool:
        return self.value <= self.limit

    def limit_text(self) -> str:
        limit = _number(self.limit) + self.unit
        return f"<= {self.base} + {limit}" if self.above else f"<= {limit}"

    def value_text(self) -> str:
        if math.isinf(self.value):
            return f"not measured ({self.now})"
        value = _number(self.value) + self.unit
        text = f"{self.base} + {value}" if self.above else value
        text = f"{self.now} = {text}" if self.now else text
        return f"{text}; {self.note}" if self.note else text

    def row(self) -> str:
        verdict = "PASS" if self.passed else "FAIL"
        return f"| {self.budget} | {self.yardstick} | {self.limit_text()} | {self.value_text()} | {verdict} |"

    def as_dict(self) -> dict[str, Any]:
        return {**self.__dict__, "passed": self.passed}


def _ratio(
    budget: str, colad: dict[str, Any], baseline: dict[str, Any], path: str, limit: float, note: str = ""
) -> Verdict:
    """colad / baseline of the figure at `path` (dotted), both from this run; a figure not measured fails."""
    mine, theirs = at(colad, path), at(baseline, path)
    if mine is None or not theirs:
        return Verdict(budget, SINGLE, math.inf, limit, "x", f"colad {mine}, baseline {theirs}")
    return Verdict(budget, SINGLE, round(mine / theirs, 2), limit, "x", f"{mine:g} / {theirs:g} ms", note)


def _refused(colad: dict[str, Any]) -> str:
    refused = at(colad, "allocate_concurrent.refused")
    return f"{refused:g} calls refused for want of a worker and made again" if refused else ""


def _to_floor(
    budget: str, mine: float | None, stick: Yardstick | None, limit: float, *, note: str = "", base: str = "floor"
) -> Verdict:
    """colad over the floor (or another yardstick, `base`) measured in this run: their ratio."""
    if mine is None or stick is None or not stick.value:
        return Verdict(budget, f"the {base}", math.inf, limit, "x", f"colad {mine}, {base} {stick}")
    now = f"{mine:g} / {stick.value:g}{stick.unit}"
    return Verdict(budget, stick.text(), round(mine / stick.value, 2), limit, "x", now, note)


def _above_floor(
    budget: str, mine: float | None, stick: Yardstick | None, limit: float, *, base: str = "floor"
) -> Verdict:
    """colad above the floor (or another yardstick, `base`) measured in this run, in its unit."""
    if mine is None or stick is None:
        return Verdict(
            budget, f"the {base}", math.inf, limit, " MiB", f"colad {mine}, {base} {stick}", above=True, base=base
        )
    now = f"{mine:g} / {stick.value:g}{stick.unit}"
    return Verdict(budget, stick.text(), round(mine - stick.value, 1), limit, stick.unit, now, above=True, base=base)


def _absolute(budget: str, value: float | None, limit: float, unit: str) -> Verdict:
    if value is None:
        return Verdict(budget, ABSOLUTE, math.inf, limit, unit, "no figure")
    return Verdict(budget, ABSOLUTE, value, limit, unit)


def _cpu_per_change(colad: dict[str, Any], sticks: dict[str, Yardstick | None]) -> Verdict:
    """Against the split; the floor with supervisord's relay of the per-change log line is printed beside."""
    mine, relayed = at(colad, "cpu_ms.change.total"), sticks[floor.CPU_PER_CHANGE_RELAYED]
    note = ""
    if mine is not None and relayed is not None and relayed.value:
        note = f"with supervisord's relay in the floor ({relayed.text()}): {mine / relayed.value:.2f}x"
    return _to_floor("CPU per change, all processes", mine, sticks[floor.CPU_PER_CHANGE], 2.0, note=note)


def _bursts(colad: dict[str, Any], baseline: dict[str, Any]) -> Verdict:
    """The burst must settle no later than the baseline's in every run: the worst run's ratio."""
    pairs = list(zip(colad["burst"]["runs"], baseline["burst"]["runs"], strict=False))
    ratios = [
        round(c["settled_ms"] / b["settled_ms"], 2) if c["settled_ms"] and b["settled_ms"] else math.inf
        for c, b in pairs
    ]
    now = "worst of " + ", ".join(f"{c['settled_ms']} / {b['settled_ms']} ms" for c, b in pairs)
    return Verdict("10,000-file burst settled, every run", SINGLE, max(ratios), 1.0, "x", now)


def _largest(results: dict[str, Any]) -> list[Verdict]:
    """At the largest count of the scale table: the message fits the kubelet, and every device is listed."""
    count = max(results.get("scale_counts", [0]))
    got = results["colad"].get("scale", {}).get(str(count))
    if not got:
        return []
    return [
        Verdict(
            f"ListAndWatch message at {count:,} devices",
            "the kubelet's receive limit",
            got["message_bytes"],
            KUBELET_MAX_RECV_MESSAGE_BYTES,
            " B",
        ),
        Verdict(f"devices missing from the list at {count:,} devices", ABSOLUTE, count - got["listed"], 0, ""),
    ]


def _idle(colad: dict[str, Any], baseline: dict[str, Any]) -> list[Verdict]:
    """Idle wake-ups, split by whose code wakes: colad's own threads, the gRPC runtime, supervisord's loop.

    The gRPC runtime's timers (the server's 200 ms poll, its event engine) wake the single-process
    baseline as often: they are compared with it. supervisord is held to its once-a-second loop.
    """
    roles = {name: cost for name, cost in colad["idle"].items() if name != "supervisord"}
    busiest = max(roles, key=lambda name: roles[name]["own_wakeups_per_min"])
    mine = roles.get("plugin", {}).get("grpc_runtime_wakeups_per_min")
    theirs = baseline["idle"].get("plugin", {}).get("grpc_runtime_wakeups_per_min")
    measured = mine is not None and theirs
    ratio, now = (round(mine / theirs, 2), f"{mine:g} / {theirs:g} per min") if measured else (math.inf, "no figure")
    supervisord = colad["idle"].get("supervisord", {}).get("wakeups_per_min")
    return [
        Verdict(
            f"idle wake-ups of colad's own threads, busiest role ({busiest})",
            ABSOLUTE,
            roles[busiest]["own_wakeups_per_min"],
            IDLE_WAKEUPS_PER_MIN,
            "/min",
        ),
        Verdict("idle wake-ups of the gRPC runtime in the plugin", SINGLE, ratio, 1.2, "x", now),
        _absolute("idle wake-ups of supervisord", supervisord, round(SUPERVISORD_LOOP_PER_MIN * 1.2), "/min"),
    ]


# DRA mode against colad in device-plugin mode, in the same phase (bench/dra.py): the ratios a prepare, a
# slice update and a start may take over their yardsticks, and the MiB its footprint may add.
DRA_CALL_RATIO = 1.5
DRA_START_RATIO = 1.25
DRA_EXTRA_MIB = 16.0
DRA_BASE = "device-plugin mode"


def _dra(results: dict[str, Any]) -> list[Verdict]:
    """DRA mode's budgets, each against colad's own device-plugin figure of the same phase.

    A prepare is held to Allocate plus one claim read at the API server (the call Allocate never
    makes), a slice update to the change reaching the kubelet plus one API call, a start to the
    device-plugin start plus the API calls on its path; the 1.5x and 1.25x on top are colad's own work
    (a CDI spec and the checkpoint written per claim, the slices planned). The footprint is held to
    colad in device-plugin mode + 16 MiB: with that mode within its own budget, DRA mode is within the
    device-plugin budget + 16 MiB.
    """
    got = results["dra"]
    mine = got.get(dra.DRA, {})
    sticks = dra.yardsticks(results)
    n = got.get("scale_count") or 0
    refused = at(mine, "prepare_concurrent.refused")
    note = f"{refused:g} calls refused for want of a worker and made again" if refused else ""
    verdicts = [
        _to_floor(
            "DRA: NodePrepareResources p99, 1 claim",
            at(mine, "prepare_sequential.p99_ms"),
            sticks[dra.PREPARE],
            DRA_CALL_RATIO,
            base=DRA_BASE,
        ),
        _to_floor(
            "DRA: NodePrepareResources p99, 16 claims at once",
            at(mine, "prepare_concurrent.p99_ms"),
            sticks[dra.PREPARE_AT_ONCE],
            DRA_CALL_RATIO,
            note=note,
            base=DRA_BASE,
        ),
        _to_floor(
            "DRA: device file change -> slice updated p99",
            at(mine, "slice_update.p99_ms"),
            sticks[dra.SLICE_UPDATE],
            DRA_CALL_RATIO,
            base=DRA_BASE,
        ),
        _to_floor(
            f"DRA: start -> slices published, {got.get('devices', 0)} devices",
            at(mine, "start.median_ms"),
            sticks[dra.START],
            DRA_START_RATIO,
            base=DRA_BASE,
        ),
        _above_floor(
            f"DRA: total PSS, {got.get('devices_for_claims', 0)} devices",
            at(mine, "memory.total.pss_mib"),
            sticks[dra.PSS],
            DRA_EXTRA_MIB,
            base=DRA_BASE,
        ),
    ]
    if n:
        verdicts[4:4] = [
            _to_floor(
                f"DRA: start -> slices published, {n:,} devices",
                at(mine, f"scale.{n}.start_ms"),
                sticks[dra.START_AT_SCALE],
                DRA_START_RATIO,
                base=DRA_BASE,
            )
        ]
        verdicts.append(
            _above_floor(
                f"DRA: total PSS, {n:,} devices",
                at(mine, f"scale.{n}.memory.total.pss_mib"),
                sticks[dra.PSS_AT_SCALE],
                DRA_EXTRA_MIB,
                base=DRA_BASE,
            )
        )
    return verdicts


def check(results: dict[str, Any]) -> list[Verdict]:
    """The budgets in the order docs/PERFORMANCE.md lists them: what a user feels, what the card costs, the rest;
    then DRA mode's. Only those of the phases that ran."""
    found = _device_plugin(results) if "colad" in results else []
    return found + (_dra(results) if "dra" in results else [])


def _device_plugin(results: dict[str, Any]) -> list[Verdict]:
    colad, baseline = results["colad"], results["baseline"]
    sticks = floor.yardsticks(results)
    at_scale = f"scale.{BUDGET_COUNT}"
    imported = {role: mods for role, mods in results["imports"].items() if role != "plugin" and mods}
    return [
        _ratio("Allocate p99, 1 caller", colad, baseline, "allocate_sequential.p99_ms", 1.25),
        _ratio("Allocate p99, 16 callers", colad, baseline, "allocate_concurrent.p99_ms", 1.3, _refused(colad)),
        _ratio("change propagation p99, with gap", colad, baseline, "propagation.p99_ms", 2.0),
        _ratio("change propagation p99, back to back", colad, baseline, "propagation_back_to_back.p99_ms", 2.0),
        _absolute("re-registration -> Register p99", at(colad, "reregistration.p99_ms"), 50.0, " ms"),
        _ratio(
            f"{BUDGET_COUNT:,} devices: one more change p50", colad, baseline, f"{at_scale}.one_more_change.p50_ms", 1.0
        ),
        _bursts(colad, baseline),
        _to_floor(
            "cold start -> Register answered", at(colad, "cold_start.registered_ms"), sticks[floor.COLD_START], 1.25
        ),
        _to_floor(
            f"{BUDGET_COUNT:,} devices: start -> full list",
            at(colad, f"{at_scale}.full_list_ms"),
            sticks[floor.FULL_LIST_AT_SCALE],
            1.5,
        ),
        _cpu_per_change(colad, sticks),
        _above_floor("total PSS, 10 devices", at(colad, "memory.total.pss_mib"), sticks[floor.PSS], 8.0),
        _above_floor(
            f"total PSS, {BUDGET_COUNT:,} devices",
            at(colad, f"{at_scale}.memory.total.pss_mib"),
            sticks[floor.PSS_AT_SCALE],
            24.0,
        ),
        Verdict(
            "discovery and kubelet-watch import neither gRPC nor prometheus_client",
            ABSOLUTE,
            sum(len(m) for m in imported.values()),
            0,
            " modules",
            "; ".join(f"{r}: {m}" for r, m in imported.items()),
        ),
        *_idle(colad, baseline),
        *_largest(results),
    ]


HEADER = "| figure | yardstick | budget | now | verdict |\n|---|---|---|---|---|"


def summary_line(verdicts: list[Verdict]) -> str:
    passed = sum(v.passed for v in verdicts)
    return f"budgets: {passed} passed, {len(verdicts) - passed} failed"
