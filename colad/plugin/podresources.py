"""The in-use view, I/O shell: polls the kubelet's PodResources API from a daemon thread of the plugin.

Every `pod_resources_interval` seconds it calls List on `pod_resources_socket` (and, once per
connection, GetAllocatableResources), hands plain tuples to the pure core (inuse.py), logs
hand-overs, publishes an InUse snapshot for /metrics and writes run_dir/state/inuse.json for `colad status`.
An absent or old kubelet degrades to "unavailable" with one log line, never a crash. Calls go through
rpc.Client (each failure counted in colad_rpc_errors_total); the answer is checked entry by entry where it
becomes plain tuples (assignments_of): an entry colad cannot use is skipped, counted and told once.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable

import grpc

from colad.api import podresources_pb2 as pb
from colad.config.config import Config
from colad.core import inuse
from colad.core.devices import request_id_problem
from colad.core.errors import CallError
from colad.core.names import is_dns1123_subdomain
from colad.metrics.registry import Metrics
from colad.outputs import statefile
from colad.runtime import log, rpc

LOG = log.get(__name__)

# Seconds any PodResources call may take: the kubelet answers from memory.
CALL_DEADLINE_S = 2.0
# The kubelet's own PodResources clients raise grpc-go's 4 MiB receive limit for nodes with many pods
# (k8s.io/kubelet pkg/apis/podresources client.go callers); so does colad.
MAX_RECEIVE_BYTES = 16 * 1024 * 1024
NO_ALLOCATABLE = "kubelet has no GetAllocatableResources (older than 1.23); in-use view from List only"
POD_RESOURCES_SERVICE = pb.DESCRIPTOR.services_by_name["PodResourcesLister"]
LIST = rpc.method_name(POD_RESOURCES_SERVICE, POD_RESOURCES_SERVICE.methods_by_name["List"])


class InUseWatcher:
    """Polls List and publishes who holds each device of `resources()` (the resource names colad serves)."""

    def __init__(
        self,
        cfg: Config,
        metrics: Metrics,
        resources: Callable[[], set[str]],
        *,
        wall: Callable[[], float] = time.time,
    ) -> None:
        self.socket_path = cfg.pod_resources_socket
        self.interval = cfg.pod_resources_interval
        self.state_path = cfg.inuse_state_file
        self.resources = resources
        self.wall = wall
        self.view: dict[inuse.Key, frozenset[inuse.Holder]] = {}  # last known, kept while unavailable
        self.available: bool | None = None  # None: not polled yet
        self.reason = "not polled yet"
        # Replaced whole on every poll (one assignment), read by /metrics from another thread.
        self.in_use: inuse.InUse = inuse.DOWN
        metrics.in_use = lambda: self.in_use
        self.told_no_allocatable = False
        self.metrics = metrics
        self.skipped = 0  # entries of the last answer colad could not use (told when it becomes non-zero)
        self._channel: grpc.Channel | None = None
        self._client: rpc.Client | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        if not self.socket_path:
            self.reason = "off (pod_resources_socket is empty)"
            LOG.info("in-use view off", reason="pod_resources_socket is empty")
            self.available = False
            self.in_use = inuse.DOWN
            self._write_state()
            return
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, name="inuse", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=CALL_DEADLINE_S * 2 + 1)
            self._thread = None
        self._close()

    def _run(self) -> None:
        failed = ""
        while True:
            try:
                self.poll()
            except Exception as exc:  # the thread's loop boundary: one line and a count, keep polling
                self.metrics.rpc_errors.labels(LIST, "INTERNAL").inc()
                error = rpc.failure(exc)
                # Said once while it repeats (every poll would be a line every interval): counted each time.
                (LOG.error if error != failed else LOG.debug)(
                    "in-use poll failed: a colad bug", method=LIST, error=error
                )
                failed = error
            else:
                failed = ""
            if self._stop.wait(self.interval):
                return

    def poll(self) -> None:
        """One List call and everything that follows from it."""
        served = set(self.resources())
        fresh = self._channel is None
        try:
            if fresh and not os.path.exists(self.socket_path):
                self._down(f"no socket at {self.socket_path}")
                return
            client = self._connect()
            response = client.call("List", pb.ListPodResourcesRequest(), CALL_DEADLINE_S)
        except CallError as exc:
            self._close()  # dial again next time: grpc's own reconnect back-off grows to minutes
            self._down(str(exc) if os.path.exists(self.socket_path) else f"no socket at {self.socket_path}")
            return
        if fresh:
            self._log_allocatable(client, served)
        assignments, skipped = assignments_of(response, served)
        self._note_skipped(skipped)
        view = inuse.holders(assignments, served)
        self._up()
        for change in inuse.diff(self.view, view):
            _log_change(change)
        self.view = view
        self.in_use = inuse.in_use_of(view, served)
        self._write_state()

    def _connect(self) -> rpc.Client:
        if self._client is None:
            self._channel = grpc.insecure_channel(
                "unix:" + self.socket_path,
                options=[
                    ("grpc.max_receive_message_length", MAX_RECEIVE_BYTES),
                    ("grpc.default_authority", "localhost"),
                ],
            )
            self._client = rpc.Client(self._channel, POD_RESOURCES_SERVICE, pb, self.metrics.rpc_errors)
        return self._client

    def _close(self) -> None:
        channel, self._channel, self._client = self._channel, None, None
        if channel is not None:
            channel.close()

    def _log_allocatable(self, client: rpc.Client, served: set[str]) -> None:
        """Once per connection: what the kubelet thinks is allocatable, for comparison with what colad serves."""
        try:
            answer = client.call("GetAllocatableResources", pb.AllocatableResourcesRequest(), CALL_DEADLINE_S)
        except CallError as exc:
            if exc.code == "UNIMPLEMENTED":
                if not self.told_no_allocatable:
                    LOG.info(NO_ALLOCATABLE)
                    self.told_no_allocatable = True
                else:
                    LOG.debug(NO_ALLOCATABLE)
            else:
                LOG.debug("GetAllocatableResources failed", error=str(exc))
            return
        counts = dict.fromkeys(served, 0)
        for devices in answer.devices:
            if devices.resource_name in counts:
                counts[devices.resource_name] += len(set(devices.device_ids))
        for resource, count in sorted(counts.items()):
            LOG.info("kubelet allocatable devices", resource=resource, devices=count)

    def _note_skipped(self, skipped: list[str]) -> None:
        """Entries of a List answer colad could not use: counted per answer, told when they first appear."""
        if skipped:
            self.metrics.rpc_errors.labels(LIST, "INVALID_ANSWER").inc()
            (LOG.warning if not self.skipped else LOG.debug)(
                "pod resources answer has entries colad cannot use; skipped",
                method=LIST,
                entries=len(skipped),
                first=skipped[0],
            )
        self.skipped = len(skipped)

    def _up(self) -> None:
        if self.available is not True:
            LOG.info("pod resources available", socket=self.socket_path)
        self.available, self.reason = True, ""

    def _down(self, reason: str) -> None:
        if self.available is not False:  # one warning per outage, then quiet until it recovers
            LOG.warning(
                "pod resources unavailable; no in-use view until the kubelet answers",
                socket=self.socket_path,
                reason=reason,
            )
        else:
            LOG.debug("pod resources still unavailable", socket=self.socket_path, reason=reason)
        self.available, self.reason = False, reason
        self.in_use = inuse.DOWN  # unknown is absent, not zero
        self._write_state()

    def _write_state(self) -> None:
        body = inuse.state(
            self.view if self.available else {}, available=bool(self.available), reason=self.reason, updated=self.wall()
        )
        statefile.write_json(self.state_path, body)


def assignments_of(response: pb.ListPodResourcesResponse, served: set[str]) -> tuple[list[inuse.Assignment], list[str]]:
    """The entries of the served resources as plain tuples, and why each one that cannot be used was skipped.

    Names are Kubernetes object names (DNS-1123, which bounds them) and device IDs ones colad could have
    advertised: anything else did not come from colad and the API server, and goes nowhere (logs, metric
    labels, the state file).
    """
    kept: list[inuse.Assignment] = []
    skipped: list[str] = []
    for p, pod in enumerate(response.pod_resources):
        for c, container in enumerate(pod.containers):
            for d, devices in enumerate(container.devices):
                if devices.resource_name not in served:
                    continue
                field = f"pod_resources[{p}].containers[{c}].devices[{d}]"
                names = (("namespace", pod.namespace), ("name", pod.name), ("container", container.name))
                problem = next((f"{n} is not a Kubernetes name" for n, v in names if not is_dns1123_subdomain(v)), None)
                ids = tuple(devices.device_ids)
                for i, device_id in enumerate(ids):
                    if problem is None and (why := request_id_problem(device_id)) is not None:
                        problem = f"device_ids[{i}]: {why}"
                if problem is not None:
                    skipped.append(f"{field}: {problem}")
                    continue
                kept.append((pod.namespace, pod.name, container.name, devices.resource_name, ids))
    return kept, skipped


def _log_change(change: inuse.Change) -> None:
    fields: dict[str, object] = {
        "resource": change.resource_name,
        "device": change.device_id,
        "namespace": change.holder.namespace,
        "pod": change.holder.pod,
        "container": change.holder.container,
    }
    if change.kind == "changed_hands" and change.previous is not None:
        previous = change.previous
        LOG.info(
            "device changed hands",
            **fields,
            from_namespace=previous.namespace,
            from_pod=previous.pod,
            from_container=previous.container,
        )
    elif change.kind == "in_use":
        LOG.info("device in use", **fields)
    else:
        LOG.info("device released", **fields)
