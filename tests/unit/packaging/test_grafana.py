"""conf/grafana/colad.json: a well-formed dashboard whose every query parses and names only colad's own metrics.

The PromQL is checked by promtool (a real parser): every expression becomes a
recording rule in a temporary file for `promtool check rules`. The metric names
each expression uses are then taken out by a small tokenizer and compared with
the names a real `Metrics()` registry exports, so a renamed metric breaks this
test instead of leaving an empty panel.
"""

from __future__ import annotations

import json
import re
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.metrics import MetricWrapperBase

from colad.core.inuse import InUse
from colad.metrics.registry import DraState, Metrics
from colad.outputs.statefile import PluginState, ResourceState

pytestmark = pytest.mark.unit
DASHBOARD = Path(__file__).resolve().parents[3] / "conf" / "grafana" / "colad.json"
DS_REF = "${datasource}"

# Labels Prometheus adds to every scraped series, and the histogram bucket label.
TARGET_LABELS = {"instance", "job", "le", "__name__"}

# What the dashboard must show: each must appear in some panel's query.
REQUIRED_METRICS = {
    "colad_devices",
    "colad_allocate_requests_total",
    "colad_allocated_devices_total",
    "colad_device_allocations_total",
    "colad_registered",
    "colad_registrations_total",
    "colad_kubelet_restarts_total",
    "colad_plugin_server_restarts_total",
    "colad_allocate_duration_seconds_bucket",
    "colad_process_resident_memory_bytes",
    "colad_process_cpu_seconds_total",
    "colad_devices_in_use",
    "colad_device_holder_info",
    "colad_dra_prepare_claims_total",
    "colad_dra_prepare_duration_seconds_bucket",
    "colad_dra_prepared_claims",
    "colad_dra_slices_current",
    "colad_dra_slice_writes_total",
    "colad_dra_api_errors_total",
}
# Metrics that carry the `resource` label: every query on them must filter with resource=~"$resource".
RESOURCE_METRICS = {
    "colad_devices",
    "colad_devices_in_use",
    "colad_device_holder_info",
    "colad_registered",
    "colad_registrations_total",
    "colad_allocate_requests_total",
    "colad_allocated_devices_total",
    "colad_device_allocations_total",
    "colad_list_and_watch_streams",
    "colad_plugin_server_restarts_total",
}

# Grafana's built-in interval variables, replaced by a duration before promtool sees the expression.
GRAFANA_DURATIONS = {"__rate_interval": "5m", "__interval": "1m", "__range": "6h"}
KEYWORDS = {
    "and",
    "or",
    "unless",
    "by",
    "without",
    "on",
    "ignoring",
    "group_left",
    "group_right",
    "offset",
    "bool",
    "inf",
    "nan",
    "atan2",
    "start",
    "end",
}
IDENTIFIER = re.compile(r"[A-Za-z_:][A-Za-z0-9_:]*")
GROUPING = re.compile(r"\b(by|without|on|ignoring|group_left|group_right)\s*\(([^()]*)\)")
STRING = re.compile(r'"(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\'|`[^`]*`')
MATCHER = re.compile(r"([A-Za-z_][A-Za-z0-9_]*)\s*(=~|!~|!=|=)")


def in_venv() -> bool:
    return sys.prefix != sys.base_prefix


def dashboard() -> dict[str, Any]:
    data = json.loads(DASHBOARD.read_text(encoding="utf-8"))
    assert isinstance(data, dict)
    return data


def panels(data: dict[str, Any]) -> Iterator[dict[str, Any]]:
    for panel in data["panels"]:
        yield panel
        yield from panel.get("panels", [])  # collapsed rows keep their panels inside


def expressions(data: dict[str, Any]) -> list[tuple[str, str]]:
    """(panel title, PromQL) for every query target of every panel."""
    return [(panel["title"], target["expr"]) for panel in panels(data) for target in panel.get("targets", [])]


def substitute(expr: str) -> str:
    """The expression with Grafana's variables replaced as Grafana would, for a parser that knows none."""

    def value(match: re.Match[str]) -> str:
        name = match.group(1) or match.group(2)
        if name in GRAFANA_DURATIONS:
            return GRAFANA_DURATIONS[name]
        if name in {"instance", "resource"}:
            return ".*"  # the variables' "All" value
        raise AssertionError(f"unknown variable ${name} in {expr!r}")

    return re.sub(r"\$\{(\w+)\}|\$(\w+)", value, expr)


