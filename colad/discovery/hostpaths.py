"""Host-path health: a device whose device nodes or mounts are not on the host is Unhealthy.

apply() is the pure rule: given the device set discovery built and what each host path is
(PathState), it returns the set to advertise (Unhealthy where a required path is missing, with
the reason beside it; optional entries whose path is missing left out) and the directories to
watch. check() and stat_path() are the thin shell (one stat per distinct path). The kubelet never
sees a device it would admit a pod to and then fail with CreateContainerError.

The same check owns the trust of each host path (trust.host_path_problem): a path whose way
a user outside trusted_owners could redirect (a directory on it they can write, a link they
own in a sticky one) makes its device Unhealthy and is left out of the device, so neither
Allocate nor the CDI spec ever hands it out.
"""

from __future__ import annotations

import functools
import os
import stat
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, replace

from colad.core import trust
from colad.core.constants import UNHEALTHY
from colad.core.devices import Device, DeviceNode, DeviceSet, Mount
from colad.runtime import pathtrust

# inotify watches are a per-user kernel budget (fs.inotify.max_user_watches, and colad already
# watches its own directories): past this many directories, the periodic rescan alone notices.
MAX_WATCH_DIRS = 256
# How each host path's reason starts (HostPath.key).
HOST_PATH_KEYS = ("device_nodes[", "mounts[")


@dataclass(frozen=True)
class PathState:
    """What stat() said about one host path: `error` is "" when it exists."""

    error: str = ""
    device: bool = False  # a character or block device node
    directory: bool = True  # False: it exists but holds no entries (a path under it cannot exist)
    untrusted: str = ""  # trust.host_path_problem: why a user outside trusted_owners could redirect it

    @property
    def exists(self) -> bool:
        return not self.error

    @property
    def holds(self) -> bool:
        """Can a path under this one exist (and this one be watched for it)?"""
        return self.exists and self.directory


MISSING = PathState("does not exist")


@dataclass(frozen=True)
class HostPath:
    """One host path a device names, with the key that names it (for the reason)."""

    key: str  # "device_nodes[0].host_path"
    path: str
    node: bool  # a device node (must be a char/block device) rather than a mount source
    optional: bool = False


@dataclass(frozen=True)
class HostCheck:
    """The result of apply(): the set to advertise and why devices in it are Unhealthy."""

    devices: DeviceSet
    reasons: tuple[tuple[str, str], ...] = ()  # (device ID, reason), sorted by ID
    watch_dirs: frozenset[str] = frozenset()

    @property
    def by_id(self) -> dict[str, str]:
        return dict(self.reasons)


def _optional(entry: DeviceNode | Mount) -> bool:
    # The device file key `optional = true` on a [[device_nodes]] or [[mounts]] entry arrives as a
    # field of the entry; until devices.py carries it, every entry is required.
    return bool(getattr(entry, "optional", False))


def host_paths(device: Device) -> tuple[HostPath, ...]:
    """Every host path `device` names, device nodes first, in file order."""
    nodes = [
        HostPath(f"device_nodes[{i}].host_path", n.host_path, True, _optional(n))
        for i, n in enumerate(device.device_nodes)
    ]
    mounts = [HostPath(f"mounts[{i}].host_path", m.host_path, False, _optional(m)) for i, m in enumerate(device.mounts)]
    return tuple(nodes + mounts)


def host_path_state_problem(host_path: HostPath, state: PathState) -> str | None:
    """Why `host_path` in `state` keeps a container from starting or may not be handed out, or None."""
    if state.untrusted:
        return f"{host_path.key} {host_path.path!r} {state.untrusted}"
    if not state.exists:
        return f"{host_path.key} {host_path.path!r} {state.error}"
    if host_path.node and not state.device:
        return f"{host_path.key} {host_path.path!r} is not a device node"
    return None


def paths(devices: Iterable[Device]) -> frozenset[str]:
    """The distinct host paths to stat for `devices`."""
    return frozenset(h.path for d in devices for h in host_paths(d))


