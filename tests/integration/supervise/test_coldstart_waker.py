"""The supervisord waker of `colad supervise` (cold start) against a real listening Unix socket.

supervisord 4.2 spawns its programs only after its first poll(timeout=1 s) returns; the waker connects
once when supervisord's pid file names it. Here the waker's body runs in a thread with this process (or
a short-lived child) as the "supervisord", with real inotify, a real pidfd and a real socket.
"""

from __future__ import annotations

import logging
import os
import select
import socket
import subprocess
import threading
from pathlib import Path

import pytest

from colad.supervise import main

pytestmark = pytest.mark.integration


def _listener(path: Path) -> socket.socket:
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(str(path))
    server.listen(4)
    return server


def _run(target: int, pidfile: Path, sock: Path) -> tuple[threading.Thread, list[int]]:
    result: list[int] = []
    thread = threading.Thread(target=lambda: result.append(main.wait_and_wake(target, str(pidfile), str(sock))))
    thread.start()
    return thread, result


def test_connects_once_when_the_pid_file_names_supervisord_and_not_before(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)
    pidfile, sock = tmp_path / "supervisord.pid", tmp_path / "supervisor.sock"
    pidfile.write_text("1\n")  # a stale pid file left by an earlier supervisord
    with _listener(sock) as server:
        supervisor_pid = os.getpid()
        thread, result = _run(supervisor_pid, pidfile, sock)
        pidfile.write_text("999999\n")  # someone else's pid: still not ours
        assert select.select([server], [], [], 0.3)[0] == [], "the waker connected before supervisord was ready"
        pidfile.write_text(f"{supervisor_pid}\n")
        thread.join(30)
        assert result == [0]
        assert select.select([server], [], [], 5)[0] == [server]
        conn, _ = server.accept()
        conn.close()
        assert select.select([server], [], [], 0)[0] == [], "more than one connection"
    assert "supervisord woken" in caplog.text


def test_gives_up_at_once_when_supervisord_exits_before_its_pid_file(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)
    child = subprocess.Popen(["sleep", "60"])
    try:
        thread, result = _run(child.pid, tmp_path / "supervisord.pid", tmp_path / "supervisor.sock")
        child.kill()
        child.wait(10)
        thread.join(30)
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
    assert result == [1]
    assert "supervisord exited before it started" in caplog.text
