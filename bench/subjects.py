"""The plugins under test, behind one interface, each paired with its own fake kubelet.

`PluginUnderTest` is what the measurements see: start(root) returns as soon as
the process is spawned, wait_ready() waits for it to be up, pids() names every
process to account for, stop() ends them. `Colad` runs `colad supervise` through
tests.service.ColadService; `Baseline` runs bench/baseline_plugin.py. Both use
the layout ColadService defines: root/colas (devices) and root/kubelet.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any, Protocol

from bench.baseline_split import CARD_IMPORTS_ENV
from tests.fakes.kubelet import FakeKubelet, ListAndWatchUpdate, Registration
from tests.helpers import wait_until
from tests.service import ColadService

RUNTIME_TMPFS = "/dev/shm"


def _fstype(path: Path) -> str:
    """The type of the file system mounted exactly at `path`, or "" (from /proc/self/mounts)."""
    with open("/proc/self/mounts") as mounts:
        types = {fields[1]: fields[2] for fields in (line.split() for line in mounts) if len(fields) > 2}
    return types.get(str(path), "")


REPO = Path(__file__).resolve().parent.parent


class PluginUnderTest(Protocol):
    name: str

    def start(self, root: Path) -> None: ...

    def wait_ready(self) -> None: ...

    def pids(self) -> dict[str, int]: ...

    def stop(self) -> None: ...


class _BenchService(ColadService):
    """ColadService whose wait for RUNNING begins once the bench has its figures (`measured` is set).

    Its wait polls supervisord's XML-RPC every 10 ms: during a cold start that is supervisord's
    CPU and the bench's, on the two CPUs the roles start on, which no operator's service manager
    spends (and the baseline is not polled). So it waits until the measurement is over.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.measured = threading.Event()

    def wait_running(self, timeout: float = 20.0, *, exclude_pids: dict[str, int] | None = None) -> dict[str, int]:
        self.measured.wait(300)
        return super().wait_running(timeout, exclude_pids=exclude_pids)


class Colad:
    """colad as an operator runs it: `colad supervise`, at the default log level, metrics on."""

    def __init__(
        self,
        python: str = sys.executable,
        extra_env: dict[str, str] | None = None,
        tree: str | None = None,
        name: str = "colad",
    ) -> None:
        self.python = python
        self.extra_env = {"COLAD_LOG_LEVEL": "INFO", **(extra_env or {})}  # run.py's --colad-env
        # A checkout whose own `python -m colad supervise` runs (on `python`, installed.tree_python); None: this one.
        self.tree = tree
        self.name = name  # the figures' key, and the Subject's
        self.service: _BenchService | None = None
        self._starting: threading.Thread | None = None
        self._error: BaseException | None = None
        self._runtime: Path | None = None  # on a tmpfs: run dir and CDI spec dir (see _runtime_on_tmpfs)

    def start(self, root: Path) -> None:
        service = _BenchService(root, extra_env=self.extra_env, python=self._python_for(root))
        self._runtime_on_tmpfs(service)
        if self.tree:
            service.env["PYTHONPATH"] = self.tree
        self.service, self._error = service, None

        def run() -> None:  # start() blocks until supervisord says RUNNING (startsecs=1), asked after wait_ready()
            try:
                service.start()
            except BaseException as exc:  # handed to wait_ready()
                self._error = exc

        self._starting = threading.Thread(target=run, name="colad-start", daemon=True)
        self._starting.start()

    def _runtime_on_tmpfs(self, service: _BenchService) -> None:
        """The run directory and the CDI spec directory on a tmpfs, where a host has them.

        colad's defaults, /run/colad and /var/run/cdi, are tmpfs on a host (systemd mounts /run); the
        bench's root is wherever the temporary directory is, ext4 on this machine, where each state-file
        and spec rename costs a journal commit that no node pays. Device and kubelet dirs stay on disk.
        """
        shm = Path(RUNTIME_TMPFS)
        if _fstype(shm) != "tmpfs":
            return
        self._runtime = Path(tempfile.mkdtemp(prefix="colad-bench-", dir=shm))
        service.run_dir = self._runtime / "run"
        service.env["COLAD_RUN_DIR"] = str(service.run_dir)
        service.env["COLAD_CDI_SPEC_DIR"] = str(self._runtime / "cdi")

    def _python_for(self, root: Path) -> str:
        if not self.tree:
            return self.python
        # `python -m` puts the working directory first on sys.path: the tree's colad runs from the tree.
        wrapper = root / "python-in-tree"
        wrapper.write_text(f'#!/bin/sh\ncd "{self.tree}" && exec "{self.python}" "$@"\n')
        wrapper.chmod(0o755)
        return str(wrapper)

    def wait_ready(self) -> None:
        """Call once the figures of the start are taken: only then is supervisord asked for its states."""
        if self.service is not None:
            self.service.measured.set()
        if self._starting is not None:
            self._starting.join()
            self._starting = None
        if self._error is not None:
            raise self._error

    def pids(self) -> dict[str, int]:
        assert self.service is not None
        self.wait_ready()
        return {**self.service.pids(), "supervisord": self.service.supervisord_pid()}

    def stop(self) -> None:
        if self.service is not None:
            self.service.measured.set()
            if self._starting is not None:
                self._starting.join()
            self.service.stop()
            self.service = None
        if self._runtime is not None:
            shutil.rmtree(self._runtime, ignore_errors=True)
            self._runtime = None


