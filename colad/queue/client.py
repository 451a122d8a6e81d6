"""The publishing end of the local queue: roles send their latest snapshots and stats to the plugin.

`QueueClient` keeps the newest message of each stream and sends deltas while the
connection that carried their base lasts; `StatsReporter` turns a role's counters
into Stats messages. Neither blocks longer than its send timeout.
"""

from __future__ import annotations

import errno
import os
import socket
import time

from colad.core.errors import QueueError
from colad.queue import messages
from colad.queue.framing import frame, peer_of
from colad.runtime import log

LOG = log.get(__name__)


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
        self._frames: dict[str, bytes | None] = {}  # encoded at publish, dropped once sent (None: when needed)
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
            # Sent: a full frame is kept no longer (185 KiB at 10,000 devices); a delta or the next
            # connection's resync encodes the latest message again (_frame_of) only when one needs it.
            self._frames[key] = None
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
        if now < self._next:  # not due whatever changed: no merge of the counters (every turn asks)
            return next_seq
        due = self.due()
        if due is None or now < due:
            return next_seq
        counters = self.current()
        self.client.publish(messages.Stats(self.epoch, next_seq, self.role, tuple(sorted(counters.items()))))
        self._reported = counters
        self._next = now + self.interval
        return next_seq + 1
