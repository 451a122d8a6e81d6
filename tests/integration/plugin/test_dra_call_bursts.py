"""The DRA socket's server (build_dra_server) under bursts of kubelet calls, with the kubelet's health
streams open at their limit: 16 prepares at once all succeed, a flood past the bound is refused with
RESOURCE_EXHAUSTED, and the server keeps serving prepares, unprepares and the streams after it."""

from __future__ import annotations

from collections.abc import Iterator
from concurrent import futures
from pathlib import Path

import pytest

from colad.config.config import Resource
from colad.core.devices import Device, DeviceSet
from colad.core.dra_registration import DRA_SUPPORTED_VERSIONS
from colad.dra.health import MAX_HEALTH_STREAMS, HealthBroadcast, HealthService
from colad.dra.service import DraPluginService
from colad.kube.access import Access, Credentials
from colad.kube.client import KubeClient
from colad.metrics.registry import Metrics
from colad.plugin.dra_host import CALL_WORKERS, DRA_WORKERS, QUEUED_CALLS, build_dra_server
from tests.fakes.apiserver import FakeApiServer, Pki
from tests.fakes.dra_kubelet import Claim, FakeDraKubelet, FakeHealthWatcher, Outcome
from tests.helpers import wait_until

pytestmark = pytest.mark.integration

DRIVER = "cola.myway5.com"
RESOURCE = "myway5.com/cola"
NODE = "node-1"
TOKEN = "test-token"
WAIT = 30.0
DEVICES = DeviceSet.of([Device("cola-a"), Device("cola-b")])
KNOWN = {(NODE, "cola-a"), (NODE, "cola-b")}


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    return Pki(tmp_path_factory.mktemp("pki"))


@pytest.fixture
def apiserver(pki: Pki) -> Iterator[FakeApiServer]:
    fake = FakeApiServer(pki, tokens={TOKEN}).start()
    yield fake
    fake.hang.clear()
    fake.stop()


class Socket:
    """The DRA services on build_dra_server's server, with the kubelet's health streams at their limit."""

    def __init__(self, root: Path, apiserver: FakeApiServer) -> None:
        self.path = str(root / "plugins" / DRIVER / "dra.sock")
        client = KubeClient(
            Credentials(Access(server=apiserver.url, ca_file=str(apiserver.pki.ca), token=TOKEN)), timeout=WAIT
        )
        broadcast = HealthBroadcast({RESOURCE: NODE})
        broadcast.update({RESOURCE: DEVICES})
        self.services = (
            DraPluginService(
                driver=DRIVER,
                node_name=NODE,
                client=client,
                resources=[Resource(RESOURCE, str(root / "devices"))],
                devices=lambda: {RESOURCE: DEVICES},
                cdi_spec_dir=str(root / "cdi"),
                state_dir=str(root / "plugins" / DRIVER),
                metrics=Metrics(dra=True),
                call_timeout=WAIT,
            ),
            HealthService(driver=DRIVER, broadcast=broadcast),
        )
        self.server = build_dra_server(self.path, self.services)
        self.server.start()
        self.streams = [
            FakeHealthWatcher(self.path, DRA_SUPPORTED_VERSIONS, lambda: KNOWN).start()
            for _ in range(MAX_HEALTH_STREAMS)
        ]
        for stream in self.streams:
            wait_until(lambda s=stream: s.held(), WAIT, "the health stream's first list")  # type: ignore[misc]
        self.kubelet = FakeDraKubelet(self.path)

    def stop(self) -> None:
        self.kubelet.close()
        for stream in self.streams:
            stream.stop()
        self.server.stop(None).wait()
        for service in self.services:
            service.close()


@pytest.fixture
def socket(short_tmp: Path, apiserver: FakeApiServer) -> Iterator[Socket]:
    made = Socket(short_tmp, apiserver)
    yield made
    made.stop()
    assert made.kubelet.violations == []
    assert all(s.violations == [] for s in made.streams)


def claims(apiserver: FakeApiServer, n: int, prefix: str = "pod") -> list[Claim]:
    made = []
    for i in range(n):
        obj = apiserver.add_allocated_claim("default", f"{prefix}-{i}", DRIVER, NODE, ["cola-a"])
        made.append(Claim("default", obj["metadata"]["name"], obj["metadata"]["uid"]))
    return made


def in_flight(pool: futures.ThreadPoolExecutor, socket: Socket, todo: list[Claim]) -> list[futures.Future[Outcome]]:
    return [pool.submit(socket.kubelet.prepare, [claim]) for claim in todo]


def refused(calls: list[futures.Future[Outcome]]) -> int:
    return sum(1 for c in calls if c.done() and c.result().failed.startswith("RESOURCE_EXHAUSTED"))


def test_sixteen_prepares_at_once_all_succeed_beside_the_health_streams(
    socket: Socket, apiserver: FakeApiServer
) -> None:
    burst = claims(apiserver, 16)
    apiserver.hang.set()  # each prepare holds its worker in its claim read until the API server answers
    with futures.ThreadPoolExecutor(len(burst)) as pool:
        calls = in_flight(pool, socket, burst)
        wait_until(
            lambda: apiserver.hanging >= CALL_WORKERS or refused(calls),
            WAIT,
            "every call worker busy with a prepare",
        )
        assert refused(calls) == 0
        apiserver.hang.clear()
        outcomes = [c.result(timeout=WAIT) for c in calls]
    assert [o.failed for o in outcomes] == [""] * len(burst)
    assert all(o.errors == {} and len(o.devices) == 1 for o in outcomes), [o.errors for o in outcomes]
    assert all(s.watching() and s.errors == [] for s in socket.streams)


def test_a_flood_past_the_bound_is_refused_and_the_driver_keeps_serving(
    socket: Socket, apiserver: FakeApiServer
) -> None:
    extra = 5
    accepted = DRA_WORKERS + QUEUED_CALLS - MAX_HEALTH_STREAMS  # the streams take their share of the bound
    flood = claims(apiserver, accepted + extra)
    apiserver.hang.set()
    with futures.ThreadPoolExecutor(len(flood)) as pool:
        calls = in_flight(pool, socket, flood)
        wait_until(lambda: refused(calls) >= extra or None, WAIT, f"{extra} calls refused")
        assert apiserver.hanging == CALL_WORKERS  # the rest wait for a worker
        apiserver.hang.clear()
        outcomes = [c.result(timeout=WAIT) for c in calls]
    failed = [o.failed for o in outcomes if o.failed]
    assert len(failed) == extra and all(f.startswith("RESOURCE_EXHAUSTED") for f in failed), failed
    assert all(o.errors == {} for o in outcomes if not o.failed)

    after = claims(apiserver, 1, "after")
    assert socket.kubelet.prepare(after).errors == {}
    assert socket.kubelet.unprepare(after + flood).errors == {}
    assert all(s.watching() and s.errors == [] for s in socket.streams)
    assert all(len(s.responses) >= 1 for s in socket.streams)
