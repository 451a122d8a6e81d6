"""Who wrote a state file, and when, in terms that survive pid reuse, reboots and clock jumps.

A process is named by (boot ID, pid, start time in clock ticks since boot): a pid alone may be
reused, and a file on a persistent run directory may come from an earlier boot. Ages are taken
on CLOCK_BOOTTIME, which every process of one boot shares and no wall-clock step moves.
Read by statefile.py (the writer's stamp), status.py (is the writer still there) and the plugin's
status socket. Linux /proc only; no logging.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass

BOOT_ID_PATH = "/proc/sys/kernel/random/boot_id"


@dataclass(frozen=True)
class ProcessId:
    """One process of one boot: `start` is field 22 of /proc/<pid>/stat (clock ticks after boot)."""

    boot_id: str
    pid: int
    start: int


def boot_id() -> str:
    """The kernel's random ID of this boot ("" where /proc does not say)."""
    try:
        with open(BOOT_ID_PATH, encoding="ascii") as handle:
            return handle.read().strip()
    except OSError:
        return ""


def _stat_fields(pid: int) -> list[str] | None:
    """/proc/<pid>/stat from field 3 (state) on; the command name may hold blanks and parentheses."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as handle:
            raw = handle.read()
    except OSError:
        return None
    return raw[raw.rfind(b")") + 2 :].decode("ascii", "replace").split()


def start_ticks(pid: int) -> int | None:
    """When `pid` started, in clock ticks after boot; None when there is no such process."""
    fields = _stat_fields(pid)
    try:
        return int(fields[19]) if fields else None
    except (IndexError, ValueError):
        return None


def run_state(pid: int) -> str:
    """The kernel's one-letter state of `pid` (R, S, D, T stopped, t traced, Z...); "" when it is gone."""
    fields = _stat_fields(pid)
    return fields[0] if fields else ""


_SELF: ProcessId | None = None


def current() -> ProcessId:
    """This process (read once per process: the pid and its start time never change)."""
    global _SELF
    if _SELF is None or _SELF.pid != os.getpid():
        _SELF = ProcessId(boot_id(), os.getpid(), start_ticks(os.getpid()) or 0)
    return _SELF


def boottime() -> float:
    """Seconds since boot, suspend included: one clock for every process of this boot."""
    return time.clock_gettime(time.CLOCK_BOOTTIME)


def alive(who: ProcessId) -> bool:
    """Is `who` still running on this boot (the same pid, started at the same tick)?"""
    return who.boot_id == boot_id() and who.start != 0 and start_ticks(who.pid) == who.start
