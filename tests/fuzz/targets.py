"""Fuzz targets: the decoders that take bytes from outside (queue frames, gRPC requests, device files).

`rpc` feeds every method of the DevicePlugin service through the real boundary (rpc.handlers: decode,
convert, serve), each input as raw request bytes or as wire.mutate's hostile message, so every field of
every request is reached; `podresources` does the same for the List answers the in-use view reads.

Each target takes raw bytes and must only ever raise the error it documents.
They run under atheris (coverage-guided) in `make soak`, and every input kept
in tests/fuzz/regressions/<target>/ runs as a plain unit test in `make test`.
"""

from __future__ import annotations

import time

import grpc
from google.protobuf.message import DecodeError

from colad.api import deviceplugin_pb2 as pb
from colad.api import podresources_pb2 as prpb
from colad.core import allocation, inuse
from colad.core.devices import Device, DeviceSet
from colad.core.errors import AllocationError, MessageError
from colad.deviceplugin.broadcast import DeviceBroadcast
from colad.deviceplugin.service import DEVICE_PLUGIN_SERVICE, DevicePluginServicer, StreamEvents
from colad.discovery import devicefile
from colad.metrics.registry import Metrics
from colad.plugin import podresources
from colad.queue import device_wire, messages, snapshots
from colad.runtime import rpc
from tests.fuzz import wire

DEVICES = DeviceSet.of([Device("cocacola"), Device("peisicola"), Device("fanta", "Unhealthy")])


def messages_target(data: bytes) -> None:
    """Queue frames: decode raises MessageError or yields a message that round-trips.

    A delta is also applied to a receiver holding DEVICES at its base: it never
    raises, and whatever it applies lands exactly on the delta's digest.
    """
    try:
        message = messages.decode(data)
    except MessageError:
        return
    assert messages.decode(messages.encode(message)) == message
    if isinstance(message, messages.DeviceDelta):
        receiver = snapshots.Receiver()
        receiver.apply(messages.DeviceSnapshot(message.epoch, message.base, DEVICES, resource=message.resource))
        outcome = receiver.apply(message)
        if outcome.snapshot is not None:
            assert device_wire.set_digest(outcome.snapshot.devices) == message.digest
            assert outcome.snapshot.devices == DeviceSet.of(outcome.snapshot.devices)


def requests_target(data: bytes) -> None:
    """gRPC requests as the servicer converts them: only DecodeError and AllocationError are expected."""
    try:
        request = pb.AllocateRequest.FromString(data)
    except DecodeError:
        request = None
    if request is not None:
        for container in request.container_requests:
            try:
                result = allocation.allocate(DEVICES, list(container.devices_ids))
            except AllocationError:
                continue
            assert result.envs["COLA_DEVICES"] == ",".join(container.devices_ids)
    try:
        preferred = pb.PreferredAllocationRequest.FromString(data)
    except DecodeError:
        return
    for container in preferred.container_requests:
        chosen = allocation.preferred(
            DEVICES,
            list(container.available_deviceIDs),
            list(container.must_include_deviceIDs),
            container.allocation_size,
        )
        assert len(chosen) <= max(container.allocation_size, 0)
        assert set(chosen) <= set(container.available_deviceIDs)


# A parse has a budget (devicefile's pre-scan): far above the ~0.1 s of the worst known input.
DEVICEFILE_BUDGET_S = 1.0


def devicefile_target(data: bytes) -> None:
    """Device files: parse never raises, answers in bounded time, and what it accepts crosses the queue."""
    started = time.perf_counter()
    device = devicefile.parse("dev", data)
    took = time.perf_counter() - started
    assert took < DEVICEFILE_BUDGET_S, f"parse took {took:.2f} s"
    assert device.device_id == "dev"
    assert device.problem == "" or device.health == "Unhealthy"  # a malformed file is Unhealthy, with a reason
    snapshot = messages.DeviceSnapshot(1, 1, DeviceSet.of([device]))
    assert len(messages.encode(snapshot)) == messages.snapshot_size(snapshot)
    assert messages.decode(messages.encode(snapshot)) == snapshot


