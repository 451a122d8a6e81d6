"""The one typed configuration, loaded once per process in `main()`.

Precedence: built-in defaults < TOML file < COLAD_* environment < command-line flags.
Every problem is collected and reported at once, naming the key and where the
value came from (the checks of single values are colad/config/checks.py; those across keys are
here, `collisions` among them); callers turn `ConfigError` into exit code 2 and one line.
Nothing else in colad reads os.environ.
"""

from __future__ import annotations

import dataclasses
import os
import shlex
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from colad.config.checks import (
    SHOWN_CHARS,
    absolute_path_problem,
    address_problem,
    alias_problems,
    expiry_problem,
    in_flight_problem,
    label_prefix_problem,
    level_problem,
    owner_uids,
    owners_problem,
    policy_problem,
    positive_problem,
    prepare_timeout_problem,
    printable_command_problem,
    printable_text_problem,
    show_key,
    show_path,
    socket_dir_problem,
    socket_file_problem,
    spec_dir_problem,
)
from colad.config.source import convert, read_file
from colad.core import constants, trust
from colad.core.device_rules import show
from colad.core.dra_registration import (
    KUBELET_PLUGINS_DIR,
    KUBELET_REGISTRY_DIR,
    plugin_socket_path,
    registration_socket_path,
)
from colad.core.errors import ConfigError
from colad.core.list_size import max_devices_in_list
from colad.core.namemap import (
    cdi_kind,
    cdi_kind_problem,
    cdi_spec_file,
    dra_driver_name,
    nfd_label_base,
    nfd_label_keys,
)
from colad.core.names import (
    CDI_MODES,
    DEFAULT_MODE,
    DEFAULT_REPLICA_POLICY,
    DEFAULT_RESOURCE_NAME,
    DRA_MODE,
    MODES,
    driver_name_problem,
    node_name_problem,
    resource_name_problem,
)
from colad.runtime import dirpath, log
from colad.runtime.files import MAX_NAME_BYTES, NAME_MAX_BYTES

TYPE_CHECKING = False  # typing is not loaded at run time: docs/DEVELOPING.md, "Import cost"
if TYPE_CHECKING:
    from collections.abc import Collection
    from typing import Any

LOG = log.get(__name__)
DEFAULT_CONFIG_PATH = "/etc/colad/colad.toml"

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
    "resource_name",
    "device_dir",
    "replicas",
    "replica_policy",
    "probe",
    "probe_timeout",
    "probe_interval",
    "prepare",
    "prepare_timeout",
)
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
    # The kubelet API the devices are served through: "device-plugin" (v1beta1) or "dra" (a DRA driver).
    mode: str = DEFAULT_MODE
    # This node's name in the API server ("" = node_name_default).
    node_name: str = ""
    # The kubeconfig file for the API server ("" = the in-cluster service account).
    kubeconfig: str = ""
    # The DRA driver name ("" = derived from the first resource's name: myway5.com/cola -> cola.myway5.com).
    dra_driver: str = ""
    # The kubelet's plugin watcher directory (the registration socket) and its plugins directory
    # (the DRA service socket, in <plugins_dir>/<driver>/).
    plugins_registry_dir: str = KUBELET_REGISTRY_DIR
    plugins_dir: str = KUBELET_PLUGINS_DIR
    # Path of the file this config was read from ("" = none), for `colad supervise`.
    config_file: str = ""
    # The file's [[resources]] tables; empty = the one resource of the top-level keys.
    resource_tables: tuple[Resource, ...] = ()
    # Keys set by the environment or a flag: they win over the file, also on reload.
    pinned: tuple[str, ...] = field(default=(), compare=False)
    # What load() found for an unset node_name: NODE_NAME, else the host name. Never exported: a child
    # finds it again in the environment it inherits.
    node_name_default: str = field(default="", compare=False)
    # The API server of a pod's own cluster (KUBERNETES_SERVICE_HOST and _PORT, as the kubelet sets them
    # in every pod), for an unset kubeconfig. Never exported, as node_name_default.
    kube_service_host: str = field(default="", compare=False)
    kube_service_port: str = field(default="", compare=False)

    @property
    def resources(self) -> tuple[Resource, ...]:
        """Every resource this daemon advertises, in config order."""
        if self.resource_tables:
            return self.resource_tables
        return (
            Resource(
                self.resource_name,
                self.device_dir,
                self.replicas,
                self.replica_policy,
                self.probe,
                self.probe_timeout,
                self.probe_interval,
                self.prepare,
                self.prepare_timeout,
            ),
        )

    @property
    def trusted_uids(self) -> frozenset[int]:
        """root and the uids of trusted_owners."""
        return trust.trusted_uids(int(uid) for uid in self.trusted_owners)

    @property
    def kubelet_socket(self) -> str:
        return os.path.join(self.kubelet_dir, constants.KUBELET_SOCKET_NAME)

    @property
    def dra_mode(self) -> bool:
        """Served as a DRA driver (else as a device plugin)."""
        return self.mode == DRA_MODE

    @property
    def resolved_node_name(self) -> str:
        """This node's name: node_name, else what load() found."""
        return self.node_name or self.node_name_default

    @property
    def dra_driver_name(self) -> str:
        """The DRA driver's name: dra_driver, else the one the first resource's name gives."""
        return self.dra_driver or dra_driver_name(self.resources[0].name)

    @property
    def dra_registration_socket(self) -> str:
        return registration_socket_path(self.plugins_registry_dir, self.dra_driver_name)

    @property
    def dra_plugin_socket(self) -> str:
        return plugin_socket_path(self.plugins_dir, self.dra_driver_name)

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
# Config fields no file, variable or flag sets: load() fills them in.
UNSETTABLE = (
    "config_file",
    "resource_tables",
    "pinned",
    "node_name_default",
    "kube_service_host",
    "kube_service_port",
)