def metric_names(expr: str) -> set[str]:
    """Metric names in a PromQL expression: identifiers outside braces, strings and grouping clauses,
    not followed by '(' (functions and aggregations) and not keywords, numbers or durations."""
    text = STRING.sub('""', expr)
    text = re.sub(r"\{[^{}]*\}", " ", text)  # label matchers
    text = re.sub(r"\[[^\[\]]*\]", " ", text)  # range and subquery durations
    text = GROUPING.sub(" ", text)
    names: set[str] = set()
    for match in IDENTIFIER.finditer(text):
        word = match.group()
        before = text[match.start() - 1] if match.start() else " "
        if before.isdigit() or before == ".":  # 1e3, 0.5 and the like
            continue
        if text[match.end() :].lstrip().startswith("(") or word.lower() in KEYWORDS:
            continue
        names.add(word)
    return names


def label_names(expr: str) -> set[str]:
    """Label names an expression filters or groups on."""
    text = STRING.sub('""', expr)
    names: set[str] = set()
    for braces in re.findall(r"\{([^{}]*)\}", text):
        names.update(name for name, _ in MATCHER.findall(braces))
    for _, inside in GROUPING.findall(text):
        names.update(name.strip() for name in inside.split(",") if name.strip())
    return names


def selectors(expr: str, metric: str) -> list[str]:
    """The label matchers after each occurrence of `metric` in `expr` ("" where it has none)."""
    found = re.finditer(r"(?<![\w:])" + re.escape(metric) + r"(?![\w:])(\{[^{}]*\})?", expr)
    return [match.group(1) or "" for match in found]


def exported() -> tuple[set[str], set[str]]:
    """Every sample name and label name a colad Metrics() registry exposes, from the source of truth.

    Names come from the metric families (a labelled family with no child yet still has its name and type);
    label names from the samples of a registry with one resource, one allocation and one holder (so the
    families read from published snapshots have samples too), and from each instrument's declared label names.
    Both modes count: the device-plugin mode's registry and the DRA mode's, with one driver serving.
    """
    resource = ResourceState(name="example.com/cola", registered=True, devices=1, healthy=1, last_registered=1.0)
    names: set[str] = set()
    labels: set[str] = set()
    for dra in (False, True):
        metrics = Metrics(snapshot=lambda: PluginState(pid=1, resources=(resource,)), dra=dra)
        metrics.in_use = lambda: InUse(True, ((resource.name, 1),), ((resource.name, "a", "ns", "pod", "c"),))
        metrics.add_resource(resource.name)
        metrics.allocated(resource.name, ["a"])
        if dra:
            metrics.add_driver("cola.example.com")
            metrics.dra_api_errors.labels("list", "unreachable").inc()
            metrics.dra_state = lambda: DraState("cola.example.com", prepared_claims=1, slices=1, slices_current=True)
        suffixes = {"counter": ["_total"], "histogram": ["_bucket", "_sum", "_count"], "info": ["_info"]}
        for family in metrics.registry.collect():
            names.update(family.name + suffix for suffix in suffixes.get(family.type, [""]))
            for sample in family.samples:
                names.add(sample.name)
                labels.update(sample.labels)
        for value in vars(metrics).values():
            if isinstance(value, MetricWrapperBase):
                labels.update(value._labelnames)  # noqa: SLF001 - no public listing in prometheus-client
    return names, labels


def test_the_tokenizer_finds_metric_names_only() -> None:
    expr = (
        'topk(10, sum by (instance, device_id) (increase(colad_x_total{a="b", c=~"d|e"}[5m])))'
        " / on (instance) group_left(le) histogram_quantile(0.99, rate(colad_y_bucket[1m:30s] offset 1h))"
        ' > bool 1e3 or label_replace(up, "dst", "$1", "src", "(.*)") unless colad_z'
    )
    assert metric_names(expr) == {"colad_x_total", "colad_y_bucket", "up", "colad_z"}
    assert label_names(expr) == {"a", "c", "instance", "device_id", "le"}
    assert metric_names("sum without (role) (rate(colad_a[5m])) * 2") == {"colad_a"}


