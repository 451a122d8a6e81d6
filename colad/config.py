"""The one typed configuration, loaded once per process in `main()`.

Precedence: built-in defaults < TOML file < COLAD_* environment < command-line flags.
Every problem is collected and reported at once, naming the key and where the
value came from (the checks of single values are config_checks.py); callers turn
`ConfigError` into exit code 2 and one line. Nothing else in colad reads os.environ.
"""

from __future__ import annotations

import dataclasses
import os
import shlex
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from colad import constants, dirpath, trust
from colad.config_checks import (
    CDI_MODES,
    address_problem,
    command_problem,
    directory_problems,
    expiry_problem,
    in_flight_problem,
    label_prefix_problem,
    level_problem,
    max_devices_in_list,
    owner_uids,
    owners_problem,
    path_problem,
    policy_problem,
    positive_problem,
    prepare_timeout_problem,
    resource_name_problems,
    show,
    show_key,
    show_path,
    socket_dir_problem,
    socket_file_problem,
    spec_dir_problem,
    text_problem,
)
from colad.config_input import convert, read_file
from colad.errors import ConfigError
from colad.namemap import collisions
from colad.names import DEFAULT_REPLICA_POLICY, DEFAULT_RESOURCE_NAME, resource_name_problem

TYPE_CHECKING = False  # typing costs a process ~0.5 MiB (#14); no annotation is evaluated at run time
if TYPE_CHECKING:
    from typing import Any

DEFAULT_CONFIG_PATH = "/etc/colad/colad.toml"

MAX_REPLICAS = constants.MAX_REPLICAS  # owned by constants: devices.py bounds replica IDs by it
MAX_RESOURCES = 32
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
SINGLE_RESOURCE_KEYS = (
    "resource_name", "device_dir", "replicas", "replica_policy",
    "probe", "probe_timeout", "probe_interval", "prepare", "prepare_timeout",
)  # fmt: skip
# Prepare: well below the kubelet's 30 s PreStartContainer deadline, so a hung command is answered.
DEFAULT_PROBE_TIMEOUT, DEFAULT_PROBE_INTERVAL, DEFAULT_PREPARE_TIMEOUT = 5.0, 30.0, 10.0


@dataclass(frozen=True, order=True)
class Resource:
    """One extended resource: its name, its device directory, and how its devices are shared."""

    name: str
    device_dir: str
    # Each device is advertised `replicas` times as <id>::<n> (1 = not shared).
    replicas: int = 1
    # How GetPreferredAllocation places replicas: "spread" over devices, or "pack" onto few.
    replica_policy: str = DEFAULT_REPLICA_POLICY
    # Health probe (argv, no shell; () = none) run per device with its timeout and interval in seconds.
    probe: tuple[str, ...] = ()
    probe_timeout: float = DEFAULT_PROBE_TIMEOUT
    probe_interval: float = DEFAULT_PROBE_INTERVAL
    # Prepare command (argv, no shell; () = none) PreStartContainer runs with the device IDs.
    prepare: tuple[str, ...] = ()
    prepare_timeout: float = DEFAULT_PREPARE_TIMEOUT

    @property
    def pre_start_required(self) -> bool:
        """Only a resource with a prepare command asks for PreStartContainer (read at Register only)."""
        return bool(self.prepare)


