"""The plugin's published state (state/plugin.json): its dataclasses and their only reader and writer.

Written by the plugin's life-cycle thread after every change, stamped with its writer (pid,
start tick, boot ID) and time (CLOCK_BOOTTIME), so a reader can tell a stale file; read by
`colad status` and `colad reload` when the plugin cannot be asked, and by `colad check` (the
resource behind a socket). The JSON keeps the keys readers have always seen, the flat
top-level ones from before [[resources]] included. No logging on read.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass, field

from colad.core.constants import UNHEALTHY
from colad.core.devices import DeviceSet, base_id
from colad.core.errors import ColadError
from colad.core.trust import UNTRUSTED
from colad.runtime import files, log, procid

LOG = log.get(__name__)


class StateFileError(ColadError):
    """The state file cannot be read or is not a state file colad writes."""


class StateFileMissing(StateFileError):
    """No state file yet: the plugin has not started (or never ran in this run directory)."""


@dataclass(frozen=True)
class ListCut:
    """The last device list measured against the kubelet's receive limit (service.fit_list)."""

    size: int = 0  # encoded bytes of the list sent
    wanted: int = 0  # device IDs the list should have held
    dropped: int = 0  # device IDs left out so that it fits


# The state file lists at most this many Unhealthy devices per resource (the first by ID), each
# reason cut to MAX_LISTED_REASON characters, and counts the rest: ~20 KiB at most per resource,
# whether 10 or 226,600 devices are Unhealthy.
MAX_LISTED_UNHEALTHY = 50
MAX_LISTED_REASON = 256


@dataclass(frozen=True)
class SickDevice:
    """One Unhealthy physical device as the state file lists it, and why.

    `reason` is the device file's `problem` when `malformed`, else discovery's reason
    (a missing host path, a failing probe, an untrusted file or directory: trust.py); ""
    when nothing says why (its file declares it).
    """

    device_id: str
    reason: str = ""
    malformed: bool = False


@dataclass(frozen=True)
class SickList:
    """A resource's Unhealthy devices: the first MAX_LISTED_UNHEALTHY physical IDs, and how many more."""

    listed: tuple[SickDevice, ...] = ()
    more: int = 0

    @staticmethod
    def of(advertised: DeviceSet) -> SickList:
        """The list for an advertised set (replicas "<id>::<n>" are one physical device); once per set."""
        return advertised.memo("sick_list", _sick_list)


def _clip(text: str) -> str:
    return text if len(text) <= MAX_LISTED_REASON else text[: MAX_LISTED_REASON - 3] + "..."


def _sick_list(advertised: DeviceSet) -> SickList:
    first: dict[str, SickDevice] = {}
    for d in advertised:
        if d.health == UNHEALTHY and base_id(d.device_id) not in first:
            first[base_id(d.device_id)] = SickDevice(
                base_id(d.device_id),
                _clip(d.problem or d.reason),
                malformed=bool(d.problem) and not d.problem.startswith(UNTRUSTED),  # its reason says "untrusted"
            )
    names = sorted(first)
    listed = tuple(first[n] for n in names[:MAX_LISTED_UNHEALTHY])
    return SickList(listed, len(names) - len(listed))


@dataclass(frozen=True)
class ResourceState:
    """One resource as the plugin serves it: registration, socket, advertised list and streams."""

    name: str
    device_dir: str = ""
    replicas: int = 1
    state: str = "starting"
    registered: bool = False
    endpoint: str = ""  # basename of the plugin socket, "" while not serving
    devices: int = 0
    healthy: int = 0
    streams: int = 0  # live ListAndWatch streams of the current server generation
    open_streams: int = 0  # every open stream, older generations included
    since: float = 0.0  # wall time of the last state change
    last_error: str = ""
    last_registered: float = 0.0  # wall time of the last successful Register; 0: never
    cut: ListCut = field(default_factory=ListCut)
    have_devices: bool = False  # discovery's list arrived (not registered empty after the initial wait)
    list_sent: bool = False  # a live stream of the current server sent the kubelet the list held now
    kubelet: str = ""  # identity of the kubelet.sock the last Register went to
    pre_start_required: bool = False  # the option the current server registered with
    sick: SickList = field(default_factory=SickList)  # SickList.of(the advertised set)

    @property
    def unhealthy(self) -> int:
        return self.devices - self.healthy


