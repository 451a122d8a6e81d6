"""Allocate's success series are looked up once per resource (Metrics.allocated) and stay the live ones.

A reload that removes a resource drops its series (Metrics.remove_resource); when a later reload
adds it back, an Allocate must count into the series the registry exports again, not into the
dropped ones the lookup cache held. Values are read the client_python way (get_sample_value).
"""

from __future__ import annotations

import pytest

from colad.metrics.registry import Metrics
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
