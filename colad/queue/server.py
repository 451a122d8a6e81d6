"""The local queue's listening end: the plugin's AF_UNIX stream socket in the run directory.

Discovery and the kubelet watcher publish to it through `QueueClient` (colad/queue/client.py):
a resource's devices as deltas while the connection that carried their base lasts (snapshots.py).
A stream, not SOCK_SEQPACKET: 10,000 devices (~0.8 MB) exceed one datagram under wmem_max
(~208 KiB), so frames carry a 4-byte length and a hard cap (framing.py); peers are checked by uid.
"""

from __future__ import annotations

import os
import selectors
import socket
import stat
import threading
import time
from collections.abc import Callable

from colad.core.errors import MessageError
from colad.outputs.socketpath import claim_socket_path
from colad.queue import messages, snapshots
from colad.queue.framing import HEADER, Peer, peer_of
from colad.runtime import log

LOG = log.get(__name__)
# Read at once: every change, every Stats and a snapshot of ~1,500 devices (a 10,000-device one is 7 reads).
# Resident for good (0.125 MiB), where a 1 MiB buffer per recv() would be mapped and unmapped each time.
RECV_CHUNK = 128 * 1024
# Publishers are discovery, the kubelet watcher and an operator's tool or two: more connections than
# this (root's only; the socket is 0600) are closed at once, so none can take the plugin's descriptors.
MAX_PEERS = 16
# A frame begun must end within this (10,000 devices arrive in ms): a peer that stops half-way is
# dropped, and the buffer it held (up to messages.MAX_MESSAGE_BYTES) with it. It reconnects with a snapshot.
PARTIAL_FRAME_TIMEOUT = 10.0
ACCEPT_PAUSE = 0.5  # after accept(2) fails for want of a resource (EMFILE, ENFILE, ENOBUFS, ENOMEM)