@dataclass(frozen=True)
class ReloadResult:
    """How the plugin took the last SIGHUP: applied (what changed) or refused (why)."""

    at: float
    ok: bool
    reason: str = ""
    added: tuple[str, ...] = ()
    removed: tuple[str, ...] = ()
    changed: tuple[str, ...] = ()
    deferred: tuple[str, ...] = ()


@dataclass(frozen=True)
class SliceStatus:
    """What the slice publisher knows of this node's slices at one moment (colad/dra/publisher.py builds it).

    Current: the API server holds the last device sets handed over, no change by another writer is
    unsynced, and the last call to the API server was answered. The health rule reads it for /readyz.
    """

    wanted: bool = False  # a device set of every resource was handed over (discovery has reported each)
    published: bool = False  # the API server has held them at least once
    pending: bool = False  # a change not yet at the API server: a newer device set, or another writer's
    failing: str = ""  # the call that failed last, while no call has been answered since ("" none)
    last_error: str = ""  # the last call that failed, answered since or not ("" none yet)
    slices: int = 0  # this node's slices of the driver, as last synced
    devices: int = 0  # the devices they list

    @property
    def current(self) -> bool:
        return self.published and not self.pending and not self.failing


@dataclass(frozen=True)
class PluginState:
    """The whole plugin at one moment: an immutable snapshot, safe to hand to any thread."""

    pid: int
    resources: tuple[ResourceState, ...] = ()
    metrics_address: str = ""
    config_file: str = ""
    reload: ReloadResult | None = None
    healthy: bool | None = None  # the /healthz verdict, when the writer computed one
    health: str = ""
    kubelet: str = ""  # identity of kubelet.sock as the plugin last saw it by stat() ("" absent)
    degraded: tuple[str, ...] = ()  # roles polling for an inotify limit, one text each (colad.health.rule.degraded)
    dra_driver: str = ""  # DRA mode: the driver served ("" device-plugin mode)
    dra_registration: str = ""  # DRA mode: the registration's phase (colad.dra.registration.RegistrationPhase)
    dra_registration_error: str = ""  # DRA mode: the kubelet's last refusal ("" none since it last registered)
    dra_problem: str = ""  # DRA mode: why the DRA socket or the API server's client is not served ("" none)
    dra_slices: SliceStatus = SliceStatus()  # DRA mode: this node's slices, as the publisher knows them
    dra_claims: int = 0  # DRA mode: claims prepared now

    def waiting(self) -> ResourceState | None:
        """The first resource not registered, else the first: the flat top-level fields describe it."""
        return next((r for r in self.resources if not r.registered), self.resources[0] if self.resources else None)

    def by_endpoint(self, endpoint: str) -> ResourceState | None:
        """The resource served on socket `endpoint` (a basename or a path)."""
        base = os.path.basename(endpoint)
        return next((r for r in self.resources if r.endpoint and os.path.basename(r.endpoint) == base), None)


def _resource_json(r: ResourceState) -> dict[str, object]:
    return {
        "name": r.name,
        "device_dir": r.device_dir,
        "replicas": r.replicas,
        "state": r.state,
        "registered": r.registered,
        "endpoint": r.endpoint,
        "devices": r.devices,
        "healthy": r.healthy,
        "streams": r.streams,
        "open_streams": r.open_streams,
        "since": r.since,
        "last_error": r.last_error,
        "last_registered": r.last_registered,
        "list": {"size": r.cut.size, "wanted": r.cut.wanted, "dropped": r.cut.dropped},
        "have_devices": r.have_devices,
        "list_sent": r.list_sent,
        "kubelet": r.kubelet,
        "pre_start_required": r.pre_start_required,
        "unhealthy_devices": [_sick_json(d) for d in r.sick.listed],
        "unhealthy_more": r.sick.more,
    }


