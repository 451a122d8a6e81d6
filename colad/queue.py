"""The local queue: length-prefixed frames over an AF_UNIX stream socket in the run directory.

The plugin process owns the listening socket (`QueueServer`); discovery and the
kubelet watcher connect to it (`QueueClient`) and publish full snapshots.
Why a stream and not SOCK_SEQPACKET: a snapshot of 10,000 devices (~0.8 MB)
does not fit one datagram under the default socket buffer limit (wmem_max,
~208 KiB), so frames carry a 4-byte length and a hard size cap instead.
Both ends check the peer's uid with SO_PEERCRED before trusting a byte.
"""

from __future__ import annotations

import errno
import os
import selectors
import socket
import struct
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from colad import log, messages
from colad.errors import InstanceError, MessageError, QueueError

LOG = log.get(__name__)
_HEADER = struct.Struct("!I")
_CRED = struct.Struct("3i")  # struct ucred: pid, uid, gid


@dataclass(frozen=True)
class Peer:
    pid: int
    uid: int
    gid: int


def peer_of(sock: socket.socket) -> Peer:
    raw = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _CRED.size)
    return Peer(*_CRED.unpack(raw))


def frame(message: messages.Message) -> bytes:
    payload = messages.encode(message)
    return _HEADER.pack(len(payload)) + payload


def claim_socket_path(path: str) -> None:
    """Make `path` free for bind(): remove a stale socket, refuse a live one.

    A socket left by a dead process refuses connections; one that accepts
    belongs to a live instance, which we must never steal from.
    """
    if not os.path.lexists(path):
        return
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    probe.settimeout(1.0)
    try:
        probe.connect(path)
    except OSError:
        os.unlink(path)
        return
    finally:
        probe.close()
    raise InstanceError(f"{path} is in use by a live process; is another colad running?")


class _Connection:
    def __init__(self, sock: socket.socket, peer: Peer) -> None:
        self.sock = sock
        self.peer = peer
        self.buffer = bytearray()
        self.types: set[str] = set()


class QueueServer:
    """Accepts publishers and hands every decoded, in-order message to `on_message`.

    Runs one selector thread. A peer of another uid is refused; a peer that
    sends a bad frame is logged, counted and disconnected; neither can harm
    the state already held.
    """

    def __init__(
        self,
        path: str,
        on_message: Callable[[messages.Message], None],
        *,
        allowed_uids: frozenset[int] | None = None,
        on_reject: Callable[[str], None] = lambda reason: None,
    ) -> None:
        self.path = path
        self.on_message = on_message
        self.on_reject = on_reject
        self.allowed_uids = allowed_uids if allowed_uids is not None else frozenset({os.geteuid()})
        self.tracker = messages.SequenceTracker()
        self._selector = selectors.DefaultSelector()
        self._listener: socket.socket | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._wake_r, self._wake_w = os.pipe()

    def start(self) -> None:
        claim_socket_path(self.path)
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        old = os.umask(0o177)
        try:
            listener.bind(self.path)
        finally:
            os.umask(old)
        os.chmod(self.path, 0o600)
        listener.listen(16)
        listener.setblocking(False)
        self._listener = listener
        self._selector.register(listener, selectors.EVENT_READ, None)
        self._selector.register(self._wake_r, selectors.EVENT_READ, "wake")
        self._thread = threading.Thread(target=self._run, name="queue-server", daemon=True)
        self._thread.start()
        LOG.info("queue listening", path=self.path)

    def stop(self) -> None:
        self._stop.set()
        os.write(self._wake_w, b"x")
        if self._thread:
            self._thread.join(timeout=5)
        for key in list(self._selector.get_map().values()):
            if isinstance(key.data, _Connection):
                key.data.sock.close()
        if self._listener:
            self._listener.close()
            try:
                os.unlink(self.path)
            except FileNotFoundError:
                pass

    def _run(self) -> None:
        while not self._stop.is_set():
            for key, _ in self._selector.select():
                if key.data == "wake":
                    continue
                try:
                    if key.data is None:
                        self._accept()
                    else:
                        self._read(key.data)
                except Exception:  # the loop boundary: log once, keep serving
                    LOG.exception("queue server error")

    def _accept(self) -> None:
        assert self._listener is not None
        try:
            sock, _ = self._listener.accept()
        except BlockingIOError:
            return
        peer = peer_of(sock)
        if peer.uid not in self.allowed_uids:
            LOG.warning("queue peer refused", reason="uid not allowed", peer_pid=peer.pid, peer_uid=peer.uid)
            self.on_reject("peer_uid")
            sock.close()
            return
        sock.setblocking(False)
        self._selector.register(sock, selectors.EVENT_READ, _Connection(sock, peer))
        LOG.debug("queue peer connected", peer_pid=peer.pid)

    def _drop(self, conn: _Connection, reason: str) -> None:
        self._selector.unregister(conn.sock)
        conn.sock.close()
        for message_type in conn.types:
            self.tracker.forget(message_type)
        LOG.debug("queue peer gone", peer_pid=conn.peer.pid, reason=reason)

    def _read(self, conn: _Connection) -> None:
        try:
            chunk = conn.sock.recv(1 << 20)
        except (BlockingIOError, InterruptedError):
            return
        except OSError as exc:
            self._drop(conn, str(exc))
            return
        if not chunk:
            self._drop(conn, "eof")
            return
        conn.buffer += chunk
        while len(conn.buffer) >= _HEADER.size:
            (size,) = _HEADER.unpack_from(conn.buffer)
            if size > messages.MAX_MESSAGE_BYTES:
                self._reject(conn, f"frame of {size} bytes over the limit")
                return
            if len(conn.buffer) < _HEADER.size + size:
                return
            payload = bytes(conn.buffer[_HEADER.size : _HEADER.size + size])
            del conn.buffer[: _HEADER.size + size]
            try:
                message = messages.decode(payload)
            except MessageError as exc:
                self._reject(conn, str(exc))
                return
            conn.types.add(message.type)
            if self.tracker.accept(message):
                self.on_message(message)
            else:
                LOG.debug("queue message stale", type=message.type, epoch=message.epoch, seq=message.seq)

    def _reject(self, conn: _Connection, reason: str) -> None:
        LOG.warning("queue message rejected", reason=reason, peer_pid=conn.peer.pid)
        self.on_reject("bad_message")
        self._drop(conn, "rejected")


