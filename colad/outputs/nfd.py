"""Node Feature Discovery feature file: node labels for colad's resources without API credentials.

render_features() is pure: per resource, `<name>.present`, `.devices` and `.healthy` (physical devices,
replicas folded), in NFD's local-source format (`name=value` lines, `# +expiry-time=` directive).
FeatureFileWriter is the thin shell: write a hidden temporary (NFD skips dotfiles) and rename it
over features.d/colad, only when the bytes change. NFD turns an unprefixed name into
feature.node.kubernetes.io/<name>.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from dataclasses import dataclass

from colad.core.devices import DeviceSet, base_id
from colad.core.namemap import NFD_LABEL_SUFFIXES, nfd_label_base
from colad.core.names import is_dns1123_subdomain, is_qualified_name
from colad.runtime import files

DEFAULT_PATH = "/etc/kubernetes/node-feature-discovery/features.d/colad"
MAX_FEATURE_FILE_BYTES = 65536  # NFD source/local/local.go MaxFeatureFileSize: a larger file is skipped whole


@dataclass(frozen=True)
class Counts:
    devices: int  # physical devices (a device advertised as N replicas counts once)
    healthy: int

    @staticmethod
    def of(devices: DeviceSet) -> Counts:
        health: dict[str, bool] = {}
        for d in devices:
            physical = base_id(d.device_id)
            health[physical] = health.get(physical, True) and d.healthy
        return Counts(len(health), sum(health.values()))


def label_problem(resource_name: str, prefix: str = "") -> str | None:
    """Why a resource's labels would not be valid Kubernetes label keys, or None."""
    if prefix and not is_dns1123_subdomain(prefix):
        return f"NFD label prefix {prefix!r} is not a lower-case DNS subdomain"
    name = nfd_label_base(resource_name, prefix).rpartition("/")[2] + "." + max(NFD_LABEL_SUFFIXES, key=len)
    if not is_qualified_name(name):
        return f"NFD label name {name!r} is not 1-63 characters of A-Z a-z 0-9 - _ ."
    return None


def render_features(resources: Iterable[tuple[str, DeviceSet | Counts]], prefix: str = "", expires: str = "") -> bytes:
    """The feature file for `resources` (name, advertised set or its Counts); `expires` an RFC 3339 time or "".

    A resource whose labels would be invalid is left out (the caller refuses it at config load).
    With `expires`, NFD drops the labels after that time unless colad rewrites the file: a node
    whose colad died for good does not keep claiming devices.
    """
    lines = ["# Written by colad: presence and healthy counts of its resources. Do not edit."]
    if expires:
        lines.append(f"# +expiry-time={expires}")
    for resource_name, devices in sorted(resources, key=lambda r: r[0]):
        if label_problem(resource_name, prefix) is not None:
            continue
        base = nfd_label_base(resource_name, prefix)
        counts = devices if isinstance(devices, Counts) else Counts.of(devices)
        values = ("true" if counts.devices else "false", counts.devices, counts.healthy)
        lines += [f"{base}.{suffix}={value}" for suffix, value in zip(NFD_LABEL_SUFFIXES, values, strict=True)]
    return ("\n".join(lines) + "\n").encode()


class FeatureFileWriter:
    """Writes the feature file atomically, only when its bytes change; removes it on request."""

    def __init__(self, path: str = DEFAULT_PATH) -> None:
        self.path = path
        self._written: bytes | None = None

    def write(self, data: bytes) -> bool:
        """True if the file changed. Raises OSError (the caller logs once and retries on rescan)."""
        if data == self._written and os.path.exists(self.path):
            return False
        files.replace(self.path, data, 0o644, 0o755)  # NFD's worker reads it, as root
        self._written = data
        return True

    def remove(self) -> bool:
        self._written = None
        try:
            os.unlink(self.path)
        except FileNotFoundError:
            return False
        return True
