"""A strict fake of the kubelet's device manager, for tests that drive a real plugin over gRPC.

Serves v1beta1.Registration on <plugin_dir>/kubelet.sock and behaves like a kubelet since the 1.25
refactor. Sources (kubernetes/kubernetes pkg/kubelet/cm/devicemanager unless noted):
plugin/v1beta1/server.go (Start, Register checks, Stop), handler.go (connectClient, runClient),
client.go (10 s blocking dial, 4 MiB receive limit, ListAndWatch), manager.go (CleanupPluginDirectory,
PluginConnected, markResourceUnhealthy, checkpoint per update), endpoint.go (one container per
Allocate), and kubernetes/kubelet pkg/apis/deviceplugin/v1beta1/constants.go. Anything a plugin does
that the contract forbids is appended to `violations`; tests assert it stays empty.
"""

from __future__ import annotations

import json
import os
import re
import socket
import stat
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable
from concurrent import futures
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar, cast

import grpc
from google.protobuf.message import DecodeError, Message

from colad.api import deviceplugin_pb2 as pb
from colad.api import deviceplugin_pb2_grpc as pb_grpc
from colad.core import constants
from tests.helpers import WaitTimeout, wait_until

M = TypeVar("M", bound=Message)
T = TypeVar("T")

# k8s.io/apimachinery pkg/util/validation/validation.go: dns1123SubdomainFmt, qualifiedNameFmt.
_DNS1123_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")
_QUALIFIED_NAME = re.compile(r"([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]")
_PLUGIN = "/v1beta1.DevicePlugin/"

# kubernetes/kubernetes pkg/kubelet/cm/devicemanager/types.go kubeletDeviceManagerCheckpoint: the file the
# device manager rewrites in the plugin directory after every update.
CHECKPOINT_NAME = "kubelet_internal_checkpoint"


def is_extended_resource_name(name: str) -> bool:
    """pkg/apis/core/v1/helper/helpers.go IsExtendedResourceName, with IsQualifiedName inlined."""
    if "/" not in name or "kubernetes.io/" in name or name.startswith("requests."):
        return False
    parts = ("requests." + name).split("/")
    if len(parts) != 2:
        return False
    prefix, short = parts
    if len(prefix) > 253 or not _DNS1123_SUBDOMAIN.fullmatch(prefix):
        return False
    return len(short) <= 63 and _QUALIFIED_NAME.fullmatch(short) is not None


def _go_quote(text: str) -> str:
    return json.dumps(text, ensure_ascii=False)  # close enough to Go's %q for test texts


def _go_status(exc: grpc.RpcError) -> str:
    """A gRPC error as grpc-go's status.Error prints it."""
    if not isinstance(exc, grpc.Call):
        return str(exc)
    return f"rpc error: code = {''.join(w.capitalize() for w in exc.code().name.split('_'))} desc = {exc.details()}"


class KubeletError(RuntimeError):
    """An error the kubelet raises itself (stopped endpoint, undecodable reply, no container response)."""


@dataclass(frozen=True)
class Registration:
    """One Register call as the kubelet saw it."""

    at: float
    version: str
    endpoint: str
    resource_name: str
    options: tuple[bool, bool] | None  # RegisterRequest.options, None if unset
    ok: bool
    error: str
    answered_at: float


@dataclass(frozen=True)
class ListAndWatchUpdate:
    at: float
    endpoint: str
    devices: dict[str, str]
    size_bytes: int


@dataclass(eq=False)
class _Client:
    """handler.go's Client plus manager.go's endpointInfo: one connection to one plugin socket."""

    resource: str
    endpoint: str
    channel: grpc.Channel
    options: tuple[bool, bool]
    stop_event: threading.Event  # the kubelet run it belongs to
    stream_open: bool = True
    stopped: bool = False  # endpoint.go isStopped(): its stream ended
    thread: threading.Thread | None = None


class _RegistrationServicer(pb_grpc.RegistrationServicer):
    def __init__(self, kubelet: FakeKubelet) -> None:
        self._kubelet = kubelet

    def Register(self, request: pb.RegisterRequest, context: grpc.ServicerContext) -> pb.Empty:  # noqa: N802
        return self._kubelet._register(request, context)


