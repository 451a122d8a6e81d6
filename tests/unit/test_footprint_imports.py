"""What each role imports on its way to work (issue 14, footprint): nothing it does not use.

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

from colad import allocation, names

pytestmark = pytest.mark.unit
REPO = Path(__file__).resolve().parents[2]

# The plugin's and discovery's: gRPC, protobuf, prometheus, the device model, the queue server.
NOT_IN_SMALL_ROLES = (
    "grpc",
    "google.protobuf",
    "prometheus_client",
    "colad.allocation",
    "colad.cdi",
    "colad.nfd",
    "colad.statefile",
    "colad.queue",
    "colad.snapshots",
    "colad.socketpath",
    "xmlrpc.client",
    "http.client",
)
CASES = {
    # pyinotify's own import brings tempfile (ctypes.util): only where inotify is used.
    "watchdog": ("colad.watchdog", NOT_IN_SMALL_ROLES + ("pyinotify", "tempfile", "colad.devices", "colad.messages")),
    # It encodes a KubeletState only: messages.py imports device_wire (the device model, hashlib) on first device use.
    "kubelet-watch": ("colad.kubelet_watch", NOT_IN_SMALL_ROLES + ("colad.devices", "hashlib")),
    "supervise": ("colad.supervise", NOT_IN_SMALL_ROLES + ("pyinotify", "tempfile", "colad.devices", "colad.watch")),
}


def loaded(module: str, tmp_path: Path) -> set[str]:
    (tmp_path / "colad.toml").write_text("")
    code = (
        f"import sys, colad.cli, {module}\n"
        "from colad import config\n"
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


def test_the_replica_policies_config_checks_are_the_ones_allocation_applies() -> None:
    # names.py holds them so that loading a config does not import the allocation core.
    assert allocation.REPLICA_POLICIES == names.REPLICA_POLICIES
    assert allocation.DEFAULT_REPLICA_POLICY == names.DEFAULT_REPLICA_POLICY
