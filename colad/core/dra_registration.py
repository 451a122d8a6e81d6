"""What a DRA driver tells the kubelet's plugin watcher, and where its sockets are: pure values.

The kubelet finds a DRA driver by a registration socket in its plugins_registry directory, asks it
GetInfo, and dials the endpoint named there (colad/dra/registration.py serves this answer). The
strings and socket names are upstream's, each with the file it was read from. No I/O.
"""

from __future__ import annotations

import posixpath
from dataclasses import dataclass

TYPE_CHECKING = False  # typing is not loaded at run time: docs/DEVELOPING.md, "Import cost"
if TYPE_CHECKING:
    from typing import Final

# kubernetes/kubelet pkg/apis/pluginregistration/v1/constants.go: PluginInfo.type of a DRA driver.
DRA_PLUGIN_TYPE: Final = "DRAPlugin"
# kubernetes/kubelet pkg/apis/dra/v1/types.go and v1beta1/types.go DRAPluginService: the supported_versions
# entries naming the services served ("<gRPC package>.<service>" in the kubelet's words, not the full proto
# package). The kubelet takes the first entry it knows, so the newest goes first (kubernetes/kubernetes
# pkg/kubelet/cm/dra/plugin/dra_plugin_manager.go validateSupportedServices).
DRA_SERVICES: Final = ("v1.DRAPlugin", "v1beta1.DRAPlugin")
# kubernetes/kubelet pkg/apis/dra-health/v1/types.go and v1alpha1/types.go DRAResourceHealthService: the
# health stream's entries. A kubelet with pickHealthService (1.37) opens the stream only when one is
# listed, the newest both sides know; a 1.36 kubelet opens it whatever is listed.
DRA_HEALTH_SERVICES: Final = ("v1.DRAResourceHealth", "v1alpha1.DRAResourceHealth")
DRA_SUPPORTED_VERSIONS: Final = DRA_SERVICES + DRA_HEALTH_SERVICES
# kubernetes/dynamic-resource-allocation kubeletplugin/draplugin.go: KubeletRegistryDir, KubeletPluginsDir,
# the registration socket "<driver>-reg.sock" and the service socket "<plugins dir>/<driver>/dra.sock".
KUBELET_REGISTRY_DIR: Final = "/var/lib/kubelet/plugins_registry"
KUBELET_PLUGINS_DIR: Final = "/var/lib/kubelet/plugins"
REGISTRATION_SOCKET_SUFFIX: Final = "-reg.sock"
PLUGIN_SOCKET_NAME: Final = "dra.sock"


def registration_socket_path(registry_dir: str, driver: str) -> str:
    """<registry_dir>/<driver>-reg.sock: the name starts with the driver, never with '.' (the kubelet
    ignores dot files in the registry, pluginwatcher/plugin_watcher.go handleCreateEvent)."""
    return posixpath.join(registry_dir, driver + REGISTRATION_SOCKET_SUFFIX)


def plugin_socket_path(plugins_dir: str, driver: str) -> str:
    """<plugins_dir>/<driver>/dra.sock: the endpoint GetInfo names, absolute when plugins_dir is."""
    return posixpath.join(plugins_dir, driver, PLUGIN_SOCKET_NAME)


@dataclass(frozen=True)
class PluginInfo:
    """The GetInfo answer (pluginregistration v1 PluginInfo), field by field."""

    type: str
    name: str
    endpoint: str
    supported_versions: tuple[str, ...]


def plugin_info(driver: str, endpoint: str) -> PluginInfo:
    """What colad answers GetInfo with: a DRA plugin named after its driver, serving DRA v1 and v1beta1
    and the health stream v1 and v1alpha1."""
    return PluginInfo(DRA_PLUGIN_TYPE, driver, endpoint, DRA_SUPPORTED_VERSIONS)


# After the kubelet refused a registration, the registration socket is made anew after this many seconds,
# doubling per refusal up to the cap: the kubelet retries a refusal of its RegisterPlugin step only when
# the socket is re-created (kubernetes/kubernetes pkg/kubelet/pluginmanager/operationexecutor
# operation_generator.go: the plugin stays in its actual state of world).
RETRY_FIRST: Final = 1.0
RETRY_MAX: Final = 60.0


def retry_delay(refusals: int) -> float:
    """Seconds before the next registration after `refusals` refusals in a row (at least 1)."""
    doublings = min(max(refusals, 1) - 1, 16)
    return min(RETRY_FIRST * float(1 << doublings), RETRY_MAX)
