"""The DRA health stream over real gRPC on a Unix socket, read by the strict fake kubelet's health client:
the complete list at once, on every change and again before the kubelet's timeout, both API versions,
the stream's end and its limits."""

from __future__ import annotations

from collections.abc import Iterator
from concurrent import futures
from pathlib import Path

import grpc
import pytest

from colad.core.constants import UNHEALTHY
from colad.core.devices import Device, DeviceSet
from colad.core.dra_registration import DRA_SERVICES, DRA_SUPPORTED_VERSIONS
from colad.dra.health import MAX_HEALTH_STREAMS, RESEND_PERIOD, HealthBroadcast, HealthService
from colad.metrics.registry import Metrics
from tests.fakes.dra_kubelet import FakeHealthWatcher, HeldHealth
from tests.helpers import wait_until

pytestmark = pytest.mark.integration

DRIVER = "cola.myway5.com"
RESOURCE = "myway5.com/cola"
NODE = "node-1"
WAIT = 10.0
KNOWN = {(NODE, "cola-a"), (NODE, "cola-b")}
MISSING = "host path /dev/cola-b is missing"


class Served:
    def __init__(self, socket: Path, resend_period: float = RESEND_PERIOD) -> None:
        self.socket = str(socket)
        self.broadcast = HealthBroadcast({RESOURCE: NODE})
        self.service = HealthService(
            driver=DRIVER,
            broadcast=self.broadcast,
            metrics=Metrics(dra=True),
            resend_period=resend_period,
            clock=lambda: 1_700_000_000.0,
        )
        self.server = grpc.server(futures.ThreadPoolExecutor(max_workers=4), maximum_concurrent_rpcs=4)
        self.service.add_to(self.server)
        assert self.server.add_insecure_port("unix:" + self.socket) != 0
        self.server.start()

    def publish(self, *devices: Device) -> None:
        self.broadcast.update({RESOURCE: DeviceSet.of(devices)})

    def watcher(self, advertised: tuple[str, ...] = DRA_SUPPORTED_VERSIONS, **kwargs: object) -> FakeHealthWatcher:
        return FakeHealthWatcher(self.socket, advertised, lambda: KNOWN, **kwargs).start()  # type: ignore[arg-type]

    def stop(self) -> None:
        self.service.close()
        self.server.stop(None).wait()


@pytest.fixture
def served(short_tmp: Path, request: pytest.FixtureRequest) -> Iterator[Served]:
    s = Served(short_tmp / "dra.sock", getattr(request, "param", RESEND_PERIOD))
    yield s
    s.stop()


@pytest.mark.parametrize("kubelet_136", [False, True], ids=["1.37-v1", "1.36-v1alpha1"])
def test_the_kubelet_holds_each_devices_health_and_reason_as_it_changes(served: Served, kubelet_136: bool) -> None:
    served.publish(Device("cola-a"), Device("cola-b"))
    kubelet = served.watcher(kubelet_136=kubelet_136)
    try:
        assert kubelet.service == ("v1alpha1" if kubelet_136 else "v1") + ".DRAResourceHealth"
        first = kubelet.wait_held((NODE, "cola-b"), "Healthy", WAIT)
        assert first == HeldHealth("Healthy", "", 1_700_000_000)
        assert set(kubelet.held()) == KNOWN
        served.publish(Device("cola-a"), Device("cola-b", UNHEALTHY, reason=MISSING))
        sick = kubelet.wait_held((NODE, "cola-b"), "Unhealthy", WAIT)
        assert sick.message == MISSING
        assert kubelet.held()[(NODE, "cola-a")].health == "Healthy"
        served.publish(Device("cola-a"), Device("cola-b"))
        assert kubelet.wait_held((NODE, "cola-b"), "Healthy", WAIT).message == ""
        assert [set(r) for r in kubelet.responses] == [KNOWN] * 3  # a complete list each time, once per change
        assert kubelet.violations == [] and kubelet.errors == []
    finally:
        kubelet.stop()


