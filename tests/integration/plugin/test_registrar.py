"""colad.plugin.registrar's effect boundary: real gRPC, the strict fake kubelet, faults at the seams.

The plugin runs in a thread of the test. Its servers and Register calls are the real ones, made
through the injected `Servers` factory, which here makes one seam fail for as long as the test
says, as a task limit does (a thread that cannot start): the failure must be published, the
registration must back off, and once the fault is lifted the kubelet must get the list again.
"""

from __future__ import annotations

import os
import threading
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from colad.core.devices import Device, DeviceSet
from colad.core.registration import REGISTER_BACKOFF_MAX
from colad.deviceplugin.service import DevicePluginServicer, RegisterCall, build_server
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
NO_THREAD = "can't start new thread"


class Faults:
    """Real servers and calls; while `armed` names a seam, that seam fails as under a task limit."""

    def __init__(self) -> None:
        self.armed = ""
        self.failed: Counter[str] = Counter()
        self.leaked: list[RegisterCall] = []

    def fail(self, seam: str) -> None:
        if self.armed == seam:
            self.failed[seam] += 1
            raise RuntimeError(NO_THREAD)

    def build(self, servicer: DevicePluginServicer, path: str) -> Any:
        return FaultyServer(build_server(servicer, path), self)

    def register(self, kubelet: str, endpoint: str, resource: str, timeout: float, pre_start: bool) -> RegisterCall:
        call = RegisterCall(kubelet, endpoint, resource, timeout, pre_start)
        if self.armed == "register":
            # The call has left (the kubelet may act on it), then the thread that waits for its answer cannot
            # start: what grpc's channel does when it cannot start its spin thread.
            self.leaked.append(call)
        self.fail("register")
        return call


class FaultyServer:
    def __init__(self, server: Any, faults: Faults) -> None:
        self.server, self.faults = server, faults

    def start(self) -> None:
        self.faults.fail("start")
        self.server.start()

    def stop(self, grace: float | None) -> Any:
        self.faults.fail("stop")
        return self.server.stop(grace)


class Running:
    def __init__(self, root: Path) -> None:
        self.cfg = make_config(root, metrics_address="", pod_resources_socket="")
        self.faults = Faults()
        self.plugin = Plugin(self.cfg, servers=Servers(build=self.faults.build, register=self.faults.register))
        self.kubelet = FakeKubelet(self.cfg.kubelet_dir, dial_timeout=5.0)
        self.result: list[int] = []
        self.thread = threading.Thread(target=lambda: self.result.append(self.plugin.run()), name="life-cycle")

    def send(self, *ids: str) -> None:
        devices = DeviceSet.of([Device(i) for i in ids])
        self.plugin.on_message(DeviceSnapshot(1, 1, devices, True, RESOURCE), Peer(os.getpid(), 0, 0))

    def watcher_reports(self) -> None:
        self.plugin.on_message(KubeletState(1, 1), Peer(os.getpid(), 0, 0))

    def registered(self) -> bool:
        state = self.plugin.snapshot.state.resources[0]
        return state.registered and state.streams == 1 and self.kubelet.devices(RESOURCE) == {"cola1": "Healthy"}

    def failures(self, effect: str) -> float | None:
        labels = {"resource": RESOURCE, "effect": effect}
        return self.plugin.metrics.registry.get_sample_value("colad_registration_effect_failures_total", labels)


@pytest.fixture
def running(short_tmp: Path) -> Iterator[Running]:
    r = Running(short_tmp)
    r.kubelet.start()
    r.thread.start()
    yield r
    r.faults.armed = ""
    r.plugin.stop()
    r.thread.join(15)
    r.kubelet.stop()
    for call in r.faults.leaked:
        call.close()
    assert not r.thread.is_alive()
    assert r.result == [0]
    assert r.kubelet.violations == []


@pytest.mark.parametrize(
    ("seam", "effect"),
    [
        pytest.param("stop", "stop_server", id="the-old-server-cannot-stop"),
        pytest.param("start", "serve", id="the-new-server-cannot-start"),
        pytest.param("register", "send_register", id="the-register-call-cannot-wait-for-its-answer"),
    ],
)
def test_an_effect_failing_across_a_kubelet_restart_is_published_then_registration_returns(
    running: Running, seam: str, effect: str
) -> None:
    running.send("cola1")
    wait_until(running.registered, DEADLINE, "registered")
    first = running.kubelet.current_endpoint(RESOURCE)
    running.faults.armed = seam
    running.kubelet.restart()
    running.watcher_reports()

    def failing() -> str | None:
        state = running.plugin.snapshot.state.resources[0]
        ok, reason = running.plugin.health()
        wanted = f"{effect} failed: RuntimeError: {NO_THREAD}"
        return reason if state.state == "backoff" and state.last_error == wanted and not ok else None

    reason = wait_until(failing, DEADLINE, f"the {effect} failure published and on /healthz's verdict")
    assert f"not registered: backoff ({effect} failed" in reason
    wait_until(lambda: running.faults.failed[seam] >= 3, DEADLINE, "retried with back-off")
    assert not running.registered()
    running.faults.armed = ""
    lifted = running.plugin.clock()
    wait_until(running.registered, REGISTER_BACKOFF_MAX + 5.0, "registered again once the fault is lifted")
    assert running.plugin.clock() - lifted < REGISTER_BACKOFF_MAX + 5.0
    assert running.kubelet.current_endpoint(RESOURCE) != first
    assert running.failures(effect) == running.faults.failed[seam]
    ok, reason = running.plugin.health()
    assert ok, reason
