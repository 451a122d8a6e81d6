"""The strict DRA client catches a driver that breaks the kubelet's contract: a skipped claim, an unknown
claim UID, a device without a pool, request names that are not base names."""

from __future__ import annotations

from concurrent import futures
from pathlib import Path
from typing import Any

import grpc
import pytest

from colad.api import dra_v1_pb2, dra_v1_pb2_grpc
from tests.fakes.dra_kubelet import Claim, FakeDraKubelet

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