def apply(devices: DeviceSet, states: Mapping[str, PathState]) -> HostCheck:
    """Mark devices with a missing required path Unhealthy and drop missing optional entries.

    An untrusted path (required or optional) is dropped and makes its device Unhealthy; its
    reason comes first. A path absent from `states` counts as missing. A malformed device
    (problem set) carries no paths and passes unchanged. A declared-Unhealthy device stays so,
    with the reason recorded.
    """
    out: list[Device] = []
    reasons: list[tuple[str, str]] = []
    for device in devices:
        problems: list[str] = []
        drop: set[str] = set()
        for host_path in host_paths(device):
            problem = host_path_state_problem(host_path, states.get(host_path.path, MISSING))
            if problem is None:
                continue
            untrusted = bool(states.get(host_path.path, MISSING).untrusted)
            if host_path.optional or untrusted:
                drop.add(host_path.key)
            if untrusted:
                problems.insert(sum(trust.UNTRUSTED in p for p in problems), problem)
            elif not host_path.optional:
                problems.append(problem)
        if drop:
            device = replace(
                device,
                device_nodes=tuple(
                    n for i, n in enumerate(device.device_nodes) if f"device_nodes[{i}].host_path" not in drop
                ),
                mounts=tuple(m for i, m in enumerate(device.mounts) if f"mounts[{i}].host_path" not in drop),
            )
        if problems:
            extra = f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""
            reasons.append((device.device_id, problems[0] + extra))
            device = replace(device, health=UNHEALTHY)
        out.append(device)
    return HostCheck(DeviceSet.of(out), tuple(sorted(reasons)), watch_dirs(paths(devices), states))


def watch_dirs(host_paths_: Iterable[str], states: Mapping[str, PathState]) -> frozenset[str]:
    """The directories whose inotify events can change a verdict: each path's nearest existing parent.

    A present path is watched in its parent (IN_DELETE, IN_MOVED_FROM, IN_ATTRIB); a missing one in
    the nearest ancestor `states` knows to exist, or its parent when none is known (the shell adds
    the ancestors it stats). Recomputed after every rescan, so the watch follows a directory
    tree as it is created. At most MAX_WATCH_DIRS, the shortest first.
    """
    dirs = set()
    for path in host_paths_:
        parent = os.path.dirname(path)
        while parent not in ("/", "") and parent in states and not states[parent].holds:
            parent = os.path.dirname(parent)
        dirs.add(parent or "/")
    return frozenset(sorted(dirs, key=lambda d: (d.count("/"), d))[:MAX_WATCH_DIRS])


# --- the thin shell ---------------------------------------------------------------------------


def stat_path(path: str, trusted: frozenset[int] = trust.ROOT_ONLY) -> PathState:
    """What `path` is on this host; follows symlinks, as the runtime does (/dev/disk/by-id/...),
    and whether the way to it is trusted (pathtrust.host_path_problem)."""
    untrusted = pathtrust.host_path_problem(path, trusted)
    if untrusted is not None:
        return PathState(untrusted=untrusted)
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return MISSING
    except (OSError, ValueError) as exc:  # ValueError: an embedded NUL (refused earlier, but never fatal)
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        return PathState(f"cannot be checked: {reason}")
    mode = st.st_mode
    return PathState(device=stat.S_ISCHR(mode) or stat.S_ISBLK(mode), directory=stat.S_ISDIR(mode))


def trust_path(path: str, trusted: frozenset[int] = trust.ROOT_ONLY) -> PathState:
    """stat_path's trust verdict alone (host_path_check off: a missing path is not looked for)."""
    untrusted = pathtrust.host_path_problem(path, trusted)
    return PathState(device=True) if untrusted is None else PathState(untrusted=untrusted)


def check(
    devices: DeviceSet, stat_fn: Callable[[str], PathState] | None = None, trusted: frozenset[int] = trust.ROOT_ONLY
) -> HostCheck:
    """apply() with every host path and the ancestors of missing ones stat'ed once, up to the nearest
    existing directory (a regular file in the way is no place for a watch). `trusted`: the owners
    stat_path trusts (the default `stat_fn`)."""
    stat_fn = stat_fn or functools.partial(stat_path, trusted=trusted)
    states: dict[str, PathState] = {}
    for path in sorted(paths(devices)):
        states[path] = stat_fn(path)
        parent = os.path.dirname(path)
        while not states[path].exists and parent not in ("/", "") and parent not in states:
            states[parent] = stat_fn(parent)
            if states[parent].holds:
                break
            parent = os.path.dirname(parent)
    return apply(devices, states)
