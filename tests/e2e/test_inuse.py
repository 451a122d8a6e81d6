"""The in-use view end to end: colad under supervisord reads a fake kubelet's PodResources API.

After a pod takes a device, `colad status` (table and --json) names the holder and /metrics counts
it; after the pod goes, both go back.
"""

from __future__ import annotations

import json
import subprocess
import sys
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.fakes.kubelet import FakeKubelet
from tests.fakes.podresources import FakePodResources
from tests.helpers import metrics_address, wait_until
from tests.service import ColadService

pytestmark = pytest.mark.e2e

COLA = "myway5.com/cola"
HOLDER_SERIES = (
    'colad_device_holder_info{container="main",device_id="cocacola",namespace="default",'
    f'pod="app",resource="{COLA}"}} 1.0'
)


@pytest.fixture
def pod_resources(short_tmp: Path) -> Iterator[FakePodResources]:
    fake = FakePodResources(short_tmp / "pod-resources" / "kubelet.sock")
    fake.start()
    yield fake
    fake.stop()
    assert fake.violations == [], "the fake PodResources server saw contract violations"


@pytest.fixture
def colad(short_tmp: Path, kubelet: FakeKubelet, pod_resources: FakePodResources) -> Iterator[ColadService]:
    service = ColadService(
        short_tmp,
        extra_env={
            "COLAD_POD_RESOURCES_SOCKET": str(pod_resources.socket_path),
            "COLAD_POD_RESOURCES_INTERVAL": "0.2",
        },
    )
    service.add("cocacola", "peisicola")
    service.start()
    yield service
    rc = service.stop()
    assert rc == 0, f"supervisord exited with {rc}\n" + service.log()[-4000:]


def status(colad: ColadService, *flags: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "colad", "status", *flags], env=colad.env, capture_output=True, text=True, timeout=20
    )


def in_use(colad: ColadService) -> dict[str, Any]:
    return json.loads(status(colad, "--json").stdout)["in_use"]  # type: ignore[no-any-return]


def scrape(colad: ColadService) -> list[str]:
    address = metrics_address(colad.run_dir)
    with urllib.request.urlopen(f"http://{address}/metrics", timeout=5) as response:
        return [line for line in response.read().decode().splitlines() if line and not line.startswith("#")]


def test_status_and_metrics_follow_the_kubelets_pod_resources(
    colad: ColadService,
    kubelet: FakeKubelet,
    pod_resources: FakePodResources,
) -> None:
    kubelet.wait_registered()
    kubelet.wait_devices({"cocacola", "peisicola"})
    wait_until(lambda: in_use(colad)["available"], 15, "the in-use view available", logs=[colad.log_path])
    assert in_use(colad)["holders"] == []
    wait_until(lambda: f'colad_devices_in_use{{resource="{COLA}"}} 0.0' in scrape(colad), 10, "0 devices in use")

    kubelet.allocate(["cocacola"])
    pod_resources.assign("default", "app", "main", COLA, ["cocacola"])
    pod_resources.assign("default", "app", "main", "nvidia.com/gpu", ["GPU-1"])  # not colad's
    view = wait_until(
        lambda: (v := in_use(colad))["holders"] and v, 10, "the holder in colad status", logs=[colad.log_path]
    )
    assert view["holders"] == [
        {"resource": COLA, "device_id": "cocacola", "namespace": "default", "pod": "app", "container": "main"}
    ]
    samples = wait_until(lambda: (s := scrape(colad)) and HOLDER_SERIES in s and s, 10, "the holder in /metrics")
    assert f'colad_devices_in_use{{resource="{COLA}"}} 1.0' in samples
    assert "colad_pod_resources_up 1.0" in samples
    table = status(colad)
    assert table.returncode == 0, table.stdout + table.stderr
    assert any(line.split() == [COLA, "cocacola", "default/app", "main"] for line in table.stdout.splitlines()), (
        table.stdout
    )
    colad.wait_log('msg="device in use" resource=myway5.com/cola device=cocacola namespace=default pod=app')

    pod_resources.release("default", "app")
    wait_until(lambda: in_use(colad)["holders"] == [], 10, "the holder gone from colad status")
    samples = wait_until(lambda: (s := scrape(colad)) and HOLDER_SERIES not in s and s, 10, "the holder series gone")
    assert f'colad_devices_in_use{{resource="{COLA}"}} 0.0' in samples
    colad.wait_log('msg="device released" resource=myway5.com/cola device=cocacola')
    assert "GPU-1" not in "\n".join(samples)


def test_status_says_why_the_view_is_unavailable(
    colad: ColadService,
    kubelet: FakeKubelet,
    pod_resources: FakePodResources,
) -> None:
    kubelet.wait_registered()
    wait_until(lambda: in_use(colad)["available"], 15, "the in-use view available", logs=[colad.log_path])
    pod_resources.stop()
    view = wait_until(lambda: (v := in_use(colad))["available"] is False and v, 10, "the view unavailable")
    assert view["reason"] == f"no socket at {pod_resources.socket_path}"
    table = status(colad)
    assert table.returncode == 0, table.stdout  # the in-use view never changes the exit code
    assert f"in-use view: unavailable (no socket at {pod_resources.socket_path})" in table.stdout
    assert len(colad.log_lines("pod resources unavailable")) == 1
    pod_resources.start()
    wait_until(lambda: in_use(colad)["available"], 10, "the in-use view back", logs=[colad.log_path])
    assert len(colad.log_lines('msg="pod resources available"')) == 2
