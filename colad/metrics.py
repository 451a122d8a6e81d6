"""Every colad metric, defined once on an explicit registry (served by httpserver.py).

Only the plugin process imports this: discovery and the watcher stay free of prometheus_client;
their counters arrive as Stats messages and are exported by collectors.py, with the process
figures of every colad role. Works with prometheus-client 0.16 (Debian bookworm) and current
releases: no newer API.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Histogram,
    Info,
    PlatformCollector,
    ProcessCollector,
)
from prometheus_client.core import Metric
from prometheus_client.metrics import MetricWrapperBase

from colad import __version__, log
from colad.collectors import QUEUE_EVENTS, InUseCollector, PeerCollector, Peers, StateCollector
from colad.httpserver import parse_address
from colad.inuse import DOWN, InUse
from colad.statefile import PluginState

LOG = log.get(__name__)
# parse_address is re-exported for tests/unit/test_kubernetes_manifests.py, which imports it from here.
__all__ = ["Metrics", "Registry", "parse_address"]

LATENCY_BUCKETS = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0)
SERVER_RESTART_REASONS = (
    "start", "kubelet_restart", "socket_removed", "stream_lost", "register_retry", "options_changed",
)  # fmt: skip
ALLOCATE_RESULTS = ("success", "not_found", "invalid")
# PreStartContainer: prepared, a prepare command failed or timed out, a device not advertised.
PRE_START_RESULTS = ("success", "failed", "timeout", "not_found")
# Allocate answers that named devices in the classic form because colad's CDI spec on disk did not list
# them (cdi.SpecReader's reasons).
CDI_FALLBACK_REASONS = ("missing", "unreadable", "invalid", "other_kind", "not_listed")
PLUGIN_INPUT_REASONS = ("foreign_path",)  # the plugin's own: kubelet or run directory entries left alone


class Registry(CollectorRegistry):
    """A registry without the `_created` samples client_python adds to every counter and histogram.

    They double the series count for no use here, and prometheus-client 0.16
    (Debian bookworm) has no switch to turn them off; filtering them here works
    the same on every version.
    """

    def collect(self) -> Iterator[Metric]:
        for metric in super().collect():
            samples = [s for s in metric.samples if not s.name.endswith("_created")]
            if len(samples) != len(metric.samples):
                trimmed = Metric(metric.name, metric.documentation, metric.type, metric.unit)
                trimmed.samples = samples
                metric = trimmed
            yield metric


class Metrics:
    """The plugin's metrics. Tests read them with `registry.get_sample_value(...)`."""

    def __init__(
        self,
        registry: CollectorRegistry | None = None,
        *,
        per_device: bool = True,
        snapshot: Callable[[], PluginState] | None = None,
    ) -> None:
        r = self.registry = registry if registry is not None else Registry()
        # Current state comes from published snapshots, read at scrape time (collectors.py): the
        # plugin's (devices, streams, registration, list size) and the in-use view's.
        empty = PluginState(pid=0)
        r.register(StateCollector(snapshot or (lambda: empty)))
        self.in_use: Callable[[], InUse] = lambda: DOWN  # podresources.InUseWatcher points it at its own
        r.register(InUseCollector(lambda: self.in_use(), per_device))
        self.per_device = per_device
        self.allocate_requests = Counter(
            "colad_allocate_requests", "Allocate calls by resource and result.", ["resource", "result"], registry=r
        )
        self.allocated_devices = Counter(
            "colad_allocated_devices",
            "Devices (advertised IDs) handed out by successful Allocate calls.",
            ["resource"],
            registry=r,
        )
        self.device_allocations = Counter(
            "colad_device_allocations",
            "Successful allocations of each advertised device ID (off with metrics_per_device = false).",
            ["resource", "device_id"],
            registry=r,
        )
        self.check_allocations = Counter(
            "colad_check_allocate_requests",
            "Allocate calls made by `colad check` (kept out of the allocation counters).",
            registry=r,
        )
        self.pre_start_requests = Counter(
            "colad_pre_start_requests",
            "PreStartContainer calls by resource and result (failed/timeout: the prepare command's).",
            ["resource", "result"],
            registry=r,
        )
        self.cdi_fallbacks = Counter(
            "colad_cdi_fallbacks",
            "Allocate answers that gave devices in the classic form, colad's CDI spec on disk not listing them.",
            ["resource", "reason"],
            registry=r,
        )
        self.allocate_duration = Histogram(
            "colad_allocate_duration_seconds", "Time to answer Allocate.", buckets=LATENCY_BUCKETS, registry=r
        )
        self.preferred_duration = Histogram(
            "colad_preferred_allocation_duration_seconds",
            "Time to answer GetPreferredAllocation.",
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.device_set_changes = Counter(
            "colad_device_set_changes", "Changes of the advertised device set.", ["resource"], registry=r
        )
        self.registrations = Counter(
            "colad_registrations",
            "Register calls to the kubelet by resource and result.",
            ["resource", "result"],
            registry=r,
        )
        self.kubelet_restarts = Counter(
            "colad_kubelet_restarts", "Times a new kubelet.sock was seen (a kubelet restart).", registry=r
        )
        self.server_restarts = Counter(
            "colad_plugin_server_restarts",
            "Times the gRPC server was started on a new socket, by reason.",
            ["resource", "reason"],
            registry=r,
        )
        # The label values colad created where they are open-ended, so their series can be removed
        # without reading the library's private tables. Written from the gRPC and in-use threads.
        self._lock = threading.Lock()
        self._device_ids: dict[str, set[str]] = {}
        self._allocated_series: dict[str, tuple[Any, Any]] = {}  # resource -> its Allocate success series
        Info("colad_build", "colad build and runtime versions.", registry=r).info(_versions())
        self.queue_events = dict.fromkeys(QUEUE_EVENTS, 0)
        self.input_rejected = dict.fromkeys(PLUGIN_INPUT_REASONS, 0)
        self.peers = Peers()
        r.register(PeerCollector(self.peers, lambda: dict(self.queue_events), lambda: dict(self.input_rejected)))
        self.list_cut = Counter(
            "colad_list_and_watch_cuts",
            "Device lists cut to fit the kubelet's message limit, by resource.",
            ["resource"],
            registry=r,
        )
        ProcessCollector(registry=r)
        PlatformCollector(registry=r)

    def add_resource(self, resource: str) -> None:
        """Create every series of a resource at zero, so dashboards and alerts see it from the start."""
        for result in ALLOCATE_RESULTS:
            self.allocate_requests.labels(resource, result)
        for result in PRE_START_RESULTS:
            self.pre_start_requests.labels(resource, result)
        for result in ("success", "failure"):
            self.registrations.labels(resource, result)
        for reason in SERVER_RESTART_REASONS:
            self.server_restarts.labels(resource, reason)
        for reason in CDI_FALLBACK_REASONS:
            self.cdi_fallbacks.labels(resource, reason)
        self.allocated_devices.labels(resource)
        self.device_set_changes.labels(resource)
        self.list_cut.labels(resource)

    def remove_resource(self, resource: str) -> None:
        """Drop every series of a resource a reload removed (the label values colad itself created)."""
        self._allocated_series.pop(resource, None)
        for family, values in (
            (self.allocate_requests, [(resource, r) for r in ALLOCATE_RESULTS]),
            (self.pre_start_requests, [(resource, r) for r in PRE_START_RESULTS]),
            (self.registrations, [(resource, r) for r in ("success", "failure")]),
            (self.server_restarts, [(resource, r) for r in SERVER_RESTART_REASONS]),
            (self.cdi_fallbacks, [(resource, r) for r in CDI_FALLBACK_REASONS]),
            (self.device_allocations, [(resource, d) for d in sorted(self._device_ids.pop(resource, set()))]),
        ):
            for labels in values:
                _remove(family, *labels)
        for family in (
            self.allocated_devices,
            self.device_set_changes,
            self.list_cut,
        ):
            _remove(family, resource)

    def allocated(self, resource: str, device_ids: Iterable[str]) -> None:
        ids = list(device_ids)
        # The resource's two series, looked up once (labels() takes the family's lock and builds a key each call).
        series = self._allocated_series.get(resource)
        if series is None:
            series = self._allocated_series[resource] = (
                self.allocate_requests.labels(resource, "success"),
                self.allocated_devices.labels(resource),
            )
        series[0].inc()
        series[1].inc(len(ids))
        if self.per_device:
            with self._lock:
                self._device_ids.setdefault(resource, set()).update(ids)
            for device_id in ids:
                self.device_allocations.labels(resource, device_id).inc()

    def forget_devices(self, resource: str, present: set[str]) -> None:
        """Drop per-device series of devices that are gone, so labels stay bounded by the device count."""
        if not self.per_device:
            return
        with self._lock:
            known = self._device_ids.get(resource, set())
            gone = known - present
            known &= present
        for device_id in sorted(gone):
            _remove(self.device_allocations, resource, device_id)


def _remove(family: MetricWrapperBase, *labels: str) -> None:
    """Remove one series, if it is there (prometheus-client raises KeyError for one never made)."""
    try:
        family.remove(*labels)
    except KeyError:
        pass


def _versions() -> dict[str, str]:
    import platform

    import grpc
    from google import protobuf

    return {
        "version": __version__,
        "python": platform.python_version(),
        "grpcio": grpc.__version__,
        "protobuf": protobuf.__version__,
    }
