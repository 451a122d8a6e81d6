"""The plugin's Prometheus registry and custom collectors: state other components own, read at scrape time.

`PeerCollector`: the discovery and watcher counters that arrive as Stats
messages, the plugin's own queue and input counters, and every colad process'
figures (prometheus_client's ProcessCollector, labelled by role).
`StateCollector`: the current-state gauges from the plugin's published snapshot;
`InUseCollector`: the in-use view podresources.py publishes; `DraCollector`: DRA mode's claims and slices.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from typing import Protocol

from prometheus_client import CollectorRegistry, ProcessCollector
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from colad.core import constants
from colad.core.inuse import InUse
from colad.core.roles import DISCOVERY, PLUGIN, QUEUE_PEERS
from colad.outputs.statefile import PluginState

RESCAN_REASONS = ("start", "inotify", "overflow", "periodic", "directory", "followup", "hostpath", "probe")
# Discovery's health changes of a device (health.<reason>) and the files it could not write (write.<file>_failed).
HEALTH_REASONS = ("host_path", "probe", "recovered")
WRITE_FILES = ("cdi", "nfd")
INPUT_PREFIX = "input."


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


# ProcessCollector's family names (after "process_") -> colad's per-role family (name, help, type).
_PROCESS_FAMILIES = {
    "cpu_seconds": ("colad_process_cpu_seconds", "CPU time of each colad process.", "counter"),
    "resident_memory_bytes": ("colad_process_resident_memory_bytes", "Resident memory of each colad process.", "gauge"),
    "virtual_memory_bytes": ("colad_process_virtual_memory_bytes", "Virtual memory of each colad process.", "gauge"),
    "start_time_seconds": (
        "colad_process_start_time_seconds",
        "Start time of each colad process (Unix time).",
        "gauge",
    ),
    "open_fds": ("colad_process_open_fds", "Open file descriptors of each colad process.", "gauge"),
}


def _constant(pid: int) -> Callable[[], int]:
    return lambda: pid


class RoleProcesses:
    """Each colad process' figures, read by prometheus_client's own ProcessCollector and labelled by role.

    One unregistered ProcessCollector per pid (it reads the boot time once, when made);
    a process that is gone yields nothing, as ProcessCollector does for itself.
    """

    def __init__(self) -> None:
        self._by_pid: dict[int, ProcessCollector] = {}

    def collect(self, pids: dict[str, int]) -> Iterator[Metric]:
        families: dict[str, CounterMetricFamily | GaugeMetricFamily] = {}
        for key, (name, documentation, kind) in _PROCESS_FAMILIES.items():
            family = CounterMetricFamily if kind == "counter" else GaugeMetricFamily
            families[key] = family(name, documentation, labels=["role"])
        wanted = set(pids.values())
        self._by_pid = {pid: c for pid, c in self._by_pid.items() if pid in wanted}
        for role, pid in sorted(pids.items()):
            collector = self._by_pid.get(pid)
            if collector is None:
                collector = self._by_pid[pid] = ProcessCollector(pid=_constant(pid), registry=None)
            for metric in collector.collect():
                key = metric.name.removeprefix("process_").removesuffix("_total")
                if key in families and metric.samples:
                    families[key].add_metric([role], metric.samples[0].value)
        yield from families.values()


class PeerCollector:
    """Exports the discovery and watcher counters and every colad process' /proc figures."""

    def __init__(
        self,
        peers: Callable[[], tuple[dict[str, int], dict[str, dict[str, int]]]],
        own: Callable[[], dict[str, int]],
        own_inputs: Callable[[], dict[str, int]] = dict,
    ) -> None:
        self.peers = peers  # the neighbours' pids and latest counters, by role
        self.own = own  # the plugin's own queue counters, by event (every event, in order)
        self.own_inputs = own_inputs  # the plugin's own input rejections, by reason
        self.processes = RoleProcesses()

    def collect(self) -> Iterator[Metric]:
        pids, counters = self.peers()
        discovery = counters.get(DISCOVERY.name, {})
        yield _stats_family(
            "colad_discovery_rescans",
            "Device directory rescans by discovery, by reason.",
            "reason",
            discovery,
            {r: f"rescans.{r}" for r in RESCAN_REASONS},
        )
        yield _stats_family(
            "colad_device_health_changes",
            "Devices discovery turned Unhealthy (a missing host path, a failing probe) or Healthy again, by reason.",
            "reason",
            discovery,
            {r: f"health.{r}" for r in HEALTH_REASONS},
        )
        yield _stats_family(
            "colad_file_write_failures",
            "CDI spec and NFD feature file writes by discovery that failed (retried at the next change or rescan).",
            "file",
            discovery,
            {f: f"write.{f}_failed" for f in WRITE_FILES},
        )
        queue = CounterMetricFamily(
            "colad_queue_messages", "Local queue messages by process role and event.", labels=["role", "event"]
        )
        for event, value in self.own().items():
            queue.add_metric([PLUGIN.name, event], value)
        for role in QUEUE_PEERS:
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
            inputs.add_metric([PLUGIN.name, reason], value)
        for role in sorted(counters):
            for name, value in sorted(counters[role].items()):
                if name.startswith(INPUT_PREFIX) and len(name) > len(INPUT_PREFIX):
                    inputs.add_metric([role, name[len(INPUT_PREFIX) :]], value)
        yield inputs
        yield from _inotify_families(counters)
        yield from self.processes.collect({PLUGIN.name: os.getpid(), "supervisord": os.getppid(), **pids})


