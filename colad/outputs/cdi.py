"""CDI specs: what a container runtime needs to resolve `<resource>=<device ID>` on its own.

encode_spec() turns one resource's advertised device set into a Container Device Interface spec's bytes
(kind = the resource name, one device per advertised ID, replicas included) at the lowest
cdiVersion that carries it; it is pure. SpecWriter is the thin shell: an atomic
write + rename into the spec directory (default /var/run/cdi), and a removal on stop.
SpecReader is the plugin's side: which devices the spec file really lists, so Allocate names
only those (a spec discovery could not write names nothing a runtime could resolve).
"""

from __future__ import annotations

import bisect
import functools
import json
import operator
import os
import stat
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from colad.core.device_rules import cdi_device_name_problem
from colad.core.devices import Device, DeviceSet, SkippedName, replicas_of
from colad.core.namemap import cdi_kind, cdi_kind_problem, cdi_marker_name, cdi_spec_file
from colad.runtime import files

TYPE_CHECKING = False  # typing is not loaded at run time: docs/DEVELOPING.md, "Import cost"
if TYPE_CHECKING:
    from typing import Any

DEFAULT_SPEC_DIR = "/var/run/cdi"
# The versions this module writes, oldest first (container-device-interface specs-go/version.go).
# podman 4.3.1 (Debian bookworm) reads 0.3.0-0.5.0 and silently ignores 0.6.0 and later
# (checked, ../shared/PLATFORM-NOTES.md section 8); CDI >= 0.6 runtimes refuse a spec whose
# version is lower than the features it uses need. So the lowest sufficient version is the
# only one every runtime takes.
VERSIONS = ("0.3.0", "0.4.0", "0.5.0", "0.6.0")


def marker(device_id: str) -> str:
    """COLA_DEVICE_<escaped id>=<id>: a variable every CDI device sets, so no device has empty containerEdits
    (podman 4.3 then rejects the whole spec) and a container can see which CDI devices it got. COLA_DEVICES
    itself cannot be a CDI edit: the runtime applies devices one after another, so the last one's value would win."""
    return f"{cdi_marker_name(device_id)}={device_id}"


def edits(device: Device) -> dict[str, Any]:
    """A device's containerEdits: what the classic Allocate answer gives, minus colad's own lists. A malformed
    device (problem set) carries nothing but the marker, as it contributes nothing to a container in Allocate."""
    env = [marker(device.device_id)] + [f"{k}={v}" for k, v in device.envs]
    result: dict[str, Any] = {"env": env}
    if device.device_nodes:
        nodes = []
        for n in device.device_nodes:
            node: dict[str, Any] = {"path": n.container_path, "permissions": n.permissions}
            if n.host_path != n.container_path:
                node["hostPath"] = n.host_path  # the field that needs 0.5.0
            nodes.append(node)
        result["deviceNodes"] = nodes
    if device.mounts:
        # No "type" (it needs 0.4.0): runc and crun take the "rbind" option as a bind mount, as
        # NVIDIA's generated specs rely on. No nosuid/nodev: a mounted directory may hold devices.
        result["mounts"] = [
            {
                "hostPath": m.host_path,
                "containerPath": m.container_path,
                "options": ["rbind", "ro" if m.read_only else "rw"],
            }
            for m in device.mounts
        ]
    return result


@functools.lru_cache(maxsize=1 << 17)
def _entry(device: Device) -> dict[str, Any] | SkippedName:
    """One device's spec entry, kept: discovery builds the whole spec on every change, and most
    devices did not change (the escaping alone costs 3 us a device). Read-only to callers."""
    problem = cdi_device_name_problem(device.device_id)
    if problem is not None:
        return SkippedName(device.device_id, problem)
    return {"name": device.device_id, "containerEdits": edits(device)}


_ENCODED = "_cdi_encoded"  # a Device's spec entry as the spec's bytes carry it, kept on it
# The version index an entry needs by its name alone: a name that starts with a digit needs 0.5.0.
_DIGIT_LEVEL = VERSIONS.index("0.5.0")


