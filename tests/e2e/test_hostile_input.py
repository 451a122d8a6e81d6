"""Hostile input, end to end: awkward device files and awkward gRPC requests.

Each case must end with a clear log line or gRPC status, an exact device list
at the kubelet, and a service that still allocates.
"""

from __future__ import annotations

import os
import shutil
import socket
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path

import grpc
import pytest

from colad.api import deviceplugin_pb2 as pb
from tests.fakes.kubelet import FakeKubelet
from tests.helpers import wait_until
from tests.service import ColadService

pytestmark = pytest.mark.e2e
BASE = {"cocacola", "peisicola"}


# One colad for the whole module (each case cleans up after itself), to keep the table fast.
@pytest.fixture(scope="module")
def shared() -> Iterator[tuple[ColadService, FakeKubelet]]:
    root = Path(tempfile.mkdtemp(prefix="colad-", dir="/tmp"))
    root.chmod(0o755)
    kubelet = FakeKubelet(root / "kubelet")
    kubelet.start()
    service = ColadService(root)
    service.add(*BASE)
    service.start()
    try:
        yield service, kubelet
    finally:
        assert service.stop() == 0
        kubelet.stop()
        assert kubelet.violations == []
        shutil.rmtree(root, ignore_errors=True)


@pytest.fixture
def colad(shared: tuple[ColadService, FakeKubelet]) -> Iterator[ColadService]:
    service, kubelet = shared
    kubelet.wait_devices(BASE)
    service.log_mark = len(service.log())
    yield service
    for entry in list(os.scandir(service.device_dir)):
        if entry.name not in BASE:
            path = Path(entry.path)
            if entry.is_dir(follow_symlinks=False):
                shutil.rmtree(path)
            else:
                path.unlink()
    kubelet.wait_devices(BASE)


@pytest.fixture
def kubelet(shared: tuple[ColadService, FakeKubelet]) -> FakeKubelet:
    return shared[1]


def new_log_lines(colad: ColadService, needle: str) -> list[str]:
    return [line for line in colad.log()[colad.log_mark :].splitlines() if needle in line]


def intact(colad: ColadService, kubelet: FakeKubelet, expected: set[str] | dict[str, str]) -> None:
    kubelet.wait_devices(expected, timeout=10)
    assert kubelet.allocate(["cocacola"])["envs"] == {"COLA_DEVICES": "cocacola"}
    assert kubelet.live_streams() == 1


def _fifo(d: Path) -> None:
    os.mkfifo(d / "fifo")


def _socket(d: Path) -> None:
    with socket.socket(socket.AF_UNIX) as s:
        s.bind(str(d / "sock"))


def _unreadable(d: Path) -> None:
    (d / "locked").write_bytes(b"")
    (d / "locked").chmod(0)


def _symlink_out(d: Path) -> None:
    target = d.parent / "outside"
    target.write_bytes(b"")
    os.symlink(target, d / "link-out")