class QueueClient:
    """Publishes the latest snapshot to the plugin, reconnecting as needed.

    Only the newest message matters (they are snapshots), so a message that
    could not be sent is simply replaced by the next one; after every
    reconnect the latest is sent again, so a restarted plugin resyncs at once.
    Never blocks longer than `send_timeout`.
    """

    def __init__(self, path: str, *, send_timeout: float = 2.0, retry_max: float = 1.0) -> None:
        self.path = path
        self.send_timeout = send_timeout
        self.retry_max = retry_max
        self.sock: socket.socket | None = None
        self.latest: messages.Message | None = None
        self.sent = True
        self._retry_at = 0.0
        self._retry_delay = 0.05
        self._expected_uid = os.geteuid()

    def fileno(self) -> int | None:
        return self.sock.fileno() if self.sock else None

    def publish(self, message: messages.Message) -> None:
        self.latest = message
        self.sent = False
        self.flush()

    def next_retry(self) -> float | None:
        """Monotonic time at which flush() wants another call, or None."""
        return None if self.sent or self.sock else self._retry_at

    def flush(self, *, now: float | None = None, force: bool = False) -> bool:
        """Send the latest message if it has not reached the current connection yet."""
        if self.sent or self.latest is None:
            return True
        now = time.monotonic() if now is None else now
        if self.sock is None:
            if not force and now < self._retry_at:
                return False
            if not self._connect(now):
                return False
        assert self.sock is not None
        try:
            self.sock.sendall(frame(self.latest))
        except (TimeoutError, OSError) as exc:
            LOG.warning("queue send failed", path=self.path, error=exc)
            self.close()
            self._retry_at = now
            return False
        self.sent = True
        return True

    def _connect(self, now: float) -> bool:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(self.send_timeout)
        try:
            sock.connect(self.path)
            peer = peer_of(sock)
            if peer.uid != self._expected_uid:
                raise QueueError(f"queue owner uid {peer.uid} is not ours ({self._expected_uid})")
        except (OSError, QueueError) as exc:
            sock.close()
            if not isinstance(exc, OSError) or exc.errno not in (errno.ENOENT, errno.ECONNREFUSED):
                LOG.warning("queue connect failed", path=self.path, error=exc)
            self._retry_at = now + self._retry_delay
            self._retry_delay = min(self._retry_delay * 2, self.retry_max)
            return False
        self.sock = sock
        self._retry_delay = 0.05
        LOG.debug("queue connected", path=self.path, peer_pid=peer.pid)
        return True

    def check_alive(self) -> None:
        """Call when the socket polls readable: the plugin never writes, so it means EOF."""
        if self.sock is None:
            return
        try:
            data = self.sock.recv(4096, socket.MSG_DONTWAIT)
        except BlockingIOError:
            return
        except OSError:
            data = b""
        if not data:
            LOG.info("queue peer closed; will resend on reconnect", path=self.path)
            self.close()
            self.sent = False

    def reconnect_now(self) -> None:
        """The queue socket was just (re)created: connect without waiting for back-off."""
        if self.sock is None:
            self._retry_at = 0.0
            self._retry_delay = 0.05
            self.sent = self.latest is None

    def close(self) -> None:
        if self.sock is not None:
            self.sock.close()
            self.sock = None