def _encoded(device: Device) -> bytes | tuple[bytes, int] | SkippedName:
    """`_entry(device)` as the spec's bytes carry it: the bytes alone when the entry needs no version
    beyond its name's (every marker-only device), else with the index in VERSIONS it needs. Bytes, not
    a (str, level) tuple: 112 bytes a device kept, not 192; the spec is joined without a copy."""
    # getattr, never __dict__: reading a 3.11 instance's __dict__ makes it a real dict (64 bytes a device).
    cached: bytes | tuple[bytes, int] | SkippedName | None = getattr(device, _ENCODED, None)
    if cached is None:
        device_id = device.device_id
        if device.envs or device.device_nodes or device.mounts or cdi_device_name_problem(device_id) is not None:
            entry = _entry(device)
            if isinstance(entry, SkippedName):
                cached = entry
            else:
                data = _dumps(entry).encode()
                level = VERSIONS.index(required_version({"devices": [entry]}))
                cached = data if level == (_DIGIT_LEVEL if device_id[:1].isdigit() else 0) else (data, level)
        else:  # the marker alone (most devices): _dumps(_entry(device)) without building the dict
            cached = (
                '{"containerEdits":{"env":[' + _string(marker(device_id)) + ']},"name":' + _string(device_id) + "}"
            ).encode()
        object.__setattr__(device, _ENCODED, cached)
    return cached


_string: Callable[[str], str] = json.encoder.encode_basestring  # json.dumps(s, ensure_ascii=False) of a str


def _dumps(value: object) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def same_entry(a: Device, b: Device) -> bool:
    """Whether `a` and `b` give one spec entry (health and reason are no part of it)."""
    return _encoded(a) == _encoded(b)


def encode_spec(resource_name: str, physical: DeviceSet, replicas: int = 1) -> bytes | None:
    """The CDI spec file of `resource_name` for replicate(physical, replicas): canonical JSON, one line.

    Every advertised ID is a device, Healthy or not: a container that already holds a device
    that turned Unhealthy must still resolve it when the kubelet restarts it. None when the
    resource name is not a CDI kind, or no ID is a CDI name (a spec without devices is
    invalid from CDI 0.6 on): the caller removes the file then. Joined from the entries kept
    on each device: only a device not seen before is encoded (the whole spec's json.dumps
    would cost 36 ms at 10,000 devices, on every change)."""
    kind = _kind(resource_name)
    if kind is None:
        return None
    if replicas <= 1:
        devices = physical.devices
        parts = [getattr(d, _ENCODED, None) or _encoded(d) for d in devices]
    else:
        by_id = {r.device_id: r for d in physical for r in replicas_of(d, replicas)}
        devices = tuple(by_id[k] for k in sorted(by_id))
        parts = [_encoded(d) for d in devices]
    level, name = kind
    try:  # most sets: every entry is bytes alone, its version that of its name
        joined = b",".join(parts)  # type: ignore[arg-type]
        # A set is sorted by ID: the names that start with a digit are one run, found in O(log n).
        at = bisect.bisect_left(devices, "0", key=operator.attrgetter("device_id"))
        digit = at < len(devices) and devices[at].device_id[:1].isdigit()
    except TypeError:  # a skipped name, or an entry that needs a version of its own
        kept = [(d, p) for d, p in zip(devices, parts, strict=True) if not isinstance(p, SkippedName)]
        devices = tuple(d for d, _ in kept)
        level = max([level] + [p[1] for _, p in kept if isinstance(p, tuple)])
        joined = b",".join([p[0] if isinstance(p, tuple) else p for _, p in kept])
        digit = any(d.device_id[:1].isdigit() for d in devices)
    if not devices:
        return None
    version = _VERSION_BYTES[max(level, _DIGIT_LEVEL if digit else 0)]
    return b'{"cdiVersion":' + version + b',"devices":[' + joined + b'],"kind":' + name + b"}\n"


_VERSION_BYTES = tuple(json.dumps(v).encode() for v in VERSIONS)


