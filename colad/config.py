"""The one typed configuration, loaded once per process in `main()`.

Precedence: built-in defaults < TOML file < COLAD_* environment < command-line flags.
Every problem is collected and reported at once, naming the key and where the
value came from; callers turn `ConfigError` into exit code 2 and one line.
Nothing else in colad reads os.environ.
"""

from __future__ import annotations

import dataclasses
import ipaddress
import os
import re
import stat
import tomllib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from colad import constants
from colad.allocation import REPLICA_POLICIES
from colad.errors import ConfigError

DEFAULT_CONFIG_PATH = "/etc/colad/colad.toml"
LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR")

# DNS-1123 subdomain and qualified-name rules, as the kubelet applies them to
# resource names (k8s.io/apimachinery validation.IsQualifiedName via
# pkg/apis/core/v1/helper IsExtendedResourceName).
_DNS1123_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*\Z")
_QUALIFIED_NAME = re.compile(r"([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]\Z")

MAX_REPLICAS = 1000
MAX_RESOURCES = 32
# A config file is small (the sample with every key is 4 KB); anything bigger is refused unread.
MAX_CONFIG_FILE_BYTES = 256 * 1024
# tomllib is quadratic in the parts of one dotted key (a 60 KB `a.a.a… = 1` parses for 20 s, and
# every role parses at start and on reload). colad's keys have no dots: a file with more dots
# outside strings and comments than this is refused before it is parsed.
MAX_BARE_DOTS = 64
# At most this many problems are spelled out in the one line of a ConfigError.
MAX_PROBLEMS_SHOWN = 20
# Keys a reload cannot change in a running daemon (sockets, listeners, the
# supervisord config): a changed value is logged and takes effect at restart.
RESTART_ONLY = (
    "kubelet_dir",
    "run_dir",
    "metrics_address",
    "metrics_per_device",
    "supervisord_template",
    "pod_resources_socket",
    "pod_resources_interval",
)
# The keys of the single resource described by top-level keys; a [[resources]] list replaces them.
SINGLE_RESOURCE_KEYS = ("resource_name", "device_dir", "replicas", "replica_policy")


@dataclass(frozen=True, order=True)
class Resource:
    """One extended resource: its name, its device directory, and how its devices are shared."""

    name: str
    device_dir: str
    # Each device is advertised `replicas` times as <id>::<n> (1 = not shared).
    replicas: int = 1
    # How GetPreferredAllocation places replicas: "spread" over devices, or "pack" onto few.
    replica_policy: str = "spread"


@dataclass(frozen=True)
class Config:
    resource_name: str = "myway5.com/cola"
    device_dir: str = "/etc/colas"
    replicas: int = 1
    replica_policy: str = "spread"
    kubelet_dir: str = constants.DEVICE_PLUGIN_PATH
    run_dir: str = "/run/colad"
    # host:port of /metrics and /healthz; "" turns the endpoint off.
    metrics_address: str = "0.0.0.0:9647"
    # Count allocations per device ID (one series per device); off for very large sets.
    metrics_per_device: bool = True
    log_level: str = "INFO"
    # Seconds between safety rescans of the device directory (inotify is primary).
    rescan_interval: float = 30.0
    # Seconds a Register call may take; the kubelet itself dials us for up to 10 s.
    register_timeout: float = 15.0
    # supervisord config template; empty = the one shipped with colad.
    supervisord_template: str = ""
    # The kubelet's PodResources socket, for the in-use view ("" turns it off).
    pod_resources_socket: str = constants.POD_RESOURCES_SOCKET
    # Seconds between PodResources List calls.
    pod_resources_interval: float = 10.0
    # Path of the file this config was read from ("" = none), for `colad supervise`.
    config_file: str = ""
    # The file's [[resources]] tables; empty = the one resource of the top-level keys.
    resource_tables: tuple[Resource, ...] = ()
    # Keys set by the environment or a flag: they win over the file, also on reload.
    pinned: tuple[str, ...] = field(default=(), compare=False)

    @property
    def resources(self) -> tuple[Resource, ...]:
        """Every resource this daemon advertises, in config order."""
        if self.resource_tables:
            return self.resource_tables
        return (Resource(self.resource_name, self.device_dir, self.replicas, self.replica_policy),)

    @property
    def kubelet_socket(self) -> str:
        return os.path.join(self.kubelet_dir, constants.KUBELET_SOCKET_NAME)

    @property
    def queue_socket(self) -> str:
        return os.path.join(self.run_dir, constants.QUEUE_SOCKET_NAME)

    @property
    def supervisor_socket(self) -> str:
        return os.path.join(self.run_dir, constants.SUPERVISOR_SOCKET_NAME)

    @property
    def plugin_state_file(self) -> str:
        return os.path.join(self.run_dir, constants.PLUGIN_STATE_NAME)

    def environment(self, *, pinned_only: bool = False) -> dict[str, str]:
        """This config as COLAD_* variables: a child that loads them gets the same Config.

        With `pinned_only`, only the keys set by the environment or flags are
        exported, so a child that re-reads the file on reload sees its changes.
        """
        names = [f.name for f in _settable_fields() if not pinned_only or f.name in self.pinned]
        if self.resource_tables:  # the file's list stands for these; exporting them would be a conflict
            names = [n for n in names if n not in SINGLE_RESOURCE_KEYS]
        env = {ENV_PREFIX + name.upper(): str(getattr(self, name)) for name in names}
        if self.config_file:
            env["COLAD_CONFIG"] = self.config_file
        return env