@dataclass(frozen=True)
class Config:
    """Every setting of one colad process, validated; see conf/colad.toml for each key's meaning."""

    resource_name: str = DEFAULT_RESOURCE_NAME
    device_dir: str = "/etc/colas"
    replicas: int = 1
    replica_policy: str = DEFAULT_REPLICA_POLICY
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
    # Allocate's CDI answer: "both", "only" or "off" (allocation.allocate); "off" also writes no spec.
    cdi: str = "both"
    # Where discovery writes each resource's CDI spec (colad-<vendor>-<class>.json).
    cdi_spec_dir: str = "/var/run/cdi"
    # A device whose required device-node or mount host paths are missing is Unhealthy.
    host_path_check: bool = True
    # Probes running at once, over every resource (the rest wait their turn).
    probe_max_in_flight: int = 4
    # The single resource's probe / prepare settings (see Resource); [[resources]] tables set their own.
    probe: tuple[str, ...] = ()
    probe_timeout: float = DEFAULT_PROBE_TIMEOUT
    probe_interval: float = DEFAULT_PROBE_INTERVAL
    prepare: tuple[str, ...] = ()
    prepare_timeout: float = DEFAULT_PREPARE_TIMEOUT
    # Node Feature Discovery feature file ("" = none), and the label prefix ("" = NFD's own).
    nfd_features_file: str = ""
    nfd_label_prefix: str = ""
    # Seconds after which NFD drops colad's labels unless the file is rewritten: a node whose colad
    # is gone for good stops claiming devices. Discovery rewrites it at least every third of this.
    nfd_expiry: float = 3600.0
    # Users besides root whose device files and directories are trusted (trust.py): names or uids,
    # held as the uids they named when loaded.
    trusted_owners: tuple[str, ...] = ()
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
        return (
            Resource(
                self.resource_name, self.device_dir, self.replicas, self.replica_policy,
                self.probe, self.probe_timeout, self.probe_interval, self.prepare, self.prepare_timeout,
            ),
        )  # fmt: skip

    @property
    def trusted_uids(self) -> frozenset[int]:
        """root and the uids of trusted_owners."""
        return trust.trusted_uids(int(uid) for uid in self.trusted_owners)

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

    @property
    def status_socket(self) -> str:
        return os.path.join(self.run_dir, constants.STATUS_SOCKET_NAME)

    @property
    def inuse_state_file(self) -> str:
        return os.path.join(self.run_dir, constants.INUSE_STATE_NAME)

    @property
    def socket_record_file(self) -> str:
        return os.path.join(self.run_dir, constants.SOCKET_RECORD_NAME)

    @property
    def supervisor_conf_file(self) -> str:
        return os.path.join(self.run_dir, constants.SUPERVISOR_CONF_NAME)

    @property
    def supervisor_pid_file(self) -> str:
        return os.path.join(self.run_dir, constants.SUPERVISOR_PID_NAME)

    def environment(self, *, pinned_only: bool = False) -> dict[str, str]:
        """This config as COLAD_* variables: a child that loads them gets the same Config.

        With `pinned_only`, only the keys set by the environment or flags are
        exported, so a child that re-reads the file on reload sees its changes.
        """
        names = [f.name for f in _settable_fields() if not pinned_only or f.name in self.pinned]
        if self.resource_tables:  # the file's list stands for these; exporting them would be a conflict
            names = [n for n in names if n not in SINGLE_RESOURCE_KEYS]
        env = {ENV_PREFIX + name.upper(): _export(getattr(self, name)) for name in names}
        if self.config_file:
            env["COLAD_CONFIG"] = self.config_file
        return env


ENV_PREFIX = "COLAD_"


def _export(value: object) -> str:
    """A value as its COLAD_* variable: a command as a shell-quoted line (read back with shlex.split)."""
    return shlex.join(value) if isinstance(value, tuple) else str(value)


def _settable_fields() -> list[dataclasses.Field[Any]]:
    return [f for f in dataclasses.fields(Config) if f.name not in ("config_file", "resource_tables", "pinned")]


_FIELDS = {f.name: f for f in dataclasses.fields(Config)}


def _replicas_problem(value: int) -> str | None:
    if not 1 <= value <= MAX_REPLICAS:
        return f"must be a whole number from 1 to {MAX_REPLICAS}"
    if max_devices_in_list(value) < 1:
        return "cannot fit even one device in the kubelet's 4 MiB ListAndWatch message"
    return None


