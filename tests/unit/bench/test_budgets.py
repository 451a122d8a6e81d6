"""bench/budgets.py: each budget against its yardstick, read from one run's results.

What a user feels is held to the single-process baseline, what the design card costs to the floor
bench/floor.py adds up from its named parts, DRA mode to colad's own device-plugin mode; a figure or a
floor part the run lacks fails its budget.
"""

from __future__ import annotations

import copy
import math
from typing import Any

import pytest

from bench import budgets, floor
from bench.report import budgets as budget_table
from tests.unit.bench.test_dra import results as dra_results

pytestmark = pytest.mark.unit


def _results() -> dict[str, Any]:
    idle = {"wakeups_per_min": 60, "grpc_runtime_wakeups_per_min": 0, "own_wakeups_per_min": 4}
    colad = {
        "allocate_sequential": {"p99_ms": 1.2},
        "allocate_concurrent": {"p99_ms": 13.0, "refused": 0},
        "propagation": {"p99_ms": 3.0},
        "propagation_back_to_back": {"p99_ms": 64.0},
        "reregistration": {"p99_ms": 20.0},
        "cold_start": {"registered_ms": 300.0},
        "cpu_ms": {"change": {"total": 2.4, "supervisord": 0.3}},
        "memory": {"total": {"pss_mib": 65.0}, "supervisord": {"pss_mib": 16.0}},
        "burst": {"runs": [{"settled_ms": 400.0}, {"settled_ms": 500.0}]},
        "scale": {
            "10000": {
                "one_more_change": {"p50_ms": 10.0},
                "full_list_ms": 900.0,
                "memory": {"total": {"pss_mib": 80.0}, "supervisord": {"pss_mib": 16.0}},
                "message_bytes": 168_890,
                "listed": 10_000,
            }
        },
        "idle": {"plugin": {**idle, "grpc_runtime_wakeups_per_min": 700}, "supervisord": idle},
    }
    baseline = {
        "allocate_sequential": {"p99_ms": 1.0},
        "allocate_concurrent": {"p99_ms": 10.0},
        "propagation": {"p99_ms": 2.0},
        "propagation_back_to_back": {"p99_ms": 0.5},
        "burst": {"runs": [{"settled_ms": 800.0}, {"settled_ms": 1000.0}]},
        "scale": {"10000": {"one_more_change": {"p50_ms": 40.0}}},
        "idle": {"plugin": {**idle, "grpc_runtime_wakeups_per_min": 700}},
    }
    return {
        "colad": colad,
        "baseline": baseline,
        "floor": {
            "supervisord_ms": 100.0,
            "split": {"split": {"registered_ms": 150.0, "cpu_change": 1.2}, "split+card": {"pss_mib": 42.0}},
            "scale": {
                "10000": {"split": {"full_list_ms": 400.0}, "split+card": {"memory": {"total": {"pss_mib": 50.0}}}}
            },
        },
        "imports": {"plugin": ["grpc"], "discovery": [], "kubelet-watch": []},
        "scale_counts": [10_000],
    }


def _verdicts(results: dict[str, Any]) -> dict[str, budgets.Verdict]:
    return {v.budget: v for v in budgets.check(results)}


# The budgets of the rebased table: figure, yardstick (with the floor's parts), value, limit, verdict.
TABLE = [
    ("Allocate p99, 1 caller", "single process", 1.2, 1.25, True),
    ("Allocate p99, 16 callers", "single process", 1.3, 1.3, True),
    ("change propagation p99, with gap", "single process", 1.5, 2.0, True),
    ("change propagation p99, back to back", "single process", 128.0, 2.0, False),
    ("re-registration -> Register p99", "absolute", 20.0, 50.0, True),
    ("10,000 devices: one more change p50", "single process", 0.25, 1.0, True),
    ("10,000-file burst settled, every run", "single process", 0.5, 1.0, True),
    ("cold start -> Register answered", "the split 150 + supervisord's start 100 = 250 ms", 1.2, 1.25, True),
    (
        "10,000 devices: start -> full list",
        "the split at 10,000 400 + supervisord's start 100 = 500 ms",
        1.8,
        1.5,
        False,
    ),
    ("CPU per change, all processes", "the split 1.2 ms", 2.0, 2.0, True),
    (
        "total PSS, 10 devices",
        "the split with the card's imports 42 + colad's supervisord 16 = 58 MiB",
        7.0,
        8.0,
        True,
    ),
    (
        "total PSS, 10,000 devices",
        "the split with the card's imports at 10,000 50 + colad's supervisord at 10,000 16 = 66 MiB",
        14.0,
        24.0,
        True,
    ),
]


@pytest.mark.parametrize(("budget", "yardstick", "value", "limit", "passed"), TABLE, ids=[row[0] for row in TABLE])
def test_each_budget_reads_its_yardstick(budget: str, yardstick: str, value: float, limit: float, passed: bool) -> None:
    verdict = _verdicts(_results())[budget]
    assert (verdict.yardstick, verdict.value, verdict.limit, verdict.passed) == (yardstick, value, limit, passed)


def test_the_budgets_come_in_the_order_of_the_table() -> None:
    names = [v.budget for v in budgets.check(_results())]
    assert names[:3] == ["Allocate p99, 1 caller", "Allocate p99, 16 callers", "change propagation p99, with gap"]
    assert names[11] == "total PSS, 10,000 devices"


