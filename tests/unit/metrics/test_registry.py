"""Allocate's success series are looked up once per resource (Metrics.allocated) and stay the live ones.

A reload that removes a resource drops its series (Metrics.remove_resource); when a later reload
adds it back, an Allocate must count into the series the registry exports again, not into the
dropped ones the lookup cache held. Values are read the client_python way (get_sample_value).
"""

from __future__ import annotations

import pytest

from colad.metrics.registry import DraState, Metrics
from colad.outputs.statefile import PluginState

pytestmark = pytest.mark.unit
COLA = "myway5.com/cola"


def test_allocated_counts_into_the_exported_series_across_remove_and_add() -> None:
    metrics = Metrics(snapshot=lambda: PluginState(pid=1))
    value = metrics.registry.get_sample_value
    metrics.add_resource(COLA)
    metrics.allocated(COLA, ["a", "b"])
    metrics.allocated(COLA, ["c"])
    assert value("colad_allocate_requests_total", {"resource": COLA, "result": "success"}) == 2
    assert value("colad_allocated_devices_total", {"resource": COLA}) == 3
    metrics.remove_resource(COLA)
    assert value("colad_allocate_requests_total", {"resource": COLA, "result": "success"}) is None
    metrics.add_resource(COLA)
    metrics.allocated(COLA, ["a"])
    assert value("colad_allocate_requests_total", {"resource": COLA, "result": "success"}) == 1
    assert value("colad_allocated_devices_total", {"resource": COLA}) == 1


def test_api_server_errors_are_a_family_of_dra_mode_only() -> None:
    from prometheus_client import CollectorRegistry, generate_latest

    plain = Metrics(CollectorRegistry())
    exposed = generate_latest(plain.registry)
    assert b"colad_dra_api_errors" not in exposed and b"colad_dra_registration_refusals" not in exposed
    dra = Metrics(dra=True)
    dra.dra_api_errors.labels("create", "422").inc()  # before the registry is built: kept, then replayed
    assert dra.registry.get_sample_value("colad_dra_api_errors_total", {"verb": "create", "code": "422"}) == 1.0


def test_a_reload_into_dra_mode_serves_its_family_from_then_on() -> None:
    from prometheus_client import CollectorRegistry, generate_latest

    metrics = Metrics(CollectorRegistry())
    metrics.serve_dra()
    metrics.dra_api_errors.labels("list", "unreachable").inc()
    assert b'colad_dra_api_errors_total{code="unreachable",verb="list"} 1.0' in generate_latest(metrics.registry)
    metrics.serve_dra()  # once only: a second family of the same name would be refused by the registry


DRA_FAMILIES = (
    "colad_dra_prepare_claims_total",
    "colad_dra_unprepare_claims_total",
    "colad_dra_prepare_duration_seconds",
    "colad_dra_unprepare_duration_seconds",
    "colad_dra_slice_writes_total",
    "colad_dra_prepared_claims",
    "colad_dra_slices",
    "colad_dra_slices_current",
)


def test_the_drivers_families_are_served_in_dra_mode_only_and_start_at_zero() -> None:
    from prometheus_client import CollectorRegistry, generate_latest

    plain = generate_latest(Metrics(CollectorRegistry()).registry).decode()
    assert not [name for name in DRA_FAMILIES if name in plain]
    metrics = Metrics(dra=True)
    metrics.add_driver("cola.example.com")
    metrics.dra_prepare_duration.labels("cola.example.com").observe(0.02)  # before the registry: replayed
    value = metrics.registry.get_sample_value
    driver = {"driver": "cola.example.com"}
    for result in ("success", "error"):
        assert value("colad_dra_prepare_claims_total", {**driver, "result": result}) == 0
        assert value("colad_dra_unprepare_claims_total", {**driver, "result": result}) == 0
    for verb in ("create", "update", "delete"):
        assert value("colad_dra_slice_writes_total", {**driver, "verb": verb}) == 0
    assert value("colad_dra_registration_refusals_total", driver) == 0
    assert value("colad_dra_prepare_duration_seconds_bucket", {**driver, "le": "0.025"}) == 1
    assert value("colad_dra_unprepare_duration_seconds_count", driver) == 0
    assert value("colad_dra_slices_current", driver) is None  # nothing served yet: no sample
    metrics.dra_state = lambda: DraState("cola.example.com", prepared_claims=3, slices=2, slices_current=True)
    assert value("colad_dra_prepared_claims", driver) == 3
    assert value("colad_dra_slices", driver) == 2
    assert value("colad_dra_slices_current", driver) == 1


def test_a_reload_into_dra_mode_serves_the_gauges_too() -> None:
    from prometheus_client import CollectorRegistry

    metrics = Metrics(CollectorRegistry())
    metrics.dra_state = lambda: DraState("cola.example.com", slices=1)
    assert metrics.registry.get_sample_value("colad_dra_slices", {"driver": "cola.example.com"}) is None
    metrics.serve_dra()
    assert metrics.registry.get_sample_value("colad_dra_slices", {"driver": "cola.example.com"}) == 1
    assert metrics.registry.get_sample_value("colad_dra_slices_current", {"driver": "cola.example.com"}) == 0
