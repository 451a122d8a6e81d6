"""Device files: what the content of one file in the device directory says about its device.

Discovery reads at most MAX_DEVICE_FILE_BYTES + 1 bytes of a device file; parse() returns a Device
(devices.py) and never raises: a malformed file is an Unhealthy device whose `problem` names
the key. A linear pre-scan refuses keys that would make tomllib slow, so a parse has a budget.
No I/O, no logging, no clock. The format is in docs/DEVICES.md.
"""

from __future__ import annotations

import re

from colad.config.source import parse_toml
from colad.core.constants import (
    HEALTHY,
    MAX_DEVICE_FILE_BYTES,
    MAX_DEVICE_LIST_ENTRIES,
    MAX_DEVICE_MAP_ENTRIES,
    UNHEALTHY,
)
from colad.core.device_rules import one_line
from colad.core.devices import HEALTH_VALUES, Device, DeviceNode, Mount, device_problem

TYPE_CHECKING = False  # typing is not loaded at run time: docs/DEVELOPING.md, "Import cost"
if TYPE_CHECKING:
    from typing import Any

FORMAT_VERSION = 1
MAX_PROBLEM_LENGTH = 300
_KEYS = frozenset(
    ("version", "health", "numa_nodes", "cdi_devices", "envs", "annotations", "device_nodes", "mounts")
    + ("probe", "prepare")
)
_DEVICE_NODE_KEYS = frozenset(("host_path", "container_path", "permissions", "optional"))
_MOUNT_KEYS = frozenset(("host_path", "container_path", "read_only", "optional"))
# tomllib builds a dotted key's tuple one part at a time and then checks every prefix of it, so a
# key of n parts costs O(n^2): a 64 KiB `a.a.a...= 1` takes 20 s. The format's deepest key has two
# parts (`envs.NAME`, `annotations."x/y"`, `[envs]`); 8 leaves room for any honest spelling and
# keeps the worst file in milliseconds (tests/unit/discovery/test_hostile_devicefile.py measures it).
MAX_KEY_PARTS = 8
# Strings are lexed as tomllib lexes them, so the scan agrees with the parser up to the first point
# where tomllib fails anyway (it ends a multi-line string at the first closing triple and takes up
# to 2 more quotes). An unterminated string runs to the end of its line (or of a multi-line string,
# the text): every alternative matches where it starts and nothing is scanned twice over.
_BASIC = r'"(?:[^"\\\n]++|\\[^\n]?)*+"?'
_LITERAL = r"'[^'\n]*+'?"
_PART = rf"(?:(?<![A-Za-z0-9_-])[A-Za-z0-9_-]++|{_BASIC}|{_LITERAL})"
_SCAN = re.compile(
    rf"(?P<deep>{_PART}(?:[ \t]*+\.[ \t]*+{_PART}){{{MAX_KEY_PARTS}}})"
    r'|"""(?:[^"\\]++|\\.|"(?!""))*+(?:""""{0,2})?'
    r"|'''(?:[^']++|'(?!''))*+(?:''''{0,2})?"
    rf"|{_BASIC}|{_LITERAL}|#[^\n]*+",
    re.DOTALL,
)


class _Malformed(Exception):
    """The file is not a valid device file; the message is the device's problem."""


def parse(device_id: str, data: bytes) -> Device:
    """The device that file `device_id` with content `data` describes; never raises.

    An empty file (or one of only whitespace and comments) is a Healthy bare
    device. A malformed file is Device(device_id, UNHEALTHY, problem=<reason>)
    with every other field empty, so it never contributes anything to a
    container. The result depends on `data` alone: fixing a file heals its device.
    """
    if not data:  # most device files: a bare device, without tomllib (a third of a 10,000-file burst's CPU)
        return Device(device_id)
    try:
        return _parse(device_id, data)
    except _Malformed as exc:
        problem = one_line(str(exc)) or "malformed"
        if len(problem) > MAX_PROBLEM_LENGTH:
            problem = problem[: MAX_PROBLEM_LENGTH - 3] + "..."
        return Device(device_id, UNHEALTHY, problem=problem)


