"""A strict fake of the kubelet's plugin manager and its DRA handler, for tests of a DRA driver's registration.

Written from kubernetes/kubernetes pkg/kubelet/pluginmanager: pluginwatcher/plugin_watcher.go (MkdirAll 0755,
a walk at start, a recursive watch; dot files and non-sockets ignored; Create adds or updates the socket's
desired state, Remove drops it, a rename away is not a Remove), cache/desired_state_of_world.go and
actual_state_of_world.go, reconciler/reconciler.go (a 1 s loop: unregister first, then register; a socket
made anew at the same path is unregistered, then registered) and operationexecutor/operation_generator.go
(dial 10 s blocking, GetInfo 1 s, the type's handler, the endpoint defaulting to the socket, ValidatePlugin,
the actual state before RegisterPlugin, NotifyRegistrationStatus 5 s; failures before the actual state
retried with back-off); and pkg/kubelet/cm/dra/plugin/dra_plugin_manager.go (ValidatePlugin and
RegisterPlugin choose the first of the plugin's services the kubelet knows; one endpoint per driver once;
the endpoint dialled at once). What the kubelet refuses it refuses in its own words through
NotifyRegistrationStatus. What the contract asks beyond the kubelet's checks (a driver name the API
server takes, an absolute endpoint that accepts connections) is appended to `violations`.
"""

from __future__ import annotations

import json
import os
import re
import stat
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeVar

import grpc
import pyinotify

from colad.api import pluginregistration_pb2 as regpb
from colad.api import pluginregistration_pb2_grpc as regpb_grpc
from tests.helpers import wait_until

T = TypeVar("T")

# kubernetes/kubernetes pkg/kubelet/cm/dra/plugin/dra_plugin_manager.go servicesSupportedByKubelet.
KUBELET_SERVICES = ("v1.DRAPlugin", "v1beta1.DRAPlugin")
DRA_PLUGIN_TYPE = "DRAPlugin"  # kubernetes/kubelet pkg/apis/pluginregistration/v1/constants.go
DIAL_TIMEOUT = 10.0  # operation_generator.go dialTimeoutDuration
GET_INFO_TIMEOUT = 1.0  # operation_generator.go: context.WithTimeout(ctx, time.Second)
NOTIFY_TIMEOUT = 5.0  # operation_generator.go notifyTimeoutDuration
RECONCILE_PERIOD = 1.0  # plugin_manager.go loopSleepDuration
BACKOFF_FIRST, BACKOFF_MAX = 0.5, 120.0  # goroutinemap/exponentialbackoff
# k8s.io/apimachinery IsDNS1123Subdomain; ResourceSlice spec.driver is at most 63 characters.
_DNS1123_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")


def is_driver_name(name: str) -> bool:
    """What the API server takes as a ResourceSlice's spec.driver (lower case, as resource/v1 asks)."""
    return len(name) <= 63 and _DNS1123_SUBDOMAIN.fullmatch(name) is not None


def _go_list(values: Sequence[str]) -> str:
    """A []string as Go's %q prints it."""
    return "[" + " ".join(json.dumps(v) for v in values) + "]"


@dataclass(frozen=True)
class Registration:
    """One registration attempt that reached GetInfo, as the kubelet saw it."""

    at: float
    socket: str
    type: str
    name: str
    endpoint: str
    supported_versions: tuple[str, ...]
    ok: bool
    error: str  # what NotifyRegistrationStatus carried ("" when registered)
    service: str  # the service the kubelet chose ("" when refused)


@dataclass(eq=False)
class Endpoint:
    """dra_plugin_manager.go monitoredPlugin: one registered endpoint of a driver and its connection."""

    driver: str
    endpoint: str
    service: str
    channel: grpc.Channel
    connected: bool = False
    ever_connected: bool = False


@dataclass
class _Desired:
    stamp: int


@dataclass
class _Actual:
    stamp: int
    name: str
    endpoint: str


@dataclass
class _Backoff:
    delay: float = BACKOFF_FIRST
    not_before: float = 0.0
    failures: list[str] = field(default_factory=list)


class RegistrationRefused(RuntimeError):
    pass


