"""An HTTP flood on loopback: idle half-sent requests held open, and rapid connect-and-close.

What a careless or hostile pod can do to a node's metrics port, bounded in time and count. Used by
the e2e flood tests and the chaos driver's http_flood fault.
"""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field

HALF_SENT = b"GET /metrics HTTP/1.1\r\nHost: colad\r\n"  # never the blank line that ends the head


@dataclass
class FloodCounts:
    idle_opened: int = 0
    rapid: int = 0
    refused: int = 0  # connect(2) failed: the kernel's backlog full, or nobody listening
    lock: threading.Lock = field(default_factory=threading.Lock)


class HttpFlood:
    """Two threads: one opens `idle_rate` half-sent connections a second and holds up to `max_idle` of
    them; one opens and closes `rapid_rate` connections a second. Loopback only, from `source` (another
    address of 127/8 on IPv4, as a pod's traffic comes from an address apart from the kubelet's)."""

    def __init__(
        self,
        address: str,
        *,
        idle_rate: float = 40,
        rapid_rate: float = 200,
        max_idle: int = 2000,
        source: str = "127.0.0.2",
    ) -> None:
        host, _, port = address.rpartition(":")
        host = host.strip("[]")
        if host in ("0.0.0.0", "::", ""):
            host = "127.0.0.1"
        if host not in ("127.0.0.1", "::1", "localhost"):
            raise ValueError(f"the flood stays on loopback, not {host}")
        self.target = (host, int(port))
        self.source = (source, 0) if host != "::1" and source.startswith("127.") else None
        self.idle_rate, self.rapid_rate, self.max_idle = idle_rate, rapid_rate, max_idle
        self.counts = FloodCounts()
        self._stop = threading.Event()
        self._held: list[socket.socket] = []
        self._threads = [
            threading.Thread(target=self._idle, name="flood-idle", daemon=True),
            threading.Thread(target=self._rapid, name="flood-rapid", daemon=True),
        ]

    def _connect(self) -> socket.socket | None:
        try:
            return socket.create_connection(self.target, timeout=1, source_address=self.source)
        except OSError:
            with self.counts.lock:
                self.counts.refused += 1
            return None

    def _idle(self) -> None:
        while not self._stop.wait(1 / self.idle_rate):
            if len(self._held) >= self.max_idle:
                self._held.pop(0).close()
            sock = self._connect()
            if sock is None:
                continue
            with contextlib.suppress(OSError):
                sock.sendall(HALF_SENT)
            self._held.append(sock)
            with self.counts.lock:
                self.counts.idle_opened += 1

    def _rapid(self) -> None:
        while not self._stop.wait(1 / self.rapid_rate):
            sock = self._connect()
            if sock is not None:
                sock.close()
                with self.counts.lock:
                    self.counts.rapid += 1

    def start(self) -> None:
        for thread in self._threads:
            thread.start()

    def stop(self) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(timeout=5)
        for sock in self._held:
            sock.close()
        self._held.clear()


@contextlib.contextmanager
def flooding(address: str, **kwargs: float) -> Iterator[HttpFlood]:
    flood = HttpFlood(address, **kwargs)  # type: ignore[arg-type]
    flood.start()
    try:
        yield flood
    finally:
        flood.stop()


def run_for(address: str, seconds: float, **kwargs: float) -> FloodCounts:
    """Flood for `seconds`, then let go of every connection."""
    with flooding(address, **kwargs) as flood:
        time.sleep(seconds)
    return flood.counts
