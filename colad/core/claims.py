"""A ResourceClaim as this DRA driver prepares it: its devices on this node, its CDI names, its checkpoint entry.

claim_devices() reads a ResourceClaim object (resource.k8s.io/v1, as the API server returns it) and says
which of this node's devices it was allocated, through the same names slices.py publishes; the CDI
names of a claim's spec; the checkpoint of prepared claims, encoded and decoded. colad/dra/service.py
is the shell that reads the claim, writes the spec and the checkpoint. Pure: no I/O.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from colad.core.device_rules import cdi_name
from colad.core.devices import DeviceSet
from colad.core.errors import ColadError
from colad.core.slices import published_names

TYPE_CHECKING = False  # typing is not loaded at run time: docs/DEVELOPING.md, "Import cost"
if TYPE_CHECKING:
    from typing import Any, Final

# The CDI kind of claim specs: vendor "k8s.<driver>" as dra-example-driver names it (cdi.go), class
# "claim" (no '.': a class with one needs CDI 0.6.0, which podman 4.3 ignores).
CDI_VENDOR_PREFIX: Final = "k8s."
CDI_CLAIM_CLASS: Final = "claim"
CHECKPOINT_FILE: Final = "dra-claims.json"
CHECKPOINT_KIND: Final = "colad-dra-claims"
CHECKPOINT_VERSION: Final = 1
# A Kubernetes UID is a UUID; anything else in a request is refused before it names a file.
_UID = re.compile(r"[A-Za-z0-9][A-Za-z0-9-]{0,127}\Z")


class ClaimError(ColadError):
    """Why one claim cannot be prepared: the text goes to the kubelet as the claim's error."""


@dataclass(frozen=True)
class ClaimRef:
    """A claim as the kubelet names it in NodePrepareResources and NodeUnprepareResources."""

    namespace: str
    name: str
    uid: str


@dataclass(frozen=True)
class ClaimDevice:
    """One device of this node a claim was allocated: where it is in the device model and in the slices."""

    resource: str
    device_id: str
    pool: str
    device: str  # the DRA device name (slices.published_names)
    request_names: tuple[str, ...]  # base request names (a "<request>/<subrequest>" cut to "<request>")


@dataclass(frozen=True)
class PreparedDevice:
    """A device as NodePrepareResources answers it, and as the checkpoint keeps it."""

    resource: str
    device_id: str
    pool: str
    device: str
    request_names: tuple[str, ...]
    cdi_device_ids: tuple[str, ...]


@dataclass(frozen=True)
class PreparedClaim:
    ref: ClaimRef
    devices: tuple[PreparedDevice, ...]


def uid_problem(uid: str) -> str | None:
    if not _UID.match(uid):
        return f"claim uid {uid[:80]!r} is not a Kubernetes UID"
    return None


def claim_devices(
    claim: Mapping[str, Any],
    ref: ClaimRef,
    driver: str,
    pools: Mapping[str, str],
    devices: Mapping[str, DeviceSet],
) -> tuple[ClaimDevice, ...]:
    """This node's devices in `claim`'s allocation for `driver`, in result order; raises ClaimError.

    `pools` maps each resource to its pool (slices.pool_names), `devices` each resource to its current
    set. Every result of `driver` must name a device this node publishes now; results of other
    drivers are theirs. A claim with no result of `driver` is an error: the kubelet asks only drivers
    named in the allocation, so it was replaced or is not what the kubelet thinks.
    """
    metadata = claim.get("metadata") or {}
    uid = str(metadata.get("uid") or "")
    if uid != ref.uid:
        raise ClaimError(f"ResourceClaim {ref.namespace}/{ref.name} has uid {uid[:80]!r}, not {ref.uid!r}: replaced")
    allocation = (claim.get("status") or {}).get("allocation")
    if not isinstance(allocation, dict):
        raise ClaimError(f"ResourceClaim {ref.namespace}/{ref.name} is not allocated")
    results = (allocation.get("devices") or {}).get("results") or []
    if not isinstance(results, list):
        raise ClaimError(f"ResourceClaim {ref.namespace}/{ref.name}: status.allocation.devices.results is not a list")
    resource_of_pool = {p: r for r, p in pools.items()}
    by_name = {r: {name: i for i, name in published_names(s).items()} for r, s in devices.items()}
    found: dict[tuple[str, str], ClaimDevice] = {}
    others: set[str] = set()
    for result in results:
        if not isinstance(result, dict):
            raise ClaimError(f"ResourceClaim {ref.namespace}/{ref.name}: an allocation result is not an object")
        if result.get("driver") != driver:
            others.add(str(result.get("driver"))[:80])
            continue
        pool, name = str(result.get("pool") or ""), str(result.get("device") or "")
        resource = resource_of_pool.get(pool)
        if resource is None:
            raise ClaimError(f"device {pool[:80]}/{name[:80]} is not in a pool of this node")
        device_id = by_name.get(resource, {}).get(name)
        if device_id is None:
            raise ClaimError(f"device {pool}/{name[:80]} is not published by this node now")
        request = str(result.get("request") or "").split("/", 1)[0]
        held = found.get((pool, name))
        names = (held.request_names if held else ()) + ((request,) if request else ())
        found[(pool, name)] = ClaimDevice(resource, device_id, pool, name, tuple(dict.fromkeys(names)))
    if not found:
        if others:
            raise ClaimError(f"no device of driver {driver} allocated; only of {', '.join(sorted(others))}")
        raise ClaimError(f"no device of driver {driver} allocated")
    return tuple(found.values())


