"""Test oracles: plain, obviously right versions of what colad computes a faster way.

Each one is written from its contract, not from the production code, and is used only by
tests (and bench/) to check the production answer: the devices a listing of names makes,
the CDI spec of a set (cdi.encode_spec's bytes must be its encode()), the delta between two sets
(snapshots.moved_delta's, computed from diff()), the ListAndWatch message protobuf itself builds
from a set, and the labels NFD reads from a feature file.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from colad.api import deviceplugin_pb2 as pb
from colad.core.device_rules import cdi_device_name_problem
from colad.core.devices import Device, DeviceDiff, DeviceSet, SkippedName, diff, valid_ids
from colad.core.namemap import cdi_kind, cdi_kind_problem
from colad.outputs import cdi
from colad.queue.device_wire import set_digest
from colad.queue.messages import DeviceDelta, DeviceSnapshot
from colad.queue.snapshots import moved_delta

# --- the device directory ---------------------------------------------------------------------


@dataclass(frozen=True)
class ScanResult:
    """One listing of a device directory: the devices its names make, and the names skipped."""

    devices: DeviceSet
    skipped: tuple[SkippedName, ...] = ()


def scan_names(names: Iterable[str]) -> ScanResult:
    """The regular-file names found in a device directory, as devices (Healthy, bare) and skipped names."""
    ids, problems = valid_ids(names)
    skipped = tuple(SkippedName(name, problem) for name, problem in problems.items())
    return ScanResult(DeviceSet.of([Device(i) for i in ids]), skipped)


# --- CDI --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Spec:
    """One resource's CDI spec: the JSON document and the advertised IDs it could not carry."""

    kind: str
    document: dict[str, Any]
    skipped: tuple[SkippedName, ...] = ()

    @property
    def version(self) -> str:
        return str(self.document["cdiVersion"])

    def encode(self) -> bytes:
        """The file's bytes as colad writes them: canonical JSON (sorted keys, compact), one line."""
        return (json.dumps(self.document, sort_keys=True, separators=(",", ":"), ensure_ascii=False) + "\n").encode()


def spec_entry(device: Device) -> dict[str, Any] | SkippedName:
    """One device's entry in the spec, or why its ID cannot be a CDI device name."""
    problem = cdi_device_name_problem(device.device_id)
    if problem is not None:
        return SkippedName(device.device_id, problem)
    return {"name": device.device_id, "containerEdits": cdi.edits(device)}


def cdi_spec(resource_name: str, devices: DeviceSet) -> Spec | None:
    """The CDI spec of `resource_name` for its advertised `devices`, or None when there is none.

    Every advertised ID is a device, Healthy or not. None when the resource name is not a
    CDI kind, or no ID is a CDI name (a spec without devices is invalid from CDI 0.6 on).
    """
    if cdi_kind_problem(resource_name) is not None:
        return None
    found = [spec_entry(device) for device in devices]
    entries = [e for e in found if not isinstance(e, SkippedName)]
    if not entries:
        return None
    document: dict[str, Any] = {"cdiVersion": "", "kind": cdi_kind(resource_name), "devices": entries}
    document["cdiVersion"] = cdi.required_version(document)
    return Spec(document["kind"], document, tuple(e for e in found if isinstance(e, SkippedName)))


def spec_bytes(spec: Spec | None) -> bytes | None:
    """What cdi.SpecWriter.write_bytes takes for `spec` (None: remove the file)."""
    return None if spec is None else spec.encode()


# --- the queue's deltas -----------------------------------------------------------------------


def snapshot_delta(
    old: DeviceSet, old_digest: int | None, new: DeviceSnapshot, base: int, change: DeviceDiff | None = None
) -> tuple[DeviceDelta | None, int]:
    """The delta from `old` (sent at seq `base`) to `new`, and the digest of `new`, from diff(old, new).

    None when the delta would carry as much as a full snapshot.
    """
    change = diff(old, new.devices) if change is None else change
    came = [new.devices.by_id[i] for i in sorted((*change.added, *change.changed))]
    gone = [old.by_id[i] for i in (*change.removed, *change.changed)]
    return moved_delta(set_digest(old) if old_digest is None else old_digest, new, base, came, gone, change.removed)


# --- the device plugin API -------------------------------------------------------------------


def device_message(device: Device) -> pb.Device:
    """A device as the v1beta1 API carries it: its ID, health and NUMA nodes (no topology when none)."""
    if not device.numa_nodes:
        return pb.Device(ID=device.device_id, health=device.health)
    topology = pb.TopologyInfo(nodes=[pb.NUMANode(ID=n) for n in device.numa_nodes])
    return pb.Device(ID=device.device_id, health=device.health, topology=topology)


def list_and_watch_bytes(devices: Iterable[Device]) -> bytes:
    """protobuf's own serialization of the ListAndWatchResponse of `devices`, in order."""
    return pb.ListAndWatchResponse(devices=[device_message(d) for d in devices]).SerializeToString()


# --- NFD --------------------------------------------------------------------------------------


def nfd_labels(data: bytes) -> dict[str, str]:
    """The labels NFD's local source reads from a feature file (its parseFeatureFile, without expiry)."""
    labels = {}
    for raw in data.decode("utf-8", "replace").split("\n"):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        key, sep, value = line.partition("=")
        labels[key] = value if sep else "true"
    return labels
