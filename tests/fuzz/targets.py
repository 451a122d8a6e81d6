"""Fuzz targets: the decoders that take bytes from outside (queue frames, gRPC requests, device files).

Each target takes raw bytes and must only ever raise the error it documents.
They run under atheris (coverage-guided) in `make soak`, and every input kept
in tests/fuzz/regressions/<target>/ runs as a plain unit test in `make test`.
"""

from __future__ import annotations

import time

from google.protobuf.message import DecodeError

from colad import allocation, device_wire, devicefile, messages, snapshots
from colad.api import deviceplugin_pb2 as pb
from colad.devices import Device, DeviceSet
from colad.errors import AllocationError, MessageError

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


TARGETS = {"messages": messages_target, "requests": requests_target, "devicefile": devicefile_target}
