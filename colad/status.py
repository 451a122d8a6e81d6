"""`colad status`: each process' state, whether the plugin is registered, the device count, and who holds each device.

Reads supervisord's XML-RPC on <run_dir>/supervisor.sock, the plugin's state file and the
in-use view (state/inuse.json); writes a table (or JSON). The in-use view never changes the exit
code: 0 registered, every process RUNNING or STARTING; 1 degraded; 3 colad is not running;
4 starting: not registered yet, for no reason but the start (man colad(8)).
"""

from __future__ import annotations

import http.client
import json
import os
import socket
import sys
import threading
import time
import xmlrpc.client
from collections.abc import Callable
from typing import Any

from colad import inuse, pathtrust, statefile
from colad.config import Config
from colad.statefile import StateFileError, StateFileMissing

PROGRAMS = ("plugin", "discovery", "kubelet-watch")
STARTING = "STARTING"  # supervisord's state for a process in its first startsecs
EXIT_DEGRADED, EXIT_NOT_RUNNING, EXIT_STARTING = 1, 3, 4
# A resource in these states, with no error yet, is on its way to registering, not failing.
_ON_ITS_WAY = ("starting", "registering")
ROLE_CHECK_TIMEOUT = 1.0  # /healthz must answer fast even when supervisord is busy
ROLE_CHECK_CACHE = 2.0  # seconds a role check is reused: probes and scrapes must not hammer supervisord


class _UnixHTTPConnection(http.client.HTTPConnection):
    """HTTP to supervisord over its unix socket: only connect() differs from a TCP connection."""

    def __init__(self, socket_path: str, timeout: float) -> None:
        super().__init__("localhost", timeout=timeout)
        self.socket_path = socket_path

    def connect(self) -> None:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(self.timeout)
        try:
            sock.connect(self.socket_path)
        except OSError:
            sock.close()
            raise
        self.sock = sock


class _UnixTransport(xmlrpc.client.Transport):
    """XML-RPC over supervisord's unix socket, with a timeout on every call (SupervisorTransport has none)."""

    def __init__(self, socket_path: str, timeout: float) -> None:
        super().__init__()
        self.socket_path = socket_path
        self.timeout = timeout

    def make_connection(self, host: Any) -> http.client.HTTPConnection:
        self.close()
        connection = _UnixHTTPConnection(self.socket_path, self.timeout)
        self._connection = host, connection
        return connection


def supervisor_proxy(socket_path: str, timeout: float = 10.0) -> Any:
    return xmlrpc.client.ServerProxy("http://localhost", transport=_UnixTransport(socket_path, timeout))


def not_running(infos: list[dict[str, Any]], *, but: tuple[str, ...] = ()) -> list[str]:
    """ "<name> is <STATE>" for every process supervisord runs that is not RUNNING (or in `but`) (pure)."""
    problems = []
    for info in sorted(infos, key=lambda i: str(i.get("name"))):
        if info.get("statename") not in ("RUNNING", *but):
            problems.append(f"{info.get('name')} is {info.get('statename')}")
    return problems


class RoleHealth:
    """For the plugin's /healthz: which colad processes supervisord reports as not RUNNING.

    Asked over XML-RPC with a short timeout and cached briefly. A plugin that is not a
    child of the supervisord of its run directory (run alone, as the integration tests
    do) has no roles to check and says so; under supervisord, no answer is a problem.
    """

    def __init__(self, cfg: Config, *, clock: Callable[[], float] = time.monotonic) -> None:
        self.socket_path = cfg.supervisor_socket
        self.pid_file = os.path.join(cfg.run_dir, "supervisord.pid")
        self.clock = clock
        self._lock = threading.Lock()
        self._cached: tuple[float, list[str] | None] | None = None

    def supervised(self) -> bool:
        try:
            with open(self.pid_file, encoding="ascii") as handle:
                return int(handle.read().strip() or 0) == os.getppid()
        except (OSError, ValueError):
            return False

    def problems(self) -> list[str] | None:
        """None when there is no supervisord to ask; else every process not RUNNING (or why we cannot tell)."""
        with self._lock:
            now = self.clock()
            if self._cached is not None and now - self._cached[0] < ROLE_CHECK_CACHE:
                return self._cached[1]
            result = self._ask()
            self._cached = (self.clock(), result)
            return result

    def _ask(self) -> list[str] | None:
        if not self.supervised():
            return None
        try:
            infos = supervisor_proxy(self.socket_path, ROLE_CHECK_TIMEOUT).supervisor.getAllProcessInfo()
        except (OSError, xmlrpc.client.Error, http.client.HTTPException) as exc:
            return [f"supervisord not answering on {self.socket_path}: {exc}"]
        if not isinstance(infos, list):
            return [f"supervisord answered {type(infos).__name__}, not a process list"]
        return not_running([i for i in infos if isinstance(i, dict)])


