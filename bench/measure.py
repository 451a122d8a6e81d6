"""The measurements, written once against `Subject` so colad and the baseline go through the same code.

Every latency is taken at the fake kubelet (monotonic `at` / `answered_at` of
what it received) or around the client call it makes, never from a plugin's
own logs. Figures are returned in milliseconds, MiB and bytes, ready for JSON.
"""

from __future__ import annotations

import contextlib
import itertools
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

import grpc

from bench import procstat
from bench.subjects import Subject, settle
from colad.api import deviceplugin_pb2 as pb
from tests.fakes.kubelet import ListAndWatchUpdate
from tests.helpers import WaitTimeout


def ms(seconds: float) -> float:
    return round(seconds * 1000, 2)


def at(figures: Any, path: str) -> float | None:
    """The number at dotted `path` in a results dict, or None where there is none."""
    for key in path.split("."):
        figures = figures.get(key) if isinstance(figures, dict) else None
    return figures if isinstance(figures, int | float) else None


def percentile(values: Sequence[float], pct: float) -> float:
    """Nearest rank: p99 of 2,000 samples is the 20th largest."""
    ordered = sorted(values)
    index = min(len(ordered) - 1, max(0, round(pct / 100 * (len(ordered) - 1))))
    return ordered[index]


def summary(values: Sequence[float]) -> dict[str, float]:
    return {
        "n": len(values),
        "p50_ms": ms(percentile(values, 50)),
        "p99_ms": ms(percentile(values, 99)),
        "max_ms": ms(max(values)),
    }


def cold_start(subject: Subject, names: set[str], first: str) -> dict[str, float]:
    """Start the plugin over `names`; create `first` the moment Register is answered."""
    subject.create(*names)
    subject.kubelet.start()
    t0 = time.monotonic()
    subject.plugin.start(subject.root)
    registration = subject.registered()
    t1 = time.monotonic()
    subject.create(first)
    full = subject.full_list_after(0, names)
    changed = subject.update_after(0, lambda u: first in u.devices)
    subject.plugin.wait_ready()
    return {
        "registered_ms": ms(registration.answered_at - t0),
        "full_list_ms": ms(full.at - t0),
        "first_change_ms": ms(changed.at - t1),
    }


def quiet(subjects: Sequence[Subject], gap: float) -> None:
    """Every fake kubelet done with what it received (checkpoint fsynced), then `gap` seconds more.

    The kubelet writes its checkpoint before it reads the next message, and an fsync on this
    machine's disk takes 0.5 ms at the median but 20-190 ms at its tail: a change made during
    one waits for it in the stream, and its figure would be the disk's, whichever plugin sent
    it. The gap lets the plugin's own follow-up work (the watcher woken by that checkpoint) end.
    """
    for subject in subjects:
        subject.kubelet.wait_idle()
    time.sleep(gap)


def change(subject: Subject, name: str, create: bool, interval: float = 0.002) -> float:
    """Seconds from one create or unlink in the device directory to the first message that shows it.

    Returns once that message is at the fake kubelet, polled every `interval` seconds.
    """
    endpoint = subject.kubelet.current_endpoint()
    since = len(subject.kubelet.updates)
    started = time.monotonic()
    if create:
        subject.create(name)
    else:
        subject.unlink(name)
    update = subject.update_after(
        since, lambda u: u.endpoint == endpoint and (name in u.devices) == create, interval=interval
    )
    return update.at - started


def changes(
    subjects: Sequence[Subject], count: int, prefix: str, gap: float, *, remove_first: bool = False
) -> dict[str, list[float]]:
    """`count` changes per subject, interleaved, alternating create and unlink of `prefix-NNN`.

    Each change meets a quiet system, not the tail of the change before: a lone
    change, as on a node (see `quiet`).
    """
    seconds: dict[str, list[float]] = {s.name: [] for s in subjects}
    for i in range(count):
        for subject in subjects if i % 2 == 0 else reversed(subjects):
            quiet(subjects, gap)
            if remove_first:  # unlink an existing device, then create it again: the set never grows
                seconds[subject.name].append(change(subject, f"{prefix}{i // 2}", create=i % 2 == 1))
            else:
                seconds[subject.name].append(change(subject, f"{prefix}-{i // 2:04d}", create=i % 2 == 0))
    return seconds


