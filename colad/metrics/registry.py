"""Every colad metric, defined once; the Prometheus registry behind them is built off the start's path.

`Metrics` counts from the moment it is made, without prometheus_client: each family keeps what it
counted until `bind()` builds the real registry (collectors.py, httpserver.py serve it) and replays
it there; from then on it hands calls to the real family. The plugin binds after its first Register.
Only the plugin process imports this. Works with prometheus-client 0.16 (Debian bookworm) and later.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from colad import __version__
from colad.core.inuse import DOWN, InUse
from colad.core.registration import EFFECTS, effect_name
from colad.outputs.statefile import PluginState
from colad.runtime import log

if TYPE_CHECKING:
    from prometheus_client import CollectorRegistry

LOG = log.get(__name__)
__all__ = ["DraState", "Family", "Metrics", "Peers", "parse_address"]

LATENCY_BUCKETS = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0)
SERVER_RESTART_REASONS = (
    "start",
    "kubelet_restart",
    "socket_removed",
    "stream_lost",
    "register_retry",
    "options_changed",
)
ALLOCATE_RESULTS = ("success", "not_found", "invalid")
# PreStartContainer: prepared, a prepare command failed or timed out, a device not advertised.
PRE_START_RESULTS = ("success", "failed", "timeout", "not_found", "busy")
# Allocate answers that named devices in the classic form because colad's CDI spec on disk did not list
# them (cdi.SpecReader's reasons).
CDI_FALLBACK_REASONS = ("missing", "unreadable", "invalid", "other_kind", "not_listed")
# The plugin's own: kubelet or run directory entries left alone; prepare programs not run, host paths
# not handed out (trust.py).
PLUGIN_INPUT_REASONS = ("foreign_path", "untrusted_program", "untrusted_host_path")
QUEUE_EVENTS = ("sent", "received", "dropped", "rejected")
# Connections to the metrics endpoint closed unserved (httpserver.py says when each applies).
HTTP_REFUSAL_REASONS = (
    "evicted",
    "timeout",
    "too_large",
    "bad_request",
    "busy",
    "fd_reserve",
    "accept_failed",
    "source_cap",
)
EFFECT_NAMES = tuple(effect_name(effect) for effect in EFFECTS)  # every effect the registration can ask for
# DRA mode: a claim's outcome (its error is logged with the claim), the slice writes the API server took,
# and the time to answer the kubelet, who gives each call 45 s.
DRA_RESULTS = ("success", "error")
SLICE_WRITE_VERBS = ("create", "update", "delete")
DRA_LATENCY_BUCKETS = (0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 20.0, 45.0)


def parse_address(address: str) -> tuple[str, int]:
    """host:port or [v6]:port of the metrics endpoint (config checks and httpserver.py)."""
    host, _, port = address.rpartition(":")
    return host.strip("[]"), int(port)


@dataclass(frozen=True)
class DraState:
    """What the DRA driver holds now, read at scrape time (collectors.DraCollector): no claim names."""

    driver: str
    prepared_claims: int = 0  # claims prepared now (in the checkpoint)
    slices: int = 0  # this node's ResourceSlices of the driver at the API server, as last synced
    slices_current: bool = False  # the API server holds the last device sets published, nothing pending


@dataclass
class Peers:
    """What the plugin knows of its neighbours: their pids and their latest counters."""

    pids: dict[str, int] = field(default_factory=dict)
    counters: dict[str, dict[str, int]] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def update(self, role: str, pid: int, counters: Iterable[tuple[str, int]] | None = None) -> None:
        with self.lock:
            self.pids[role] = pid
            if counters is not None:
                self.counters[role] = dict(counters)

    def snapshot(self) -> tuple[dict[str, int], dict[str, dict[str, int]]]:
        with self.lock:
            return dict(self.pids), {k: dict(v) for k, v in self.counters.items()}


class _Pending:
    """One series of a family not bound yet: its calls go to the family, which keeps or forwards them."""

    __slots__ = ("family", "values")

    def __init__(self, family: Family, values: tuple[str, ...]) -> None:
        self.family, self.values = family, values

    def inc(self, amount: float = 1.0) -> None:
        self.family.add(self.values, amount)

    def observe(self, value: float) -> None:
        self.family.add(self.values, value)


class Family:
    """A counter or histogram family: kept here until `bind` makes the prometheus_client one, then forwarded.

    Before: a counter series is its running sum, a histogram series its observations, each made
    (at zero) by `labels()` as prometheus_client does. `bind` replays them under the lock it
    counts under, so a call from another thread meanwhile lands once, before or after.
    """

    def __init__(
        self,
        kind: str,
        name: str,
        documentation: str,
        labelnames: tuple[str, ...] = (),
        buckets: tuple[float, ...] = (),
    ) -> None:
        self.kind, self.name, self.documentation = kind, name, documentation
        self.labelnames, self.buckets = labelnames, buckets
        self._lock = threading.Lock()
        self._pending: dict[tuple[str, ...], list[float]] = {}
        self.real: Any = None  # the prometheus_client family once bound

    def labels(self, *values: str) -> Any:
        real = self.real
        if real is not None:
            return real.labels(*values)
        with self._lock:
            if self.real is None:
                self._pending.setdefault(values, self._empty())
                return _Pending(self, values)
        return self.real.labels(*values)

    def inc(self, amount: float = 1.0) -> None:
        self.add((), amount)

    def observe(self, value: float) -> None:
        self.add((), value)

    def add(self, values: tuple[str, ...], amount: float) -> None:
        """Count (counter) or observe (histogram) `amount` on the series of `values`."""
        real = self.real
        if real is None:
            with self._lock:
                if self.real is None:
                    kept = self._pending.setdefault(values, self._empty())
                    if self.kind == "counter":
                        kept[0] += amount  # a sum: what a counter keeps, whatever the count of calls
                    else:
                        kept.append(amount)
                    return
                real = self.real
        series = real.labels(*values) if values else real
        series.inc(amount) if self.kind == "counter" else series.observe(amount)

    def _empty(self) -> list[float]:
        return [0.0] if self.kind == "counter" else []

    def remove(self, *values: str) -> None:
        """Drop one series (prometheus-client 0.16 raises KeyError for one never made; later ones do not)."""
        with self._lock:
            if self.real is None:
                self._pending.pop(values, None)
                return
        self.real.remove(*values)

    def bind(self, registry: CollectorRegistry) -> None:
        """Make the prometheus_client family on `registry` and replay what was counted before."""
        from prometheus_client import Counter, Histogram

        with self._lock:
            if self.kind == "counter":
                real: Any = Counter(self.name, self.documentation, self.labelnames, registry=registry)
            else:
                real = Histogram(
                    self.name, self.documentation, self.labelnames, buckets=self.buckets, registry=registry
                )
            for values, amounts in self._pending.items():
                series = real.labels(*values) if values else real
                for amount in amounts:
                    series.inc(amount) if self.kind == "counter" else series.observe(amount)
            self._pending = {}
            self.real = real


def _counter(name: str, documentation: str, *labelnames: str) -> Family:
    return Family("counter", name, documentation, labelnames)


class Metrics:
    """The plugin's metrics. Tests read them with `registry.get_sample_value(...)` (which binds)."""

    def __init__(
        self,
        registry: CollectorRegistry | None = None,
        *,
        per_device: bool = True,
        snapshot: Callable[[], PluginState] | None = None,
        dra: bool = False,
    ) -> None:
        self.per_device = per_device
        self.dra = dra  # DRA mode: its families are served too (device-plugin mode's output stays as it is)
        # Current state comes from published snapshots, read at scrape time (collectors.py): the
        # plugin's (devices, streams, registration, list size) and the in-use view's.
        empty = PluginState(pid=0)
        self.snapshot: Callable[[], PluginState] = snapshot or (lambda: empty)
        self.in_use: Callable[[], InUse] = lambda: DOWN  # podresources.InUseWatcher points it at its own
        self.allocate_requests = _counter(
            "colad_allocate_requests", "Allocate calls by resource and result.", "resource", "result"
        )
        self.allocated_devices = _counter(
            "colad_allocated_devices", "Devices (advertised IDs) handed out by successful Allocate calls.", "resource"
        )
        self.device_allocations = _counter(
            "colad_device_allocations",
            "Successful allocations of each advertised device ID (off with metrics_per_device = false).",
            "resource",
            "device_id",
        )
        self.check_allocations = _counter(
            "colad_check_allocate_requests",
            "Allocate calls made by `colad check` (kept out of the allocation counters).",
        )
        self.pre_start_requests = _counter(
            "colad_pre_start_requests",
            "PreStartContainer calls by resource and result (failed/timeout: the prepare command's).",
            "resource",
            "result",
        )
        self.cdi_fallbacks = _counter(
            "colad_cdi_fallbacks",
            "Allocate answers that gave devices in the classic form, colad's CDI spec on disk not listing them.",
            "resource",
            "reason",
        )
        self.allocate_duration = Family(
            "histogram", "colad_allocate_duration_seconds", "Time to answer Allocate.", buckets=LATENCY_BUCKETS
        )
        self.preferred_duration = Family(
            "histogram",
            "colad_preferred_allocation_duration_seconds",
            "Time to answer GetPreferredAllocation.",
            buckets=LATENCY_BUCKETS,
        )
        self.device_set_changes = _counter(
            "colad_device_set_changes", "Changes of the advertised device set.", "resource"
        )
        self.registrations = _counter(
            "colad_registrations", "Register calls to the kubelet by resource and result.", "resource", "result"
        )
        self.kubelet_restarts = _counter(
            "colad_kubelet_restarts", "Times a new kubelet.sock was seen (a kubelet restart)."
        )
        self.server_restarts = _counter(
            "colad_plugin_server_restarts",
            "Times the gRPC server was started on a new socket, by reason.",
            "resource",
            "reason",
        )
        self.list_cut = _counter(
            "colad_list_and_watch_cuts", "Device lists cut to fit the kubelet's message limit, by resource.", "resource"
        )
        self.rpc_errors = _counter(
            "colad_rpc_errors",
            "gRPC calls served or made that ended in an error, by method and status code (INTERNAL: a colad bug "
            "or an undecodable message; INVALID_ANSWER: a kubelet answer with entries colad could not use).",
            "method",
            "code",
        )
        self.http_refused = _counter(
            "colad_http_connections_refused",
            "Connections to the metrics endpoint closed without an answer to their request, by reason.",
            "reason",
        )
        for reason in HTTP_REFUSAL_REASONS:
            self.http_refused.labels(reason)
        self.state_file_failures = _counter(
            "colad_state_file_write_failures", "Writes of the plugin's state file that failed (each is retried)."
        )
        self.thread_failures = _counter(
            "colad_plugin_thread_failures",
            "Threads of the plugin that ended with an error (a gRPC server's is replaced).",
        )
        self.effect_failures = _counter(
            "colad_registration_effect_failures",
            "Effects of the registration life cycle the plugin could not carry out (then backed off and retried).",
            "resource",
            "effect",
        )
        self.dra_api_errors = _counter(
            "colad_dra_api_errors",
            "Calls to the API server (DRA mode) that failed, by verb (list, watch, get, create, update, delete, "
            "sync) and code (the HTTP status, unreachable, or the exception of a colad bug).",
            "verb",
            "code",
        )
        self.dra_registration_refusals = _counter(
            "colad_dra_registration_refusals",
            "Registrations of the DRA driver the kubelet refused (NotifyRegistrationStatus registered=false); "
            "each is retried after a back-off.",
            "driver",
        )
        self.dra_prepares = _counter(
            "colad_dra_prepare_claims",
            "Claims NodePrepareResources was asked to prepare (DRA mode), by driver and result (success, error: "
            "the claim's error is logged with it).",
            "driver",
            "result",
        )
        self.dra_unprepares = _counter(
            "colad_dra_unprepare_claims",
            "Claims NodeUnprepareResources was asked to unprepare (DRA mode), by driver and result (success, error).",
            "driver",
            "result",
        )
        self.dra_prepare_duration = Family(
            "histogram",
            "colad_dra_prepare_duration_seconds",
            "Time to answer NodePrepareResources (DRA mode), by driver.",
            ("driver",),
            DRA_LATENCY_BUCKETS,
        )
        self.dra_unprepare_duration = Family(
            "histogram",
            "colad_dra_unprepare_duration_seconds",
            "Time to answer NodeUnprepareResources (DRA mode), by driver.",
            ("driver",),
            DRA_LATENCY_BUCKETS,
        )
        self.dra_slice_writes = _counter(
            "colad_dra_slice_writes",
            "Writes of this node's ResourceSlices the API server accepted (DRA mode), by driver and verb "
            "(create, update, delete).",
            "driver",
            "verb",
        )
        # DRA mode's current state: the DRA host points it at its own (None: nothing served yet).
        self.dra_state: Callable[[], DraState | None] = lambda: None
        # The label values colad created where they are open-ended, so their series can be removed
        # without reading the library's private tables. Written from the gRPC and in-use threads.
        self._lock = threading.Lock()
        self._device_ids: dict[str, set[str]] = {}
        self._allocated_series: dict[str, tuple[Any, Any]] = {}  # resource -> its Allocate success series
        self._device_series: dict[tuple[str, str], Any] = {}  # (resource, device ID) -> its allocations series
        self.queue_events = dict.fromkeys(QUEUE_EVENTS, 0)
        self.input_rejected = dict.fromkeys(PLUGIN_INPUT_REASONS, 0)
        self.peers = Peers()
        self._registry: CollectorRegistry | None = None
        self._bind_lock = threading.Lock()
        if registry is not None:
            self.bind(registry)

    def families(self) -> tuple[Family, ...]:
        return (
            self.allocate_requests,
            self.allocated_devices,
            self.device_allocations,
            self.check_allocations,
            self.pre_start_requests,
            self.cdi_fallbacks,
            self.allocate_duration,
            self.preferred_duration,
            self.device_set_changes,
            self.registrations,
            self.kubelet_restarts,
            self.server_restarts,
            self.list_cut,
            self.rpc_errors,
            self.http_refused,
            self.state_file_failures,
            self.effect_failures,
            self.thread_failures,
        ) + (self.dra_families() if self.dra else ())

    def dra_families(self) -> tuple[Family, ...]:
        """The families served in DRA mode only (device-plugin mode's output stays as it is)."""
        return (
            self.dra_api_errors,
            self.dra_registration_refusals,
            self.dra_prepares,
            self.dra_unprepares,
            self.dra_prepare_duration,
            self.dra_unprepare_duration,
            self.dra_slice_writes,
        )

    @property
    def bound(self) -> bool:
        return self._registry is not None

    @property
    def registry(self) -> CollectorRegistry:
        """The Prometheus registry, built (and every count so far replayed) on first use."""
        return self._registry if self._registry is not None else self.bind()

    def bind(self, registry: CollectorRegistry | None = None) -> CollectorRegistry:
        """Import prometheus_client, build the registry and hand every family over to it; once."""
        with self._bind_lock:
            if self._registry is not None:
                return self._registry
            from prometheus_client import Info, PlatformCollector, ProcessCollector

            from colad.metrics import collectors

            r = registry if registry is not None else collectors.Registry()
            r.register(collectors.StateCollector(self.snapshot))
            r.register(collectors.InUseCollector(lambda: self.in_use(), self.per_device))
            for family in self.families():
                family.bind(r)
            if self.dra:
                r.register(collectors.DraCollector(lambda: self.dra_state()))
            Info("colad_build", "colad build and runtime versions.", registry=r).info(_versions())
            own = lambda: dict(self.queue_events)  # noqa: E731
            r.register(collectors.PeerCollector(self.peers.snapshot, own, lambda: dict(self.input_rejected)))
            ProcessCollector(registry=r)
            PlatformCollector(registry=r)
            self._allocated_series.clear()  # looked up again, now on the real families
            self._device_series.clear()
            self._registry = r
            return r

    def serve_dra(self) -> None:
        """DRA mode from now on (a reload into it): its families are served too, from then on."""
        with self._bind_lock:
            if self.dra:
                return
            self.dra = True
            if self._registry is not None:
                from colad.metrics import collectors

                for family in self.dra_families():
                    family.bind(self._registry)
                self._registry.register(collectors.DraCollector(lambda: self.dra_state()))

    def add_driver(self, driver: str) -> None:
        """Create every series of a DRA driver at zero, so dashboards and alerts see it from the start."""
        self.dra_registration_refusals.labels(driver)
        for result in DRA_RESULTS:
            self.dra_prepares.labels(driver, result)
            self.dra_unprepares.labels(driver, result)
        for verb in SLICE_WRITE_VERBS:
            self.dra_slice_writes.labels(driver, verb)
        self.dra_prepare_duration.labels(driver)
        self.dra_unprepare_duration.labels(driver)

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
        for effect in EFFECT_NAMES:
            self.effect_failures.labels(resource, effect)
        self.allocated_devices.labels(resource)
        self.device_set_changes.labels(resource)
        self.list_cut.labels(resource)

    def remove_resource(self, resource: str) -> None:
        """Drop every series of a resource a reload removed (the label values colad itself created)."""
        self._allocated_series.pop(resource, None)
        with self._lock:
            for key in [k for k in self._device_series if k[0] == resource]:
                del self._device_series[key]
        for family, values in (
            (self.allocate_requests, [(resource, r) for r in ALLOCATE_RESULTS]),
            (self.pre_start_requests, [(resource, r) for r in PRE_START_RESULTS]),
            (self.registrations, [(resource, r) for r in ("success", "failure")]),
            (self.server_restarts, [(resource, r) for r in SERVER_RESTART_REASONS]),
            (self.cdi_fallbacks, [(resource, r) for r in CDI_FALLBACK_REASONS]),
            (self.effect_failures, [(resource, e) for e in EFFECT_NAMES]),
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
        if not self.per_device:
            return
        kept = self._device_series
        for device_id in ids:
            # Known series from the dict; under the lock only a new one, made and named in _device_ids at once,
            # so forget_devices, which drops both under the lock, never leaves a series it does not know of.
            child = kept.get((resource, device_id))
            if child is None:
                with self._lock:
                    self._device_ids.setdefault(resource, set()).add(device_id)
                    child = kept[(resource, device_id)] = self.device_allocations.labels(resource, device_id)
            child.inc()

    def forget_devices(self, resource: str, present: set[str]) -> None:
        """Drop per-device series of devices that are gone, so labels stay bounded by the device count."""
        if not self.per_device:
            return
        with self._lock:
            known = self._device_ids.get(resource, set())
            gone = known - present
            known &= present
            for device_id in gone:
                self._device_series.pop((resource, device_id), None)
        for device_id in sorted(gone):
            _remove(self.device_allocations, resource, device_id)


def _remove(family: Family, *labels: str) -> None:
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
