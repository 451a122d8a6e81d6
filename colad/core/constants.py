"""Constants of the kubelet device plugin contract, and colad's own fixed names.

Every upstream value names the file it was read from. Nothing here does I/O.
"""

from __future__ import annotations

TYPE_CHECKING = False  # typing is not loaded at run time: docs/DEVELOPING.md, "Import cost"
if TYPE_CHECKING:
    from typing import Final


# kubernetes/kubelet pkg/apis/deviceplugin/v1beta1/constants.go
HEALTHY: Final = "Healthy"  # line 21
UNHEALTHY: Final = "Unhealthy"  # line 23
VERSION: Final = "v1beta1"  # line 26
DEVICE_PLUGIN_PATH: Final = "/var/lib/kubelet/device-plugins"  # line 30
KUBELET_SOCKET_NAME: Final = "kubelet.sock"  # line 32: DevicePluginPath + "kubelet.sock"
SUPPORTED_VERSIONS: Final = ("v1beta1",)  # line 48

# pkg/kubelet/cm/devicemanager/plugin/v1beta1/client.go dial(): the kubelet gives
# up dialling the plugin socket after 10 s, so Register must not wait for less.
KUBELET_DIAL_TIMEOUT_S: Final = 10.0

# v1beta1/api.proto, Device.ID: "Max length of this field is 63 characters".
MAX_DEVICE_ID_LENGTH: Final = 63
# The config's `replicas` is 1..MAX_REPLICAS, so a replica ID's index ("<id>::<n>") is below it.
MAX_REPLICAS: Final = 1000

# The kubelet's gRPC client keeps grpc-go's default receive limit (4 MiB).
KUBELET_MAX_RECV_MESSAGE_BYTES: Final = 4 * 1024 * 1024

# colad's own names.
PLUGIN_SOCKET_PREFIX: Final = "colad-"  # + <unix ms> + ".sock": unique per serve, see colad/plugin/main.py
PLUGIN_SOCKET_SUFFIX: Final = ".sock"
QUEUE_SOCKET_NAME: Final = "queue.sock"
SUPERVISOR_SOCKET_NAME: Final = "supervisor.sock"
SUPERVISOR_CONF_NAME: Final = "supervisord.conf"
# In a subdirectory: discovery and kubelet-watch watch run_dir itself for queue.sock, and
# every state-file rename there would wake them on the path of a device change.
PLUGIN_STATE_NAME: Final = "state/plugin.json"
STATUS_SOCKET_NAME: Final = "state/status.sock"  # the plugin answers `colad status` here (status_socket.py)
INUSE_STATE_NAME: Final = "state/inuse.json"  # kubelet-watch's in-use view for `colad status` (podresources.py)
SOCKET_RECORD_NAME: Final = "state/sockets.json"  # the plugin sockets colad created: the only ones it ever removes
SUPERVISOR_PID_NAME: Final = "supervisord.pid"  # as conf/supervisord.conf's pidfile names it
COLA_DEVICES_ENV: Final = "COLA_DEVICES"

# kubernetes/kubelet pkg/apis/podresources: the kubelet's PodResources socket (pod-resources/kubelet.sock).
POD_RESOURCES_SOCKET: Final = "/var/lib/kubelet/pod-resources/kubelet.sock"

# Device files and the richer device model (docs/DEVICES.md). The limits keep one device file
# from blowing up a snapshot on the queue or an Allocate answer.
MAX_DEVICE_FILE_BYTES: Final = 64 * 1024  # the reader reads at most this + 1 bytes
MAX_DEVICE_LIST_ENTRIES: Final = 64  # numa_nodes, device_nodes, mounts, cdi_devices (each)
MAX_DEVICE_MAP_ENTRIES: Final = 128  # envs, annotations (each)
MAX_DEVICE_STRING_BYTES: Final = 4096  # any one string (path, env value, annotation, ...), UTF-8 bytes
MAX_NUMA_NODE: Final = 1023  # NUMA node IDs are 0..1023 (Linux MAX_NUMNODES with NODES_SHIFT=10)
COLA_REPLICAS_ENV: Final = "COLA_REPLICAS"
# colad owns every container env name starting with COLA_ (it sets COLA_DEVICES and COLA_REPLICAS
# and may add more), so a device file may not set any of them.
RESERVED_ENV_PREFIX: Final = "COLA_"

# Metadata `colad check` sends on every call (value "1"): the plugin keeps its Allocates out of the
# allocation metrics.
CHECK_METADATA_KEY: Final = "x-colad-check"

# gRPC reads "unix:<path>" as a URI: %XX is decoded, ? and # start a query or a fragment, and ","
# separates addresses (checked with grpcio 1.51 and 1.85: bind or dial then misses the path). A socket
# path colad binds or dials holds none of these.
GRPC_UNSAFE_PATH_CHARS: Final = "%?#,"
# Linux <linux/un.h>: sun_path holds 108 bytes; gRPC (unix_sockaddr_populate) keeps one for the
# terminating NUL, so a socket path colad binds or dials is at most 107 bytes.
SUN_PATH_MAX_BYTES: Final = 107
# Linux include/linux/threads.h PID_MAX_LIMIT (4 * 1024 * 1024): a pid has at most 7 digits. Staging
# socket names carry one: colad/queue/server.py "<queue.sock>.<pid>.tmp", supervisor/http.py "<file>.<pid>".
PID_MAX_DIGITS: Final = 7
# Unix milliseconds in the plugin socket name (colad-<ms>.sock) have 13 digits until the year 2286.
PLUGIN_SOCKET_STAMP_DIGITS: Final = 13

# While a kernel inotify limit (fs.inotify.max_user_instances or max_user_watches, shared by every
# process of the uid) keeps a watch out, discovery and kubelet-watch look at their directories this
# often (seconds) and try inotify again; the roles report it in their Stats under these keys.
DEGRADED_POLL_S = 1.0
INOTIFY_DEGRADED = "inotify_degraded."  # + the limit's name: 1 while it keeps a watch out, else 0
INOTIFY_LIMIT_REACHED = "inotify.limit_reached"  # counted on each entry into the degraded mode
