"""What a probe or a prepare command starts ends with it, on real processes.

This process plays the role: a child subreaper (as discovery and the plugin make themselves)
that finds processes through the kernel's children files or, as without them, a scan of /proc,
runs probes through ProbeRunner and prepares through prestart.run. Each command escapes in its
own way (a background child, a double fork into a new session, one with its environment
cleared, a daemon that keeps forking, one that ignores SIGTERM and closes its output); whether
the command exits or times out, nothing it started survives, no zombie stays, and a command's
own daemon lives while that command runs. The role's stop (commands.stopping) runs in a child
process, as the plugin takes SIGTERM.
"""

from __future__ import annotations

import itertools
import os
import random
import shlex
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from colad.jobs import commands, prestart
from colad.jobs.probes import BASE_ENV, PENDING, Probe, ProbeResult, ProbeRunner
from tests.helpers import wait_until

pytestmark = pytest.mark.integration
SH = "/bin/sh"
DEADLINE = 15.0  # generous: the machine is shared
_COUNTER = itertools.count(1)


def token() -> str:
    """A `sleep` argument no other process on the machine has: `sleep 600.<pid><n>`."""
    return f"600.{os.getpid()}{next(_COUNTER):04d}"


def survivors(tok: str) -> list[int]:
    """Live (not zombie) processes whose command line holds `tok`."""
    found = []
    needle = tok.encode()
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            cmdline = Path(f"/proc/{name}/cmdline").read_bytes()
            state = Path(f"/proc/{name}/stat").read_bytes().rsplit(b")", 1)[1].split()[0]
        except (OSError, IndexError):
            continue
        if needle in cmdline and state != b"Z":
            found.append(int(name))
    return found


