"""What each role imports on its way to work (footprint): nothing it does not use.

Each case starts a fresh interpreter, imports what `colad <role>` imports (the CLI, the role module)
and loads the default config as main() does, then lists sys.modules. A module named here costs every
node its memory (and every start its import time) in a process that never calls it.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration
REPO = Path(__file__).resolve().parents[3]

# The plugin's and discovery's: gRPC, protobuf, prometheus, the device model, the queue server.
NOT_IN_SMALL_ROLES = (
    "grpc",
    "google.protobuf",
    "prometheus_client",
    "colad.core.allocation",
    "colad.outputs.cdi",
    "colad.outputs.nfd",
    "colad.outputs.statefile",
    "colad.queue.server",
    "colad.queue.snapshots",
    "colad.outputs.socketpath",
    "xmlrpc.client",
    "http.client",
)
CASES = {
    # It encodes a KubeletState only: messages.py imports device_wire (the device model, hashlib) on first device use.
    "kubelet-watch": ("colad.kubelet_watch.main", NOT_IN_SMALL_ROLES + ("colad.core.devices", "hashlib")),
    # pyinotify's own import brings tempfile (ctypes.util): only where inotify is used.
    "supervise": (
        "colad.supervise.main",
        NOT_IN_SMALL_ROLES + ("pyinotify", "tempfile", "colad.core.devices", "colad.watchers.loop"),
    ),
}


def loaded(module: str, tmp_path: Path, config_text: str = "") -> set[str]:
    """sys.modules of a fresh interpreter that imported the CLI and `module`, then loaded a config of `config_text`."""
    (tmp_path / "colad.toml").write_text(config_text)
    code = (
        f"import sys, colad.cli.main, {module}\n"
        "from colad.config import config\n"
        "config.load({})\n"
        "print(' '.join(sorted(sys.modules)))\n"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("COLAD_")}
    env["COLAD_CONFIG"] = str(tmp_path / "colad.toml")
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, env=env, capture_output=True, text=True, check=True)
    return set(out.stdout.split())


@pytest.mark.parametrize("role", sorted(CASES))
def test_a_small_role_imports_nothing_it_does_not_use(role: str, tmp_path: Path) -> None:
    module, unwanted = CASES[role]
    modules = loaded(module, tmp_path)
    assert module in modules
    assert sorted(m for m in unwanted if m in modules) == []


# What supervisord has loaded when it calls the rpcinterface factories (supervisor/http.py make_http_servers).
SUPERVISORD_LOADS = (
    "import supervisor.supervisord, supervisor.http, supervisor.rpcinterface, supervisor.xmlrpc, supervisor.web"
)
# The watchdog runs inside supervisord for the node's whole life: the log format (stdlib logging) and itself.
WATCHDOG_ADDS = {
    "colad",
    "colad.runtime",
    "colad.runtime.log",
    "colad.supervise",
    "colad.supervise.watchdog",
    "logging",
    "atexit",
    "encodings.unicode_escape",
}


def test_the_watchdog_adds_to_supervisord_only_itself_and_the_log_format() -> None:
    code = (
        f"import sys\n{SUPERVISORD_LOADS}\nbefore = set(sys.modules)\n"
        "from colad.supervise import watchdog\n"
        "watchdog.make_rpcinterface(object(), 'INFO')\n"  # subscribes, logs its first line
        "print('MODULES', ' '.join(sorted(set(sys.modules) - before)))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, check=True)
    added = set(out.stdout.rsplit("MODULES", 1)[1].split())
    assert "colad.supervise.watchdog" in added
    assert sorted(added - WATCHDOG_ADDS) == []  # e.g. dataclasses would bring inspect, ast, dis: ~0.9 MiB
