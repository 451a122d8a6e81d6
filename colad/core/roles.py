"""The process roles supervisord runs: the one list of them.

`colad <name>` runs `module`.main(); conf/supervisord.conf has a [program:<name>] for each (in its
own order: plugin first); a queue peer connects to the plugin's queue and sends it Stats under its
name. Pure: no I/O.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Role:
    """One process role: its command and supervisord program name, and what it does."""

    name: str
    module: str  # whose main() `colad <name>` runs
    summary: str  # the command's one-line help
    queue_peer: bool  # connects to the plugin's queue and reports its Stats
    nice: int = 0  # os.nice() before its imports: below the roles on the path to Register


DISCOVERY = Role("discovery", "colad.discovery.main", "watch the device directory and publish device snapshots", True)
PLUGIN = Role("plugin", "colad.plugin.main", "serve the device plugin API to the kubelet and keep it registered", False)
# supervisord starts the three roles at once on a node's CPUs; the plugin's Register waits on its own
# start and discovery's first snapshot, not on kubelet-watch: the plugin stats kubelet.sock itself at
# start (kubelet-watch's report is a hint it checks; it also re-registers when its stream ends).
KUBELET_WATCH = Role("kubelet-watch", "colad.kubelet_watch.main", "tell the plugin when the kubelet restarts", True, 10)

ROLES = (DISCOVERY, PLUGIN, KUBELET_WATCH)
ROLE_NAMES = frozenset(r.name for r in ROLES)
QUEUE_PEERS = tuple(r.name for r in ROLES if r.queue_peer)  # the roles whose Stats the plugin accepts
