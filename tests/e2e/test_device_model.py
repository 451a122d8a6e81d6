"""End to end: device files with content, topology, replicas, several resources, live reload.

Real colad under the real supervisord, through the strict fake kubelet.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.fakes.kubelet import FakeKubelet
from tests.helpers import wait_until
from tests.service import ColadService

pytestmark = pytest.mark.e2e

COLA = "myway5.com/cola"
PEPSI = "myway5.com/pepsi"

FULL = """
version = 1
numa_nodes = [1]
cdi_devices = ["myway5.com/cola=cocacola"]

[envs]
FLAVOUR = "classic"

[annotations]
"myway5.com/batch" = "b1"

[[device_nodes]]
host_path = "/dev/cola0"
container_path = "/dev/cola"
permissions = "rw"

[[mounts]]
host_path = "/opt/cola/lib"
container_path = "/usr/local/cola"
"""


def reload(colad: ColadService) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "colad", "reload"], env=colad.env, capture_output=True, text=True, timeout=30
    )


def write_config(colad: ColadService, text: str) -> None:
    path = Path(colad.env["COLAD_CONFIG"])
    tmp = path.with_suffix(".tmp")
    tmp.write_text(text)
    tmp.replace(path)


@pytest.fixture
def two_resources(short_tmp: Path, kubelet: FakeKubelet) -> Iterator[ColadService]:
    """colad with the cola and pepsi resources from a [[resources]] list (no COLAD_DEVICE_DIR)."""
    service = ColadService(short_tmp)
    del service.env["COLAD_DEVICE_DIR"]
    pepsis = short_tmp / "pepsis"
    pepsis.mkdir()
    write_config(
        service,
        f'[[resources]]\nname = "{COLA}"\ndevice_dir = "{service.device_dir}"\n\n'
        f'[[resources]]\nname = "{PEPSI}"\ndevice_dir = "{pepsis}"\nreplicas = 2\n',
    )
    service.add("cocacola")
    (pepsis / "pepsi1").write_bytes(b"")
    service.start()
    yield service
    assert service.stop() == 0, service.log()[-4000:]


def test_health_from_the_file_is_seen_both_ways(colad: ColadService, kubelet: FakeKubelet) -> None:
    kubelet.wait_devices({"cocacola", "peisicola"})
    (colad.device_dir / "cocacola").write_text('health = "Unhealthy"\n')
    kubelet.wait_devices({"cocacola": "Unhealthy", "peisicola": "Healthy"})
    with pytest.raises(Exception, match="Unhealthy"):
        kubelet.allocate(["cocacola"])
    (colad.device_dir / "cocacola").write_text('health = "Healthy"\n')
    kubelet.wait_devices({"cocacola": "Healthy", "peisicola": "Healthy"})
    assert kubelet.allocate(["cocacola"])["envs"]["COLA_DEVICES"] == "cocacola"


def test_a_malformed_file_makes_only_its_device_unhealthy(colad: ColadService, kubelet: FakeKubelet) -> None:
    kubelet.wait_devices({"cocacola", "peisicola"})
    (colad.device_dir / "peisicola").write_text("numa_nodes = [\n")
    kubelet.wait_devices({"cocacola": "Healthy", "peisicola": "Unhealthy"})
    line = colad.wait_log('msg="device file malformed: device is Unhealthy"')[0]
    assert "device=peisicola" in line and "reason=" in line
    (colad.device_dir / "peisicola").write_text("numa_nodes = [0]\n")
    kubelet.wait_devices({"cocacola": "Healthy", "peisicola": "Healthy"})
    colad.wait_log('msg="device file valid again"')


def test_allocate_returns_nodes_mounts_envs_annotations_and_cdi(colad: ColadService, kubelet: FakeKubelet) -> None:
    # The files name /dev/cola0 and /opt/cola/lib, which this machine does not have: without the check,
    # the Allocate answer is what is under test (host-path health has tests of its own).
    write_config(colad, "host_path_check = false\n")
    assert reload(colad).returncode == 0
    (colad.device_dir / "cocacola").write_text(FULL)
    (colad.device_dir / "peisicola").write_text(
        'numa_nodes = [0]\ncdi_devices = ["myway5.com/cola=peisicola"]\n'
        '[[device_nodes]]\nhost_path = "/dev/cola1"\npermissions = "r"\n'
    )
    wait_until(lambda: kubelet.topology() == {"cocacola": (1,), "peisicola": (0,)}, 10, "NUMA topology listed")
    answer = kubelet.allocate(["peisicola", "cocacola"])
    assert answer["envs"] == {"COLA_DEVICES": "peisicola,cocacola", "FLAVOUR": "classic"}
    assert answer["devices"] == [
        {"container_path": "/dev/cola1", "host_path": "/dev/cola1", "permissions": "r"},
        {"container_path": "/dev/cola", "host_path": "/dev/cola0", "permissions": "rw"},
    ]
    assert answer["mounts"] == [{"container_path": "/usr/local/cola", "host_path": "/opt/cola/lib", "read_only": True}]
    assert answer["annotations"] == {"myway5.com/batch": "b1"}
    assert answer["cdi_devices"] == ["myway5.com/cola=peisicola", "myway5.com/cola=cocacola"]
    # Only what the requested device carries.
    assert kubelet.allocate(["peisicola"])["mounts"] == []


def test_preferred_allocation_keeps_to_one_numa_node(colad: ColadService, kubelet: FakeKubelet) -> None:
    for name, node in (("cocacola", 0), ("peisicola", 1), ("fanta", 1), ("sprite", 0), ("tango", 1)):
        (colad.device_dir / name).write_text(f"numa_nodes = [{node}]\n")
    wait_until(lambda: len(kubelet.topology()) == 5, 10, "five devices with topology")
    everything = ["cocacola", "fanta", "peisicola", "sprite", "tango"]
    assert sorted(kubelet.get_preferred_allocation(everything, [], 3)) == ["fanta", "peisicola", "tango"]
    assert kubelet.get_preferred_allocation(everything, ["cocacola"], 2) == ["cocacola", "sprite"]


def test_two_resources_register_and_allocate_apart(two_resources: ColadService, kubelet: FakeKubelet) -> None:
    kubelet.wait_devices({"cocacola"}, resource=COLA)
    kubelet.wait_devices({"pepsi1::0", "pepsi1::1"}, resource=PEPSI)
    assert kubelet.current_endpoint(COLA) != kubelet.current_endpoint(PEPSI)
    assert kubelet.allocate(["cocacola"], resource=COLA)["envs"] == {"COLA_DEVICES": "cocacola"}
    shared = kubelet.allocate(["pepsi1::1"], resource=PEPSI)["envs"]
    assert shared == {"COLA_DEVICES": "pepsi1", "COLA_REPLICAS": "pepsi1::1"}
    # Each resource's devices follow its own directory.
    (two_resources.root / "pepsis" / "pepsi2").write_bytes(b"")
    kubelet.wait_devices({"pepsi1::0", "pepsi1::1", "pepsi2::0", "pepsi2::1"}, resource=PEPSI)
    assert kubelet.devices(COLA) == {"cocacola": "Healthy"}
    # Spread: two replicas on two devices.
    preferred = kubelet.get_preferred_allocation(sorted(kubelet.devices(PEPSI) or {}), [], 2, resource=PEPSI)
    assert {p.split("::")[0] for p in preferred} == {"pepsi1", "pepsi2"}
    state = json.loads((two_resources.run_dir / "state" / "plugin.json").read_text())
    assert [r["name"] for r in state["resources"]] == [COLA, PEPSI] and state["registered"]


def test_reload_refuses_a_list_while_the_environment_pins_one_resource(
    colad: ColadService, kubelet: FakeKubelet
) -> None:
    kubelet.wait_devices({"cocacola", "peisicola"})
    registrations = len(kubelet.successful_registrations())
    endpoint = kubelet.current_endpoint(COLA)
    pepsis = colad.root / "pepsis"
    pepsis.mkdir()
    (pepsis / "pepsi1").write_text("numa_nodes = [0]\n")
    # COLAD_DEVICE_DIR pins the single resource; a list replaces it, so the variable must go.
    colad.env.pop("COLAD_DEVICE_DIR")
    write_config(
        colad,
        f'[[resources]]\nname = "{COLA}"\ndevice_dir = "{colad.device_dir}"\n\n'
        f'[[resources]]\nname = "{PEPSI}"\ndevice_dir = "{pepsis}"\n',
    )
    # The running processes keep the environment they started with, which pins device_dir:
    # this reload is refused, and says why.
    result = reload(colad)
    assert result.returncode == 1, result
    assert "cannot be used with a [[resources]] list" in result.stderr
    assert kubelet.resources() == [COLA]
    colad.wait_log('msg="reload refused; the running config stays"')
    assert kubelet.current_endpoint(COLA) == endpoint
    assert len(kubelet.successful_registrations()) == registrations


def test_reload_adds_and_removes_resources(two_resources: ColadService, kubelet: FakeKubelet) -> None:
    colad = two_resources
    kubelet.wait_devices({"cocacola"}, resource=COLA)
    kubelet.wait_devices({"pepsi1::0", "pepsi1::1"}, resource=PEPSI)
    cola_endpoint = kubelet.current_endpoint(COLA)
    cola_registrations = [r for r in kubelet.successful_registrations() if r.resource_name == COLA]
    fantas = colad.root / "fantas"
    fantas.mkdir()
    (fantas / "fanta1").write_bytes(b"")
    write_config(
        colad,
        f'[[resources]]\nname = "{COLA}"\ndevice_dir = "{colad.device_dir}"\n\n'
        f'[[resources]]\nname = "myway5.com/fanta"\ndevice_dir = "{fantas}"\n',
    )
    result = reload(colad)
    assert result.returncode == 0, result
    assert "added=myway5.com/fanta" in result.stdout and f"removed={PEPSI}" in result.stdout
    kubelet.wait_devices({"fanta1"}, resource="myway5.com/fanta")
    # The removed resource told the kubelet its devices are gone before its stream ended.
    wait_until(lambda: kubelet.devices(PEPSI) == {}, 10, "pepsi withdrawn with an empty list")
    # The unchanged resource was not touched: same endpoint, no new Register, stream alive.
    assert kubelet.current_endpoint(COLA) == cola_endpoint
    assert [r for r in kubelet.successful_registrations() if r.resource_name == COLA] == cola_registrations
    assert kubelet.stream_alive(COLA)
    assert kubelet.allocate(["fanta1"], resource="myway5.com/fanta")["envs"] == {"COLA_DEVICES": "fanta1"}
    # Discovery follows the new directory and no longer the old one.
    (fantas / "fanta2").write_bytes(b"")
    kubelet.wait_devices({"fanta1", "fanta2"}, resource="myway5.com/fanta")


def test_an_invalid_reload_is_refused_and_the_old_config_keeps_running(
    two_resources: ColadService, kubelet: FakeKubelet
) -> None:
    colad = two_resources
    kubelet.wait_devices({"cocacola"}, resource=COLA)
    registrations = len(kubelet.successful_registrations())
    write_config(colad, f'[[resources]]\nname = "{COLA}"\ndevice_dir = "relative/path"\n')
    result = reload(colad)
    assert result.returncode == 2, result
    assert "resources[0].device_dir" in result.stderr and "absolute" in result.stderr
    # Sent anyway (an operator's `kill -HUP`): every process refuses it with a clear line.
    colad.rpc().supervisor.signalProcessGroup("colad", "HUP")
    lines = colad.wait_log('msg="reload refused; the running config stays"', count=3)
    assert {line.split("proc=")[1].split()[0] for line in lines} == {"plugin", "discovery", "kubelet-watch"}
    (colad.device_dir / "fanta").write_bytes(b"")
    kubelet.wait_devices({"cocacola", "fanta"}, resource=COLA)
    kubelet.wait_devices({"pepsi1::0", "pepsi1::1"}, resource=PEPSI)
    assert len(kubelet.successful_registrations()) == registrations


def test_stop_withdraws_every_resource(two_resources: ColadService, kubelet: FakeKubelet) -> None:
    kubelet.wait_devices({"cocacola"}, resource=COLA)
    kubelet.wait_devices({"pepsi1::0", "pepsi1::1"}, resource=PEPSI)
    assert two_resources.stop() == 0
    assert kubelet.devices(COLA) == {} and kubelet.devices(PEPSI) == {}
    two_resources.start()  # the fixture stops it again
    kubelet.wait_devices({"cocacola"}, resource=COLA)
    # Replica IDs are stable across restarts: the kubelet's checkpoint still matches them.
    kubelet.wait_devices({"pepsi1::0", "pepsi1::1"}, resource=PEPSI)
