"""The servicer's Allocate over real gRPC on a Unix socket: kept answers give the answer and the line of old.

Each response must equal the one built fresh from allocation.allocate (to_container_response, one per
container, in order), for one and several containers, the first time and when kept, in each CDI mode
against a real spec on disk; each container's log line must be the one LOG.info("allocate", ...)
writes; `colad check`'s metadata still says check=True; a refusal is refused every time.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from colad.api import deviceplugin_pb2 as pb
from colad.api import deviceplugin_pb2_grpc as pb_grpc
from colad.core import allocation, constants, namemap
from colad.core.constants import UNHEALTHY
from colad.core.devices import Device, DeviceNode, DeviceSet, Mount
from colad.core.names import CDI_MODES
from colad.deviceplugin.broadcast import DeviceBroadcast
from colad.deviceplugin.service import DevicePluginServicer, StreamEvents, build_server, to_container_response
from colad.metrics.registry import Metrics
from colad.outputs import cdi
from colad.outputs.statefile import PluginState
from colad.runtime import log

pytestmark = pytest.mark.integration
COLA = "myway5.com/cola"
DEVICES = DeviceSet.of(
    [
        Device("a", device_nodes=(DeviceNode("/dev/a", "/dev/a"),), envs=(("K", "1"),)),
        Device("b", mounts=(Mount("/opt/b", "/b"),), envs=(("K", "2"),), annotations=(("x", "y"),)),
        Device("c::1", cdi_devices=("vendor.com/gpu=c",)),
        Device("c::2", cdi_devices=("vendor.com/gpu=c",)),
        Device("d-", envs=(("V", "a b"),)),
        Device("sick", UNHEALTHY),
    ]
)
REQUESTS = [[["a"]], [["b", "a"]], [["c::1", "c::2"]], [["a"], ["b"], ["d-"]], [["d-", "c::2"], ["c::1"]]]


class Served:
    def __init__(self, tmp_path: Path, mode: str) -> None:
        spec_dir = tmp_path / "cdi"
        spec_dir.mkdir()
        listed = DeviceSet.of([d for d in DEVICES if d.device_id != "b"])  # b: not in the spec on disk
        (spec_dir / namemap.cdi_spec_file(COLA)).write_bytes(cdi.encode_spec(COLA, listed) or b"")
        self.broadcast = DeviceBroadcast()
        self.broadcast.update(DEVICES)
        self.metrics = Metrics(snapshot=lambda: PluginState(pid=1))
        self.metrics.add_resource(COLA)
        events = StreamEvents(lambda _g: None, lambda _g: None, lambda _g, _n: None)
        self.servicer = DevicePluginServicer(
            self.broadcast, 1, events, self.metrics, COLA, cdi_mode=lambda: mode, cdi_spec_dir=lambda: str(spec_dir)
        )
        self.names = self.servicer.cdi_specs.read(str(spec_dir), COLA).names
        self.mode = mode
        self.server = build_server(self.servicer, str(tmp_path / "p.sock"))
        self.server.start()
        self.channel = grpc.insecure_channel(f"unix:{tmp_path / 'p.sock'}")
        self.stub = pb_grpc.DevicePluginStub(self.channel)

    def allocate(self, containers: list[list[str]], check: bool = False) -> pb.AllocateResponse:
        request = pb.AllocateRequest(
            container_requests=[pb.ContainerAllocateRequest(devices_ids=c) for c in containers]
        )
        metadata = ((constants.CHECK_METADATA_KEY, "1"),) if check else None
        response: pb.AllocateResponse = self.stub.Allocate(request, timeout=10, metadata=metadata)
        return response

    def fresh(self, containers: list[list[str]]) -> tuple[pb.AllocateResponse, list[allocation.ContainerAllocation]]:
        results = [
            allocation.allocate(DEVICES, c, resource_name=COLA, cdi_mode=self.mode, cdi_listed=self.names)
            for c in containers
        ]
        return pb.AllocateResponse(container_responses=[to_container_response(r) for r in results]), results

    def close(self) -> None:
        self.channel.close()
        self.server.stop(grace=None).wait(5)


@pytest.fixture(params=CDI_MODES)
def served(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Served]:
    s = Served(tmp_path, request.param)
    yield s
    s.close()


def expected_line(result: allocation.ContainerAllocation, check: bool) -> str:
    fields = {
        "resource": COLA,
        "devices": ",".join(result.device_ids),
        "device_nodes": len(result.device_nodes),
        "mounts": len(result.mounts),
        "cdi": len(result.cdi_devices),
        "check": check,
    }
    return f"msg=allocate {log.format_fields(fields)}"


def test_kept_answers_are_the_fresh_ones_with_the_same_lines(served: Served, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="colad.deviceplugin.service")
    for check in (False, True):
        for _ in range(3):  # the first works each answer out, the others find it kept
            for containers in REQUESTS:
                caplog.clear()
                want, results = served.fresh(containers)
                got = served.allocate(containers, check)
                assert got == want
                assert got.SerializeToString(deterministic=True) == want.SerializeToString(deterministic=True)
                lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith("msg=allocate ")]
                assert lines == [expected_line(r, check) for r in results]
    value = served.metrics.registry.get_sample_value
    assert value("colad_allocate_requests_total", {"resource": COLA, "result": "success"}) == 3 * 8
    assert value("colad_allocated_devices_total", {"resource": COLA}) == 3 * 11
    assert value("colad_device_allocations_total", {"resource": COLA, "device_id": "a"}) == 3 * 3
    assert value("colad_check_allocate_requests_total") == 3 * 8
    assert value("colad_allocate_duration_seconds_count") == 2 * 3 * len(REQUESTS)


def test_a_refusal_is_refused_every_time(served: Served) -> None:
    for _ in range(3):
        with pytest.raises(grpc.RpcError) as refused:
            served.allocate([["a"], ["sick"]])
        assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT  # type: ignore[attr-defined]
        with pytest.raises(grpc.RpcError) as unknown:
            served.allocate([["nope"]])
        assert unknown.value.code() == grpc.StatusCode.NOT_FOUND  # type: ignore[attr-defined]
    value = served.metrics.registry.get_sample_value
    assert value("colad_allocate_requests_total", {"resource": COLA, "result": "invalid"}) == 3
    assert value("colad_allocate_requests_total", {"resource": COLA, "result": "not_found"}) == 3
    assert value("colad_allocate_requests_total", {"resource": COLA, "result": "success"}) == 0


def test_a_new_set_is_answered_from_itself(served: Served) -> None:
    assert dict(served.allocate([["a"]]).container_responses[0].annotations) == {}
    served.broadcast.update(DeviceSet.of([Device("a", annotations=(("x", "9"),))]))  # annotations: in every mode
    assert dict(served.allocate([["a"]]).container_responses[0].annotations) == {"x": "9"}
    with pytest.raises(grpc.RpcError) as gone:
        served.allocate([["b"]])
    assert gone.value.code() == grpc.StatusCode.NOT_FOUND  # type: ignore[attr-defined]