def test_pss_is_printed_as_the_size_above_the_floor() -> None:
    row = _verdicts(_results())["total PSS, 10 devices"].row()
    assert "| <= floor + 8 MiB | 65 / 58 MiB = floor + 7 MiB | PASS |" in row


def test_cpu_per_change_also_shows_the_floor_with_supervisords_relay() -> None:
    verdict = _verdicts(_results())["CPU per change, all processes"]
    assert verdict.note == (
        "with supervisord's relay in the floor (the split 1.2 + supervisord's relay 0.3 = 1.5 ms): 1.60x"
    )


def test_refused_allocate_calls_are_named_beside_the_figure() -> None:
    results = _results()
    results["colad"]["allocate_concurrent"]["refused"] = 7
    assert "7 calls refused" in _verdicts(results)["Allocate p99, 16 callers"].value_text()


@pytest.mark.parametrize(
    ("missing", "budget"),
    [
        ("split at scale", "10,000 devices: start -> full list"),
        ("card split at scale", "total PSS, 10,000 devices"),
        ("back to back", "change propagation p99, back to back"),
    ],
)
def test_a_budget_whose_figure_or_floor_part_is_missing_fails(missing: str, budget: str) -> None:
    results = copy.deepcopy(_results())
    if missing == "split at scale":
        del results["floor"]["scale"]["10000"]["split"]
    elif missing == "card split at scale":
        del results["floor"]["scale"]["10000"]["split+card"]
    else:
        del results["colad"]["propagation_back_to_back"]
    verdict = _verdicts(results)[budget]
    assert math.isinf(verdict.value) and not verdict.passed
    assert verdict.value_text().startswith("not measured")


def test_every_floor_a_budget_reads_is_printed() -> None:
    printed = floor.yardsticks(_results())
    assert all(stick is not None for stick in printed.values())
    table = budget_table(budgets.check(_results()))
    assert table.splitlines()[0] == "| figure | yardstick | budget | now | verdict |"
    assert table.splitlines()[-1] == budgets.summary_line(budgets.check(_results()))


# DRA mode against colad's own device-plugin mode of the same phase: figure, value, limit, verdict.
DRA_TABLE = [
    ("DRA: NodePrepareResources p99, 1 claim", 1.29, 1.5, True),
    ("DRA: NodePrepareResources p99, 16 claims at once", 1.17, 1.5, True),
    ("DRA: device file change -> slice updated p99", 1.25, 1.5, True),
    ("DRA: start -> slices published, 10 devices", 1.31, 1.25, False),
    ("DRA: start -> slices published, 10,000 devices", 1.31, 1.25, False),
    ("DRA: total PSS, 16 devices", 3.5, 16.0, True),
    ("DRA: total PSS, 10,000 devices", 20.0, 16.0, False),
]


def _dra_verdicts(results: dict[str, Any]) -> dict[str, budgets.Verdict]:
    return {v.budget: v for v in budgets.check(results)}


@pytest.mark.parametrize(("budget", "value", "limit", "passed"), DRA_TABLE, ids=[row[0] for row in DRA_TABLE])
def test_each_dra_budget_reads_colads_device_plugin_mode(budget: str, value: float, limit: float, passed: bool) -> None:
    verdict = _dra_verdicts(dra_results())[budget]
    assert (verdict.value, verdict.limit, verdict.passed) == (value, limit, passed)


def test_the_dra_budgets_follow_the_device_plugins_and_come_alone_when_only_dra_ran() -> None:
    both = {**_results(), **dra_results()}
    names = [v.budget for v in budgets.check(both)]
    assert names[: len(TABLE)] == [row[0] for row in TABLE]
    assert names[-len(DRA_TABLE) :] == [row[0] for row in DRA_TABLE]
    assert [v.budget for v in budgets.check(dra_results())] == [row[0] for row in DRA_TABLE]


def test_dra_pss_is_printed_as_the_size_above_the_device_plugin_mode() -> None:
    row = _dra_verdicts(dra_results())["DRA: total PSS, 16 devices"].row()
    assert row == (
        "| DRA: total PSS, 16 devices | colad in device-plugin mode 60 MiB | <= device-plugin mode + 16 MiB"
        " | 63.5 / 60 MiB = device-plugin mode + 3.5 MiB | PASS |"
    )


def test_refused_prepares_are_named_beside_the_figure() -> None:
    text = _dra_verdicts(dra_results())["DRA: NodePrepareResources p99, 16 claims at once"].value_text()
    assert text == "14 / 12 ms = 1.17x; 3 calls refused for want of a worker and made again"


def test_without_the_start_at_scale_its_dra_budgets_are_left_out_and_a_missing_figure_fails() -> None:
    results = dra_results()
    results["dra"]["scale_count"] = 0
    del results["dra"]["api"]["claim_read_sequential"]
    verdicts = _dra_verdicts(results)
    assert not any("10,000" in name for name in verdicts)
    missing = verdicts["DRA: NodePrepareResources p99, 1 claim"]
    assert math.isinf(missing.value) and not missing.passed
    assert missing.yardstick == "the device-plugin mode"
