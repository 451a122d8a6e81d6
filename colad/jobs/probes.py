"""Health probes: a command per device, run without a shell, whose verdict joins the device's health.

ProbeRunner is a non-blocking object the discovery loop polls: it hands out the fds to wait on
(each probe's output pipe, and a pidfd that becomes readable when it exits) and the next
deadline; poll() starts due probes (at most max_in_flight at once), reads output, reaps, kills
a probe past its timeout and returns the verdicts that changed. A probe that ends, or is killed,
ends with everything it started (commands.py owns the processes). Nothing in it waits, but
for killed processes to exit (microseconds; at most commands.DEATH_WAIT for one in D state).
The pure parts (first_line, outcome) are separate for the unit tests.
"""

from __future__ import annotations

import heapq
import os
import signal
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from colad.core import trust
from colad.core.device_rules import one_line
from colad.jobs import commands
from colad.runtime import log, pathtrust

LOG = log.get(__name__)
PENDING = "probe has not completed yet"
MAX_REASON = 200
OUTPUT_LIMIT = 4096  # bytes kept of a probe's output; the rest is read and dropped (no pipe stall)
DEFAULT_MAX_IN_FLIGHT = 4
# Without a pidfd (kernel < 5.3, or a seccomp profile refusing pidfd_open) an exit is only seen on
# the next poll: the deadline then comes this soon while a probe runs.
NO_PIDFD_POLL = 0.05
BASE_ENV = {"PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "LANG": "C.UTF-8"}


@dataclass(frozen=True)
class Probe:
    """One probe: argv (no shell), its timeout and its interval in seconds, extra environment."""

    command: tuple[str, ...]
    timeout: float = 5.0
    interval: float = 30.0
    env: tuple[tuple[str, str], ...] = ()  # e.g. (("COLA_DEVICE_ID", "cola1"),)


@dataclass(frozen=True)
class ProbeResult:
    healthy: bool
    reason: str = ""  # "" when healthy


def first_line(output: bytes) -> str:
    """The first non-blank line of `output`, decoded leniently, without control characters, bounded."""
    for raw in output.splitlines():
        line = one_line(raw.decode("utf-8", "replace"))
        if line:
            return line if len(line) <= MAX_REASON else line[: MAX_REASON - 3] + "..."
    return ""


def outcome(returncode: int | None, output: bytes, timeout: float | None = None) -> ProbeResult:
    """The verdict of a finished probe: `returncode` as Popen gives it (negative = signal), or
    None with `timeout` set when it was killed for running too long."""
    line = first_line(output)
    if returncode is None:
        return ProbeResult(False, f"timed out after {timeout:g}s" + (f": {line}" if line else ""))
    if returncode == 0:
        return ProbeResult(True)
    if returncode < 0:
        try:
            name = signal.Signals(-returncode).name
        except ValueError:
            name = f"signal {-returncode}"
        return ProbeResult(False, f"killed by {name}" + (f": {line}" if line else ""))
    return ProbeResult(False, line or f"exit status {returncode}")


@dataclass
class _Running:
    key: str
    probe: Probe
    child: commands.Child
    deadline: float
    pidfd: int | None
    output: bytearray = field(default_factory=bytearray)
    killed: bool = False  # timed out: its verdict is out, the slot stays taken until it is reaped


class ProbeRunner:
    """Runs the probes set with set_probes(); the caller waits on fds() until next_deadline()."""

    def __init__(
        self,
        max_in_flight: int = DEFAULT_MAX_IN_FLIGHT,
        clock: Callable[[], float] = time.monotonic,
        env: Mapping[str, str] = BASE_ENV,
        trusted: frozenset[int] = trust.ROOT_ONLY,
    ) -> None:
        self.max_in_flight = max(1, max_in_flight)
        self.trusted = trusted  # whose programs may run as probes (trust.program_problem)
        self.clock = clock
        self.env = dict(env)
        self._probes: dict[str, Probe] = {}
        self._verdicts: dict[str, ProbeResult] = {}
        self._due: list[tuple[float, str]] = []  # heap of (next run, key); stale entries skipped
        self._next: dict[str, float] = {}
        self._running: dict[str, _Running] = {}
        self._reaping: list[_Running] = []  # killed and not yet reaped: still count as in flight
        self.started = 0
        self.spawn_failures = 0
        self.timeouts = 0
        self.refused = 0  # runs refused: a program someone untrusted can write
        self.leftovers = 0  # processes probes left running when they ended, killed
        self._warned: set[tuple[str, ...]] = set()  # commands whose leftovers were logged

    # --- configuration -----------------------------------------------------------------------

    def set_probes(self, probes: Mapping[str, Probe]) -> None:
        """Make `probes` the set to run; a new or changed probe runs at once and is pending until then."""
        now = self.clock()
        for key in list(self._probes):
            if probes.get(key) != self._probes[key]:
                self._forget(key)
        for key, probe in probes.items():
            if key not in self._probes:
                self._probes[key] = probe
                self._verdicts[key] = ProbeResult(False, PENDING)
                self._schedule(key, now)

    def verdicts(self) -> dict[str, ProbeResult]:
        return dict(self._verdicts)

    def verdict(self, key: str) -> ProbeResult | None:
        """The verdict of one probe (None: not set), without copying them all."""
        return self._verdicts.get(key)

    @property
    def in_flight(self) -> int:
        return len(self._running) + len(self._reaping)

    # --- what the caller waits on ------------------------------------------------------------

    def fds(self) -> list[int]:
        fds = []
        for run in list(self._running.values()) + self._reaping:
            if run.pidfd is not None:
                fds.append(run.pidfd)
            stdout = run.child.popen.stdout
            if stdout is not None and not stdout.closed:
                fds.append(stdout.fileno())
        return fds

    def next_deadline(self) -> float | None:
        """The monotonic time poll() must be called by, or None when nothing is scheduled."""
        times = [r.deadline for r in self._running.values()]
        if commands.pending() or any(r.pidfd is None for r in list(self._running.values()) + self._reaping):
            times.append(self.clock() + NO_PIDFD_POLL)
        self._drop_stale()
        if self._due and self.in_flight < self.max_in_flight:
            times.append(self._due[0][0])
        return min(times) if times else None

    # --- the work ------------------------------------------------------------------------------

    def poll(self) -> dict[str, ProbeResult]:
        """Read, reap, time out and start what is due; the verdicts that changed, by key."""
        now = self.clock()
        changed: dict[str, ProbeResult] = {}
        for run in list(self._running.values()):
            self._drain(run)
            if run.child.exited():
                self._drain(run)
                # Kill what it left behind (`cmd &` holds the pipe; a daemon would live on) while
                # its pid still names its group and tree: it is reaped only after.
                self._left(run, run.child.kill())
                returncode = run.child.wait()
                self._finish(run, now)
                self._set(run.key, outcome(returncode, bytes(run.output)), changed)
            elif now >= run.deadline:
                self.timeouts += 1
                self._left(run, run.child.kill())
                run.killed = True
                del self._running[run.key]
                self._reaping.append(run)
                self._schedule(run.key, now + run.probe.interval)
                self._set(run.key, outcome(None, bytes(run.output), run.probe.timeout), changed)
        for run in list(self._reaping):
            self._drain(run)
            if run.child.poll() is not None:
                self._reaping.remove(run)
                self._close(run)
        if commands.pending():
            commands.sweep()  # reaps what a probe's end killed once it has exited
        self._start_due(now, changed)
        return changed

    def close(self) -> None:
        """Kill every running probe with everything it started, and reap them (bounded wait)."""
        for run in list(self._running.values()) + self._reaping:
            import subprocess  # noqa: PLC0415 - a probe ran, so it is loaded already

            run.child.kill()
            try:
                run.child.wait(timeout=1.0)
            except subprocess.TimeoutExpired:
                pass  # in uninterruptible sleep; init reaps it once this process exits
            self._close(run)
        self._running.clear()
        self._reaping.clear()
        commands.settle(1.0)

    # --- internals -----------------------------------------------------------------------------

    def _schedule(self, key: str, when: float) -> None:
        self._next[key] = when
        heapq.heappush(self._due, (when, key))

    def _drop_stale(self) -> None:
        while self._due and (self._due[0][1] not in self._probes or self._next.get(self._due[0][1]) != self._due[0][0]):
            heapq.heappop(self._due)

    def _start_due(self, now: float, changed: dict[str, ProbeResult]) -> None:
        while self.in_flight < self.max_in_flight:
            self._drop_stale()
            if not self._due or self._due[0][0] > now:
                return
            _, key = heapq.heappop(self._due)
            self._next.pop(key, None)
            if key in self._running:
                continue
            self._start(key, now, changed)

    def _start(self, key: str, now: float, changed: dict[str, ProbeResult]) -> None:
        probe = self._probes[key]
        untrusted = pathtrust.program_problem(probe.command[0], self.trusted)
        if untrusted is not None:  # never run as root: its verdict says why, as a program that fails to start
            self.refused += 1
            self._schedule(key, now + probe.interval)
            self._set(key, ProbeResult(False, f"not run: {untrusted}"), changed)
            return
        env = {**self.env, **dict(probe.env)}
        try:
            child = commands.start(probe.command, env)
        except (OSError, ValueError) as exc:  # ENOENT, EACCES, ENOEXEC; ValueError: NUL in argv
            self.spawn_failures += 1
            reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
            self._schedule(key, now + probe.interval)
            self._set(
                key, ProbeResult(False, f"cannot run {first_line(probe.command[0].encode())!r}: {reason}"), changed
            )
            return
        self.started += 1
        assert child.popen.stdout is not None
        os.set_blocking(child.popen.stdout.fileno(), False)
        pidfd: int | None
        try:
            pidfd = os.pidfd_open(child.pid)
        except (AttributeError, OSError):
            pidfd = None
        self._running[key] = _Running(key, probe, child, now + probe.timeout, pidfd)

    def _drain(self, run: _Running) -> None:
        stdout = run.child.popen.stdout
        if stdout is None or stdout.closed:
            return
        while True:
            try:
                chunk = os.read(stdout.fileno(), 65536)
            except BlockingIOError:
                return
            except OSError:
                chunk = b""
            if not chunk:
                stdout.close()  # EOF: nothing more to wait on from this pipe
                return
            room = OUTPUT_LIMIT - len(run.output)
            if room > 0:
                run.output += chunk[:room]

    def _finish(self, run: _Running, now: float) -> None:
        del self._running[run.key]
        self._close(run)
        if run.key in self._probes:
            self._schedule(run.key, now + run.probe.interval)

    def _left(self, run: _Running, count: int) -> None:
        """A probe left `count` processes running (killed now): counted, logged once per command."""
        if count:
            self.leftovers += count
            if run.probe.command not in self._warned:
                self._warned.add(run.probe.command)
                LOG.warning("probe left processes running; killed", command=run.probe.command[0], killed=count)

    def _close(self, run: _Running) -> None:
        stdout = run.child.popen.stdout
        if stdout is not None and not stdout.closed:
            stdout.close()
        if run.pidfd is not None:
            os.close(run.pidfd)
            run.pidfd = None

    def _forget(self, key: str) -> None:
        run = self._running.pop(key, None)
        if run is not None:
            run.child.kill()
            self._reaping.append(run)
        self._probes.pop(key, None)
        self._verdicts.pop(key, None)
        self._next.pop(key, None)

    def _set(self, key: str, verdict: ProbeResult, changed: dict[str, ProbeResult]) -> None:
        if key in self._probes and self._verdicts.get(key) != verdict:
            self._verdicts[key] = verdict
            changed[key] = verdict