def _sick_json(d: SickDevice) -> dict[str, object]:
    return {"id": d.device_id, "reason": d.reason, **({"malformed": True} if d.malformed else {})}


def _reload_json(result: ReloadResult | None) -> dict[str, object]:
    if result is None:
        return {}
    body: dict[str, object] = {"at": result.at, "ok": result.ok, "reason": result.reason}
    if result.ok:
        body.update(
            added=list(result.added),
            removed=list(result.removed),
            changed=list(result.changed),
            deferred=list(result.deferred),
        )
    return body


def to_json(state: PluginState) -> dict[str, object]:
    """The file's JSON object: per-resource entries plus the flat keys of the one-resource shape."""
    waiting = state.waiting()
    first = state.resources[0] if state.resources else None
    return {
        "pid": state.pid,
        "state": waiting.state if waiting else "",
        "registered": waiting.registered if waiting else False,
        "resource_name": first.name if first else "",
        "endpoint": first.endpoint if first else "",
        "devices": sum(r.devices for r in state.resources),
        "healthy": sum(r.healthy for r in state.resources),
        "streams": sum(r.streams for r in state.resources),
        "since": waiting.since if waiting else 0.0,
        "last_error": waiting.last_error if waiting else "",
        "metrics_address": state.metrics_address,
        "resources": [_resource_json(r) for r in state.resources],
        "config_file": state.config_file,
        "reload": _reload_json(state.reload),
        "kubelet": state.kubelet,
        **({} if state.healthy is None else {"health": {"ok": state.healthy, "reason": state.health}}),
        **({"degraded": list(state.degraded)} if state.degraded else {}),
        **({"dra": _dra_json(state)} if state.dra_driver else {}),
    }


def _dra_json(state: PluginState) -> dict[str, object]:
    s = state.dra_slices
    return {
        "driver": state.dra_driver,
        "registration": state.dra_registration,
        "registration_error": state.dra_registration_error,
        "problem": state.dra_problem,
        "claims_prepared": state.dra_claims,
        "slices": {
            "wanted": s.wanted,
            "published": s.published,
            "pending": s.pending,
            "current": s.current,
            "failing": s.failing,
            "last_error": s.last_error,
            "count": s.slices,
            "devices": s.devices,
        },
    }


def _slices_from(dra: dict[str, object]) -> SliceStatus:
    raw = dra.get("slices") or {}
    if not isinstance(raw, dict):
        raise StateFileError("dra.slices: not an object")
    return SliceStatus(
        wanted=_bool(raw, "wanted"),
        published=_bool(raw, "published"),
        pending=_bool(raw, "pending"),
        failing=_str(raw, "failing"),
        last_error=_str(raw, "last_error"),
        slices=_int(raw, "count", 0),
        devices=_int(raw, "devices", 0),
    )


def _int(raw: dict[str, object], key: str, default: int = 0) -> int:
    value = raw.get(key, default)
    if isinstance(value, int) and not isinstance(value, bool):  # a count that says "true" is no count
        return value
    raise StateFileError(f"{key}: {type(value).__name__}, not a whole number")


def _float(raw: dict[str, object], key: str, default: float = 0.0) -> float:
    value = raw.get(key, default)
    if isinstance(value, int | float) and not isinstance(value, bool):
        return float(value)
    raise StateFileError(f"{key}: {type(value).__name__}, not a number")


def _str(raw: dict[str, object], key: str, default: str = "") -> str:
    value = raw.get(key, default)
    if value is None:
        return default
    if isinstance(value, str):
        return value
    raise StateFileError(f"{key}: {type(value).__name__}, not a string")


def _bool(raw: dict[str, object], key: str, default: bool = False) -> bool:
    value = raw.get(key, default)
    if isinstance(value, bool):
        return value
    raise StateFileError(f"{key}: {type(value).__name__}, not true or false")


