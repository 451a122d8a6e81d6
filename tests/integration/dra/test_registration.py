"""The DRA registration service against the strict fake plugin watcher, over real sockets and inotify.

Registered with the fields the kubelet checks; refused by a kubelet that knows none of the services
(counted, the socket made anew after the back-off, registered once the kubelet knows them); a removed
socket made anew; a live socket never taken; stopped, the socket gone and the driver deregistered.
"""

from __future__ import annotations

import os
import socket
import stat
from collections.abc import Iterator
from concurrent import futures
from dataclasses import dataclass
from pathlib import Path

import grpc
import pytest

from colad.core.dra_registration import (
    DRA_HEALTH_SERVICES,
    DRA_SERVICES,
    DRA_SUPPORTED_VERSIONS,
    RETRY_MAX,
    plugin_info,
    plugin_socket_path,
    registration_socket_path,
)
from colad.core.errors import InstanceError
from colad.dra.registration import RegistrationPhase, RegistrationService
from colad.metrics.registry import Metrics
from tests.fakes.pluginwatcher import FakePluginWatcher
from tests.helpers import wait_until

pytestmark = pytest.mark.integration

DRIVER = "cola.example.com"
FAST = {"reconcile_period": 0.05, "dial_timeout": 2.0, "backoff_first": 0.05}


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@dataclass
class Node:
    registry: Path
    plugins: Path
    socket: str
    endpoint: str
    clock: Clock

    def service(self) -> RegistrationService:
        return RegistrationService(plugin_info(DRIVER, self.endpoint), self.socket, Metrics(dra=True), clock=self.clock)


@pytest.fixture
def node(short_tmp: Path) -> Node:
    registry, plugins = short_tmp / "reg", short_tmp / "plugins"
    endpoint = plugin_socket_path(str(plugins), DRIVER)
    return Node(registry, plugins, registration_socket_path(str(registry), DRIVER), endpoint, Clock())


@pytest.fixture
def endpoint_server(node: Node) -> Iterator[grpc.Server]:
    """Something listening at the endpoint, as the DRA service will: the kubelet dials it at once."""
    os.makedirs(os.path.dirname(node.endpoint), mode=0o700)
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=1))
    server.add_insecure_port("unix:" + node.endpoint)
    server.start()
    yield server
    server.stop(None).wait()


@pytest.fixture
def service(node: Node) -> Iterator[RegistrationService]:
    service = node.service()
    yield service
    service.stop()


def test_the_kubelet_registers_the_driver(
    node: Node, endpoint_server: grpc.Server, service: RegistrationService
) -> None:
    service.start()
    with FakePluginWatcher(node.registry, **FAST) as kubelet:
        registration = kubelet.wait_registration()
        assert (registration.type, registration.name, registration.endpoint) == ("DRAPlugin", DRIVER, node.endpoint)
        assert registration.supported_versions == DRA_SUPPORTED_VERSIONS == (*DRA_SERVICES, *DRA_HEALTH_SERVICES)
        assert registration.service == "v1.DRAPlugin"
        wait_until(lambda: service.phase is RegistrationPhase.REGISTERED, 5, "the service hears it was registered")
        kubelet.wait_usable(DRIVER)
        assert kubelet.violations() == []
    assert (service.registered, service.refused) == (1, 0)
    assert stat.S_IMODE(os.lstat(node.socket).st_mode) == 0o600


def test_the_directories_colad_makes_are_root_only(node: Node, service: RegistrationService) -> None:
    service.start()
    assert stat.S_IMODE(os.stat(node.registry).st_mode) == 0o700
    node.plugins.mkdir(mode=0o755)
    service.stop()
    service.start()
    assert stat.S_IMODE(os.stat(node.plugins).st_mode) == 0o755  # an existing directory stays as it is


