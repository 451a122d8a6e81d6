"""Every colad metric, defined once on an explicit registry, plus the /metrics and /healthz server.

Only the plugin process imports this (discovery and the watcher stay free of
prometheus_client and gRPC). Their counters arrive as Stats messages over the
local queue and are exported here, together with the standard process
figures of every colad process, read from /proc by pid. Works with
prometheus-client 0.16 (Debian bookworm) and current releases: no newer API.
"""

from __future__ import annotations

import os
import socket
import socketserver
import threading
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    Info,
    PlatformCollector,
    ProcessCollector,
    make_wsgi_app,
)
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.metrics import MetricWrapperBase

from colad import __version__, constants, log

LOG = log.get(__name__)

LATENCY_BUCKETS = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0)
RESCAN_REASONS = ("start", "inotify", "overflow", "periodic", "directory", "followup")
SERVER_RESTART_REASONS = ("start", "kubelet_restart", "socket_removed", "stream_lost", "register_retry")
ALLOCATE_RESULTS = ("success", "not_found", "invalid")
QUEUE_EVENTS = ("sent", "received", "dropped", "rejected")
INPUT_PREFIX = "input."
PLUGIN_INPUT_REASONS = ("foreign_path",)  # the plugin's own: kubelet or run directory entries left alone


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


