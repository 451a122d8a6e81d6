"""Tests of the FakeKubelet itself, against a minimal plugin written here from the contract.

A plugin that is correct must leave `violations` empty; each deliberately broken variant shows one
rule the fake enforces. Everything runs over real gRPC on Unix sockets in a temporary directory.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import stat
import tempfile
import threading
import uuid
from collections.abc import Iterator
from concurrent import futures
from pathlib import Path

import grpc
import pytest

from colad.api import deviceplugin_pb2 as pb
from colad.api import deviceplugin_pb2_grpc as pb_grpc
from tests.fakes.kubelet import FakeKubelet, KubeletError, is_extended_resource_name
from tests.helpers import wait_until

pytestmark = pytest.mark.integration

RESOURCE = "myway5.com/cola"
CHECKPOINT = "kubelet_internal_checkpoint"


class Plugin(pb_grpc.DevicePluginServicer):
    """A minimal correct device plugin: serve first, then register; full list at once, then on change."""

    def __init__(
        self,
        plugin_dir: Path,
        devices: dict[str, str],
        *,
        options: tuple[bool, bool] = (False, True),
        resource: str = RESOURCE,
        version: str = "v1beta1",
    ) -> None:
        self.plugin_dir = plugin_dir
        self.endpoint = f"test-{uuid.uuid4().hex[:8]}.sock"
        self.socket_path = plugin_dir / self.endpoint
        self.options = pb.DevicePluginOptions(
            pre_start_required=options[0], get_preferred_allocation_available=options[1]
        )
        self.resource, self.version = resource, version
        self._cond = threading.Condition()
        self._devices = dict(devices)
        self._generation = 0
        self._stopping = False
        self._server: grpc.Server | None = None

    # ---- what broken variants override ----
    def register_request(self) -> pb.RegisterRequest:
        return pb.RegisterRequest(
            version=self.version, endpoint=self.endpoint, resource_name=self.resource, options=self.options
        )

    def list_response(self, devices: dict[str, str]) -> pb.ListAndWatchResponse:
        return pb.ListAndWatchResponse(devices=[pb.Device(ID=i, health=h) for i, h in devices.items()])

    def extra_handlers(self) -> tuple[grpc.GenericRpcHandler, ...]:
        return ()

    # ---- DevicePlugin service ----
    def GetDevicePluginOptions(self, request: pb.Empty, context: grpc.ServicerContext) -> pb.DevicePluginOptions:  # noqa: N802
        return self.options

    def ListAndWatch(self, request: pb.Empty, context: grpc.ServicerContext) -> Iterator[pb.ListAndWatchResponse]:  # noqa: N802
        context.add_callback(self._wake)
        sent = -1
        while True:
            with self._cond:
                while self._generation == sent and not self._stopping and context.is_active():
                    self._cond.wait()
                if self._stopping or not context.is_active():
                    return
                sent, devices = self._generation, dict(self._devices)
            yield self.list_response(devices)

    def Allocate(self, request: pb.AllocateRequest, context: grpc.ServicerContext) -> pb.AllocateResponse:  # noqa: N802
        responses = []
        with self._cond:
            devices = dict(self._devices)
        for container in request.container_requests:
            bad = [i for i in container.devices_ids if devices.get(i) != "Healthy"]
            if bad:
                context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"unknown or unhealthy devices {bad}")
            responses.append(pb.ContainerAllocateResponse(envs={"COLA_DEVICES": ",".join(container.devices_ids)}))
        return pb.AllocateResponse(container_responses=responses)

    def GetPreferredAllocation(
        self,
        request: pb.PreferredAllocationRequest,  # noqa: N802
        context: grpc.ServicerContext,
    ) -> pb.PreferredAllocationResponse:
        responses = []
        for c in request.container_requests:
            rest = [i for i in c.available_deviceIDs if i not in c.must_include_deviceIDs]
            chosen = (list(c.must_include_deviceIDs) + rest)[: c.allocation_size]
            responses.append(pb.ContainerPreferredAllocationResponse(deviceIDs=chosen))
        return pb.PreferredAllocationResponse(container_responses=responses)

    def PreStartContainer(
        self,
        request: pb.PreStartContainerRequest,  # noqa: N802
        context: grpc.ServicerContext,
    ) -> pb.PreStartContainerResponse:
        return pb.PreStartContainerResponse()

    # ---- life cycle ----
    def serve(self) -> Plugin:
        self._server = grpc.server(futures.ThreadPoolExecutor(max_workers=8))
        self._server.add_generic_rpc_handlers(self.extra_handlers())
        pb_grpc.add_DevicePluginServicer_to_server(self, self._server)  # type: ignore[no-untyped-call]
        assert self._server.add_insecure_port("unix:" + str(self.socket_path))
        self._server.start()
        return self

    def register(self, kubelet: FakeKubelet, timeout: float = 15) -> None:
        with grpc.insecure_channel("unix:" + str(kubelet.socket_path)) as channel:
            stub = pb_grpc.RegistrationStub(channel)  # type: ignore[no-untyped-call]
            stub.Register(self.register_request(), timeout=timeout)

    def set_devices(self, devices: dict[str, str]) -> None:
        with self._cond:
            self._devices = dict(devices)
            self._generation += 1
            self._cond.notify_all()

    def stop(self) -> None:
        with self._cond:
            self._stopping = True
            self._cond.notify_all()
        if self._server is not None:
            self._server.stop(grace=1).wait()
        self.socket_path.unlink(missing_ok=True)

    def _wake(self) -> None:
        with self._cond:
            self._cond.notify_all()


@pytest.fixture
def plugin_dir(tmp_path: Path) -> Iterator[Path]:
    if len(str(tmp_path)) < 60:  # room for "/test-xxxxxxxx.sock" within the 107-byte sun_path
        yield tmp_path
        return
    short = Path(tempfile.mkdtemp(prefix="fk-", dir="/tmp"))
    yield short
    shutil.rmtree(short, ignore_errors=True)


@pytest.fixture
def kubelet(plugin_dir: Path) -> Iterator[FakeKubelet]:
    with FakeKubelet(plugin_dir, dial_timeout=0.5) as fake:
        yield fake


@pytest.fixture
def plugins() -> Iterator[list[Plugin]]:
    started: list[Plugin] = []
    yield started
    for plugin in started:
        plugin.stop()


def running(plugins: list[Plugin], plugin: Plugin, kubelet: FakeKubelet) -> Plugin:
    plugins.append(plugin.serve())
    plugin.register(kubelet)
    return plugin


def make_stale_socket(path: Path) -> None:
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.bind(str(path))


def register_error(kubelet: FakeKubelet, plugin: Plugin) -> grpc.RpcError:
    with pytest.raises(grpc.RpcError) as caught:
        plugin.register(kubelet)
    return caught.value


# ---- a correct plugin ----


def test_registration_records_options_and_full_list(kubelet: FakeKubelet, plugins: list[Plugin]) -> None:
    plugin = running(plugins, Plugin(kubelet.plugin_dir, {"a": "Healthy", "b": "Unhealthy"}), kubelet)
    reg = kubelet.wait_registered()
    assert (reg.ok, reg.error, reg.version, reg.endpoint, reg.resource_name) == (
        True,
        "",
        "v1beta1",
        plugin.endpoint,
        RESOURCE,
    )
    assert reg.options == (False, True) and kubelet.options() == (False, True)
    assert reg.at <= reg.answered_at
    kubelet.wait_devices({"a": "Healthy", "b": "Unhealthy"})
    assert kubelet.current_endpoint() == plugin.endpoint
    assert kubelet.live_streams() == 1
    first = kubelet.updates[0]
    assert first.endpoint == plugin.endpoint and first.devices == {"a": "Healthy", "b": "Unhealthy"}
    assert first.size_bytes == plugin.list_response(first.devices).ByteSize()
    assert kubelet.violations == []


def test_each_update_replaces_the_whole_set(kubelet: FakeKubelet, plugins: list[Plugin]) -> None:
    plugin = running(plugins, Plugin(kubelet.plugin_dir, {"a": "Healthy", "b": "Healthy"}), kubelet)
    kubelet.wait_devices({"a", "b"})
    plugin.set_devices({"b": "Unhealthy", "c": "Healthy"})
    kubelet.wait_devices({"b": "Unhealthy", "c": "Healthy"})
    assert [u.devices for u in kubelet.updates] == [
        {"a": "Healthy", "b": "Healthy"},
        {"b": "Unhealthy", "c": "Healthy"},
    ]
    assert kubelet.violations == []


def test_allocate_preferred_allocation_and_prestart(kubelet: FakeKubelet, plugins: list[Plugin]) -> None:
    running(plugins, Plugin(kubelet.plugin_dir, {"a": "Healthy", "b": "Healthy"}, options=(True, True)), kubelet)
    kubelet.wait_devices({"a", "b"})
    assert kubelet.allocate(["a", "b"]) == {
        "envs": {"COLA_DEVICES": "a,b"},
        "mounts": [],
        "devices": [],
        "annotations": {},
        "cdi_devices": [],
    }
    with pytest.raises(grpc.RpcError) as caught:
        kubelet.allocate(["nope"])
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert kubelet.get_preferred_allocation(["a", "b"], ["b"], 1) == ["b"]
    kubelet.pre_start_container(["a"])
    assert kubelet.violations == []


def test_allocate_before_any_registration_fails_in_the_kubelet(kubelet: FakeKubelet) -> None:
    with pytest.raises(KubeletError, match="unknown Device Plugin"):
        kubelet.allocate(["a"])


def test_write_checkpoint_false_writes_nothing(plugin_dir: Path, plugins: list[Plugin]) -> None:
    with FakeKubelet(plugin_dir, write_checkpoint=False) as kubelet:
        running(plugins, Plugin(plugin_dir, {"a": "Healthy"}), kubelet)
        kubelet.wait_devices({"a"})
    assert not (plugin_dir / CHECKPOINT).exists()


def test_register_delay_holds_the_answer(plugin_dir: Path, plugins: list[Plugin]) -> None:
    with FakeKubelet(plugin_dir, register_delay=0.3) as kubelet:
        running(plugins, Plugin(plugin_dir, {"a": "Healthy"}), kubelet)
        reg = kubelet.wait_registered()
        assert reg.answered_at - reg.at >= 0.3
        kubelet.wait_devices({"a"})


# ---- Register failures, with the kubelet's own texts ----


@pytest.mark.parametrize(
    "version, resource, expected",
    [
        (
            "v1alpha",
            RESOURCE,
            'requested API version "v1alpha" is not supported by kubelet. Supported version is ["v1beta1"]',
        ),
        ("", RESOURCE, 'requested API version "" is not supported by kubelet. Supported version is ["v1beta1"]'),
        ("v1beta1", "cola", 'the ResourceName "cola" is invalid'),
        ("v1beta1", "kubernetes.io/cola", 'the ResourceName "kubernetes.io/cola" is invalid'),
        ("v1beta1", "Myway5.com/cola", 'the ResourceName "Myway5.com/cola" is invalid'),
    ],
    ids=["old-version", "no-version", "no-prefix", "native-prefix", "uppercase-prefix"],
)
def test_register_rejects_with_kubelet_text(
    kubelet: FakeKubelet, plugins: list[Plugin], version: str, resource: str, expected: str
) -> None:
    plugin = Plugin(kubelet.plugin_dir, {"a": "Healthy"}, version=version, resource=resource).serve()
    plugins.append(plugin)
    error = register_error(kubelet, plugin)
    assert (error.code(), error.details()) == (grpc.StatusCode.UNKNOWN, expected)
    assert [(r.ok, r.error) for r in kubelet.registrations] == [(False, expected)]
    assert kubelet.live_streams() == 0 and kubelet.current_endpoint() is None


def test_register_before_serving_fails_to_dial(kubelet: FakeKubelet) -> None:
    plugin = Plugin(kubelet.plugin_dir, {"a": "Healthy"})  # broken: registers without serving
    error = register_error(kubelet, plugin)
    assert error.code() == grpc.StatusCode.UNKNOWN
    assert error.details() == "failed to dial device plugin: context deadline exceeded"
    assert kubelet.successful_registrations() == []


class FailingOptions(Plugin):
    def GetDevicePluginOptions(self, request: pb.Empty, context: grpc.ServicerContext) -> pb.DevicePluginOptions:  # noqa: N802
        context.abort(grpc.StatusCode.UNIMPLEMENTED, "not yet")
        raise AssertionError("abort() raises")


def test_register_fails_when_get_device_plugin_options_fails(kubelet: FakeKubelet, plugins: list[Plugin]) -> None:
    plugin = FailingOptions(kubelet.plugin_dir, {"a": "Healthy"}).serve()
    plugins.append(plugin)
    error = register_error(kubelet, plugin)
    assert error.code() == grpc.StatusCode.UNKNOWN
    assert error.details() == "failed to get device plugin options: rpc error: code = Unimplemented desc = not yet"
    assert kubelet.live_streams() == 0 and kubelet.successful_registrations() == []


def test_register_error_option_fails_every_register(plugin_dir: Path, plugins: list[Plugin]) -> None:
    with FakeKubelet(plugin_dir, register_error="kubelet is busy") as kubelet:
        plugin = Plugin(plugin_dir, {"a": "Healthy"}).serve()
        plugins.append(plugin)
        error = register_error(kubelet, plugin)
        assert (error.code(), error.details()) == (grpc.StatusCode.UNKNOWN, "kubelet is busy")
        assert kubelet.registrations[0].error == "kubelet is busy" and kubelet.live_streams() == 0


@pytest.mark.parametrize(
    "name, valid",
    [
        ("myway5.com/cola", True),
        ("example.com/a.b_c-D9", True),
        ("a/" + "x" * 63, True),
        ("a/" + "x" * 64, False),
        ("cola", False),
        ("kubernetes.io/cola", False),
        ("foo.kubernetes.io/cola", False),
        ("requests.example.com/cola", False),
        ("example.com/a/b", False),
        ("example.com/-cola", False),
        ("example.com/cola_", False),
        ("example_com/cola", False),
        ("example.com/", False),
        ("x" * 250 + ".com/cola", False),
    ],
)
def test_extended_resource_name_rule(name: str, valid: bool) -> None:
    assert is_extended_resource_name(name) is valid


# ---- kubelet start, restart, stop ----


def test_start_deletes_sockets_but_keeps_files_and_checkpoint(plugin_dir: Path, tmp_path: Path) -> None:
    make_stale_socket(plugin_dir / "old-plugin.sock")
    make_stale_socket(plugin_dir / "kubelet.sock")
    elsewhere = Path(tempfile.mkdtemp(prefix="fk-", dir="/tmp"))
    try:
        make_stale_socket(elsewhere / "s")
        (plugin_dir / "link-to-socket").symlink_to(elsewhere / "s")
        (plugin_dir / "dangling").symlink_to(elsewhere / "missing")
        (plugin_dir / "DEPRECATION").write_text("kept")
        (plugin_dir / "not-a-socket.sock").write_text("kept")
        (plugin_dir / "subdir").mkdir()
        (plugin_dir / CHECKPOINT).write_text('{"Data":{}}')
        with FakeKubelet(plugin_dir) as kubelet:
            left = sorted(os.listdir(plugin_dir))
            assert left == sorted(
                [CHECKPOINT, "DEPRECATION", "dangling", "kubelet.sock", "not-a-socket.sock", "subdir"]
            )
            assert (plugin_dir / CHECKPOINT).read_text() == '{"Data":{}}'
            assert stat.S_ISSOCK(os.stat(kubelet.socket_path).st_mode)
            assert os.path.exists(elsewhere / "s")  # the link went, not its target
    finally:
        shutil.rmtree(elsewhere)


def test_checkpoint_is_rewritten_by_rename_after_each_update(kubelet: FakeKubelet, plugins: list[Plugin]) -> None:
    plugin = running(plugins, Plugin(kubelet.plugin_dir, {"b": "Healthy", "a": "Healthy"}), kubelet)
    checkpoint = kubelet.plugin_dir / CHECKPOINT

    def registered() -> dict[str, list[str]]:
        data: dict[str, dict[str, list[str]]] = json.loads(checkpoint.read_text())["Data"]
        return data["RegisteredDevices"]

    wait_until(lambda: registered() == {RESOURCE: ["a", "b"]}, 5, "first checkpoint")
    inode = os.stat(checkpoint).st_ino
    plugin.set_devices({"a": "Unhealthy", "c": "Healthy"})
    wait_until(lambda: registered() == {RESOURCE: ["c"]}, 5, "checkpoint with healthy IDs only")
    assert os.stat(checkpoint).st_ino != inode  # replaced by a rename, not rewritten in place
    assert [n for n in os.listdir(kubelet.plugin_dir) if n.startswith(".")] == []


def test_wait_idle_waits_for_the_checkpoint_and_the_next_message_waits_too(
    kubelet: FakeKubelet, plugins: list[Plugin]
) -> None:
    """As in the kubelet's receive loop: a message sent while a checkpoint is written is read after it."""
    held, writing = threading.Event(), threading.Event()
    write = kubelet._write_checkpoint

    def slow_disk() -> None:
        writing.set()
        held.wait(10)
        write()

    plugin = running(plugins, Plugin(kubelet.plugin_dir, {"a": "Healthy"}), kubelet)
    kubelet.wait_devices({"a"})
    kubelet.wait_idle(5)
    kubelet._write_checkpoint = slow_disk  # type: ignore[method-assign]
    plugin.set_devices({"b": "Healthy"})
    assert writing.wait(5)
    plugin.set_devices({"c": "Healthy"})
    with pytest.raises(TimeoutError, match="1 message"):
        kubelet.wait_idle(0.2)
    assert [u.devices for u in kubelet.updates] == [{"a": "Healthy"}, {"b": "Healthy"}]
    held.set()
    kubelet.wait_devices({"c"})
    kubelet.wait_idle(5)
    assert [u.devices for u in kubelet.updates][-1] == {"c": "Healthy"}
    assert kubelet.violations == []


