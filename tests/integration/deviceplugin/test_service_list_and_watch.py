"""ListAndWatch sends each list's encoded bytes as they are, over real gRPC on a Unix socket.

What the kubelet receives must be protobuf's own serialization of the ListAndWatchResponse built
from the devices (tests.oracles.list_and_watch_bytes, one message per device), for random sets (IDs, health, NUMA nodes,
replicas) changed in turn, the first list and every later one; the generated stub still parses
each; and the servicer's other methods still answer through the generated handlers.
"""

from __future__ import annotations

import queue
import random
import threading
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from colad.api import deviceplugin_pb2 as pb
from colad.api import deviceplugin_pb2_grpc as pb_grpc
from colad.core.constants import HEALTHY, UNHEALTHY
from colad.core.devices import Device, DeviceSet
from colad.deviceplugin.broadcast import DeviceBroadcast
from colad.deviceplugin.service import DevicePluginServicer, StreamEvents, build_server
from colad.metrics.registry import Metrics
from colad.outputs.statefile import PluginState
from tests.oracles import list_and_watch_bytes

pytestmark = pytest.mark.integration
METHOD = "/v1beta1.DevicePlugin/ListAndWatch"


def _random_set(rng: random.Random) -> DeviceSet:
    devices = [
        Device(
            f"dev-{i}" + ("::1" if rng.random() < 0.2 else ""),
            rng.choice([HEALTHY, UNHEALTHY]),
            numa_nodes=tuple(sorted(rng.sample(range(4), rng.randint(0, 2)))),
        )
        for i in rng.sample(range(1000), rng.randint(0, 40))
    ]
    return DeviceSet.of(devices)


def _protobuf_bytes(devices: DeviceSet) -> bytes:
    wire: bytes = list_and_watch_bytes(devices)
    return wire


def _read(stream: Iterator[bytes], into: list[bytes]) -> None:
    try:
        into.extend(stream)
    except grpc.RpcError:  # cancelled at the end
        pass


@pytest.mark.parametrize("seed", range(3))
def test_each_list_is_protobufs_own_bytes_and_parses(tmp_path: Path, seed: int) -> None:
    rng = random.Random(seed)
    broadcast = DeviceBroadcast()
    sets = [_random_set(rng) for _ in range(12)]
    broadcast.update(sets[0])
    sent: queue.SimpleQueue[int] = queue.SimpleQueue()
    events = StreamEvents(lambda _g: None, lambda _g: None, lambda _g, n: sent.put(n))
    servicer = DevicePluginServicer(broadcast, 1, events, Metrics(snapshot=lambda: PluginState(pid=1)), "example.com/r")
    server = build_server(servicer, str(tmp_path / "p.sock"))
    server.start()
    raw_got: list[bytes] = []
    try:
        with grpc.insecure_channel(f"unix:{tmp_path / 'p.sock'}") as channel:
            raw = channel.unary_stream(METHOD, request_serializer=pb.Empty.SerializeToString)(pb.Empty())
            reader = threading.Thread(target=_read, args=(raw, raw_got), daemon=True)
            reader.start()
            sent.get(timeout=10)
            for before, devices in zip(sets, sets[1:], strict=False):
                broadcast.update(devices)
                if _protobuf_bytes(devices) != _protobuf_bytes(before):
                    sent.get(timeout=10)  # each sent before the next: every list reaches the stream
            parsed = next(iter(pb_grpc.DevicePluginStub(channel).ListAndWatch(pb.Empty(), timeout=10)))
            options = pb_grpc.DevicePluginStub(channel).GetDevicePluginOptions(pb.Empty(), timeout=10)
            raw.cancel()
            reader.join(10)
    finally:
        server.stop(0).wait(5)
    distinct = [s for i, s in enumerate(sets) if i == 0 or _protobuf_bytes(s) != _protobuf_bytes(sets[i - 1])]
    assert raw_got == [_protobuf_bytes(s) for s in distinct]
    assert [d.ID for d in parsed.devices] == [d.device_id for d in sets[-1]]
    assert [tuple(n.ID for n in d.topology.nodes) for d in parsed.devices] == [d.numa_nodes for d in sets[-1]]
    assert options.get_preferred_allocation_available