# (id, how to make it, the name a warning must mention or None, does it become a device)
FILES: list[tuple[str, Callable[[Path], None], str | None, str | None]] = [
    ("non-utf8-name", lambda d: Path(os.fsdecode(bytes(d) + b"/caf\xe9")).write_bytes(b""), "caf", None),
    ("255-char-name", lambda d: (d / ("x" * 255)).write_bytes(b""), "x" * 64, None),
    ("newline-in-name", lambda d: (d / "a\nb").write_bytes(b""), "a\\nb", None),
    ("bell-in-name", lambda d: (d / "a\x07b").write_bytes(b""), "a\\x07b", None),
    ("comma-in-name", lambda d: (d / "a,b").write_bytes(b""), "a,b", None),
    ("equals-in-name", lambda d: (d / "a=b").write_bytes(b""), "a=b", None),
    ("space-in-name", lambda d: (d / "a b").write_bytes(b""), "a b", None),
    ("colon-in-name", lambda d: (d / "a:b").write_bytes(b""), "a:b", None),
    ("dotfile", lambda d: (d / ".hidden").write_bytes(b""), ".hidden", None),
    ("vim-swap", lambda d: (d / ".cocacola.swp").write_bytes(b""), ".cocacola.swp", None),
    ("backup-tilde", lambda d: (d / "cocacola~").write_bytes(b""), "cocacola~", None),
    ("emacs-autosave", lambda d: (d / "#cocacola#").write_bytes(b""), "#cocacola#", None),
    ("fifo", _fifo, None, None),
    ("unix-socket", _socket, None, None),
    ("subdirectory", lambda d: (d / "subdir").mkdir(), None, None),
    ("symlink-inside", lambda d: os.symlink(d / "cocacola", d / "link-in"), None, None),
    ("symlink-outside", _symlink_out, None, None),
    ("dangling-symlink", lambda d: os.symlink(d / "nothing", d / "dangling"), None, None),
    ("unreadable-file", _unreadable, None, "locked"),
    # Content that is not a device file (docs/DEVICES.md): a device, Unhealthy, with the reason logged.
    ("binary-content", lambda d: (d / "binary").write_bytes(os.urandom(4096)), None, "binary"),
    ("huge-file", lambda d: (d / "huge").write_bytes(b"#" * (8 << 20)), None, "huge"),
    ("toml-of-another-kind", lambda d: (d / "other").write_text("[server]\nport = 80\n"), None, "other"),
]
UNHEALTHY_CONTENT = {"binary", "huge", "other"}


@pytest.mark.parametrize(("make", "warned", "device"), [f[1:] for f in FILES], ids=[f[0] for f in FILES])
def test_awkward_device_files(
    colad: ColadService,
    kubelet: FakeKubelet,
    make: Callable[[Path], None],
    warned: str | None,
    device: str | None,
) -> None:
    kubelet.wait_devices(BASE)
    make(colad.device_dir)
    colad.add("marker")  # a change after the awkward one: when it arrives, the awkward one was seen too
    expected = {d: "Healthy" for d in BASE | {"marker"} | ({device} if device else set())}
    if device in UNHEALTHY_CONTENT:
        expected[device] = "Unhealthy"
        wait_until(
            lambda: [line for line in colad.log_lines("device file malformed") if f"device={device} " in line],
            10,
            f"the reason {device} is Unhealthy in the log",
        )
    intact(colad, kubelet, expected)
    warnings = new_log_lines(colad, "file skipped: not a valid device ID")
    if warned is not None:
        assert [w for w in warnings if warned in w], warnings
        assert all("\n" not in w for w in warnings)
    else:
        assert warnings == [], "a non-regular file is silently not a device"


def raw_call(colad: ColadService, kubelet: FakeKubelet, method: str, payload: bytes) -> grpc.RpcError | bytes:
    endpoint = kubelet.current_endpoint()
    assert endpoint is not None
    with grpc.insecure_channel(f"unix:{colad.kubelet_dir / endpoint}") as channel:
        call = channel.unary_unary(f"/v1beta1.DevicePlugin/{method}")
        try:
            return bytes(call(payload, timeout=10))
        except grpc.RpcError as exc:
            return exc


def allocate_request(*containers: list[str]) -> bytes:
    return pb.AllocateRequest(
        container_requests=[pb.ContainerAllocateRequest(devices_ids=c) for c in containers]
    ).SerializeToString()


