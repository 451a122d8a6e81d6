"""Kernel limits confined to the processes under test: a child pids cgroup (v1) and prlimit.

Never the machine's: the group is made under /sys/fs/cgroup/pids, its members are moved back to the
root group and the group removed on exit, whatever happened.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import time
from collections.abc import Iterable, Iterator
from pathlib import Path

PIDS_ROOT = Path("/sys/fs/cgroup/pids")


def threads_of(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/task"))


def cpu_seconds(pid: int) -> float:
    """user + system CPU of a whole process so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def open_fds(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


class PidsGroup:
    """A child group of the pids controller with its own pids.max."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def add(self, pid: int) -> None:
        (self.path / "cgroup.procs").write_text(f"{pid}\n")  # the process and all its threads

    def set_max(self, limit: int | str) -> None:
        (self.path / "pids.max").write_text(f"{limit}\n")

    def current(self) -> int:
        return int((self.path / "pids.current").read_text())

    def refused(self) -> int:
        """Forks and clones refused at pids.max so far (the events file's max line)."""
        for line in (self.path / "pids.events").read_text().splitlines():
            name, _, value = line.partition(" ")
            if name == "max":
                return int(value)
        return 0


@contextlib.contextmanager
def pids_group(name: str, pids: Iterable[int] = (), limit: int | str = "max") -> Iterator[PidsGroup]:
    if not (PIDS_ROOT / "cgroup.procs").exists():
        raise RuntimeError(f"no pids cgroup controller at {PIDS_ROOT}")
    path = PIDS_ROOT / f"{name}-{os.getpid()}"
    path.mkdir()
    group = PidsGroup(path)
    try:
        group.set_max(limit)
        for pid in pids:
            group.add(pid)
        yield group
    finally:
        for _ in range(50):  # processes may fork meanwhile: move until empty
            members = (path / "cgroup.procs").read_text().split()
            if not members:
                break
            for pid in members:
                with contextlib.suppress(OSError):  # gone meanwhile
                    (PIDS_ROOT / "cgroup.procs").write_text(f"{pid}\n")
        for _ in range(50):
            try:
                path.rmdir()
                break
            except OSError:
                time.sleep(0.05)


def set_nofile(pid: int, soft: int) -> None:
    """The soft RLIMIT_NOFILE of a running process (prlimit(1)); the hard one stays, so this can be undone
    without CAP_SYS_RESOURCE (a process may raise its soft limit up to the hard one, as supervisord does)."""
    subprocess.run(["prlimit", f"--pid={pid}", f"--nofile={soft}:"], check=True, capture_output=True, text=True)


def soft_nofile(pid: int) -> int:
    out = subprocess.run(
        ["prlimit", f"--pid={pid}", "--nofile", "--raw", "--noheadings", "--output=SOFT"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    return int(out.strip())


# The budgets the shipped limits must hold (systemd/colad.service, conf/supervisord.conf, the DaemonSet),
# from the constants that bound each part. Measured at rest with one resource: supervisord 1 task and
# ~15 files, discovery and kubelet-watch 1 task and ~9 files each, the plugin 15 threads and ~20 files.
PLUGIN_FIXED_THREADS = 16  # at rest, the HTTP server's selector thread and two lanes included
PLUGIN_FIXED_FDS = 24
FDS_PER_RESOURCE = 4  # its gRPC socket, the kubelet's connection, a Register channel, grpc's wakeup fd


def task_budget() -> int:
    """Every task of a colad with the most resources allowed, each with every gRPC worker busy."""
    from colad.config.config import MAX_RESOURCES
    from colad.deviceplugin.service import WORKERS

    return 1 + 1 + 1 + PLUGIN_FIXED_THREADS + MAX_RESOURCES * (WORKERS + 1)


def plugin_fd_budget() -> int:
    """The plugin's files with the most resources, the queue full of peers and the HTTP server at its cap."""
    from colad.config.config import MAX_RESOURCES
    from colad.metrics import httpserver
    from colad.queue import server

    http = httpserver.MAX_CONNECTIONS + 2 * (httpserver.LANE_BACKLOG + 1) + httpserver.FD_RESERVE
    return PLUGIN_FIXED_FDS + MAX_RESOURCES * FDS_PER_RESOURCE + server.MAX_PEERS + http