def collect(cfg: Config) -> dict[str, Any]:
    report = _collect_processes(cfg)
    if report["running"]:
        report["problems"].extend(untrusted_directories(cfg))
    report["in_use"] = read_in_use(cfg) if report["running"] else _in_use_unavailable("colad is not running")
    return report


def untrusted_directories(cfg: Config) -> list[str]:
    """Each device directory discovery refuses as untrusted (trust.py), looked at now: a directory
    refused since the start has no device whose reason the state file could carry."""
    found = ((r.name, pathtrust.directory_problem(r.device_dir, cfg.trusted_uids)) for r in cfg.resources)
    return [f"{name}: {why}" for name, why in found if why is not None]


def _in_use_unavailable(reason: str) -> dict[str, Any]:
    return {"available": False, "reason": reason, "updated": None, "holders": []}


def read_in_use(cfg: Config) -> dict[str, Any]:
    """The plugin's in-use view, tolerant of a missing, partial or foreign file."""
    try:
        raw = statefile.read_raw(os.path.join(cfg.run_dir, inuse.STATE_NAME))
    except StateFileMissing:
        return _in_use_unavailable("no in-use view written yet")
    except StateFileError as exc:
        return _in_use_unavailable(f"in-use view unreadable: {exc}")
    available = raw.get("available") is True
    updated = raw.get("updated")
    return {
        "available": available,
        "reason": str(raw.get("reason") or ("" if available else "unknown")),
        "updated": updated if isinstance(updated, int | float) and not isinstance(updated, bool) else None,
        "holders": inuse.parse_rows(raw.get("holders")) if available else [],
    }


def _collect_processes(cfg: Config) -> dict[str, Any]:
    report: dict[str, Any] = {
        "running": False, "processes": {}, "plugin": None, "problems": [], "starting": [], "waiting": [],
        "restarts": [],
    }  # fmt: skip
    proxy = supervisor_proxy(cfg.supervisor_socket)
    try:
        infos = proxy.supervisor.getAllProcessInfo()
    except (OSError, xmlrpc.client.Error, http.client.HTTPException) as exc:
        report["problems"].append(f"supervisord not reachable on {cfg.supervisor_socket}: {exc}")
        return report
    report["running"] = True
    _collect_restarts(proxy, report)
    for info in infos:
        uptime = info["now"] - info["start"] if info["pid"] else 0
        report["processes"][info["name"]] = {"state": info["statename"], "pid": info["pid"], "uptime": uptime}
    for name in PROGRAMS:
        if name not in report["processes"]:
            report["problems"].append(f"{name} is MISSING")
    # Every process supervisord runs counts: a role in BACKOFF,
    # FATAL, EXITED or STOPPED is colad not doing its job, whoever stopped it. STARTING (the
    # first startsecs after a spawn) is not a problem by itself: what it means is in `waiting`.
    report["problems"].extend(not_running(infos, but=(STARTING,)))
    report["starting"] = sorted(str(i.get("name")) for i in infos if i.get("statename") == STARTING)
    plugin_starting = report["processes"].get("plugin", {}).get("state") == STARTING
    # While the plugin itself is STARTING, a missing or older state file, or a resource not
    # registered yet, is the start itself: waiting (exit 4), not degraded.
    start_window = report["waiting"] if plugin_starting else report["problems"]
    try:
        plugin = statefile.read_raw(cfg.plugin_state_file)
        state = statefile.from_json(plugin)
    except StateFileMissing as exc:
        start_window.append(f"plugin state unknown: {exc}")
        return report
    except StateFileError as exc:
        report["problems"].append(f"plugin state unknown: {exc}")
        return report
    plugin_pid = report["processes"].get("plugin", {}).get("pid")
    if state.pid != plugin_pid:
        start_window.append("plugin state file is from an earlier plugin process")
        plugin["registered"] = False
    report["plugin"] = plugin
    if "resources" in plugin and state.resources and state.pid == plugin_pid:
        for r in state.resources:
            if not r.registered:
                on_its_way = r.state in _ON_ITS_WAY and not r.last_error
                where = report["waiting"] if on_its_way or plugin_starting else report["problems"]
                where.append(f"{r.name} not registered ({r.state}: {r.last_error or '-'})")
    elif not plugin.get("registered"):
        start_window.append(f"plugin not registered ({plugin.get('state')}: {plugin.get('last_error') or '-'})")
    if state.reload is not None and not state.reload.ok:
        report["problems"].append(f"last reload refused, the running config stays: {state.reload.reason}")
    return report