def test_restart_deletes_plugin_socket_ends_stream_and_needs_new_register(
    kubelet: FakeKubelet, plugins: list[Plugin]
) -> None:
    plugin = running(plugins, Plugin(kubelet.plugin_dir, {"a": "Healthy", "b": "Healthy"}), kubelet)
    kubelet.wait_devices({"a", "b"})
    kubelet.restart()
    assert not plugin.socket_path.exists()
    assert kubelet.live_streams() == 0 and not kubelet.stream_alive()
    assert kubelet.devices() == {"a": "Unhealthy", "b": "Unhealthy"}
    with pytest.raises(KubeletError, match="has been stopped"):
        kubelet.allocate(["a"])
    again = running(plugins, Plugin(kubelet.plugin_dir, {"a": "Healthy", "b": "Healthy"}), kubelet)
    assert kubelet.wait_registered(2).endpoint == again.endpoint
    kubelet.wait_devices({"a", "b"})
    assert kubelet.violations == []


def test_killed_kubelet_leaves_a_dead_socket_that_start_replaces(kubelet: FakeKubelet, plugins: list[Plugin]) -> None:
    kubelet.stop(leave_stale_socket=True)
    assert stat.S_ISSOCK(os.stat(kubelet.socket_path).st_mode)
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as probe, pytest.raises(ConnectionRefusedError):
        probe.connect(str(kubelet.socket_path))
    kubelet.start()
    running(plugins, Plugin(kubelet.plugin_dir, {"a": "Healthy"}), kubelet)
    kubelet.wait_devices({"a"})