@functools.lru_cache(maxsize=64)
def _kind(resource_name: str) -> tuple[int, bytes] | None:
    """encode_spec()'s parts of a resource name, made once: the version index it needs and its JSON (None: no
    CDI kind). cdi_kind_problem(), required_version() and two json.dumps were a quarter of encode_spec() a change."""
    if cdi_kind_problem(resource_name) is not None:
        return None
    kind = cdi_kind(resource_name)
    return VERSIONS.index(required_version({"kind": kind})), _dumps(kind).encode()


def required_version(document: dict[str, Any]) -> str:
    """The lowest cdiVersion whose features `document` uses (specs-go/version.go requiredVersion)."""
    kind = str(document.get("kind", ""))
    if "." in kind.partition("/")[2] or document.get("annotations"):
        return "0.6.0"
    devices = document.get("devices", [])
    all_edits = [document.get("containerEdits", {})] + [d.get("containerEdits", {}) for d in devices]
    if any(d.get("annotations") for d in devices):
        return "0.6.0"
    digit_name = any(str(d.get("name", ""))[:1].isdigit() for d in devices)
    if digit_name or any(n.get("hostPath") for e in all_edits for n in e.get("deviceNodes", [])):
        return "0.5.0"
    if any(m.get("type") for e in all_edits for m in e.get("mounts", [])):
        return "0.4.0"
    return "0.3.0"


def encode_claim_spec(kind: str, entries: Sequence[tuple[str, Device, Mapping[str, str]]]) -> bytes:
    """A DRA claim's CDI spec: one device per (CDI name, device, envs) entry, at the lowest version it needs.

    Each device carries its own device nodes and mounts (edits()) and, besides its marker, `envs`: the
    environment of the container's whole request as Allocate merges it (COLA_DEVICES included), the
    same on every device of one request, so the order in which a runtime applies them does not matter.
    """
    devices = []
    for name, device, envs in entries:
        container_edits = edits(device)
        container_edits["env"] = [marker(device.device_id)] + [f"{k}={v}" for k, v in envs.items()]
        devices.append({"name": name, "containerEdits": container_edits})
    document: dict[str, Any] = {"kind": kind, "devices": devices}
    document["cdiVersion"] = required_version(document)
    return (_dumps(document) + "\n").encode()


class SpecWriter:
    """Writes and removes colad's spec files in one directory, each only when its bytes change (on disk: a file
    edited or removed behind colad's back is written again). The temporary file ends in .tmp, which runtimes
    skip (they read *.json and *.yaml), and is renamed over the spec: a runtime reads the old spec or the new."""

    def __init__(self, spec_dir: str = DEFAULT_SPEC_DIR) -> None:
        self.spec_dir = spec_dir

    def path(self, resource_name: str) -> str:
        return os.path.join(self.spec_dir, cdi_spec_file(resource_name))

    def write_bytes(self, resource_name: str, data: bytes | None) -> bool:
        """Write a spec's bytes (encode_spec()'s), or remove the file when None; True if the directory changed.
        Raises OSError."""
        if data is None:
            return self.remove(resource_name)
        path = self.path(resource_name)
        if holds(path, data):
            return False
        # Runtimes read specs as root; nothing in one is secret to root. No fsync (colad.runtime.files): the
        # directory is tmpfs by default and every spec is checked against its file again at start, before
        # the kubelet can hear of a device; fsync and mkstemp were most of a one-device change's CPU.
        files.replace(path, data, 0o644, 0o755)
        return True

    def remove(self, resource_name: str) -> bool:
        """Remove the resource's spec (graceful stop, no devices); True if a file was removed."""
        try:
            os.unlink(self.path(resource_name))
        except FileNotFoundError:
            return False
        return True


def holds(path: str, data: bytes) -> bool:
    """Does the regular file `path` hold exactly `data`? The file is the record of what was written,
    not a copy of its bytes in memory (650 KiB at 10,000 devices): a change almost always moves
    the size (one stat); an equal size is read back (0.1 ms on tmpfs)."""
    try:
        if os.stat(path).st_size != len(data):
            return False
        with open(path, "rb", buffering=0, opener=_nonblocking) as f:  # never a FIFO's hang
            return stat.S_ISREG(os.fstat(f.fileno()).st_mode) and f.read(len(data) + 1) == data
    except (OSError, ValueError):
        return False  # a doubt is a rewrite