def _collect_restarts(proxy: Any, report: dict[str, Any]) -> None:
    """The watchdog's coming starts of FATAL roles (colad.getRestarts, inside supervisord), or why not."""
    try:
        restarts = proxy.colad.getRestarts()
    except xmlrpc.client.Fault:  # UNKNOWN_METHOD: a template without [rpcinterface:colad]
        report["problems"].append("no watchdog in supervisord (no [rpcinterface:colad]): a FATAL role stays down")
        return
    except (OSError, xmlrpc.client.Error, http.client.HTTPException) as exc:
        report["problems"].append(f"watchdog not answering in supervisord: {exc}")
        return
    report["restarts"] = [r for r in restarts if isinstance(r, dict)] if isinstance(restarts, list) else []


def exit_code(report: dict[str, Any]) -> int:
    """3 not running, 1 degraded, 4 still starting (nothing wrong, not registered yet), else 0 (pure)."""
    if not report["running"]:
        return EXIT_NOT_RUNNING
    if report["problems"]:
        return EXIT_DEGRADED
    return EXIT_STARTING if report.get("waiting") else 0


def render(report: dict[str, Any]) -> str:
    lines = [f"{'PROCESS':<15}{'STATE':<10}{'PID':>8}  UPTIME"]
    for name, info in sorted(report["processes"].items()):
        lines.append(f"{name:<15}{info['state']:<10}{info['pid']:>8}  {int(info['uptime'])}s")
    plugin = report.get("plugin")
    # report["plugin"] is the file as written (for --json); collect() has read it with from_json already.
    for r in statefile.from_json(plugin).resources if plugin else ():
        since = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(r.since))
        lines.append("")
        lines.append(f"resource:   {r.name}")
        lines.append(f"registered: {'yes' if r.registered else 'no'} ({r.state} since {since})")
        lines.append(f"endpoint:   {r.endpoint or '-'}")
        replicas = f", {r.replicas} replicas each" if r.replicas > 1 else ""
        lines.append(f"devices:    {r.devices} ({r.healthy} healthy{replicas})")
        lines.append(f"streams:    {r.streams}")
        lines += _render_sick(r.sick)
    lines += _render_in_use(report.get("in_use"))
    if report.get("starting"):
        lines.append("")
        lines.append(f"starting:   {', '.join(report['starting'])} (within supervisord's startsecs; not a problem)")
    for r in report.get("restarts", ()):
        lines.append(
            f"restart: {r.get('name')} in {r.get('in_s')}s by the watchdog (FATAL {r.get('fatal_in_a_row')} in a row)"
        )
    for waiting in report.get("waiting", ()):
        lines.append(f"waiting: {waiting}")
    for text in statefile.from_json(plugin).degraded if plugin else ():
        lines.append(f"degraded: {text}")
    for problem in report["problems"]:
        lines.append(f"problem: {problem}")
    return "\n".join(lines)


def _render_sick(sick: statefile.SickList) -> list[str]:
    """A line per Unhealthy device the state file lists (at most 50), and a count of the rest."""
    lines = []
    for d in sick.listed:
        why = f"malformed device file: {d.reason}" if d.malformed else d.reason or "no reason given"
        # A probe's output may hold terminal escapes: shown escaped, never interpreted.
        why = "".join(c if c.isprintable() else repr(c)[1:-1] for c in why)
        lines.append(f"unhealthy:  {d.device_id}: {why}")
    if sick.more:
        lines.append(f"unhealthy:  ... and {sick.more} more (the state file lists the first by ID)")
    return lines


def _render_in_use(view: dict[str, Any] | None) -> list[str]:
    if not view:
        return []
    if not view.get("available"):
        return ["", f"in-use view: unavailable ({view.get('reason') or 'unknown'})"]
    holders = view.get("holders") or []
    updated = view.get("updated")
    as_of = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(updated)) if updated is not None else "-"
    lines = ["", f"in use:     {len({(h['resource'], h['device_id']) for h in holders})} devices (as of {as_of})"]
    if not holders:
        return lines
    table = [("RESOURCE", "DEVICE", "NAMESPACE/POD", "CONTAINER")] + [
        (h["resource"], h["device_id"], f"{h['namespace']}/{h['pod']}", h["container"]) for h in holders
    ]
    widths = [max(len(row[i]) for row in table) for i in range(3)]
    for row in table:
        lines.append("  ".join(cell.ljust(width) for cell, width in zip(row[:3], widths, strict=True)) + "  " + row[3])
    return lines


def main(args: Any = None, cfg: Config | None = None) -> int:
    assert cfg is not None
    report = collect(cfg)
    if getattr(args, "json", False):
        print(json.dumps(report, indent=2, sort_keys=True))
    else:
        print(render(report))
    sys.stdout.flush()
    return exit_code(report)