def test_stop_removes_kubelet_socket(kubelet: FakeKubelet) -> None:
    kubelet.stop()
    assert not kubelet.socket_path.exists()


def test_closed_stream_marks_devices_unhealthy(kubelet: FakeKubelet, plugins: list[Plugin]) -> None:
    running(plugins, Plugin(kubelet.plugin_dir, {"a": "Healthy"}), kubelet)
    kubelet.wait_devices({"a"})
    kubelet.close_stream()
    assert kubelet.devices() == {"a": "Unhealthy"} and not kubelet.stream_alive()
    assert kubelet.live_streams() == 0


def test_plugin_ending_its_stream_marks_devices_unhealthy(kubelet: FakeKubelet, plugins: list[Plugin]) -> None:
    plugin = running(plugins, Plugin(kubelet.plugin_dir, {"a": "Healthy"}), kubelet)
    kubelet.wait_devices({"a"})
    plugin.stop()
    wait_until(lambda: kubelet.devices() == {"a": "Unhealthy"}, 5, "devices unhealthy after plugin exit")
    assert kubelet.live_streams() == 0


def test_newest_registration_wins(kubelet: FakeKubelet, plugins: list[Plugin]) -> None:
    old = running(plugins, Plugin(kubelet.plugin_dir, {"a": "Healthy"}), kubelet)
    kubelet.wait_devices({"a"})
    new = running(plugins, Plugin(kubelet.plugin_dir, {"b": "Healthy"}), kubelet)
    kubelet.wait_devices({"b"})
    assert kubelet.current_endpoint() == new.endpoint and kubelet.live_streams() == 2
    old.set_devices({"z": "Healthy"})
    wait_until(
        lambda: any(u.endpoint == old.endpoint and "z" in u.devices for u in kubelet.updates),
        5,
        "the old stream's update",
    )
    assert kubelet.devices() == {"b": "Healthy"}
    old.stop()
    wait_until(lambda: kubelet.live_streams() == 1, 5, "the old stream to end")
    kubelet.wait_devices({"b"})


