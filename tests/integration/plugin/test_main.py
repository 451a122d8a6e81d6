"""Integration tests for colad.plugin in-process: the life-cycle thread against the strict fake kubelet.

The plugin runs in a thread of the test with real gRPC on temporary Unix sockets; device
snapshots arrive as the queue thread would post them. Its servers are built through the
injected `Servers` factory, which lets a test count them or make one fail.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from colad.core.devices import Device, DeviceSet
from colad.deviceplugin.service import DevicePluginServicer, build_server
from colad.plugin.main import Plugin
from colad.plugin.registrar import Servers
from colad.queue.framing import Peer
from colad.queue.messages import DeviceSnapshot, KubeletState
from tests.fakes.kubelet import FakeKubelet
from tests.helpers import wait_until
from tests.integration.support import make_config

pytestmark = pytest.mark.integration

RESOURCE = "myway5.com/cola"
DEADLINE = 30.0


class CountingServers:
    """Real gRPC servers, counted; the first `failures` builds refuse as a bind failure would."""

    def __init__(self, failures: int = 0) -> None:
        self.built: list[str] = []
        self.failures = failures

    def build(self, servicer: DevicePluginServicer, path: str) -> Any:
        if self.failures:
            self.failures -= 1
            raise OSError(f"cannot listen on {path}")
        self.built.append(os.path.basename(path))
        return build_server(servicer, path)


class Running:
    def __init__(self, root: Path, servers: CountingServers) -> None:
        self.cfg = make_config(root, metrics_address="", pod_resources_socket="")
        self.servers = servers
        self.plugin = Plugin(self.cfg, servers=Servers(build=servers.build))
        self.kubelet = FakeKubelet(self.cfg.kubelet_dir, dial_timeout=5.0)
        self.result: list[int] = []
        self.thread = threading.Thread(target=lambda: self.result.append(self.plugin.run()), name="life-cycle")

    def send(self, *ids: str, seq: int = 1) -> None:
        devices = DeviceSet.of([Device(i) for i in ids])
        self.plugin.on_message(DeviceSnapshot(1, seq, devices, True, RESOURCE), Peer(os.getpid(), 0, 0))

    def watcher_reports(self) -> None:
        """What kubelet-watch sends when kubelet.sock changes; the plugin checks it by stat() itself."""
        self.plugin.on_message(KubeletState(1, 1), Peer(os.getpid(), 0, 0))

    def held(self) -> dict[str, str] | None:
        return self.kubelet.devices(RESOURCE)


@pytest.fixture
def running(short_tmp: Path) -> Iterator[Running]:
    r = Running(short_tmp, CountingServers())
    r.kubelet.start()
    r.thread.start()
    yield r
    r.plugin.stop()
    r.thread.join(15)
    r.kubelet.stop()
    assert not r.thread.is_alive()
    assert r.result == [0]
    assert r.kubelet.violations == []


def registered_with_stream(r: Running) -> bool:
    state = r.plugin.snapshot.state.resources[0]
    return state.registered and state.streams == 1


def test_registers_after_the_first_snapshot_and_the_kubelet_holds_the_list(running: Running) -> None:
    running.send("cola1", "cola2")
    wait_until(lambda: running.held() == {"cola1": "Healthy", "cola2": "Healthy"}, DEADLINE, "the list")
    wait_until(lambda: registered_with_stream(running), DEADLINE, "published: registered, one stream")
    assert len(running.servers.built) == 1, "one server for one registration"
    ok, reason = running.plugin.health()
    assert ok, reason
    running.send("cola1", seq=2)
    wait_until(lambda: running.held() == {"cola1": "Healthy"}, DEADLINE, "the change")
    assert running.plugin.snapshot.state.resources[0].devices == 1


def test_a_restarted_kubelet_gets_a_fresh_socket_and_the_exact_list(running: Running) -> None:
    running.send("cola1")
    wait_until(lambda: registered_with_stream(running), DEADLINE, "registered")
    first = running.kubelet.current_endpoint(RESOURCE)
    running.kubelet.restart()
    running.watcher_reports()
    wait_until(
        lambda: (
            running.kubelet.current_endpoint(RESOURCE) not in (None, first) and running.held() == {"cola1": "Healthy"}
        ),
        DEADLINE,
        "registered again on a new socket",
    )
    wait_until(lambda: registered_with_stream(running), DEADLINE, "one live stream again")
    assert running.servers.built[-1] == running.kubelet.current_endpoint(RESOURCE)
    assert len(running.servers.built) == 2


def test_stop_withdraws_the_devices_and_removes_the_socket(short_tmp: Path) -> None:
    r = Running(short_tmp, CountingServers())
    with r.kubelet:
        r.thread.start()
        r.send("cola1", "cola2")
        wait_until(lambda: registered_with_stream(r), DEADLINE, "registered")
        socket_path = Path(r.cfg.kubelet_dir) / r.servers.built[0]
        r.plugin.stop()
        r.thread.join(15)
        assert r.result == [0]
        # The fake reads the stream on its own thread: once it has seen the stream end, what it
        # holds is final ({} if the empty list came first, all Unhealthy if it did not).
        wait_until(lambda: r.kubelet.live_streams() == 0, DEADLINE, "the kubelet saw the stream end")
        assert r.held() == {}, "the kubelet was sent an empty list before the socket went"
        assert not socket_path.exists()
        assert r.plugin.snapshot.state.resources[0].state == "stopped"


def test_a_server_that_cannot_bind_is_retried_with_back_off(short_tmp: Path) -> None:
    r = Running(short_tmp, CountingServers(failures=2))
    with r.kubelet:
        r.thread.start()
        r.send("cola1")
        wait_until(lambda: r.held() == {"cola1": "Healthy"}, DEADLINE, "registered after two failed binds")
        assert r.servers.failures == 0 and len(r.servers.built) == 1
        r.plugin.stop()
        r.thread.join(15)
    assert r.result == [0]