def _names(raw: dict[str, object], key: str) -> tuple[str, ...]:
    value = raw.get(key) or []
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise StateFileError(f"reload.{key}: not a list of names")
    return tuple(value)


def _sick_from(raw: dict[str, object]) -> SickList:
    entries = raw.get("unhealthy_devices", [])
    if not isinstance(entries, list) or not all(isinstance(e, dict) for e in entries):
        raise StateFileError("unhealthy_devices: not a list of objects")
    listed = tuple(SickDevice(_str(e, "id"), _str(e, "reason"), _bool(e, "malformed")) for e in entries)
    return SickList(listed, _int(raw, "unhealthy_more", 0))


def _resource_from(raw: object) -> ResourceState:
    if not isinstance(raw, dict):
        raise StateFileError("resources: an entry is not an object")
    cut = raw.get("list")
    cut = cut if isinstance(cut, dict) else {}
    return ResourceState(
        name=_str(raw, "name"),
        device_dir=_str(raw, "device_dir"),
        replicas=_int(raw, "replicas", 1),
        state=_str(raw, "state"),
        registered=_bool(raw, "registered"),
        endpoint=_str(raw, "endpoint"),
        devices=_int(raw, "devices", 0),
        healthy=_int(raw, "healthy", 0),
        streams=_int(raw, "streams", 0),
        open_streams=_int(raw, "open_streams", 0),
        since=_float(raw, "since"),
        last_error=_str(raw, "last_error"),
        last_registered=_float(raw, "last_registered"),
        cut=ListCut(
            _int(cut, "size", 0),
            _int(cut, "wanted", 0),
            _int(cut, "dropped", 0),
        ),
        have_devices=_bool(raw, "have_devices"),
        list_sent=_bool(raw, "list_sent"),
        kubelet=_str(raw, "kubelet"),
        pre_start_required=_bool(raw, "pre_start_required"),
        sick=_sick_from(raw),
    )


def _reload_from(raw: object) -> ReloadResult | None:
    if not isinstance(raw, dict) or "ok" not in raw:
        return None
    return ReloadResult(
        at=_float(raw, "at"),
        ok=_bool(raw, "ok"),
        reason=_str(raw, "reason"),
        added=_names(raw, "added"),
        removed=_names(raw, "removed"),
        changed=_names(raw, "changed"),
        deferred=_names(raw, "deferred"),
    )


def from_json(raw: object) -> PluginState:
    """The snapshot a state file holds; the flat one-resource shape (no "resources") is read too."""
    if not isinstance(raw, dict):
        raise StateFileError(f"not an object but {type(raw).__name__}")
    entries = raw.get("resources")
    if entries is None:  # a state file from before [[resources]]
        entries = [{**raw, "name": raw.get("resource_name", "")}]
    if not isinstance(entries, list):
        raise StateFileError("resources: not a list")
    health = raw.get("health")
    dra = raw.get("dra") or {}
    if not isinstance(dra, dict):
        raise StateFileError("dra: not an object")
    return PluginState(
        pid=_int(raw, "pid", 0),
        resources=tuple(_resource_from(e) for e in entries),
        metrics_address=_str(raw, "metrics_address"),
        config_file=_str(raw, "config_file"),
        reload=_reload_from(raw.get("reload")),
        healthy=bool(health.get("ok")) if isinstance(health, dict) else None,
        health=str(health.get("reason", "")) if isinstance(health, dict) else "",
        kubelet=_str(raw, "kubelet"),
        degraded=_texts(raw.get("degraded", [])),
        dra_driver=_str(dra, "driver"),
        dra_registration=_str(dra, "registration"),
        dra_registration_error=_str(dra, "registration_error"),
        dra_problem=_str(dra, "problem"),
        dra_slices=_slices_from(dra),
        dra_claims=_int(dra, "claims_prepared", 0),
    )


def _texts(value: object) -> tuple[str, ...]:
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise StateFileError("degraded: not a list of strings")
    return tuple(value)