# --- CDI names of a claim's spec ------------------------------------------------------------------


def claim_cdi_kind(driver: str) -> str:
    """k8s.<driver>/claim: one kind for every claim spec of the driver."""
    return f"{CDI_VENDOR_PREFIX}{driver}/{CDI_CLAIM_CLASS}"


def claim_spec_file(driver: str, uid: str) -> str:
    """The claim's spec file: <vendor>-<class>_<uid>.json (CDI GenerateTransientSpecName), unique per claim."""
    return f"{CDI_VENDOR_PREFIX}{driver}-{CDI_CLAIM_CLASS}_{uid}.json"


def claim_cdi_device(uid: str, device: str) -> str:
    """A claim device's CDI name: <uid>-<DRA device name>, never reused by another claim (draplugin.go)."""
    return f"{uid}-{device}"


def claim_cdi_id(driver: str, uid: str, device: str) -> str:
    """The fully qualified CDI device ID the kubelet hands the runtime."""
    return cdi_name(claim_cdi_kind(driver), claim_cdi_device(uid, device))


# --- the checkpoint ---------------------------------------------------------------------------------


def encode_checkpoint(driver: str, claims: Iterable[PreparedClaim]) -> bytes:
    """The prepared claims as the checkpoint file holds them: canonical JSON, claims by uid."""
    document = {
        "kind": CHECKPOINT_KIND,
        "version": CHECKPOINT_VERSION,
        "driver": driver,
        "claims": [
            {
                "uid": c.ref.uid,
                "namespace": c.ref.namespace,
                "name": c.ref.name,
                "devices": [
                    {
                        "resource": d.resource,
                        "deviceId": d.device_id,
                        "pool": d.pool,
                        "device": d.device,
                        "requestNames": list(d.request_names),
                        "cdiDeviceIds": list(d.cdi_device_ids),
                    }
                    for d in c.devices
                ],
            }
            for c in sorted(claims, key=lambda c: c.ref.uid)
        ],
    }
    return (json.dumps(document, sort_keys=True, separators=(",", ":"), ensure_ascii=False) + "\n").encode()


class CheckpointError(ColadError):
    """The checkpoint file is not one this version wrote, or not for this driver."""


def _strings(value: object, what: str) -> tuple[str, ...]:
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise CheckpointError(f"{what} is not a list of strings")
    return tuple(value)


def _string(entry: Mapping[str, Any], key: str) -> str:
    value = entry.get(key)
    if not isinstance(value, str):
        raise CheckpointError(f"{key} is not a string")
    return value


def decode_checkpoint(data: bytes, driver: str) -> dict[str, PreparedClaim]:
    """The prepared claims by uid; raises CheckpointError naming what is wrong."""
    try:
        document = json.loads(data)
    except (ValueError, RecursionError) as exc:
        raise CheckpointError(f"not JSON: {str(exc)[:120]}") from None
    if not isinstance(document, dict) or document.get("kind") != CHECKPOINT_KIND:
        raise CheckpointError(f"not a {CHECKPOINT_KIND} document")
    if document.get("version") != CHECKPOINT_VERSION:
        raise CheckpointError(f"version {str(document.get('version'))[:20]}, not {CHECKPOINT_VERSION}")
    if document.get("driver") != driver:
        raise CheckpointError(f"written for driver {str(document.get('driver'))[:80]!r}, not {driver!r}")
    entries = document.get("claims")
    if not isinstance(entries, list):
        raise CheckpointError("claims is not a list")
    claims: dict[str, PreparedClaim] = {}
    for entry in entries:
        if not isinstance(entry, dict) or not isinstance(entry.get("devices"), list):
            raise CheckpointError("a claim is not an object with devices")
        ref = ClaimRef(_string(entry, "namespace"), _string(entry, "name"), _string(entry, "uid"))
        problem = uid_problem(ref.uid)
        if problem is not None:
            raise CheckpointError(problem)
        prepared = []
        for d in entry["devices"]:
            if not isinstance(d, dict):
                raise CheckpointError("a device is not an object")
            prepared.append(
                PreparedDevice(
                    _string(d, "resource"),
                    _string(d, "deviceId"),
                    _string(d, "pool"),
                    _string(d, "device"),
                    _strings(d.get("requestNames"), "requestNames"),
                    _strings(d.get("cdiDeviceIds"), "cdiDeviceIds"),
                )
            )
        claims[ref.uid] = PreparedClaim(ref, tuple(prepared))
    return claims
