"""The shipped Prometheus configuration and Grafana dashboard: rules and expressions checked by promtool itself."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.unit.packaging.test_grafana import (
    TARGET_LABELS,
    dashboard,
    exported,
    expressions,
    in_venv,
    label_names,
    metric_names,
    substitute,
)

pytestmark = pytest.mark.integration
CONF = Path(__file__).resolve().parents[3] / "conf" / "prometheus"


def promtool(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["promtool", *args], cwd=CONF, capture_output=True, text=True, timeout=60)


def test_alerting_rules_are_valid() -> None:
    result = promtool("check", "rules", "colad-alerts.yml")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS: 10 rules found" in result.stdout + result.stderr


def test_alerting_rules_pass_their_unit_tests() -> None:
    result = promtool("test", "rules", "colad-alerts.test.yml")
    assert result.returncode == 0, result.stdout + result.stderr


def test_every_metric_and_label_a_rule_names_is_one_colad_exports() -> None:
    """In either mode: the DRA rules name families only DRA mode serves."""
    yaml = pytest.importorskip("yaml")
    names, labels = exported()
    labels |= TARGET_LABELS
    rules = yaml.safe_load((CONF / "colad-alerts.yml").read_text(encoding="utf-8"))
    exprs = {r["alert"]: r["expr"] for group in rules["groups"] for r in group["rules"]}
    assert any(name.startswith("ColadDra") for name in exprs)
    for name, expr in exprs.items():
        used = metric_names(expr) - {"up"}
        assert used <= names, f"{name}: colad exports no {sorted(used - names)}"
        assert label_names(expr) <= labels, f"{name}: no label {sorted(label_names(expr) - labels)}"


def test_scrape_config_example_is_valid() -> None:
    result = promtool("check", "config", "scrape.yml")
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.skipif(shutil.which("promtool") is None and not in_venv(), reason="promtool is not installed")
def test_every_expression_parses_with_promtool(tmp_path: Path) -> None:
    """promtool is installed by `make setup` (Debian's prometheus); the .deb build may lack it."""
    assert shutil.which("promtool"), "promtool missing: run `make setup`"
    exprs = expressions(dashboard())
    rules = [{"record": f"colad:dashboard_check:{n}", "expr": substitute(expr)} for n, (_, expr) in enumerate(exprs)]
    path = tmp_path / "dashboard-rules.yml"
    path.write_text(json.dumps({"groups": [{"name": "dashboard", "rules": rules}]}))  # JSON is YAML
    check = subprocess.run(["promtool", "check", "rules", str(path)], capture_output=True, text=True, timeout=60)
    assert check.returncode == 0, check.stdout + check.stderr
    assert f"{len(rules)} rules found" in check.stdout, check.stdout
