"""Fault injection against colad under supervisord, with the strict fake kubelet.

`Chaos.run(n)` injects `n` faults in random order (the seed is printed, and
`CHAOS_SEED` replays a run), and after every fault waits for the invariant:

    registered, exactly one live ListAndWatch stream at the kubelet, and the
    list the kubelet holds equals the device directory (every device Healthy)

and the guard (tests/service.py): no role exited that the fault did not kill
itself, and no traceback reached a colad log. It records how long each recovery
took. A fault whose invariant does not come back within its deadline counts as
lost. Used by tests/chaos/test_chaos.py (a short run in `make test`) and
tests/chaos/soak.py (`make soak`).
"""

from __future__ import annotations

import os
import random
import re
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import time
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from colad.core.devices import Device, DeviceSet
from colad.health.rule import PROGRAMS
from colad.queue import messages
from colad.queue.framing import frame
from tests.fakes.kubelet import FakeKubelet
from tests.flood import flooding
from tests.helpers import http_get, metrics_address, wait_until
from tests.service import ColadService
from tests.userns import InotifyLimits

NOBODY = 65534
RESOURCE = "myway5.com/cola"
DEVICE_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,62}")  # docs/DEVICES.md "Device IDs": anything else is skipped
LIMIT = 65536  # MAX_DEVICE_FILE_BYTES: larger device files are Unhealthy
# tomllib-pathological device files: each must turn Unhealthy at once, never stall the others.
SLOW_FILES = {
    "dotted": b"a" + b".a" * 30_000 + b" = 1\n",
    "dotted-spaced": b"a" + b" . a" * 15_000 + b" = 1\n",
    "dotted-quoted": b'"a"' + b'."a"' * 15_000 + b" = 1\n",
    "table-header": b"[" + b"a." * 30_000 + b"a]\n",
    "nested-arrays": b"envs = " + b"[" * 20_000 + b"]" * 20_000 + b"\n",
    "nested-tables": b"x = " + b"{a=" * 10_000 + b"1" + b"}" * 10_000 + b"\n",
}