# ---- broken plugins: the fake's strictness ----


class MismatchedOptions(Plugin):
    def register_request(self) -> pb.RegisterRequest:
        request = super().register_request()
        request.options.get_preferred_allocation_available = False
        return request


class NoRegisterOptions(Plugin):
    def register_request(self) -> pb.RegisterRequest:
        request = super().register_request()
        request.ClearField("options")
        return request


@pytest.mark.parametrize("variant", [MismatchedOptions, NoRegisterOptions])
def test_options_must_match_in_register_and_rpc(
    kubelet: FakeKubelet, plugins: list[Plugin], variant: type[Plugin]
) -> None:
    running(plugins, variant(kubelet.plugin_dir, {"a": "Healthy"}, options=(False, True)), kubelet)
    kubelet.wait_registered()
    assert kubelet.options() == (False, True)
    assert len(kubelet.violations) == 1 and "GetDevicePluginOptions" in kubelet.violations[0]


def test_unset_options_are_fine_when_all_false(kubelet: FakeKubelet, plugins: list[Plugin]) -> None:
    running(plugins, NoRegisterOptions(kubelet.plugin_dir, {"a": "Healthy"}, options=(False, False)), kubelet)
    assert kubelet.wait_registered().options is None
    kubelet.wait_devices({"a"})
    assert kubelet.violations == []


