"""The `colad` command's configuration handling, through real processes."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

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