ENV_PREFIX = "COLAD_"


def _settable_fields() -> list[dataclasses.Field[Any]]:
    return [f for f in dataclasses.fields(Config) if f.name not in ("config_file", "resource_tables", "pinned")]


def resource_name_problem(name: str) -> str | None:
    """Why the kubelet would refuse this resource name at Register, or None."""
    if "/" not in name:
        return "must have a domain prefix, e.g. example.com/cola"
    if "kubernetes.io/" in name:
        return "must not use the kubernetes.io/ prefix"
    if name.startswith("requests."):
        return "must not start with requests."
    prefix, _, short = ("requests." + name).rpartition("/")
    if "/" in prefix or len(prefix) > 253 or not _DNS1123_SUBDOMAIN.match(prefix):
        return "prefix must be a lowercase DNS subdomain"
    if len(short) > 63 or not _QUALIFIED_NAME.match(short):
        return "name must be at most 63 characters of [A-Za-z0-9._-], starting and ending alphanumeric"
    return None


def _show(value: object, limit: int = 80) -> str:
    """A value for a problem text: repr (so no line break or invisible byte gets through), cut short."""
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _name(key: str) -> str:
    """A key or variable name for a problem text: as it is when short and printable, else its repr."""
    return key if key.isprintable() and len(key) <= 80 else _show(key)


def _where(path: str) -> str:
    """A file path for a problem text: as it is when printable, else its repr."""
    return path if path.isprintable() else repr(path)


def _text_problem(value: str) -> str | None:
    """Why a path or name cannot pass through the OS, inotify, gRPC and the logs as text, or None."""
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        return "is not valid UTF-8 (a byte that is not UTF-8 came in through the environment or a flag)"
    if "\x00" in value:
        return "contains a NUL byte"
    if not value.isprintable():
        return "contains a control or invisible character"
    return None


def _path_problem(value: str) -> str | None:
    return _text_problem(value) or (None if os.path.isabs(value) else "must be an absolute path")


