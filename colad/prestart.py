"""PreStartContainer's prepare commands: which command runs for which devices, and running it.

plan() is pure: the requested IDs grouped by the command that prepares them (a device file's
own `prepare`, else the resource's), each with its arguments and environment. run() is the
thin shell: no shell, its own process group, stdin closed, output bounded, killed with its
whole group at the deadline; the first line of its output is the reason of a failure.
"""

from __future__ import annotations

import os
import selectors
import signal
import subprocess
import threading
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from colad import pathtrust, trust
from colad.constants import COLA_DEVICES_ENV, COLA_REPLICAS_ENV
from colad.devices import Device, DeviceSet, base_id
from colad.probes import BASE_ENV, OUTPUT_LIMIT, outcome

# Prepare commands running at once in one plugin (each PreStartContainer call runs its own); a call
# that waits for a turn waits within its deadline.
MAX_RUNNING = 4
RESOURCE_ENV = "COLA_RESOURCE_NAME"
_SLOTS = threading.BoundedSemaphore(MAX_RUNNING)
# Kept off the kubelet's deadline: killing the command's group and answering fit in it.
ANSWER_MARGIN = 1.0
POLL_INTERVAL = 0.05  # how soon the command's exit is noticed while its output pipe is quiet


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
        child = subprocess.Popen(
            step.argv,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            env={**BASE_ENV, **dict(step.env)},
            start_new_session=True,  # its own process group: a timeout kills what it started, too
            close_fds=True,
        )
    except (OSError, ValueError) as exc:
        return Result(False, f"cannot run {step.argv[0]}: {getattr(exc, 'strerror', None) or exc}")
    assert child.stdout is not None
    output = bytearray()
    returncode: int | None = None
    try:
        with selectors.DefaultSelector() as selector:
            selector.register(child.stdout, selectors.EVENT_READ)
            # Until it exits and its output is read, or the deadline. A child it left behind may
            # hold the pipe open: once the command itself has exited, only what is there is read.
            # Beyond OUTPUT_LIMIT the output is read and dropped, so it never stalls on a full pipe.
            while (left := deadline - time.monotonic()) > 0:
                exited = child.poll() is not None
                if not selector.select(0 if exited else min(left, POLL_INTERVAL)):
                    if exited:
                        break
                    continue
                chunk = os.read(child.stdout.fileno(), 65536)
                if not chunk:
                    break
                output += chunk[: max(0, OUTPUT_LIMIT - len(output))]
        try:  # EOF can come just before the exit status does
            returncode = child.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            returncode = None
    finally:
        _kill_group(child.pid)  # what it left behind, and the command itself past the deadline
        child.wait()
        child.stdout.close()
    verdict = outcome(returncode, bytes(output), timeout)
    return Result(verdict.healthy, verdict.reason, timed_out=returncode is None)


def _kill_group(pgid: int) -> None:
    try:
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