class _Connection:
    def __init__(self, sock: socket.socket, peer: Peer) -> None:
        self.sock = sock
        self.peer = peer
        self.buffer = bytearray()
        self.partial_since: float | None = None  # when the unfinished frame in `buffer` began


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
        partial_frame_timeout: float = PARTIAL_FRAME_TIMEOUT,
    ) -> None:
        self.path = path
        self.partial_frame_timeout = partial_frame_timeout
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
        # One receive buffer for every connection (one selector thread), reused: a fresh 1 MiB bytes per
        # recv() would be an mmap, an mremap and an munmap per change, each munmap a TLB shootdown of the
        # other threads. Larger frames gather
        # in the connection's buffer a chunk at a time.
        self._chunk = bytearray(RECV_CHUNK)
        self._chunk_view = memoryview(self._chunk)
        self.inode = 0
        self._peers = 0
        self._partial: set[_Connection] = set()  # connections holding part of a frame
        self._paused_until: float | None = None  # the listener is out of the selector until then

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
        thread = threading.Thread(target=self._run, name="queue-server", daemon=True)
        thread.start()  # a RuntimeError at a task limit: stop() then closes what was opened, joining nothing
        self._thread = thread
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
            for key, _ in self._selector.select(self._wait()):
                if key.data == "wake":
                    continue
                try:
                    if key.data is None:
                        self._accept()
                    else:
                        self._read(key.data)
                except Exception:  # the loop boundary: log once, keep serving
                    LOG.exception("queue server error")
            if self._partial or self._paused_until is not None:
                self._expire()

    def _wait(self) -> float | None:
        """Seconds until a partial frame's deadline or the end of an accept pause; None (no wake) if neither."""
        if not self._partial and self._paused_until is None:
            return None
        due = [c.partial_since + self.partial_frame_timeout for c in self._partial if c.partial_since is not None]
        if self._paused_until is not None:
            due.append(self._paused_until)
        return max(0.0, min(due) - time.monotonic())

    def _expire(self) -> None:
        now = time.monotonic()
        for conn in [c for c in self._partial if c.partial_since is not None]:
            if now - conn.partial_since >= self.partial_frame_timeout:  # type: ignore[operator]
                LOG.warning("queue peer dropped", reason="frame unfinished", peer_pid=conn.peer.pid)
                self.on_reject("bad_message")
                self._drop(conn, "frame unfinished")
        if self._paused_until is not None and now >= self._paused_until and self._listener is not None:
            self._paused_until = None
            self._selector.register(self._listener, selectors.EVENT_READ, None)

    def _accept(self) -> None:
        assert self._listener is not None
        try:
            sock, _ = self._listener.accept()
        except (BlockingIOError, InterruptedError, ConnectionAbortedError):
            return
        except OSError as exc:  # EMFILE/ENFILE/ENOBUFS: the listener stays readable, so do not spin on it
            LOG.warning("queue accept failed; pausing", path=self.path, error=exc, seconds=ACCEPT_PAUSE)
            self.on_reject("accept_failed")
            # Out of the selector meanwhile: the peers already connected are still read.
            self._selector.unregister(self._listener)
            self._paused_until = time.monotonic() + ACCEPT_PAUSE
            return
        if self._peers >= MAX_PEERS:
            LOG.warning("queue peer refused", reason="too many peers", peers=self._peers)
            self.on_reject("too_many_peers")
            sock.close()
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
        self._peers += 1
        LOG.debug("queue peer connected", peer_pid=peer.pid)

    def _drop(self, conn: _Connection, reason: str) -> None:
        self._selector.unregister(conn.sock)
        conn.sock.close()
        self._peers -= 1
        self._partial.discard(conn)
        self.tracker.forget_source(conn)
        self.receiver.forget_source(conn)
        LOG.debug("queue peer gone", peer_pid=conn.peer.pid, reason=reason)

    def _read(self, conn: _Connection) -> None:
        try:
            got = conn.sock.recv_into(self._chunk)
        except (BlockingIOError, InterruptedError):
            return
        except OSError as exc:
            self._drop(conn, str(exc))
            return
        if not got:
            self._drop(conn, "eof")
            return
        if not conn.buffer:  # frames that arrive whole (every change) are decoded from the chunk: no copy
            used = self._frames(conn, self._chunk_view[:got])
            if used is not None and used < got:
                conn.buffer += self._chunk_view[used:got]
                self._partial_began(conn)
            return
        conn.buffer += self._chunk_view[:got]
        # Decoded in place: a frame may be as large as messages.MAX_MESSAGE_BYTES, and a copy of it
        # (two, with a bytearray slice) would only raise the reader's peak. The view is released
        # before the buffer moves on (with: an exception's frames must not keep it).
        with memoryview(conn.buffer) as whole:
            used = self._frames(conn, whole)
        if used:
            del conn.buffer[:used]
            if conn.buffer:
                self._partial_began(conn)
            else:
                conn.partial_since = None
                self._partial.discard(conn)

    def _partial_began(self, conn: _Connection) -> None:
        conn.partial_since = time.monotonic()
        self._partial.add(conn)

    def _frames(self, conn: _Connection, data: memoryview) -> int | None:
        """Hand on every whole frame at the start of `data`: the bytes used, None when `conn` was dropped."""
        used, end = 0, len(data)
        while end - used >= HEADER.size:
            (size,) = HEADER.unpack_from(data, used)
            if size > messages.MAX_MESSAGE_BYTES:
                self._reject(conn, f"frame of {size} bytes over the limit")
                return None
            start = used + HEADER.size
            if end - start < size:
                break
            problem: str | None = None
            with data[start : start + size] as payload:
                try:
                    message = messages.decode(payload)
                except MessageError as exc:
                    problem = str(exc)
            if problem is not None:
                self._reject(conn, problem)
                return None
            used = start + size
            if not self._deliver(conn, message):
                return None
        return used

    def _deliver(self, conn: _Connection, message: messages.Message) -> bool:
        """Pass one decoded message on if it is news; False when `conn` was dropped (a resync)."""
        if not self.tracker.accept(message, conn):
            self.on_reject("stale")
            LOG.debug("queue message stale", type=message.type, epoch=message.epoch, seq=message.seq)
            return True
        if isinstance(message, messages.DeviceSnapshot | messages.DeviceDelta):
            outcome = self.receiver.apply(message, conn)
            if outcome.fate is snapshots.Fate.RESYNC:
                # The sender starts every connection with a full snapshot: dropping this one asks for it.
                LOG.info("queue resync", resource=message.resource, seq=message.seq, reason=outcome.reason)
                self.on_reject("resync")
                self._drop(conn, "resync")
                return False
            if outcome.snapshot is None:
                self.on_reject("stale")
                return True
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
        return True

    def _reject(self, conn: _Connection, reason: str) -> None:
        LOG.warning("queue message rejected", reason=reason, peer_pid=conn.peer.pid)
        self.on_reject("bad_message")
        self._drop(conn, "rejected")
