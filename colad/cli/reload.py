"""`colad reload`: check the config, then have the running colad re-read it (SIGHUP to its processes).

colad/cli/main.py has loaded the config already (an invalid one exits 2, nothing signalled). This signals the
programs through supervisord's XML-RPC, never supervisord itself (its SIGHUP restarts them all),
and waits for the plugin to say how it was taken: asked on its status socket, or, when it cannot be
asked, from the "reload" entry of its state file.
Exit codes: 0 applied; 1 refused or not confirmed in time; 2 invalid config; 3 colad is not running.
"""

from __future__ import annotations

import sys
import time
import xmlrpc.client
from typing import Any

from colad.config.config import Config
from colad.health.supervisor import supervisor_proxy
from colad.outputs import statefile
from colad.plugin import status_socket

GROUP = "colad"  # [group:colad] in conf/supervisord.conf
CONFIRM_TIMEOUT = 10.0


def last_reload(cfg: Config) -> statefile.ReloadResult | None:
    """How the plugin took the last reload: its own answer, else its state file (which a full run dir freezes)."""
    try:
        body, _pid = status_socket.ask(cfg.status_socket)
        return statefile.from_json(body).reload
    except (status_socket.NoAnswer, statefile.StateFileError):
        return statefile.read_reload(cfg.plugin_state_file)


def main(args: Any = None, cfg: Config | None = None) -> int:
    assert cfg is not None
    before = last_reload(cfg)
    try:
        supervisor_proxy(cfg.supervisor_socket).supervisor.signalProcessGroup(GROUP, "HUP")
    except (OSError, xmlrpc.client.Error) as exc:
        print(f"colad reload: colad is not running ({cfg.supervisor_socket}: {exc})", file=sys.stderr)
        return 3
    deadline = time.monotonic() + CONFIRM_TIMEOUT
    while time.monotonic() < deadline:
        result = last_reload(cfg)
        if result is not None and (before is None or result.at != before.at):
            if result.ok:
                named = {"added": result.added, "removed": result.removed, "changed": result.changed}
                parts = [f"{key}={','.join(names) or '-'}" for key, names in named.items()]
                deferred = ",".join(result.deferred)
                print("colad reload: applied: " + " ".join(parts) + (f" (at restart: {deferred})" if deferred else ""))
                return 0
            print(f"colad reload: refused, the running config stays: {result.reason}", file=sys.stderr)
            return 1
        time.sleep(0.05)
    print(f"colad reload: signalled, but the plugin did not confirm within {CONFIRM_TIMEOUT:.0f}s", file=sys.stderr)
    return 1