@dataclass
class Record:
    fault: str
    recovery_s: float | None  # None: the invariant did not come back within the deadline
    lost_devices: int = 0  # devices in the directory the kubelet did not hold as Healthy at the deadline
    detail: str = ""
    guard: list[str] = field(default_factory=list)  # roles that exited unasked, tracebacks


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
        # In a user namespace of its own, whose inotify limits inotify_limits lowers (the machine's stay).
        self.limits = InotifyLimits(self.root)
        self.colad = ColadService(
            self.root, extra_env={"COLAD_LOG_LEVEL": "INFO", "COLAD_REGISTER_TIMEOUT": "1"}, python=self.limits.python
        )
        # The resource comes from the file, not COLAD_DEVICE_DIR, so a reload can try to change it.
        del self.colad.env["COLAD_DEVICE_DIR"]
        self.config = Path(self.colad.env["COLAD_CONFIG"])
        self.good_config = f'[[resources]]\nname = "{RESOURCE}"\ndevice_dir = "{self.colad.device_dir}"\n'
        self.config.write_text(self.good_config)
        self.health: dict[str, set[str]] = {}  # devices whose health a fault sets (default: Healthy)
        self.shutdown_guard: list[str] = []
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
            "bad_name_storm": self.bad_name_storm,
            "oversized_files": self.oversized_files,
            "slow_files": self.slow_files,
            "config_alias_reload": self.config_alias_reload,
            "inotify_limits": self.inotify_limits,
            "http_flood": self.http_flood,
        }

    # ---- life cycle ----
    def start(self) -> None:
        self.kubelet.start()
        self.colad.add("cocacola", "peisicola")
        self.colad.start()
        self.wait_invariant("start")

    def stop(self) -> None:
        before = len(self.colad.guard.problems)
        self.colad.stop()
        self.shutdown_guard = self.colad.guard.problems[before:]  # what stopping itself logged
        self.kubelet.stop()

    # ---- the invariant ----
    def expected(self) -> dict[str, str]:
        """The devices of the directory, each with the health it must have (or one of several)."""
        return {name: "Healthy" for name in self.colad.device_ids() if DEVICE_ID.fullmatch(name)}

    def wrong(self, held: dict[str, str]) -> list[str]:
        want = self.expected()
        return sorted(n for n in set(want) | set(held) if held.get(n) not in self.health.get(n, {want.get(n)}))

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
        if self.kubelet.resources() != [RESOURCE]:
            return f"kubelet has resources {self.kubelet.resources()}"
        held, want = self.kubelet.devices() or {}, self.expected()
        if wrong := self.wrong(held):
            missing, extra = sorted(set(want) - set(held)), sorted(set(held) - set(want))
            return (
                f"kubelet holds {len(held)}, directory {len(want)} (missing {missing[:5]}, extra {extra[:5]}, "
                f"health {[(n, held.get(n)) for n in wrong[:5]]})"
            )
        return None

    def wait_invariant(self, fault: str, deadline: float | None = None) -> float:
        started = time.monotonic()
        wait_until(
            lambda: self.problem() is None,
            deadline or self.deadline,
            f"invariant after {fault}",
            interval=0.005,
            logs=[self.colad.log_path],
        )
        return time.monotonic() - started

    # ---- helpers ----
    def name(self) -> str:
        self.counter += 1
        return f"chaos-{self.counter:06d}"

    def change_devices(self) -> None:
        """Add one device and remove another, so every fault also tests that no change is lost."""
        self.colad.add(self.name())
        current = sorted(n for n in self.colad.device_ids() if n.startswith("chaos-"))
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
        old = self.colad.kill(victim)
        self.change_devices()
        self.colad.wait_running(exclude_pids={victim: old}, timeout=self.deadline)

    def sigkill_all_roles(self) -> None:
        old = {role: self.colad.kill(role) for role in PROGRAMS}
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
        self.colad.kill("supervisord")
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
        # mode=0755: a tmpfs is 1777 by default, and a device directory anyone can write is refused (trust.py).
        subprocess.run(
            ["mount", "-t", "tmpfs", "-o", "size=64m,mode=0755", "chaos", str(self.colad.device_dir)], check=True
        )
        self.colad.add(*keep, self.name())  # the same devices, now on another filesystem
        self.wait_invariant("dir_remounted (mounted)")
        subprocess.run(["umount", str(self.colad.device_dir)], check=True)
        self.change_devices()

    def inotify_limits(self) -> None:
        """The uid's inotify instances or watches used up (by other root daemons): the watcher roles,
        started again now, get none and poll; once the limits are restored they watch again."""
        kind = self.rng.choice(["instances", "watches"])
        recovered_before = len(self.colad.log_lines("inotify available again"))
        self.limits.set(**{kind: 0})
        try:
            old = {role: self.colad.kill(role) for role in ("discovery", "kubelet-watch")}
            self.colad.wait_running(exclude_pids=old, timeout=self.deadline)
            self.change_devices()
            self.wait_invariant(f"inotify_limits ({kind} used up)")
        finally:
            self.limits.lift()
        # Both watcher roles, each once; counted from this fault's start, as the other faults count.
        self.colad.wait_log("inotify available again", timeout=self.deadline, count=recovered_before + 2)
        self.change_devices()

    # ---- faults: the local queue ----
    def queue_socket_deleted(self) -> None:
        (self.colad.run_dir / "queue.sock").unlink(missing_ok=True)
        if self.rng.random() < 0.5:  # and a sender restarts before the plugin noticed
            role = self.rng.choice(["discovery", "kubelet-watch"])
            old = self.colad.kill(role)
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
        """Another uid tries to feed the plugin a device. A fresh interpreter, not a fork: a fork of this
        process, whose gRPC threads may be inside the core, can crash in the child."""
        payload = frame(messages.DeviceSnapshot(2**62, 1, DeviceSet.of([Device("intruder")])))
        script = (
            "import socket, sys\n"
            "peer = socket.socket(socket.AF_UNIX)\n"
            "peer.settimeout(2)\n"
            "try:\n"
            "    peer.connect(sys.argv[1])\n"
            "    peer.sendall(sys.stdin.buffer.read())\n"
            "except OSError:\n"
            "    pass\n"
        )
        subprocess.run(
            ["/usr/bin/python3", "-c", script, str(self.colad.run_dir / "queue.sock")],  # root's venv: not nobody's
            input=payload,
            user=NOBODY,
            group=NOBODY,
            extra_groups=[],
            capture_output=True,
            timeout=30,
            check=True,
        )
        self.change_devices()

    # ---- faults: hostile input ----
    def bad_name(self) -> bytes:
        """A name that is not UTF-8: lone continuation bytes, an encoded surrogate, an overlong '/'."""
        junk = self.rng.choice([b"\xff\xfe", b"\x80", b"\xed\xa0\x80", b"\xc0\xaf", b"\xe9t\xe9", os.urandom(3)])
        name = b"bad" + junk + str(self.rng.randrange(10**6)).encode()
        return name.replace(b"/", b"_").replace(b"\x00", b"_")

    def bad_name_storm(self) -> None:
        """Non-UTF-8 names created, written, renamed and deleted in every watched directory and their parents."""
        dirs = [os.fsencode(p) for p in (self.colad.device_dir, self.colad.kubelet_dir, self.colad.run_dir, self.root)]
        made: dict[bytes, list[bytes]] = {d: [] for d in dirs}
        until = time.monotonic() + self.rng.uniform(0.5, 3.0)
        ops = 0
        while time.monotonic() < until and ops < 5_000:
            where = self.rng.choice(dirs)
            names = made[where]
            action = self.rng.random() if names else 0.0
            try:
                if action < 0.35:
                    names.append(self.bad_name())
                    with open(os.path.join(where, names[-1]), "wb") as handle:
                        handle.write(b'health = "Healthy"\n')
                elif action < 0.55:  # rewrite in place: IN_MODIFY and IN_CLOSE_WRITE with a bad name
                    with open(os.path.join(where, self.rng.choice(names)), "ab") as handle:
                        handle.write(b"# more\n")
                elif action < 0.75:
                    old = names.pop(self.rng.randrange(len(names)))
                    names.append(self.bad_name())
                    os.rename(os.path.join(where, old), os.path.join(where, names[-1]))
                elif action < 0.85:
                    names.append(self.bad_name())
                    os.mkdir(os.path.join(where, names[-1]))
                else:
                    victim = os.path.join(where, names.pop(self.rng.randrange(len(names))))
                    os.rmdir(victim) if os.path.isdir(victim) else os.unlink(victim)
            except (IsADirectoryError, NotADirectoryError, FileNotFoundError, FileExistsError):
                # "rewrote" one of the bad directories, or a random name came up twice (its first copy
                # is already gone, or still there for mkdir): the storm's own bookkeeping, not colad's doing.
                pass
            ops += 1
            if ops % 200 == 0:
                self.change_devices()  # real changes amid the storm must still arrive
        self.change_devices()
        for where, names in made.items():
            for name in names:
                path = os.path.join(where, name)
                if os.path.isdir(path):
                    os.rmdir(path)
                elif os.path.lexists(path):
                    os.unlink(path)

    def oversized_files(self) -> None:
        """Device files at and over the 64 KiB limit, and non-ASCII ones that blow up the queue's JSON."""
        near = b'health = "Healthy"\n' + b"#" * (LIMIT - 20) + b"\n"  # exactly the limit: a device like any other
        tag = self.counter
        big = {f"big-at-limit-{tag}": (near, {"Healthy"}), f"big-over-{tag}": (near + b"#", {"Unhealthy"})}
        # One e-acute is 2 bytes in the file and 6 in JSON: about 180 KB each on the queue, 28 of them
        # over its 4 MiB frame, so discovery must cut (the largest turn Unhealthy), never crash.
        value = "\u00e9" * 300
        wide = ("[annotations]\n" + "".join(f'k{i} = "{value}"\n' for i in range(100))).encode()
        for i in range(self.rng.randint(24, 32)):
            big[f"big-wide-{tag}-{i:02d}"] = (wide, {"Healthy", "Unhealthy"})
        for name, (data, health) in big.items():
            (self.colad.device_dir / name).write_bytes(data)
            self.health[name] = health
        grow = self.colad.device_dir / f"big-growing-{tag}"
        with open(grow, "wb") as handle:  # read while it grows past the limit: ends Unhealthy
            for _ in range(8):
                handle.write(b"#" * (LIMIT // 7))
                handle.flush()
        self.health[grow.name] = {"Unhealthy"}
        self.change_devices()
        self.wait_invariant("oversized_files (written)")
        for name in [*big, grow.name]:
            self.colad.remove(name)
            self.health.pop(name)
        self.change_devices()

    def slow_files(self) -> None:
        """tomllib-pathological files (quadratic dotted keys, deep nesting): Unhealthy at once, nothing stalls."""
        chosen = self.rng.sample(sorted(SLOW_FILES), self.rng.randint(1, len(SLOW_FILES)))
        names = [f"slow-{kind}-{self.counter}" for kind in chosen]
        for kind, name in zip(chosen, names, strict=True):
            (self.colad.device_dir / name).write_bytes(SLOW_FILES[kind])
            self.health[name] = {"Unhealthy"}
        self.change_devices()  # must not wait behind the slow parses
        # 15 s: one 60 KB dotted key alone takes tomllib that long, so a stall shows.
        self.wait_invariant("slow_files (written)", deadline=min(self.deadline, 15.0))
        for name in names:
            self.colad.remove(name)
            self.health.pop(name)
        self.change_devices()

    def reload(self) -> subprocess.CompletedProcess[str]:
        """`colad reload`, as an operator runs it."""
        command = [sys.executable, "-m", "colad", "reload"]
        return subprocess.run(command, env=self.colad.env, capture_output=True, text=True, timeout=60)

    def config_alias_reload(self) -> None:
        """A second resource on the same directory spelled differently: refused by `colad reload` and by SIGHUP."""
        real = str(self.colad.device_dir)
        link = self.root / "colas-alias"
        if not link.is_symlink():
            link.symlink_to(self.colad.device_dir)
        parent, leaf = os.path.split(real)
        spelling = self.rng.choice(
            [
                real + "/",
                real + "//",
                f"{parent}/./{leaf}",
                f"{parent}/{leaf}/../{leaf}",
                f"{parent}//{leaf}",
                str(link),
                real + "/nested",
            ]
        )
        (self.colad.device_dir / "nested").mkdir(exist_ok=True)
        alias = f'\n[[resources]]\nname = "example.com/alias"\ndevice_dir = "{spelling}"\n'
        self.config.write_text(self.good_config + alias)
        refused_before = len(self.colad.log_lines("reload refused; the running config stays"))
        try:
            run = self.reload()
            detail = f"device_dir {spelling!r}: rc={run.returncode} stderr={run.stderr!r}"
            assert run.returncode == 2, f"colad reload accepted an alias: {detail}"
            assert len(run.stderr.splitlines()) == 1 and "Traceback" not in run.stderr, detail
            # And behind the command's back: each role checks the file again and keeps its config.
            self.colad.rpc().supervisor.signalProcessGroup("colad", "HUP")
            self.colad.wait_log(
                "reload refused; the running config stays", timeout=self.deadline, count=refused_before + len(PROGRAMS)
            )
            self.change_devices()
        finally:
            self.config.write_text(self.good_config)
            (self.colad.device_dir / "nested").rmdir()
            # The operator's fix: the good file reloaded, so no refused reload stays in /healthz.
            fixed = self.reload()
            assert fixed.returncode == 0, f"the good config was not reloaded: rc={fixed.returncode} {fixed.stderr!r}"

    # ---- faults: the metrics port ----
    def http_flood(self) -> None:
        """Idle half-sent requests and rapid connections on the metrics port for 1-4 s (loopback), a kubelet
        restart in the middle of one flood in two; /healthz must answer 200 within 5 s meanwhile."""
        address = metrics_address(self.colad.run_dir)
        seconds = self.rng.uniform(1.0, 4.0)
        with flooding(address, idle_rate=self.rng.choice([6, 40, 100]), rapid_rate=200) as flood:
            wait_until(lambda: flood.counts.idle_opened >= 5, 10, "the flood under way")
            code, body = http_get(f"http://{address}/healthz")
            assert code == 200, f"/healthz {code} {body.strip()} during an HTTP flood"
            if self.rng.random() < 0.5:
                self.kubelet.restart()
                self.change_devices()
            time.sleep(seconds)
        self.change_devices()

    # ---- the loop ----
    def inject(self, fault: str) -> Record:
        started = time.monotonic()
        try:
            self.faults[fault]()
            recovery = self.wait_invariant(fault)
            record = Record(fault, recovery)
        except AssertionError as exc:  # WaitTimeout, or a fault's own check (a reload that was accepted)
            lost = len(self.wrong(self.kubelet.devices() or {}))
            record = Record(fault, None, lost, f"{self.problem()}\n{str(exc)[:3000]}")
        finally:
            self.health.clear()
        record.guard = self.colad.guard_check()
        self.records.append(record)
        took = time.monotonic() - started
        status = f"recovered in {record.recovery_s * 1000:.0f} ms" if record.recovery_s is not None else "LOST"
        guard = f" GUARD: {len(record.guard)} problem(s)" if record.guard else ""
        self.log(f"chaos fault={fault} {status} (fault+recovery {took:.1f}s){guard}")
        for problem in record.guard:
            self.log(problem)
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
        guard = [p for r in self.records for p in r.guard] + self.shutdown_guard
        exits = sum(p.startswith("role ") for p in guard)
        lines.append(
            f"faults={len(self.records)} recovered={recovered} lost_devices={lost_devices}"
            f" unasked_exits={exits} tracebacks={len(guard) - exits}"
        )
        return "\n".join(lines)

    def clean(self) -> bool:
        return (
            all(r.recovery_s is not None and not r.guard for r in self.records)
            and not self.shutdown_guard
            and not self.kubelet.violations
        )
