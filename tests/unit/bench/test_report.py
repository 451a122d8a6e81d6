"""bench/report.py: the printed report holds the sections of the phases that ran, and the budgets last."""

from __future__ import annotations

from typing import Any

import pytest

from bench import budgets, report
from tests.unit.bench.test_dra import results as dra_results

pytestmark = pytest.mark.unit

META = {
    "date": "2026-12-04T00:00:00Z",
    "cpus": 2,
    "kernel": "6.1",
    "runtime_s": 50.0,
    "machine_busy_pct_before": 1.0,
    "machine_busy_pct_during": 50.0,
    "python": "3.11.7",
    "grpcio": "1.0",
    "protobuf": "5.0",
    "supervisor": "4.2",
    "interpreter": "byte-compiled",
}


def test_a_dra_only_run_prints_the_dra_table_and_its_budgets_and_nothing_of_the_device_plugin_phase() -> None:
    results: dict[str, Any] = {**dra_results(), "meta": META}
    verdicts = budgets.check(results)
    printed = report.render(results, verdicts)
    sections = printed.split("\n\n")
    assert sections[0].startswith("colad bench 2026-12-04T00:00:00Z")
    assert sections[1].startswith("DRA mode, 10 devices (16 once claims run)")
    assert sections[2].splitlines()[0] == budgets.HEADER.splitlines()[0]
    assert sections[2].splitlines()[-1] == budgets.summary_line(verdicts)
    assert len(sections) == 3 and "baseline" not in printed