def read_raw(path: str) -> dict[str, object]:
    """The file's JSON object as written (for `colad status --json`); raises StateFileError."""
    try:
        with open(path, encoding="utf-8") as handle:
            raw = json.load(handle)
    except FileNotFoundError as exc:
        raise StateFileMissing(f"{path}: {exc.strerror}") from None
    except (OSError, ValueError) as exc:
        raise StateFileError(f"{path}: {exc}") from None
    if not isinstance(raw, dict):
        raise StateFileError(f"{path}: not an object but {type(raw).__name__}")
    return raw


def read(path: str) -> PluginState:
    """The snapshot in the file at `path`; raises StateFileMissing or StateFileError, naming the path."""
    raw = read_raw(path)
    try:
        return from_json(raw)
    except StateFileError as exc:
        raise StateFileError(f"{path}: {exc}") from None


def read_reload(path: str) -> ReloadResult | None:
    """The last reload's result, None when there is none or the file is unreadable (never raises)."""
    try:
        return read(path).reload
    except StateFileError:
        return None


def _replace(path: str, body: object) -> str:
    """Replace the JSON file `path` atomically (0600, in a 0700 directory): "" when done, else why not."""
    try:
        # One write of the whole text (json.dump makes many small ones).
        files.replace(path, json.dumps(body).encode("utf-8"), 0o600, 0o700)
    except (OSError, ValueError, TypeError) as exc:
        return str(exc) or type(exc).__name__
    return ""


_FAILING: set[str] = set()  # paths whose last write_json failed


def write_json(path: str, body: object) -> bool:
    """Replace the JSON file `path` atomically (0600, in a 0700 directory); False (logged), never raises.

    Readers see the old file or the new one, never half of one; a state file is
    never worth a crash. The socket record and the in-use view are written this way too.
    """
    error = _replace(path, body)
    if error and path not in _FAILING:  # said once per run of failures: a full disk is not news every write
        _FAILING.add(path)
        LOG.warning("state file not written", path=path, error=error)
    elif not error and path in _FAILING:
        _FAILING.discard(path)
        LOG.info("state file written again", path=path)
    return not error


@dataclass(frozen=True)
class Stamp:
    """Who wrote a state file and when: its writer, CLOCK_BOOTTIME of that boot, wall time (for people)."""

    writer: procid.ProcessId | None = None  # None: a file from a colad that did not say
    boottime: float | None = None
    wall: float | None = None

    def age(self) -> float | None:
        """Seconds since the write, on this boot's clock; None for a file of another boot or of unknown age."""
        if self.writer is None or self.boottime is None or self.writer.boot_id != procid.boot_id():
            return None
        return max(0.0, procid.boottime() - self.boottime)


def stamp_of(raw: dict[str, object]) -> Stamp:
    """The writer and time a state file records; an empty Stamp when it records none (never raises)."""
    who, when = raw.get("writer"), raw.get("written")
    writer = None
    if isinstance(who, dict):
        boot, pid, start = who.get("boot_id"), who.get("pid"), who.get("start")
        if isinstance(boot, str) and isinstance(pid, int) and isinstance(start, int):
            writer = procid.ProcessId(boot, pid, start)
    when = when if isinstance(when, dict) else {}
    boottime, wall = when.get("boottime"), when.get("wall")
    return Stamp(
        writer,
        float(boottime) if isinstance(boottime, int | float) and not isinstance(boottime, bool) else None,
        float(wall) if isinstance(wall, int | float) and not isinstance(wall, bool) else None,
    )


def stamped(state: PluginState) -> dict[str, object]:
    """The file's JSON object with who writes it and when (the status socket answers the same object)."""
    me = procid.current()
    return {
        **to_json(state),
        "writer": {"boot_id": me.boot_id, "pid": me.pid, "start": me.start},
        "written": {"boottime": procid.boottime(), "wall": time.time()},
    }


def write(path: str, state: PluginState) -> str:
    """Publish `state` to the file at `path`, stamped: "" when written, else why not.

    Not logged here: the plugin says once that writes fail, retries, and reports it on /healthz.
    """
    return _replace(path, stamped(state))
