"""`colad check` against a real colad under supervisord, a dead socket, and an empty kubelet directory."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from tests.fakes.kubelet import FakeKubelet
from tests.service import ColadService

pytestmark = pytest.mark.e2e

DEVICES = {"cocacola", "peisicola"}


def check(env: dict[str, str], *args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "colad", "check", *args], env=env, capture_output=True, text=True, timeout=timeout
    )


def env_for(root: Path, kubelet_dir: Path | None = None) -> dict[str, str]:
    """colad's environment for a root with no colad running: an empty config file, no COLAD_* from outside."""
    config = root / "colad.toml"
    config.write_text("")
    base = {k: v for k, v in os.environ.items() if not k.startswith("COLAD_")}
    return {
        **base,
        "COLAD_CONFIG": str(config),
        "COLAD_KUBELET_DIR": str(kubelet_dir or root / "kubelet"),
        "COLAD_RUN_DIR": str(root / "run"),
    }


def settled(colad: ColadService, kubelet: FakeKubelet) -> str:
    kubelet.wait_registered(timeout=15)
    kubelet.wait_devices(DEVICES, timeout=15)
    endpoint = kubelet.current_endpoint()
    assert endpoint is not None
    return str(colad.kubelet_dir / endpoint)


def assert_every_device_allocated(report: dict[str, Any], socket_path: str) -> None:
    assert report["ok"] is True and report["reason"], report
    [sock] = report["sockets"]
    assert sock["socket"] == socket_path and sock["error"] == "" and sock["dead"] is False
    assert sock["resource"] == "myway5.com/cola"
    assert sock["options"] == {"pre_start_required": False, "get_preferred_allocation_available": True}
    assert {d["id"] for d in sock["devices"]} == DEVICES
    for device in sock["devices"]:
        assert device["health"] == "Healthy" and device["numa_nodes"] == []
        allocate = device["allocate"]
        assert allocate["ok"] is True and allocate["error"] == "", device
        assert allocate["envs"]["COLA_DEVICES"] == device["id"]
    assert len(sock["preferred"]) == 1 and sock["preferred"][0] in DEVICES


def test_check_reports_every_device_and_allocates_each(colad: ColadService, kubelet: FakeKubelet) -> None:
    socket_path = settled(colad, kubelet)
    registrations = len(kubelet.successful_registrations())

    result = check(colad.env, "--json")
    assert result.returncode == 0, result
    assert result.stderr == ""
    assert_every_device_allocated(json.loads(result.stdout), socket_path)

    # The same socket named with --socket, and the table form.
    single = check(colad.env, "--json", "--socket", socket_path)
    assert single.returncode == 0, single
    assert_every_device_allocated(json.loads(single.stdout), socket_path)
    table = check(colad.env)
    assert table.returncode == 0, table
    assert socket_path in table.stdout and "myway5.com/cola" in table.stdout
    for device_id in DEVICES:
        line = next(x for x in table.stdout.splitlines() if x.split()[:1] == [device_id])
        assert "Healthy" in line and f"ok COLA_DEVICES={device_id}" in line

    # check only looks: the kubelet keeps its one stream and registration, and its list is unchanged.
    assert kubelet.stream_alive() and kubelet.live_streams() == 1
    assert len(kubelet.successful_registrations()) == registrations
    assert kubelet.devices() == {d: "Healthy" for d in DEVICES}


def test_check_of_a_stopped_colad_exits_3(colad: ColadService, kubelet: FakeKubelet) -> None:
    socket_path = settled(colad, kubelet)
    assert colad.stop() == 0
    assert not os.path.exists(socket_path)  # a clean stop removes its socket
    result = check(colad.env)
    assert result.returncode == 3, result
    assert result.stderr.splitlines() == [f"colad check: no colad socket in {colad.kubelet_dir} (is colad running?)"]
    named = check(colad.env, "--socket", socket_path, "--json")
    assert named.returncode == 3, named
    assert json.loads(named.stdout)["sockets"][0]["dead"] is True
    assert named.stderr.splitlines() == [f"colad check: {socket_path}: no such file (is colad running?)"]


def test_check_of_a_dead_socket_exits_3_with_the_reason(short_tmp: Path, kubelet: FakeKubelet) -> None:
    dead = kubelet.plugin_dir / "colad-1700000000000.sock"
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.bind(str(dead))  # bound, then closed: the file stays and nobody listens, as after a SIGKILL
    result = check(env_for(short_tmp), "--json")
    assert result.returncode == 3, result
    assert result.stderr.splitlines() == [f"colad check: {dead}: connection refused (is colad running?)"]
    report = json.loads(result.stdout)
    assert report["ok"] is False and "connection refused" in report["reason"]
    [sock] = report["sockets"]
    assert sock["socket"] == str(dead) and sock["dead"] is True and sock["devices"] is None


def test_check_with_no_colad_socket_exits_3(short_tmp: Path, kubelet: FakeKubelet) -> None:
    # kubelet.sock and the checkpoint are there; no colad socket is.
    (kubelet.plugin_dir / "other-vendor.sock").write_bytes(b"")
    result = check(env_for(short_tmp), "--json")
    assert result.returncode == 3, result
    assert json.loads(result.stdout) == {
        "ok": False,
        "reason": f"no colad socket in {kubelet.plugin_dir} (is colad running?)",
        "sockets": [],
    }
    assert len(result.stderr.splitlines()) == 1
    missing = check(env_for(short_tmp, short_tmp / "nowhere"))
    assert missing.returncode == 3 and missing.stdout == "" and "no colad socket" in missing.stderr


def test_check_of_a_silent_socket_ends_at_its_deadlines(short_tmp: Path) -> None:
    """Something accepts connections but never speaks: every call gives up at --timeout, exit 1."""
    kubelet_dir = short_tmp / "kubelet"
    kubelet_dir.mkdir()
    path = kubelet_dir / "colad-1.sock"
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as silent:
        silent.bind(str(path))
        silent.listen(16)
        started = time.monotonic()
        result = check(env_for(short_tmp), "--json", "--timeout", "0.5", timeout=30)
        elapsed = time.monotonic() - started
    assert result.returncode == 1, result
    [sock] = json.loads(result.stdout)["sockets"]
    assert sock["dead"] is False and sock["devices"] is None
    assert "ListAndWatch sent nothing within 0.5 s" in sock["problems"]
    assert elapsed < 20, elapsed  # two deadlines and an interpreter start, not a hang
    assert result.stderr.startswith(f"colad check: {path}: ") and len(result.stderr.splitlines()) == 1