class FixedList(Plugin):
    """Sends `raw_devices` (a list, so it can repeat IDs) instead of its device dict."""

    raw_devices: list[tuple[str, str]] = []

    def list_response(self, devices: dict[str, str]) -> pb.ListAndWatchResponse:
        return pb.ListAndWatchResponse(devices=[pb.Device(ID=i, health=h) for i, h in self.raw_devices])


@pytest.mark.parametrize(
    "raw_devices, problem",
    [
        ([("a", "Healthy"), ("a", "Healthy")], "duplicate device IDs ['a']"),
        ([("", "Healthy")], "empty device ID"),
        ([("x" * 64, "Healthy")], "longer than 63 characters"),
        ([("a", "healthy")], "has health 'healthy'"),
    ],
    ids=["duplicate-id", "empty-id", "long-id", "bad-health"],
)
def test_bad_device_lists_are_violations(
    kubelet: FakeKubelet, plugins: list[Plugin], raw_devices: list[tuple[str, str]], problem: str
) -> None:
    plugin = FixedList(kubelet.plugin_dir, {})
    plugin.raw_devices = raw_devices
    running(plugins, plugin, kubelet)
    wait_until(lambda: kubelet.violations, 5, "a violation")
    assert len(kubelet.violations) == 1 and problem in kubelet.violations[0]


