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
from dataclasses import dataclass
from typing import Any

from colad import constants
from colad.errors import ConfigError

DEFAULT_CONFIG_PATH = "/etc/colad/colad.toml"
LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR")

# DNS-1123 subdomain and qualified-name rules, as the kubelet applies them to
# resource names (k8s.io/apimachinery validation.IsQualifiedName via
# pkg/apis/core/v1/helper IsExtendedResourceName).
_DNS1123_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*\Z")
_QUALIFIED_NAME = re.compile(r"([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]\Z")


@dataclass(frozen=True)
class Config:
    resource_name: str = "myway5.com/cola"
    device_dir: str = "/etc/colas"
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
    # Path of the file this config was read from ("" = none), for `colad supervise`.
    config_file: str = ""

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

    def environment(self) -> dict[str, str]:
        """This config as COLAD_* variables: a child that loads them gets the same Config."""
        env = {ENV_PREFIX + f.name.upper(): str(getattr(self, f.name)) for f in _settable_fields()}
        if self.config_file:
            env["COLAD_CONFIG"] = self.config_file
        return env


ENV_PREFIX = "COLAD_"


def _settable_fields() -> list[dataclasses.Field[Any]]:
    return [f for f in dataclasses.fields(Config) if f.name != "config_file"]


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
    for key, raw in file_data.items():
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
    return Config(config_file=path, **final)  # type: ignore[arg-type]
