"""The committed gRPC stubs are exactly what the pinned generator makes from the committed .proto.

Why committed and pinned: stubs from grpcio-tools 1.62.3 import and serve on both
Debian bookworm's grpcio 1.51.1 / protobuf 4.21.12 and the newest PyPI releases;
1.63 and newer emit code that fails on bookworm, and Debian's own generator is
too old for current protobuf. `make setup` installs the pin in .venv-protoc.
"""

from __future__ import annotations

import filecmp
import importlib
import shutil
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest
from google.protobuf.descriptor import FileDescriptor

from colad.api import deviceplugin_pb2 as pb
from colad.api import dra_health_v1_pb2 as healthpb
from colad.api import dra_health_v1alpha1_pb2 as healthalphapb
from colad.api import dra_v1_pb2 as drapb
from colad.api import dra_v1beta1_pb2 as drabetapb
from colad.api import pluginregistration_pb2 as regpb
from colad.api import podresources_pb2 as prpb

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[3]
GENERATOR = ROOT / ".venv-protoc" / "bin" / "python"
PROTOS = (
    "deviceplugin",
    "podresources",
    "pluginregistration",
    "dra_v1",
    "dra_v1beta1",
    "dra_health_v1",
    "dra_health_v1alpha1",
)
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


def messages(file: FileDescriptor) -> dict[str, dict[str, int]]:
    return {name: {f.name: f.number for f in m.fields} for name, m in file.message_types_by_name.items()}


def services(file: FileDescriptor) -> dict[str, dict[str, tuple[str, str, bool]]]:
    return {
        service.full_name: {
            m.name: (m.input_type.name, m.output_type.name, m.server_streaming) for m in service.methods
        }
        for service in file.services_by_name.values()
    }


# kubernetes/kubelet pkg/apis/pluginregistration/v1/api.proto: the package is "pluginregistration", not "v1".
def test_plugin_registration_matches_upstream() -> None:
    assert regpb.DESCRIPTOR.package == "pluginregistration"
    assert messages(regpb.DESCRIPTOR) == {
        "PluginInfo": {"type": 1, "name": 2, "endpoint": 3, "supported_versions": 4},
        "RegistrationStatus": {"plugin_registered": 1, "error": 2},
        "RegistrationStatusResponse": {},
        "InfoRequest": {},
    }
    assert services(regpb.DESCRIPTOR) == {
        "pluginregistration.Registration": {
            "GetInfo": ("InfoRequest", "PluginInfo", False),
            "NotifyRegistrationStatus": ("RegistrationStatus", "RegistrationStatusResponse", False),
        }
    }


DRA_MESSAGES = {
    "NodePrepareResourcesRequest": {"claims": 1},
    "NodePrepareResourcesResponse": {"claims": 1},
    "NodePrepareResourceResponse": {"devices": 1, "error": 2},
    "Device": {"request_names": 1, "pool_name": 2, "device_name": 3, "cdi_device_ids": 4},
    "NodeUnprepareResourcesRequest": {"claims": 1},
    "NodeUnprepareResourcesResponse": {"claims": 1},
    "NodeUnprepareResourceResponse": {"error": 1},
    "Claim": {"namespace": 1, "uid": 2, "name": 3},
}
DRA_METHODS = {
    "NodePrepareResources": ("NodePrepareResourcesRequest", "NodePrepareResourcesResponse", False),
    "NodeUnprepareResources": ("NodeUnprepareResourcesRequest", "NodeUnprepareResourcesResponse", False),
}


# kubernetes/kubelet pkg/apis/dra/{v1,v1beta1}/api.proto: the same messages, except that only v1's Device
# has share_id. The full package names make the gRPC paths the kubelet calls.
@pytest.mark.parametrize(
    ("file", "package", "share_id"),
    [
        (drapb.DESCRIPTOR, "k8s.io.kubelet.pkg.apis.dra.v1", True),
        (drabetapb.DESCRIPTOR, "k8s.io.kubelet.pkg.apis.dra.v1beta1", False),
    ],
    ids=["v1", "v1beta1"],
)
def test_dra_plugin_matches_upstream(file: FileDescriptor, package: str, share_id: bool) -> None:
    expected = {name: dict(fields) for name, fields in DRA_MESSAGES.items()}
    if share_id:
        expected["Device"]["share_id"] = 5
    assert file.package == package
    assert messages(file) == expected
    assert services(file) == {f"{package}.DRAPlugin": DRA_METHODS}
    responses = file.message_types_by_name["NodePrepareResourcesResponse"].fields_by_name["claims"]
    assert responses.message_type.GetOptions().map_entry


