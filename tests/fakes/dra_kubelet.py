"""A strict DRA client, calling a driver's DRAPlugin service as the kubelet does.

From kubernetes/kubernetes pkg/kubelet/cm/dra (manager.go, plugin/dra_plugin.go) and kubernetes/kubelet
pkg/apis/dra/v1 and v1beta1: insecure gRPC on unix:<endpoint>, each call under a 45 s deadline, claims
sent as {namespace, uid, name}. An answer must hold exactly one entry per claim uid ("skipped" or
"unknown claim UID" otherwise); a claim's `error` is its failure and its devices are then ignored; a
prepared device needs pool_name and device_name, and request_names are base names (no '/').
Every breach of the contract is recorded in `violations`, and the call's result says what the kubelet saw.

`FakeHealthWatcher` is the kubelet's health stream client, from kubernetes/kubernetes pkg/kubelet/cm/dra
(dra_plugin_manager.go, manager.go, healthinfo.go) and kubernetes/kubelet pkg/apis/dra-health/v1: it picks
the newest health service both sides know from what GetInfo advertised (pickHealthService, 1.37; a 1.36
kubelet opens v1alpha1 whatever was advertised), opens NodeWatchResources, and opens it again 5 s after
the stream ends (wait.UntilWithContext); Unimplemented ends it for good (1.37). On a stream's end it
clears the driver's health cache. Each device's entry is stamped with the time it was received, and
reads Unknown once that is older than the health timeout (healthinfo.go getHealthInfo). Each response
must be the complete list of the driver's devices, each known, once, with a message of at most 1024
characters.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import grpc

from colad.api import dra_health_v1_pb2, dra_health_v1alpha1_pb2, dra_v1_pb2, dra_v1beta1_pb2
from tests.helpers import wait_until

CALL_TIMEOUT = 45.0  # defaultClientCallTimeout
SERVICES = {
    "v1": ("k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin", dra_v1_pb2),
    "v1beta1": (
        "k8s.io.kubelet.pkg.apis.dra.v1beta1.DRAPlugin",
        dra_v1beta1_pb2,
    ),
}


@dataclass(frozen=True)
class Claim:
    namespace: str
    name: str
    uid: str


@dataclass(frozen=True)
class PreparedDevice:
    request_names: tuple[str, ...]
    pool_name: str
    device_name: str
    cdi_device_ids: tuple[str, ...]


@dataclass
class Outcome:
    """What the kubelet made of one call: per claim uid its devices or its error; `failed` if the call failed."""

    devices: dict[str, tuple[PreparedDevice, ...]] = field(default_factory=dict)
    errors: dict[str, str] = field(default_factory=dict)
    failed: str = ""


class FakeDraKubelet:
    """The kubelet's DRA client for one endpoint and one API version ("v1" or "v1beta1")."""

    def __init__(self, endpoint: str, version: str = "v1", timeout: float = CALL_TIMEOUT) -> None:
        if version not in SERVICES:
            raise ValueError(f"the kubelet speaks {sorted(SERVICES)}, not {version!r}")
        self.service, self.pb = SERVICES[version]
        self.timeout = timeout
        self.channel = grpc.insecure_channel("unix:" + endpoint)
        self.violations: list[str] = []

    def close(self) -> None:
        self.channel.close()

    def _call(self, method: str, request: Any, response: Any) -> Any:
        call = self.channel.unary_unary(
            f"/{self.service}/{method}",
            request_serializer=type(request).SerializeToString,
            response_deserializer=response.FromString,
        )
        return call(request, timeout=self.timeout)

    def _claims(self, claims: list[Claim]) -> list[Any]:
        for c in claims:
            if not (c.namespace and c.name and c.uid):
                raise ValueError(f"the kubelet sends every field of a claim: {c}")
        return [self.pb.Claim(namespace=c.namespace, uid=c.uid, name=c.name) for c in claims]

    def _check_entries(self, method: str, claims: list[Claim], answered: Any) -> None:
        sent = {c.uid for c in claims}
        unknown = set(answered) - sent
        skipped = sent - set(answered)
        if unknown:
            self.violations.append(f"{method} returned result for unknown claim UID {sorted(unknown)}")
        if skipped:
            self.violations.append(f"{method} skipped {len(skipped)} ResourceClaims")

    def prepare(self, claims: list[Claim]) -> Outcome:
        request = self.pb.NodePrepareResourcesRequest(claims=self._claims(claims))
        try:
            response = self._call("NodePrepareResources", request, self.pb.NodePrepareResourcesResponse)
        except grpc.RpcError as exc:
            return Outcome(failed=f"{exc.code().name}: {exc.details()}")
        self._check_entries("NodePrepareResources", claims, response.claims)
        outcome = Outcome()
        for uid, entry in response.claims.items():
            if entry.error:
                outcome.errors[uid] = entry.error
                continue
            devices = []
            for d in entry.devices:
                if not d.pool_name or not d.device_name:
                    self.violations.append(f"claim {uid}: a device without pool_name or device_name")
                if any("/" in r for r in d.request_names):
                    self.violations.append(f"claim {uid}: request_names {list(d.request_names)} are not base names")
                devices.append(
                    PreparedDevice(tuple(d.request_names), d.pool_name, d.device_name, tuple(d.cdi_device_ids))
                )
            outcome.devices[uid] = tuple(devices)
        return outcome

    def unprepare(self, claims: list[Claim]) -> Outcome:
        request = self.pb.NodeUnprepareResourcesRequest(claims=self._claims(claims))
        try:
            response = self._call("NodeUnprepareResources", request, self.pb.NodeUnprepareResourcesResponse)
        except grpc.RpcError as exc:
            return Outcome(failed=f"{exc.code().name}: {exc.details()}")
        self._check_entries("NodeUnprepareResources", claims, response.claims)
        outcome = Outcome()
        for uid, entry in response.claims.items():
            if entry.error:
                outcome.errors[uid] = entry.error
            else:
                outcome.devices[uid] = ()
        return outcome


