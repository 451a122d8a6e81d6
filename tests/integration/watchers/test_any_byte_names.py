"""Inotify with real inotify on real files whose names are any bytes a filesystem allows.

pyinotify 0.9.6 decoded event names strictly, so one non-UTF-8 name raised out of
its read and cost every other event of that read (PLATFORM-NOTES section 9). These
tests drive the real kernel queue with bytes paths and check that every event of a
batch arrives, good names intact and bad ones surrogate-escaped (os.fsdecode).
"""

from __future__ import annotations

import json
import os
import random
import signal
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pyinotify
import pytest

from colad.queue.messages import MAX_MESSAGE_BYTES, KubeletState, encode
from colad.runtime.kubeletdir import plugin_sockets
from colad.watchers.inotify import Inotify, InotifyEvent
from colad.watchers.loop import poll

pytestmark = pytest.mark.integration

MASK = (
    pyinotify.IN_CREATE
    | pyinotify.IN_MODIFY
    | pyinotify.IN_CLOSE_WRITE
    | pyinotify.IN_MOVED_FROM
    | pyinotify.IN_MOVED_TO
    | pyinotify.IN_DELETE
)
KINDS = {
    pyinotify.IN_CREATE: "create",
    pyinotify.IN_MODIFY: "modify",
    pyinotify.IN_CLOSE_WRITE: "close_write",
    pyinotify.IN_MOVED_FROM: "moved_from",
    pyinotify.IN_MOVED_TO: "moved_to",
    pyinotify.IN_DELETE: "delete",
}


@pytest.fixture
def inotify() -> Iterator[Inotify]:
    notify = Inotify()
    yield notify
    notify.close()


def read_all(notify: Inotify) -> list[InotifyEvent]:
    """Every event queued so far: read until the inotify fd has nothing more."""
    events: list[InotifyEvent] = []
    while notify.fileno() in poll([notify.fileno()], 0):
        events.extend(notify.read())
    return events


def kinds(events: list[InotifyEvent]) -> list[tuple[str, bytes]]:
    """(what happened, the name as the bytes it was on disk) of each event."""
    return [(KINDS[e.mask & ~pyinotify.IN_ISDIR], os.fsencode(e.name)) for e in events]


