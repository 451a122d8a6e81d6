"""colad's performance budgets: ratios to the single-process baseline of the same run, and sizes.

Reads the results dict bench/run.py builds and returns one Verdict per budget.
Nothing here fails a build: `make bench` is a report, `make test` asserts no timing.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from colad.constants import KUBELET_MAX_RECV_MESSAGE_BYTES

IDLE_WAKEUPS_PER_MIN = 60.0  # "no process wakes more than once a second"


def _number(value: float) -> str:
    return f"{value:,}" if isinstance(value, int) else f"{value:g}"


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


def _ratio(budget: str, colad: dict[str, Any], baseline: dict[str, Any], key: str, limit: float) -> Verdict:
    mine, theirs = colad[key]["p99_ms"], baseline[key]["p99_ms"]
    return Verdict(budget, round(mine / theirs, 2), limit, "x", f"colad {mine} ms, baseline {theirs} ms")


def check(results: dict[str, Any]) -> list[Verdict]:
    colad, baseline = results["colad"], results["baseline"]
    idle = {name: cost["wakeups_per_min"] for name, cost in colad["idle"].items()}
    noisiest = max(idle, key=lambda name: idle[name])
    idle_detail = "; ".join(
        f"{name} {cost['wakeups_per_min']:g} (gRPC runtime {cost['grpc_runtime_wakeups_per_min']:g}, "
        f"own {cost['own_wakeups_per_min']:g})"
        for name, cost in sorted(colad["idle"].items(), key=lambda kv: -kv[1]["wakeups_per_min"])
    )
    imported = {role: mods for role, mods in results["imports"].items() if role != "plugin" and mods}
    return [
        _ratio("Allocate p99, sequential, vs baseline", colad, baseline, "allocate_sequential", 1.2),
        _ratio("Allocate p99, 16 callers, vs baseline", colad, baseline, "allocate_concurrent", 1.2),
        Verdict("change propagation p99", colad["propagation"]["p99_ms"], 5.0, " ms"),
        _ratio("change propagation p99 vs baseline", colad, baseline, "propagation", 2.0),
        Verdict(
            "re-registration p99 (kubelet.sock -> Register answer)", colad["reregistration"]["p99_ms"], 50.0, " ms"
        ),
        Verdict("cold start -> registered", colad["cold_start"]["registered_ms"], 1500.0, " ms"),
        Verdict("total PSS incl. supervisord, 10 devices", colad["memory"]["total"]["pss_mib"], 64.0, " MiB"),
        Verdict(
            "total PSS incl. supervisord, 10,000 devices", colad["scale"]["memory"]["total"]["pss_mib"], 96.0, " MiB"
        ),
        Verdict(
            "discovery and kubelet-watch import neither gRPC nor prometheus_client",
            sum(len(m) for m in imported.values()),
            0,
            " modules",
            "; ".join(f"{r}: {m}" for r, m in imported.items()),
        ),
        Verdict(
            f"idle wake-ups, busiest colad process ({noisiest})",
            idle[noisiest],
            IDLE_WAKEUPS_PER_MIN,
            "/min",
            idle_detail,
        ),
        Verdict(
            "ListAndWatch message at 10,000 devices (kubelet limit)",
            colad["scale"]["message_bytes"],
            KUBELET_MAX_RECV_MESSAGE_BYTES,
            " B",
        ),
    ]


def summary_line(verdicts: list[Verdict]) -> str:
    passed = sum(v.passed for v in verdicts)
    return f"budgets: {passed} passed, {len(verdicts) - passed} failed"