# gRPC reads "unix:<path>" as a URI: %XX is decoded, ? and # start a query or a fragment, and ","
# separates addresses (checked with grpcio 1.51 and 1.85: bind or dial then misses the path).
_GRPC_UNSAFE = "%?#,"
# run_dir is written into supervisord.conf: supervisord expands %(name)s in its values, strips
# surrounding blanks and ends a value at " ;" or " #".
_SUPERVISORD_UNSAFE = "%"
_STAMP = "0" * constants.PLUGIN_SOCKET_STAMP_DIGITS
_PID = "0" * constants.PID_MAX_DIGITS
# The sockets colad binds or dials in each directory: (name as shown, longest name).
_DIR_SOCKETS: dict[str, tuple[tuple[str, str], ...]] = {
    "kubelet_dir": (
        (
            f"{constants.PLUGIN_SOCKET_PREFIX}<unix ms>{constants.PLUGIN_SOCKET_SUFFIX}",
            f"{constants.PLUGIN_SOCKET_PREFIX}{_STAMP}{constants.PLUGIN_SOCKET_SUFFIX}",
        ),
        (constants.KUBELET_SOCKET_NAME, constants.KUBELET_SOCKET_NAME),
    ),
    "run_dir": (
        (f"{constants.QUEUE_SOCKET_NAME}.<pid>.tmp", f"{constants.QUEUE_SOCKET_NAME}.{_PID}.tmp"),  # queue.py staging
        (f"{constants.SUPERVISOR_SOCKET_NAME}.<pid>", f"{constants.SUPERVISOR_SOCKET_NAME}.{_PID}"),  # supervisor's
    ),
}


def _socket_length_problem(path: str, shown: str) -> str | None:
    size = len(os.fsencode(path))
    if size <= constants.SUN_PATH_MAX_BYTES:
        return None
    limit = constants.SUN_PATH_MAX_BYTES
    return f"gives the socket path {shown} of {size} bytes, over the {limit} a Unix socket allows"


def _socket_dir_problem(key: str) -> Callable[[str], str | None]:
    """A check of a directory in which colad binds or dials the sockets of _DIR_SOCKETS[key]."""

    def check(value: str) -> str | None:
        if problem := _path_problem(value):
            return problem
        grpc = key == "kubelet_dir"
        if bad := "".join(sorted(set(value) & set(_GRPC_UNSAFE if grpc else _SUPERVISORD_UNSAFE))):
            why = "gRPC reads unix:<path> as a URI" if grpc else "supervisord.conf cannot carry it"
            return f"must not contain {bad!r} ({why})"
        if key == "run_dir" and any(c.isspace() for c in value):
            return "must not contain blanks (supervisord.conf cannot carry them)"
        for shown, name in _DIR_SOCKETS[key]:
            if problem := _socket_length_problem(os.path.join(value, name), os.path.join("<dir>", shown)):
                return problem
        return None

    return check


def _socket_file_problem(value: str) -> str | None:
    if problem := _path_problem(value):
        return problem
    if bad := "".join(sorted(set(value) & set(_GRPC_UNSAFE))):
        return f"must not contain {bad!r} (gRPC reads unix:<path> as a URI)"
    if value.endswith("/"):
        return "must name a socket, not a directory"
    return _socket_length_problem(value, "")


_HOST_LABEL = re.compile(r"[A-Za-z0-9]([-A-Za-z0-9]{0,61}[A-Za-z0-9])?\Z")
# An interface name (IFNAMSIZ 16 with the NUL) as an IPv6 scope, e.g. [fe80::1%eth0].
_SCOPE = re.compile(r"[A-Za-z0-9_.:-]{1,15}\Z")


def _host_problem(host: str) -> str | None:
    """Why the metrics server could not even try to bind `host`, or None (an unknown name is retried)."""
    if host.startswith("[") and host.endswith("]"):
        address, _, scope = host[1:-1].partition("%")
        try:
            ipaddress.IPv6Address(address)
        except ValueError:
            return "host in brackets must be an IPv6 address, e.g. [::1]:9647"
        return None if not scope or _SCOPE.match(scope) else "IPv6 scope must be an interface name"
    if re.fullmatch(r"[0-9.]+", host):
        try:
            ipaddress.IPv4Address(host)
        except ValueError:
            return "host is not an IPv4 address"
        return None
    name = host[:-1] if host.endswith(".") else host
    # socket.getaddrinfo encodes a name with the idna codec, which raises (not OSError) on a
    # label over 63 characters or an empty one.
    if len(name) > 253 or not all(_HOST_LABEL.match(label) for label in name.split(".")):
        return "host must be an IP address or a DNS name of letters, digits and '-'"
    return None


