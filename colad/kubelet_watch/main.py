"""Role `colad kubelet-watch`: tells the plugin when the kubelet directory changes under it.

Watches the kubelet's device-plugins directory (inotify): a restarting kubelet deletes every
plugin socket, then creates kubelet.sock anew; its checkpoint rewrites are ignored. In DRA mode it
watches the plugin watcher's registry too, for colad's registration socket removed or replaced. On every
change and reconnect it sends a bare KubeletState; the plugin re-checks the directory itself
before acting: this role says "look". (kubelet.sock's identity, colad's sockets) only skips repeats.
"""

from __future__ import annotations

import os
import time

from colad.config import config
from colad.config.config import Config
from colad.core import constants
from colad.core.roles import KUBELET_WATCH
from colad.queue import messages
from colad.queue.client import QueueClient
from colad.runtime import log
from colad.runtime.kubeletdir import is_plugin_socket_name, plugin_sockets, socket_identity
from colad.watchers import loop
from colad.watchers.inotify import InotifyEvent

LOG = log.get(__name__)

KUBELET_DIR_EVENTS = loop.DIR_CHANGE_EVENTS


class KubeletWatch(loop.WatcherLoop):
    """The watcher role's loop: inotify on the kubelet directory, a KubeletState on every change."""

    def __init__(self, cfg: Config, *, client: QueueClient | None = None) -> None:
        super().__init__(cfg, KUBELET_WATCH.name, client=client)
        self.kubelet_dir = loop.DirWatch(self.inotify, cfg.kubelet_dir, KUBELET_DIR_EVENTS)
        self.registry_dir: loop.DirWatch | None = None
        self.registration_name = ""
        self.watch_registry()
        self.last: tuple[str, tuple[str, ...]] | None = None
        self.registration = ""  # the registration socket's identity at the last look ("" absent)

    def watch_registry(self) -> None:
        """In DRA mode, watch the registry directory for colad's registration socket; else nothing there."""
        wanted = self.cfg.plugins_registry_dir if self.cfg.dra_mode else None
        self.registration_name = os.path.basename(self.cfg.dra_registration_socket) if wanted else ""
        if self.registry_dir is not None and self.registry_dir.configured != wanted:
            self.registry_dir.close()
            self.registry_dir = None
        if wanted is not None and self.registry_dir is None:
            self.registry_dir = loop.DirWatch(self.inotify, wanted, KUBELET_DIR_EVENTS)

    def apply_config(self, previous: Config) -> None:
        """A reload into or out of DRA mode starts or ends the registry's watch, and looks at once."""
        self.watch_registry()
        if self.registry_dir is not None:
            self.registry_dir.ensure()
        self.look("reload")

    def relevant(self, event: InotifyEvent) -> bool:
        if event.overflow or event.mask & loop.SELF_GONE:
            return True
        if self.registry_dir is not None and self.registry_dir.concerns(event):
            return not event.name or event.name == self.registration_name
        if not self.kubelet_dir.concerns(event):
            return False
        name = event.name
        # Everything else (the checkpoint and its dot-prefixed temp file) is churn.
        return not name or name == constants.KUBELET_SOCKET_NAME or is_plugin_socket_name(name)

    def look(self, reason: str) -> None:
        where = self.kubelet_dir.path  # the directory watched, as resolved at its last look
        registration = ""
        if self.registry_dir is not None:
            registration = socket_identity(os.path.join(self.registry_dir.path, self.registration_name))
        state = (socket_identity(os.path.join(where, constants.KUBELET_SOCKET_NAME)), plugin_sockets(where))
        if state == self.last and registration == self.registration:
            return
        previous, self.last, self.registration = self.last, state, registration
        seq = self.next_seq()
        self.stats.count("changes.kubelet_socket" if previous and previous[0] != state[0] else "changes.sockets")
        if previous is None or previous[0] != state[0]:
            LOG.info(
                "kubelet socket " + ("present" if state[0] else "absent"),
                reason=reason,
                socket=self.cfg.kubelet_socket,
                identity=state[0] or "-",
            )
        elif previous[1] != state[1]:
            LOG.info("plugin sockets changed", reason=reason, sockets=",".join(state[1]) or "-")
        else:
            LOG.info("registration socket changed", reason=reason, identity=registration or "-")
        self.client.publish(messages.KubeletState(self.epoch, seq))

    def step(self, timeout: float | None) -> None:
        events = self.wait(timeout)
        if events is None:
            return
        reason = None
        for event in events:
            self.kubelet_dir.note(event)
            if self.registry_dir is not None:
                self.registry_dir.note(event)
            if self.relevant(event):
                reason = "overflow" if event.overflow else "inotify"
        if self.kubelet_dir.ensure():
            reason = reason or "directory changed"
        if self.registry_dir is not None and self.registry_dir.ensure():
            reason = reason or "directory changed"
        if reason or self.degraded is not None:  # degraded: each turn (at most DEGRADED_POLL_S) looks
            self.look(reason or "poll")
        self.finish(time.monotonic())

    def timeout(self) -> float | None:
        due = self.due()
        return None if not due else max(0.0, min(due) - time.monotonic())

    def run(self) -> int:
        self.run_dir.ensure()
        self.kubelet_dir.ensure()
        if self.registry_dir is not None:
            self.registry_dir.ensure()
        self.look("start")
        while not self.stopping:
            self.step(self.timeout())
        self.close()
        LOG.info("kubelet watcher stopped")
        return 0


def main(args: object = None, cfg: Config | None = None) -> int:
    cfg = cfg or config.load()
    return loop.run_role(KUBELET_WATCH.name, lambda: KubeletWatch(cfg), cfg, kubelet_dir=cfg.kubelet_dir)
