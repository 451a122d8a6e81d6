"""colad.metrics with a published snapshot: current state from StateCollector, counters as instruments.

Values are read the client_python way (registry.get_sample_value); the process
figures come from prometheus_client's ProcessCollector, labelled by role.
"""

from __future__ import annotations

import os

import pytest

from colad.core.inuse import InUse
from colad.metrics.registry import Metrics
from colad.outputs.statefile import ListCut, PluginState, ResourceState

pytestmark = pytest.mark.unit

COLA = "example.com/cola"


def test_state_gauges_follow_the_snapshot() -> None:
    state = [
        PluginState(
            pid=1,
            resources=(
                ResourceState(
                    name=COLA,
                    registered=True,
                    devices=5,
                    healthy=4,
                    open_streams=2,
                    last_registered=100.0,
                    cut=ListCut(size=300, wanted=5, dropped=1),
                ),
            ),
        )
    ]
    metrics = Metrics(snapshot=lambda: state[0])
    metrics.add_resource(COLA)
    value = metrics.registry.get_sample_value
    assert value("colad_devices", {"resource": COLA, "health": "Healthy"}) == 4
    assert value("colad_devices", {"resource": COLA, "health": "Unhealthy"}) == 1
    assert value("colad_registered", {"resource": COLA}) == 1
    assert value("colad_list_and_watch_streams", {"resource": COLA}) == 2
    assert value("colad_last_registration_timestamp_seconds", {"resource": COLA}) == 100.0
    assert value("colad_list_and_watch_message_bytes", {"resource": COLA}) == 300
    assert value("colad_list_and_watch_dropped_devices", {"resource": COLA}) == 1
    assert value("colad_allocate_requests_total", {"resource": COLA, "result": "success"}) == 0
    state[0] = PluginState(pid=1)  # a reload removed the resource: its state series are gone at once
    assert value("colad_registered", {"resource": COLA}) is None
    assert value("colad_devices", {"resource": COLA, "health": "Healthy"}) is None


def test_removal_drops_only_that_resources_series() -> None:
    metrics = Metrics()
    for name in (COLA, "example.com/pepsi"):
        metrics.add_resource(name)
        metrics.allocated(name, ["a", "b"])
    metrics.forget_devices(COLA, {"a"})
    value = metrics.registry.get_sample_value
    assert value("colad_device_allocations_total", {"resource": COLA, "device_id": "b"}) is None
    assert value("colad_device_allocations_total", {"resource": COLA, "device_id": "a"}) == 1
    metrics.remove_resource(COLA)
    metrics.remove_resource(COLA)  # twice: nothing left to remove is no error
    assert value("colad_device_allocations_total", {"resource": COLA, "device_id": "a"}) is None
    assert value("colad_registered", {"resource": COLA}) is None
    assert value("colad_allocate_requests_total", {"resource": COLA, "result": "success"}) is None
    assert value("colad_device_allocations_total", {"resource": "example.com/pepsi", "device_id": "b"}) == 1


def test_in_use_gauges_follow_the_published_view() -> None:
    metrics = Metrics()
    value = metrics.registry.get_sample_value
    assert value("colad_pod_resources_up") == 0  # not polled yet: down, nothing else
    assert value("colad_devices_in_use", {"resource": COLA}) is None
    metrics.in_use = lambda: InUse(True, ((COLA, 1),), ((COLA, "a", "ns", "pod", "c"),))
    labels = {"resource": COLA, "device_id": "a", "namespace": "ns", "pod": "pod", "container": "c"}
    assert value("colad_pod_resources_up") == 1
    assert value("colad_devices_in_use", {"resource": COLA}) == 1
    assert value("colad_device_holder_info", labels) == 1
    metrics.in_use = lambda: InUse(True)  # the holder and the resource are gone: so are their series
    assert value("colad_devices_in_use", {"resource": COLA}) is None
    assert value("colad_device_holder_info", labels) is None


def test_no_holder_series_without_per_device() -> None:
    metrics = Metrics(per_device=False)
    metrics.in_use = lambda: InUse(True, ((COLA, 1),), ((COLA, "a", "ns", "pod", "c"),))
    value = metrics.registry.get_sample_value
    assert value("colad_devices_in_use", {"resource": COLA}) == 1
    labels = {"resource": COLA, "device_id": "a", "namespace": "ns", "pod": "pod", "container": "c"}
    assert value("colad_device_holder_info", labels) is None


def test_process_figures_per_role_from_process_collector() -> None:
    metrics = Metrics()
    metrics.peers.update("discovery", os.getpid())
    value = metrics.registry.get_sample_value
    assert (value("colad_process_resident_memory_bytes", {"role": "plugin"}) or 0) > 0
    assert value("colad_process_open_fds", {"role": "discovery"}) is not None
    assert value("colad_process_cpu_seconds_total", {"role": "plugin"}) is not None
    assert value("colad_process_start_time_seconds", {"role": "supervisord"}) is not None
    metrics.peers.update("discovery", 2**22 + 12345)  # no such pid: absent, not zero
    assert value("colad_process_open_fds", {"role": "discovery"}) is None