def _address_problem(value: str) -> str | None:
    host, sep, port = value.rpartition(":")
    bracketed = host.startswith("[") and host.endswith("]")
    if ("[" in host or "]" in host or ":" in host) and not bracketed:
        return "IPv6 hosts go in brackets, e.g. [::1]:9647"
    if not sep or not host:
        return "must be host:port"
    if not re.fullmatch(r"[0-9]{1,5}", port) or not 0 <= int(port) <= 65535:
        return "port must be a number from 0 to 65535"
    return _text_problem(value) or _host_problem(host)


def _level_problem(value: str) -> str | None:
    return None if value.upper() in LOG_LEVELS else "must be one of " + ", ".join(LOG_LEVELS)


def _positive_problem(value: float) -> str | None:
    return None if 0 < value < 86400 else "must be a number of seconds greater than 0 and less than a day"


def _varint_bytes(value: int) -> int:
    return max(1, (value.bit_length() + 6) // 7)


def _field_bytes(body: int) -> int:
    """A length-delimited protobuf field: one tag byte (field numbers below 16), the length, the body."""
    return 1 + _varint_bytes(body) + body


def device_entry_max_bytes(replicas: int, numa_nodes: int = constants.MAX_DEVICE_LIST_ENTRIES) -> int:
    """The most bytes one advertised device can take in a ListAndWatchResponse (v1beta1 api.proto).

    Its ID is the longest file name (MAX_DEVICE_ID_LENGTH) plus "::<replicas - 1>", its health
    "Unhealthy", its topology `numa_nodes` NUMA IDs of two varint bytes each (up to MAX_NUMA_NODE).
    """
    id_bytes = constants.MAX_DEVICE_ID_LENGTH + (len(f"::{replicas - 1}") if replicas > 1 else 0)
    node = _field_bytes(1 + _varint_bytes(constants.MAX_NUMA_NODE))  # NUMANode{ID} in TopologyInfo.nodes
    topology = _field_bytes(numa_nodes * node) if numa_nodes else 0
    return _field_bytes(_field_bytes(id_bytes) + _field_bytes(len(constants.UNHEALTHY)) + topology)


def max_devices_in_list(replicas: int, numa_nodes: int = constants.MAX_DEVICE_LIST_ENTRIES) -> int:
    """How many device files one resource can have so that its ListAndWatch answer always fits the
    kubelet's receive limit, whatever the names, health and topology (each file is `replicas` entries).
    """
    per_file = replicas * device_entry_max_bytes(replicas, numa_nodes)
    return constants.KUBELET_MAX_RECV_MESSAGE_BYTES // per_file


def _replicas_problem(value: int) -> str | None:
    if not 1 <= value <= MAX_REPLICAS:
        return f"must be a whole number from 1 to {MAX_REPLICAS}"
    if max_devices_in_list(value) < 1:
        return "cannot fit even one device in the kubelet's 4 MiB ListAndWatch message"
    return None


def _policy_problem(value: str) -> str | None:
    return None if value in REPLICA_POLICIES else "must be one of " + ", ".join(REPLICA_POLICIES)


_CHECKS: dict[str, Callable[[Any], str | None]] = {
    "resource_name": resource_name_problem,
    "device_dir": _path_problem,
    "kubelet_dir": _socket_dir_problem("kubelet_dir"),
    "run_dir": _socket_dir_problem("run_dir"),
    "metrics_address": lambda v: None if v == "" else _address_problem(v),
    "log_level": _level_problem,
    "rescan_interval": _positive_problem,
    "register_timeout": _positive_problem,
    "supervisord_template": lambda v: None if v == "" else _path_problem(v),
    "replicas": _replicas_problem,
    "replica_policy": _policy_problem,
    "pod_resources_socket": lambda v: None if v == "" else _socket_file_problem(v),
    "pod_resources_interval": _positive_problem,
}


_TRUE = ("true", "yes", "on", "1")
_FALSE = ("false", "no", "off", "0")


def _convert(field: dataclasses.Field[Any], raw: object) -> object:
    """Coerce a file/env/flag value to the field's type, or raise ValueError."""
    kind: type = type(field.default)
    if kind is bool:
        if isinstance(raw, bool):
            return raw
        text = str(raw).strip().lower() if isinstance(raw, str) else None
        if text in _TRUE:
            return True
        if text in _FALSE:
            return False
        raise ValueError("must be true or false")
    if kind is float:
        if isinstance(raw, bool):
            raise ValueError("must be a number")
        return float(raw)  # type: ignore[arg-type]
    if kind is int:
        if isinstance(raw, bool) or isinstance(raw, float):
            raise ValueError("must be a whole number")
        return int(str(raw).strip()) if isinstance(raw, str) else int(raw)  # type: ignore[call-overload]
    if not isinstance(raw, str):
        raise ValueError("must be a string")
    return raw


def _bare_dots(text: str) -> int:
    """Dots outside TOML strings and comments (the parts of dotted keys, and floats); linear time."""
    dots = i = 0
    special = re.compile(r"[.#\"']")
    while (match := special.search(text, i)) is not None:
        char, i = match.group(), match.start()
        if char == ".":
            dots, i = dots + 1, i + 1
            continue
        if char == "#":
            end = text.find("\n", i)
        else:
            quote = char * 3 if text.startswith(char * 3, i) else char
            end = _string_end(text, i + len(quote), quote)
        if end < 0:  # runs to the end of the file (tomllib refuses it if unterminated)
            break
        i = end
    return dots


def _string_end(text: str, start: int, quote: str) -> int:
    """The index after the string closed by `quote` from `start`; -1 if it never closes."""
    i = start
    while True:
        end = text.find(quote, i)
        if end < 0:
            return -1
        if quote[0] == '"':  # basic strings: an odd run of backslashes escapes the quote
            run = len(text[i:end]) - len(text[i:end].rstrip("\\"))
            if run % 2:
                i = end + 1
                continue
        if len(quote) == 1 and "\n" in text[start:end]:
            return text.index("\n", start)  # a one-line string cannot span lines: invalid, stop there
        return end + len(quote)


def _read_file(path: str, explicit: bool, problems: list[str]) -> tuple[dict[str, Any], str]:
    """The parsed file and its path ("" when the default file is absent); problems appended."""
    where = _where(path)
    if problem := _text_problem(path):
        problems.append(f"config file {where}: path {problem}")
        return {}, path
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)  # a FIFO must not block us
    except FileNotFoundError:
        if explicit:
            problems.append(f"config file {where}: not found")
        return {}, ""
    except OSError as exc:
        problems.append(f"config file {where}: {exc.strerror or exc}")
        return {}, path
    try:
        with os.fdopen(fd, "rb") as handle:
            if not stat.S_ISREG(os.fstat(handle.fileno()).st_mode):
                problems.append(f"config file {where}: not a regular file")
                return {}, path
            raw = handle.read(MAX_CONFIG_FILE_BYTES + 1)
        if len(raw) > MAX_CONFIG_FILE_BYTES:
            problems.append(f"config file {where}: larger than {MAX_CONFIG_FILE_BYTES // 1024} KiB")
            return {}, path
        text = raw.decode("utf-8")
        if _bare_dots(text) > MAX_BARE_DOTS:
            problems.append(f"config file {where}: more than {MAX_BARE_DOTS} dotted key parts (colad's keys have none)")
            return {}, path
        return tomllib.loads(text), path
    except (OSError, ValueError, RecursionError, MemoryError) as exc:  # ValueError: UTF-8, TOML, huge ints
        problems.append(f"config file {where}: {exc}")
        return {}, path