def test_dashboard_is_valid_json_with_a_current_schema() -> None:
    data = dashboard()
    assert data["schemaVersion"] >= 36
    assert data["title"] and data["uid"]
    assert data.get("id") is None, "an exported dashboard carries no database id"
    assert not data.get("__inputs"), "the data source is chosen by the $datasource variable, not on import"


def test_template_variables() -> None:
    variables = {v["name"]: v for v in dashboard()["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource"
    assert variables["datasource"]["query"] == "prometheus"
    for name, metric in (("instance", "colad_build_info"), ("resource", "colad_devices")):
        variable = variables[name]
        assert variable["type"] == "query", name
        query = variable["query"]
        query = query["query"] if isinstance(query, dict) else query
        assert query == f"label_values({metric}, {name})"
        assert variable["datasource"] == {"type": "prometheus", "uid": DS_REF}, name
        assert variable["includeAll"] and variable["allValue"] == ".*", name


def test_every_panel_has_an_id_a_title_the_datasource_variable_and_targets() -> None:
    data = dashboard()
    ids = [panel.get("id") for panel in panels(data)]
    assert all(isinstance(i, int) for i in ids), ids
    assert len(ids) == len(set(ids)), f"duplicate panel ids: {ids}"
    for panel in panels(data):
        title = panel.get("title")
        assert title, f"panel {panel['id']} has no title"
        assert panel.get("datasource") == {"type": "prometheus", "uid": DS_REF}, title
        targets = panel.get("targets")
        assert targets, f"{title}: no targets"
        ref_ids = [t["refId"] for t in targets]
        assert len(ref_ids) == len(set(ref_ids)), title
        for target in targets:
            assert target.get("expr", "").strip(), title
            assert target.get("datasource", panel["datasource"]) == panel["datasource"], title
        grid = panel["gridPos"]
        assert grid["w"] > 0 and grid["h"] > 0 and grid["x"] + grid["w"] <= 24, title


def test_no_datasource_uid_is_hard_coded() -> None:
    def walk(node: object, path: str) -> Iterator[tuple[str, object]]:
        if isinstance(node, dict):
            for key, value in node.items():
                if key == "datasource":
                    yield f"{path}.{key}", value
                yield from walk(value, f"{path}.{key}")
        elif isinstance(node, list):
            for index, value in enumerate(node):
                yield from walk(value, f"{path}[{index}]")

    data = dashboard()
    refs = list(walk({k: v for k, v in data.items() if k != "templating"}, ""))
    refs += list(walk([v for v in data["templating"]["list"] if v["type"] != "datasource"], ".templating"))
    assert refs
    for path, ref in refs:
        uid = ref.get("uid") if isinstance(ref, dict) else ref
        assert uid == DS_REF, f"{path} names data source {ref!r}, not the $datasource variable"
    assert "DS_" not in DASHBOARD.read_text(encoding="utf-8")


def test_every_metric_and_label_is_one_colad_exports() -> None:
    names, labels = exported()
    assert "colad_allocate_requests_total" in names and "colad_build_info" in names  # the registry was read
    known_names = names
    known_labels = labels | TARGET_LABELS
    data = dashboard()
    used: set[str] = set()
    for title, expr in expressions(data):
        found = metric_names(expr)
        assert found, f"{title}: no metric in {expr!r}"
        assert found <= known_names, f"{title}: colad exports no {sorted(found - known_names)}"
        assert label_names(expr) <= known_labels, f"{title}: no label {sorted(label_names(expr) - known_labels)}"
        for metric in found:
            wanted = ['instance=~"$instance"'] + (['resource=~"$resource"'] if metric in RESOURCE_METRICS else [])
            for selector in selectors(expr, metric):
                missing = [w for w in wanted if w not in selector]
                assert not missing, f"{title}: {metric} is not filtered by {missing}"
        used |= found
    for variable in data["templating"]["list"]:
        query = variable.get("query")
        query = query.get("query", "") if isinstance(query, dict) else str(query)
        if query.startswith("label_values("):
            metric = query.removeprefix("label_values(").split(",")[0].strip()
            assert metric in known_names, variable["name"]
    assert REQUIRED_METRICS <= used, f"not on the dashboard: {sorted(REQUIRED_METRICS - used)}"