def _export(value: object) -> str:
    """A value as its COLAD_* variable: a command as a shell-quoted line (read back with shlex.split)."""
    return shlex.join(value) if isinstance(value, tuple) else str(value)


def _settable_fields() -> list[dataclasses.Field[Any]]:
    return [f for f in dataclasses.fields(Config) if f.name not in UNSETTABLE]


_FIELDS = {f.name: f for f in dataclasses.fields(Config)}


def _replicas_problem(value: int) -> str | None:
    if not 1 <= value <= constants.MAX_REPLICAS:
        return f"must be a whole number from 1 to {constants.MAX_REPLICAS}"
    if max_devices_in_list(value) < 1:
        return "cannot fit even one device in the kubelet's 4 MiB ListAndWatch message"
    return None


_CHECKS: dict[str, Callable[[Any], str | None]] = {
    "resource_name": resource_name_problem,
    "device_dir": absolute_path_problem,
    "kubelet_dir": socket_dir_problem("kubelet_dir"),
    "run_dir": socket_dir_problem("run_dir"),
    "metrics_address": lambda v: None if v == "" else address_problem(v),
    "log_level": level_problem,
    "rescan_interval": positive_problem,
    "register_timeout": positive_problem,
    "supervisord_template": lambda v: None if v == "" else absolute_path_problem(v),
    "replicas": _replicas_problem,
    "replica_policy": policy_problem,
    "pod_resources_socket": lambda v: None if v == "" else socket_file_problem(v),
    "pod_resources_interval": positive_problem,
    "cdi": lambda v: None if v in CDI_MODES else "must be one of " + ", ".join(CDI_MODES),
    "cdi_spec_dir": spec_dir_problem,
    "probe_max_in_flight": in_flight_problem,
    "probe": printable_command_problem,
    "probe_timeout": positive_problem,
    "probe_interval": positive_problem,
    "prepare": printable_command_problem,
    "prepare_timeout": prepare_timeout_problem,
    "nfd_features_file": lambda v: None if v == "" else absolute_path_problem(v),
    "nfd_label_prefix": label_prefix_problem,
    "nfd_expiry": expiry_problem,
    "trusted_owners": owners_problem,
    "mode": lambda v: None if v in MODES else "must be one of " + ", ".join(MODES),
    "node_name": lambda v: None if v == "" else node_name_problem(v),
    "kubeconfig": lambda v: None if v == "" else absolute_path_problem(v),
    "dra_driver": lambda v: None if v == "" else driver_name_problem(v),
    "plugins_registry_dir": socket_dir_problem("plugins_registry_dir"),
    "plugins_dir": socket_dir_problem("plugins_dir"),
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
    if not os.path.isabs(path) and printable_text_problem(path) is None:
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
            problems.append(f"{name} ({sources[name]}): {show(value, SHOWN_CHARS)} {problem}")
            continue
        final[name] = value
    failed = set(values) - set(final)
    if isinstance(final.get("run_dir"), str):
        # colad/supervise/main.py joins names to it in supervisord.conf: "/run/colad/" would give "//" paths there
        # that supervisord reads back as other paths than the ones colad dials.
        final["run_dir"] = str(final["run_dir"]).rstrip("/") or "/"
    if "log_level" in final:
        final["log_level"] = str(final["log_level"]).upper()
    if "trusted_owners" in final:  # resolved once: a user deleted later changes nothing
        final["trusted_owners"] = owner_uids(final["trusted_owners"])  # type: ignore[arg-type]
    found, found_in = _default_node_name(env)
    pinned = tuple(sorted(n for n in values if not sources[n].startswith("file ")))
    cfg = Config(
        config_file=path,
        resource_tables=tables,
        pinned=pinned,
        node_name_default=found,
        kube_service_host=env.get("KUBERNETES_SERVICE_HOST", ""),
        kube_service_port=env.get("KUBERNETES_SERVICE_PORT", ""),
        **final,  # type: ignore[arg-type]
    )
    problems.extend(_directory_problems(cfg, labels, sources, source, failed))
    problems.extend(_resource_name_problems(cfg, sources, failed))
    problems.extend(_dra_problems(cfg, sources, found_in, failed))
    problems.extend(f"names: {clash}" for clash in collisions(cfg, failed))
    if problems:
        shown = problems[:MAX_PROBLEMS_SHOWN]
        if len(problems) > len(shown):
            shown.append(f"and {len(problems) - len(shown)} more")
        message = "invalid configuration: " + "; ".join(shown)
        raise ConfigError(" ".join(message.splitlines()))  # one line, whatever a message carried
    return cfg


_RESOURCE_KEYS = ("name", "device_dir", "replicas", "replica_policy") + SINGLE_RESOURCE_KEYS[4:]


def _default_node_name(env: Mapping[str, str]) -> tuple[str, str]:
    """node_name when unset, and where it came from: NODE_NAME (a DaemonSet sets it from spec.nodeName),
    else the host name as the kubelet names its node (lower case, no blanks: k8s.io/component-helpers
    node/util GetHostname)."""
    if env.get("NODE_NAME"):
        return env["NODE_NAME"], "environment NODE_NAME"
    return os.uname().nodename.strip().lower(), "the host name"


def _dra_problems(cfg: Config, sources: Mapping[str, str], found_in: str, failed: set[str]) -> list[str]:
    """What only DRA mode uses, checked in DRA mode only: a default node name, and the socket paths the
    driver name gives (its own rule is a MAPPINGS entry). A device plugin never reads them."""
    if not cfg.dra_mode:
        return []
    problems: list[str] = []
    if not cfg.node_name and (why := node_name_problem(cfg.node_name_default)):
        shown = show(cfg.node_name_default, SHOWN_CHARS)
        problems.append(f"node_name ({found_in}): {shown} {why}; set node_name")
    if driver_name_problem(cfg.dra_driver_name) is not None or {"dra_driver", "resource_name"} & failed:
        return problems
    for key, path in (("plugins_registry_dir", cfg.dra_registration_socket), ("plugins_dir", cfg.dra_plugin_socket)):
        if key not in failed and (why := socket_file_problem(path)):
            problems.append(f"{key} ({sources.get(key, 'default')}): the socket {show_path(path)} {why}")
    return problems


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
                problem = f"{show(value, SHOWN_CHARS)} {why}"
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
            problems.append(
                f"resources ({source}): name {show(resource.name, SHOWN_CHARS)} is used by more than one resource"
            )
        seen.add(resource.name)
    return tuple(result), labels


def _directory_problems(
    cfg: Config, labels: list[str], sources: Mapping[str, str], file_source: str, failed: set[str]
) -> list[str]:
    """The device directories of `cfg` and colad's own ones, named for alias_problems.

    `labels` names each of cfg.resource_tables by its index in the file; a key whose value
    was refused (`failed`) is left out rather than compared as its default.
    """
    if cfg.resource_tables:
        tables = zip(labels, cfg.resource_tables, strict=True)
        dirs = [(f"{label}.device_dir", file_source, r.device_dir) for label, r in tables]
    elif "device_dir" not in failed:
        dirs = [("device_dir", sources.get("device_dir", "default"), cfg.device_dir)]
    else:
        dirs = []
    own = [(k, sources.get(k, "default"), getattr(cfg, k)) for k in ("run_dir", "kubelet_dir") if k not in failed]
    return alias_problems(dirs, own)


def _resource_name_problems(cfg: Config, sources: Mapping[str, str], failed: set[str]) -> list[str]:
    """Settings a resource's name cannot carry: a CDI kind for cdi = "only", NFD label keys with the prefix."""
    problems: list[str] = []
    if failed & {"resource_name", "cdi", "nfd_label_prefix"} or not (cfg.cdi == "only" or cfg.nfd_features_file):
        return problems
    from colad.outputs.nfd import (
        label_problem,  # only for the settings that need it: the default config loads no device model
    )

    for resource in cfg.resources:
        if cfg.cdi == "only" and (why := cdi_kind_problem(resource.name)) is not None:
            problems.append(f"cdi ({sources.get('cdi', 'default')}): 'only' needs a CDI kind per resource: {why}")
        if cfg.nfd_features_file and (why := label_problem(resource.name, cfg.nfd_label_prefix)) is not None:
            problems.append(f"nfd_label_prefix ({sources.get('nfd_label_prefix', 'default')}): {why}")
    return problems


@dataclass(frozen=True)
class NameMapping:
    """One way colad derives names of one kind (`space`) from a resource name, when `applies` to a config.

    `functions` are the namemap functions it applies; `derive` gives what the resource becomes
    (empty: nothing, e.g. a name that is no CDI kind); `problem` why one derived value cannot be used,
    or None. `keys` are the config keys it reads: a mapping is not checked when one of them was
    refused (its default would stand in).
    """

    thing: str  # what the values are, in words: "CDI spec file"
    space: str  # values in one space must not meet, whichever mapping made them
    functions: tuple[Callable[..., object], ...]
    derive: Callable[[Config, str], tuple[str, ...]]
    applies: Callable[[Config], bool]
    keys: tuple[str, ...] = ()
    problem: Callable[[str], str | None] | None = None


def _spec_path(cfg: Config, resource_name: str) -> tuple[str, ...]:
    if cdi_kind_problem(resource_name) is not None:
        return ()  # no kind, no spec
    return (os.path.join(cfg.cdi_spec_dir, cdi_spec_file(resource_name)),)


def _spec_name_problem(path: str) -> str | None:
    size = len(os.fsencode(os.path.basename(path)))
    if size <= MAX_NAME_BYTES:
        return None
    return f"is a file name of {size} bytes, over the {MAX_NAME_BYTES} colad can write (NAME_MAX {NAME_MAX_BYTES})"


def _cdi_on(cfg: Config) -> bool:
    return cfg.cdi != "off" and bool(cfg.cdi_spec_dir)


def _dra_on(cfg: Config) -> bool:
    """DRA mode with a driver name its socket paths can be made of."""
    return cfg.dra_mode and driver_name_problem(cfg.dra_driver_name) is None


MAPPINGS: tuple[NameMapping, ...] = (
    NameMapping(
        "CDI kind",
        "cdi kind",
        (cdi_kind, cdi_kind_problem),
        lambda cfg, name: () if cdi_kind_problem(name) else (cdi_kind(name),),
        _cdi_on,
        ("cdi",),
    ),
    NameMapping(
        "CDI spec file",
        "path",
        (cdi_spec_file,),
        _spec_path,
        _cdi_on,
        ("cdi", "cdi_spec_dir"),
        _spec_name_problem,
    ),
    NameMapping(
        "DRA driver name",
        "dra driver",
        (dra_driver_name,),
        lambda cfg, name: (dra_driver_name(name),) if name == cfg.resources[0].name else (),
        lambda cfg: cfg.dra_mode and not cfg.dra_driver,
        ("mode", "dra_driver"),
        lambda value: f"{why}; set dra_driver" if (why := driver_name_problem(value)) else None,
    ),
    NameMapping(
        "NFD label",
        "nfd label",
        (nfd_label_base, nfd_label_keys),
        lambda cfg, name: nfd_label_keys(name, cfg.nfd_label_prefix),
        lambda cfg: bool(cfg.nfd_features_file),
        ("nfd_features_file", "nfd_label_prefix"),
    ),
)


@dataclass(frozen=True)
class Output:
    """A file, socket or directory colad writes at a path it takes from the config, not from a name.

    `path` reads the one definition of that path (a Config property, or a key itself); `keys` are
    the config keys it reads (not checked when one was refused). A directory may be shared with
    another directory (files and sockets never); no directory may be a device directory and no file
    an entry of one (discovery would list it as a device).
    """

    who: str  # in words, the key first: "run_dir (the queue socket)"
    path: Callable[[Config], str]
    keys: tuple[str, ...]
    directory: bool = False
    applies: Callable[[Config], bool] = lambda cfg: True


# Every path colad writes that does not derive from a resource name (those are MAPPINGS' "path" space).
# tests/unit/core/test_namemap.py fails when a Config path property or a join onto one of these
# directories is not here.
OUTPUTS: tuple[Output, ...] = (
    Output("nfd_features_file", lambda cfg: cfg.nfd_features_file, ("nfd_features_file",)),
    Output("run_dir", lambda cfg: cfg.run_dir, ("run_dir",), directory=True),
    Output("run_dir (the state directory)", lambda cfg: os.path.dirname(cfg.plugin_state_file), ("run_dir",), True),
    Output("run_dir (the queue socket)", lambda cfg: cfg.queue_socket, ("run_dir",)),
    Output("run_dir (supervisord's socket)", lambda cfg: cfg.supervisor_socket, ("run_dir",)),
    Output("run_dir (supervisord's config)", lambda cfg: cfg.supervisor_conf_file, ("run_dir",)),
    Output("run_dir (supervisord's pid file)", lambda cfg: cfg.supervisor_pid_file, ("run_dir",)),
    Output("run_dir (the plugin state file)", lambda cfg: cfg.plugin_state_file, ("run_dir",)),
    Output("run_dir (the status socket)", lambda cfg: cfg.status_socket, ("run_dir",)),
    Output("run_dir (the in-use state file)", lambda cfg: cfg.inuse_state_file, ("run_dir",)),
    Output("run_dir (the plugin socket record)", lambda cfg: cfg.socket_record_file, ("run_dir",)),
    Output("kubelet_dir (the plugin sockets)", lambda cfg: cfg.kubelet_dir, ("kubelet_dir",), directory=True),
    Output("cdi_spec_dir", lambda cfg: cfg.cdi_spec_dir, ("cdi", "cdi_spec_dir"), True, _cdi_on),
    Output(
        "plugins_registry_dir (the DRA registration socket)",
        lambda cfg: cfg.dra_registration_socket,
        ("mode", "plugins_registry_dir", "dra_driver", "resource_name"),
        applies=_dra_on,
    ),
    Output(
        "plugins_dir (the DRA plugin socket)",
        lambda cfg: cfg.dra_plugin_socket,
        ("mode", "plugins_dir", "dra_driver", "resource_name"),
        applies=_dra_on,
    ),
    Output(
        "plugins_dir (the DRA driver's directory)",
        lambda cfg: os.path.dirname(cfg.dra_plugin_socket),
        ("mode", "plugins_dir", "dra_driver", "resource_name"),
        directory=True,
        applies=_dra_on,
    ),
)


def _where(path: str, directory: bool) -> str:
    """Where `path` leads now (dirpath's rule): a directory resolved whole, a file by its parent."""
    if directory:
        return dirpath.resolve(path)
    head, name = dirpath.entry(path)
    return os.path.join(head, name)


def collisions(cfg: Config, refused: Collection[str] = ()) -> list[str]:
    """Problem texts for every two owners (configured resources, colad's own outputs) that one mapping,
    or two of one space, would send to the same value; for every derived value that cannot be used;
    and for every output of colad that discovery would list as a device. Paths are compared where
    they lead now (colad.runtime.dirpath), a CDI spec file's case-folded too.
    `refused`: config keys whose value was refused (entries that read them are left out)."""
    owners: dict[tuple[str, str], tuple[str, str]] = {}  # (space, value compared) -> (who, value), in words
    problems: list[str] = []
    # Paths: (who, where it leads, as configured, directory?, a CDI spec file?)
    paths: list[tuple[str, str, str, bool, bool]] = []
    for out in OUTPUTS:
        if not set(out.keys) & set(refused) and out.applies(cfg) and (path := out.path(cfg)):
            paths.append((out.who, _where(path, out.directory), path, out.directory, False))
    for mapping in MAPPINGS:
        if set(mapping.keys) & set(refused) or not mapping.applies(cfg):
            continue
        for resource in cfg.resources:
            who = f"resource {resource.name!r}"
            for value in mapping.derive(cfg, resource.name):
                if mapping.problem is not None and (why := mapping.problem(value)) is not None:
                    problems.append(f"{who}: its {mapping.thing} {value!r} {why}")
                    continue
                if mapping.space == "path":
                    paths.append((who, _where(value, False), value, False, True))
                    continue
                held, seen = owners.setdefault((mapping.space, value), (who, value))
                if held != who:
                    problems.append(f"{held} and {who} both map to the {mapping.thing} {value!r}")
                    break  # one line per pair and mapping
    problems.extend(_path_clashes(paths))
    if not {"device_dir", "resources", "resource_name"} & set(refused):
        problems.extend(_in_device_dirs(cfg, paths))
    return problems


# Paths are compared where they lead now (_where), and a CDI spec file also case-folded: a spec directory may fold
# case (ext4 casefold, vfat, a container runtime's on another file system): "a.com/GPU" and "a.com/gpu"
# would be one spec file there.
def _path_clashes(paths: list[tuple[str, str, str, bool, bool]]) -> list[str]:
    """Every pair of paths that lead to one file (two directories may be one), one line per pair."""
    problems: list[str] = []
    exact: dict[str, list[int]] = {}
    folded: dict[str, list[int]] = {}
    told: set[tuple[str, str]] = set()
    for i, (who, real, _path, directory, spec) in enumerate(paths):
        same = exact.setdefault(real, [])
        near = folded.setdefault(real.casefold(), [])
        for j in dict.fromkeys(same + [j for j in near if spec or paths[j][4]]):
            held, seen, _, held_dir, _ = paths[j]
            if held == who or (directory and held_dir) or (held, who) in told:
                continue
            told.add((held, who))
            thing = "CDI spec file" if spec else "path"
            folds = "" if seen == real else f" ({seen!r} where case is folded)"
            problems.append(f"{held} and {who} both map to the {thing} {real!r}{folds}")
        same.append(i)
        near.append(i)
    return problems


def _in_device_dirs(cfg: Config, paths: list[tuple[str, str, str, bool, bool]]) -> list[str]:
    """colad's outputs that discovery would list as devices: a directory of colad's that is a device
    directory, or a file colad writes directly in one (discovery lists the regular files of a device
    directory, not its subdirectories). One line per resource and output."""
    problems: list[str] = []
    for resource in cfg.resources:
        device_dir = dirpath.resolve(resource.device_dir)
        found = [(who, real) for who, real, _, directory, _ in paths if directory and real == device_dir]
        if not found:  # else the files in that directory are found with it
            found = [
                (who, real)
                for who, real, _, directory, spec in paths
                if not (directory or spec) and device_dir in (real, os.path.dirname(real))
            ]
        for who, real in found:
            if who in ("run_dir", "kubelet_dir (the plugin sockets)"):
                continue  # config.checks.alias_problems refuses these already
            problems.append(
                f"{who} {real!r} is in the device directory {device_dir!r} of resource {resource.name!r},"
                " where colad's own files would be listed as devices"
            )
    return problems


def reload_plan(running: Config, new: Config) -> tuple[Config, tuple[str, ...]]:
    """What a reload applies: `new`, except the restart-only keys, which keep their running values.

    Returns the config to apply and the restart-only keys whose new value waits for a restart.
    """
    deferred = tuple(k for k in RESTART_ONLY if getattr(running, k) != getattr(new, k))
    kept = {k: getattr(running, k) for k in deferred}
    return dataclasses.replace(new, **kept), deferred


def reload_config(running: Config) -> tuple[Config, tuple[str, ...]]:
    """Re-read the config (SIGHUP) and say what applies; raises ConfigError, logged, if it is refused.

    The whole file is validated before anything changes. Restart-only keys keep
    their running values (logged); the log level takes effect at once.
    """
    try:
        applied, deferred = reload_plan(running, load())
    except ConfigError as exc:
        LOG.error("reload refused; the running config stays", reason=str(exc))
        raise
    for key in deferred:
        LOG.warning("reload: this key changes at the next restart", key=key, running=getattr(running, key))
    log.set_level(applied.log_level)
    return applied, deferred
