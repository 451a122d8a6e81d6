"""Role `colad kubelet-watch`: tells the plugin when the kubelet directory changes under it.

Reads: the kubelet's device-plugins directory (inotify). A restarting kubelet
deletes every plugin socket, then creates kubelet.sock anew; the kubelet also
rewrites its checkpoint there after every device update, which is ignored.
Writes: a KubeletState (identity of kubelet.sock, colad sockets present) to the
plugin over the local queue on every change and after every reconnect. The
plugin re-checks the directory itself before acting: this role says "look".
"""

from __future__ import annotations

import os
import signal
import stat
import time

import pyinotify

from colad import config as config_mod
from colad import constants, log, messages, proc, watch
from colad.config import Config
from colad.queue import QueueClient, StatsReporter

LOG = log.get(__name__)

KUBELET_DIR_EVENTS = (
    pyinotify.IN_CREATE
    | pyinotify.IN_DELETE
    | pyinotify.IN_MOVED_FROM
    | pyinotify.IN_MOVED_TO
    | pyinotify.IN_ATTRIB
    | pyinotify.IN_DELETE_SELF
    | pyinotify.IN_MOVE_SELF
)


def socket_identity(path: str) -> str:
    """"dev:ino:ctime_ns" of the socket at `path`, or "" when there is none."""
    try:
        st = os.stat(path)
    except OSError:
        return ""
    if not stat.S_ISSOCK(st.st_mode):
        return ""
    return f"{st.st_dev}:{st.st_ino}:{st.st_ctime_ns}"


def is_plugin_socket_name(name: str) -> bool:
    return name.startswith(constants.PLUGIN_SOCKET_PREFIX) and name.endswith(constants.PLUGIN_SOCKET_SUFFIX)


def plugin_sockets(kubelet_dir: str) -> tuple[str, ...]:
    try:
        names = os.listdir(kubelet_dir)
    except OSError:
        return ()
    return tuple(sorted(n for n in names if is_plugin_socket_name(n)))


class KubeletWatch:
    def __init__(self, cfg: Config, *, client: QueueClient | None = None) -> None:
        self.cfg = cfg
        self.client = client or QueueClient(cfg.queue_socket)
        self.inotify = watch.Inotify()
        self.kubelet_dir = watch.DirWatch(self.inotify, cfg.kubelet_dir, KUBELET_DIR_EVENTS)
        self.run_dir = watch.DirWatch(self.inotify, cfg.run_dir, pyinotify.IN_CREATE | pyinotify.IN_MOVED_TO)
        self.mounts = watch.MountWatch()
        self.mounts.drain()
        self.epoch = time.time_ns()
        self.seq = 0
        self.stats = StatsReporter(self.client, "kubelet-watch", self.epoch)
        self.last: tuple[str, tuple[str, ...]] | None = None
        self.stopping = False
        self.waker: watch.SignalWaker | None = None

    def relevant(self, event: watch.Event) -> bool:
        if event.overflow or event.mask & watch.SELF_GONE:
            return True
        if not self.kubelet_dir.concerns(event):
            return False
        name = event.name
        # Everything else (the checkpoint and its dot-prefixed temp file) is churn.
        return not name or name == constants.KUBELET_SOCKET_NAME or is_plugin_socket_name(name)

    def look(self, reason: str) -> None:
        state = (socket_identity(self.cfg.kubelet_socket), plugin_sockets(self.cfg.kubelet_dir))
        if state == self.last:
            return
        previous, self.last = self.last, state
        self.seq += 1
        self.stats.count("changes.kubelet_socket" if previous and previous[0] != state[0] else "changes.sockets")
        if previous is None or previous[0] != state[0]:
            LOG.info(
                "kubelet socket " + ("present" if state[0] else "absent"),
                reason=reason,
                socket=self.cfg.kubelet_socket,
                identity=state[0] or "-",
            )
        else:
            LOG.info("plugin sockets changed", reason=reason, sockets=",".join(state[1]) or "-")
        self.client.publish(messages.KubeletState(self.epoch, self.seq, state[0], state[1]))

    def step(self, timeout: float | None) -> None:
        waker_fd = self.waker.fileno() if self.waker else None
        fds = [self.inotify.fileno(), self.client.fileno(), waker_fd]
        readable = watch.poll(fds, timeout, priority=[self.mounts.fileno()])
        if waker_fd in readable and self.waker:
            self.waker.drain()
        if self.stopping:
            return
        reason = None
        if self.mounts.fileno() in readable:
            self.mounts.drain()  # a mount over the kubelet directory: ensure() below notices
        if self.inotify.fileno() in readable:
            for event in self.inotify.read():
                self.kubelet_dir.note(event)
                self.run_dir.note(event)
                if self.relevant(event):
                    reason = "overflow" if event.overflow else "inotify"
                if event.wd == self.run_dir.wd and event.name == os.path.basename(self.cfg.queue_socket):
                    self.client.reconnect_now()
        if self.client.fileno() in readable:
            self.client.check_alive()
        self.run_dir.ensure()
        if self.kubelet_dir.ensure():
            reason = reason or "directory changed"
        if reason:
            self.look(reason)
        self.seq = self.stats.report(time.monotonic(), self.seq + 1) - 1
        self.client.flush()

    def timeout(self) -> float | None:
        due = [m for m in (self.client.next_retry(), self.stats.due()) if m is not None]
        return None if not due else max(0.0, min(due) - time.monotonic())

    def run(self) -> int:
        self.run_dir.ensure()
        self.kubelet_dir.ensure()
        self.look("start")
        while not self.stopping:
            self.step(self.timeout())
        self.client.close()
        self.inotify.close()
        LOG.info("kubelet watcher stopped")
        return 0


def main(args: object = None, cfg: Config | None = None) -> int:
    cfg = cfg or config_mod.load()
    log.setup("kubelet-watch", cfg.log_level)
    proc.setup_role()
    role = KubeletWatch(cfg)
    role.waker = watch.SignalWaker()

    def stop(signum: int, _frame: object) -> None:
        role.stopping = True

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    LOG.info("kubelet watcher starting", kubelet_dir=cfg.kubelet_dir, queue=cfg.queue_socket)
    return role.run()