# kubernetes/kubelet pkg/apis/dra-health/v1/types.go and v1alpha1/types.go, newest first: pickHealthService
# takes the first of these that the plugin advertised.
KUBELET_HEALTH_SERVICES = {
    "v1.DRAResourceHealth": dra_health_v1_pb2,
    "v1alpha1.DRAResourceHealth": dra_health_v1alpha1_pb2,
}
HEALTH_REOPEN_PERIOD = 5.0  # dra_plugin_manager.go: wait.UntilWithContext(..., 5*time.Second)
MAX_HEALTH_MESSAGE = 1024  # api.proto DeviceHealth.message
HEALTH_NAMES = {0: "Unknown", 1: "Healthy", 2: "Unhealthy"}  # HealthStatus, as the pod status words them
HEALTH_TIMEOUT = 30.0  # healthinfo.go healthTimeout (DefaultHealthTimeout)


def pick_health_service(advertised: Sequence[str]) -> str:
    """pickHealthService: the newest version both the plugin and the kubelet support, or "" if none."""
    return next((name for name in KUBELET_HEALTH_SERVICES if name in advertised), "")


@dataclass(frozen=True)
class HeldHealth:
    """One device's entry in the kubelet's health cache."""

    health: str  # Healthy, Unhealthy or Unknown
    message: str
    last_updated_time: int  # as the driver sent it (the kubelet stamps its own receive time)


