"""The plugin's metrics, health and in-use watcher come after its first Register, and lose nothing.

The life-cycle thread runs against the strict fake kubelet on the test's frozen clock, so it waits for
discovery's first snapshot as long as the test likes: meanwhile nothing listens on the metrics address.
Once Register is sent the endpoint comes up, and its counters include what was counted before it.
"""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from colad.core.devices import Device, DeviceSet
from colad.deviceplugin.service import build_server
from colad.plugin.main import Plugin
from colad.plugin.registrar import Servers
from colad.queue.framing import Peer
from colad.queue.messages import DeviceSnapshot
from tests.fakes.kubelet import FakeKubelet
from tests.helpers import http_get, wait_until
from tests.integration.support import make_config

pytestmark = pytest.mark.integration
RESOURCE = "myway5.com/cola"
DEADLINE = 30.0


class Frozen:
    """A monotonic clock that stays put: the initial wait for devices never ends on its own."""

    def __call__(self) -> float:
        return 1000.0


class Started:
    def __init__(self, root: Path) -> None:
        self.cfg = make_config(root, metrics_address="127.0.0.1:0", pod_resources_socket="")
        self.plugin = Plugin(self.cfg, clock=Frozen(), servers=Servers(build=build_server))
        self.kubelet = FakeKubelet(self.cfg.kubelet_dir, dial_timeout=5.0)
        self.result: list[int] = []
        self.thread = threading.Thread(target=lambda: self.result.append(self.plugin.run()), name="life-cycle")

    def on_disk(self) -> dict[str, object]:
        with open(self.cfg.plugin_state_file, encoding="utf-8") as handle:
            return dict(json.load(handle))


@pytest.fixture
def started(short_tmp: Path) -> Iterator[Started]:
    s = Started(short_tmp)
    s.kubelet.start()
    s.thread.start()
    yield s
    s.plugin.stop()
    s.thread.join(15)
    s.kubelet.stop()
    assert not s.thread.is_alive()
    assert s.result == [0]
    assert s.kubelet.violations == []


def test_observers_wait_for_the_first_register_and_count_what_came_before(started: Started) -> None:
    plugin = started.plugin
    wait_until(lambda: os.path.exists(started.cfg.plugin_state_file), DEADLINE, "the first state file")
    # Waiting for discovery: no Register yet, so no registry, HTTP server or in-use watcher.
    assert plugin.observers == "" and plugin.metrics_server is None and plugin.inuse is None
    assert not plugin.metrics.bound
    assert started.on_disk()["metrics_address"] == ""
    assert plugin.snapshot.state.resources[0].state == "starting"

    devices = DeviceSet.of([Device("cola1"), Device("cola2")])
    plugin.on_message(DeviceSnapshot(1, 1, devices, True, RESOURCE), Peer(os.getpid(), 0, 0))
    # Published in the snapshot (the state file follows it on the clock, which stands still here).
    address = wait_until(lambda: plugin.snapshot.state.metrics_address, DEADLINE, "the metrics address published")
    assert plugin.metrics.bound and plugin.inuse is not None
    wait_until(lambda: started.kubelet.devices(RESOURCE) == {"cola1": "Healthy", "cola2": "Healthy"}, DEADLINE, "list")
    readyz = f"http://{address}/readyz"
    code, body = wait_until(lambda: (r := http_get(readyz))[0] == 200 and r, DEADLINE, "/readyz 200")
    assert body == f"ready: {RESOURCE}, 2 devices\n"
    _, text = http_get(f"http://{address}/metrics")
    # Counted before the registry existed: the server started for the first Register, the set's change.
    assert f'colad_plugin_server_restarts_total{{reason="start",resource="{RESOURCE}"}} 1.0' in text
    assert f'colad_device_set_changes_total{{resource="{RESOURCE}"}} 1.0' in text
    assert f'colad_registrations_total{{resource="{RESOURCE}",result="success"}} 1.0' in text