def load(flags: Mapping[str, object | None] | None = None, env: Mapping[str, str] | None = None) -> Config:
    """Build the Config from defaults, the TOML file, COLAD_* variables and flags."""
    flags = dict(flags or {})
    env = os.environ if env is None else env
    problems: list[str] = []
    values: dict[str, object] = {}
    sources: dict[str, str] = {}

    path = flags.pop("config", None) or env.get("COLAD_CONFIG") or None
    explicit = path is not None
    path = str(path) if path else DEFAULT_CONFIG_PATH
    if not os.path.isabs(path) and _text_problem(path) is None:
        # The children (supervisord's, with their own working directory) re-read it on reload.
        try:
            path = os.path.abspath(path)
        except OSError as exc:
            problems.append(f"config file {_where(path)}: {exc.strerror or exc}")
    fields = {f.name: f for f in _settable_fields()}

    file_data, path = _read_file(path, explicit, problems)
    source = f"file {_where(path)}"
    tables: tuple[Resource, ...] = ()
    labels: list[str] = []
    for key, raw in file_data.items():
        if key == "resources":
            tables, labels = _resource_tables(raw, source, problems)
            continue
        if key not in fields:
            problems.append(f"{_name(key)} ({source}): unknown key")
            continue
        values[key], sources[key] = raw, source

    known_vars = {ENV_PREFIX + name.upper() for name in fields} | {"COLAD_CONFIG"}
    for var in sorted(v for v in env if v.startswith(ENV_PREFIX) and v not in known_vars):
        problems.append(f"environment {_name(var)}: unknown variable")
    for name in fields:
        var = ENV_PREFIX + name.upper()
        if var in env:
            values[name], sources[name] = env[var], f"environment {var}"
    for name, raw in flags.items():
        if raw is not None and name in fields:
            values[name], sources[name] = raw, "flag --" + name.replace("_", "-")
    if tables:
        for name in SINGLE_RESOURCE_KEYS:
            if name in sources:
                problems.append(f"{name} ({sources[name]}): cannot be used with a [[resources]] list; set it there")

    final: dict[str, object] = {}
    for name, raw in values.items():
        try:
            value = _convert(fields[name], raw)
        except (TypeError, ValueError, OverflowError) as exc:
            problems.append(f"{name} ({sources[name]}): {exc}")
            continue
        problem = _CHECKS.get(name, lambda _v: None)(value)
        if problem:
            problems.append(f"{name} ({sources[name]}): {_show(value)} {problem}")
            continue
        final[name] = value
    failed = set(values) - set(final)
    if "log_level" in final:
        final["log_level"] = str(final["log_level"]).upper()
    pinned = tuple(sorted(n for n, src in sources.items() if not src.startswith("file ")))
    cfg = Config(config_file=path, resource_tables=tables, pinned=pinned, **final)  # type: ignore[arg-type]
    problems.extend(_directory_problems(cfg, labels, sources, source, failed))
    if problems:
        shown = problems[:MAX_PROBLEMS_SHOWN]
        if len(problems) > len(shown):
            shown.append(f"and {len(problems) - len(shown)} more")
        message = "invalid configuration: " + "; ".join(shown)
        raise ConfigError(" ".join(message.splitlines()))  # one line, whatever a message carried
    return cfg