def test_an_unchanged_set_sends_nothing(served: Served) -> None:
    served.publish(Device("cola-a"), Device("cola-b"))
    kubelet = served.watcher()
    try:
        kubelet.wait_held((NODE, "cola-a"), "Healthy", WAIT)
        served.publish(Device("cola-a"), Device("cola-b"))  # the same devices, a new version
        served.publish(Device("cola-a", UNHEALTHY), Device("cola-b"))
        kubelet.wait_held((NODE, "cola-a"), "Unhealthy", WAIT)
        assert [r[(NODE, "cola-a")].health for r in kubelet.responses] == ["Healthy", "Unhealthy"]
    finally:
        kubelet.stop()


@pytest.mark.parametrize("served", [0.1], indirect=True, ids=["resend-0.1s"])
def test_an_unchanged_list_is_sent_again_so_the_kubelet_never_reads_it_stale(served: Served) -> None:
    served.publish(Device("cola-a"), Device("cola-b", UNHEALTHY, reason=MISSING))
    kubelet = served.watcher(health_timeout=5.0)
    try:
        wait_until(lambda: len(kubelet.responses) >= 5 or None, WAIT, "the list sent again, unchanged")
        assert all(r == kubelet.responses[0] for r in kubelet.responses), kubelet.responses
        assert {k: h.health for k, h in kubelet.held().items()} == {
            (NODE, "cola-a"): "Healthy",
            (NODE, "cola-b"): "Unhealthy",
        }
        assert kubelet.violations == [] and kubelet.opened == 1
    finally:
        kubelet.stop()


def test_a_list_not_sent_again_within_the_kubelets_timeout_reads_unknown(served: Served) -> None:
    """The fake kubelet's own rule, against the default resend period: what the resend is for."""
    served.publish(Device("cola-a"))
    kubelet = served.watcher(health_timeout=0.2)
    try:
        wait_until(lambda: kubelet.responses or None, WAIT, "the first list")
        assert kubelet.responses[0][(NODE, "cola-a")].health == "Healthy"
        kubelet.wait_held((NODE, "cola-a"), "Unknown", WAIT)
        assert len(kubelet.responses) == 1  # RESEND_PERIOD has not passed
    finally:
        kubelet.stop()


def test_a_kubelet_that_was_not_told_of_the_service_never_opens_it(served: Served) -> None:
    kubelet = served.watcher(advertised=DRA_SERVICES)
    kubelet.stop()
    assert kubelet.service == "" and kubelet.opened == 0


def test_closing_the_service_ends_its_streams_and_refuses_new_ones(served: Served) -> None:
    served.publish(Device("cola-a"))
    kubelet = served.watcher(reopen_period=0.1)
    try:
        kubelet.wait_held((NODE, "cola-a"), "Healthy", WAIT)
        served.service.close()
        wait_until(lambda: kubelet.opened >= 2 or None, WAIT, "the kubelet opening the stream again")
        wait_until(lambda: kubelet.errors or None, WAIT, "the new stream refused")
        assert kubelet.errors[0].startswith("UNAVAILABLE"), kubelet.errors
        assert kubelet.held() == {}  # the stream ended: the kubelet dropped the driver's health
        assert served.service.streams() == 0
    finally:
        kubelet.stop()


def test_streams_beyond_the_limit_are_refused(served: Served) -> None:
    served.publish(Device("cola-a"))
    kubelets = [served.watcher() for _ in range(MAX_HEALTH_STREAMS)]
    try:
        for kubelet in kubelets:
            kubelet.wait_held((NODE, "cola-a"), "Healthy", WAIT)
        extra = served.watcher()
        try:
            wait_until(lambda: extra.errors or None, WAIT, "the extra stream refused")
            assert extra.errors[0].startswith("RESOURCE_EXHAUSTED"), extra.errors
        finally:
            extra.stop()
    finally:
        for kubelet in kubelets:
            kubelet.stop()
    wait_until(lambda: served.service.streams() == 0 or None, WAIT, "every stream ended")


def test_a_device_the_driver_never_published_is_a_violation(served: Served) -> None:
    served.publish(Device("cola-a"), Device("cola-z"))
    kubelet = served.watcher()
    try:
        kubelet.wait_held((NODE, "cola-z"), "Healthy", WAIT)
        assert kubelet.violations == [f"{(NODE, 'cola-z')} is no device the driver published"]
    finally:
        kubelet.stop()
