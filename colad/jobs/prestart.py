"""PreStartContainer's prepare commands: which command runs for which devices, and running it.

plan() is pure: the requested IDs grouped by the command that prepares them (a device file's
own `prepare`, else the resource's), each with its arguments and environment. run() is the
thin shell: no shell, stdin closed, output bounded, killed at the deadline; whether it exits or
is killed, everything it started is killed with it (commands.py owns the processes). The first
line of its output is the reason of a failure.
"""

from __future__ import annotations

import os
import select
import selectors
import threading
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from colad.core import trust
from colad.core.constants import COLA_DEVICES_ENV, COLA_REPLICAS_ENV
from colad.core.devices import Device, DeviceSet, base_id
from colad.jobs import commands
from colad.jobs.probes import BASE_ENV, OUTPUT_LIMIT, outcome
from colad.runtime import pathtrust

# Prepare commands running at once in one plugin (each PreStartContainer call runs its own); a call
# that waits for a turn waits within its deadline.
MAX_RUNNING = 4
RESOURCE_ENV = "COLA_RESOURCE_NAME"
_SLOTS = threading.BoundedSemaphore(MAX_RUNNING)
# Kept off the kubelet's deadline: killing the command with what it started and answering fit in it
# (unless a killed process hangs in D state: commands.DEATH_WAIT per pass).
ANSWER_MARGIN = 1.0
POLL_INTERVAL = 0.05  # how soon the command's exit is noticed while its output pipe is quiet
SETTLE = 0.2  # after the kill, how long what it left may take to be reaped before the answer goes


@dataclass(frozen=True)
class Step:
    """One command run: argv (the device IDs appended), the devices it prepares, its environment."""

    argv: tuple[str, ...]
    device_ids: tuple[str, ...]  # as requested (replica IDs included)
    env: tuple[tuple[str, str], ...]


@dataclass(frozen=True)
class Result:
    ok: bool
    reason: str = ""  # why it failed: the first line of its output, an exit status, a timeout
    timed_out: bool = False
    refused: bool = False  # not run: a program someone untrusted could have written
    leftovers: int = 0  # processes it left running, killed at its end


class UnknownDevice(Exception):
    """A requested ID is not advertised (its device file went away since the kubelet allocated it)."""


def plan(resource: str, command: tuple[str, ...], devices: DeviceSet, requested: Sequence[str]) -> list[Step]:
    """The commands to run for `requested`, in order of each command's first device; raises UnknownDevice.

    A device's own prepare (devices.Device.prepare, when set) replaces `command`; () means none.
    Only when `command` is set: a resource without one registers without pre_start_required,
    so the kubelet never calls (ignored_prepares names such devices for a warning), and a call
    that comes anyway runs nothing the kubelet was never told about. Each command gets the
    physical IDs of its devices as arguments, once each in request order, and COLA_DEVICES
    (those IDs), COLA_REPLICAS (the requested IDs, when any is a replica) and COLA_RESOURCE_NAME.
    """
    groups: dict[tuple[str, ...], list[str]] = {}
    for device_id in dict.fromkeys(requested):
        device = devices.get(device_id)
        if device is None:
            raise UnknownDevice(device_id)
        own = device.prepare if device.prepare is not None and command else command
        if own:
            groups.setdefault(own, []).append(device_id)
    steps = []
    for argv, ids in groups.items():
        physical = tuple(dict.fromkeys(base_id(i) for i in ids))
        env = {RESOURCE_ENV: resource, COLA_DEVICES_ENV: ",".join(physical)}
        if any(base_id(i) != i for i in ids):
            env[COLA_REPLICAS_ENV] = ",".join(ids)
        steps.append(Step(argv + physical, tuple(ids), tuple(sorted(env.items()))))
    return steps


def ignored_prepares(command: tuple[str, ...], devices: Iterable[Device]) -> tuple[str, ...]:
    """The IDs of devices naming a prepare of their own that plan() never runs: `command` is ()."""
    return () if command else tuple(d.device_id for d in devices if d.prepare)


def run(step: Step, timeout: float, trusted: frozenset[int] = trust.ROOT_ONLY) -> Result:
    """Run `step` for at most `timeout` seconds (a wait for a free slot included); never raises.

    A program that a user outside `trusted` could have written is not run (trust.program_problem).
    """
    untrusted = pathtrust.program_problem(step.argv[0], trusted)
    if untrusted is not None:
        return Result(False, f"not run: {untrusted}", refused=True)
    deadline = time.monotonic() + timeout
    if not _SLOTS.acquire(timeout=timeout):
        return Result(False, f"no free slot for the prepare command within {timeout:g}s", timed_out=True)
    try:
        return _run(step, deadline, timeout)
    finally:
        _SLOTS.release()


def _run(step: Step, deadline: float, timeout: float) -> Result:
    try:
        child = commands.start(step.argv, {**BASE_ENV, **dict(step.env)})
    except (OSError, ValueError) as exc:
        return Result(False, f"cannot run {step.argv[0]}: {getattr(exc, 'strerror', None) or exc}")
    stdout = child.popen.stdout
    assert stdout is not None
    output = bytearray()
    exited = False
    try:
        with selectors.DefaultSelector() as selector:
            selector.register(stdout, selectors.EVENT_READ)
            # Until it exits and its output is read, or the deadline. A child it left behind may
            # hold the pipe open: once the command itself has exited, only what is there is read.
            # Beyond OUTPUT_LIMIT the output is read and dropped, so it never stalls on a full pipe.
            while (left := deadline - time.monotonic()) > 0:
                exited = child.exited()
                if not selector.select(0 if exited else min(left, POLL_INTERVAL)):
                    if exited:
                        break
                    continue
                chunk = os.read(stdout.fileno(), 65536)
                if not chunk:
                    break
                output += chunk[: max(0, OUTPUT_LIMIT - len(output))]
        exited = exited or _exits_by(child, deadline)  # EOF can come just before the exit status does
    finally:
        leftovers = child.kill()  # what it left behind, and the command itself past the deadline
        returncode = child.wait()
        stdout.close()
        commands.settle(SETTLE)
    verdict = outcome(returncode if exited else None, bytes(output), timeout)
    return Result(verdict.healthy, verdict.reason, timed_out=not exited, leftovers=leftovers)


def _exits_by(child: commands.Child, deadline: float) -> bool:
    """Whether the command exits before `deadline`, without reaping it."""
    try:
        pidfd: int | None = os.pidfd_open(child.pid)
    except (AttributeError, OSError):
        pidfd = None
    try:
        while not child.exited():
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            if pidfd is not None:
                select.select([pidfd], [], [], left)
            else:
                time.sleep(min(left, POLL_INTERVAL))
        return True
    finally:
        if pidfd is not None:
            os.close(pidfd)
