"""`colad status`: each process' state, whether the plugin is registered, and the device count.

Reads: supervisord's XML-RPC interface on <run_dir>/supervisor.sock and the
plugin's state file. Writes: a table (or JSON) to stdout.
Exit codes: 0 all running and registered; 1 running but degraded; 3 colad is not running.
"""

from __future__ import annotations

import json
import sys
import time
import xmlrpc.client
from typing import Any

from colad.config import Config

PROGRAMS = ("plugin", "discovery", "kubelet-watch")


def supervisor_proxy(socket_path: str) -> Any:
    from supervisor.xmlrpc import SupervisorTransport

    transport = SupervisorTransport(None, None, serverurl="unix://" + socket_path)
    return xmlrpc.client.ServerProxy("http://127.0.0.1", transport=transport)


def collect(cfg: Config) -> dict[str, Any]:
    report: dict[str, Any] = {"running": False, "processes": {}, "plugin": None, "problems": []}
    try:
        infos = supervisor_proxy(cfg.supervisor_socket).supervisor.getAllProcessInfo()
    except (OSError, xmlrpc.client.Error) as exc:
        report["problems"].append(f"supervisord not reachable on {cfg.supervisor_socket}: {exc}")
        return report
    report["running"] = True
    for info in infos:
        uptime = info["now"] - info["start"] if info["pid"] else 0
        report["processes"][info["name"]] = {"state": info["statename"], "pid": info["pid"], "uptime": uptime}
    for name in PROGRAMS:
        state = report["processes"].get(name, {}).get("state", "MISSING")
        if state != "RUNNING":
            report["problems"].append(f"{name} is {state}")
    try:
        with open(cfg.plugin_state_file, encoding="utf-8") as handle:
            plugin = json.load(handle)
    except (OSError, ValueError) as exc:
        report["problems"].append(f"plugin state unknown: {exc}")
        return report
    plugin_pid = report["processes"].get("plugin", {}).get("pid")
    if plugin.get("pid") != plugin_pid:
        report["problems"].append("plugin state file is from an earlier plugin process")
        plugin["registered"] = False
    report["plugin"] = plugin
    if not plugin.get("registered"):
        report["problems"].append(f"plugin not registered ({plugin.get('state')}: {plugin.get('last_error') or '-'})")
    return report


def render(report: dict[str, Any]) -> str:
    lines = [f"{'PROCESS':<15}{'STATE':<10}{'PID':>8}  UPTIME"]
    for name, info in sorted(report["processes"].items()):
        lines.append(f"{name:<15}{info['state']:<10}{info['pid']:>8}  {int(info['uptime'])}s")
    plugin = report.get("plugin")
    if plugin:
        since = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(plugin.get("since", 0)))
        lines.append("")
        lines.append(f"resource:   {plugin.get('resource_name')}")
        lines.append(f"registered: {'yes' if plugin.get('registered') else 'no'} ({plugin.get('state')} since {since})")
        lines.append(f"endpoint:   {plugin.get('endpoint') or '-'}")
        lines.append(f"devices:    {plugin.get('devices')} ({plugin.get('healthy')} healthy)")
        lines.append(f"streams:    {plugin.get('streams')}")
    for problem in report["problems"]:
        lines.append(f"problem: {problem}")
    return "\n".join(lines)


def main(args: Any = None, cfg: Config | None = None) -> int:
    assert cfg is not None
    report = collect(cfg)
    if getattr(args, "json", False):
        print(json.dumps(report, indent=2, sort_keys=True))
    else:
        print(render(report))
    sys.stdout.flush()
    if not report["running"]:
        return 3
    return 1 if report["problems"] else 0


