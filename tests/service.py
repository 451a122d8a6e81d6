"""Runs the real colad under the real supervisord, the way an operator (or systemd) does.

`ColadService` starts `python -m colad supervise` with COLAD_* variables
pointing into a temporary root, waits on supervisord's XML-RPC interface, and
gives tests the processes' pids, the log, and helpers to kill things. Every
started service is guarded (see `Guard`): a role that restarts unasked, or a
traceback in a colad log, fails the test that was running.
"""

from __future__ import annotations

import math
import os
import re
import signal
import subprocess
import sys
import xmlrpc.client
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from colad.health.rule import PROGRAMS
from colad.health.supervisor import supervisor_proxy
from tests.helpers import wait_until

SUPERVISORD = "supervisord"
TRACEBACK = "Traceback (most recent call last)"
_CHAINED = ("During handling of the above exception", "The above exception was the direct cause")
# supervisord's own log lines (supervisor/process.py), which `nodaemon` echoes into the colad log.
_SPAWNED = re.compile(r" INFO spawned: '(?P<name>[^']+)' with pid (?P<pid>\d+)")
_SUPERVISOR_NOTE = re.compile(r" (?:WARN|INFO|CRIT) (?:exited|gave up|stopped|killing): (?P<name>[\w.-]+)")
# Signals after which a process is gone, so supervisord starts a new one.
_NON_FATAL = {0, signal.SIGSTOP, signal.SIGCONT, signal.SIGHUP, signal.SIGWINCH, signal.SIGCHLD, signal.SIGURG}

_LIVE: list[ColadService] = []  # every started service whose guard has not reported its end yet


@dataclass
class Guard:
    """Tells the restarts a test asked for from the ones it did not, and finds tracebacks.

    Ground truth is supervisord's `spawned: 'x' with pid N` line: the first spawn of
    each program after `start()` is its start, every further one must have been declared
    with `expect_restart` (which `kill` and `restart` do). The pids supervisord reports
    must be the last ones spawned. Logs are scanned once each, from the service's start,
    so a service shared by several tests blames each test only for what appeared during it.
    """

    budget: defaultdict[str, float] = field(default_factory=lambda: defaultdict(float))  # declared, not yet seen
    baseline: dict[str, int] = field(default_factory=dict)  # the pid each role is expected to have
    started: set[str] = field(default_factory=set)  # programs spawned since the last start()
    offsets: dict[Path, int] = field(default_factory=dict)  # bytes of each log already scanned
    notes: dict[str, list[str]] = field(default_factory=dict)  # supervisord's lines per program since its spawn
    problems: list[str] = field(default_factory=list)  # found, not yet reported to a test
    flagged: set[tuple[str, int]] = field(default_factory=set)  # (role, baseline) already reported as down

    def expect(self, role: str, times: float) -> None:
        self.budget[role] += times  # math.inf: any number

    def new_start(self) -> None:
        self.started = set()

    def spawned(self, name: str, pid: int) -> str | None:
        old, said = self.baseline.get(name), self.said(name)
        self.baseline[name], self.notes[name] = pid, []
        if name not in self.started:
            self.started.add(name)
            return None
        if self.budget[name] > 0:
            self.budget[name] -= 1
            return None
        return f"role {name} restarted without the test asking: pid {old} -> {pid}\n  supervisord:\n    {said}"

    def said(self, name: str) -> str:
        return "\n    ".join(self.notes.get(name, [])[-3:]) or "(no exit line from supervisord)"

    def checked_state(self, name: str, state: str, pid: int) -> str | None:
        want = self.baseline.get(name)
        if state in ("RUNNING", "STARTING") and pid == want:
            return None
        if state in ("RUNNING", "STARTING"):
            self.baseline[name] = pid  # reported once
            return f"role {name} pid changed without a spawn line: {want} -> {pid} (state {state})"
        if self.budget[name] > 0 or (name, want or 0) in self.flagged:
            return None  # going down was asked for, and its restart is still to come
        self.flagged.add((name, want or 0))
        said = self.said(name)
        return f"role {name} is {state} without the test asking: pid {want} gone\n  supervisord:\n    {said}"


