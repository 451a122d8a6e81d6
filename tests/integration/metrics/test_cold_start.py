"""Metrics count before their registry exists (cold start): nothing counted early is lost.

The plugin builds prometheus_client's registry after its first Register; until then each family keeps
what it counted. Property: whatever sequence of counts, observations, series made and removed, and
wherever `bind()` falls in it (or while other threads count), the registry ends with the same samples
as one built first. And a fresh interpreter that imports the plugin loads no prometheus_client.
"""

from __future__ import annotations

import random
import threading
from pathlib import Path

import pytest
from prometheus_client import generate_latest

from colad.metrics.registry import Metrics
from tests.integration.footprint.test_role_footprint import loaded

pytestmark = pytest.mark.integration
REPO = Path(__file__).resolve().parents[3]
RESOURCES = ("example.com/a", "example.com/b")


def scrape(metrics: Metrics) -> list[str]:
    """The exposition without the lines that differ between two processes' moments (process, build)."""
    text = generate_latest(metrics.registry).decode()
    skip = ("process_", "python_", "colad_build", "colad_process_")
    names = (line.removeprefix("# HELP ").removeprefix("# TYPE ") for line in text.splitlines())
    return sorted(name for name in names if not name.startswith(skip))


def apply(metrics: Metrics, op: tuple[str, str, str]) -> None:
    kind, resource, device = op
    if kind == "add":
        metrics.add_resource(resource)
    elif kind == "allocated":
        metrics.allocated(resource, [device])
    elif kind == "forget":
        metrics.forget_devices(resource, {device})
    elif kind == "remove":
        metrics.remove_resource(resource)
    elif kind == "restart":
        metrics.kubelet_restarts.inc()
    elif kind == "observe":
        metrics.allocate_duration.observe(0.0003)
    elif kind == "register":
        metrics.registrations.labels(resource, "success").inc()


def ops(rng: random.Random) -> list[tuple[str, str, str]]:
    kinds = ("add", "allocated", "forget", "remove", "restart", "observe", "register")
    return [(rng.choice(kinds), rng.choice(RESOURCES), f"d{rng.randrange(4)}") for _ in range(rng.randrange(1, 40))]


@pytest.mark.parametrize("seed", range(60))
def test_binding_anywhere_in_a_sequence_exports_what_binding_first_does(seed: int) -> None:
    rng = random.Random(seed)
    sequence = ops(rng)
    at = rng.randrange(len(sequence) + 1)
    first, late = Metrics(), Metrics()
    first.bind()
    for i, op in enumerate(sequence):
        if i == at:
            late.bind()
        apply(first, op)
        apply(late, op)
    assert scrape(late) == scrape(first)


def test_a_series_taken_before_bind_still_counts_after_it() -> None:
    metrics = Metrics()
    series = metrics.allocate_requests.labels(RESOURCES[0], "invalid")  # kept by a caller, as allocated() does
    series.inc()
    metrics.allocated(RESOURCES[0], ["a", "b"])  # its cached series are pending ones
    metrics.bind()
    series.inc()
    metrics.allocated(RESOURCES[0], ["a"])
    get = metrics.registry.get_sample_value
    assert get("colad_allocate_requests_total", {"resource": RESOURCES[0], "result": "invalid"}) == 2
    assert get("colad_allocate_requests_total", {"resource": RESOURCES[0], "result": "success"}) == 2
    assert get("colad_allocated_devices_total", {"resource": RESOURCES[0]}) == 3
    assert get("colad_device_allocations_total", {"resource": RESOURCES[0], "device_id": "a"}) == 2


def test_counts_made_by_other_threads_while_binding_land_once() -> None:
    for _ in range(20):
        metrics = Metrics()
        metrics.add_resource(RESOURCES[0])
        go = threading.Barrier(5)

        def count(metrics: Metrics = metrics, go: threading.Barrier = go) -> None:
            go.wait()
            for _ in range(500):
                metrics.allocated(RESOURCES[0], ["a"])
                metrics.allocate_duration.observe(0.001)

        threads = [threading.Thread(target=count) for _ in range(4)]
        for thread in threads:
            thread.start()
        go.wait()
        metrics.bind()
        for thread in threads:
            thread.join()
        get = metrics.registry.get_sample_value
        assert get("colad_allocate_requests_total", {"resource": RESOURCES[0], "result": "success"}) == 2000
        assert get("colad_device_allocations_total", {"resource": RESOURCES[0], "device_id": "a"}) == 2000
        assert get("colad_allocate_duration_seconds_count") == 2000


def test_a_series_removed_before_bind_is_not_exported() -> None:
    metrics = Metrics()
    metrics.add_resource(RESOURCES[0])
    metrics.list_cut.labels(RESOURCES[1]).inc()
    metrics.remove_resource(RESOURCES[0])
    metrics.list_cut.remove("never made")  # no error, as after bind (colad.metrics.registry._remove)
    text = generate_latest(metrics.registry).decode()
    assert RESOURCES[0] not in text
    assert metrics.registry.get_sample_value("colad_list_and_watch_cuts_total", {"resource": RESOURCES[1]}) == 1


def test_the_plugin_loads_no_prometheus_client_http_server_or_prepare_before_register(tmp_path: Path) -> None:
    """What `colad plugin` imports before its first Register: the CLI, the config, colad.plugin."""
    modules = loaded("colad.plugin.main", tmp_path)
    assert "colad.plugin.main" in modules and "grpc" in modules
    unwanted = (
        "prometheus_client",
        "colad.metrics.collectors",
        "colad.metrics.httpserver",
        "wsgiref",
        "http.server",
        "colad.cli.status",
        "xmlrpc.client",
        "colad.plugin.podresources",
        "colad.jobs.prestart",
        "colad.jobs.probes",
    )
    assert sorted(m for m in unwanted if m in modules) == []
