"""Helpers for the integration tests of one role: a queue inbox and a role loop in a thread.

`Inbox` collects what a real QueueServer delivers (and every rejection) under a lock.
`RoleRunner` drives a Discovery or KubeletWatch exactly as its `run()` does, one
`step(role.timeout())` after another, in a thread it can stop and start again.
Fixtures that build these live in conftest.py beside this module.
"""

from __future__ import annotations

import os
import socket
import threading
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

from colad.config.config import Config
from colad.discovery.main import Discovery
from colad.kubelet_watch.main import KubeletWatch
from colad.queue.framing import Peer
from colad.queue.messages import Message
from colad.queue.server import QueueServer
from colad.watchers.loop import SignalWaker

M = TypeVar("M")
Role = Discovery | KubeletWatch


def make_config(root: Path, **overrides: object) -> Config:
    """A Config whose every path is under `root`; the safety rescan is out of the way."""
    values: dict[str, object] = {
        "device_dir": str(root / "devices"),
        "kubelet_dir": str(root / "kubelet"),
        "run_dir": str(root / "run"),
        "cdi_spec_dir": str(root / "cdi"),  # never the machine's own /var/run/cdi
        "rescan_interval": 3600.0,
    }
    values.update(overrides)
    return Config(**values)  # type: ignore[arg-type]


def discovery_config(root: Path, **overrides: object) -> Config:
    """make_config() with the run directory (root-only, as colad makes it) and the device directory made."""
    config = make_config(root, **overrides)
    os.mkdir(config.run_dir, 0o700)
    os.mkdir(config.device_dir)
    return config


def bind_socket(path: Path) -> None:
    """Leave a Unix socket file at `path` (nothing listens on it), as a dead server would."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.bind(str(path))
    finally:
        sock.close()


class Inbox:
    """What a QueueServer handed over, in order, safe to read from the test thread."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._messages: list[Message] = []
        self._peers: list[Peer] = []
        self._rejects: list[str] = []

    def on_message(self, message: Message, peer: Peer) -> None:
        with self._lock:
            self._messages.append(message)
            self._peers.append(peer)

    def on_reject(self, reason: str) -> None:
        with self._lock:
            self._rejects.append(reason)

    @property
    def messages(self) -> list[Message]:
        with self._lock:
            return list(self._messages)

    @property
    def peers(self) -> list[Peer]:
        """The sender of each message, as SO_PEERCRED told the server."""
        with self._lock:
            return list(self._peers)

    @property
    def rejects(self) -> list[str]:
        with self._lock:
            return list(self._rejects)

    def of(self, kind: type[M]) -> list[M]:
        return [m for m in self.messages if isinstance(m, kind)]

    def latest(self, kind: type[M]) -> M | None:
        found = self.of(kind)
        return found[-1] if found else None


Serve = Callable[..., tuple[QueueServer, "Inbox"]]  # the `serve` fixture: serve(path, **kwargs)


def PipeWaker() -> SignalWaker:  # noqa: N802 - reads as the class it stands in for
    """loop.SignalWaker without the signal hook (which needs the main thread): wake() ends a blocking step."""
    return SignalWaker(signals=False)


def begin(role: Role) -> None:
    """What `role.run()` does before its loop: establish the watches and take the first look."""
    role.run_dir.ensure()
    if isinstance(role, Discovery):
        for watch in role.watches.values():
            watch.dir.ensure()
        role.rescan("start")
    else:
        role.kubelet_dir.ensure()
        role.look("start")


class RoleRunner:
    """Runs `role.step(role.timeout())` in a thread until stopped, as `role.run()` does."""

    def __init__(self, role: Role) -> None:
        self.role = role
        self.waker = PipeWaker()
        role.waker = self.waker
        self.thread: threading.Thread | None = None
        self.error: BaseException | None = None

    def start(self) -> RoleRunner:
        assert self.thread is None, "already running"
        self.role.stopping = False
        self.thread = threading.Thread(target=self._loop, name=f"{type(self.role).__name__}-loop", daemon=True)
        self.thread.start()
        return self

    def _loop(self) -> None:
        try:
            while not self.role.stopping:
                self.role.step(self.role.timeout())
        except BaseException as exc:  # reported by stop(): a dead loop must fail the test
            self.error = exc
            raise

    def stop(self) -> None:
        if self.thread is None:
            return
        self.role.stopping = True
        self.waker.wake()
        self.thread.join(timeout=10)
        alive = self.thread.is_alive()
        self.thread = None
        assert not alive, "the role loop did not stop within 10 s"
        if self.error is not None:
            raise AssertionError(f"the role loop died: {self.error!r}") from self.error

    def close(self) -> None:
        self.stop()
        self.role.close()  # discovery's probes too: a command left running would be the next test's
        self.waker.close()