# colad writes about 120 bytes a device; a file far larger than any spec of its own is not read.
MAX_SPEC_BYTES = 64 << 20


@dataclass(frozen=True)
class Listed:
    """What the spec file of one resource lists: the device names, or why it lists none. `reason` is a short
    label (metrics, logs): "" when the file is the resource's spec, else missing, unreadable, invalid or
    other_kind; `problem` says it in words."""

    names: frozenset[str] = frozenset()
    reason: str = ""
    problem: str = ""


def parse_listed(data: bytes, kind: str) -> Listed:
    """The device names of a spec file's bytes, if it is a CDI spec of `kind`. Pure; never raises."""
    try:
        document = json.loads(data)
    except (ValueError, RecursionError) as exc:  # UnicodeDecodeError is a ValueError
        return Listed(reason="invalid", problem=f"not valid JSON: {str(exc)[:120]}")
    if not isinstance(document, dict):
        return Listed(reason="invalid", problem="not a JSON object")
    if document.get("kind") != kind:
        return Listed(reason="other_kind", problem=f"its kind is {str(document.get('kind'))[:80]!r}, not {kind!r}")
    entries = document.get("devices")
    if not isinstance(entries, list):
        return Listed(reason="invalid", problem="it has no device list")
    names = (e.get("name") for e in entries if isinstance(e, dict))
    return Listed(frozenset(n for n in names if isinstance(n, str)))


class SpecReader:
    """Reads the spec file of a resource in a spec directory, again only when the file changed. A read is cached
    under the file's (st_dev, st_ino, st_size, st_mtime_ns): SpecWriter renames every new spec into place (a new
    inode), so a cache hit costs one stat. Called from gRPC threads: the cache is one dict replaced entry-whole."""

    def __init__(self) -> None:
        self._cache: dict[str, tuple[tuple[int, int, int, int], Listed]] = {}
        self._paths: dict[tuple[str, str], str] = {}  # (spec dir, resource) -> the file's path: joined once
        self.reads = 0  # files read and parsed (the cache misses)

    def read(self, spec_dir: str, resource_name: str) -> Listed:
        if not spec_dir:
            return Listed(reason="missing", problem="no cdi_spec_dir is configured")
        path = self._paths.get((spec_dir, resource_name))
        if path is None:
            path = self._paths[(spec_dir, resource_name)] = os.path.join(spec_dir, cdi_spec_file(resource_name))
        try:
            st = os.stat(path)
        except FileNotFoundError:
            return Listed(reason="missing", problem=f"{path} does not exist")
        except (OSError, ValueError) as exc:
            return Listed(reason="unreadable", problem=f"{path}: {exc}")
        cached = self._cache.get(path)
        if cached is not None and cached[0] == _key(st):
            return cached[1]
        if not stat.S_ISREG(st.st_mode) or st.st_size > MAX_SPEC_BYTES:
            return Listed(reason="invalid", problem=f"{path} is not a file of at most {MAX_SPEC_BYTES} bytes")
        try:
            with open(path, "rb", opener=_nonblocking) as f:  # the key of what was read, not of the stat before
                st = os.fstat(f.fileno())
                data = f.read(MAX_SPEC_BYTES + 1) if stat.S_ISREG(st.st_mode) else b""
                listed = parse_listed(data, cdi_kind(resource_name))
        except OSError as exc:
            return Listed(reason="unreadable", problem=f"{path}: {exc.strerror or exc}")
        self.reads += 1
        self._cache[path] = (_key(st), listed)
        return listed


def _nonblocking(path: str, flags: int) -> int:
    # A FIFO renamed into place between the stat and the open must not hang an Allocate.
    return os.open(path, flags | os.O_NONBLOCK | os.O_CLOEXEC)


def _key(st: os.stat_result) -> tuple[int, int, int, int]:
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)


class FallbackNotes:
    """Whether Allocate's CDI fallback changed reason since it was last noted (one log line, one
    count per change, not one per Allocate); thread-safe."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.reason = ""

    def changed(self, reason: str) -> bool:
        with self._lock:
            before, self.reason = self.reason, reason
        return before != reason