ALLOCATE_CASES = [
    ("no-container-requests", allocate_request(), grpc.StatusCode.INVALID_ARGUMENT, "no container requests"),
    ("empty-device-list", allocate_request([]), grpc.StatusCode.INVALID_ARGUMENT, "names no devices"),
    ("duplicate-ids", allocate_request(["cocacola", "cocacola"]), grpc.StatusCode.INVALID_ARGUMENT, "cocacola"),
    ("unknown-id", allocate_request(["fanta"]), grpc.StatusCode.NOT_FOUND, "fanta"),
    ("one-bad-container-of-two", allocate_request(["cocacola"], ["fanta"]), grpc.StatusCode.NOT_FOUND, "fanta"),
    ("10000-unknown-ids", allocate_request([f"x{i}" for i in range(10_000)]), grpc.StatusCode.NOT_FOUND, "x0"),
    ("garbage-bytes", b"\xff\xff\xff\xff", grpc.StatusCode.INVALID_ARGUMENT, "request: not a valid message"),
    # container_requests { devices_ids: "\xff" }: not UTF-8, which proto3 strings must be.
    ("non-utf8-id", b"\x0a\x03\x0a\x01\xff", grpc.StatusCode.INVALID_ARGUMENT, "request: not a valid message"),
    ("5000-digit-id", allocate_request(["1" * 5000]), grpc.StatusCode.INVALID_ARGUMENT, "devices_ids[0]: not a device"),
]


@pytest.mark.parametrize(
    ("payload", "code", "needle"), [c[1:] for c in ALLOCATE_CASES], ids=[c[0] for c in ALLOCATE_CASES]
)
def test_awkward_allocate_requests(
    colad: ColadService, kubelet: FakeKubelet, payload: bytes, code: grpc.StatusCode, needle: str
) -> None:
    kubelet.wait_devices(BASE)
    result = raw_call(colad, kubelet, "Allocate", payload)
    assert isinstance(result, grpc.RpcError), result
    assert result.code() == code
    assert needle.lower() in (result.details() or "").lower()
    intact(colad, kubelet, BASE)


def test_two_container_requests_get_two_answers_in_order(colad: ColadService, kubelet: FakeKubelet) -> None:
    kubelet.wait_devices(BASE)
    raw = raw_call(colad, kubelet, "Allocate", allocate_request(["peisicola"], ["cocacola"]))
    assert isinstance(raw, bytes)
    answer = pb.AllocateResponse.FromString(raw)
    assert [dict(c.envs) for c in answer.container_responses] == [
        {"COLA_DEVICES": "peisicola"},
        {"COLA_DEVICES": "cocacola"},
    ]


PREFERRED_CASES = [
    ("size-larger-than-available", ["cocacola", "peisicola"], [], 5, ["cocacola", "peisicola"]),
    ("must-include-not-available", ["peisicola"], ["cocacola"], 1, ["peisicola"]),
    ("size-zero", ["cocacola", "peisicola"], [], 0, []),
    ("negative-size", ["cocacola"], [], -3, []),
    ("nothing-available", [], [], 2, []),
    ("must-include-beyond-size", ["cocacola", "peisicola"], ["peisicola", "cocacola"], 1, ["peisicola"]),
    ("unknown-and-duplicate-ids", ["zz", "zz", "cocacola"], ["zz"], 2, ["zz", "cocacola"]),
]


@pytest.mark.parametrize(
    ("available", "must", "size", "expected"), [c[1:] for c in PREFERRED_CASES], ids=[c[0] for c in PREFERRED_CASES]
)
def test_awkward_preferred_allocation_requests_never_fail(
    colad: ColadService, kubelet: FakeKubelet, available: list[str], must: list[str], size: int, expected: list[str]
) -> None:
    kubelet.wait_devices(BASE)
    assert kubelet.get_preferred_allocation(available, must, size) == expected
    intact(colad, kubelet, BASE)


def test_garbage_preferred_allocation_request_gets_a_status(colad: ColadService, kubelet: FakeKubelet) -> None:
    kubelet.wait_devices(BASE)
    result = raw_call(colad, kubelet, "GetPreferredAllocation", b"\x0a\xff")
    assert isinstance(result, grpc.RpcError) and result.code() == grpc.StatusCode.INVALID_ARGUMENT
    intact(colad, kubelet, BASE)