def test_a_refusal_is_counted_and_the_socket_made_anew_until_the_kubelet_registers(
    node: Node, endpoint_server: grpc.Server, service: RegistrationService
) -> None:
    service.start()
    first = os.lstat(node.socket).st_ino
    with FakePluginWatcher(node.registry, kubelet_services=("v1alpha4.Node",), **FAST) as kubelet:
        refused = kubelet.wait_registration(ok=False)
        assert "none of services supported by the plugin" in refused.error
        wait_until(lambda: service.refused >= 1, 5, "the refusal is counted")
        assert service.phase is RegistrationPhase.REFUSED and "none of services" in service.last_error
        assert service.retry_at is not None and node.clock.now < service.retry_at <= node.clock.now + RETRY_MAX
        service.check()  # not yet due: nothing changes
        assert os.lstat(node.socket).st_ino == first
        kubelet.kubelet_services = ("v1.DRAPlugin",)  # the kubelet is upgraded meanwhile
        node.clock.now += RETRY_MAX
        service.check()
        assert service.phase is not RegistrationPhase.REFUSED and service.retry_at is None
        kubelet.wait_registration()
        wait_until(lambda: service.phase is RegistrationPhase.REGISTERED, 5, "registered after the retry")
    assert service.refused >= 1 and service.registered == 1
    counted = service.metrics.registry.get_sample_value("colad_dra_registration_refusals_total", {"driver": DRIVER})
    assert counted == service.refused


def test_a_removed_socket_is_made_anew_and_registered_again(
    node: Node, endpoint_server: grpc.Server, service: RegistrationService
) -> None:
    service.start()
    with FakePluginWatcher(node.registry, **FAST) as kubelet:
        kubelet.wait_registration()
        os.unlink(node.socket)
        kubelet.wait_deregistered(DRIVER)
        assert not service.intact()
        service.check()
        assert service.intact()
        kubelet.wait_registration(count=2)
        wait_until(lambda: service.registered == 2, 5, "the service hears the second registration")


def test_a_kubelet_restart_registers_the_driver_again(
    node: Node, endpoint_server: grpc.Server, service: RegistrationService
) -> None:
    service.start()
    with FakePluginWatcher(node.registry, **FAST) as kubelet:
        kubelet.wait_registration()
        kubelet.restart()
        kubelet.wait_registration(count=2)
        kubelet.wait_usable(DRIVER)
    wait_until(lambda: service.registered == 2, 5, "GetInfo and the status answered again")


def test_a_live_socket_is_never_taken(node: Node, service: RegistrationService) -> None:
    service.start()
    second = node.service()
    with pytest.raises(InstanceError):
        second.start()
    assert service.intact() and second.phase is RegistrationPhase.STOPPED


def test_a_stale_socket_is_replaced(node: Node, service: RegistrationService) -> None:
    node.registry.mkdir(mode=0o700)
    dead = socket.socket(socket.AF_UNIX)
    dead.bind(node.socket)
    dead.close()  # bound, never listening: connect() is refused
    service.start()
    assert service.intact() and service.phase is RegistrationPhase.SERVING


def test_stop_removes_the_socket_and_the_kubelet_deregisters_the_driver(
    node: Node, endpoint_server: grpc.Server, service: RegistrationService
) -> None:
    service.start()
    with FakePluginWatcher(node.registry, **FAST) as kubelet:
        kubelet.wait_registration()
        service.stop()
        assert not os.path.lexists(node.socket) and service.phase is RegistrationPhase.STOPPED
        kubelet.wait_deregistered(DRIVER)
        assert kubelet.endpoints(DRIVER) == []


def test_a_path_taken_meanwhile_is_named_and_served_again_once_free(node: Node, service: RegistrationService) -> None:
    service.start()
    os.unlink(node.socket)
    Path(node.socket).write_text("someone else's")
    service.check()  # never raises: logged, tried again by the next check
    service.check()
    assert service.phase is RegistrationPhase.STOPPED and "not a socket colad made" in service.serve_problem
    assert Path(node.socket).read_text() == "someone else's"
    os.unlink(node.socket)
    service.check()
    assert service.intact() and service.phase is RegistrationPhase.SERVING and service.serve_problem == ""