_RESOURCE_KEYS = ("name", "device_dir", "replicas", "replica_policy")


def _resource_tables(raw: object, source: str, problems: list[str]) -> tuple[tuple[Resource, ...], list[str]]:
    """Validate the file's [[resources]] list: the valid tables and their labels (resources[i]).

    Every problem is appended, never raised.
    """
    if not isinstance(raw, list) or not raw or not all(isinstance(t, dict) for t in raw):
        problems.append(f"resources ({source}): must be a non-empty list of [[resources]] tables")
        return (), []
    if len(raw) > MAX_RESOURCES:
        problems.append(f"resources ({source}): at most {MAX_RESOURCES} resources")
        return (), []
    result: list[Resource] = []
    labels: list[str] = []
    for index, table in enumerate(raw):
        where = f"resources[{index}]"
        before = len(problems)
        for key in sorted(set(table) - set(_RESOURCE_KEYS)):
            problems.append(f"{where}.{_name(key)} ({source}): unknown key")
        for key in ("name", "device_dir"):
            if key not in table:
                problems.append(f"{where}.{key} ({source}): required")
        name, device_dir = table.get("name"), table.get("device_dir")
        replicas, policy = table.get("replicas", 1), table.get("replica_policy", "spread")
        checks: tuple[tuple[str, object, type, Callable[[Any], str | None]], ...] = (
            ("name", name, str, resource_name_problem),
            ("device_dir", device_dir, str, _path_problem),
            ("replicas", replicas, int, _replicas_problem),
            ("replica_policy", policy, str, _policy_problem),
        )
        for key, value, kind, check in checks:
            if key not in table and key in ("name", "device_dir"):
                continue
            if not isinstance(value, kind) or isinstance(value, bool):
                problems.append(f"{where}.{key} ({source}): must be a {'whole number' if kind is int else 'string'}")
            elif (problem := check(value)) is not None:
                problems.append(f"{where}.{key} ({source}): {_show(value)} {problem}")
        if len(problems) == before:
            result.append(Resource(str(name), str(device_dir), int(replicas), str(policy)))
            labels.append(where)
    seen: set[str] = set()
    for resource in result:  # directories: see _directory_problems
        if resource.name in seen:
            problems.append(f"resources ({source}): name {_show(resource.name)} is used by more than one resource")
        seen.add(resource.name)
    return tuple(result), labels