# kubernetes/kubelet pkg/apis/dra-health/{v1,v1alpha1}/api.proto: the same messages in the packages "v1" (as
# PodResources v1 is) and "v1alpha1"; the package makes the service name the kubelet dials.
@pytest.mark.parametrize(
    ("file", "package"),
    [(healthpb.DESCRIPTOR, "v1"), (healthalphapb.DESCRIPTOR, "v1alpha1")],
    ids=["v1", "v1alpha1"],
)
def test_dra_health_matches_upstream(file: FileDescriptor, package: str) -> None:
    assert file.package == package
    assert messages(file) == {
        "NodeWatchResourcesRequest": {},
        "DeviceIdentifier": {"pool_name": 1, "device_name": 2},
        "DeviceHealth": {
            "device": 1,
            "health": 2,
            "last_updated_time": 3,
            "health_check_timeout_seconds": 4,
            "message": 5,
        },
        "NodeWatchResourcesResponse": {"devices": 1},
    }
    assert {v.name: v.number for v in file.enum_types_by_name["HealthStatus"].values} == {
        "UNKNOWN": 0,
        "HEALTHY": 1,
        "UNHEALTHY": 2,
    }
    assert services(file) == {
        f"{package}.DRAResourceHealth": {
            "NodeWatchResources": ("NodeWatchResourcesRequest", "NodeWatchResourcesResponse", True)
        }
    }


def full_names(file: FileDescriptor) -> set[str]:
    """Every symbol the file adds to the descriptor pool: messages (nested too), enums and their values, services."""
    names: set[str] = set()

    def add_enums(enums: Mapping[str, Any]) -> None:
        for enum in enums.values():
            names.add(enum.full_name)
            # An enum value's full name is a sibling of its enum: <scope>.<VALUE>.
            scope = enum.full_name.rpartition(".")[0]
            names.update(f"{scope}.{value.name}" for value in enum.values)

    def add_message(message: Any) -> None:
        names.add(message.full_name)
        add_enums(message.enum_types_by_name)
        for nested in message.nested_types:
            add_message(nested)

    for message in file.message_types_by_name.values():
        add_message(message)
    add_enums(file.enum_types_by_name)
    names.update(service.full_name for service in file.services_by_name.values())
    return names


def test_no_two_protos_define_the_same_full_name() -> None:
    """Several files share a proto package ("v1": PodResources and DRA health); protobuf refuses a second
    definition of a full name in one process, so the files' symbols must stay disjoint."""
    files = {proto: importlib.import_module(f"colad.api.{proto}_pb2").DESCRIPTOR for proto in PROTOS}
    seen: dict[str, str] = {}
    for proto, file in files.items():
        assert file.name == f"colad/api/{proto}.proto"
        for name in full_names(file):
            assert name not in seen, f"{name} is defined by both {seen[name]} and {proto}"
            seen[name] = proto
    assert len({file.name for file in files.values()}) == len(PROTOS)


LOAD_ALL = (
    "import importlib, sys\n"
    "for proto in sys.argv[1:]:\n"
    "    for suffix in ('_pb2', '_pb2_grpc'):\n"
    "        importlib.import_module('colad.api.' + proto + suffix)\n"
    "print('loaded', len(sys.argv) - 1)\n"
)


@pytest.mark.parametrize(
    "python",
    [
        pytest.param(sys.executable, id="venv"),
        pytest.param("/usr/bin/python3", id="bookworm", marks=pytest.mark.debian),
    ],
)
def test_every_stub_loads_in_one_process(python: str) -> None:
    """All stubs in one fresh process, in both orders: bookworm's grpcio 1.51 / protobuf 4.21 and the venv's."""
    if not Path(python).exists():
        pytest.fail(f"{python} is missing")
    for order in (PROTOS, tuple(reversed(PROTOS))):
        result = subprocess.run(
            [python, "-c", LOAD_ALL, *order],
            cwd=ROOT,
            env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(ROOT)},
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert result.returncode == 0, result.stderr[-2000:]
        assert result.stdout.split() == ["loaded", str(len(PROTOS))]
