"""colad's performance budgets: ratios to the single-process baseline of the same run, and sizes.

Reads the results dict bench/run.py builds and returns one Verdict per budget.
Nothing here fails a build: `make bench` is a report, `make test` asserts no timing.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from colad.core.constants import KUBELET_MAX_RECV_MESSAGE_BYTES

IDLE_WAKEUPS_PER_MIN = 60.0  # "no thread of colad's own wakes more than once a second"
# supervisord's main loop polls with a 1 s timeout: 60 a minute is its floor, whatever colad does.
SUPERVISORD_LOOP_PER_MIN = 60.0


def _number(value: float) -> str:
    if isinstance(value, int):
        return f"{value:,}"
    return f"{value:g}"


@dataclass(frozen=True)
class Verdict:
    budget: str
    value: float
    limit: float
    unit: str
    detail: str = ""

    @property
    def passed(self) -> bool:
        return self.value <= self.limit

    def line(self) -> str:
        detail = f"  [{self.detail}]" if self.detail else ""
        verdict = "PASS" if self.passed else "FAIL"
        value, limit = _number(self.value) + self.unit, _number(self.limit) + self.unit
        return f"{verdict}  {self.budget}: {value} (limit {limit}){detail}"

    def as_dict(self) -> dict[str, Any]:
        return {**self.__dict__, "passed": self.passed}


def _at(figures: dict[str, Any], path: str) -> float | None:
    value: Any = figures
    for key in path.split("."):
        value = value.get(key) if isinstance(value, dict) else None
    return value if isinstance(value, int | float) else None


def _ratio(budget: str, colad: dict[str, Any], baseline: dict[str, Any], path: str, limit: float) -> Verdict:
    """colad / baseline of the figure at `path` (dotted), both from this run; a figure not measured fails."""
    mine, theirs = _at(colad, path), _at(baseline, path)
    unit = " ms" if path.endswith("_ms") or ".cpu_ms" in path or path.startswith("cpu_ms") else ""
    if mine is None or not theirs:
        return Verdict(budget, math.inf, limit, "x", f"not measured: colad {mine}, baseline {theirs}")
    return Verdict(budget, round(mine / theirs, 2), limit, "x", f"colad {mine:g}{unit}, baseline {theirs:g}{unit}")


def _absolute(budget: str, value: float | None, limit: float, unit: str) -> Verdict:
    if value is None:
        return Verdict(budget, math.inf, limit, unit, "not measured")
    return Verdict(budget, value, limit, unit)


def _bursts(colad: dict[str, Any], baseline: dict[str, Any]) -> Verdict:
    """The burst must settle no later than the baseline's in every run: the worst run's ratio."""
    pairs = list(zip(colad["burst"]["runs"], baseline["burst"]["runs"], strict=False))
    ratios = [
        round(c["settled_ms"] / b["settled_ms"], 2) if c["settled_ms"] and b["settled_ms"] else math.inf
        for c, b in pairs
    ]
    detail = ", ".join(f"{c['settled_ms']}/{b['settled_ms']} ms" for c, b in pairs)
    return Verdict(f"10,000-file burst settled vs baseline, worst of {len(pairs)} runs", max(ratios), 1.0, "x", detail)


def _largest(results: dict[str, Any]) -> list[Verdict]:
    """At the largest count of the scale table: the message fits the kubelet, and every device is listed."""
    count = max(results.get("scale_counts", [0]))
    got = results["colad"].get("scale", {}).get(str(count))
    if not got:
        return []
    return [
        Verdict(
            f"ListAndWatch message at {count:,} devices (kubelet limit)",
            got["message_bytes"],
            KUBELET_MAX_RECV_MESSAGE_BYTES,
            " B",
        ),
        Verdict(f"devices missing from the list at {count:,} devices", count - got["listed"], 0, ""),
    ]


def _idle(colad: dict[str, Any], baseline: dict[str, Any]) -> list[Verdict]:
    """Idle wake-ups, split by whose code wakes: colad's own threads, the gRPC runtime, supervisord's loop.

    The gRPC runtime's timers (the server's 200 ms poll, its event engine) wake the single-process
    baseline as often: they are compared with it. supervisord is held to its once-a-second loop.
    """
    roles = {name: cost for name, cost in colad["idle"].items() if name != "supervisord"}
    detail = "; ".join(
        f"{name} {cost['wakeups_per_min']:g} (gRPC runtime {cost['grpc_runtime_wakeups_per_min']:g}, "
        f"own {cost['own_wakeups_per_min']:g})"
        for name, cost in sorted(colad["idle"].items(), key=lambda kv: -kv[1]["wakeups_per_min"])
    )
    busiest = max(roles, key=lambda name: roles[name]["own_wakeups_per_min"])
    verdicts = [
        Verdict(
            f"idle wake-ups of colad's own threads, busiest role ({busiest})",
            roles[busiest]["own_wakeups_per_min"],
            IDLE_WAKEUPS_PER_MIN,
            "/min",
            detail,
        )
    ]
    mine = roles.get("plugin", {}).get("grpc_runtime_wakeups_per_min")
    theirs = baseline["idle"].get("plugin", {}).get("grpc_runtime_wakeups_per_min")
    ratio = round(mine / theirs, 2) if mine is not None and theirs else math.inf
    verdicts.append(
        Verdict(
            "idle wake-ups of the gRPC runtime in the plugin vs baseline",
            ratio,
            1.2,
            "x",
            f"colad {mine}/min, baseline {theirs}/min",
        )
    )
    supervisord = colad["idle"].get("supervisord", {}).get("wakeups_per_min")
    verdicts.append(
        _absolute("idle wake-ups of supervisord", supervisord, round(SUPERVISORD_LOOP_PER_MIN * 1.2), "/min")
    )
    return verdicts


def check(results: dict[str, Any]) -> list[Verdict]:
    colad, baseline = results["colad"], results["baseline"]
    idle = _idle(colad, baseline)
    imported = {role: mods for role, mods in results["imports"].items() if role != "plugin" and mods}
    return [
        # The cost targets, each as a ratio to the baseline of the same run or as a size.
        _ratio(
            "10,000 devices: one more change p50 vs baseline",
            colad,
            baseline,
            "scale.10000.one_more_change.p50_ms",
            2.0,
        ),
        _ratio("CPU per change, all processes, vs baseline", colad, baseline, "cpu_ms.change.total", 2.0),
        _ratio("cold start -> Register answered vs baseline", colad, baseline, "cold_start.registered_ms", 2.0),
        _ratio("10,000 devices: start -> full list vs baseline", colad, baseline, "scale.10000.full_list_ms", 2.0),
        _ratio("change propagation p99 vs baseline", colad, baseline, "propagation.p99_ms", 1.5),
        _absolute("total PSS incl. supervisord, 10 devices", _at(colad, "memory.total.pss_mib"), 64.0, " MiB"),
        _absolute(
            "total PSS incl. supervisord, 10,000 devices", _at(colad, "scale.10000.memory.total.pss_mib"), 80.0, " MiB"
        ),
        _bursts(colad, baseline),
        _ratio("Allocate p99, sequential, vs baseline", colad, baseline, "allocate_sequential.p99_ms", 1.2),
        _ratio("Allocate p99, 16 callers, vs baseline", colad, baseline, "allocate_concurrent.p99_ms", 1.2),
        # Absolute budgets.
        _absolute("change propagation p99", _at(colad, "propagation.p99_ms"), 5.0, " ms"),
        _absolute(
            "re-registration p99 (kubelet.sock -> Register answer)", _at(colad, "reregistration.p99_ms"), 50.0, " ms"
        ),
        _absolute("cold start -> registered", _at(colad, "cold_start.registered_ms"), 1500.0, " ms"),
        Verdict(
            "discovery and kubelet-watch import neither gRPC nor prometheus_client",
            sum(len(m) for m in imported.values()),
            0,
            " modules",
            "; ".join(f"{r}: {m}" for r, m in imported.items()),
        ),
        *idle,
        *_largest(results),
    ]


def summary_line(verdicts: list[Verdict]) -> str:
    passed = sum(v.passed for v in verdicts)
    return f"budgets: {passed} passed, {len(verdicts) - passed} failed"
