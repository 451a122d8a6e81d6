"""The DRA health stream: NodeWatchResources of DRAResourceHealth v1 and v1alpha1, on the DRA socket.

The kubelet (feature gate ResourceHealthStatus) holds one stream per driver and opens it again 5 s
after it ends. Each stream gets the complete list of this driver's devices (colad/core/dra_health.py)
at once, and again whenever the list changes. `HealthBroadcast` holds the device sets the plugin
process received last (colad/plugin/dra_host.py updates it); `HealthService` serves it through
colad/runtime/rpc.py. Protobuf stays here.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import grpc

from colad.api import dra_health_v1_pb2, dra_health_v1alpha1_pb2
from colad.core.devices import DeviceSet
from colad.core.dra_health import ReportedHealth, Stamped, health_report, stamp
from colad.core.errors import RequestError
from colad.metrics.registry import Metrics
from colad.runtime import log, rpc

LOG = log.get(__name__)
SERVICES = tuple(
    (messages.DESCRIPTOR.services_by_name["DRAResourceHealth"], messages)
    for messages in (dra_health_v1_pb2, dra_health_v1alpha1_pb2)
)
# The kubelet holds one stream per driver; one more lets a restarted kubelet's stream in before the
# old one is cancelled. Each stream holds a worker of the DRA socket for its life (dra_host.DRA_WORKERS).
MAX_HEALTH_STREAMS = 2
WAIT_SAFETY = 30.0  # seconds a stream waits unwoken: a safety net, cancellation and updates notify


class HealthBroadcast:
    """The device sets every health stream follows, their version, and the list they make; thread-safe.

    `update` (the life-cycle thread) only stores the sets; the list is made by the first stream that
    asks for a version, once, and each device keeps the second its health was last determined.
    """

    def __init__(self, pools: Mapping[str, str], clock: Callable[[], float] = time.time) -> None:
        self.pools = dict(pools)
        self.clock = clock
        self._cond = threading.Condition()
        self._sets: Mapping[str, DeviceSet] = {}
        self._version = 0
        self._made = threading.Lock()  # one stream makes a version's list; the others wait for it
        self._report: tuple[int, tuple[ReportedHealth, ...], Stamped] = (-1, (), {})

    def update(self, device_sets: Mapping[str, DeviceSet]) -> None:
        with self._cond:
            self._sets = device_sets
            self._version += 1
            self._cond.notify_all()

    def wake(self) -> None:
        with self._cond:
            self._cond.notify_all()

    def version(self) -> int:
        with self._cond:
            return self._version

    def report(self) -> tuple[int, tuple[ReportedHealth, ...], Stamped]:
        """The newest version, its list, and each device's list entry with its second."""
        with self._made:
            with self._cond:
                version, sets = self._version, self._sets
            made, _, stamped = self._report
            if made != version:
                report = health_report(sets, self.pools)
                self._report = (version, report, stamp(report, stamped, int(self.clock())))
            return self._report

    def wait_change(self, seen: int, alive: Callable[[], bool]) -> bool:
        """Block until the sets move past version `seen` (True), or `alive()` turns false (False)."""
        with self._cond:
            while True:
                if not alive():
                    return False
                if self._version != seen:
                    return True
                self._cond.wait(timeout=WAIT_SAFETY)


def _response(messages: Any, stamped: Stamped) -> Any:
    response = messages.NodeWatchResourcesResponse()
    for entry, at in stamped.values():
        response.devices.add(
            device=messages.DeviceIdentifier(pool_name=entry.pool, device_name=entry.device),
            health=messages.HEALTHY if entry.healthy else messages.UNHEALTHY,
            last_updated_time=at,
            message=entry.message,
        )
    return response


class HealthService:
    """NodeWatchResources for the kubelet; add_to() serves it (v1 and v1alpha1), close() ends its streams."""

    def __init__(self, *, driver: str, broadcast: HealthBroadcast, metrics: Metrics | None = None) -> None:
        self.driver, self.broadcast = driver, broadcast
        self.metrics = metrics if metrics is not None else Metrics()
        self._lock = threading.Lock()
        self._streams = 0
        self._closed = False

    def add_to(self, server: grpc.Server) -> None:
        for service, messages in SERVICES:
            servicer = _Servicer(self, messages, service.full_name)
            server.add_generic_rpc_handlers(
                (rpc.handlers(service, servicer, messages, self.metrics.rpc_errors, fields={"driver": self.driver}),)
            )

    def streams(self) -> int:
        with self._lock:
            return self._streams

    def close(self) -> None:
        """End every stream of this service (the server stops; a new one gets a new service)."""
        with self._lock:
            self._closed = True
        self.broadcast.wake()

    def watch(self, messages: Any, service: str, alive: Callable[[], bool]) -> Iterator[Any]:
        """The complete list at once, then again on every change of it, until the stream ends."""
        with self._lock:
            if self._closed:
                raise RequestError("the DRA socket is being served anew", status="UNAVAILABLE")
            if self._streams >= MAX_HEALTH_STREAMS:
                raise RequestError(f"at most {MAX_HEALTH_STREAMS} health streams", status="RESOURCE_EXHAUSTED")
            self._streams += 1
        LOG.info("dra health stream opened", driver=self.driver, service=service)

        def open_() -> bool:
            return not self._closed and alive()

        try:
            version, sent, stamped = self.broadcast.report()
            yield _response(messages, stamped)
            LOG.debug("dra health sent", driver=self.driver, devices=len(sent))
            while self.broadcast.wait_change(version, open_):
                version, report, stamped = self.broadcast.report()
                if report == sent:
                    continue
                sent = report
                yield _response(messages, stamped)
                LOG.debug("dra health sent", driver=self.driver, devices=len(sent))
        finally:
            with self._lock:
                self._streams -= 1
            LOG.info("dra health stream closed", driver=self.driver, service=service)


class _Servicer:
    """DRAResourceHealth of one API version: protobuf out of the service's lists."""

    def __init__(self, service: HealthService, messages: Any, name: str) -> None:
        self.service, self.pb, self.name = service, messages, name

    def NodeWatchResources(self, request: Any, context: grpc.ServicerContext) -> Iterator[Any]:  # noqa: N802
        context.add_callback(self.service.broadcast.wake)
        yield from self.service.watch(self.pb, self.name, context.is_active)