def life(d: bytes, name: bytes, renamed: bytes) -> list[tuple[str, bytes]]:
    """Create, write, rename and delete one file by bytes path; returns the events it must cause."""
    fd = os.open(d + b"/" + name, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    os.write(fd, b"x")
    os.close(fd)
    os.rename(d + b"/" + name, d + b"/" + renamed)
    os.unlink(d + b"/" + renamed)
    return [
        ("create", name),
        ("modify", name),
        ("close_write", name),
        ("moved_from", name),
        ("moved_to", renamed),
        ("delete", renamed),
    ]


def test_bad_names_mixed_with_good_ones_in_one_read(inotify: Inotify, short_tmp: Path) -> None:
    d = os.fsencode(short_tmp)
    wd = inotify.add(str(short_tmp), MASK)
    assert wd is not None
    expected: list[tuple[str, bytes]] = []
    # Good first, so that a strict decoder has already taken events when it meets the bad one.
    for name, renamed in [
        (b"good-1", b"good-2"),
        (b"bad\xff\xfe", b"good-3"),
        (b"good-4", b"also\x80bad"),
        (b"caf\xe9", b"\xc3\x28"),
        (b"good-5", b"good-6"),
    ]:
        expected += life(d, name, renamed)
    events = read_all(inotify)
    assert kinds(events) == expected
    assert {e.wd for e in events} == {wd}
    assert {e.path for e in events} == {str(short_tmp)}
    names = [e.name for e in events]
    assert "good-1" in names and "good-6" in names
    assert "bad\udcff\udcfe" in names  # surrogateescape, as os.listdir would give it
    assert all(isinstance(n, str) for n in names)
    assert set(os.listdir(short_tmp)) == set()


def test_overflow_is_still_reported_amid_bad_names(inotify: Inotify, short_tmp: Path) -> None:
    limit = int(Path("/proc/sys/fs/inotify/max_queued_events").read_text())
    assert inotify.add(str(short_tmp), pyinotify.IN_CREATE | pyinotify.IN_DELETE) is not None
    d = os.fsencode(short_tmp)
    for i in range(limit // 2 + 10):  # two events each: past the kernel's queue limit
        path = d + b"/\xff" + str(i).encode()
        os.close(os.open(path, os.O_WRONLY | os.O_CREAT, 0o600))
        os.unlink(path)
    events = read_all(inotify)
    overflows = [e for e in events if e.overflow]
    assert len(overflows) == 1 and overflows[0] == events[-1]
    assert len(events) == limit + 1  # the kernel keeps max_queued_events - 1 plus the overflow itself
    assert events[0].name == "\udcff0"


def random_name(rng: random.Random, taken: set[bytes]) -> bytes:
    alphabet = [b for b in range(256) if b not in (0, ord("/"))]
    while True:
        name = bytes(rng.choice(alphabet) for _ in range(rng.randint(1, 255)))
        if name not in taken and name not in (b".", b".."):
            taken.add(name)
            return name


@pytest.mark.parametrize("seed", [1, 12, 2024, 31337])
def test_random_byte_names_every_event_of_the_batch_arrives(inotify: Inotify, short_tmp: Path, seed: int) -> None:
    rng = random.Random(seed)
    print(f"seed={seed}")
    d = os.fsencode(short_tmp)
    assert inotify.add(str(short_tmp), MASK) is not None
    taken: set[bytes] = set()
    expected: list[tuple[str, bytes]] = []
    for _ in range(300):  # 1800 events of up to 272 bytes: one batch, well under the queue limit
        expected += life(d, random_name(rng, taken), random_name(rng, taken))
    events = read_all(inotify)
    assert len(events) == len(expected)
    assert kinds(events) == expected
    assert not any(e.overflow for e in events)


def test_watch_on_a_path_with_surrogates_does_not_raise(inotify: Inotify, short_tmp: Path) -> None:
    bad = os.fsdecode(os.fsencode(short_tmp) + b"/dir\xff")
    os.mkdir(bad)
    assert inotify.add(bad, MASK) is None  # refused with one log line, never an exception
    assert inotify.add(str(short_tmp), MASK) is not None  # and the next watch still works
    os.close(os.open(os.fsencode(short_tmp) + b"/after", os.O_WRONLY | os.O_CREAT, 0o600))
    assert ("create", b"after") in kinds(read_all(inotify))


def test_signal_waker_unblocks_a_signal_that_arrived_while_blocked() -> None:
    """The SIGHUP of a `colad reload` during start-up is blocked until the handlers exist, then handled."""
    program = (
        "import os, signal\n"
        "signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGHUP, signal.SIGTERM, signal.SIGINT})\n"
        "os.kill(os.getpid(), signal.SIGHUP)  # start-up: blocked, so pending\n"
        "from colad.watchers.loop import SignalWaker\n"
        "got = []\n"
        "waker = SignalWaker(handlers={signal.SIGHUP: lambda s, f: got.append(s)})\n"
        "assert got == [signal.SIGHUP], got\n"
        "assert signal.SIGHUP not in signal.pthread_sigmask(signal.SIG_BLOCK, set())\n"
        "print('handled')\n"
    )
    result = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0 and result.stdout.strip() == "handled", (result.returncode, result.stderr)
    assert result.returncode != -signal.SIGHUP


def test_undecodable_names_and_refused_paths_are_counted_once_each(short_tmp: Path) -> None:
    counted: list[str] = []
    notify = Inotify(counted.append)
    try:
        bad = os.fsdecode(os.fsencode(short_tmp) + b"/dir\xff")
        for _ in range(3):  # ensure() retries every turn: one count, one log line
            assert notify.add(bad, MASK) is None
        assert counted == ["input.bad_watch_path"]
        assert notify.add(str(short_tmp), MASK) is not None
        life(os.fsencode(short_tmp), b"x\xff", b"good")
        life(os.fsencode(short_tmp), b"good", b"good2")
        assert len(read_all(notify)) == 12
        assert counted.count("input.undecodable_name") == 4  # create, modify, close_write, moved_from of x\xff
    finally:
        notify.close()


def test_plugin_sockets_are_sockets_only(short_tmp: Path) -> None:
    """A directory or a regular file named like colad's socket is not one (and must never be claimed)."""
    (short_tmp / "colad-1.sock").mkdir()
    (short_tmp / "colad-2.sock").write_bytes(b"")
    os.symlink(short_tmp / "colad-4.sock", short_tmp / "colad-3.sock")
    with socket.socket(socket.AF_UNIX) as sock:
        sock.bind(str(short_tmp / "colad-4.sock"))
    os.close(os.open(os.fsencode(short_tmp) + b"/colad-\xff.sock", os.O_WRONLY | os.O_CREAT, 0o600))
    assert plugin_sockets(str(short_tmp)) == ("colad-4.sock",)


def test_a_kubelet_state_is_its_envelope_whatever_the_directory_holds() -> None:
    """No socket name travels, so no directory can make the message too large to frame."""
    body = json.loads(encode(KubeletState(2**63, 2**63)))
    assert set(body) == {"v", "type", "epoch", "seq"}
    assert len(encode(KubeletState(2**63, 2**63))) < MAX_MESSAGE_BYTES