def zombies_of(pid: int) -> int:
    count = 0
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            fields = Path(f"/proc/{name}/stat").read_bytes().rsplit(b")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if int(fields[1]) == pid and fields[0] == b"Z":
            count += 1
    return count


def describe(pids: list[int]) -> str:
    """Each process as `pid ppid state COLAD_COMMAND`, for a failure message."""
    lines = []
    for pid in pids:
        try:
            fields = Path(f"/proc/{pid}/stat").read_bytes().rsplit(b")", 1)[1].split()
            marker = [e for e in Path(f"/proc/{pid}/environ").read_bytes().split(b"\0") if e.startswith(b"COLAD_")]
        except (OSError, IndexError):
            continue
        lines.append(f"{pid} ppid={int(fields[1])} state={fields[0].decode()} {marker} (test pid {os.getpid()})")
    lines.append(f"commands running={commands.running()} pending={commands.pending()}")
    return "; ".join(lines)


def gone(tok: str) -> None:
    try:
        wait_until(lambda: not survivors(tok), DEADLINE, f"no process left holding {tok}")
    except AssertionError as exc:
        raise AssertionError(f"left: {describe(survivors(tok))}") from exc


# Each escape starts `sleep <tok>` (SLEEP) in its own way; {then} is how the command goes on.
ESCAPES = {
    "background child": "{SLEEP} & {then}",
    "double fork into a new session": "(setsid {SLEEP} &); {then}",
    "double fork with the environment cleared": "(env -i /usr/bin/setsid {SLEEP} &); {then}",
    "a daemon with children of its own": "(setsid sh -c '{SLEEP} & {SLEEP} & wait' &); {then}",
    "a daemon that keeps forking": (  # for 200 rounds: bounded even where the kill fails
        "(setsid sh -c 'i=0; while [ $i -lt 200 ]; do {SLEEP} & sleep 0.02; i=$((i+1)); done' &); {then}"
    ),
    "ignores SIGTERM and closes its output": (
        "(setsid sh -c 'trap \"\" TERM HUP; exec {SLEEP}' </dev/null >/dev/null 2>&1 &); {then}"
    ),
}
EXITS = "echo started; exit 0"
HANGS = "echo started; exec sleep 60"


def script(escape: str, tok: str, then: str) -> str:
    return ESCAPES[escape].format(SLEEP=f"sleep {tok}", then=then)


@pytest.fixture(params=["children files", "a scan of /proc"])
def subreaper(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """This process as a subreaper role; processes found through /proc/<pid>/task/*/children
    (CONFIG_PROC_CHILDREN) or, as on kernels without them, through every /proc/<pid>/stat."""
    if request.param == "children files" and not commands.CHILDREN_FILES:
        pytest.skip("this kernel has no /proc/<pid>/task/<tid>/children")
    monkeypatch.setattr(commands, "CHILDREN_FILES", request.param == "children files")
    assert commands.become_subreaper()
    yield
    commands.child_exited()  # no SIGCHLD handler here: as if one had come
    commands.settle(2.0)
    commands.become_subreaper(False)
    leftover = zombies_of(os.getpid())
    assert leftover == 0, f"{leftover} zombies left in the test process"


def drive(runner: ProbeRunner, until: Callable[[], bool], describe: str) -> None:
    end = time.monotonic() + DEADLINE
    while not until():
        assert time.monotonic() < end, f"timed out waiting for {describe}: {runner.verdicts()}"
        deadline = runner.next_deadline()
        wait = 0.2 if deadline is None else min(0.2, max(0.0, deadline - time.monotonic()))
        fds = runner.fds()
        if fds:
            import select

            select.select(fds, [], [], wait)
        else:
            time.sleep(wait)
        runner.poll()


@pytest.mark.parametrize("escape", list(ESCAPES))
@pytest.mark.parametrize("ends", ["exits", "times out"])
def test_a_probe_ends_with_everything_it_started(subreaper: None, escape: str, ends: str) -> None:
    tok = token()
    runner = ProbeRunner(env=BASE_ENV)
    then, timeout = (EXITS, 10.0) if ends == "exits" else (HANGS, 0.5)
    try:
        runner.set_probes({"cola1": Probe((SH, "-c", script(escape, tok, then)), timeout=timeout, interval=3600)})
        drive(runner, lambda: runner.verdicts()["cola1"].reason != PENDING, "a verdict")
        expected = ProbeResult(True) if ends == "exits" else ProbeResult(False, "timed out after 0.5s: started")
        assert runner.verdicts()["cola1"] == expected
        drive(runner, lambda: runner.in_flight == 0 and not commands.pending(), "the probe reaped")
        gone(tok)
        if escape != "double fork with the environment cleared":  # carries no marker: no command's
            assert runner.leftovers >= 1
    finally:
        runner.close()
    assert commands.running() == 0


@pytest.mark.parametrize("escape", list(ESCAPES))
@pytest.mark.parametrize("ends", ["exits", "times out"])
def test_a_prepare_command_ends_with_everything_it_started(subreaper: None, escape: str, ends: str) -> None:
    tok = token()
    then, timeout = (EXITS, 10.0) if ends == "exits" else (HANGS, 0.5)
    step = prestart.Step((SH, "-c", script(escape, tok, then)), ("cola1",), ())
    result = prestart.run(step, timeout)
    if ends == "exits":
        assert (result.ok, result.timed_out) == (True, False), result
    else:
        assert (result.ok, result.timed_out, result.reason) == (False, True, "timed out after 0.5s: started")
    gone(tok)
    if escape != "double fork with the environment cleared":  # carries no marker: no command's
        assert result.leftovers >= 1, result
    assert commands.running() == 0


def random_tree(rng: random.Random, sleep: str, depth: int = 0) -> str:
    """Shell statements that start `sleep` processes in a random tree of escapes without blocking:
    backgrounded, double-forked into a new session, through a shell with its environment cleared,
    several in a row; each escaped shell runs more of them, or the sleep itself, then waits or not."""
    kind = rng.choice(["bg", "setsid", "env -i", "two"] if depth < 3 else ["bg"])
    if kind == "two":
        return f"{random_tree(rng, sleep, depth + 1)}\n{random_tree(rng, sleep, depth + 1)}"
    body = sleep if depth >= 2 or rng.random() < 0.3 else random_tree(rng, sleep, depth + 1)
    body += rng.choice(["\nwait", "\nsleep 600", ""]) if body != sleep else ""
    if kind == "bg":
        return f"{{ {body}\n}} &"
    if kind == "setsid":
        return f"(setsid /bin/sh -c {shlex.quote(body)} &)"
    return f"(env -i /bin/sh -c {shlex.quote('PATH=/usr/bin:/bin' + chr(10) + body)} &)"


@pytest.mark.parametrize("seed", range(12))
def test_random_trees_of_escapes_end_with_their_command(subreaper: None, seed: int) -> None:
    rng = random.Random(seed)
    tok = token()
    tree = random_tree(rng, f"sleep {tok}")
    ends = rng.choice(["exits", "times out"])
    then, timeout = (EXITS, 10.0) if ends == "exits" else (HANGS, 0.5)
    command = f"{tree}\n{then}"
    if rng.random() < 0.5:
        result = prestart.run(prestart.Step((SH, "-c", command), ("cola1",), ()), timeout)
        assert (result.ok, result.timed_out) == (ends == "exits", ends != "exits"), (seed, command, result)
    else:
        runner = ProbeRunner(env=BASE_ENV)
        try:
            runner.set_probes({"cola1": Probe((SH, "-c", command), timeout=timeout, interval=3600)})
            drive(runner, lambda: runner.verdicts()["cola1"].reason != PENDING, "a verdict")
            assert runner.verdicts()["cola1"].healthy == (ends == "exits"), (seed, command)
            drive(runner, lambda: runner.in_flight == 0, "the probe reaped")
        finally:
            runner.close()
    try:
        gone(tok)
    except AssertionError as exc:
        raise AssertionError(f"seed {seed}: {command}") from exc


def test_zombies_stay_bounded_over_many_probe_cycles(subreaper: None) -> None:
    """Orphans that exit on their own, and daemons killed at each probe's end, are reaped as they go."""
    tok = token()
    probe = f"(setsid true &); (setsid sleep {tok} &); (setsid sh -c 'sleep 0.01' &); sleep 0.05; exit 0"
    runner = ProbeRunner(max_in_flight=2, env=BASE_ENV)
    peak = 0

    def twenty_cycles() -> bool:
        nonlocal peak
        peak = max(peak, zombies_of(os.getpid()))
        return runner.started >= 40

    try:
        runner.set_probes({f"cola{i}": Probe((SH, "-c", probe), timeout=5, interval=0.02) for i in range(2)})
        drive(runner, twenty_cycles, "20 cycles of two probes")
    finally:
        runner.close()
    print(f"peak zombies over {runner.started} probe runs: {peak}")
    assert peak <= 8, peak  # at most what two probes' ends leave before the next poll reaps them
    gone(tok)


def test_a_running_commands_own_daemon_lives_while_others_end(subreaper: None, tmp_path: Path) -> None:
    """Attribution: the daemon a prepare still waits for is not killed when another command ends."""
    flag = tmp_path / "flag"
    waits = f"(setsid sh -c 'sleep 1; touch {flag}' &); sleep 2.5; test -e {flag} || echo lost; test -e {flag}"
    result: list[prestart.Result] = []
    thread = threading.Thread(target=lambda: result.append(prestart.run(prestart.Step((SH, "-c", waits), (), ()), 20)))
    thread.start()
    tok = token()
    probe = ProbeRunner(env=BASE_ENV)
    try:
        probe.set_probes({"other": Probe((SH, "-c", f"(setsid sleep {tok} &); exit 0"), interval=0.05)})
        drive(probe, lambda: probe.started >= 10 and not thread.is_alive(), "the prepare's end, ten probes meanwhile")
    finally:
        probe.close()
        thread.join()
    assert result[0].ok, result[0]
    gone(tok)


def test_without_a_subreaper_what_carries_the_marker_is_still_killed() -> None:
    """A role that could not become a subreaper finds a double fork's daemon by its marker."""
    assert not commands.is_subreaper()
    tok = token()
    step = prestart.Step((SH, "-c", script("double fork into a new session", tok, EXITS)), ("cola1",), ())
    assert prestart.run(step, 10).ok
    gone(tok)


STOPPER = """
import signal, sys, threading, time
from colad.jobs import commands
from colad.jobs import prestart
signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})  # as the plugin takes it: sigwait
commands.become_subreaper()
step = prestart.Step(("/bin/sh", "-c", sys.argv[1]), ("cola1",), ())
results = []
thread = threading.Thread(target=lambda: results.append(prestart.run(step, 60)))
thread.start()
signal.sigwait({signal.SIGTERM})
with commands.stopping():
    thread.join(5)
print("result", results[0].ok if results else "none", "alive", thread.is_alive(), flush=True)
"""


def test_the_roles_stop_kills_running_commands_and_their_grandchildren() -> None:
    tok = token()
    command = f"(setsid sh -c 'sleep {tok} & sleep {tok}' &); sleep {tok} & echo started; sleep 60"
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[3])}
    role = subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(STOPPER), command],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        env=env,
    )
    try:
        signalled = False

        def started() -> bool:
            return len(survivors(tok)) >= 3

        wait_until(started, DEADLINE, "the command and its grandchildren running")
        role.send_signal(15)
        signalled = True
        out, _ = role.communicate(timeout=DEADLINE)
    finally:
        if role.poll() is None:
            role.kill()
            role.wait()
    assert signalled
    text = out.decode()
    assert "result False alive False" in text and "Traceback" not in text, text
    gone(tok)


def test_a_kill_while_the_command_forks_and_exits_leaves_nothing(subreaper: None) -> None:
    """The kill's look at the tree races the command: a subshell forks `setsid sleep` and exits while
    the kill reads the table, so the daemon is adopted unseen by that look. A pass that meets a
    process which ended while it looked is followed by another; no sweep after the kill is needed."""
    rng = random.Random(7)
    tok = token()
    for _ in range(200):
        child = commands.start((SH, "-c", f"(setsid sleep {tok} &); (setsid sleep {tok} &); exit 0"), BASE_ENV)
        time.sleep(rng.uniform(0.0, 0.01))
        child.kill()
        child.wait(5)
        assert not survivors(tok), f"left: {describe(survivors(tok))}"