def back_to_back(subjects: Sequence[Subject], count: int, prefix: str, rounds: int = 2) -> dict[str, list[float]]:
    """`count` changes per subject, each made as soon as the fake kubelet has the message of the one before.

    No quiet in between, as a script adding devices one by one or a flapping probe makes them.
    The subjects take turns by round (`count // rounds` changes each, the order swapped every round);
    each round opens with one change that follows a quiet system, timed but not kept, and closes with
    one more where needed, so creates and unlinks pair up and the set ends as it began.
    """
    seconds: dict[str, list[float]] = {s.name: [] for s in subjects}
    per_round = count // rounds
    for r in range(rounds):
        for subject in subjects if r % 2 == 0 else reversed(subjects):
            quiet(subjects, 0.0)
            for i in range(per_round + 1 + (per_round + 1) % 2):
                took = change(subject, f"{prefix}-{r:02d}-{i // 2:04d}", create=i % 2 == 0, interval=0.001)
                if 0 < i <= per_round:
                    seconds[subject.name].append(took)
    return seconds


def _allocate_request(device: str) -> pb.AllocateRequest:
    return pb.AllocateRequest(container_requests=[pb.ContainerAllocateRequest(devices_ids=[device])])


def allocate_sequential(subjects: Sequence[Subject], devices: Sequence[str], count: int) -> dict[str, list[float]]:
    """`count` Allocate calls per subject, one at a time, alternating between the subjects call by call."""
    requests = [_allocate_request(d) for d in devices]
    seconds: dict[str, list[float]] = {s.name: [] for s in subjects}
    for i in range(count):
        request = requests[i % len(requests)]
        for subject in subjects if i % 2 == 0 else reversed(subjects):
            started = time.perf_counter()
            subject.kubelet.allocate_raw(request)
            seconds[subject.name].append(time.perf_counter() - started)
    return seconds


