"""The strict DRA client catches a driver that breaks the kubelet's contract: a skipped claim, an unknown
claim UID, a device without a pool, request names that are not base names; its health client catches a
list that is not complete, a device twice or unknown, a message too long, and re-opens as the kubelet does."""

from __future__ import annotations

from concurrent import futures
from pathlib import Path
from typing import Any

import grpc
import pytest

from colad.api import dra_health_v1_pb2, dra_health_v1_pb2_grpc, dra_v1_pb2, dra_v1_pb2_grpc
from tests.fakes.dra_kubelet import Claim, FakeDraKubelet, FakeHealthWatcher, pick_health_service
from tests.helpers import wait_until

pytestmark = pytest.mark.integration


class Careless(dra_v1_pb2_grpc.DRAPluginServicer):
    def NodePrepareResources(self, request: Any, context: Any) -> Any:  # noqa: N802
        response = dra_v1_pb2.NodePrepareResourcesResponse()
        response.claims["stranger"].error = ""
        response.claims[request.claims[0].uid].devices.add(request_names=["a/b"], device_name="d")
        return response

    def NodeUnprepareResources(self, request: Any, context: Any) -> Any:  # noqa: N802
        return dra_v1_pb2.NodeUnprepareResourcesResponse()


def test_a_driver_breaking_the_contract_is_recorded(short_tmp: Path) -> None:
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=1))
    dra_v1_pb2_grpc.add_DRAPluginServicer_to_server(Careless(), server)
    server.add_insecure_port(f"unix:{short_tmp}/dra.sock")
    server.start()
    client = FakeDraKubelet(f"{short_tmp}/dra.sock")
    try:
        client.prepare([Claim("ns", "a", "uid-a"), Claim("ns", "b", "uid-b")])
        client.unprepare([Claim("ns", "a", "uid-a")])
        assert client.violations == [
            "NodePrepareResources returned result for unknown claim UID ['stranger']",
            "NodePrepareResources skipped 1 ResourceClaims",
            "claim uid-a: a device without pool_name or device_name",
            "claim uid-a: request_names ['a/b'] are not base names",
            "NodeUnprepareResources skipped 1 ResourceClaims",
        ]
    finally:
        client.close()
        server.stop(None)


def test_the_kubelet_speaks_only_v1_and_v1beta1() -> None:
    with pytest.raises(ValueError, match="v1alpha4"):
        FakeDraKubelet("/nonexistent", "v1alpha4")


class CarelessHealth(dra_health_v1_pb2_grpc.DRAResourceHealthServicer):
    def NodeWatchResources(self, request: Any, context: Any) -> Any:  # noqa: N802
        pb = dra_health_v1_pb2

        def device(name: str, **fields: Any) -> Any:
            return pb.DeviceHealth(device=pb.DeviceIdentifier(pool_name="p", device_name=name), **fields)

        yield pb.NodeWatchResourcesResponse(
            devices=[
                pb.DeviceHealth(health=pb.HEALTHY),
                device("a", health=pb.HEALTHY),
                device("a", health=pb.HEALTHY),
                device("b", health=pb.UNHEALTHY, message="x" * 1025),
                device("c", health=pb.HEALTHY, health_check_timeout_seconds=-1),
                device("stranger", health=pb.HEALTHY),
            ]
        )
        yield pb.NodeWatchResourcesResponse(devices=[device("a", health=pb.HEALTHY)])


def test_a_health_stream_breaking_the_contract_is_recorded(short_tmp: Path) -> None:
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    dra_health_v1_pb2_grpc.add_DRAResourceHealthServicer_to_server(CarelessHealth(), server)
    server.add_insecure_port(f"unix:{short_tmp}/dra.sock")
    server.start()
    known = {("p", "a"), ("p", "b"), ("p", "c")}
    kubelet = FakeHealthWatcher(f"{short_tmp}/dra.sock", ["v1.DRAResourceHealth"], lambda: known).start()
    try:
        wait_until(lambda: len(kubelet.responses) >= 2 or None, 10, "both responses")
        assert kubelet.violations == [
            "a device without pool_name or device_name: ('', '')",
            "('p', 'a') reported twice in one response",
            "('p', 'b'): message of 1025 characters (at most 1024)",
            "('p', 'c'): negative health_check_timeout_seconds -1",
            "('p', 'stranger') is no device the driver published",
            "not a complete list: [('p', 'b'), ('p', 'c')] reported before and left out",
        ]
    finally:
        kubelet.stop()
        server.stop(None)


@pytest.mark.parametrize(
    ("advertised", "chosen"),
    [
        (["v1.DRAPlugin", "v1.DRAResourceHealth", "v1alpha1.DRAResourceHealth"], "v1.DRAResourceHealth"),
        (["v1alpha1.DRAResourceHealth", "v1.DRAResourceHealth"], "v1.DRAResourceHealth"),
        (["v1.DRAPlugin", "v1alpha1.DRAResourceHealth"], "v1alpha1.DRAResourceHealth"),
        (["v1.DRAPlugin", "v1beta1.DRAPlugin"], ""),
    ],
)
def test_the_kubelet_picks_the_newest_health_service_both_know(advertised: list[str], chosen: str) -> None:
    assert pick_health_service(advertised) == chosen


@pytest.mark.parametrize(("kubelet_136", "gives_up"), [(False, True), (True, False)], ids=["1.37", "1.36"])
def test_an_unimplemented_health_service_ends_the_watch_only_after_1_36(
    short_tmp: Path, kubelet_136: bool, gives_up: bool
) -> None:
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=1))
    dra_v1_pb2_grpc.add_DRAPluginServicer_to_server(Careless(), server)  # no health service at all
    server.add_insecure_port(f"unix:{short_tmp}/dra.sock")
    server.start()
    advertised = ["v1.DRAPlugin", "v1.DRAResourceHealth"]
    kubelet = FakeHealthWatcher(
        f"{short_tmp}/dra.sock", advertised, set, kubelet_136=kubelet_136, reopen_period=0.05
    ).start()
    try:
        wait_until(lambda: kubelet.errors or None, 10, "the stream refused")
        assert kubelet.errors[0].startswith("UNIMPLEMENTED")
        if gives_up:
            wait_until(lambda: not kubelet.watching() or None, 10, "the kubelet giving up")
            assert kubelet.opened == 1
        else:
            wait_until(lambda: kubelet.opened >= 3 or None, 10, "the stream opened again and again")
    finally:
        kubelet.stop()
        server.stop(None)
