"""The committed gRPC stubs are exactly what the pinned generator makes from the committed .proto.

Why committed and pinned: stubs from grpcio-tools 1.62.3 import and serve on both
Debian bookworm's grpcio 1.51.1 / protobuf 4.21.12 and the newest PyPI releases;
1.63 and newer emit code that fails on bookworm, and Debian's own generator is
too old for current protobuf. `make setup` installs the pin in .venv-protoc.
"""

from __future__ import annotations

import filecmp
import shutil
import subprocess
from pathlib import Path

import pytest

from colad.api import deviceplugin_pb2 as pb
from colad.api import podresources_pb2 as prpb

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[3]
GENERATOR = ROOT / ".venv-protoc" / "bin" / "python"
PROTOS = ("deviceplugin", "podresources")
STUBS = tuple(f"{proto}{suffix}" for proto in PROTOS for suffix in ("_pb2.py", "_pb2.pyi", "_pb2_grpc.py"))


def test_regenerating_the_stubs_changes_nothing(tmp_path: Path) -> None:
    if not GENERATOR.exists():
        pytest.fail("the pinned generator is missing: run `make setup`")
    version = subprocess.run(
        [str(GENERATOR), "-c", "import importlib.metadata as m; print(m.version('grpcio-tools'))"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    assert version == "1.62.3"
    (tmp_path / "colad" / "api").mkdir(parents=True)
    for proto in PROTOS:  # one protoc run per file, as `make stubs` does
        shutil.copy(ROOT / f"colad/api/{proto}.proto", tmp_path / f"colad/api/{proto}.proto")
        subprocess.run(
            [
                str(GENERATOR),
                "-m",
                "grpc_tools.protoc",
                "-I.",
                "--python_out=.",
                "--pyi_out=.",
                "--grpc_python_out=.",
                f"colad/api/{proto}.proto",
            ],
            cwd=tmp_path,
            check=True,
        )
    for name in STUBS:
        assert filecmp.cmp(tmp_path / "colad/api" / name, ROOT / "colad/api" / name, shallow=False), name


# Wire compatibility: the names and numbers the kubelet's Go code was built with.
EXPECTED_FIELDS = {
    "DevicePluginOptions": {"pre_start_required": 1, "get_preferred_allocation_available": 2},
    "RegisterRequest": {"version": 1, "endpoint": 2, "resource_name": 3, "options": 4},
    "Empty": {},
    "ListAndWatchResponse": {"devices": 1},
    "TopologyInfo": {"nodes": 1},
    "NUMANode": {"ID": 1},
    "Device": {"ID": 1, "health": 2, "topology": 3},
    "PreStartContainerRequest": {"devices_ids": 1},
    "PreStartContainerResponse": {},
    "PreferredAllocationRequest": {"container_requests": 1},
    "ContainerPreferredAllocationRequest": {
        "available_deviceIDs": 1,
        "must_include_deviceIDs": 2,
        "allocation_size": 3,
    },
    "PreferredAllocationResponse": {"container_responses": 1},
    "ContainerPreferredAllocationResponse": {"deviceIDs": 1},
    "AllocateRequest": {"container_requests": 1},
    "ContainerAllocateRequest": {"devices_ids": 1},
    "CDIDevice": {"name": 1},
    "AllocateResponse": {"container_responses": 1},
    "ContainerAllocateResponse": {"envs": 1, "mounts": 2, "devices": 3, "annotations": 4, "cdi_devices": 5},
    "Mount": {"container_path": 1, "host_path": 2, "read_only": 3},
    "DeviceSpec": {"container_path": 1, "host_path": 2, "permissions": 3},
}
EXPECTED_METHODS = {
    "Registration": {"Register": ("RegisterRequest", "Empty", False)},
    "DevicePlugin": {
        "GetDevicePluginOptions": ("Empty", "DevicePluginOptions", False),
        "ListAndWatch": ("Empty", "ListAndWatchResponse", True),
        "GetPreferredAllocation": ("PreferredAllocationRequest", "PreferredAllocationResponse", False),
        "Allocate": ("AllocateRequest", "AllocateResponse", False),
        "PreStartContainer": ("PreStartContainerRequest", "PreStartContainerResponse", False),
    },
}


def test_proto_package_and_messages_match_upstream() -> None:
    file = pb.DESCRIPTOR
    assert file.package == "v1beta1"
    assert {name: {f.name: f.number for f in m.fields} for name, m in file.message_types_by_name.items()} == (
        EXPECTED_FIELDS
    )


def test_services_match_upstream() -> None:
    services = {}
    for name, service in pb.DESCRIPTOR.services_by_name.items():
        assert service.full_name == f"v1beta1.{name}"
        services[name] = {m.name: (m.input_type.name, m.output_type.name, m.server_streaming) for m in service.methods}
    assert services == EXPECTED_METHODS


# kubernetes/kubelet pkg/apis/podresources/v1/api.proto: the subset colad keeps, upstream names and numbers.
# Left out on purpose (never reuse the numbers): rpc Get, PodResources.cpu_ids = 4 / memory = 5,
# ContainerResources.dynamic_resources = 5 and the DRA messages.
EXPECTED_POD_RESOURCES_FIELDS = {
    "AllocatableResourcesRequest": {},
    "AllocatableResourcesResponse": {"devices": 1, "cpu_ids": 2, "memory": 3},
    "ListPodResourcesRequest": {},
    "ListPodResourcesResponse": {"pod_resources": 1},
    "PodResources": {"name": 1, "namespace": 2, "containers": 3},
    "ContainerResources": {"name": 1, "devices": 2, "cpu_ids": 3, "memory": 4},
    "ContainerMemory": {"memory_type": 1, "size": 2, "topology": 3},
    "ContainerDevices": {"resource_name": 1, "device_ids": 2, "topology": 3},
    "TopologyInfo": {"nodes": 1},
    "NUMANode": {"ID": 1},
}
EXPECTED_POD_RESOURCES_METHODS = {
    "PodResourcesLister": {
        "List": ("ListPodResourcesRequest", "ListPodResourcesResponse", False),
        "GetAllocatableResources": ("AllocatableResourcesRequest", "AllocatableResourcesResponse", False),
    },
}


def test_pod_resources_messages_match_upstream() -> None:
    file = prpb.DESCRIPTOR
    assert file.package == "v1"
    assert {name: {f.name: f.number for f in m.fields} for name, m in file.message_types_by_name.items()} == (
        EXPECTED_POD_RESOURCES_FIELDS
    )


def test_pod_resources_service_matches_upstream() -> None:
    services = {}
    for name, service in prpb.DESCRIPTOR.services_by_name.items():
        assert service.full_name == f"v1.{name}"
        services[name] = {m.name: (m.input_type.name, m.output_type.name, m.server_streaming) for m in service.methods}
    assert services == EXPECTED_POD_RESOURCES_METHODS
