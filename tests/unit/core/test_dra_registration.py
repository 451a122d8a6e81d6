"""What a DRA driver tells the kubelet's plugin watcher: the GetInfo answer, the socket names, the retry delay."""

from __future__ import annotations

import pytest

from colad.api import dra_health_v1_pb2, dra_health_v1alpha1_pb2, dra_v1_pb2, dra_v1beta1_pb2
from colad.core.dra_registration import (
    DRA_HEALTH_SERVICES,
    DRA_SERVICES,
    RETRY_FIRST,
    RETRY_MAX,
    PluginInfo,
    plugin_info,
    plugin_socket_path,
    registration_socket_path,
    retry_delay,
)

pytestmark = pytest.mark.unit


def test_get_info_names_a_dra_plugin_its_driver_its_endpoint_and_the_services_newest_first() -> None:
    info = plugin_info("cola.myway5.com", "/var/lib/kubelet/plugins/cola.myway5.com/dra.sock")
    assert info == PluginInfo(
        "DRAPlugin",
        "cola.myway5.com",
        "/var/lib/kubelet/plugins/cola.myway5.com/dra.sock",
        ("v1.DRAPlugin", "v1beta1.DRAPlugin", "v1.DRAResourceHealth", "v1alpha1.DRAResourceHealth"),
    )


def test_each_advertised_service_names_a_served_proto_service_by_its_last_two_parts() -> None:
    """The kubelet's "<gRPC package>.<service>" is the proto package's last part, not the full package."""
    services = [f.DESCRIPTOR.services_by_name["DRAPlugin"].full_name for f in (dra_v1_pb2, dra_v1beta1_pb2)]
    assert services == ["k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin", "k8s.io.kubelet.pkg.apis.dra.v1beta1.DRAPlugin"]
    assert [".".join(s.split(".")[-2:]) for s in services] == list(DRA_SERVICES)


def test_each_advertised_health_service_is_the_full_name_of_a_served_proto_service() -> None:
    """The health protos' packages are "v1" and "v1alpha1": the entry is the service's full name."""
    files = (dra_health_v1_pb2, dra_health_v1alpha1_pb2)
    services = [f.DESCRIPTOR.services_by_name["DRAResourceHealth"].full_name for f in files]
    assert services == list(DRA_HEALTH_SERVICES)


@pytest.mark.parametrize(
    ("directory", "expected"),
    [
        ("/var/lib/kubelet/plugins_registry", "/var/lib/kubelet/plugins_registry/cola.myway5.com-reg.sock"),
        ("/r/", "/r/cola.myway5.com-reg.sock"),
    ],
)
def test_the_registration_socket_is_the_driver_then_reg_sock(directory: str, expected: str) -> None:
    assert registration_socket_path(directory, "cola.myway5.com") == expected


def test_the_service_socket_is_dra_sock_in_the_drivers_own_directory() -> None:
    path = plugin_socket_path("/var/lib/kubelet/plugins", "cola.myway5.com")
    assert path == "/var/lib/kubelet/plugins/cola.myway5.com/dra.sock"


@pytest.mark.parametrize(
    ("refusals", "delay"),
    [
        (0, RETRY_FIRST),
        (1, RETRY_FIRST),
        (2, 2 * RETRY_FIRST),
        (3, 4 * RETRY_FIRST),
        (7, RETRY_MAX),
        (10**6, RETRY_MAX),
    ],
)
def test_the_retry_delay_doubles_up_to_its_cap(refusals: int, delay: float) -> None:
    assert retry_delay(refusals) == delay
