"""The plugin's status socket: a root-only AF_UNIX socket in the run directory that `colad status` asks.

On each connection the plugin writes one JSON document (its health verdict, its readiness and
its published state, stamped with who it is) and closes; it reads nothing, so a client can hold
nothing open but its own wait. One thread answers one peer at a time, each under a send timeout.
It works whatever the metrics address is (disabled, or bound to another interface).
Neighbours: colad/plugin/main.py (builds the document), status.py (`ask`, the only client).
"""

from __future__ import annotations

import errno
import json
import os
import socket
import stat
import threading
import time
from collections.abc import Callable

from colad.core.errors import InstanceError
from colad.outputs.socketpath import claim_socket_path
from colad.queue.framing import peer_of
from colad.runtime import log

LOG = log.get(__name__)

SEND_TIMEOUT = 1.0  # a peer that does not read its answer is dropped after this
ASK_TIMEOUT = 3.0  # the client's whole wait: the plugin asks supervisord (1 s) before it answers
MAX_ANSWER = 16 * 1024 * 1024  # the state file's bound (50 listed devices per resource) is far below
# accept() errors that say "not now" (file or memory limits): waited out, never a spin.
_TRANSIENT = {errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM, errno.EAGAIN, errno.ECONNABORTED}
_PAUSE = 0.5


class StatusSocket:
    """Answers `answer()` (bytes) to every peer of an allowed uid on `path`; `intact()` for the safety timer."""

    def __init__(self, path: str, answer: Callable[[], bytes], *, allowed_uids: frozenset[int] | None = None) -> None:
        self.path = path
        self.answer = answer
        self.allowed_uids = allowed_uids if allowed_uids is not None else frozenset({0, os.geteuid()})
        self.inode = 0
        self._listener: socket.socket | None = None
        self._thread: threading.Thread | None = None
        self._stopping = threading.Event()  # one per listener: a thread of an earlier one never reads a new one's
        self.failures = 0

    def start(self) -> bool:
        """Bind and answer in a thread; False (logged once per failure run) when the path cannot be bound."""
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            claim_socket_path(self.path)
            os.makedirs(os.path.dirname(self.path), mode=0o700, exist_ok=True)
            old = os.umask(0o177)
            try:
                listener.bind(self.path)
            finally:
                os.umask(old)
            listener.listen(8)
            self.inode = os.lstat(self.path).st_ino
        except (OSError, InstanceError) as exc:  # InstanceError: something else, or a live process, at the path
            listener.close()
            self.failures += 1
            if self.failures == 1:
                LOG.error("status socket not available; retrying", path=self.path, error=exc)
            return False
        if self.failures:
            LOG.info("status socket available after retries", path=self.path, failures=self.failures)
            self.failures = 0
        self._listener = listener
        self._stopping = threading.Event()
        self._thread = threading.Thread(
            target=self._serve, args=(listener, self._stopping), name="status-socket", daemon=True
        )
        self._thread.start()
        LOG.info("status socket listening", path=self.path)
        return True

    def intact(self) -> bool:
        """Our socket is still at `path` (not deleted, not replaced) and its thread answers on it."""
        try:
            st = os.lstat(self.path)
        except OSError:
            return False
        answering = self._thread is not None and self._thread.is_alive()
        return self._listener is not None and answering and stat.S_ISSOCK(st.st_mode) and st.st_ino == self.inode

    def problem(self) -> str:
        """For /healthz: why `colad status` cannot ask the plugin now ("" when it can)."""
        return (
            ""
            if self.intact()
            else f"status socket {self.path} not answering (colad status cannot ask); listening again at the next check"
        )

    def _serve(self, listener: socket.socket, stopping: threading.Event) -> None:
        while not stopping.is_set():
            try:
                conn, _ = listener.accept()
            except OSError as exc:
                if stopping.is_set():
                    return
                if exc.errno in _TRANSIENT:
                    LOG.warning("status socket cannot accept now; pausing", error=exc, pause_s=_PAUSE)
                    time.sleep(_PAUSE)
                    continue
                LOG.error("status socket stopped answering", path=self.path, error=exc)
                return
            with conn:
                self._answer(conn)

    def _answer(self, conn: socket.socket) -> None:
        try:
            peer = peer_of(conn)
            if peer.uid not in self.allowed_uids:
                LOG.warning("status socket peer refused", pid=peer.pid, uid=peer.uid)
                return
            conn.settimeout(SEND_TIMEOUT)
            conn.sendall(self.answer())
        except OSError as exc:  # a peer gone or not reading: its loss
            LOG.debug("status answer not delivered", error=exc)
        except Exception as exc:  # the thread's boundary: one line, never a traceback, keep answering
            LOG.error("status answer failed", error=f"{type(exc).__name__}: {exc}")

    def stop(self) -> None:
        listener, self._listener = self._listener, None
        if listener is None:
            return
        self._stopping.set()
        try:
            listener.shutdown(socket.SHUT_RDWR)  # wakes accept() (Linux)
        except OSError:
            pass
        if self._thread is not None:
            self._thread.join(timeout=2)
        listener.close()
        try:
            st = os.lstat(self.path)
            if stat.S_ISSOCK(st.st_mode) and st.st_ino == self.inode:  # never remove a socket not ours
                os.unlink(self.path)
        except OSError:
            pass


class NoAnswer(Exception):
    """The status socket could not be asked: why, in words for `colad status`."""


def ask(path: str, timeout: float = ASK_TIMEOUT) -> tuple[dict[str, object], int]:
    """The plugin's status document and the pid that answered (SO_PEERCRED); NoAnswer naming why not."""
    deadline = time.monotonic() + timeout
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.settimeout(timeout)
        try:
            sock.connect(path)
            peer = peer_of(sock)
            chunks, size = [], 0
            while chunk := sock.recv(65536):
                chunks.append(chunk)
                size += len(chunk)
                if size > MAX_ANSWER:
                    raise NoAnswer(f"{path}: answer over {MAX_ANSWER} bytes")
                sock.settimeout(max(0.01, deadline - time.monotonic()))
        except TimeoutError:
            raise NoAnswer(f"{path}: no answer within {timeout:.0f}s") from None
        except OSError as exc:
            raise NoAnswer(f"{path}: {exc.strerror or exc}") from None
    finally:
        sock.close()
    if peer.uid not in (0, os.geteuid()):
        raise NoAnswer(f"{path}: answered by uid {peer.uid}, not root")
    try:
        body = json.loads(b"".join(chunks))
    except ValueError as exc:
        raise NoAnswer(f"{path}: not a status document: {exc}") from None
    if not isinstance(body, dict):
        raise NoAnswer(f"{path}: not a status document")
    return body, peer.pid
