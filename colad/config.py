"""The one typed configuration, loaded once per process in `main()`.

Precedence: built-in defaults < TOML file < COLAD_* environment < command-line flags.
Every problem is collected and reported at once, naming the key and where the
value came from; callers turn `ConfigError` into exit code 2 and one line.
Nothing else in colad reads os.environ.
"""

from __future__ import annotations

import dataclasses
import os
import re
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


def _address_problem(value: str) -> str | None:
    host, sep, port = value.rpartition(":")
    bracketed = host.startswith("[") and host.endswith("]")
    if ("[" in host or "]" in host or ":" in host) and not bracketed:
        return "IPv6 hosts go in brackets, e.g. [::1]:9647"
    if not sep or not host:
        return "must be host:port"
    if not re.fullmatch(r"[0-9]{1,5}", port) or not 0 <= int(port) <= 65535:
        return "port must be a number from 0 to 65535"
    return None


def _path_problem(value: str) -> str | None:
    return None if os.path.isabs(value) else "must be an absolute path"


def _level_problem(value: str) -> str | None:
    return None if value.upper() in LOG_LEVELS else "must be one of " + ", ".join(LOG_LEVELS)


def _positive_problem(value: float) -> str | None:
    return None if 0 < value < 86400 else "must be a number of seconds greater than 0 and less than a day"


def _replicas_problem(value: int) -> str | None:
    return None if 1 <= value <= MAX_REPLICAS else f"must be a whole number from 1 to {MAX_REPLICAS}"


def _policy_problem(value: str) -> str | None:
    return None if value in REPLICA_POLICIES else "must be one of " + ", ".join(REPLICA_POLICIES)


_CHECKS: dict[str, Callable[[Any], str | None]] = {
    "resource_name": resource_name_problem,
    "device_dir": _path_problem,
    "kubelet_dir": _path_problem,
    "run_dir": _path_problem,
    "metrics_address": lambda v: None if v == "" else _address_problem(v),
    "log_level": _level_problem,
    "rescan_interval": _positive_problem,
    "register_timeout": _positive_problem,
    "supervisord_template": lambda v: None if v == "" else _path_problem(v),
    "replicas": _replicas_problem,
    "replica_policy": _policy_problem,
    "pod_resources_socket": lambda v: None if v == "" else _path_problem(v),
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
    fields = {f.name: f for f in _settable_fields()}

    file_data: dict[str, Any] = {}
    try:
        with open(path, "rb") as handle:
            file_data = tomllib.load(handle)
    except FileNotFoundError:
        if explicit:
            problems.append(f"config file {path}: not found")
        path = ""
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
        problems.append(f"config file {path}: {exc}")
    tables: tuple[Resource, ...] = ()
    for key, raw in file_data.items():
        if key == "resources":
            tables = _resource_tables(raw, f"file {path}", problems)
            continue
        if key not in fields:
            problems.append(f"{key} (file {path}): unknown key")
            continue
        values[key], sources[key] = raw, f"file {path}"

    known_vars = {ENV_PREFIX + name.upper() for name in fields} | {"COLAD_CONFIG"}
    for var in sorted(v for v in env if v.startswith(ENV_PREFIX) and v not in known_vars):
        problems.append(f"environment {var}: unknown variable")
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
        except (TypeError, ValueError) as exc:
            problems.append(f"{name} ({sources[name]}): {exc}")
            continue
        problem = _CHECKS.get(name, lambda _v: None)(value)
        if problem:
            problems.append(f"{name} ({sources[name]}): {value!r} {problem}")
            continue
        final[name] = value
    if problems:
        raise ConfigError("invalid configuration: " + "; ".join(problems))
    if "log_level" in final:
        final["log_level"] = str(final["log_level"]).upper()
    pinned = tuple(sorted(n for n, src in sources.items() if not src.startswith("file ")))
    return Config(config_file=path, resource_tables=tables, pinned=pinned, **final)  # type: ignore[arg-type]


_RESOURCE_KEYS = ("name", "device_dir", "replicas", "replica_policy")


def _resource_tables(raw: object, source: str, problems: list[str]) -> tuple[Resource, ...]:
    """Validate the file's [[resources]] list; every problem is appended, never raised."""
    if not isinstance(raw, list) or not raw or not all(isinstance(t, dict) for t in raw):
        problems.append(f"resources ({source}): must be a non-empty list of [[resources]] tables")
        return ()
    if len(raw) > MAX_RESOURCES:
        problems.append(f"resources ({source}): at most {MAX_RESOURCES} resources")
        return ()
    result: list[Resource] = []
    for index, table in enumerate(raw):
        where = f"resources[{index}]"
        before = len(problems)
        for key in sorted(set(table) - set(_RESOURCE_KEYS)):
            problems.append(f"{where}.{key} ({source}): unknown key")
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
                problems.append(f"{where}.{key} ({source}): {value!r} {problem}")
        if len(problems) == before:
            result.append(Resource(str(name), str(device_dir), int(replicas), str(policy)))
    for key in ("name", "device_dir"):
        seen: set[str] = set()
        for resource in result:
            value = getattr(resource, key)
            if value in seen:
                problems.append(f"resources ({source}): {key} {value!r} is used by more than one resource")
            seen.add(value)
    return tuple(result)


def reload_plan(running: Config, new: Config) -> tuple[Config, tuple[str, ...]]:
    """What a reload applies: `new`, except the restart-only keys, which keep their running values.

    Returns the config to apply and the restart-only keys whose new value waits for a restart.
    """
    deferred = tuple(k for k in RESTART_ONLY if getattr(running, k) != getattr(new, k))
    kept = {k: getattr(running, k) for k in deferred}
    return dataclasses.replace(new, **kept), deferred
