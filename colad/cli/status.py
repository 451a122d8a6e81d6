"""`colad status`: each process' state, whether the plugin is registered, the device count, and who holds each device.

Reads supervisord's XML-RPC on <run_dir>/supervisor.sock and asks the plugin itself on its status
socket (status_socket.py): its verdict is the one /healthz gives (colad.health.rule.assess). Only when the
plugin cannot be asked is its state file shown, with its age and writer, and never as healthy. Also
reads the in-use view (state/inuse.json), which never changes the exit code: 0 healthy (as /healthz
200); 1 degraded; 3 colad is not running; 4 starting: not registered yet, for no reason but the start.
"""

from __future__ import annotations

import http.client
import json
import sys
import time
import xmlrpc.client
from typing import Any

from colad.config.config import Config
from colad.core import inuse
from colad.health.rule import STARTING, RoleView, dra_registration_problem, role_view, slices_problem
from colad.health.supervisor import restarts, supervisor_proxy
from colad.outputs import statefile
from colad.outputs.statefile import StateFileError, StateFileMissing
from colad.plugin import status_socket
from colad.plugin.status_socket import NoAnswer
from colad.runtime import procid

EXIT_DEGRADED, EXIT_NOT_RUNNING, EXIT_STARTING = 1, 3, 4


def collect(cfg: Config) -> dict[str, Any]:
    report = _collect_processes(cfg)
    report["in_use"] = read_in_use(cfg) if report["running"] else _in_use_unavailable("colad is not running")
    return report


def _in_use_unavailable(reason: str) -> dict[str, Any]:
    return {"available": False, "reason": reason, "updated": None, "holders": []}


def read_in_use(cfg: Config) -> dict[str, Any]:
    """The plugin's in-use view, tolerant of a missing, partial or foreign file."""
    try:
        raw = statefile.read_raw(cfg.inuse_state_file)
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
        "running": False,
        "processes": {},
        "plugin": None,
        "source": None,
        "health": None,
        "ready": None,
        "problems": [],
        "starting": [],
        "waiting": [],
        "restarts": [],
    }
    proxy = supervisor_proxy(cfg.supervisor_socket)
    try:
        infos = proxy.supervisor.getAllProcessInfo()
    except (OSError, xmlrpc.client.Error, http.client.HTTPException) as exc:
        report["problems"].append(f"supervisord not reachable on {cfg.supervisor_socket}: {exc}")
        return report
    report["running"] = True
    report["restarts"], watchdog = restarts(proxy)
    for info in infos:
        uptime = info["now"] - info["start"] if info["pid"] else 0
        report["processes"][info["name"]] = {"state": info["statename"], "pid": info["pid"], "uptime": uptime}
    roles = role_view(infos, watchdog=watchdog)
    report["starting"] = list(roles.starting)
    plugin = report["processes"].get("plugin", {})
    try:
        body, answered_by = status_socket.ask(cfg.status_socket)
    except NoAnswer as exc:
        _from_file(cfg, report, roles, str(exc))
        return report
    if answered_by != plugin.get("pid"):
        why = f"{cfg.status_socket} answered by pid {answered_by}, not supervisord's plugin (pid {plugin.get('pid')})"
        _from_file(cfg, report, roles, why)
        return report
    _from_live(report, body, answered_by)
    return report


def _from_live(report: dict[str, Any], body: dict[str, Any], pid: int) -> None:
    """The plugin's own answer: its state, and its verdict as the only judge of health (as on /healthz)."""
    health, ready = body.pop("health", None), body.pop("ready", None)
    try:
        statefile.from_json(body)
        if not isinstance(health, dict) or not isinstance(ready, dict):
            raise StateFileError("no health or readiness in it")
    except StateFileError as exc:
        report["problems"].append(f"plugin's status answer not understood: {exc}")
        return
    report["plugin"], report["health"], report["ready"] = body, health, ready
    report["source"] = {"live": True, "pid": pid}
    report["problems"] += [str(p) for p in health.get("problems") or ()]
    report["waiting"] += [str(w) for w in health.get("waiting") or ()]
    if not health.get("ok") and not report["problems"] and not report["waiting"]:
        report["problems"].append(str(health.get("reason") or "plugin unhealthy, no reason given"))


