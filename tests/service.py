"""Runs the real colad under the real supervisord, the way an operator (or systemd) does.

`ColadService` starts `python -m colad supervise` with COLAD_* variables
pointing into a temporary root, waits on supervisord's XML-RPC interface, and
gives tests the processes' pids, the log, and helpers to kill things.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import xmlrpc.client
from pathlib import Path
from typing import Any

from colad.status import supervisor_proxy
from tests.helpers import wait_until

PROGRAMS = ("plugin", "discovery", "kubelet-watch")


class ColadService:
    def __init__(self, root: Path, *, extra_env: dict[str, str] | None = None, python: str = sys.executable) -> None:
        """`python` runs colad: the venv's by default, or Debian's /usr/bin/python3 with bookworm's packages."""
        self.root = root
        self.python = python
        self.device_dir = root / "colas"
        self.kubelet_dir = root / "kubelet"
        self.run_dir = root / "run"
        self.log_path = root / "colad.log"
        self.device_dir.mkdir(parents=True, exist_ok=True)
        self.env = {k: v for k, v in os.environ.items() if not k.startswith("COLAD_")}
        (root / "colad.toml").write_text("# empty: defaults < this file < COLAD_* < flags\n")
        self.env.update(
            {
                "COLAD_CONFIG": str(root / "colad.toml"),
                "COLAD_DEVICE_DIR": str(self.device_dir),
                "COLAD_KUBELET_DIR": str(self.kubelet_dir),
                "COLAD_RUN_DIR": str(self.run_dir),
                "COLAD_METRICS_ADDRESS": "127.0.0.1:0",
                "COLAD_LOG_LEVEL": "DEBUG",
            }
        )
        if python != sys.executable:
            # Run this checkout's colad on another interpreter's own packages.
            self.env["PYTHONPATH"] = str(Path(__file__).resolve().parent.parent)
            self.env.pop("VIRTUAL_ENV", None)
        self.env.update(extra_env or {})
        self.proc: subprocess.Popen[bytes] | None = None
        self.log_mark = 0  # tests sharing one service read the log from here on

    # Life cycle
    def start(self) -> None:
        log = open(self.log_path, "ab")  # O_APPEND: supervisord's children reopen /dev/stdout
        self.proc = subprocess.Popen(
            [self.python, "-m", "colad", "supervise"],
            env=self.env,
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
        log.close()
        self.wait_running()

    def stop(self, timeout: float = 20.0) -> int | None:
        if self.proc is None:
            return None
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(5)
        return self.proc.returncode

    def rpc(self) -> Any:
        return supervisor_proxy(str(self.run_dir / "supervisor.sock"))

    def states(self) -> dict[str, tuple[str, int]]:
        try:
            infos = self.rpc().supervisor.getAllProcessInfo()
        except (OSError, xmlrpc.client.Error):
            return {}
        return {i["name"]: (i["statename"], i["pid"]) for i in infos}

    def wait_running(self, timeout: float = 20.0, *, exclude_pids: dict[str, int] | None = None) -> dict[str, int]:
        """Wait until all three programs are RUNNING (with new pids, if `exclude_pids` is given)."""
        exclude = exclude_pids or {}

        def ready() -> dict[str, int] | None:
            if self.proc is not None and self.proc.poll() is not None:
                raise AssertionError(f"colad supervise exited with {self.proc.returncode}")
            states = self.states()
            if all(states.get(p, ("", 0))[0] == "RUNNING" and states[p][1] != exclude.get(p) for p in PROGRAMS):
                return {p: states[p][1] for p in PROGRAMS}
            return None

        return wait_until(ready, timeout, "all colad programs RUNNING", logs=[self.log_path])

    def pids(self) -> dict[str, int]:
        return {name: pid for name, (_, pid) in self.states().items()}

    def supervisord_pid(self) -> int:
        return int((self.run_dir / "supervisord.pid").read_text())

    def kill(self, program: str, sig: int = signal.SIGKILL) -> int:
        pid = self.pids()[program]
        os.kill(pid, sig)
        return pid

    # Devices
    def add(self, *names: str) -> None:
        for name in names:
            (self.device_dir / name).write_bytes(b"")

    def remove(self, *names: str) -> None:
        for name in names:
            (self.device_dir / name).unlink()

    def device_ids(self) -> set[str]:
        return {p.name for p in self.device_dir.iterdir() if p.is_file() and not p.is_symlink()}

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def log_lines(self, needle: str) -> list[str]:
        return [line for line in self.log().splitlines() if needle in line]

    def wait_log(self, needle: str, timeout: float = 10.0, count: int = 1) -> list[str]:
        return wait_until(
            lambda: (lines := self.log_lines(needle)) and len(lines) >= count and lines,
            timeout,
            f"{count}x {needle!r} in the colad log",
            logs=[self.log_path],
        )