def traceback_excerpts(text: str, where: str) -> list[str]:
    """Each traceback in `text` (chained ones as one) with two lines of context before it."""
    lines = text.splitlines()
    found, i = [], 0
    while i < len(lines):
        if TRACEBACK not in lines[i]:
            i += 1
            continue
        end = i + 1
        while end < len(lines) and end < i + 60:
            line = lines[end]
            end += 1
            if not line or line.startswith((" ", "\t", *_CHAINED)) or TRACEBACK in line:
                continue
            # The exception line ends a traceback, unless a chained one follows it.
            rest = [s for s in lines[end : end + 2] if s]
            if not (rest and rest[0].startswith(_CHAINED)):
                break
        found.append(f"traceback in {where}:\n" + "\n".join("  | " + s for s in lines[max(0, i - 2) : end]))
        i = end
    return found


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
                # Never the machine's own /var/run/cdi: tests must not touch the host's runtime specs.
                "COLAD_CDI_SPEC_DIR": str(root / "cdi"),
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
        self.log_mark = 0  # tests sharing one service read the log from here on (the guard keeps its own marks)
        self.guard = Guard()
        self._stopped = True  # by stop(): supervisord's exit was asked for
        self._exit_seen = True  # supervisord's exit has been accounted for

    # Life cycle
    def start(self) -> None:
        if self.proc is not None:
            self.guard_check()  # an earlier supervisord that died unasked is reported, not forgotten
        else:  # another service may have used this root: its logs are not ours to blame
            for path in self._log_paths():
                self.guard.offsets.setdefault(path, path.stat().st_size)
        self.guard.offsets.setdefault(self.log_path, 0)
        if self not in _LIVE:
            _LIVE.append(self)
        log = open(self.log_path, "ab")  # O_APPEND: supervisord's children reopen /dev/stdout
        self.guard.new_start()
        self.proc = subprocess.Popen(
            [self.python, "-m", "colad", "supervise"],
            env=self.env,
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
        log.close()
        self._stopped = self._exit_seen = False
        self.guard.baseline[SUPERVISORD] = self.proc.pid  # `colad supervise` execs supervisord
        self.wait_running()
        self.guard_check()

    def stop(self, timeout: float = 20.0) -> int | None:
        if self.proc is None:
            return None
        if self.proc.poll() is None:
            self.guard_check()  # before the roles go: a pid that changed unasked
            self._stopped = True
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(5)
        self.guard_check()  # and what the shutdown itself logged
        self._stopped = True
        return self.proc.returncode

    # The guard
    def expect_restart(self, *roles: str, times: int | None = 1) -> None:
        """Declare that the test itself makes each role (or supervisord) exit `times` times.

        `times=None`: any number, for a test that crash-loops a role on purpose.
        """
        for role in roles:
            if role not in (*PROGRAMS, SUPERVISORD) and role not in self.guard.baseline:
                raise ValueError(f"unknown role {role!r}")
            self.guard.expect(role, math.inf if times is None else times)

    def guard_check(self) -> list[str]:
        """Check pids and logs now; return the new problems (they are also kept for `take_problems`)."""
        new: list[str] = []
        running = self.proc is not None and self.proc.poll() is None
        states = self.states() if running else {}  # first, so every pid it shows has its spawn line logged
        new += self._scan_logs()
        if self.proc is not None and not running and not self._exit_seen:
            self._exit_seen = True
            if not self._stopped and self.guard.budget[SUPERVISORD] > 0:
                self.guard.budget[SUPERVISORD] -= 1
            elif not self._stopped:
                new.append(
                    f"role {SUPERVISORD} exited (rc {self.proc.returncode}) without the test asking: "
                    f"pid {self.proc.pid}"
                )
        for name, (state, pid) in states.items():
            if name in PROGRAMS or name in self.guard.started:
                problem = self.guard.checked_state(name, state, pid)
                if problem:
                    new.append(problem)
        self.guard.problems += new
        return new

    def take_problems(self) -> list[str]:
        """Check once more (if supervisord still runs) and hand over everything not yet reported."""
        if self.proc is not None and not (self._stopped and self._exit_seen):
            self.guard_check()
        problems, self.guard.problems = self.guard.problems, []
        if problems:
            problems.append(f"(colad log: {self.log_path})")
        return problems

    def _log_paths(self) -> list[Path]:
        paths = [self.log_path] if self.log_path.exists() else []
        try:  # supervisord's child logs (an AUTO stderr log), if any
            paths += sorted(p for p in self.run_dir.iterdir() if p.suffix == ".log" and p.is_file())
        except OSError:
            pass
        return paths

    def _scan_logs(self) -> list[str]:
        found = []
        for path in self._log_paths():
            try:
                with open(path, "rb") as handle:
                    if os.fstat(handle.fileno()).st_size < self.guard.offsets.get(path, 0):
                        self.guard.offsets[path] = 0  # rotated by supervisord (stderr_logfile_maxbytes)
                    handle.seek(self.guard.offsets.setdefault(path, 0))
                    chunk = handle.read()
            except OSError:
                continue
            chunk = chunk[: chunk.rfind(b"\n") + 1]  # whole lines only: the rest is scanned next time
            self.guard.offsets[path] += len(chunk)
            text = chunk.decode(errors="replace")
            if path == self.log_path:
                found += self._supervisor_lines(text)
            found += traceback_excerpts(text, path.name)
        return found

    def _supervisor_lines(self, text: str) -> list[str]:
        found = []
        for line in text.splitlines():
            if note := _SUPERVISOR_NOTE.search(line):
                self.guard.notes.setdefault(note["name"], []).append(line.strip())
            elif spawn := _SPAWNED.search(line):
                problem = self.guard.spawned(spawn["name"], int(spawn["pid"]))
                if problem:
                    found.append(problem)
        return found

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
        """Signal a role (or supervisord); a signal that ends it declares the restart to the guard."""
        pid = self.supervisord_pid() if program == SUPERVISORD else self.pids()[program]
        if sig not in _NON_FATAL:
            self.expect_restart(program)
        os.kill(pid, sig)
        return pid

    def restart(self, program: str, timeout: float = 30.0) -> int:
        """Restart one role through supervisord, as `supervisorctl restart` does; return its new pid."""
        old = self.pids()[program]
        self.expect_restart(program)
        self.rpc().supervisor.stopProcess(f"colad:{program}")
        self.rpc().supervisor.startProcess(f"colad:{program}")
        return self.wait_running(timeout, exclude_pids={program: old})[program]

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
            lambda: lines if len(lines := self.log_lines(needle)) >= count else None,
            timeout,
            f"{count}x {needle!r} in the colad log",
            logs=[self.log_path],
        )


def guard_report() -> list[str]:
    """Every guarded service's problems not yet reported; forgets services whose end was reported."""
    problems: list[str] = []
    for service in list(_LIVE):
        problems += service.take_problems()
        if service.proc is None or service.proc.poll() is not None:
            _LIVE.remove(service)
    return problems