def _from_file(cfg: Config, report: dict[str, Any], roles: RoleView, why: str) -> None:
    """The plugin could not be asked: never healthy. The state file is shown, with its age and writer."""
    report["problems"] += roles.problems
    plugin = report["processes"].get("plugin", {})
    if plugin.get("state") == STARTING:
        report["waiting"].append(f"plugin not answering yet: {why}")
    elif plugin.get("state") == "RUNNING":
        stopped = " (the process is stopped)" if procid.run_state(int(plugin.get("pid") or 0)) in ("T", "t") else ""
        report["problems"].append(f"plugin not answering: {why}{stopped}")
    try:
        raw = statefile.read_raw(cfg.plugin_state_file)
        statefile.from_json(raw)
    except StateFileError as exc:
        report["source"] = {"live": False, "note": str(exc)}
        return
    stamp = statefile.stamp_of(raw)
    report["plugin"] = raw
    report["source"] = {"live": False, "age_s": stamp.age(), "writer": _writer_note(stamp, plugin.get("pid"))}


def _writer_note(stamp: statefile.Stamp, plugin_pid: object) -> str:
    """Who wrote the state file, as it bears on trusting it: this plugin, an earlier one, another boot."""
    who = stamp.writer
    if who is None:
        return "a colad that did not record its writer"
    if who.boot_id != procid.boot_id():
        return f"pid {who.pid} of an earlier boot"
    if not procid.alive(who):
        return f"pid {who.pid}, which has exited"
    if who.pid != plugin_pid:
        return f"pid {who.pid}, not supervisord's plugin (pid {plugin_pid})"
    return f"pid {who.pid}, the running plugin"


def exit_code(report: dict[str, Any]) -> int:
    """3 not running, 1 degraded, 4 still starting (nothing wrong, not registered yet), else 0 (pure)."""
    if not report["running"]:
        return EXIT_NOT_RUNNING
    if report["problems"]:
        return EXIT_DEGRADED
    return EXIT_STARTING if report.get("waiting") else 0


def render_status(report: dict[str, Any]) -> str:
    lines = [f"{'PROCESS':<15}{'STATE':<10}{'PID':>8}  UPTIME"]
    for name, info in sorted(report["processes"].items()):
        lines.append(f"{name:<15}{info['state']:<10}{info['pid']:>8}  {int(info['uptime'])}s")
    plugin = report.get("plugin")
    lines += _render_source(report.get("source"), report.get("ready"))
    stale = "" if (report.get("source") or {}).get("live") else "; from the state file, not live"
    # report["plugin"] is the answer or the file as written (for --json); collect() has read it with from_json.
    state = statefile.from_json(plugin) if plugin else None
    if state is not None and state.dra_driver:
        lines.append("")
        lines.append(
            f"mode:       dra (driver {state.dra_driver}, registration {state.dra_registration or '-'}{stale})"
        )
        lines += _render_dra(state)
    for r in state.resources if state else ():
        since = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(r.since))
        lines.append("")
        lines.append(f"resource:   {r.name}")
        error = f": {r.last_error}" if r.last_error and not r.registered else ""
        lines.append(f"registered: {'yes' if r.registered else 'no'} ({r.state} since {since}{error}{stale})")
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
    for text in state.degraded if state else ():
        lines.append(f"degraded: {text}")
    for problem in report["problems"]:
        lines.append(f"problem: {problem}")
    return "\n".join(lines)


def _render_source(source: dict[str, Any] | None, ready: dict[str, Any] | None) -> list[str]:
    """Where the plugin's state below comes from: its own answer now, or a state file of some age."""
    if not source:
        return []
    if source.get("live"):
        said = "yes" if (ready or {}).get("ok") else f"no: {(ready or {}).get('reason') or '-'}"
        return ["", f"source:     the plugin (pid {source.get('pid')}), asked now", f"ready:      {said}"]
    if "writer" not in source:
        return ["", f"source:     none: the plugin does not answer and {source.get('note')}"]
    age = source.get("age_s")
    when = f"written {age:.0f}s ago" if isinstance(age, int | float) else "written at an unknown time"
    return ["", f"source:     the state file, {when} by {source['writer']}: NOT LIVE, the plugin did not answer"]


def _render_dra(state: statefile.PluginState) -> list[str]:
    """The DRA side: why not registered, this node's slices and how current, claims, the last API error."""
    lines = []
    if unregistered := dra_registration_problem(state):
        lines.append(f"registered: no: {unregistered}")
    s = state.dra_slices
    current = "current" if s.current else slices_problem(s).removeprefix("slices ")
    lines.append(f"slices:     {s.slices} published, {s.devices} devices, {current}")
    lines.append(f"claims:     {state.dra_claims} prepared")
    if s.failing:
        lines.append(f"api error:  {s.failing} (failing now)")
    else:
        lines.append(f"api error:  {s.last_error + ' (answered since)' if s.last_error else 'none'}")
    return lines


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
        print(render_status(report))
    sys.stdout.flush()
    return exit_code(report)
