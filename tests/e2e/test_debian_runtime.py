"""The same colad, run by Debian bookworm's python3 with bookworm's own packages.

grpcio 1.51.1, protobuf 4.21.12, pyinotify 0.9.6, supervisor 4.2.5 and
prometheus-client 0.16.0 are what the .deb runs on; the committed stubs and
every role must work there exactly as in the virtualenv.
"""

from __future__ import annotations

import subprocess
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.fakes.kubelet import FakeKubelet
from tests.helpers import metrics_address
from tests.service import ColadService

pytestmark = [pytest.mark.e2e, pytest.mark.debian]

DEBIAN_PYTHON = "/usr/bin/python3"
EXPECTED = {"grpc": "1.51.1", "google.protobuf": "4.21.12", "supervisor": "4.2.5"}


def debian_versions() -> dict[str, str]:
    script = (
        "import grpc, google.protobuf, importlib.metadata as m;"
        "print(grpc.__version__); print(google.protobuf.__version__); print(m.version('supervisor'))"
    )
    out = subprocess.run([DEBIAN_PYTHON, "-c", script], capture_output=True, text=True, check=True, timeout=30)
    return dict(zip(EXPECTED, out.stdout.split(), strict=True))


def test_debian_runtime_is_bookworms() -> None:
    assert debian_versions() == EXPECTED


@pytest.fixture
def debian_colad(short_tmp: Path, kubelet: FakeKubelet) -> Iterator[ColadService]:
    service = ColadService(short_tmp, python=DEBIAN_PYTHON)
    service.add("cocacola", "peisicola")
    service.start()
    yield service
    assert service.stop() == 0, service.log()[-4000:]


def test_colad_serves_on_bookworm_packages(debian_colad: ColadService, kubelet: FakeKubelet) -> None:
    kubelet.wait_registered()
    kubelet.wait_devices({"cocacola", "peisicola"})
    assert kubelet.allocate(["cocacola"])["envs"] == {"COLA_DEVICES": "cocacola"}
    assert kubelet.get_preferred_allocation(["peisicola", "cocacola"], [], 1) == ["cocacola"]
    debian_colad.add("fanta")
    kubelet.wait_devices({"cocacola", "peisicola", "fanta"})
    kubelet.restart()
    kubelet.wait_registered(count=2, timeout=15)
    kubelet.wait_devices({"cocacola", "peisicola", "fanta"}, timeout=15)
    assert "/usr/bin/python3 -m colad plugin" in (debian_colad.run_dir / "supervisord.conf").read_text()


def test_metrics_on_bookworms_prometheus_client(debian_colad: ColadService, kubelet: FakeKubelet) -> None:
    kubelet.wait_registered()
    kubelet.wait_devices({"cocacola", "peisicola"})
    kubelet.allocate(["peisicola"])
    address = metrics_address(debian_colad.run_dir)
    text = urllib.request.urlopen(f"http://{address}/metrics", timeout=10).read().decode()
    check = subprocess.run(["promtool", "check", "metrics"], input=text, capture_output=True, text=True, timeout=30)
    assert check.returncode == 0, check.stdout + check.stderr
    assert 'colad_allocate_requests_total{resource="myway5.com/cola",result="success"} 1.0' in text
    assert 'grpcio="1.51.1"' in text and 'protobuf="4.21.12"' in text
    assert "_created" not in text
