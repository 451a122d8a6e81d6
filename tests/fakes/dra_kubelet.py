"""A strict DRA client, calling a driver's DRAPlugin service as the kubelet does.

From kubernetes/kubernetes pkg/kubelet/cm/dra (manager.go, plugin/dra_plugin.go) and kubernetes/kubelet
pkg/apis/dra/v1 and v1beta1: insecure gRPC on unix:<endpoint>, each call under a 45 s deadline, claims
sent as {namespace, uid, name}. An answer must hold exactly one entry per claim uid ("skipped" or
"unknown claim UID" otherwise); a claim's `error` is its failure and its devices are then ignored; a
prepared device needs pool_name and device_name, and request_names are base names (no '/').
Every breach of the contract is recorded in `violations`, and the call's result says what the kubelet saw.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import grpc

from colad.api import dra_v1_pb2, dra_v1beta1_pb2

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