def _proc_figures(pid: int) -> dict[str, float] | None:
    """CPU seconds, RSS, virtual size, start time and open fds of `pid`, as ProcessCollector reads them."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as handle:
            parts = handle.read().split(b")")[-1].split()
        with open("/proc/stat", "rb") as handle:
            btime = next(float(line.split()[1]) for line in handle if line.startswith(b"btime"))
        fds = len(os.listdir(f"/proc/{pid}/fd"))
    except (OSError, StopIteration, IndexError, ValueError):
        return None
    ticks = os.sysconf("SC_CLK_TCK")
    page = os.sysconf("SC_PAGE_SIZE")
    return {
        "cpu": (float(parts[11]) + float(parts[12])) / ticks,
        "rss": float(parts[21]) * page,
        "vsize": float(parts[20]),
        "start": btime + float(parts[19]) / ticks,
        "fds": float(fds),
    }


class PeerCollector:
    """Exports the discovery and watcher counters and every colad process' /proc figures."""

    def __init__(
        self,
        peers: Peers,
        own: Callable[[], dict[str, int]],
        own_inputs: Callable[[], dict[str, int]] = dict,
    ) -> None:
        self.peers = peers
        self.own = own  # the plugin's own queue counters, by event
        self.own_inputs = own_inputs  # the plugin's own input rejections, by reason

    def collect(self) -> Iterator[Metric]:
        pids, counters = self.peers.snapshot()
        rescans = CounterMetricFamily(
            "colad_discovery_rescans", "Device directory rescans by discovery, by reason.", labels=["reason"]
        )
        discovery = counters.get("discovery", {})
        for reason in RESCAN_REASONS:
            rescans.add_metric([reason], discovery.get(f"rescans.{reason}", 0))
        yield rescans
        queue = CounterMetricFamily(
            "colad_queue_messages", "Local queue messages by process role and event.", labels=["role", "event"]
        )
        own = self.own()
        for event in QUEUE_EVENTS:
            queue.add_metric(["plugin", event], own.get(event, 0))
        for role in ("discovery", "kubelet-watch"):
            for event in ("sent", "dropped"):
                queue.add_metric([role, event], counters.get(role, {}).get(f"queue.{event}", 0))
        yield queue
        # Every "input.<reason>" counter a role sends (bad names, oversized snapshots, parse
        # timeouts, unusable directories...): the names are checked label-safe by messages.py.
        inputs = CounterMetricFamily(
            "colad_input_rejected",
            "Inputs a colad process refused or left alone (and went on), by process role and reason.",
            labels=["role", "reason"],
        )
        for reason, value in sorted(self.own_inputs().items()):
            inputs.add_metric(["plugin", reason], value)
        for role in sorted(counters):
            for name, value in sorted(counters[role].items()):
                if name.startswith(INPUT_PREFIX) and len(name) > len(INPUT_PREFIX):
                    inputs.add_metric([role, name[len(INPUT_PREFIX) :]], value)
        yield inputs
        pids = {"plugin": os.getpid(), "supervisord": os.getppid(), **pids}
        families: dict[str, CounterMetricFamily | GaugeMetricFamily] = {
            "cpu": CounterMetricFamily("colad_process_cpu_seconds", "CPU time of each colad process.", labels=["role"]),
            "rss": GaugeMetricFamily(
                "colad_process_resident_memory_bytes", "Resident memory of each colad process.", labels=["role"]
            ),
            "vsize": GaugeMetricFamily(
                "colad_process_virtual_memory_bytes", "Virtual memory of each colad process.", labels=["role"]
            ),
            "start": GaugeMetricFamily(
                "colad_process_start_time_seconds", "Start time of each colad process (Unix time).", labels=["role"]
            ),
            "fds": GaugeMetricFamily(
                "colad_process_open_fds", "Open file descriptors of each colad process.", labels=["role"]
            ),
        }
        for role, pid in sorted(pids.items()):
            figures = _proc_figures(pid)
            if figures is None:
                continue
            for key, family in families.items():
                family.add_metric([role], figures[key])
        yield from families.values()


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

    def __init__(self, registry: CollectorRegistry | None = None, *, per_device: bool = True) -> None:
        r = self.registry = registry if registry is not None else Registry()
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
        self.allocate_duration = Histogram(
            "colad_allocate_duration_seconds", "Time to answer Allocate.", buckets=LATENCY_BUCKETS, registry=r
        )
        self.preferred_duration = Histogram(
            "colad_preferred_allocation_duration_seconds",
            "Time to answer GetPreferredAllocation.",
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.devices = Gauge(
            "colad_devices", "Devices advertised now, by resource and health.", ["resource", "health"], registry=r
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
        self.streams = Gauge(
            "colad_list_and_watch_streams", "Open ListAndWatch streams, by resource.", ["resource"], registry=r
        )
        self.registered = Gauge(
            "colad_registered",
            "1 while the resource is registered with the kubelet, else 0.",
            ["resource"],
            registry=r,
        )
        self.last_registration = Gauge(
            "colad_last_registration_timestamp_seconds",
            "Unix time of the last successful Register, by resource.",
            ["resource"],
            registry=r,
        )
        Info("colad_build", "colad build and runtime versions.", registry=r).info(_versions())
        self.queue_events = dict.fromkeys(QUEUE_EVENTS, 0)
        self.input_rejected = dict.fromkeys(PLUGIN_INPUT_REASONS, 0)
        self.peers = Peers()
        r.register(PeerCollector(self.peers, lambda: dict(self.queue_events), lambda: dict(self.input_rejected)))
        # The ListAndWatch answer measured against the kubelet's 4 MiB receive limit (service.fit_list).
        self.list_bytes = Gauge(
            "colad_list_and_watch_message_bytes",
            "Encoded size of the latest device list for the kubelet, by resource.",
            ["resource"],
            registry=r,
        )
        self.list_dropped = Gauge(
            "colad_list_and_watch_dropped_devices",
            "Device IDs left out of the latest list to fit the kubelet's message limit, by resource.",
            ["resource"],
            registry=r,
        )
        self.list_cut = Counter(
            "colad_list_and_watch_cuts",
            "Device lists cut to fit the kubelet's message limit, by resource.",
            ["resource"],
            registry=r,
        )
        ProcessCollector(registry=r)
        PlatformCollector(registry=r)
        # The in-use view from the kubelet's PodResources API (podresources.py).
        self.pod_resources_up = Gauge(
            "colad_pod_resources_up", "1 while the kubelet's PodResources List answers, else 0.", registry=r
        )
        self.devices_in_use = Gauge(
            "colad_devices_in_use",
            "Physical devices held by at least one container, by resource.",
            ["resource"],
            registry=r,
        )
        self.device_holder_info = Gauge(
            "colad_device_holder_info",
            "1 for each container that holds a device (off with metrics_per_device = false).",
            ["resource", "device_id", "namespace", "pod", "container"],
            registry=r,
        )

    def add_resource(self, resource: str) -> None:
        """Create every series of a resource at zero, so dashboards and alerts see it from the start."""
        for health in (constants.HEALTHY, constants.UNHEALTHY):
            self.devices.labels(resource, health).set(0)
        for result in ALLOCATE_RESULTS:
            self.allocate_requests.labels(resource, result)
        for result in ("success", "failure"):
            self.registrations.labels(resource, result)
        for reason in SERVER_RESTART_REASONS:
            self.server_restarts.labels(resource, reason)
        self.allocated_devices.labels(resource)
        self.device_set_changes.labels(resource)
        self.streams.labels(resource).set(0)
        self.registered.labels(resource).set(0)
        self.list_bytes.labels(resource).set(0)
        self.list_dropped.labels(resource).set(0)
        self.list_cut.labels(resource)

    def remove_resource(self, resource: str) -> None:
        """Drop every series of a resource a reload removed."""
        for family in (
            self.devices,
            self.allocate_requests,
            self.registrations,
            self.server_restarts,
            self.allocated_devices,
            self.device_set_changes,
            self.streams,
            self.registered,
            self.last_registration,
            self.device_allocations,
            self.list_bytes,
            self.list_dropped,
            self.list_cut,
        ):
            _remove_where(family, lambda labels: labels[0] == resource)

    def allocated(self, resource: str, device_ids: Iterable[str]) -> None:
        ids = list(device_ids)
        self.allocate_requests.labels(resource, "success").inc()
        self.allocated_devices.labels(resource).inc(len(ids))
        if self.per_device:
            for device_id in ids:
                self.device_allocations.labels(resource, device_id).inc()

    def forget_devices(self, resource: str, present: set[str]) -> None:
        """Drop per-device series of devices that are gone, so labels stay bounded by the device count."""
        if not self.per_device:
            return
        _remove_where(self.device_allocations, lambda labels: labels[0] == resource and labels[1] not in present)

    def set_in_use(self, up: bool, counts: dict[str, int], holders: Iterable[tuple[str, str, str, str, str]]) -> None:
        """Publish the in-use view; series of gone resources and holders are removed (labels stay bounded).

        `holders` are (resource, device_id, namespace, pod, container); while the view is down pass
        empty `counts` and `holders`: unknown is absent, not zero.
        """
        self.pod_resources_up.set(1 if up else 0)
        _remove_where(self.devices_in_use, lambda labels: labels[0] not in counts)
        for resource, count in counts.items():
            self.devices_in_use.labels(resource).set(count)
        wanted = set(holders) if self.per_device else set()
        _remove_where(self.device_holder_info, lambda labels: labels not in wanted)
        for labels in wanted:
            self.device_holder_info.labels(*labels).set(1)


def _remove_where(family: MetricWrapperBase, doomed: Callable[[Sequence[str]], bool]) -> None:
    """Remove the series of `family` whose label values `doomed` picks, so labels stay bounded."""
    for labels in list(family._metrics):  # noqa: SLF001 - no public listing in prometheus-client 0.16
        if doomed(labels):
            family.remove(*labels)


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


class _Handler(WSGIRequestHandler):
    def log_message(self, format: str, *args: object) -> None:  # noqa: A002 - stdlib signature
        LOG.debug("http request", line=format % args)


class _ThreadingServer(socketserver.ThreadingMixIn, WSGIServer):
    daemon_threads = True


class _ThreadingServer6(_ThreadingServer):
    address_family = socket.AF_INET6


def parse_address(address: str) -> tuple[str, int]:
    host, _, port = address.rpartition(":")
    return host.strip("[]"), int(port)


class MetricsServer:
    """Serves /metrics and /healthz on the configured address; `health()` says (ok, reason)."""

    def __init__(self, metrics: Metrics, address: str, health: Callable[[], tuple[bool, str]]) -> None:
        self.metrics = metrics
        self.address = address
        self.health = health
        self.server: WSGIServer | None = None
        self.bound = ""
        self._stopping = False
        self._thread: threading.Thread | None = None
        self.failures = 0
        self._metrics_app = make_wsgi_app(metrics.registry)

    def app(self, environ: dict[str, object], start_response: Callable[..., object]) -> list[bytes]:
        path = str(environ.get("PATH_INFO", "/"))
        if path == "/healthz":
            ok, reason = self.health()
            status = "200 OK" if ok else "503 Service Unavailable"
            start_response(status, [("Content-Type", "text/plain; charset=utf-8")])
            return [(reason + "\n").encode()]
        if path == "/metrics":
            return self._metrics_app(environ, start_response)  # type: ignore[no-any-return]
        start_response("404 Not Found", [("Content-Type", "text/plain; charset=utf-8")])
        return [b"colad: see /metrics and /healthz\n"]

    def start(self) -> bool:
        """Bind and serve in a thread; False (logged) if the address cannot be bound."""
        host, port = parse_address(self.address)
        server_class = _ThreadingServer6 if ":" in host else _ThreadingServer
        try:
            self.server = make_server(host, port, self.app, server_class=server_class, handler_class=_Handler)
        except (OSError, UnicodeError) as exc:  # UnicodeError: getaddrinfo's idna codec on a bad host name
            self.failures += 1
            if self.failures == 1:  # then retried quietly on the plugin's safety timer
                LOG.error("metrics endpoint not available; retrying", address=self.address, error=exc)
            return False
        if self.failures:
            LOG.info("metrics endpoint available after retries", address=self.address, failures=self.failures)
        bound_host, bound_port = str(self.server.server_address[0]), int(self.server.server_address[1])
        self.bound = f"[{bound_host}]:{bound_port}" if ":" in bound_host else f"{bound_host}:{bound_port}"
        self._thread = threading.Thread(target=self._serve, name="metrics", daemon=True)
        self._thread.start()
        LOG.info("metrics listening", address=self.bound)
        return True

    def _serve(self) -> None:
        # handle_request() blocks until a client comes: an idle colad never wakes up here
        # (serve_forever would poll every 0.5 s). stop() wakes it with a connection.
        assert self.server is not None
        self.server.timeout = None
        while not self._stopping:
            self.server.handle_request()

    def stop(self) -> None:
        if self.server is None:
            return
        self._stopping = True
        host, port = parse_address(self.bound)
        host = {"0.0.0.0": "127.0.0.1", "::": "::1"}.get(host, host)
        try:
            socket.create_connection((host, port), timeout=1).close()
        except OSError:
            pass
        if self._thread is not None:
            self._thread.join(timeout=2)
        self.server.server_close()
        self.server = None