_CHECKS: dict[str, Callable[[Any], str | None]] = {
    "resource_name": resource_name_problem,
    "device_dir": path_problem,
    "kubelet_dir": socket_dir_problem("kubelet_dir"),
    "run_dir": socket_dir_problem("run_dir"),
    "metrics_address": lambda v: None if v == "" else address_problem(v),
    "log_level": level_problem,
    "rescan_interval": positive_problem,
    "register_timeout": positive_problem,
    "supervisord_template": lambda v: None if v == "" else path_problem(v),
    "replicas": _replicas_problem,
    "replica_policy": policy_problem,
    "pod_resources_socket": lambda v: None if v == "" else socket_file_problem(v),
    "pod_resources_interval": positive_problem,
    "cdi": lambda v: None if v in CDI_MODES else "must be one of " + ", ".join(CDI_MODES),
    "cdi_spec_dir": spec_dir_problem,
    "probe_max_in_flight": in_flight_problem,
    "probe": command_problem,
    "probe_timeout": positive_problem,
    "probe_interval": positive_problem,
    "prepare": command_problem,
    "prepare_timeout": prepare_timeout_problem,
    "nfd_features_file": lambda v: None if v == "" else path_problem(v),
    "nfd_label_prefix": label_prefix_problem,
    "nfd_expiry": expiry_problem,
    "trusted_owners": owners_problem,
}


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
    if not os.path.isabs(path) and text_problem(path) is None:
        # The children (supervisord's, with their own working directory) re-read it on reload.
        try:
            path = dirpath.absolute(path)
        except OSError as exc:
            problems.append(f"config file {show_path(path)}: {exc.strerror or exc}")
    fields = {f.name: f for f in _settable_fields()}

    file_data, path = read_file(path, explicit, problems)
    source = f"file {show_path(path)}"
    tables: tuple[Resource, ...] = ()
    labels: list[str] = []
    for key, raw in file_data.items():
        if key == "resources":
            tables, labels = _resource_tables(raw, source, problems)
            continue
        if key not in fields:
            problems.append(f"{show_key(key)} ({source}): unknown key")
            continue
        values[key], sources[key] = raw, source

    known_vars = {ENV_PREFIX + name.upper() for name in fields} | {"COLAD_CONFIG"}
    for var in sorted(v for v in env if v.startswith(ENV_PREFIX) and v not in known_vars):
        problems.append(f"environment {show_key(var)}: unknown variable")
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
            value = convert(fields[name], raw)
        except (TypeError, ValueError, OverflowError) as exc:
            problems.append(f"{name} ({sources[name]}): {exc}")
            continue
        problem = _CHECKS.get(name, lambda _v: None)(value)
        if problem:
            problems.append(f"{name} ({sources[name]}): {show(value)} {problem}")
            continue
        final[name] = value
    failed = set(values) - set(final)
    if isinstance(final.get("run_dir"), str):
        # supervise.py joins names to it in supervisord.conf: "/run/colad/" would give "//" paths there
        # that supervisord reads back as other paths than the ones colad dials.
        final["run_dir"] = str(final["run_dir"]).rstrip("/") or "/"
    if "log_level" in final:
        final["log_level"] = str(final["log_level"]).upper()
    if "trusted_owners" in final:  # resolved once: a user deleted later changes nothing
        final["trusted_owners"] = owner_uids(final["trusted_owners"])  # type: ignore[arg-type]
    pinned = tuple(sorted(n for n, src in sources.items() if not src.startswith("file ")))
    cfg = Config(config_file=path, resource_tables=tables, pinned=pinned, **final)  # type: ignore[arg-type]
    problems.extend(directory_problems(cfg, labels, sources, source, failed))
    problems.extend(resource_name_problems(cfg, sources, failed))
    problems.extend(f"names: {clash}" for clash in collisions(cfg, failed))
    if problems:
        shown = problems[:MAX_PROBLEMS_SHOWN]
        if len(problems) > len(shown):
            shown.append(f"and {len(problems) - len(shown)} more")
        message = "invalid configuration: " + "; ".join(shown)
        raise ConfigError(" ".join(message.splitlines()))  # one line, whatever a message carried
    return cfg


_RESOURCE_KEYS = ("name", "device_dir", "replicas", "replica_policy") + SINGLE_RESOURCE_KEYS[4:]


def _table_value(key: str, value: object) -> tuple[object, str | None]:
    """A [[resources]] table's value converted like the top-level key of the same name, or a problem."""
    if key in ("name", "device_dir", "replica_policy"):
        return value, None if isinstance(value, str) else "must be a string"
    if key == "replicas":
        ok = isinstance(value, int) and not isinstance(value, bool)
        return value, None if ok else "must be a whole number"
    try:
        return convert(_FIELDS[key], value), None
    except (TypeError, ValueError, OverflowError) as exc:
        return value, str(exc)


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
    defaults = Resource("", "")
    result: list[Resource] = []
    labels: list[str] = []
    for index, table in enumerate(raw):
        where = f"resources[{index}]"
        before = len(problems)
        for key in sorted(set(table) - set(_RESOURCE_KEYS)):
            problems.append(f"{where}.{show_key(key)} ({source}): unknown key")
        for key in ("name", "device_dir"):
            if key not in table:
                problems.append(f"{where}.{key} ({source}): required")
        values: dict[str, object] = {}
        for key in _RESOURCE_KEYS:
            if key not in table:
                continue
            value, problem = _table_value(key, table[key])
            check = _CHECKS["resource_name" if key == "name" else key]
            if problem is None and (why := check(value)) is not None:
                problem = f"{show(value)} {why}"
            if problem is not None:
                problems.append(f"{where}.{key} ({source}): {problem}")
            values[key] = value
        if len(problems) == before:
            fields = {k: values.get(k, getattr(defaults, k)) for k in _RESOURCE_KEYS if k != "name"}
            result.append(Resource(name=str(values["name"]), **fields))  # type: ignore[arg-type]
            labels.append(where)
    seen: set[str] = set()
    for resource in result:  # directories: see _directory_problems
        if resource.name in seen:
            problems.append(f"resources ({source}): name {show(resource.name)} is used by more than one resource")
        seen.add(resource.name)
    return tuple(result), labels


def reload_plan(running: Config, new: Config) -> tuple[Config, tuple[str, ...]]:
    """What a reload applies: `new`, except the restart-only keys, which keep their running values.

    Returns the config to apply and the restart-only keys whose new value waits for a restart.
    """
    deferred = tuple(k for k in RESTART_ONLY if getattr(running, k) != getattr(new, k))
    kept = {k: getattr(running, k) for k in deferred}
    return dataclasses.replace(new, **kept), deferred
