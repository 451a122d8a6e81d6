"""The fake plugin watcher is as strict as the kubelet: a hand-written Registration server it must refuse.

Each bad GetInfo gets the kubelet's refusal through NotifyRegistrationStatus; a name or endpoint the kubelet
lets through but no working driver can have is a violation; dot files and non-sockets are never dialled;
one endpoint is registered once.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Iterator
from concurrent import futures
from pathlib import Path

import grpc
import pytest

from colad.api import pluginregistration_pb2 as regpb
from colad.api import pluginregistration_pb2_grpc as regpb_grpc
from tests.fakes.pluginwatcher import FakePluginWatcher
from tests.helpers import wait_until

pytestmark = pytest.mark.integration

FAST = {"reconcile_period": 0.05, "dial_timeout": 2.0, "backoff_first": 10.0}


class Plugin(regpb_grpc.RegistrationServicer):
    """A registration server answering whatever GetInfo a test gives it, recording every status."""

    def __init__(self, info: regpb.PluginInfo) -> None:
        self.info = info
        self.statuses: list[tuple[bool, str]] = []
        self.get_infos = 0
        self.lock = threading.Lock()

    def GetInfo(self, request: regpb.InfoRequest, context: grpc.ServicerContext) -> regpb.PluginInfo:  # noqa: N802
        with self.lock:
            self.get_infos += 1
        return self.info

    def NotifyRegistrationStatus(  # noqa: N802
        self, request: regpb.RegistrationStatus, context: grpc.ServicerContext
    ) -> regpb.RegistrationStatusResponse:
        with self.lock:
            self.statuses.append((request.plugin_registered, request.error))
        return regpb.RegistrationStatusResponse()


@pytest.fixture
def serve(short_tmp: Path) -> Iterator[Callable[..., str]]:
    servers: list[grpc.Server] = []

    def start(plugin: Plugin, name: str = "x.example-reg.sock") -> str:
        path = str(short_tmp / "reg" / name)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
        regpb_grpc.add_RegistrationServicer_to_server(plugin, server)
        server.add_insecure_port("unix:" + path)
        server.start()
        servers.append(server)
        return path

    yield start
    for server in servers:
        server.stop(None).wait()


def info(**fields: object) -> regpb.PluginInfo:
    values: dict[str, object] = {
        "type": "DRAPlugin",
        "name": "x.example",
        "endpoint": "/nowhere/dra.sock",
        "supported_versions": ["v1.DRAPlugin", "v1beta1.DRAPlugin"],
    }
    values.update(fields)
    return regpb.PluginInfo(**values)


def status(plugin: Plugin) -> tuple[bool, str]:
    return wait_until(lambda: plugin.statuses[0] if plugin.statuses else None, 10, "a registration status")


@pytest.mark.parametrize(
    ("fields", "error"),
    [
        pytest.param(
            {"type": "CSIPlugin"},
            "RegisterPlugin error -- no handler registered for plugin type: CSIPlugin at socket ",
            id="not-a-dra-plugin",
        ),
        pytest.param(
            {"supported_versions": []},
            "empty list of supported gRPC services (aka supported versions)",
            id="no-services",
        ),
        pytest.param(
            {"supported_versions": ["v1", "DRAPlugin", "k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin"]},
            'none of services supported by the plugin (["v1" "DRAPlugin" "k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin"])',
            id="services-not-named-as-the-kubelet-names-them",
        ),
    ],
)
def test_a_get_info_the_kubelet_refuses_is_refused_in_its_words(
    short_tmp: Path, serve: Callable[..., str], fields: dict[str, object], error: str
) -> None:
    plugin = Plugin(info(**fields))
    socket_path = serve(plugin)
    with FakePluginWatcher(short_tmp / "reg", **FAST) as kubelet:
        ok, said = status(plugin)
        assert not ok and error in said, said
        registration = kubelet.wait_registration(ok=False)
        assert registration.socket == socket_path and not registration.ok
        assert kubelet.endpoints("x.example") == []


def test_the_plugins_order_of_services_decides(short_tmp: Path, serve: Callable[..., str]) -> None:
    plugin = Plugin(info(supported_versions=["v9.DRAPlugin", "v1beta1.DRAPlugin", "v1.DRAPlugin"]))
    serve(plugin)
    with FakePluginWatcher(short_tmp / "reg", **FAST) as kubelet:
        assert status(plugin) == (True, "")
        assert kubelet.wait_registration().service == "v1beta1.DRAPlugin"


def test_an_empty_endpoint_is_the_registration_socket(short_tmp: Path, serve: Callable[..., str]) -> None:
    plugin = Plugin(info(endpoint=""))
    socket_path = serve(plugin)
    with FakePluginWatcher(short_tmp / "reg", **FAST) as kubelet:
        assert status(plugin) == (True, "")
        assert kubelet.wait_registration().endpoint == socket_path
        kubelet.wait_usable("x.example")  # the registration server itself answers there


@pytest.mark.parametrize(
    ("fields", "violation"),
    [
        pytest.param({"name": "X_Example"}, "is no ResourceSlice driver", id="driver-name-not-dns"),
        pytest.param({"name": "d" * 64}, "is no ResourceSlice driver", id="driver-name-too-long"),
        pytest.param({"endpoint": "plugins/dra.sock"}, "is not absolute", id="relative-endpoint"),
    ],
)
def test_what_the_kubelet_lets_through_but_breaks_a_driver_is_a_violation(
    short_tmp: Path, serve: Callable[..., str], fields: dict[str, object], violation: str
) -> None:
    plugin = Plugin(info(**fields))
    serve(plugin)
    with FakePluginWatcher(short_tmp / "reg", **FAST) as kubelet:
        assert status(plugin) == (True, "")  # the kubelet itself registers it
        assert any(violation in v for v in kubelet.violations()), kubelet.violations()


def test_one_endpoint_is_registered_once(short_tmp: Path, serve: Callable[..., str]) -> None:
    first, second = Plugin(info()), Plugin(info())
    serve(first, "a-reg.sock")
    with FakePluginWatcher(short_tmp / "reg", **FAST) as kubelet:
        assert status(first) == (True, "")
        serve(second, "b-reg.sock")
        ok, said = status(second)
        assert not ok and "endpoint /nowhere/dra.sock already registered for DRA driver plugin x.example" in said
        assert kubelet.wait_registration(ok=False).socket.endswith("/b-reg.sock")
        assert len(kubelet.endpoints("x.example")) == 1


def test_dot_files_and_non_sockets_are_never_dialled(short_tmp: Path, serve: Callable[..., str]) -> None:
    hidden, shown = Plugin(info()), Plugin(info(name="y.example", endpoint="/nowhere/y.sock"))
    serve(hidden, ".x.example-reg.sock")
    (short_tmp / "reg" / "notes-reg.sock").write_text("not a socket")
    with FakePluginWatcher(short_tmp / "reg", **FAST) as kubelet:
        serve(shown, "sub/y.example-reg.sock")  # a subdirectory is watched too
        assert status(shown) == (True, "")
        assert [r.name for r in kubelet.registrations()] == ["y.example"]
    assert hidden.get_infos == 0