def _parse(device_id: str, data: bytes) -> Device:
    if len(data) > MAX_DEVICE_FILE_BYTES:
        raise _Malformed(f"larger than {MAX_DEVICE_FILE_BYTES} bytes")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise _Malformed(f"not UTF-8 (invalid byte at offset {exc.start})") from None
    line = deep_key(text)
    if line is not None:
        raise _Malformed(f"a key at line {line} has more than {MAX_KEY_PARTS} dotted parts (the format nests 2 deep)")
    try:
        table = parse_toml(text)  # imports tomllib only for a file with more than comments
    except (RecursionError, ValueError) as exc:  # ValueError: tomllib.TOMLDecodeError among them
        raise _Malformed(f"invalid TOML: {exc}") from None
    _no_unknown_keys(table, _KEYS, "")
    version = table.get("version", FORMAT_VERSION)
    if type(version) is not int:
        raise _Malformed("version must be an integer")
    if version != FORMAT_VERSION:
        raise _Malformed(f"unsupported version {version}")
    health = table.get("health", HEALTHY)
    if health not in HEALTH_VALUES:
        raise _Malformed(f'health must be "{HEALTHY}" or "{UNHEALTHY}"')
    numa_nodes = _list(table, "numa_nodes", int)
    device = Device(
        device_id,
        health,
        numa_nodes=tuple(sorted(set(numa_nodes))),
        device_nodes=tuple(_device_node(t, i) for i, t in enumerate(_list(table, "device_nodes", dict))),
        mounts=tuple(_mount(t, i) for i, t in enumerate(_list(table, "mounts", dict))),
        envs=_map(table, "envs"),
        annotations=_map(table, "annotations"),
        cdi_devices=tuple(_list(table, "cdi_devices", str)),
        probe=_command(table, "probe"),
        prepare=_command(table, "prepare"),
    )
    problem = device_problem(device)
    if problem is not None:
        raise _Malformed(problem)
    return device


def deep_key(text: str) -> int | None:
    """The line of the first key of more than MAX_KEY_PARTS dotted parts in TOML `text`, or None.

    Looks for chains of key parts (bare words or one-line strings joined by '.',
    blanks allowed around it) outside strings and comments, in linear time: the
    regex engine skips everything else. A value such as 1.5 is a chain of two,
    which is why this only serves a generous limit.
    """
    for match in _SCAN.finditer(text):
        if match.lastgroup == "deep":
            return text.count("\n", 0, match.start()) + 1
    return None


_TYPE_NAMES = {int: "integers", str: "strings", dict: "tables ([[...]])"}


def _list(table: dict[str, Any], key: str, kind: type) -> list[Any]:
    value = table.get(key, [])
    # bool is an int in Python; a TOML boolean is never a NUMA node.
    if not isinstance(value, list) or not all(isinstance(v, kind) and not isinstance(v, bool) for v in value):
        raise _Malformed(f"{key} must be a list of {_TYPE_NAMES[kind]}")
    if len(value) > MAX_DEVICE_LIST_ENTRIES:
        raise _Malformed(f"{key} has more than {MAX_DEVICE_LIST_ENTRIES} entries")
    return value


def _map(table: dict[str, Any], key: str) -> tuple[tuple[str, str], ...]:
    value = table.get(key, {})
    if not isinstance(value, dict):
        raise _Malformed(f"{key} must be a table ([{key}])")
    if len(value) > MAX_DEVICE_MAP_ENTRIES:
        raise _Malformed(f"{key} has more than {MAX_DEVICE_MAP_ENTRIES} entries")
    for name, item in value.items():
        if not isinstance(item, str):
            raise _Malformed(f"{key}.{name} must be a string")
    return tuple(sorted(value.items()))


def _command(table: dict[str, Any], key: str) -> tuple[str, ...] | None:
    """A probe or prepare override: None when absent (the resource's), () for none on this device."""
    if key not in table:
        return None
    value = table[key]
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise _Malformed(f"{key} must be a list of strings (the command's absolute path, then its arguments)")
    return tuple(value)


def _optional(table: dict[str, Any], where: str) -> bool:
    value = table.get("optional", False)
    if not isinstance(value, bool):
        raise _Malformed(f"{where}.optional must be true or false")
    return value


def _no_unknown_keys(table: dict[str, Any], known: frozenset[str], where: str) -> None:
    unknown = sorted(table.keys() - known)
    if unknown:
        raise _Malformed(f"unknown key {where}{unknown[0]!r}")


def _path(table: dict[str, Any], key: str, where: str, default: str | None = None) -> str:
    value = table.get(key, default)
    if value is None:
        raise _Malformed(f"{where}.{key} is missing")
    if not isinstance(value, str):
        raise _Malformed(f"{where}.{key} must be a string")
    return value


def _device_node(table: dict[str, Any], index: int) -> DeviceNode:
    where = f"device_nodes[{index}]"
    _no_unknown_keys(table, _DEVICE_NODE_KEYS, f"in {where}: ")
    host_path = _path(table, "host_path", where)
    permissions = table.get("permissions", "rw")
    valid = (
        isinstance(permissions, str)
        and permissions != ""
        and set(permissions) <= set("rwm")
        and len(set(permissions)) == len(permissions)
    )
    if not valid:
        raise _Malformed(f"{where}.permissions must be a non-empty combination of r, w, m")
    return DeviceNode(
        host_path,
        _path(table, "container_path", where, host_path),
        "".join(c for c in "rwm" if c in permissions),
        _optional(table, where),
    )


def _mount(table: dict[str, Any], index: int) -> Mount:
    where = f"mounts[{index}]"
    _no_unknown_keys(table, _MOUNT_KEYS, f"in {where}: ")
    host_path = _path(table, "host_path", where)
    read_only = table.get("read_only", True)
    if not isinstance(read_only, bool):
        raise _Malformed(f"{where}.read_only must be true or false")
    return Mount(host_path, _path(table, "container_path", where, host_path), read_only, _optional(table, where))
