"""systemd/colad.service: systemd accepts it, its sandbox is as docs/OPERATING.md says; it never waits for the kubelet.

`systemd-analyze verify` exits 0 even on unknown keys and bad values, so stderr must be empty.
It also insists that ExecStart's binary exists: /usr/bin/colad is there only where the .deb is
installed, so here it checks a copy whose ExecStart names this checkout's colad instead (the
unmodified, installed unit is verified in the booted container by tests/e2e/test_deb.py).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from colad.config.config import Config
from tests.limits import plugin_fd_budget, task_budget

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[3]
UNIT = ROOT / "systemd" / "colad.service"
EXEC_START = "ExecStart=/usr/bin/colad supervise"
# `systemd-analyze security` with systemd 252 (bookworm); docs/OPERATING.md quotes it.
EXPOSURE = "1.7 OK"


def settings() -> dict[str, list[str]]:
    """Every Key=value of the unit, in order, comments and sections left out."""
    found: dict[str, list[str]] = {}
    for line in UNIT.read_text().splitlines():
        if line and not line.startswith(("#", ";", "[")):
            key, _, value = line.partition("=")
            found.setdefault(key, []).append(value)
    return found


def test_systemd_analyze_verify_is_silent(tmp_path: Path) -> None:
    colad = Path(sys.executable).parent / "colad"
    assert colad.is_file(), "colad is not installed in this venv: run `make setup`"
    text = UNIT.read_text()
    assert text.count(EXEC_START) == 1
    unit = tmp_path / UNIT.name
    text = text.replace(EXEC_START, f"ExecStart={colad} supervise")
    unit.write_text(text.replace("ExecReload=/usr/bin/colad reload", f"ExecReload={colad} reload"))
    # Documentation=man:colad(8) is checked too: man must find the page this tree ships.
    (tmp_path / "man" / "man8").mkdir(parents=True)
    shutil.copy(ROOT / "man" / "colad.8", tmp_path / "man" / "man8" / "colad.8")
    env = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "MANPATH": str(tmp_path / "man"), "LANG": "C.UTF-8"}
    result = subprocess.run(
        ["systemd-analyze", "verify", str(unit)], capture_output=True, text=True, env=env, timeout=60
    )
    assert (result.returncode, result.stderr) == (0, ""), result.stderr


def test_security_exposure_is_the_one_the_operating_guide_quotes() -> None:
    result = subprocess.run(
        ["systemd-analyze", "security", "--offline=yes", "--no-pager", str(UNIT)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    match = re.search(r"Overall exposure level for colad\.service: (\d+\.\d+ \w+)", result.stdout)
    assert match, result.stdout
    assert match.group(1) == EXPOSURE, result.stdout
    guide = (ROOT / "docs" / "OPERATING.md").read_text()
    assert f"exposure level **{EXPOSURE}**" in guide


def test_never_ordered_after_or_bound_to_the_kubelet() -> None:
    # colad must already watch for kubelet.sock when the kubelet starts (see the unit's comment).
    unit = settings()
    for key in ("After", "Requires", "Requisite", "BindsTo", "PartOf", "Wants", "Upholds"):
        assert not any("kubelet" in value for value in unit.get(key, [])), f"{key}={unit[key]}"


def test_runs_supervise_and_restarts_on_failure() -> None:
    unit = settings()
    assert unit["ExecStart"] == ["/usr/bin/colad supervise"]
    assert unit["Restart"] == ["on-failure"]
    assert unit["Documentation"] == ["man:colad(8)"]
    assert unit["WantedBy"] == ["multi-user.target"]


def test_writes_only_to_the_kubelet_directories_the_cdi_directory_and_its_run_directory() -> None:
    unit = settings()
    assert unit["ProtectSystem"] == ["strict"]
    # DRA mode's two: the registration socket's directory, and the driver's own one under the plugins
    # directory (its DRA socket and checkpoint), as colad's defaults name them; not the whole plugins dir.
    cfg = Config()
    dra_dirs = [cfg.plugins_registry_dir, os.path.dirname(cfg.dra_plugin_socket)]
    assert dra_dirs == ["/var/lib/kubelet/plugins_registry", "/var/lib/kubelet/plugins/cola.myway5.com"]
    # '-': a missing directory must not fail the start with 226/NAMESPACE.
    assert unit["ReadWritePaths"] == ["-/var/lib/kubelet/device-plugins", "-/run/cdi", *(f"-{d}" for d in dra_dirs)]
    # They exist before the sandbox is set up for ExecStart (/run/cdi is a tmpfs, empty after a boot),
    # in either mode: `colad reload` may switch to DRA mode in the sandbox set up at start.
    assert "+/bin/mkdir -p -m 0755 /run/cdi" in unit["ExecStartPre"]
    assert f"+/bin/mkdir -p -m 0755 {dra_dirs[0]}" in unit["ExecStartPre"]
    assert f"+/bin/mkdir -p -m 0700 {dra_dirs[1]}" in unit["ExecStartPre"]
    assert (unit["RuntimeDirectory"], unit["RuntimeDirectoryMode"]) == (["colad"], ["0700"])
    assert unit["ProtectHome"] == ["yes"] and unit["PrivateTmp"] == ["yes"]
    assert unit["CapabilityBoundingSet"] == [""] and unit["NoNewPrivileges"] == ["yes"]
    # A device plugin must see the host's /dev.
    assert "PrivateDevices" not in unit
    # Unix sockets (kubelet, queue, /dev/log) and the metrics listener; nothing else.
    assert unit["RestrictAddressFamilies"] == ["AF_UNIX AF_INET AF_INET6"]


def test_task_and_file_limits_are_explicit_explained_and_hold_the_worst_case() -> None:
    unit = settings()
    tasks, files = int(unit["TasksMax"][0]), int(unit["LimitNOFILE"][0])
    assert tasks >= task_budget(), f"TasksMax={tasks} below {task_budget()}"
    assert files >= plugin_fd_budget(), f"LimitNOFILE={files} below {plugin_fd_budget()}"
    lines = UNIT.read_text().splitlines()
    for key in ("TasksMax=", "LimitNOFILE="):
        at = next(i for i, line in enumerate(lines) if line.startswith(key))
        assert lines[at - 1].startswith("#"), f"{key} has no comment explaining its value"
