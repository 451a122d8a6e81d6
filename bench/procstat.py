"""What /proc says about a process: memory (RSS, PSS, USS), CPU time and per-thread context switches.

Readers of /proc/<pid>/{smaps_rollup,maps,pagemap,stat,task/*/status,task/*/comm},
plus `py-spy dump` to name Python threads when it is installed. A "wake-up" is
one context switch of one thread: a thread that sleeps, wakes and sleeps again
switches out once.
"""

from __future__ import annotations

import array
import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

CLOCK_TICKS = os.sysconf("SC_CLK_TCK")
PAGE = os.sysconf("SC_PAGE_SIZE")
_PFN_MASK = (1 << 55) - 1
# Threads gRPC's C core starts for itself (their comm), and Python frames inside grpcio.
GRPC_THREADS = ("event_engine", "grpc_", "lifeguard", "timer_manager", "default-executo", "resolver-execut")
GRPC_FRAMES = ("grpc/_server.py", "grpc/_channel.py", "grpc/_utilities.py", "grpc/aio/")


def memory(pid: int) -> dict[str, float]:
    """RSS, PSS and USS (private pages) in MiB, from smaps_rollup."""
    fields: dict[str, int] = {}
    for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines()[1:]:
        key, value = line.split(":", 1)
        fields[key] = int(value.split()[0])
    private = fields["Private_Clean"] + fields["Private_Dirty"]
    return {
        "rss_mib": round(fields["Rss"] / 1024, 1),
        "pss_mib": round(fields["Pss"] / 1024, 1),
        "uss_mib": round(private / 1024, 1),
    }


def footprint(pids: Iterable[int]) -> float | None:
    """MiB of distinct physical pages mapped by `pids` together: their PSS sum if nothing else shared a page.

    PSS splits a page among every process that maps it, including the bench
    itself (same interpreter, same grpcio), so a group's PSS sum depends on who
    else runs. Counting each resident page of the group once does not. Needs
    root (PFNs read as 0 otherwise); None when they cannot be read.
    """
    frames: set[int] = set()
    for pid in pids:
        with open(f"/proc/{pid}/maps") as maps, open(f"/proc/{pid}/pagemap", "rb") as pagemap:
            for line in maps:
                start, end = (int(x, 16) for x in line.split(None, 1)[0].split("-"))
                if start >= 1 << 47:  # [vsyscall]
                    continue
                pagemap.seek(start // PAGE * 8)
                entries = array.array("Q")
                entries.frombytes(pagemap.read((end - start) // PAGE * 8))
                frames.update(e & _PFN_MASK for e in entries if e >> 63)  # bit 63: present in RAM
    if not frames or frames == {0}:
        return None
    return round(len(frames) * PAGE / 2**20, 1)


def cpu_seconds(pid: int, tid: int | None = None) -> float:
    """utime + stime of every thread of `pid` (of its thread `tid` alone, if given), in seconds."""
    text = Path(f"/proc/{pid}/stat" if tid is None else f"/proc/{pid}/task/{tid}/stat").read_text()
    fields = text[text.rindex(")") + 2 :].split()  # comm may contain spaces; fields 14, 15 (1-based)
    return (int(fields[11]) + int(fields[12])) / CLOCK_TICKS


def machine_busy() -> tuple[int, int]:
    """(busy, total) jiffies of all CPUs so far, from /proc/stat."""
    fields = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    idle = fields[3] + fields[4]  # idle + iowait
    return sum(fields) - idle, sum(fields)


def busy_percent(before: tuple[int, int], after: tuple[int, int]) -> float:
    """Share of the machine's CPU time (all CPUs) that was busy between two machine_busy() readings."""
    total = after[1] - before[1]
    return round(100.0 * (after[0] - before[0]) / total, 1) if total else 0.0


@dataclass(frozen=True)
class Thread:
    tid: int
    comm: str
    switches: int  # voluntary + nonvoluntary context switches so far


def threads(pid: int) -> dict[int, Thread]:
    found: dict[int, Thread] = {}
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            comm = (task / "comm").read_text().strip()
            status = (task / "status").read_text()
        except OSError:
            continue  # the thread ended while we looked
        switches = 0
        for line in status.splitlines():
            key, _, value = line.partition(":")
            if key in ("voluntary_ctxt_switches", "nonvoluntary_ctxt_switches"):
                switches += int(value)
        found[int(task.name)] = Thread(int(task.name), comm, switches)
    return found


@dataclass(frozen=True)
class Sample:
    cpu: float
    threads: dict[int, Thread]


def sample(pid: int) -> Sample:
    return Sample(cpu_seconds(pid), threads(pid))


def python_threads(pid: int) -> dict[int, str]:
    """Native thread id -> "python thread name: innermost frame", from `py-spy dump` if it is installed.

    Threads that run no Python (gRPC core's own, named in comm) are absent. py-spy
    pauses the process for a moment: call it after a measurement window, never in one.
    """
    spy = shutil.which("py-spy", path=f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}")
    if spy is None:
        return {}
    try:
        out = subprocess.run([spy, "dump", "--json", "--pid", str(pid)], capture_output=True, text=True, timeout=20)
        dumped = json.loads(out.stdout)
    except (OSError, subprocess.SubprocessError, ValueError):
        return {}
    names = {}
    for thread in dumped:
        frame = thread["frames"][0] if thread["frames"] else None
        where = f": {frame['name']} ({frame['short_filename']}:{frame['line']})" if frame else ""
        names[thread["os_thread_id"]] = f"{thread['thread_name']}{where}"
    return names


def is_grpc_runtime(label: str) -> bool:
    """A thread gRPC runs for itself: one of its C core threads, or grpcio's own Python poller."""
    return label.startswith(GRPC_THREADS) or any(frame in label for frame in GRPC_FRAMES)


def idle_cost(before: Sample, after: Sample, seconds: float, names: dict[int, str] | None = None) -> dict[str, object]:
    """CPU seconds and wake-ups per minute between two samples, per thread (grouped by name) and in all."""
    per_minute = 60.0 / seconds
    woke: dict[str, list[int]] = {}
    for tid, thread in after.threads.items():
        previous = before.threads.get(tid)
        delta = thread.switches - (previous.switches if previous else 0)
        if delta:
            woke.setdefault((names or {}).get(tid, thread.comm), []).append(delta)
    grpc = sum(sum(deltas) for label, deltas in woke.items() if is_grpc_runtime(label))
    groups = {
        (label if len(deltas) == 1 else f"{label} (x{len(deltas)})"): round(sum(deltas) * per_minute, 1)
        for label, deltas in woke.items()
    }
    total = sum(sum(d) for d in woke.values())
    return {
        "cpu_s_per_min": round((after.cpu - before.cpu) * per_minute, 3),
        "wakeups_per_min": round(total * per_minute, 1),
        "grpc_runtime_wakeups_per_min": round(grpc * per_minute, 1),
        "own_wakeups_per_min": round((total - grpc) * per_minute, 1),
        "threads": len(after.threads),
        "waking_threads": dict(sorted(groups.items(), key=lambda kv: -kv[1])),
    }
