"""The plugin's side of the contract, end to end under supervisord: retries, streams, scale."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from colad.api import deviceplugin_pb2 as pb
from colad.api import deviceplugin_pb2_grpc as pb_grpc
from tests.fakes.kubelet import FakeKubelet
from tests.helpers import wait_until
from tests.service import ColadService

pytestmark = pytest.mark.e2e


def test_register_is_retried_with_capped_backoff_until_the_kubelet_accepts(short_tmp: Path) -> None:
    kubelet = FakeKubelet(short_tmp / "kubelet", register_error="resource busy (test)")
    kubelet.start()
    service = ColadService(short_tmp)
    service.add("cocacola")
    try:
        service.start()
        refused = wait_until(lambda: len(r := kubelet.registrations) >= 7 and r, 30, "seven refused registrations")
        assert not any(r.ok for r in refused)
        gaps = [b.at - a.at for a, b in zip(refused, refused[1:], strict=False)]
        # Back-off doubles from 0.1 s up to 5 s. A timer never fires early, so each gap is at least
        # its nominal back-off (load can only lengthen it); the cap bounds it from above.
        nominal = [min(0.1 * 2**i, 5.0) for i in range(len(gaps))]
        assert all(gap >= want * 0.95 for gap, want in zip(gaps, nominal, strict=True)), (gaps, nominal)
        assert max(gaps) <= 5.0 + 2.0, gaps
        service.wait_log('msg="register failed" resource=myway5.com/cola error="UNKNOWN: resource busy (test)"')
        kubelet.register_error = None
        kubelet.wait_registered(timeout=10)
        kubelet.wait_devices({"cocacola"})
        assert kubelet.violations == []
    finally:
        service.stop()
        kubelet.stop()


@pytest.fixture
def plugin_channel(colad: ColadService, kubelet: FakeKubelet) -> Iterator[grpc.Channel]:
    reg = kubelet.wait_registered()
    kubelet.wait_devices({"cocacola", "peisicola"})
    channel = grpc.insecure_channel(f"unix:{colad.kubelet_dir / reg.endpoint}")
    yield channel
    channel.close()


def follow(channel: grpc.Channel, seen: list[set[str]], errors: list[grpc.RpcError]) -> threading.Thread:
    def run() -> None:
        try:
            for response in pb_grpc.DevicePluginStub(channel).ListAndWatch(pb.Empty()):
                seen.append({d.ID for d in response.devices})
        except grpc.RpcError as exc:
            errors.append(exc)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


def test_every_open_stream_gets_every_change(
    colad: ColadService, kubelet: FakeKubelet, plugin_channel: grpc.Channel
) -> None:
    extra: list[list[set[str]]] = [[], []]
    errors: list[grpc.RpcError] = []
    for seen in extra:
        follow(plugin_channel, seen, errors)
    for seen in extra:
        wait_until(lambda seen=seen: seen and seen[0] == {"cocacola", "peisicola"}, 10, "the full list at once")
    colad.add("fanta")
    kubelet.wait_devices({"cocacola", "peisicola", "fanta"})
    for seen in extra:
        wait_until(lambda seen=seen: seen[-1] == {"cocacola", "peisicola", "fanta"}, 10, "the change on every stream")
    assert errors == []


def test_streams_beyond_the_limit_are_refused_and_allocate_still_answers(
    colad: ColadService, kubelet: FakeKubelet, plugin_channel: grpc.Channel
) -> None:
    seen: list[list[set[str]]] = [[] for _ in range(5)]
    errors: list[grpc.RpcError] = []
    for s in seen:
        follow(plugin_channel, s, errors)
    # The kubelet holds one stream; the plugin takes at most 4, so two of ours are refused.
    wait_until(lambda: len(errors) == 2, 10, "two refused streams")
    assert {e.code() for e in errors} == {grpc.StatusCode.RESOURCE_EXHAUSTED}
    assert kubelet.allocate(["cocacola"])["envs"] == {"COLA_DEVICES": "cocacola"}
    assert kubelet.stream_alive()


def test_ten_thousand_devices_fit_one_list_and_arrive_exact(colad: ColadService, kubelet: FakeKubelet) -> None:
    kubelet.wait_registered()
    names = [f"{i:05d}-" + "x" * 57 for i in range(10_000)]  # 63 characters each: the longest IDs
    colad.add(*names)
    kubelet.wait_devices({"cocacola", "peisicola", *names}, timeout=60)
    biggest = max(u.size_bytes for u in kubelet.updates)
    assert biggest < 4 * 1024 * 1024, "the kubelet's 4 MiB receive limit"
    colad.add("one-more")
    kubelet.wait_devices({"cocacola", "peisicola", "one-more", *names}, timeout=30)


def test_a_register_the_kubelet_carries_out_late_never_leaves_two_streams(short_tmp: Path) -> None:
    """A kubelet that answers Register after colad gave up still dials the endpoint it was given.

    colad must have moved to a new socket by then, or the kubelet would hold two streams to it.
    """
    kubelet = FakeKubelet(short_tmp / "kubelet", register_delay=2.0)
    kubelet.start()
    service = ColadService(short_tmp, extra_env={"COLAD_REGISTER_TIMEOUT": "1"})
    service.add("cocacola")
    try:
        service.start()
        wait_until(lambda: len(kubelet.registrations) >= 2, 20, "a timed-out Register and its retry")
        kubelet.register_delay = 0.0
        kubelet.wait_devices({"cocacola"}, timeout=20)
        # Let the kubelet carry out every Register it held back, then look.
        wait_until(lambda: kubelet.registers_in_flight() == 0, 15, "held Registers carried out")
        kubelet.wait_devices({"cocacola"}, timeout=10)
        assert kubelet.live_streams() == 1, kubelet.registrations
        late_ok = [r for r in kubelet.registrations if r.ok]
        assert late_ok, "the retry registered"
        assert kubelet.violations == []
    finally:
        service.stop()
        kubelet.stop()
