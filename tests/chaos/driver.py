"""Fault injection against colad under supervisord, with the strict fake kubelet.

`Chaos.run(n)` injects `n` faults in random order (the seed is printed, and
`CHAOS_SEED` replays a run), and after every fault waits for the invariant:

    registered, exactly one live ListAndWatch stream at the kubelet, and the
    list the kubelet holds equals the device directory (every device Healthy)

It records how long each recovery took. A fault whose invariant does not come
back within its deadline counts as lost. Used by tests/chaos/test_chaos.py (a
short run in `make test`) and tests/chaos/soak.py (`make soak`).
"""

from __future__ import annotations

import os
import random
import shutil
import signal
import socket
import statistics
import subprocess
import time
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from colad import messages
from colad.devices import Device, DeviceSet
from colad.queue import frame
from tests.fakes.kubelet import FakeKubelet
from tests.helpers import WaitTimeout, wait_until
from tests.service import PROGRAMS, ColadService

NOBODY = 65534


@dataclass
class Record:
    fault: str
    recovery_s: float | None  # None: the invariant did not come back within the deadline
    lost_devices: int = 0  # devices in the directory the kubelet did not hold as Healthy at the deadline
    detail: str = ""


@dataclass
class Chaos:
    root: Path
    seed: int
    burst: int = 1_000  # files per burst (the soak uses 10,000)
    away_max: float = 3.0  # longest kubelet absence, seconds (the soak uses minutes)
    deadline: float = 45.0  # for the invariant after a fault
    log: Callable[[str], None] = print
    records: list[Record] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.rng = random.Random(self.seed)
        self.kubelet = FakeKubelet(self.root / "kubelet")
        # A short Register timeout, so a hanging kubelet is a quick fault to inject.
        self.colad = ColadService(self.root, extra_env={"COLAD_LOG_LEVEL": "INFO", "COLAD_REGISTER_TIMEOUT": "1"})
        self.counter = 0
        self.faults: dict[str, Callable[[], None]] = {
            "kubelet_restart": self.kubelet_restart,
            "kubelet_restart_burst": self.kubelet_restart_burst,
            "kubelet_away": self.kubelet_away,
            "kubelet_stale_socket": self.kubelet_stale_socket,
            "register_error": self.register_error,
            "register_hang": self.register_hang,
            "close_stream": self.close_stream,
            "sigkill_role": self.sigkill_role,
            "sigkill_all_roles": self.sigkill_all_roles,
            "sigstop_role": self.sigstop_role,
            "sigkill_supervisord": self.sigkill_supervisord,
            "sigstop_supervisord": self.sigstop_supervisord,
            "file_burst": self.file_burst,
            "dir_deleted": self.dir_deleted,
            "dir_symlinked": self.dir_symlinked,
            "dir_remounted": self.dir_remounted,
            "queue_socket_deleted": self.queue_socket_deleted,
            "queue_garbage": self.queue_garbage,
            "queue_other_uid": self.queue_other_uid,
        }

    # ---- life cycle ----
    def start(self) -> None:
        self.kubelet.start()
        self.colad.add("cocacola", "peisicola")
        self.colad.start()
        self.wait_invariant("start")

    def stop(self) -> None:
        self.colad.stop()
        self.kubelet.stop()

    # ---- the invariant ----
    def expected(self) -> dict[str, str]:
        return {name: "Healthy" for name in self.colad.device_ids()}

    def problem(self) -> str | None:
        states = self.colad.states()
        bad = {p: s for p, (s, _) in states.items() if s not in ("RUNNING", "STARTING", "BACKOFF")}
        if any(s == "FATAL" for s in bad.values()):
            return f"FATAL: {bad}"
        if not all(states.get(p, ("",))[0] == "RUNNING" for p in PROGRAMS):
            return f"not all RUNNING: {states}"
        if not self.kubelet.stream_alive():
            return "no live stream for the current endpoint"
        if self.kubelet.live_streams() != 1:
            return f"{self.kubelet.live_streams()} live streams"
        held, want = self.kubelet.devices(), self.expected()
        if held != want:
            missing, extra = sorted(set(want) - set(held or {})), sorted(set(held or {}) - set(want))
            return f"kubelet holds {len(held or {})}, directory {len(want)} (missing {missing[:5]}, extra {extra[:5]})"
        return None

    def wait_invariant(self, fault: str, deadline: float | None = None) -> float:
        started = time.monotonic()
        wait_until(lambda: self.problem() is None, deadline or self.deadline, f"invariant after {fault}",
                   interval=0.005, logs=[self.colad.log_path])
        return time.monotonic() - started

    # ---- helpers ----
    def name(self) -> str:
        self.counter += 1
        return f"chaos-{self.counter:06d}"

    def change_devices(self) -> None:
        """Add one device and remove another, so every fault also tests that no change is lost."""
        self.colad.add(self.name())
        current = sorted(self.colad.device_ids() - {"cocacola", "peisicola"})
        if len(current) > 3:
            self.colad.remove(self.rng.choice(current))

    def pause(self, low: float, high: float) -> None:
        time.sleep(self.rng.uniform(low, high))  # the fault's own duration, not a wait for a condition

    # ---- faults: the kubelet ----
    def kubelet_restart(self) -> None:
        self.kubelet.restart()
        self.change_devices()

    def kubelet_restart_burst(self) -> None:
        for _ in range(self.rng.randint(2, 5)):  # faster than colad can re-register
            self.kubelet.restart()
            self.pause(0.0, 0.05)
        self.change_devices()

    def kubelet_away(self) -> None:
        self.kubelet.stop()
        self.change_devices()
        self.pause(0.1, self.away_max)
        self.kubelet.start()

    def kubelet_stale_socket(self) -> None:
        self.kubelet.stop(leave_stale_socket=True)
        self.change_devices()
        self.pause(0.1, 1.0)
        self.kubelet.start()

    def register_error(self) -> None:
        self.kubelet.register_error = "injected: resource registration refused"
        self.kubelet.restart()
        self.pause(0.2, 2.0)
        self.kubelet.register_error = None

    def register_hang(self) -> None:
        self.kubelet.register_delay = 2.0  # the plugin's Register times out after 1 s (chaos config)
        self.kubelet.restart()
        self.pause(0.5, 2.5)
        self.kubelet.register_delay = 0.0
        # The fault lasts until the kubelet has carried out the Registers it held back (as Go does):
        # only then can a late one have opened a second stream.
        self.pause(2.0, 2.0)

    def close_stream(self) -> None:
        self.kubelet.close_stream()

    # ---- faults: colad's processes ----
    def sigkill_role(self) -> None:
        victim = self.rng.choice(PROGRAMS)
        old = self.colad.pids()[victim]
        os.kill(old, signal.SIGKILL)
        self.change_devices()
        self.colad.wait_running(exclude_pids={victim: old}, timeout=self.deadline)

    def sigkill_all_roles(self) -> None:
        old = self.colad.pids()
        for pid in old.values():
            os.kill(pid, signal.SIGKILL)
        self.change_devices()
        self.colad.wait_running(exclude_pids=old, timeout=self.deadline)

    def sigstop_role(self) -> None:
        pid = self.colad.pids()[self.rng.choice(PROGRAMS)]
        os.kill(pid, signal.SIGSTOP)
        try:
            self.change_devices()
            self.pause(0.1, 2.0)
        finally:
            os.kill(pid, signal.SIGCONT)

    def sigkill_supervisord(self) -> None:
        os.kill(self.colad.supervisord_pid(), signal.SIGKILL)
        assert self.colad.proc is not None
        self.colad.proc.wait(10)
        self.change_devices()
        self.colad.start()  # systemd's Restart=on-failure

    def sigstop_supervisord(self) -> None:
        pid = self.colad.supervisord_pid()
        os.kill(pid, signal.SIGSTOP)
        try:
            self.change_devices()
            self.pause(0.1, 2.0)
        finally:
            os.kill(pid, signal.SIGCONT)

    # ---- faults: the device directory ----
    def file_burst(self) -> None:
        names = [self.name() for _ in range(self.burst)]
        self.colad.add(*names)  # within a second: overflows the inotify queue at 10,000
        # Most go again, so that the directory stays near the 10,000 devices colad is sized for.
        for victim in self.rng.sample(names, len(names) - 20):
            self.colad.remove(victim)
        for old in os.listdir(self.colad.device_dir):  # rename a few in place
            if old.startswith("chaos-") and self.rng.random() < 0.01:
                os.rename(self.colad.device_dir / old, self.colad.device_dir / (old + "-r"))

    def dir_deleted(self) -> None:
        keep = self.colad.device_ids()
        shutil.rmtree(self.colad.device_dir)
        self.pause(0.0, 0.5)
        self.colad.device_dir.mkdir()
        self.colad.add(*keep, self.name())

    def dir_symlinked(self) -> None:
        real = self.root / f"colas-real-{self.counter}"
        os.rename(self.colad.device_dir, real)
        os.symlink(real, self.colad.device_dir)
        self.change_devices()
        # and back to a plain directory, so the next fault starts from the usual layout
        self.wait_invariant("dir_symlinked (intermediate)")
        os.unlink(self.colad.device_dir)
        os.rename(real, self.colad.device_dir)

    def dir_remounted(self) -> None:
        keep = self.colad.device_ids()
        subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64m", "chaos", str(self.colad.device_dir)], check=True)
        self.colad.add(*keep, self.name())  # the same devices, now on another filesystem
        self.wait_invariant("dir_remounted (mounted)")
        subprocess.run(["umount", str(self.colad.device_dir)], check=True)
        self.change_devices()

    # ---- faults: the local queue ----
    def queue_socket_deleted(self) -> None:
        (self.colad.run_dir / "queue.sock").unlink(missing_ok=True)
        if self.rng.random() < 0.5:  # and a sender restarts before the plugin noticed
            role = self.rng.choice(["discovery", "kubelet-watch"])
            old = self.colad.pids()[role]
            os.kill(old, signal.SIGKILL)
            self.colad.wait_running(exclude_pids={role: old}, timeout=self.deadline)
        self.change_devices()

    def queue_garbage(self) -> None:
        snapshot = messages.DeviceSnapshot(1, 1, DeviceSet.of([Device("ghost")]))
        payloads = [
            b"\x00\x00\x00\x05hello",
            b"\xff\xff\xff\xff",  # announces 4 GiB
            frame(snapshot)[:-3],  # truncated
            frame(snapshot) * 2,  # a valid but stale snapshot from an "old epoch": must never win
            os.urandom(self.rng.randint(1, 4096)),
        ]
        for payload in payloads:
            with socket.socket(socket.AF_UNIX) as peer:
                peer.settimeout(2)
                try:
                    peer.connect(str(self.colad.run_dir / "queue.sock"))
                    peer.sendall(payload)
                except OSError:
                    pass
        self.change_devices()

    def queue_other_uid(self) -> None:
        pid = os.fork()
        if pid == 0:  # the child: another uid tries to feed the plugin a device
            try:
                os.setgroups([])
                os.setgid(NOBODY)
                os.setuid(NOBODY)
                with socket.socket(socket.AF_UNIX) as peer:
                    peer.settimeout(2)
                    peer.connect(str(self.colad.run_dir / "queue.sock"))
                    peer.sendall(frame(messages.DeviceSnapshot(2**62, 1, DeviceSet.of([Device("intruder")]))))
            except OSError:
                pass
            os._exit(0)
        os.waitpid(pid, 0)
        self.change_devices()

    # ---- the loop ----
    def inject(self, fault: str) -> Record:
        started = time.monotonic()
        try:
            self.faults[fault]()
            recovery = self.wait_invariant(fault)
            record = Record(fault, recovery)
        except WaitTimeout as exc:
            held = self.kubelet.devices() or {}
            lost = sum(1 for name in self.expected() if held.get(name) != "Healthy")
            record = Record(fault, None, lost, f"{self.problem()}\n{str(exc)[:3000]}")
        self.records.append(record)
        took = time.monotonic() - started
        status = f"recovered in {record.recovery_s * 1000:.0f} ms" if record.recovery_s is not None else "LOST"
        self.log(f"chaos fault={fault} {status} (fault+recovery {took:.1f}s)")
        return record

    def run(self, count: int | None = None, until: float | None = None, only: list[str] | None = None) -> None:
        names = sorted(only or self.faults)
        n = 0
        while (count is None or n < count) and (until is None or time.monotonic() < until):
            self.inject(self.rng.choice(names))
            n += 1

    def summary(self) -> str:
        lost = [r for r in self.records if r.recovery_s is None]
        by_fault: dict[str, list[float]] = defaultdict(list)
        for r in self.records:
            if r.recovery_s is not None:
                by_fault[r.fault].append(r.recovery_s)
        lines = [f"seed={self.seed}"]
        for fault in sorted(by_fault):
            times = by_fault[fault]
            lines.append(
                f"  {fault:<22} n={len(times):<4} median={statistics.median(times) * 1000:8.0f} ms"
                f"  worst={max(times) * 1000:8.0f} ms"
            )
        lost_devices = sum(r.lost_devices for r in lost)
        recovered = len(self.records) - len(lost)
        lines.append(f"faults={len(self.records)} recovered={recovered} lost_devices={lost_devices}")
        return "\n".join(lines)
