"""The DRA health stream: NodeWatchResources of DRAResourceHealth v1 and v1alpha1, on the DRA socket.

The kubelet (feature gate ResourceHealthStatus) holds one stream per driver and opens it again 5 s
after it ends. Each stream gets the complete list of this driver's devices (colad/core/dra_health.py)
at once, again whenever the list changes, and again every RESEND_PERIOD while it does not.
`HealthBroadcast` holds the device sets the plugin process received last (colad/plugin/dra_host.py
updates it); `HealthService` serves it through colad/runtime/rpc.py. Protobuf stays here.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import grpc

from colad.api import dra_health_v1_pb2, dra_health_v1alpha1_pb2
from colad.core.devices import DeviceSet
from colad.core.dra_health import ReportedHealth, health_report
from colad.core.errors import RequestError
from colad.metrics.registry import Metrics
from colad.runtime import log, rpc

LOG = log.get(__name__)
SERVICES = tuple(
    (messages.DESCRIPTOR.services_by_name["DRAResourceHealth"], messages)
    for messages in (dra_health_v1_pb2, dra_health_v1alpha1_pb2)
)
# The kubelet holds one stream per driver; one more lets a restarted kubelet's stream in before the
# old one is cancelled. Each stream holds a worker of the DRA socket for its life (dra_host.DRA_WORKERS
# has room for them beside the calls).
MAX_HEALTH_STREAMS = 2
# The kubelet reads a device as Unknown once its last response is older than 30 s, however healthy it
# was (kubernetes/kubernetes pkg/kubelet/cm/dra/healthinfo.go: getHealthInfo against healthTimeout, with
# LastUpdated the receive time), so an unchanged list is sent again well within that.
RESEND_PERIOD = 10.0


class HealthBroadcast:
    """The device sets every health stream follows, their version, and the list they make; thread-safe.

    `update` (the life-cycle thread) only stores the sets; the list is made by the first stream that
    asks for a version, once.
    """

    def __init__(self, pools: Mapping[str, str]) -> None:
        self.pools = dict(pools)
        self._cond = threading.Condition()
        self._sets: Mapping[str, DeviceSet] = {}
        self._version = 0
        self._made = threading.Lock()  # one stream makes a version's list; the others wait for it
        self._report: tuple[int, tuple[ReportedHealth, ...]] = (-1, ())

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

    def report(self) -> tuple[int, tuple[ReportedHealth, ...]]:
        """The newest version and its list."""
        with self._made:
            with self._cond:
                version, sets = self._version, self._sets
            if self._report[0] != version:
                self._report = (version, health_report(sets, self.pools))
            return self._report

    def wait_change(self, seen: int, alive: Callable[[], bool], timeout: float) -> bool | None:
        """Block until the sets move past version `seen` (True), `timeout` seconds pass (False), or
        `alive()` turns false (None)."""
        deadline = time.monotonic() + timeout
        with self._cond:
            while True:
                if not alive():
                    return None
                if self._version != seen:
                    return True
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._cond.wait(timeout=left)


def _response(messages: Any, report: tuple[ReportedHealth, ...], at: int) -> Any:
    """The list as the kubelet receives it; `at`: the second it was made, when every health in it held."""
    response = messages.NodeWatchResourcesResponse()
    for entry in report:
        response.devices.add(
            device=messages.DeviceIdentifier(pool_name=entry.pool, device_name=entry.device),
            health=messages.HEALTHY if entry.healthy else messages.UNHEALTHY,
            last_updated_time=at,
            message=entry.message,
        )
    return response


class HealthService:
    """NodeWatchResources for the kubelet; add_to() serves it (v1 and v1alpha1), close() ends its streams."""

    def __init__(
        self,
        *,
        driver: str,
        broadcast: HealthBroadcast,
        metrics: Metrics | None = None,
        resend_period: float = RESEND_PERIOD,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.driver, self.broadcast = driver, broadcast
        self.metrics = metrics if metrics is not None else Metrics()
        self.resend_period, self.clock = resend_period, clock
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
        """The complete list at once, then again on every change of it and every resend_period, until
        the stream ends."""
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
            version, sent = self.broadcast.report()
            due = time.monotonic() + self.resend_period
            yield _response(messages, sent, int(self.clock()))
            LOG.debug("dra health sent", driver=self.driver, devices=len(sent))
            while True:
                changed = self.broadcast.wait_change(version, open_, max(0.0, due - time.monotonic()))
                if changed is None:
                    return
                if changed:
                    version, report = self.broadcast.report()
                    if report == sent and time.monotonic() < due:
                        continue
                    sent = report
                due = time.monotonic() + self.resend_period
                yield _response(messages, sent, int(self.clock()))
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