def test_a_63_character_id_is_fine(kubelet: FakeKubelet, plugins: list[Plugin]) -> None:
    running(plugins, Plugin(kubelet.plugin_dir, {"x" * 63: "Healthy"}), kubelet)
    kubelet.wait_devices({"x" * 63})
    assert kubelet.violations == []


class InvalidUtf8(Plugin):
    """Writes ListAndWatch bytes by hand: one device whose ID is not UTF-8."""

    def extra_handlers(self) -> tuple[grpc.GenericRpcHandler, ...]:
        device = b"\x0a\x02\xff\xfe" + b"\x12\x07Healthy"  # ID = ff fe, health = "Healthy"
        message = b"\x0a" + bytes([len(device)]) + device

        def listen(request: bytes, context: grpc.ServicerContext) -> Iterator[bytes]:
            yield message

        handler = grpc.unary_stream_rpc_method_handler(listen, request_deserializer=None, response_serializer=None)
        return (grpc.method_handlers_generic_handler("v1beta1.DevicePlugin", {"ListAndWatch": handler}),)


def test_invalid_utf8_is_a_violation_and_ends_the_stream(kubelet: FakeKubelet, plugins: list[Plugin]) -> None:
    running(plugins, InvalidUtf8(kubelet.plugin_dir, {}), kubelet)
    wait_until(lambda: kubelet.violations and kubelet.live_streams() == 0, 5, "the stream to fail")
    assert "UTF-8" in kubelet.violations[0] and kubelet.devices() is None