class FakePluginWatcher:
    """The plugin manager of one kubelet over `registry_dir`, with the DRA handler as its one handler.

    `kubelet_services` is the kubelet's list (an older kubelet knows other services); the timeouts and
    `reconcile_period` only shorten tests. `root` is where the plugin's file system is seen from here when
    the plugin runs in another mount namespace (`/proc/<pid>/root`): the kubelet dials the endpoint the
    plugin names in the namespace they share on a node, the fake dials it under `root`.
    """

    def __init__(
        self,
        registry_dir: str | Path,
        *,
        kubelet_services: Sequence[str] = KUBELET_SERVICES,
        reconcile_period: float = RECONCILE_PERIOD,
        dial_timeout: float = DIAL_TIMEOUT,
        backoff_first: float = BACKOFF_FIRST,
        root: str = "",
    ) -> None:
        self.registry_dir = Path(registry_dir)
        self.root = root
        self.kubelet_services = tuple(kubelet_services)
        self.reconcile_period = reconcile_period
        self.dial_timeout = dial_timeout
        self.backoff_first = backoff_first
        self._lock = threading.RLock()
        self._desired: dict[str, _Desired] = {}
        self._actual: dict[str, _Actual] = {}
        self._in_flight: set[str] = set()
        self._backoff: dict[str, _Backoff] = {}
        self._stamps = 0
        self._endpoints: dict[str, list[Endpoint]] = {}
        self._registrations: list[Registration] = []
        self._deregistrations: list[tuple[str, str]] = []
        self._violations: list[str] = []
        self._notify_errors: list[str] = []
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self._ops: list[threading.Thread] = []
        self._notifier: pyinotify.Notifier | None = None
        self._wm: pyinotify.WatchManager | None = None

    # --- life cycle -------------------------------------------------------------------------------

    def start(self) -> None:
        self._stop.clear()
        self.registry_dir.mkdir(mode=0o755, parents=True, exist_ok=True)
        self._wm = pyinotify.WatchManager()
        self._notifier = pyinotify.Notifier(self._wm, self._on_event, timeout=50)
        self._traverse(str(self.registry_dir))
        for target, name in ((self._watch, "fake-pluginwatcher"), (self._reconcile_loop, "fake-reconciler")):
            thread = threading.Thread(target=target, name=name, daemon=True)
            thread.start()
            self._threads.append(thread)

    def stop(self) -> None:
        """The kubelet goes away: its watches, loops and connections end; its states are forgotten."""
        self._stop.set()
        for thread in self._threads + self._ops:
            thread.join(timeout=15)
        self._threads, self._ops = [], []
        if self._notifier is not None:
            self._notifier.stop()
            self._notifier = None
        with self._lock:
            channels = [ep.channel for endpoints in self._endpoints.values() for ep in endpoints]
            self._endpoints.clear()
            self._desired.clear()
            self._actual.clear()
            self._backoff.clear()
            self._in_flight.clear()
        for channel in channels:  # outside the lock: a connectivity callback may be waiting for it
            channel.close()

    def restart(self) -> None:
        """A kubelet restart: every socket in the registry is found by the walk and registered again."""
        self.stop()
        self.start()

    def __enter__(self) -> FakePluginWatcher:
        self.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    # --- plugin_watcher.go ------------------------------------------------------------------------

    def _add_watch(self, directory: str) -> None:
        assert self._wm is not None
        mask = pyinotify.IN_CREATE | pyinotify.IN_DELETE | pyinotify.IN_MOVED_TO | pyinotify.IN_DELETE_SELF
        self._wm.add_watch(directory, mask, quiet=True)

    def _traverse(self, directory: str) -> None:
        """traversePluginDir: watch every directory (symlinks not followed), a Create for every socket."""
        self._add_watch(directory)
        for root, dirs, files in os.walk(directory):
            for name in dirs:
                self._add_watch(os.path.join(root, name))
            for name in files:
                path = os.path.join(root, name)
                try:
                    if stat.S_ISSOCK(os.lstat(path).st_mode):
                        self._handle_create(path)
                except OSError:
                    continue

    def _handle_create(self, path: str) -> None:
        """handleCreateEvent: os.Stat (a symlink followed); dot names, then non-sockets, ignored."""
        try:
            st = os.stat(path)
        except OSError:
            return
        if os.path.basename(path).startswith("."):
            return
        if stat.S_ISDIR(st.st_mode):
            self._traverse(path)
            return
        if not stat.S_ISSOCK(st.st_mode):
            return
        with self._lock:
            self._stamps += 1
            self._desired[path] = _Desired(self._stamps)  # AddOrUpdatePlugin: a new timestamp every time

    def _on_event(self, event: pyinotify.Event) -> None:
        if event.mask & (pyinotify.IN_CREATE | pyinotify.IN_MOVED_TO):
            self._handle_create(event.pathname)
        elif event.mask & (pyinotify.IN_DELETE | pyinotify.IN_DELETE_SELF):
            with self._lock:
                self._desired.pop(event.pathname, None)  # handleDeleteEvent: RemovePlugin

    def _watch(self) -> None:
        notifier = self._notifier
        assert notifier is not None
        while not self._stop.is_set():
            if notifier.check_events():
                notifier.read_events()
                notifier.process_events()

    # --- reconciler.go and operation_generator.go -------------------------------------------------

    def _reconcile_loop(self) -> None:
        while not self._stop.wait(self.reconcile_period):
            self._reconcile()

    def _reconcile(self) -> None:
        closing: list[grpc.Channel] = []
        with self._lock:
            for path, actual in list(self._actual.items()):
                desired = self._desired.get(path)
                if desired is None or desired.stamp != actual.stamp:
                    del self._actual[path]
                    closing.extend(self._deregister(actual.name, actual.endpoint))
            now = time.monotonic()
            for path, desired in self._desired.items():
                backoff = self._backoff.get(path)
                if path in self._actual or path in self._in_flight or (backoff and now < backoff.not_before):
                    continue
                self._in_flight.add(path)
                op = threading.Thread(target=self._register_op, args=(path, desired.stamp), daemon=True)
                self._ops = [t for t in self._ops if t.is_alive()] + [op]
                op.start()
        for channel in closing:  # outside the lock, as dra_plugin_manager.go remove() does
            channel.close()

    def _register_op(self, path: str, stamp: int) -> None:
        try:
            self._register(path, stamp)
        except RegistrationRefused as exc:
            with self._lock:
                backoff = self._backoff.setdefault(path, _Backoff(self.backoff_first))
                backoff.failures.append(str(exc))
                backoff.not_before = time.monotonic() + backoff.delay
                backoff.delay = min(backoff.delay * 2, BACKOFF_MAX)
        else:
            with self._lock:
                self._backoff.pop(path, None)
        finally:
            with self._lock:
                self._in_flight.discard(path)

    def _register(self, path: str, stamp: int) -> None:
        channel = grpc.insecure_channel("unix:" + path)
        try:
            try:
                grpc.channel_ready_future(channel).result(timeout=self.dial_timeout)
            except grpc.FutureTimeoutError:
                raise RegistrationRefused(f"RegisterPlugin error -- dial failed at socket {path}") from None
            stub = regpb_grpc.RegistrationStub(channel)
            try:
                info = stub.GetInfo(regpb.InfoRequest(), timeout=GET_INFO_TIMEOUT)
            except grpc.RpcError as exc:
                raise RegistrationRefused(
                    f"RegisterPlugin error -- failed to get plugin info using RPC GetInfo at socket {path}, err: {exc}"
                ) from None
            self._registered_or_refused(stub, path, stamp, info)
        finally:
            channel.close()

    def _registered_or_refused(self, stub: regpb_grpc.RegistrationStub, path: str, stamp: int, info: object) -> None:
        assert isinstance(info, regpb.PluginInfo)
        versions = tuple(info.supported_versions)
        endpoint = info.endpoint or path

        def record(ok: bool, error: str, service: str = "") -> None:
            entry = Registration(time.monotonic(), path, info.type, info.name, endpoint, versions, ok, error, service)
            with self._lock:
                self._registrations.append(entry)

        if info.type != DRA_PLUGIN_TYPE:
            error = f"RegisterPlugin error -- no handler registered for plugin type: {info.type} at socket {path}"
            self._notify(stub, path, False, error)
            record(False, error)
            raise RegistrationRefused(error)
        service, why = self._choose_service(info.name, endpoint, versions)
        if why:
            error = f"RegisterPlugin error -- plugin validation failed with err: {why}"
            self._notify(stub, path, False, error)
            record(False, error)
            raise RegistrationRefused("RegisterPlugin error -- pluginHandler.ValidatePluginFunc failed")
        self._check_contract(info.name, endpoint, path)
        with self._lock:
            # Before RegisterPlugin, so that a socket removed meanwhile is unregistered (operation_generator.go).
            self._actual[path] = _Actual(stamp, info.name, endpoint)
            why = self._add(info.name, endpoint, service)
        if why:
            error = f"RegisterPlugin error -- plugin registration failed with err: {why}"
            self._notify(stub, path, False, error)
            record(False, error)
            return  # the actual state keeps it: no retry until the socket is made anew
        self._notify(stub, path, True, "")
        record(True, "", service)

    def _notify(self, stub: regpb_grpc.RegistrationStub, path: str, ok: bool, error: str) -> None:
        try:
            stub.NotifyRegistrationStatus(
                regpb.RegistrationStatus(plugin_registered=ok, error=error), timeout=NOTIFY_TIMEOUT
            )
        except grpc.RpcError as exc:
            # The kubelet only logs it (upstream's Go helper answers a refusal with an error).
            with self._lock:
                self._notify_errors.append(f"{path}: {exc.code().name if isinstance(exc, grpc.Call) else exc}")

    # --- dra_plugin_manager.go --------------------------------------------------------------------

    def _choose_service(self, driver: str, endpoint: str, versions: tuple[str, ...]) -> tuple[str, str]:
        """ValidatePlugin: (the chosen service, "") or ("", the kubelet's error)."""
        prefix = f"invalid supported gRPC versions of DRA driver plugin {driver} at endpoint {endpoint}: "
        if not versions:
            return "", prefix + "empty list of supported gRPC services (aka supported versions)"
        for service in versions:  # the plugin's order decides
            if service in self.kubelet_services:
                return service, ""
        return "", (
            prefix + f"none of services supported by the plugin ({_go_list(versions)}) "
            f"are supported by the kubelet ({_go_list(self.kubelet_services)})"
        )

    def _add(self, driver: str, endpoint: str, service: str) -> str:
        """add(): one registration per driver and endpoint; the connection is made at once."""
        endpoints = self._endpoints.setdefault(driver, [])
        if any(ep.endpoint == endpoint for ep in endpoints):
            return f"endpoint {endpoint} already registered for DRA driver plugin {driver}"
        dialled = self.root + endpoint if os.path.isabs(endpoint) else endpoint
        ep = Endpoint(driver, endpoint, service, grpc.insecure_channel("unix:" + dialled))

        def watch(state: grpc.ChannelConnectivity) -> None:
            with self._lock:
                ep.connected = state is grpc.ChannelConnectivity.READY
                ep.ever_connected = ep.ever_connected or ep.connected

        ep.channel.subscribe(watch, try_to_connect=True)
        endpoints.append(ep)
        return ""

    def _deregister(self, driver: str, endpoint: str) -> list[grpc.Channel]:
        """DeRegisterPlugin: the endpoint is forgotten; its channel is returned for closing outside the lock."""
        self._deregistrations.append((driver, endpoint))
        endpoints = self._endpoints.get(driver, [])
        gone = [e for e in endpoints if e.endpoint == endpoint]
        for ep in gone:
            endpoints.remove(ep)
        if not endpoints:
            self._endpoints.pop(driver, None)
        return [ep.channel for ep in gone]

    def _check_contract(self, driver: str, endpoint: str, socket: str) -> None:
        """What the kubelet lets through but a working driver cannot be: recorded, not refused."""
        problems = []
        if not is_driver_name(driver):
            problems.append(f"{socket}: driver name {driver!r} is no ResourceSlice driver (a DNS subdomain of <= 63)")
        if not os.path.isabs(endpoint):
            problems.append(f"{socket}: endpoint {endpoint!r} is not absolute (the kubelet dials it from its own cwd)")
        if problems:
            with self._lock:
                self._violations.extend(problems)

    # --- what tests read --------------------------------------------------------------------------

    def registrations(self) -> list[Registration]:
        with self._lock:
            return list(self._registrations)

    def notify_errors(self) -> list[str]:
        """NotifyRegistrationStatus calls the plugin answered with an error (the kubelet only logs them)."""
        with self._lock:
            return list(self._notify_errors)

    def deregistrations(self) -> list[tuple[str, str]]:
        with self._lock:
            return list(self._deregistrations)

    def violations(self) -> list[str]:
        with self._lock:
            return list(self._violations)

    def retry_failures(self, socket: str | Path) -> list[str]:
        """The errors of the attempts the kubelet retries with back-off (before its actual state)."""
        with self._lock:
            backoff = self._backoff.get(str(socket))
            return list(backoff.failures) if backoff else []

    def endpoints(self, driver: str) -> list[Endpoint]:
        with self._lock:
            return list(self._endpoints.get(driver, []))

    def usable(self, driver: str) -> bool:
        """dra_plugin_manager.go usable(): some registered endpoint of the driver is connected."""
        with self._lock:
            return any(ep.connected for ep in self._endpoints.get(driver, []))

    def wait_registration(self, count: int = 1, timeout: float = 10.0, *, ok: bool | None = True) -> Registration:
        """The `count`-th registration attempt (of those with outcome `ok`, or of all when None)."""

        def found() -> Registration | None:
            entries = [r for r in self.registrations() if ok is None or r.ok is ok]
            return entries[count - 1] if len(entries) >= count else None

        return self._wait(found, timeout, f"registration #{count} (ok={ok})")

    def wait_usable(self, driver: str, timeout: float = 10.0) -> None:
        self._wait(lambda: self.usable(driver), timeout, f"a connected endpoint of {driver}")

    def wait_deregistered(self, driver: str, count: int = 1, timeout: float = 10.0) -> None:
        self._wait(
            lambda: len([d for d, _ in self.deregistrations() if d == driver]) >= count,
            timeout,
            f"{count} deregistration(s) of {driver}",
        )

    def _wait(self, predicate: Callable[[], T | None], timeout: float, describe: str) -> T:
        return wait_until(
            predicate,
            timeout,
            f"{describe}; registrations={self.registrations()} violations={self.violations()}",
        )
