"""The `colad` command's configuration handling, through real processes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.fakes.kubelet import FakeKubelet
from tests.helpers import wait_until
from tests.service import ColadService

pytestmark = pytest.mark.e2e


def run(args: list[str], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    base = {k: v for k, v in os.environ.items() if not k.startswith("COLAD_")}
    return subprocess.run(
        [sys.executable, "-m", "colad", *args], env={**base, **env}, capture_output=True, text=True, timeout=30
    )


@pytest.mark.parametrize(
    ("args", "env", "needles"),
    [
        (["supervise"], {"COLAD_LOG_LEVEL": "loud"}, ["log_level", "environment COLAD_LOG_LEVEL"]),
        (["plugin"], {"COLAD_RESOURCE_NAME": "cola"}, ["resource_name", "COLAD_RESOURCE_NAME"]),
        (["discovery", "--device-dir", "relative/dir"], {}, ["device_dir", "flag --device-dir"]),
        (["kubelet-watch"], {"COLAD_METRICS_ADDRESS": "nope"}, ["metrics_address", "COLAD_METRICS_ADDRESS"]),
        (["supervise"], {"COLAD_CONFIG": "/nonexistent/colad.toml"}, ["/nonexistent/colad.toml", "not found"]),
        (["status"], {"COLAD_RUN_DIR": "run", "COLAD_KUBELET_DIR": "k"}, ["run_dir", "kubelet_dir"]),
    ],
    ids=["env-level", "env-resource", "flag-path", "env-address", "missing-file", "two-problems"],
)
def test_bad_config_exits_2_with_one_line(args: list[str], env: dict[str, str], needles: list[str]) -> None:
    result = run(args, env)
    assert result.returncode == 2, result
    lines = result.stderr.splitlines()
    assert len(lines) == 1, result.stderr
    assert "Traceback" not in result.stderr and result.stdout == ""
    for needle in needles:
        assert needle in lines[0]


def test_bad_toml_file_names_the_file(tmp_path: Path) -> None:
    conf = tmp_path / "colad.toml"
    conf.write_text('device_dir = "/etc/colas\nlog_level = 3\n')
    result = run(["supervise"], {"COLAD_CONFIG": str(conf)})
    assert result.returncode == 2 and len(result.stderr.splitlines()) == 1
    assert str(conf) in result.stderr


def test_file_values_are_checked_and_flags_win(tmp_path: Path) -> None:
    conf = tmp_path / "colad.toml"
    conf.write_text('log_level = 3\nunknown_key = "x"\n')
    result = run(["discovery"], {"COLAD_CONFIG": str(conf)})
    assert result.returncode == 2
    assert f"log_level (file {conf})" in result.stderr and "unknown_key" in result.stderr
    # A flag overrides a bad environment value.
    ok = run(["status", "--log-level", "INFO", "--run-dir", str(tmp_path / "run")], {"COLAD_LOG_LEVEL": "loud"})
    assert ok.returncode == 3  # valid config; colad simply isn't running there


def test_check_refuses_a_timeout_that_is_not_positive(tmp_path: Path) -> None:
    result = run(["check", "--timeout", "0", "--run-dir", str(tmp_path / "run")], {})
    assert result.returncode == 2 and result.stdout == ""
    assert "--timeout" in result.stderr and "positive" in result.stderr


def json_lines(text: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in text.splitlines()]  # every stdout line must be JSON


def test_kubelet_sim_json_follows_a_real_colad(short_tmp: Path) -> None:
    service = ColadService(short_tmp)
    service.add("cocacola", "peisicola")
    sim = subprocess.Popen(
        [sys.executable, "-m", "colad", "kubelet-sim", "--json", "--once", "--allocate", "2", "--timeout", "40"],
        env=service.env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        wait_until(
            lambda: (service.kubelet_dir / "kubelet.sock").exists() or sim.poll() is not None,
            20,
            "kubelet-sim listening",
        )
        service.start()
        out, err = sim.communicate(timeout=60)
    finally:
        if sim.poll() is None:
            sim.kill()
            sim.wait(5)
        assert service.stop() == 0
    assert sim.returncode == 0, (out, err)
    events = json_lines(out)
    kinds = [e["event"] for e in events]
    assert kinds[0] == "listening" and kinds[-1] == "exit", kinds
    register = next(e for e in events if e["event"] == "register")
    assert register["ok"] is True and register["resource"] == "myway5.com/cola"
    options = next(e for e in events if e["event"] == "options")
    assert options["get_preferred_allocation_available"] is True
    full = [e for e in events if e["event"] == "devices" and len(e["devices"]) == 2]
    assert full and {d["id"] for d in full[0]["devices"]} == {"cocacola", "peisicola"}
    allocate = next(e for e in events if e["event"] == "allocate")
    assert allocate["ok"] is True and len(allocate["devices"]) == 2
    assert events[-1] == {"event": "exit", "code": 0, "reason": "allocate answered"}
    assert "proc=kubelet-sim" in err  # the log went to stderr


def test_kubelet_sim_refuses_a_live_kubelet_sock(short_tmp: Path) -> None:
    with FakeKubelet(short_tmp / "kubelet") as kubelet:
        service_env = {
            "COLAD_KUBELET_DIR": str(kubelet.plugin_dir),
            "COLAD_RUN_DIR": str(short_tmp / "run"),
            "COLAD_CONFIG": str(short_tmp / "colad.toml"),
        }
        (short_tmp / "colad.toml").write_text("")
        result = run(["kubelet-sim", "--json", "--once"], service_env)
        assert kubelet.socket_path.exists()  # left alone
    assert result.returncode == 1, result
    [event] = json_lines(result.stdout)
    assert event["event"] == "exit" and event["code"] == 1
    assert str(event["reason"]).startswith("refusing to start")