def test_a_list_over_4_mib_is_a_violation(kubelet: FakeKubelet, plugins: list[Plugin]) -> None:
    running(plugins, Plugin(kubelet.plugin_dir, {f"{i:060d}": "Healthy" for i in range(60_000)}), kubelet)
    wait_until(lambda: kubelet.violations and kubelet.live_streams() == 0, 10, "the oversized list to fail")
    assert "4 MiB" in kubelet.violations[0] and kubelet.updates == []


class WrongResponseCount(Plugin):
    count = 0

    def Allocate(self, request: pb.AllocateRequest, context: grpc.ServicerContext) -> pb.AllocateResponse:  # noqa: N802
        return pb.AllocateResponse(container_responses=[pb.ContainerAllocateResponse()] * self.count)


@pytest.mark.parametrize("count", [0, 2])
def test_allocate_needs_exactly_one_container_response(kubelet: FakeKubelet, plugins: list[Plugin], count: int) -> None:
    plugin = WrongResponseCount(kubelet.plugin_dir, {"a": "Healthy"})
    plugin.count = count
    running(plugins, plugin, kubelet)
    kubelet.wait_devices({"a"})
    if count == 0:
        with pytest.raises(KubeletError, match="no containers return"):
            kubelet.allocate(["a"])
    else:
        kubelet.allocate(["a"])
    assert kubelet.violations == [f"Allocate: {count} container responses for 1 container requests"]


def test_calls_the_options_do_not_allow_are_violations(kubelet: FakeKubelet, plugins: list[Plugin]) -> None:
    running(plugins, Plugin(kubelet.plugin_dir, {"a": "Healthy"}, options=(False, False)), kubelet)
    kubelet.wait_devices({"a"})
    assert kubelet.get_preferred_allocation(["a"], [], 1) == ["a"]  # still called
    kubelet.pre_start_container(["a"])
    assert len(kubelet.violations) == 2