class _Aborted(Exception):
    pass


class _Context:
    """What the servicer and the boundary use of a grpc.ServicerContext; abort() records the code."""

    def __init__(self) -> None:
        self.code: grpc.StatusCode | None = None

    def abort(self, code: grpc.StatusCode, details: str) -> None:
        self.code = code
        raise _Aborted(details)

    def invocation_metadata(self) -> tuple[()]:
        return ()

    def time_remaining(self) -> float:
        return 5.0

    def add_callback(self, callback: object) -> bool:
        return True

    def is_active(self) -> bool:
        return False


class _Details:
    def __init__(self, method: str) -> None:
        self.method, self.invocation_metadata = method, ()


_BROADCAST = DeviceBroadcast()
_BROADCAST.update(DeviceSet.of([*DEVICES, Device("cocacola::0")]))
_SERVICER = DevicePluginServicer(
    _BROADCAST, 1, StreamEvents(lambda _g: None, lambda _g: None, lambda _g, _n: None), Metrics(), "example.com/cola"
)
_HANDLERS = rpc.handlers(DEVICE_PLUGIN_SERVICE, _SERVICER, pb, _SERVICER.metrics.rpc_errors, raw=("ListAndWatch",))
_METHODS = list(DEVICE_PLUGIN_SERVICE.methods)
# What a request colad cannot serve is answered with (the kubelet contract's codes): never INTERNAL or UNKNOWN.
DOCUMENTED = {
    grpc.StatusCode.INVALID_ARGUMENT,
    grpc.StatusCode.NOT_FOUND,
    grpc.StatusCode.FAILED_PRECONDITION,
    grpc.StatusCode.RESOURCE_EXHAUSTED,
}


def rpc_target(data: bytes) -> None:
    """A DevicePlugin request through the boundary: an answer or a documented code, never anything else.

    The first byte picks the method; the second whether the rest is the request as it is or the seed of
    wire.mutate's hostile message (every field of the request in many shapes).
    """
    if len(data) < 2:
        return
    method = _METHODS[data[0] % len(_METHODS)]
    body = data[2:] if data[1] % 2 == 0 else wire.mutate(method.input_type, data[2:])
    handler = _HANDLERS.service(_Details(f"/{DEVICE_PLUGIN_SERVICE.full_name}/{method.name}"))  # type: ignore[arg-type]
    assert handler is not None
    context = _Context()
    request = handler.request_deserializer(body)
    try:
        if method.server_streaming:
            stream = handler.unary_stream(request, context)
            try:
                assert isinstance(next(stream), bytes)
            finally:
                stream.close()
        else:
            answer = handler.unary_unary(request, context)
            assert isinstance(answer, getattr(pb, method.output_type.name))
    except _Aborted:
        assert context.code in DOCUMENTED, (method.name, context.code)


def podresources_target(data: bytes) -> None:
    """A List answer: undecodable or decoded, what the in-use view keeps is well formed and serializable."""
    answer = rpc.decoder(prpb.ListPodResourcesResponse)(wire.mutate(prpb.ListPodResourcesResponse.DESCRIPTOR, data))
    if isinstance(answer, rpc.Undecodable):
        return
    served = {"example.com/cola", wire.VALID_ID}
    kept, skipped = podresources.assignments_of(answer, served)
    view = inuse.holders(kept, served)
    body = inuse.state(view, available=True, reason="", updated=0.0)
    assert inuse.parse_rows(body["holders"]) == body["holders"]
    assert len(skipped) + len(kept) <= sum(len(c.devices) for p in answer.pod_resources for c in p.containers)


TARGETS = {
    "messages": messages_target,
    "requests": requests_target,
    "devicefile": devicefile_target,
    "rpc": rpc_target,
    "podresources": podresources_target,
}