class FakeHealthWatcher:
    """The kubelet's NodeWatchResources client for one driver endpoint.

    `advertised` is GetInfo's supported_versions; `known` returns the (pool, device) pairs the driver
    has published (a device reported that is not among them is a violation). `held()` is each
    device's health as the kubelet reads it now; `responses` every response received, in order.
    """

    def __init__(
        self,
        endpoint: str,
        advertised: Sequence[str],
        known: Callable[[], set[tuple[str, str]]],
        *,
        kubelet_136: bool = False,
        reopen_period: float = HEALTH_REOPEN_PERIOD,
        health_timeout: float = HEALTH_TIMEOUT,
    ) -> None:
        self.service = "v1alpha1.DRAResourceHealth" if kubelet_136 else pick_health_service(advertised)
        self.terminal_unimplemented = not kubelet_136
        self.known = known
        self.reopen_period = reopen_period
        self.health_timeout = health_timeout
        self.channel = grpc.insecure_channel("unix:" + endpoint)
        self.violations: list[str] = []
        self.errors: list[str] = []  # stream ends other than EOF, as the kubelet logs them
        self.responses: list[dict[tuple[str, str], HeldHealth]] = []
        self.opened = 0
        self._held: dict[tuple[str, str], tuple[HeldHealth, float]] = {}  # with the receive time
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._call: Any = None
        self._thread: threading.Thread | None = None

    def start(self) -> FakeHealthWatcher:
        if self.service:  # not advertised: a 1.37 kubelet never opens the stream
            self._thread = threading.Thread(target=self._loop, name="fake-dra-health", daemon=True)
            self._thread.start()
        return self

    def stop(self) -> None:
        """The driver deregistered: the stream is cancelled and not opened again."""
        self._stop.set()
        with self._lock:
            call = self._call
        if call is not None:
            call.cancel()
        if self._thread is not None:
            self._thread.join(timeout=15)
        self.channel.close()

    def _loop(self) -> None:
        while not self._stop.is_set():
            if not self._watch():
                return
            self._stop.wait(self.reopen_period)

    def _watch(self) -> bool:
        """One stream, to its end; False when the kubelet gives up on the service."""
        pb = KUBELET_HEALTH_SERVICES[self.service]
        method = self.channel.unary_stream(
            f"/{self.service}/NodeWatchResources",
            request_serializer=pb.NodeWatchResourcesRequest.SerializeToString,
            response_deserializer=pb.NodeWatchResourcesResponse.FromString,
        )
        call = method(pb.NodeWatchResourcesRequest())
        with self._lock:
            self._call = call
            self.opened += 1
        reported: set[tuple[str, str]] = set()
        try:
            for response in call:
                reported = self._update(response, reported)
        except grpc.RpcError as exc:
            code = exc.code() if isinstance(exc, grpc.Call) else None
            if code is not grpc.StatusCode.CANCELLED or not self._stop.is_set():
                with self._lock:
                    self.errors.append(
                        f"{code.name if code else exc}: {exc.details() if isinstance(exc, grpc.Call) else ''}"
                    )
            if code is grpc.StatusCode.UNIMPLEMENTED and self.terminal_unimplemented:
                return False
        finally:
            with self._lock:
                self._call = None
                self._held.clear()  # manager.go: the driver's health cache goes with its stream
        return True

    def _update(self, response: Any, before: set[tuple[str, str]]) -> set[tuple[str, str]]:
        """updateHealthInfo, with the contract's checks; the devices this response reported."""
        problems = []
        entries: dict[tuple[str, str], HeldHealth] = {}
        known = self.known()
        for d in response.devices:
            key = (d.device.pool_name, d.device.device_name)
            if not d.HasField("device") or not all(key):
                problems.append(f"a device without pool_name or device_name: {key}")
                continue
            if key in entries:
                problems.append(f"{key} reported twice in one response")
            if key not in known:
                problems.append(f"{key} is no device the driver published")
            if d.health not in HEALTH_NAMES:
                problems.append(f"{key}: health {d.health} is no HealthStatus")
            if len(d.message) > MAX_HEALTH_MESSAGE:
                problems.append(f"{key}: message of {len(d.message)} characters (at most {MAX_HEALTH_MESSAGE})")
            if d.health_check_timeout_seconds < 0:
                problems.append(f"{key}: negative health_check_timeout_seconds {d.health_check_timeout_seconds}")
            entries[key] = HeldHealth(HEALTH_NAMES.get(d.health, "Unknown"), d.message, d.last_updated_time)
        dropped = {key for key in before - entries.keys() if key in known}
        if dropped:
            problems.append(f"not a complete list: {sorted(dropped)} reported before and left out")
        now = time.monotonic()
        with self._lock:
            self.violations.extend(problems)
            self.responses.append(dict(entries))
            for key, (entry, at) in list(self._held.items()):  # updateHealthInfo: unreported and timed out
                if key not in entries and entry.health != "Unknown" and now - at > self.health_timeout:
                    self._held[key] = (HeldHealth("Unknown", entry.message, entry.last_updated_time), now)
            self._held.update({key: (entry, now) for key, entry in entries.items()})
        return set(entries)

    def watching(self) -> bool:
        """Whether the kubelet still opens the stream (its wait.Until loop runs)."""
        return self._thread is not None and self._thread.is_alive()

    def held(self) -> dict[tuple[str, str], HeldHealth]:
        """getHealthInfo for each device in the cache: Unknown once its entry is older than the timeout."""
        now = time.monotonic()
        with self._lock:
            return {
                key: entry if now - at <= self.health_timeout else HeldHealth("Unknown", "", entry.last_updated_time)
                for key, (entry, at) in self._held.items()
            }

    def wait_held(self, key: tuple[str, str], health: str, timeout: float) -> HeldHealth:
        """Wait until the cache holds `key` with `health`; its entry."""

        def found() -> HeldHealth | None:
            entry = self.held().get(key)
            return entry if entry is not None and entry.health == health else None

        entry: HeldHealth = wait_until(
            found, timeout, f"{key} {health} at the kubelet; held={self.held()} violations={self.violations}"
        )
        return entry
