"""The plugin's own sockets outside gRPC: the queue it listens on and the kubelet directory it claims.

At start, colad sockets a dead plugin left behind are removed (only those the socket
record says colad made) and a live plugin is refused; the queue socket is (re)bound, and
a lost or foreign one is named once and retried on the safety timer. Life-cycle thread only.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable

from colad.config.config import Config
from colad.core.errors import InstanceError
from colad.metrics.registry import Metrics
from colad.outputs.socketpath import ForeignPathError, SocketRecord, claim_socket_path
from colad.queue import messages
from colad.queue.framing import Peer
from colad.queue.server import QueueServer
from colad.runtime import log
from colad.runtime.kubeletdir import plugin_socket_names

LOG = log.get(__name__)

CLAIM_PATIENCE = 5.0  # a previous plugin of ours may still be shutting down: supervisord restarts us quickly


class Sockets:
    """The queue server and the claim on the kubelet directory; `queue_problem` is for /healthz."""

    def __init__(
        self,
        cfg: Config,
        record: SocketRecord,
        metrics: Metrics,
        on_message: Callable[[messages.Message, Peer], None],
        on_reject: Callable[[str], None],
        *,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.cfg, self.record, self.metrics, self.clock = cfg, record, metrics, clock
        self.on_message, self.on_reject = on_message, on_reject
        self.queue: QueueServer | None = None
        self.queue_problem = ""
        self.warned: set[str] = set()  # problems already logged once (a foreign object is named once)

    def warn_once(self, key: str, msg: str, **fields: object) -> None:
        if key not in self.warned:
            self.warned.add(key)
            LOG.warning(msg, **fields)

    def check_queue(self) -> None:
        if self.queue is None or not self.queue.intact():
            if self.queue is not None:
                LOG.warning("queue socket removed or replaced; listening again", path=self.cfg.queue_socket)
            try:
                self.start_queue("queue socket lost")
            except InstanceError as exc:
                LOG.error("queue socket taken by another process", error=str(exc))

    def start_queue(self, reason: str) -> None:
        """(Re)listen on the queue socket; on failure log one clear line and retry on the safety timer."""
        self.stop()
        server = QueueServer(self.cfg.queue_socket, self.on_message, on_reject=self.on_reject)
        try:
            os.makedirs(self.cfg.run_dir, mode=0o700, exist_ok=True)
            server.start()
        except ForeignPathError as exc:
            # Never removed, never worth an exit: named once, retried on the safety timer, on /healthz.
            server.stop()
            self.queue_problem = str(exc)
            key = f"queue:{exc}"
            if key not in self.warned:
                self.warned.add(key)
                self.metrics.input_rejected["foreign_path"] += 1
                LOG.error("queue socket path holds something colad did not make; retrying", error=str(exc))
            return
        except InstanceError:
            server.stop()
            raise
        except OSError as exc:
            server.stop()
            self.queue_problem = f"{self.cfg.run_dir}: {exc}"
            LOG.error("run directory not usable; retrying", run_dir=self.cfg.run_dir, reason=reason, error=exc)
            return
        except RuntimeError as exc:  # its thread cannot start (a task limit): retried on the safety timer
            server.stop()
            self.queue_problem = f"cannot start its thread: {exc}"
            LOG.error("queue not listening; retrying", reason=reason, error=exc)
            return
        self.queue_problem = ""
        self.queue = server

    def claim_instance(self) -> None:
        """Remove colad sockets a dead plugin left in the kubelet directory; refuse to run beside a live one."""
        deadline = self.clock() + CLAIM_PATIENCE
        while True:
            try:
                for name in self._colad_names():
                    self._claim(os.path.join(self.cfg.kubelet_dir, name))
                self.record.prune()
                self.start_queue("start")
                return
            except InstanceError:
                if self.clock() >= deadline:
                    raise
                time.sleep(0.1)

    def _colad_names(self) -> list[str]:
        """Every entry named like our sockets, whatever it is: a foreign one is named in the log once."""
        try:
            return plugin_socket_names(self.cfg.kubelet_dir)
        except OSError as exc:
            self.warn_once(self.cfg.kubelet_dir, "kubelet directory not listed", path=self.cfg.kubelet_dir, error=exc)
            return []

    def _claim(self, path: str) -> None:
        """Remove a stale socket colad recorded creating; leave (and name once) anything else."""
        try:
            claim_socket_path(path, owns=lambda st: self.record.owns(path, st))
        except ForeignPathError as exc:
            if path not in self.warned:
                self.metrics.input_rejected["foreign_path"] += 1
            self.warn_once(path, "kubelet directory entry left alone", path=path, reason=str(exc))
        except OSError as exc:
            self.warn_once(path, "kubelet directory entry not checked; left alone", path=path, error=exc)

    def stop(self) -> None:
        if self.queue is not None:
            self.queue.stop()
            self.queue = None