class StateCollector:
    """The current-state gauges of every resource, read from the plugin's published snapshot at scrape time.

    client_python's idiom for state another component owns: nothing to keep in step,
    and a resource a reload removed simply is not in the next snapshot.
    """

    def __init__(self, snapshot: Callable[[], PluginState]) -> None:
        self.snapshot = snapshot

    def collect(self) -> Iterator[Metric]:
        resources = self.snapshot().resources
        devices = GaugeMetricFamily(
            "colad_devices", "Devices advertised now, by resource and health.", labels=["resource", "health"]
        )
        streams = GaugeMetricFamily(
            "colad_list_and_watch_streams", "Open ListAndWatch streams, by resource.", labels=["resource"]
        )
        registered = GaugeMetricFamily(
            "colad_registered", "1 while the resource is registered with the kubelet, else 0.", labels=["resource"]
        )
        last = GaugeMetricFamily(
            "colad_last_registration_timestamp_seconds",
            "Unix time of the last successful Register, by resource.",
            labels=["resource"],
        )
        size = GaugeMetricFamily(
            "colad_list_and_watch_message_bytes",
            "Encoded size of the latest device list for the kubelet, by resource.",
            labels=["resource"],
        )
        dropped = GaugeMetricFamily(
            "colad_list_and_watch_dropped_devices",
            "Device IDs left out of the latest list to fit the kubelet's message limit, by resource.",
            labels=["resource"],
        )
        for r in resources:
            devices.add_metric([r.name, constants.HEALTHY], r.healthy)
            devices.add_metric([r.name, constants.UNHEALTHY], r.unhealthy)
            streams.add_metric([r.name], r.open_streams)
            registered.add_metric([r.name], 1 if r.registered else 0)
            if r.last_registered:
                last.add_metric([r.name], r.last_registered)
            size.add_metric([r.name], r.cut.size)
            dropped.add_metric([r.name], r.cut.dropped)
        yield from (devices, streams, registered, last, size, dropped)


class DraView(Protocol):
    """What DraCollector reads (colad/metrics/registry.py's DraState)."""

    @property
    def driver(self) -> str: ...
    @property
    def prepared_claims(self) -> int: ...
    @property
    def slices(self) -> int: ...
    @property
    def slices_current(self) -> bool: ...


class DraCollector:
    """DRA mode's current-state gauges, read at scrape time from what the DRA host holds (None: nothing
    served yet, so no samples)."""

    def __init__(self, snapshot: Callable[[], DraView | None]) -> None:
        self.snapshot = snapshot

    def collect(self) -> Iterator[Metric]:
        view = self.snapshot()
        prepared = GaugeMetricFamily(
            "colad_dra_prepared_claims", "Claims prepared now (DRA mode), by driver.", labels=["driver"]
        )
        slices = GaugeMetricFamily(
            "colad_dra_slices",
            "This node's ResourceSlices of the driver at the API server, as last synced (DRA mode).",
            labels=["driver"],
        )
        current = GaugeMetricFamily(
            "colad_dra_slices_current",
            "1 while the API server holds the device sets last published and no change is pending (DRA mode), else 0.",
            labels=["driver"],
        )
        if view is not None:
            prepared.add_metric([view.driver], view.prepared_claims)
            slices.add_metric([view.driver], view.slices)
            current.add_metric([view.driver], 1 if view.slices_current else 0)
        yield from (prepared, slices, current)


class InUseCollector:
    """The in-use gauges, read at scrape time from the InUse snapshot podresources.py publishes.

    A resource or holder that is gone is simply not in the next snapshot: no series to remove.
    `per_device` false leaves the holder family without samples (its labels are open-ended).
    """

    def __init__(self, snapshot: Callable[[], InUse], per_device: bool = True) -> None:
        self.snapshot = snapshot
        self.per_device = per_device

    def collect(self) -> Iterator[Metric]:
        view = self.snapshot()
        up = GaugeMetricFamily("colad_pod_resources_up", "1 while the kubelet's PodResources List answers, else 0.")
        up.add_metric([], 1 if view.up else 0)
        counts = GaugeMetricFamily(
            "colad_devices_in_use", "Physical devices held by at least one container, by resource.", labels=["resource"]
        )
        for resource, count in view.counts:
            counts.add_metric([resource], count)
        holders = GaugeMetricFamily(
            "colad_device_holder_info",
            "1 for each container that holds a device (off with metrics_per_device = false).",
            labels=["resource", "device_id", "namespace", "pod", "container"],
        )
        if self.per_device:
            for row in view.holders:
                holders.add_metric(list(row), 1)
        yield from (up, counts, holders)


def _inotify_families(counters: dict[str, dict[str, int]]) -> Iterator[Metric]:
    """Each watcher role's degraded mode: which inotify limit keeps a watch out now, and how often it began."""
    degraded = GaugeMetricFamily(
        "colad_inotify_degraded",
        f"1 while a kernel inotify limit keeps a role from watching, so it polls every {constants.DEGRADED_POLL_S:g}s.",
        labels=["role", "limit"],
    )
    reached = CounterMetricFamily(
        "colad_inotify_limit_reached",
        "Times a role entered the degraded mode (a kernel inotify limit kept a watch out).",
        labels=["role"],
    )
    for role in QUEUE_PEERS:
        got = counters.get(role, {})
        for limit in ("max_user_instances", "max_user_watches"):
            degraded.add_metric([role, limit], got.get(constants.INOTIFY_DEGRADED + limit, 0))
        reached.add_metric([role], got.get(constants.INOTIFY_LIMIT_REACHED, 0))
    yield degraded
    yield reached


def _stats_family(name: str, text: str, label: str, counters: dict[str, int], keys: dict[str, str]) -> Metric:
    """One counter family from a role's Stats counters: a series per label value, 0 until counted."""
    family = CounterMetricFamily(name, text, labels=[label])
    for value, key in keys.items():
        family.add_metric([value], counters.get(key, 0))
    return family
