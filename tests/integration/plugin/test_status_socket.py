"""The plugin's status socket on a real AF_UNIX socket: it answers, it is bounded, it says when it cannot.

A peer that never reads its answer holds the socket for at most the send timeout; an answer that
raises costs one log line; a socket deleted or a path taken by something else is seen by
`intact()`/`problem()` (so /healthz can say status cannot ask) and a restart binds it again.
"""

from __future__ import annotations

import json
import os
import socket
import threading
import time
from pathlib import Path

import pytest

from colad.plugin.status_socket import SEND_TIMEOUT, NoAnswer, StatusSocket, ask
from tests.helpers import wait_until

pytestmark = pytest.mark.integration


@pytest.fixture
def path(short_tmp: Path) -> Path:
    run = short_tmp / "run"
    run.mkdir(mode=0o700)
    return run / "state" / "status.sock"


def test_it_answers_with_the_document_and_the_pid(path: Path) -> None:
    server = StatusSocket(str(path), lambda: json.dumps({"pid": 7, "health": {"ok": True}}).encode())
    assert server.start() and server.intact() and server.problem() == ""
    try:
        body, pid = ask(str(path))
        assert body == {"pid": 7, "health": {"ok": True}} and pid == os.getpid()
        assert oct(path.stat().st_mode & 0o777) == "0o600"
    finally:
        server.stop()
    assert not path.exists()
    with pytest.raises(NoAnswer, match="No such file"):
        ask(str(path))


def test_a_peer_that_never_reads_holds_it_no_longer_than_the_send_timeout(path: Path) -> None:
    big = json.dumps({"pad": "x" * (8 * 1024 * 1024)}).encode()  # far over a socket buffer
    small = b'{"ok": true}'
    answers = iter([big])
    server = StatusSocket(str(path), lambda: next(answers, small))
    assert server.start()
    try:
        stuck = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        stuck.connect(str(path))  # and never reads
        started = time.monotonic()
        body, _ = ask(str(path), timeout=SEND_TIMEOUT + 3)
        assert body == {"ok": True} and time.monotonic() - started < SEND_TIMEOUT + 2
        stuck.close()
    finally:
        server.stop()


def test_an_answer_that_raises_is_one_line_and_the_next_is_answered(
    path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    calls = iter([RuntimeError("boom")])

    def answer() -> bytes:
        if (exc := next(calls, None)) is not None:
            raise exc
        return b"{}"

    server = StatusSocket(str(path), answer)
    assert server.start()
    try:
        with pytest.raises(NoAnswer, match="not a status document"):
            ask(str(path))
        assert ask(str(path))[0] == {}
    finally:
        server.stop()
    [line] = [r for r in caplog.records if "status answer failed" in r.getMessage()]
    assert "RuntimeError: boom" in line.getMessage() and not line.exc_info


def test_a_deleted_socket_is_seen_and_bound_again(path: Path) -> None:
    server = StatusSocket(str(path), lambda: b"{}")
    assert server.start()
    path.unlink()
    assert not server.intact() and "not answering" in server.problem()
    with pytest.raises(NoAnswer):
        ask(str(path))
    server.stop()
    assert server.start() and server.intact()
    assert ask(str(path))[0] == {}
    server.stop()


def test_a_stale_socket_is_claimed_and_a_foreign_file_is_left_alone(path: Path) -> None:
    path.parent.mkdir(mode=0o700)
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as dead:
        dead.bind(str(path))  # nobody listens: left by a dead plugin
    server = StatusSocket(str(path), lambda: b"{}")
    assert server.start()
    server.stop()
    path.write_text("not a socket")
    server = StatusSocket(str(path), lambda: b"{}")
    assert not server.start() and "not answering" in server.problem()
    assert path.read_text() == "not a socket"


def test_a_stopped_server_ends_its_thread(path: Path) -> None:
    server = StatusSocket(str(path), lambda: b"{}")
    assert server.start()
    thread = server._thread
    assert thread is not None
    server.stop()
    wait_until(lambda: not thread.is_alive(), 5, "the status thread to end")
    assert not any(t.name == "status-socket" and t.is_alive() for t in threading.enumerate())
