"""The shipped Prometheus configuration: rules checked and unit-tested by promtool itself."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration
CONF = Path(__file__).resolve().parents[2] / "conf" / "prometheus"


def promtool(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["promtool", *args], cwd=CONF, capture_output=True, text=True, timeout=60)


def test_alerting_rules_are_valid() -> None:
    result = promtool("check", "rules", "colad-alerts.yml")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS: 6 rules found" in result.stdout + result.stderr


def test_alerting_rules_pass_their_unit_tests() -> None:
    result = promtool("test", "rules", "colad-alerts.test.yml")
    assert result.returncode == 0, result.stdout + result.stderr


def test_scrape_config_example_is_valid() -> None:
    result = promtool("check", "config", "scrape.yml")
    assert result.returncode == 0, result.stdout + result.stderr
