"""The local queue: length-prefixed frames over an AF_UNIX stream socket in the run directory.

The plugin process owns the listening socket (`QueueServer`); discovery and the
kubelet watcher connect to it (`QueueClient`) and publish snapshots, a resource's devices as
deltas while the connection that carried their base lasts (snapshots.py).
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
import stat
import struct
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from colad import log, messages, snapshots
from colad.errors import MessageError, QueueError
from colad.socketpath import ForeignPathError, SocketRecord, claim_socket_path, kind_of

LOG = log.get(__name__)
# The socket-path names are re-exported: their users imported them from here before socketpath.py.
__all__ = [
    "ForeignPathError", "Peer", "QueueClient", "QueueServer", "SocketRecord", "StatsReporter",
    "claim_socket_path", "frame", "kind_of", "peer_of",
]
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


class _Connection:
    def __init__(self, sock: socket.socket, peer: Peer) -> None:
        self.sock = sock
        self.peer = peer
        self.buffer = bytearray()


class QueueServer:
    """Accepts publishers and hands every decoded, in-order message to `on_message`.

    Runs one selector thread. A peer of another uid is refused; a peer that
    sends a bad frame is logged, counted and disconnected; neither can harm
    the state already held.
    """

    def __init__(
        self,
        path: str,
        on_message: Callable[[messages.Message, Peer], None],
        *,
        allowed_uids: frozenset[int] | None = None,
        on_reject: Callable[[str], None] = lambda reason: None,
        receiver: snapshots.Receiver | None = None,
    ) -> None:
        self.path = path
        self.on_message = on_message
        self.on_reject = on_reject
        self.allowed_uids = allowed_uids if allowed_uids is not None else frozenset({os.geteuid()})
        self.tracker = snapshots.SequenceTracker()
        self.receiver = receiver or snapshots.Receiver()  # device deltas in, exact DeviceSnapshots out
        self._selector = selectors.DefaultSelector()
        self._listener: socket.socket | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._wake_r, self._wake_w = os.pipe()
        self.inode = 0

    def start(self) -> None:
        claim_socket_path(self.path)
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        # Bind under a temporary name and rename once listening: a sender that sees
        # queue.sock appear (inotify) must never find it refusing connections.
        staging = f"{self.path}.{os.getpid()}.tmp"
        claim_socket_path(staging)
        old = os.umask(0o177)
        try:
            listener.bind(staging)
        finally:
            os.umask(old)
        os.chmod(staging, 0o600)
        listener.listen(16)
        os.rename(staging, self.path)
        self.inode = os.lstat(self.path).st_ino
        listener.setblocking(False)
        self._listener = listener
        self._selector.register(listener, selectors.EVENT_READ, None)
        self._selector.register(self._wake_r, selectors.EVENT_READ, "wake")
        self._thread = threading.Thread(target=self._run, name="queue-server", daemon=True)
        self._thread.start()
        LOG.info("queue listening", path=self.path)

    def intact(self) -> bool:
        """Is our socket file still in place (not deleted, not replaced)?"""
        try:
            st = os.lstat(self.path)
            return self._listener is not None and stat.S_ISSOCK(st.st_mode) and st.st_ino == self.inode
        except OSError:
            return False

    def stop(self) -> None:
        if self._stop.is_set():
            return
        self._stop.set()
        os.write(self._wake_w, b"x")
        if self._thread:
            self._thread.join(timeout=5)
        for key in list(self._selector.get_map().values()):
            if isinstance(key.data, _Connection):
                key.data.sock.close()
        if self._listener:
            self._listener.close()
            if self.intact():  # never remove a socket that is no longer ours
                try:
                    os.unlink(self.path)
                except OSError as exc:
                    LOG.warning("queue socket not removed", path=self.path, error=exc)
        self._selector.close()
        os.close(self._wake_r)
        os.close(self._wake_w)

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
        except (BlockingIOError, InterruptedError, ConnectionAbortedError):
            return
        except OSError as exc:  # EMFILE/ENFILE/ENOBUFS: the listener stays readable, so do not spin on it
            LOG.warning("queue accept failed; pausing", path=self.path, error=exc)
            self.on_reject("accept_failed")
            self._stop.wait(0.5)
            return
        try:
            peer = peer_of(sock)
        except OSError as exc:
            LOG.warning("queue peer refused", reason=f"no peer credentials: {exc}")
            self.on_reject("peer_uid")
            sock.close()
            return
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
        self.tracker.forget_source(conn)
        self.receiver.forget_source(conn)
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
            if self.tracker.accept(message, conn):
                if isinstance(message, messages.DeviceSnapshot | messages.DeviceDelta):
                    outcome = self.receiver.apply(message, conn)
                    if outcome.verdict is snapshots.Verdict.RESYNC:
                        # The sender starts every connection with a full snapshot: dropping this one asks for it.
                        LOG.info("queue resync", resource=message.resource, seq=message.seq, reason=outcome.reason)
                        self.on_reject("resync")
                        self._drop(conn, "resync")
                        return
                    if outcome.snapshot is None:
                        self.on_reject("stale")
                        continue
                    message = outcome.snapshot
                try:
                    self.on_message(message, conn.peer)
                except Exception as exc:  # the callback's fault, not the peer's: name the message, keep the peer
                    LOG.error(
                        "queue message not handled",
                        type=message.type,
                        seq=message.seq,
                        peer_pid=conn.peer.pid,
                        error=repr(exc),
                    )
                    self.on_reject("handler_error")
            else:
                self.on_reject("stale")
                LOG.debug("queue message stale", type=message.type, epoch=message.epoch, seq=message.seq)

    def _reject(self, conn: _Connection, reason: str) -> None:
        LOG.warning("queue message rejected", reason=reason, peer_pid=conn.peer.pid)
        self.on_reject("bad_message")
        self._drop(conn, "rejected")


class QueueClient:
    """Publishes the latest message of each stream (message `key`) to the plugin, reconnecting as needed.

    Only the newest message of a stream matters (they are snapshots), so one that
    could not be sent is simply replaced by the next; after every reconnect the
    latest of each stream is sent again, so a restarted plugin resyncs at once.
    Never blocks longer than `send_timeout`. `counters` feeds /metrics.
    """

    def __init__(self, path: str, *, send_timeout: float = 2.0, retry_max: float = 1.0) -> None:
        self.path = path
        self.send_timeout = send_timeout
        self.retry_max = retry_max
        self.sock: socket.socket | None = None
        self.latest: dict[str, messages.Message] = {}
        self.unsent: set[str] = set()
        self.counters = {"queue.sent": 0, "queue.dropped": 0, "input.oversized_message": 0}
        self._frames: dict[str, bytes | None] = {}  # encoded once, at publish (None: when a connection needs it)
        self._deltas: dict[str, bytes] = {}  # a delta frame to send instead of the full one, on this connection
        self._sent_at: dict[str, tuple[int, int]] = {}  # (epoch, seq) of each stream's last send on this connection
        self._retry_at = 0.0
        self._retry_delay = 0.05
        self._expected_uid = os.geteuid()

    @property
    def sent(self) -> bool:
        return not self.unsent

    def fileno(self) -> int | None:
        return self.sock.fileno() if self.sock else None

    def publish(self, message: messages.Message, *, delta: messages.DeviceDelta | None = None) -> None:
        """Send `message` now if connected, else after the next connect; it supersedes its stream's last.

        With `delta` (the change from this stream's previous message to `message`),
        the delta goes out instead when the current connection carried its base;
        `message` itself is then encoded only when a new connection needs it.
        """
        key = message.key  # one stream per key: each resource's snapshots, each role's stats
        encoded: bytes | None = None
        try:
            if delta is not None and self.sock is not None and self._sent_at.get(key) == (delta.epoch, delta.base):
                self._deltas[key] = frame(delta)
            elif delta is None:
                encoded = frame(message)  # refuse here what can never be framed, or it would fail every later flush()
        except messages.MessageError as exc:
            if delta is None:
                LOG.warning("queue message not sent: it cannot be framed", key=key, reason=str(exc))
                self.counters["input.oversized_message"] += 1
                return
            # A delta over the frame limit: the full snapshot goes instead.
        if key in self.unsent and message.type != "stats":
            self.counters["queue.dropped"] += 1  # superseded before it could be sent
        self.latest[key] = message
        self._frames[key] = encoded
        self.unsent.add(key)
        self.flush()

    def _frame_of(self, key: str) -> bytes | None:
        """The frame that brings the current connection up to the stream's latest message."""
        delta = self._deltas.pop(key, None)
        if delta is not None:
            return delta
        encoded = self._frames.get(key)
        if encoded is None:
            try:
                encoded = self._frames[key] = frame(self.latest[key])
            except messages.MessageError as exc:  # the sender fits its snapshots; never poison later flushes
                LOG.warning("queue message not sent: it cannot be framed", key=key, reason=str(exc))
                self.counters["input.oversized_message"] += 1
                self.withdraw(key)
        return encoded

    def withdraw(self, key: str) -> None:
        """Stop (re)sending the stream `key`: its subject is gone (a resource removed by a reload)."""
        self.latest.pop(key, None)
        self._frames.pop(key, None)
        self._deltas.pop(key, None)
        self._sent_at.pop(key, None)
        self.unsent.discard(key)

    def next_retry(self) -> float | None:
        """Monotonic time at which flush() wants another call, or None."""
        return None if self.sent or self.sock else self._retry_at

    def flush(self, *, now: float | None = None, force: bool = False) -> bool:
        """Send the latest message of each stream that has not reached the current connection yet."""
        if not self.unsent:
            return True
        now = time.monotonic() if now is None else now
        if self.sock is None:
            if not force and now < self._retry_at:
                return False
            if not self._connect(now):
                return False
        assert self.sock is not None
        for key in sorted(self.unsent):
            message = self.latest[key]
            encoded = self._frame_of(key)
            if encoded is None:
                continue
            try:
                self.sock.sendall(encoded)
            except OSError as exc:  # includes socket.timeout
                LOG.warning("queue send failed", path=self.path, error=exc)
                self.close()
                self._retry_at = now
                return False
            self.unsent.discard(key)
            self._sent_at[key] = (message.epoch, message.seq)
            if message.type != "stats":  # counting our own reports would make them never settle
                self.counters["queue.sent"] += 1
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
        self.unsent = set(self.latest)  # a new connection: the peer may be a new plugin
        LOG.debug("queue connected", path=self.path, peer_pid=peer.pid)
        return True

    def check_alive(self) -> None:
        """Call when the socket polls readable: the plugin never writes, so it means EOF."""
        if self.sock is None:
            return
        # With a timeout set, recv() would first wait for data (MSG_DONTWAIT notwithstanding).
        self.sock.setblocking(False)
        try:
            data = self.sock.recv(4096)
        except BlockingIOError:
            return
        except OSError:
            data = b""
        finally:
            if self.sock is not None:
                self.sock.settimeout(self.send_timeout)
        if not data:
            LOG.info("queue peer closed; will resend on reconnect", path=self.path)
            self.close()
            self.unsent = set(self.latest)

    def reconnect_now(self) -> None:
        """The queue socket was just (re)created: connect without waiting for back-off."""
        if self.sock is None:
            self._retry_at = 0.0
            self._retry_delay = 0.05

    def close(self) -> None:
        # Whatever the next connection reaches, it starts from full snapshots.
        self._deltas.clear()
        self._sent_at.clear()
        if self.sock is not None:
            self.sock.close()
            self.sock = None


class StatsReporter:
    """Sends a role's counters to the plugin as Stats messages: on change, at most once per `interval`."""

    def __init__(self, client: QueueClient, role: str, epoch: int, *, interval: float = 1.0) -> None:
        self.client = client
        self.role = role
        self.epoch = epoch
        self.interval = interval
        self.counters: dict[str, int] = {}
        self.seq = 0
        self._reported: dict[str, int] | None = None
        self._next = 0.0

    def count(self, name: str, by: int = 1) -> None:
        self.counters[name] = self.counters.get(name, 0) + by

    def current(self) -> dict[str, int]:
        return {**self.counters, **self.client.counters}

    def due(self) -> float | None:
        """Monotonic time of the next report, or None when there is nothing new to say."""
        return None if self.current() == self._reported else self._next

    def report(self, now: float, next_seq: int) -> int:
        """Publish if due; returns the sequence number the caller should continue from."""
        due = self.due()
        if due is None or now < due:
            return next_seq
        counters = self.current()
        self.client.publish(messages.Stats(self.epoch, next_seq, self.role, tuple(sorted(counters.items()))))
        self._reported = counters
        self._next = now + self.interval
        return next_seq + 1
