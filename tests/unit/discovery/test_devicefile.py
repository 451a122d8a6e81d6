"""Unit tests for colad.discovery.devicefile: the device file format (docs/DEVICES.md)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from colad.core.constants import HEALTHY, MAX_DEVICE_FILE_BYTES, UNHEALTHY
from colad.core.devices import Device, DeviceNode, Mount
from colad.discovery.devicefile import parse
from colad.queue.device_wire import device_from_wire, device_to_wire

pytestmark = pytest.mark.unit

DOCS = Path(__file__).resolve().parents[3] / "docs" / "DEVICES.md"

FULL = b"""
version = 1
health = "Healthy"
numa_nodes = [1, 0, 1]
cdi_devices = ["vendor.com/cola=cola1", "nvidia.com/gpu=0"]

[envs]
COLALIKE = "allowed: only the COLA_ prefix is reserved"
VISIBLE = "1"

[annotations]
"example.com/key" = "v"
plain = "w"

[[device_nodes]]
host_path = "/dev/cola1"

[[device_nodes]]
host_path = "/dev/cola1-ctl"
container_path = "/dev/cola-ctl"
permissions = "mwr"

[[mounts]]
host_path = "/opt/cola"

[[mounts]]
host_path = "/var/lib/cola"
container_path = "/cola/state"
read_only = false
"""

VALID = [
    # (content, expected device)
    pytest.param(b"", Device("d"), id="empty"),
    pytest.param(b"  \n\t\n", Device("d"), id="whitespace"),
    pytest.param(b"# just a comment\n\n# another\n", Device("d"), id="comments"),
    pytest.param(b"version = 1\n", Device("d"), id="version-only"),
    pytest.param(b'health = "Healthy"', Device("d"), id="explicit-healthy"),
    pytest.param(b'health = "Unhealthy"', Device("d", UNHEALTHY), id="declared-unhealthy-no-problem"),
    pytest.param(b"numa_nodes = [3, 1, 3]", Device("d", numa_nodes=(1, 3)), id="numa-sorted-unique"),
    pytest.param(b"numa_nodes = [0, 1023]", Device("d", numa_nodes=(0, 1023)), id="numa-bounds"),
    pytest.param(b"numa_nodes = []", Device("d"), id="numa-empty-list"),
    pytest.param(
        b'[[device_nodes]]\nhost_path = "/dev/cola1"',
        Device("d", device_nodes=(DeviceNode("/dev/cola1", "/dev/cola1", "rw"),)),
        id="device-node-defaults",
    ),
    pytest.param(
        b'[[device_nodes]]\nhost_path = "/dev/a"\ncontainer_path = "/dev/b"\npermissions = "mr"',
        Device("d", device_nodes=(DeviceNode("/dev/a", "/dev/b", "rm"),)),
        id="device-node-permissions-canonical",
    ),
    pytest.param(
        b'[[mounts]]\nhost_path = "/opt/cola"',
        Device("d", mounts=(Mount("/opt/cola", "/opt/cola", True),)),
        id="mount-defaults",
    ),
    pytest.param(
        b'[[mounts]]\nhost_path = "/a"\ncontainer_path = "/b"\nread_only = false',
        Device("d", mounts=(Mount("/a", "/b", False),)),
        id="mount-read-write",
    ),
    pytest.param(
        b'[envs]\nB = "2"\nA = "1"\n_x = ""\ncola_lower = "ok"',
        Device("d", envs=(("A", "1"), ("B", "2"), ("_x", ""), ("cola_lower", "ok"))),
        id="envs-sorted",
    ),
    pytest.param(
        b'[annotations]\n"example.com/k" = "v"\n"a.b-c/D_e.f" = "w"\nplain = ""',
        Device("d", annotations=(("a.b-c/D_e.f", "w"), ("example.com/k", "v"), ("plain", ""))),
        id="annotations",
    ),
    pytest.param(
        b'cdi_devices = ["vendor.com/cola=cola1", "nvidia.com/gpu=0", "a/b=c:d.e"]',
        Device("d", cdi_devices=("vendor.com/cola=cola1", "nvidia.com/gpu=0", "a/b=c:d.e")),
        id="cdi-devices-order-kept",
    ),
    pytest.param(
        b'health = "Unhealthy"\nnuma_nodes = [0]\n[[device_nodes]]\nhost_path = "/dev/x"',
        Device("d", UNHEALTHY, numa_nodes=(0,), device_nodes=(DeviceNode("/dev/x", "/dev/x"),)),
        id="declared-unhealthy-keeps-fields",
    ),
    pytest.param(
        FULL,
        Device(
            "d",
            HEALTHY,
            numa_nodes=(0, 1),
            device_nodes=(
                DeviceNode("/dev/cola1", "/dev/cola1", "rw"),
                DeviceNode("/dev/cola1-ctl", "/dev/cola-ctl", "rwm"),
            ),
            mounts=(Mount("/opt/cola", "/opt/cola", True), Mount("/var/lib/cola", "/cola/state", False)),
            envs=(("COLALIKE", "allowed: only the COLA_ prefix is reserved"), ("VISIBLE", "1")),
            annotations=(("example.com/key", "v"), ("plain", "w")),
            cdi_devices=("vendor.com/cola=cola1", "nvidia.com/gpu=0"),
        ),
        id="every-key",
    ),
    pytest.param(b"\n" * MAX_DEVICE_FILE_BYTES, Device("d"), id="exactly-the-size-limit"),
]


@pytest.mark.parametrize("content, expected", VALID)
def test_parse_valid(content: bytes, expected: Device) -> None:
    assert parse("d", content) == expected


def _node(**fields: str) -> bytes:
    return b"[[device_nodes]]\n" + b"".join(f"{k} = {v}\n".encode() for k, v in fields.items())


def _mount(**fields: str) -> bytes:
    return b"[[mounts]]\n" + b"".join(f"{k} = {v}\n".encode() for k, v in fields.items())


INVALID = [
    # (content, fragment of the problem)
    pytest.param(b"\n" * (MAX_DEVICE_FILE_BYTES + 1), "larger than 65536 bytes", id="too-large"),
    pytest.param(b"health = \xff", "not UTF-8", id="not-utf8"),
    pytest.param(b"\xef\xbb\xbfversion = 1", "invalid TOML", id="utf8-bom"),
    pytest.param(b"health = ", "invalid TOML", id="invalid-toml"),
    pytest.param(b"a = " + b"[" * 20000, "invalid TOML", id="deep-nesting"),
    pytest.param(b"[envs]\nA = 'x'\n[envs]\nB = 'y'", "invalid TOML", id="table-twice"),
    pytest.param(b"colour = 'red'", "unknown key 'colour'", id="unknown-key"),
    pytest.param(b"problem = 'x'", "unknown key 'problem'", id="problem-is-not-a-file-key"),
    pytest.param(b"version = 2", "unsupported version 2", id="version-2"),
    pytest.param(b"version = 0", "unsupported version 0", id="version-0"),
    pytest.param(b"version = '1'", "version must be an integer", id="version-string"),
    pytest.param(b"version = true", "version must be an integer", id="version-bool"),
    pytest.param(b"health = 'healthy'", "health must be", id="health-lower-case"),
    pytest.param(b"health = 1", "health must be", id="health-int"),
    pytest.param(b"numa_nodes = 0", "numa_nodes must be a list of integers", id="numa-single-int"),
    pytest.param(b"numa_nodes = ['0']", "numa_nodes must be a list of integers", id="numa-string"),
    pytest.param(b"numa_nodes = [true]", "numa_nodes must be a list of integers", id="numa-bool"),
    pytest.param(b"numa_nodes = [1.0]", "numa_nodes must be a list of integers", id="numa-float"),
    pytest.param(b"numa_nodes = [-1]", "numa_nodes: -1 is not in 0..1023", id="numa-negative"),
    pytest.param(b"numa_nodes = [1024]", "numa_nodes: 1024 is not in 0..1023", id="numa-too-big"),
    pytest.param(f"numa_nodes = {list(range(65))}".encode(), "numa_nodes has more than 64", id="numa-too-many"),
    pytest.param(b"cdi_devices = 'a.com/b=c'", "cdi_devices must be a list of strings", id="cdi-not-list"),
    pytest.param(b"cdi_devices = ['cola1']", "cdi_devices[0]", id="cdi-unqualified"),
    pytest.param(b"cdi_devices = ['a.com/b']", "not a fully qualified CDI name", id="cdi-no-name"),
    pytest.param(b"cdi_devices = ['a.com/b=']", "not a fully qualified CDI name", id="cdi-empty-name"),
    pytest.param(b"cdi_devices = ['1a.com/b=c']", "not a fully qualified CDI name", id="cdi-vendor-digit-first"),
    pytest.param(b"cdi_devices = ['a.com/b.c=d']", "not a fully qualified CDI name", id="cdi-class-dot"),
    pytest.param(b"cdi_devices = ['a.com/b=c d']", "not a fully qualified CDI name", id="cdi-space"),
    pytest.param(b"cdi_devices = ['a.com/b=c-']", "not a fully qualified CDI name", id="cdi-name-trailing-dash"),
    pytest.param(b"cdi_devices = ['a.com/b=c', 'a.com/b=c']", "cdi_devices[1]", id="cdi-duplicate"),
    pytest.param(
        f"cdi_devices = {[f'a.com/b=c{i}' for i in range(65)]}".encode(), "cdi_devices has more than 64", id="cdi-many"
    ),
    pytest.param(b"envs = 'A=1'", "envs must be a table", id="envs-not-table"),
    pytest.param(b"[envs]\nA = 1", "envs.A must be a string", id="env-value-int"),
    pytest.param(b"[envs.A]\nB = 'x'", "envs.A must be a string", id="env-value-table"),
    pytest.param(b"[envs]\n'1A' = 'x'", "not a valid environment variable name", id="env-name-digit"),
    pytest.param(b"[envs]\n'A-B' = 'x'", "not a valid environment variable name", id="env-name-dash"),
    pytest.param(b"[envs]\n'' = 'x'", "not a valid environment variable name", id="env-name-empty"),
    pytest.param(b"[envs]\nCOLA_DEVICES = 'x'", "'COLA_DEVICES' is reserved", id="env-cola-devices"),
    pytest.param(b"[envs]\nCOLA_REPLICAS = 'x'", "'COLA_REPLICAS' is reserved", id="env-cola-replicas"),
    pytest.param(b"[envs]\nCOLA_ANYTHING = 'x'", "reserved", id="env-cola-prefix"),
    pytest.param(b'[envs]\nA = "x\\u0000y"', "envs.A value contains a NUL", id="env-value-nul"),
    pytest.param(b"[envs]\nA = '" + b"x" * 4097 + b"'", "envs.A value is longer than 4096", id="env-value-long"),
    pytest.param(
        b"[envs]\n" + b"".join(f"A{i} = ''\n".encode() for i in range(129)),
        "envs has more than 128",
        id="envs-too-many",
    ),
    pytest.param(b"[annotations]\nk = 1", "annotations.k must be a string", id="annotation-value-int"),
    pytest.param(b"[annotations]\n'Example.com/k' = 'v'", "annotations: 'Example.com/k'", id="annotation-upper-prefix"),
    pytest.param(b"[annotations]\n'/k' = 'v'", "prefix", id="annotation-empty-prefix"),
    pytest.param(b"[annotations]\n'a/b/c' = 'v'", "more than one '/'", id="annotation-two-slashes"),
    pytest.param(b"[annotations]\n'a.com/' = 'v'", "the name must be", id="annotation-empty-name"),
    pytest.param(b"[annotations]\n'-k' = 'v'", "the name must be", id="annotation-leading-dash"),
    pytest.param(b"[annotations]\n'" + b"k" * 64 + b"' = 'v'", "the name must be", id="annotation-name-64"),
    pytest.param(b"device_nodes = '/dev/x'", "device_nodes must be a list of tables", id="device-nodes-string"),
    pytest.param(b"device_nodes = ['/dev/x']", "device_nodes must be a list of tables", id="device-nodes-strings"),
    pytest.param(_node(container_path='"/dev/x"'), "device_nodes[0].host_path is missing", id="node-no-host"),
    pytest.param(_node(host_path="1"), "device_nodes[0].host_path must be a string", id="node-host-int"),
    pytest.param(_node(host_path='"dev/x"'), "device_nodes[0].host_path 'dev/x' is not an absolute", id="relative"),
    pytest.param(_node(host_path='""'), "device_nodes[0].host_path '' is not an absolute", id="node-host-empty"),
    pytest.param(_node(host_path='"/dev/../etc/x"'), "has a '..' component", id="node-host-dotdot"),
    pytest.param(_node(host_path='"/dev/./x"'), "is not normalised", id="node-host-dot"),
    pytest.param(_node(host_path='"/dev//x"'), "is not normalised", id="node-host-double-slash"),
    pytest.param(_node(host_path='"//dev/x"'), "is not normalised", id="node-host-leading-double-slash"),
    pytest.param(_node(host_path='"/dev/x/"'), "is not normalised", id="node-host-trailing-slash"),
    pytest.param(_node(host_path='"/"'), "'/' is not allowed", id="node-host-root"),
    pytest.param(_node(host_path='"/dev/x\\u0000"'), "contains a NUL", id="node-host-nul"),
    pytest.param(_node(host_path='"/' + "x" * 4096 + '"'), "longer than 4096 bytes", id="node-host-long"),
    pytest.param(
        _node(host_path='"/dev/x"', container_path='"x"'), "device_nodes[0].container_path 'x'", id="node-relative"
    ),
    pytest.param(_node(host_path='"/dev/x"', permissions='""'), "permissions must be", id="permissions-empty"),
    pytest.param(_node(host_path='"/dev/x"', permissions='"rx"'), "permissions must be", id="permissions-x"),
    pytest.param(_node(host_path='"/dev/x"', permissions='"rr"'), "permissions must be", id="permissions-repeat"),
    pytest.param(_node(host_path='"/dev/x"', permissions="7"), "permissions must be", id="permissions-int"),
    pytest.param(_node(host_path='"/dev/x"', mode='"rw"'), "unknown key in device_nodes[0]: 'mode'", id="node-key"),
    pytest.param(
        _node(host_path='"/dev/x"') + _node(host_path='"/dev/y"', container_path='"/dev/x"'),
        "device_nodes[1].container_path '/dev/x' is already used by device_nodes[0]",
        id="node-node-same-container-path",
    ),
    pytest.param(
        _node(host_path='"/dev/x"') + _node(host_path='"/dev/x"'),
        "already used by device_nodes[0]",
        id="node-listed-twice",
    ),
    pytest.param(
        _node(host_path='"/dev/x"') + _mount(host_path='"/opt/x"', container_path='"/dev/x"'),
        "mounts[0].container_path '/dev/x' is already used by device_nodes[0]",
        id="node-mount-same-container-path",
    ),
    pytest.param(
        _mount(host_path='"/a"') + _mount(host_path='"/b"', container_path='"/a"'),
        "mounts[1].container_path '/a' is already used by mounts[0]",
        id="mount-mount-same-container-path",
    ),
    pytest.param(b"".join(_node(host_path=f'"/dev/x{i}"') for i in range(65)), "more than 64", id="nodes-too-many"),
    pytest.param(_mount(container_path='"/a"'), "mounts[0].host_path is missing", id="mount-no-host"),
    pytest.param(_mount(host_path='"/a"', read_only='"yes"'), "mounts[0].read_only must be true or false", id="ro-str"),
    pytest.param(_mount(host_path='"/a"', read_only="1"), "mounts[0].read_only must be true or false", id="ro-int"),
    pytest.param(_mount(host_path='"/a"', options='"x"'), "unknown key in mounts[0]: 'options'", id="mount-key"),
    pytest.param(_mount(host_path='"/a/.."'), "mounts[0].host_path '/a/..' has a '..' component", id="mount-dotdot"),
]


@pytest.mark.parametrize("content, fragment", INVALID)
def test_parse_malformed(content: bytes, fragment: str) -> None:
    device = parse("d", content)
    assert device == Device("d", UNHEALTHY, problem=device.problem)  # every other field empty
    assert fragment in device.problem
    assert "\n" not in device.problem
    assert len(device.problem) <= 300
    # A malformed device crosses the queue like any other.
    assert device_from_wire(device_to_wire(device)) == device


def test_malformed_device_contributes_nothing_even_with_valid_parts() -> None:
    content = b"numa_nodes = [0]\ncdi_devices = ['a.com/b=c']\nbogus = 1\n" + _node(host_path='"/dev/x"')
    assert parse("d", content) == Device("d", UNHEALTHY, problem="unknown key 'bogus'")


def test_parse_is_a_function_of_the_content() -> None:
    good, bad = b"numa_nodes = [0]", b"numa_nodes = [0"
    first = parse("d", good)
    assert parse("d", bad).problem.startswith("invalid TOML")
    assert parse("d", good) == first  # fixing the file heals the device
    assert parse("d", b"") == Device("d")  # and emptying it gives the bare device again


def test_parse_keeps_the_given_id() -> None:
    assert parse("cola7", b"").device_id == "cola7"
    assert parse("cola7", b"x").device_id == "cola7"


def test_long_problem_is_truncated_to_one_line() -> None:
    device = parse("d", b"[envs]\n'" + b"A-" * 2000 + b"' = 'x'")
    assert device.health == UNHEALTHY
    assert len(device.problem) <= 300
    assert "not a valid environment variable name" in device.problem


def _toml_blocks() -> list[str]:
    return re.findall(r"^```toml\n(.*?)^```", DOCS.read_text(encoding="utf-8"), flags=re.S | re.M)


def test_docs_examples() -> None:
    blocks = _toml_blocks()
    assert len(blocks) >= 3  # an empty file, NUMA and a device node, every key
    for block in blocks:
        device = parse("cola1", block.encode())
        assert device.problem == "", (device.problem, block)