def _place(path: str) -> tuple[str, tuple[int, int] | None]:
    """A directory's resolved path (symlinks, '.', '..', '//' and a trailing '/' gone) and, if it
    exists, its (st_dev, st_ino): two spellings, a symlink or a bind mount of one directory match."""
    try:
        real = os.path.realpath(path)
        st = os.stat(real)
    except (OSError, ValueError):  # absent, unreadable; ValueError: a NUL (refused elsewhere)
        return os.path.realpath(path) if "\x00" not in path else os.path.normpath(path), None
    return real, (st.st_dev, st.st_ino) if stat.S_ISDIR(st.st_mode) else None


def _directory_problems(
    cfg: Config, labels: list[str], sources: Mapping[str, str], file_source: str, failed: set[str]
) -> list[str]:
    """Device directories that alias or nest in one another, or that are colad's own directories.

    One physical device in two resources could be allocated twice; in a nested directory,
    in-place edits would go unseen (discovery watches each directory, not its subdirectories).
    `labels` names each of cfg.resource_tables by its index in the file.
    """
    if cfg.resource_tables:
        tables = zip(labels, cfg.resource_tables, strict=True)
        dirs = [(f"{label}.device_dir", file_source, r.device_dir) for label, r in tables]
    elif "device_dir" not in failed:
        dirs = [("device_dir", sources.get("device_dir", "default"), cfg.device_dir)]
    else:
        dirs = []
    places = [_place(path) for _, _, path in dirs]
    own = {k: _place(getattr(cfg, k)) for k in ("run_dir", "kubelet_dir") if k not in failed}
    problems: list[str] = []
    for j, ((key, source, path), (real, ident)) in enumerate(zip(dirs, places, strict=True)):
        for (other_key, _, other_path), (other_real, other_ident) in zip(dirs[:j], places[:j], strict=True):
            common = os.path.commonpath([real, other_real])
            if real == other_real or (ident is not None and ident == other_ident):
                how = "is used by more than one resource: it is the same directory as"
            elif common == other_real:
                how = "is inside the directory of"
            elif common == real:
                how = "contains the directory of"
            else:
                continue
            problems.append(f"{key} ({source}): {_show(path)} {how} {other_key} {_show(other_path)}")
        for own_key, (own_real, own_ident) in own.items():
            if real == own_real or (ident is not None and ident == own_ident):
                problems.append(
                    f"{key} ({source}): {_show(path)} is also the {own_key} ({sources.get(own_key, 'default')}),"
                    " whose files are colad's own, not devices"
                )
    return problems


def reload_plan(running: Config, new: Config) -> tuple[Config, tuple[str, ...]]:
    """What a reload applies: `new`, except the restart-only keys, which keep their running values.

    Returns the config to apply and the restart-only keys whose new value waits for a restart.
    """
    deferred = tuple(k for k in RESTART_ONLY if getattr(running, k) != getattr(new, k))
    kept = {k: getattr(running, k) for k in deferred}
    return dataclasses.replace(new, **kept), deferred