def together(callers: int, count: int, work: Callable[[int], None]) -> None:
    """`work(ticket)` for tickets 0..count-1, shared by `callers` threads that all start together."""
    tickets = itertools.count()
    start = threading.Barrier(callers)
    errors: list[BaseException] = []

    def caller() -> None:
        start.wait()
        try:
            while (ticket := next(tickets)) < count:
                work(ticket)
        except BaseException as exc:  # re-raised on the bench's thread
            errors.append(exc)

    threads = [threading.Thread(target=caller, name=f"caller-{n}") for n in range(callers)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    if errors:
        raise errors[0]


def _allocate_burst(
    subject: Subject, requests: Sequence[pb.AllocateRequest], count: int, callers: int
) -> tuple[list[float], int]:
    """`count` Allocate calls shared by `callers` threads that all start together; and how many were refused.

    A plugin may refuse calls past its worker pool (RESOURCE_EXHAUSTED) rather than queue them: such a
    call is made again at once, and its time runs from the first attempt to the answer.
    """
    seconds: list[float] = []
    refused: list[int] = []

    def allocate(ticket: int) -> None:
        request = requests[ticket % len(requests)]
        started = time.perf_counter()
        while not _allocated(subject, request):
            refused.append(ticket)
        seconds.append(time.perf_counter() - started)

    together(callers, count, allocate)
    return seconds, len(refused)


def _allocated(subject: Subject, request: pb.AllocateRequest) -> bool:
    """One Allocate call: True once answered, False when refused for want of a worker."""
    try:
        subject.kubelet.allocate_raw(request)
    except grpc.RpcError as exc:
        if exc.code() != grpc.StatusCode.RESOURCE_EXHAUSTED:
            raise
        return False
    return True


def allocate_concurrent(
    subjects: Sequence[Subject], devices: Sequence[str], count: int, callers: int, rounds: int = 4
) -> dict[str, tuple[list[float], int]]:
    """`count` calls per subject from `callers` threads, in `rounds` alternating rounds; and the refusals."""
    requests = [_allocate_request(d) for d in devices]
    seconds: dict[str, list[float]] = {s.name: [] for s in subjects}
    refused = dict.fromkeys(seconds, 0)
    for r in range(rounds):
        for subject in subjects if r % 2 == 0 else reversed(subjects):
            answered, refusals = _allocate_burst(subject, requests, count // rounds, callers)
            seconds[subject.name] += answered
            refused[subject.name] += refusals
    return {name: (seconds[name], refused[name]) for name in seconds}


def reregister(subject: Subject, names: set[str]) -> tuple[float, float, float]:
    """Restart the fake kubelet once: seconds to the Register answer, to the full list, and kubelet.start()."""
    kubelet = subject.kubelet
    count = len(kubelet.successful_registrations())
    kubelet.stop()
    since = len(kubelet.updates)
    started = time.monotonic()
    kubelet.start()  # kubelet.sock appears inside; the figures include this call (a few ms, also returned)
    serving = time.monotonic()
    registration = subject.registered(count + 1)
    full = subject.update_after(
        since, lambda u: u.endpoint == registration.endpoint and names <= u.devices.keys(), interval=0.001
    )
    return registration.answered_at - started, full.at - started, serving - started


def reregistrations(subjects: Sequence[Subject], names: set[str], count: int) -> dict[str, dict[str, list[float]]]:
    seconds: dict[str, dict[str, list[float]]] = {
        s.name: {"registered": [], "full_list": [], "kubelet_start": []} for s in subjects
    }
    for i in range(count):
        for subject in subjects if i % 2 == 0 else reversed(subjects):
            registered, full_list, kubelet_start = reregister(subject, names)
            seconds[subject.name]["registered"].append(registered)
            seconds[subject.name]["full_list"].append(full_list)
            seconds[subject.name]["kubelet_start"].append(kubelet_start)
    return seconds


def memory(subject: Subject) -> dict[str, dict[str, float]]:
    """Per process and in total; the total also as `alone_mib`, each page of the group counted once."""
    pids = subject.plugin.pids()
    figures = {name: procstat.memory(pid) for name, pid in sorted(pids.items())}
    total = {k: round(sum(m[k] for m in figures.values()), 1) for k in ("rss_mib", "pss_mib", "uss_mib")}
    alone = procstat.footprint(pids.values())
    figures["total"] = total if alone is None else {**total, "alone_mib": alone}
    return figures


def cpu(subjects: Sequence[Subject]) -> dict[str, dict[str, float]]:
    """CPU seconds used so far by every process of every subject."""
    return {s.name: {p: procstat.cpu_seconds(pid) for p, pid in s.plugin.pids().items()} for s in subjects}


def cpu_per_operation(
    before: dict[str, dict[str, float]], after: dict[str, dict[str, float]], operations: int
) -> dict[str, dict[str, float]]:
    """Milliseconds of CPU per operation, per process and in total, between two `cpu()` readings."""
    spent: dict[str, dict[str, float]] = {}
    for name, procs in after.items():
        per = {p: round((t - before[name].get(p, 0.0)) / operations * 1000, 3) for p, t in sorted(procs.items())}
        spent[name] = {**per, "total": round(sum(per.values()), 3)}
    return spent


def idle(subjects: Sequence[Subject], seconds: float) -> dict[str, dict[str, dict[str, object]]]:
    """CPU and wake-ups of every process of every subject over one shared quiet window."""
    pids = {s.name: s.plugin.pids() for s in subjects}
    before = {(s, p): procstat.sample(pid) for s, procs in pids.items() for p, pid in procs.items()}
    started = time.monotonic()
    time.sleep(seconds)
    elapsed = time.monotonic() - started
    after = {key: procstat.sample(pids[key[0]][key[1]]) for key in before}
    costs: dict[str, dict[str, dict[str, object]]] = {s.name: {} for s in subjects}
    for (name, proc), first in before.items():
        names = procstat.python_threads(pids[name][proc])
        costs[name][proc] = procstat.idle_cost(first, after[(name, proc)], elapsed, names)
    return costs


def burst(subject: Subject, count: int, prefix: str) -> dict[str, Any]:
    """Create `count` files as fast as Python can; time until one message holds them all."""
    names = [f"{prefix}-{i:05d}" for i in range(count)]
    since = len(subject.kubelet.updates)
    started = time.monotonic()
    subject.create(*names)
    created = time.monotonic()
    try:
        full = subject.full_list_after(since, set(names), timeout=120)
    except WaitTimeout:  # reported as a run that never settled; the bench goes on
        return {"files": count, "create_ms": ms(created - started), "settled_ms": None, "messages": None}
    messages = sum(1 for u in subject.kubelet.updates[since:] if u.at <= full.at)
    return {
        "files": count,
        "create_ms": ms(created - started),
        "settled_ms": ms(full.at - started),
        "messages": messages,
    }


def unburst(subject: Subject, count: int, prefix: str) -> None:
    """Remove what burst() created and wait until the kubelet's list has none of it (not measured)."""
    names = [f"{prefix}-{i:05d}" for i in range(count)]
    since = len(subject.kubelet.updates)
    subject.unlink(*names)
    gone = set(names)
    with contextlib.suppress(WaitTimeout):  # the next burst's wait reports a plugin that stopped listing
        subject.update_after(since, lambda u: not gone & u.devices.keys(), timeout=120, interval=0.01)


def listed(subject: Subject, names: set[str], timeout: float, quiet: float) -> tuple[ListAndWatchUpdate | None, int]:
    """The first message holding all of `names`, or None once no message came for `quiet` seconds
    (a list cut short stays short); and the most of `names` any message held."""
    deadline = time.monotonic() + timeout
    most = seen = 0
    while time.monotonic() < deadline:
        updates = subject.kubelet.updates
        for update in updates[seen:]:
            held = len(names & update.devices.keys())
            if held == len(names):
                return update, held
            most = max(most, held)
        seen = len(updates)
        if updates and time.monotonic() - updates[-1].at > quiet:
            break
        time.sleep(0.05)
    return None, most


def scale(
    subject: Subject, names: set[str], more: int, gap: float, *, full: bool = False, timeout: float = 150.0
) -> dict[str, Any]:
    """Start over the files `names` (already in the device directory); then `more` single changes.

    `full`: the list is as large as the kubelet takes, so a change removes a device and adds it back.
    `more` 0: the start and the memory only.
    """
    subject.kubelet.start()
    started = time.monotonic()
    subject.plugin.start(subject.root)
    registration = subject.registered(timeout=60)
    listing, most = listed(subject, names, timeout, quiet=45.0)
    subject.plugin.wait_ready()
    figures: dict[str, Any] = {
        "devices": len(names),
        "registered_ms": ms(registration.answered_at - started),
        "full_list_ms": ms(listing.at - started) if listing else None,
        "listed": most,
        "message_bytes": max((u.size_bytes for u in subject.kubelet.updates), default=0),
    }
    settle(2.0)
    figures["memory"] = memory(subject)
    if listing is None or not more:  # a change to a list that is cut short may never show
        return figures
    before = cpu([subject])
    one_more = changes([subject], more, "" if full else "more", gap, remove_first=full)[subject.name]
    spent = cpu_per_operation(before, cpu([subject]), more)[subject.name]
    return {**figures, "one_more_change": summary(one_more), "cpu_ms_per_change": spent}
