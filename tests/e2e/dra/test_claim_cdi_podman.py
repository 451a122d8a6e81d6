"""A real CDI consumer for a DRA claim: podman resolves the CDI IDs NodePrepareResources answered.

Device files on disk are parsed as discovery parses them; the DRA service prepares a two-device claim the
strict fake API server holds, through the strict DRA client, and podman 4.3 (Debian's) runs a container
with the answered CDI IDs, resolved from the claim's spec alone (tests/image.py run_with_cdi). The
container must see COLA_DEVICES, the device file's env, its mount and its device node.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from concurrent import futures
from pathlib import Path

import grpc
import pytest

from colad.config.config import Resource
from colad.core.devices import DeviceSet
from colad.discovery.devicefile import parse
from colad.dra.service import DraPluginService
from colad.kube.access import Access, Credentials
from colad.kube.client import KubeClient
from colad.metrics.registry import Metrics
from tests import image
from tests.fakes.apiserver import FakeApiServer, Pki
from tests.fakes.dra_kubelet import Claim, FakeDraKubelet

DRIVER = "cola.myway5.com"
RESOURCE = "myway5.com/cola"
NODE = "node-1"
TOKEN = "test-token"
PODMAN_TIMEOUT = 180


def _why_not() -> str | None:
    if shutil.which("unshare") is None:
        return "unshare (util-linux) is not installed"
    return image.unusable()


WHY_NOT = _why_not()
pytestmark = [
    pytest.mark.e2e,
    pytest.mark.skipif(WHY_NOT is not None, reason=WHY_NOT or ""),
    pytest.mark.usefixtures("base_image"),
]


@pytest.fixture
def fake(short_tmp: Path) -> Iterator[FakeApiServer]:
    (short_tmp / "pki").mkdir()
    server = FakeApiServer(Pki(short_tmp / "pki"), tokens={TOKEN}).start()
    yield server
    server.stop()


def test_podman_gives_the_container_both_devices_of_a_prepared_claim(short_tmp: Path, fake: FakeApiServer) -> None:
    device_dir, spec_dir, host = short_tmp / "colas", short_tmp / "cdi", short_tmp / "host"
    for d in (device_dir, host / "dev", host / "share"):
        d.mkdir(parents=True)
    os.mknod(host / "dev" / "cola0", 0o666 | 0o020000, os.makedev(1, 3))  # /dev/null's numbers: harmless
    (host / "share" / "hello").write_text("from the host\n")
    (device_dir / "cola0").write_text(
        f"""
[envs]
MODE = "fast"

[[device_nodes]]
host_path = "{host}/dev/cola0"
container_path = "/dev/cola"

[[mounts]]
host_path = "{host}/share"
container_path = "/opt/cola"
"""
    )
    (device_dir / "cola1").write_text('[envs]\nMODE = "slow"\n')
    devices = DeviceSet.of(parse(p.name, p.read_bytes()) for p in sorted(device_dir.iterdir()))
    claim = fake.add_claim(
        {
            "metadata": {"namespace": "default", "name": "pair", "uid": "5d0c7c56-2f3e-4b8e-9a43-0c0a0b0c0d0e"},
            "status": {
                "allocation": {
                    "devices": {
                        "results": [
                            {"request": "gpus", "driver": DRIVER, "pool": NODE, "device": "cola0"},
                            {"request": "gpus", "driver": DRIVER, "pool": NODE, "device": "cola1"},
                        ]
                    }
                }
            },
        }
    )
    service = DraPluginService(
        driver=DRIVER,
        node_name=NODE,
        client=KubeClient(Credentials(Access(server=fake.url, ca_file=str(fake.pki.ca), token=TOKEN))),
        resources=[Resource(RESOURCE, str(device_dir))],
        devices=lambda: {RESOURCE: devices},
        cdi_spec_dir=str(spec_dir),
        state_dir=str(short_tmp / "state"),
        metrics=Metrics(),
    )
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    service.add_to(server)
    server.add_insecure_port(f"unix:{short_tmp}/dra.sock")
    server.start()
    kubelet = FakeDraKubelet(f"{short_tmp}/dra.sock")
    try:
        ref = Claim("default", "pair", claim["metadata"]["uid"])
        outcome = kubelet.prepare([ref])
        assert outcome.errors == {} and kubelet.violations == []
        cdi_ids = [i for d in outcome.devices[ref.uid] for i in d.cdi_device_ids]
        script = (
            'echo "devices $COLA_DEVICES"; echo "mode $MODE"; '
            'echo "node $(stat -c "%F %t:%T" /dev/cola)"; echo "mount $(cat /opt/cola/hello)"'
        )
        result = image.run_with_cdi(short_tmp, spec_dir, cdi_ids, script, PODMAN_TIMEOUT)
        assert result.returncode == 0, f"podman exited {result.returncode}:\n{result.stdout}\n{result.stderr}"
        seen = dict(line.split(" ", 1) for line in result.stdout.splitlines() if " " in line)
        assert seen == {
            "devices": "cola0,cola1",
            "mode": "fast,slow",
            "node": "character special file 1:3",
            "mount": "from the host",
        }
        assert kubelet.unprepare([ref]).errors == {}
        gone = image.run_with_cdi(short_tmp, spec_dir, cdi_ids, "true", PODMAN_TIMEOUT)
        assert gone.returncode != 0 and "unresolvable CDI devices" in gone.stderr, gone.stderr
    finally:
        kubelet.close()
        server.stop(None)
        service.close()