def _spawn(
    python: str, args: list[str], log: IO[bytes], extra_env: dict[str, str] | None = None
) -> subprocess.Popen[bytes]:
    """`python -m <args>` from this checkout, in a session of its own, its output to `log`."""
    env = {**os.environ, **(extra_env or {})}
    if python != sys.executable:  # as ColadService does: this checkout on another interpreter's packages
        env["PYTHONPATH"] = str(REPO)
        env.pop("VIRTUAL_ENV", None)
    return subprocess.Popen(
        [python, "-m", *args],
        cwd=REPO,
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
        start_new_session=True,
    )


def _terminate(procs: list[subprocess.Popen[bytes]]) -> None:
    """SIGTERM to each that still runs, then wait; killed after 10 s."""
    for proc in procs:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
    for proc in procs:
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)


class Baseline:
    """bench/baseline_plugin.py: one process, on the same interpreter and packages as colad."""

    name = "baseline"

    def __init__(self, python: str = sys.executable) -> None:
        self.python = python
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self, root: Path) -> None:
        (root / "colas").mkdir(parents=True, exist_ok=True)
        (root / "kubelet").mkdir(parents=True, exist_ok=True)
        with open(root / "baseline.log", "ab") as log:
            self.proc = _spawn(self.python, ["bench.baseline_plugin", str(root / "colas"), str(root / "kubelet")], log)

    def wait_ready(self) -> None:
        assert self.proc is not None
        if self.proc.poll() is not None:
            raise RuntimeError(f"baseline plugin exited with {self.proc.returncode}")

    def pids(self) -> dict[str, int]:
        assert self.proc is not None
        return {"plugin": self.proc.pid}

    def stop(self) -> None:
        if self.proc is not None:
            _terminate([self.proc])
        self.proc = None


class Split:
    """bench/baseline_split.py: the baseline cut into colad's three processes, with no supervisord."""

    name = "split"
    ROLES = ("plugin", "discovery", "kubelet-watch")

    def __init__(self, python: str = sys.executable, *, card: bool = False) -> None:
        """`card`: each role also loads what the card and the house style make colad's load (baseline_split.py)."""
        self.python = python
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        self.env = {CARD_IMPORTS_ENV: "1"} if card else {}
        if card:
            self.name = "split+card"

    def start(self, root: Path) -> None:
        devices, kubelet, queue = root / "colas", root / "kubelet", root / "split-queue.sock"
        devices.mkdir(parents=True, exist_ok=True)
        kubelet.mkdir(parents=True, exist_ok=True)
        queue.unlink(missing_ok=True)
        args = {
            "plugin": [devices, kubelet, queue],
            "discovery": [devices, queue],
            "kubelet-watch": [kubelet, queue],
        }
        with open(root / "split.log", "ab") as log:
            for role in self.ROLES:  # all at once, as supervisord starts colad's
                argv = ["bench.baseline_split", role, *map(str, args[role])]
                self.procs[role] = _spawn(self.python, argv, log, self.env)

    def wait_ready(self) -> None:
        for role, proc in self.procs.items():
            if proc.poll() is not None:
                raise RuntimeError(f"split {role} exited with {proc.returncode}")

    def pids(self) -> dict[str, int]:
        return {role: proc.pid for role, proc in self.procs.items()}

    def stop(self) -> None:
        _terminate(list(self.procs.values()))
        self.procs = {}


class Subject:
    """One plugin under test with its own root directory and fake kubelet."""

    def __init__(self, plugin: PluginUnderTest, root: Path) -> None:
        self.plugin = plugin
        self.name = plugin.name
        self.root = root
        self.device_dir = root / "colas"
        self.device_dir.mkdir(parents=True, exist_ok=True)
        self.kubelet = FakeKubelet(root / "kubelet")

    def create(self, *names: str) -> None:
        for name in names:
            (self.device_dir / name).write_bytes(b"")

    def unlink(self, *names: str) -> None:
        for name in names:
            (self.device_dir / name).unlink()

    def registered(self, count: int = 1, timeout: float = 30.0) -> Registration:
        """The `count`-th successful registration, polled every millisecond: its `answered_at` is the figure."""

        def nth() -> Registration | None:
            done = self.kubelet.successful_registrations()
            return done[count - 1] if len(done) >= count else None

        return wait_until(nth, timeout, f"{self.name}: {count} registration(s)", interval=0.001)

    def update_after(
        self, since: int, holds: Callable[[ListAndWatchUpdate], bool], timeout: float = 30.0, interval: float = 0.002
    ) -> ListAndWatchUpdate:
        """The first ListAndWatch message (of any stream) after the first `since` that satisfies `holds`."""

        def find() -> ListAndWatchUpdate | None:
            return next((u for u in self.kubelet.updates[since:] if holds(u)), None)

        return wait_until(find, timeout, f"{self.name}: a ListAndWatch message", interval=interval)

    def full_list_after(self, since: int, names: set[str], timeout: float = 60.0) -> ListAndWatchUpdate:
        return self.update_after(
            since, lambda u: len(u.devices) >= len(names) and names <= u.devices.keys(), timeout, interval=0.005
        )

    def close(self) -> None:
        try:
            self.plugin.stop()
        finally:
            self.kubelet.stop()


def settle(seconds: float) -> None:
    """A deliberate pause between phases (never on a measurement path)."""
    time.sleep(seconds)