class FakeKubelet:
    """The device manager of one kubelet for the resource its latest successful Register named.

    Newest registration wins, as with clients keyed by (name, socket) since kubernetes/kubernetes#135437:
    a superseded stream is still read and recorded in `updates` but never changes `devices()`, and its
    end does not mark the resource unhealthy (older kubelets would, kubernetes/kubernetes#121994).
    `dial_timeout` only shortens tests.
    """

    def __init__(
        self,
        plugin_dir: str | Path,
        *,
        register_error: str | None = None,
        register_delay: float = 0.0,
        write_checkpoint: bool = True,
        dial_timeout: float = constants.KUBELET_DIAL_TIMEOUT_S,
    ) -> None:
        self.plugin_dir = Path(plugin_dir)
        self.socket_path = self.plugin_dir / constants.KUBELET_SOCKET_NAME
        self.register_error = register_error
        self.register_delay = register_delay
        self.write_checkpoint = write_checkpoint
        self.dial_timeout = dial_timeout
        self._cond = threading.Condition()
        self._checkpoint_lock = threading.Lock()
        self._registrations: list[Registration] = []
        self._updates: list[ListAndWatchUpdate] = []
        self._handled = 0  # updates whose handling ended (checkpoint written): the loop is back in Recv()
        self._violations: list[str] = []
        self._in_flight = 0  # Register calls being carried out, even those whose caller gave up
        self._clients: list[_Client] = []
        self._channels: set[grpc.Channel] = set()
        self._current: dict[str, _Client] = {}  # resource -> newest successful registration
        self._held: dict[str, dict[str, str]] = {}  # resource -> device set the kubelet holds
        self._topology: dict[str, dict[str, tuple[int, ...]]] = {}  # resource -> device -> NUMA nodes
        self._resource: str | None = None
        self._server: grpc.Server | None = None
        self._stop_event = threading.Event()

    # ---- life cycle (server.go Start/Stop) ----
    def start(self) -> None:
        with self._cond:
            if self._server is not None:
                raise RuntimeError("fake kubelet already started")
            self._stop_event = threading.Event()
        self.plugin_dir.mkdir(mode=0o750, parents=True, exist_ok=True)
        self._cleanup_plugin_directory()
        self.socket_path.unlink(missing_ok=True)  # newer server.go cleanupSocket()
        server = grpc.server(futures.ThreadPoolExecutor(max_workers=8, thread_name_prefix="fake-kubelet"))
        pb_grpc.add_RegistrationServicer_to_server(_RegistrationServicer(self), server)  # type: ignore[no-untyped-call]
        if not server.add_insecure_port("unix:" + str(self.socket_path)):
            raise RuntimeError(f"cannot listen on {self.socket_path}")
        server.start()
        with self._cond:
            self._server = server

    def stop(self, *, leave_stale_socket: bool = False) -> None:
        with self._cond:
            server, self._server = self._server, None
            if server is None:
                return
            self._stop_event.set()
            channels, clients = list(self._channels), list(self._clients)
        server.stop(grace=None).wait(5)  # grpc also unlinks kubelet.sock here
        for channel in channels:  # Disconnect every client: their streams end, devices turn unhealthy
            self._close(channel)
        for client in clients:
            if client.thread is not None:
                client.thread.join(5)
        if leave_stale_socket:  # a SIGKILLed kubelet: the file stays, nobody listens
            self.socket_path.unlink(missing_ok=True)
            with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as stale:
                stale.bind(str(self.socket_path))
        else:
            self.socket_path.unlink(missing_ok=True)

    def restart(self) -> None:
        self.stop()
        self.start()

    def __enter__(self) -> FakeKubelet:
        self.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    def _cleanup_plugin_directory(self) -> None:
        """manager.go CleanupPluginDirectory: remove what os.Stat calls a socket, except the checkpoint."""
        for name in os.listdir(self.plugin_dir):
            if name == CHECKPOINT_NAME:
                continue
            try:
                mode = os.stat(self.plugin_dir / name).st_mode  # follows symlinks, like os.Stat
            except OSError:
                continue  # upstream logs and skips, e.g. a dangling symlink
            if stat.S_ISSOCK(mode):
                os.remove(self.plugin_dir / name)

    # ---- Register (server.go Register -> handler.go connectClient -> manager.go PluginConnected) ----
    def _register(self, request: pb.RegisterRequest, context: grpc.ServicerContext) -> pb.Empty:
        at = time.monotonic()
        stop_event = self._stop_event
        with self._cond:
            self._in_flight += 1
        try:
            if self.register_delay:
                stop_event.wait(self.register_delay)  # a slow kubelet; cut short if it is stopped meanwhile
            sent = request.options if request.HasField("options") else None
            error = self._connect(request, stop_event)
        finally:
            with self._cond:
                self._in_flight -= 1
        registration = Registration(
            at=at,
            version=request.version,
            endpoint=request.endpoint,
            resource_name=request.resource_name,
            options=None if sent is None else (sent.pre_start_required, sent.get_preferred_allocation_available),
            ok=not error,
            error=error,
            answered_at=time.monotonic(),
        )
        with self._cond:
            self._registrations.append(registration)
            self._cond.notify_all()
        if error:
            context.abort(grpc.StatusCode.UNKNOWN, error)
        return pb.Empty()

    def _connect(self, r: pb.RegisterRequest, stop_event: threading.Event) -> str:
        """Return "" on success, else the error text the kubelet answers with."""
        if self.register_error is not None:
            return self.register_error
        if r.version not in constants.SUPPORTED_VERSIONS:
            supported = "[" + " ".join(_go_quote(v) for v in constants.SUPPORTED_VERSIONS) + "]"
            return (
                f"requested API version {_go_quote(r.version)} is not supported by kubelet. "
                f"Supported version is {supported}"
            )
        if not is_extended_resource_name(r.resource_name):
            return f"the ResourceName {_go_quote(r.resource_name)} is invalid"
        if "/" in r.endpoint:
            self._violate(f"Register: endpoint {r.endpoint!r} is not a file name in the device-plugins directory")
        path = os.path.normpath(f"{self.plugin_dir}/{r.endpoint}")  # filepath.Join(socketDir, r.Endpoint)
        channel = grpc.insecure_channel(
            "unix:" + path,
            options=[
                ("grpc.max_receive_message_length", constants.KUBELET_MAX_RECV_MESSAGE_BYTES),
                ("grpc.default_authority", "localhost"),
            ],
        )
        with self._cond:
            if stop_event.is_set():
                channel.close()
                return "device plugin registration server stopped"
            self._channels.add(channel)
        try:
            grpc.channel_ready_future(channel).result(timeout=self.dial_timeout)
        except (grpc.FutureTimeoutError, grpc.FutureCancelledError):
            self._close(channel)
            return "failed to dial device plugin: context deadline exceeded"
        try:
            reply = self._unary(channel, "GetDevicePluginOptions", pb.Empty(), pb.DevicePluginOptions, None)
        except (grpc.RpcError, KubeletError, ValueError) as exc:
            self._close(channel)
            return f"failed to get device plugin options: {_go_status(exc) if isinstance(exc, grpc.RpcError) else exc}"
        options = (reply.pre_start_required, reply.get_preferred_allocation_available)
        sent = (r.options.pre_start_required, r.options.get_preferred_allocation_available)
        if sent != options:  # an unset RegisterRequest.options reads as all false, as in Go
            self._violate(
                f"Register: RegisterRequest.options {sent} differ from GetDevicePluginOptions {options} "
                "(pre_start_required, get_preferred_allocation); kubelets before 1.25 use the former"
            )
        client = _Client(r.resource_name, r.endpoint, channel, options, stop_event)
        client.thread = threading.Thread(target=self._run, args=(client,), name=f"law-{r.endpoint}", daemon=True)
        with self._cond:
            stopped = stop_event.is_set()
            if not stopped:
                self._clients.append(client)
                self._current[r.resource_name] = client  # newest wins (PluginConnected overwrites m.endpoints)
                self._resource = r.resource_name
                client.thread.start()  # `go runClient(...)`; started under the lock so stop() can join it
                self._cond.notify_all()
        if stopped:
            self._close(channel)
            return "device plugin registration server stopped"
        return ""

    # ---- ListAndWatch (client.go Run, manager.go genericDeviceUpdateCallback / PluginDisconnected) ----
    def _run(self, client: _Client) -> None:
        listen = client.channel.unary_stream(_PLUGIN + "ListAndWatch", request_serializer=pb.Empty.SerializeToString)
        try:
            call = listen(pb.Empty())
            for raw in call:
                if not self._receive(client, raw):
                    call.cancel()
                    break
        except grpc.RpcError as exc:
            if exc.code() == grpc.StatusCode.RESOURCE_EXHAUSTED:
                self._violate(
                    f"ListAndWatch from {client.endpoint}: message over the kubelet's 4 MiB limit: {_go_status(exc)}"
                )
        except ValueError:
            pass  # the channel was closed before the call started
        finally:
            with self._cond:
                client.stream_open, client.stopped = False, True
                held = self._held.get(client.resource)
                if self._current.get(client.resource) is client and held is not None:
                    self._held[client.resource] = {i: constants.UNHEALTHY for i in held}  # markResourceUnhealthy
                self._cond.notify_all()
            self._close(client.channel)  # Disconnect; the kubelet never redials

    def _receive(self, client: _Client, raw: bytes) -> bool:
        at = time.monotonic()
        try:
            message = self._parse(pb.ListAndWatchResponse, raw, f"ListAndWatch from {client.endpoint}")
        except KubeletError:
            return False  # Recv() fails, so the stream ends
        ids = [d.ID for d in message.devices]
        devices = {d.ID: d.health for d in message.devices}
        where = f"ListAndWatch from {client.endpoint}"
        duplicates = sorted(i for i, n in Counter(ids).items() if n > 1)
        problems = [f"{where}: duplicate device IDs {duplicates}"] if duplicates else []
        problems += [
            f"{where}: empty device ID" if not i else f"{where}: device ID {i!r} longer than 63 characters"
            for i in ids
            if not i or len(i) > constants.MAX_DEVICE_ID_LENGTH
        ]
        problems += [
            f"{where}: device {d.ID!r} has health {d.health!r}, not Healthy/Unhealthy"
            for d in message.devices
            if d.health not in (constants.HEALTHY, constants.UNHEALTHY)
        ]
        with self._cond:
            self._updates.append(ListAndWatchUpdate(at, client.endpoint, devices, len(raw)))
            self._violations.extend(problems)
            if self._current.get(client.resource) is client:
                self._held[client.resource] = dict(devices)
                self._topology[client.resource] = {
                    d.ID: tuple(n.ID for n in d.topology.nodes) for d in message.devices if d.HasField("topology")
                }
            self._cond.notify_all()
        try:
            if self.write_checkpoint and not client.stop_event.is_set():
                self._write_checkpoint()
        finally:
            with self._cond:
                self._handled += 1
                self._cond.notify_all()
        return True

    def _write_checkpoint(self) -> None:
        """checkpointmanager + util/store filestore.go writeFile: dot-prefixed temp file, fsync, rename."""
        with self._checkpoint_lock:
            with self._cond:  # RegisteredDevices holds only healthy IDs (manager.go writeCheckpoint)
                registered = {
                    r: sorted(i for i, h in d.items() if h == constants.HEALTHY) for r, d in self._held.items()
                }
            data = {"Data": {"PodDeviceEntries": [], "RegisteredDevices": registered}, "Checksum": 0}
            fd, tmp = tempfile.mkstemp(prefix=".", dir=self.plugin_dir)
            with os.fdopen(fd, "w") as handle:
                json.dump(data, handle)
                handle.flush()
                os.fsync(handle.fileno())
            os.replace(tmp, self.plugin_dir / CHECKPOINT_NAME)

    # ---- RPCs the kubelet makes at admission / container start (endpoint.go, manager.go) ----
    def allocate(self, device_ids: list[str], timeout: float = 10, *, resource: str | None = None) -> dict[str, Any]:
        request = pb.AllocateRequest(container_requests=[pb.ContainerAllocateRequest(devices_ids=device_ids)])
        response = self.allocate_raw(request, timeout, resource=resource)
        if not response.container_responses:
            raise KubeletError(f"no containers return in allocation response {response}")
        r = response.container_responses[0]
        return {
            "envs": dict(r.envs),
            "mounts": [
                {"container_path": m.container_path, "host_path": m.host_path, "read_only": m.read_only}
                for m in r.mounts
            ],
            "devices": [
                {"container_path": d.container_path, "host_path": d.host_path, "permissions": d.permissions}
                for d in r.devices
            ],
            "annotations": dict(r.annotations),
            "cdi_devices": [c.name for c in r.cdi_devices],
        }

    def allocate_raw(
        self, request: pb.AllocateRequest, timeout: float = 10, *, resource: str | None = None
    ) -> pb.AllocateResponse:
        client = self._live_client(resource)
        response = self._unary(client.channel, "Allocate", request, pb.AllocateResponse, timeout)
        want, got = len(request.container_requests), len(response.container_responses)
        if got != want:  # one response per container request, in order
            self._violate(f"Allocate: {got} container responses for {want} container requests")
        for r in response.container_responses:  # what the container runtime would refuse
            paths = [("mount", m.container_path, m.host_path) for m in r.mounts]
            paths += [("device", d.container_path, d.host_path) for d in r.devices]
            for kind, inside, outside in paths:
                if not (inside.startswith("/") and outside.startswith("/")):
                    self._violate(f"Allocate: {kind} {outside!r} -> {inside!r} is not absolute on both sides")
            inside_paths = [p[1] for p in paths]
            if len(set(inside_paths)) != len(inside_paths):
                self._violate(f"Allocate: a container path is used twice in {sorted(inside_paths)}")
            for d in r.devices:
                if not d.permissions or set(d.permissions) - set("rwm"):
                    self._violate(f"Allocate: device {d.host_path!r} has permissions {d.permissions!r}")
        return response

    def get_preferred_allocation(
        self,
        available: list[str],
        must_include: list[str],
        size: int,
        timeout: float = 10,
        *,
        resource: str | None = None,
    ) -> list[str]:
        client = self._live_client(resource)
        if not client.options[1]:
            self._violate("GetPreferredAllocation called although get_preferred_allocation_available is false")
        request = pb.PreferredAllocationRequest(
            container_requests=[
                pb.ContainerPreferredAllocationRequest(
                    available_deviceIDs=available, must_include_deviceIDs=must_include, allocation_size=size
                )
            ]
        )
        response = self._unary(
            client.channel, "GetPreferredAllocation", request, pb.PreferredAllocationResponse, timeout
        )
        if len(response.container_responses) != 1:
            self._violate(f"GetPreferredAllocation: {len(response.container_responses)} container responses for 1")
        return list(response.container_responses[0].deviceIDs) if response.container_responses else []

    def pre_start_container(self, device_ids: list[str], timeout: float = 30) -> None:
        client = self._live_client()
        if not client.options[0]:
            self._violate("PreStartContainer called although pre_start_required is false")
        request = pb.PreStartContainerRequest(devices_ids=device_ids)
        self._unary(client.channel, "PreStartContainer", request, pb.PreStartContainerResponse, timeout)

    def _unary(self, channel: grpc.Channel, method: str, request: Message, reply: type[M], timeout: float | None) -> M:
        call = channel.unary_unary(_PLUGIN + method, request_serializer=type(request).SerializeToString)
        return self._parse(reply, call(request, timeout=timeout), method)  # no deserializer: raw bytes

    def _parse(self, reply: type[M], raw: bytes, what: str) -> M:
        try:
            return cast(M, reply.FromString(raw))
        except DecodeError as exc:  # kubelets since 1.34 reject invalid UTF-8 in string fields
            self._violate(f"{what}: reply does not decode: {exc}")
            raise KubeletError(f"{what}: {exc}") from exc

    def _current_locked(self, resource: str | None = None) -> _Client | None:
        resource = resource or self._resource
        return self._current.get(resource) if resource else None

    def _live_client(self, resource: str | None = None) -> _Client:
        with self._cond:
            client = self._current_locked(resource)
        if client is None:
            raise KubeletError(f"unknown Device Plugin {resource or self._resource}")
        if client.stopped:
            raise KubeletError(f"endpoint {client.endpoint} has been stopped")
        return client

    # ---- observations ----
    @property
    def registrations(self) -> list[Registration]:
        with self._cond:
            return list(self._registrations)

    @property
    def updates(self) -> list[ListAndWatchUpdate]:
        with self._cond:
            return list(self._updates)

    @property
    def violations(self) -> list[str]:
        with self._cond:
            return list(self._violations)

    def registers_in_flight(self) -> int:
        with self._cond:
            return self._in_flight

    def clear_violations(self) -> None:
        """Forget recorded violations (for a test that provokes one on purpose and has checked it)."""
        with self._cond:
            self._violations.clear()

    def successful_registrations(self) -> list[Registration]:
        return [r for r in self.registrations if r.ok]

    def wait_idle(self, timeout: float = 30.0) -> None:
        """Until every ListAndWatch message received so far is handled, its checkpoint written and fsynced.

        The kubelet's receive loop writes the checkpoint before its next Recv(), so a message sent
        meanwhile waits in the stream: on a slow disk an fsync takes 100 ms and more. A measurement
        that means to time the plugin, not the kubelet's disk, waits for this first.
        """
        with self._cond:
            if not self._cond.wait_for(lambda: self._handled >= len(self._updates), timeout):
                raise TimeoutError(f"fake kubelet: {len(self._updates) - self._handled} message(s) unhandled")

    def current_endpoint(self, resource: str | None = None) -> str | None:
        with self._cond:
            client = self._current_locked(resource)
            return client.endpoint if client else None

    def resources(self) -> list[str]:
        """Every resource with a current endpoint, sorted."""
        with self._cond:
            return sorted(self._current)

    def devices(self, resource: str | None = None) -> dict[str, str] | None:
        with self._cond:
            resource = resource or self._resource
            held = self._held.get(resource) if resource else None
            return dict(held) if held is not None else None

    def topology(self, resource: str | None = None) -> dict[str, tuple[int, ...]]:
        """NUMA node IDs of each device in the latest list of the resource's current endpoint."""
        with self._cond:
            resource = resource or self._resource
            return dict(self._topology.get(resource, {})) if resource else {}

    def live_streams(self) -> int:
        with self._cond:
            return sum(c.stream_open for c in self._clients)

    def stream_alive(self, resource: str | None = None) -> bool:
        with self._cond:
            client = self._current_locked(resource)
            return client is not None and client.stream_open

    def options(self) -> tuple[bool, bool] | None:
        with self._cond:
            client = self._current_locked()
            return client.options if client else None

    def wait_registered(self, count: int = 1, timeout: float = 10.0) -> Registration:
        def latest() -> Registration | None:
            done = self.successful_registrations()
            return done[-1] if len(done) >= count else None

        return cast(Registration, self._wait(latest, timeout, f"{count} successful registration(s)"))

    def wait_devices(
        self, expected: dict[str, str] | set[str], timeout: float = 10.0, *, resource: str | None = None
    ) -> None:
        want = {i: constants.HEALTHY for i in expected} if isinstance(expected, set) else dict(expected)
        self._wait(
            lambda: self.devices(resource) == want and self.stream_alive(resource),
            timeout,
            f"devices {want} of {resource or 'the latest resource'} on a live stream",
        )

    def close_stream(self) -> None:
        with self._cond:
            client = self._current_locked()
        if client is None:
            raise KubeletError("no current endpoint")
        self._close(client.channel)
        with self._cond:
            if not self._cond.wait_for(lambda: not client.stream_open, timeout=5):
                raise WaitTimeout(f"stream of {client.endpoint} did not end")

    def _wait(self, predicate: Callable[[], T], timeout: float, describe: str) -> T:
        try:
            return wait_until(predicate, timeout, describe)
        except WaitTimeout as exc:
            raise WaitTimeout(
                f"{exc}\nregistrations: {self.registrations}\ndevices: {self.devices()}\n"
                f"live streams: {self.live_streams()}\nviolations: {self.violations}"
            ) from None

    def _violate(self, text: str) -> None:
        with self._cond:
            self._violations.append(text)
            self._cond.notify_all()

    def _close(self, channel: grpc.Channel) -> None:
        with self._cond:
            self._channels.discard(channel)
        channel.close()  # cancels its calls; their threads take the lock, so not under it
