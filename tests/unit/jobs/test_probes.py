"""Unit tests for colad.jobs.probes' pure parts: the reason a probe gives, and the verdict of an exit."""

from __future__ import annotations

import random
import signal

import pytest

from colad.jobs.probes import MAX_REASON, ProbeResult, first_line, outcome

pytestmark = pytest.mark.unit


@pytest.mark.parametrize(
    ("output", "line"),
    [
        (b"", ""),
        (b"fan stalled\nsecond line\n", "fan stalled"),
        (b"\n  \n\tfirst real\n", "first real"),
        (b"bad \xff byte", "bad \ufffd byte"),
        (b"tab\there\x1b[31mred", "tab here [31mred"),
        (b"no newline at the end", "no newline at the end"),
        (b"x" * 1000, "x" * (MAX_REASON - 3) + "..."),
    ],
)
def test_first_line(output: bytes, line: str) -> None:
    assert first_line(output) == line


@pytest.mark.parametrize(
    ("returncode", "output", "timeout", "verdict"),
    [
        (0, b"", None, ProbeResult(True)),
        (0, b"all good\n", None, ProbeResult(True)),
        (1, b"fan stalled\n", None, ProbeResult(False, "fan stalled")),
        (3, b"", None, ProbeResult(False, "exit status 3")),
        (-signal.SIGSEGV, b"", None, ProbeResult(False, "killed by SIGSEGV")),
        (-signal.SIGKILL, b"oom\n", None, ProbeResult(False, "killed by SIGKILL: oom")),
        (-200, b"", None, ProbeResult(False, "killed by signal 200")),
        (None, b"", 2.5, ProbeResult(False, "timed out after 2.5s")),
        (None, b"waiting for firmware\n", 5, ProbeResult(False, "timed out after 5s: waiting for firmware")),
    ],
)
def test_outcome(returncode: int | None, output: bytes, timeout: float | None, verdict: ProbeResult) -> None:
    assert outcome(returncode, output, timeout) == verdict


def test_reasons_are_always_one_bounded_printable_line() -> None:
    rng = random.Random(15)
    for _ in range(2000):
        output = bytes(rng.randrange(256) for _ in range(rng.randint(0, 600)))
        verdict = outcome(rng.choice([None, 1, 2, -9, -11]), output, 1.0)
        assert not verdict.healthy and verdict.reason
        assert "\n" not in verdict.reason and all(ord(c) >= 0x20 and c != "\x7f" for c in verdict.reason)
        assert len(verdict.reason) <= MAX_REASON + 40
