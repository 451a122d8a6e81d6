"""The plugin's /healthz and /readyz verdicts, from the snapshot the life-cycle thread publishes. Pure.

Healthy (/healthz): every resource registered with a live stream and an uncut list, every
role RUNNING (when supervised), discovery heard from recently and the queue listening.
Ready (/readyz): registered with the current kubelet, streamed, and the list exact (see
`readiness`). Otherwise one line naming every reason. The HTTP thread calls these; nothing locks.
"""

from __future__ import annotations

from dataclasses import dataclass

from colad import constants
from colad.statefile import PluginState

# Discovery reports at least once per rescan_interval (its periodic rescan bumps a counter it sends);
# silent for this many intervals (plus slack), the list the kubelet holds may be stale.
SILENT_INTERVALS = 3
SILENT_SLACK = 10.0


def degraded(role: str, counters: tuple[tuple[str, int], ...]) -> str:
    """What a role's Stats say of its degraded mode ("" when it watches with inotify).

    Degraded is healthy and ready: the role polls every DEGRADED_POLL_S, so a change reaches the
    kubelet within that interval; a restart would not free the inotify budget other root processes
    hold, and an unready pod would stall a DaemonSet's rollout over a node-local shortage.
    """
    for name, value in counters:
        if value and name.startswith(constants.INOTIFY_DEGRADED):
            limit = name[len(constants.INOTIFY_DEGRADED) :]
            return f"{role} polls every {constants.DEGRADED_POLL_S:g}s (inotify limit fs.inotify.{limit} reached)"
    return ""


@dataclass(frozen=True)
class Published:
    """What the life-cycle thread publishes (one attribute assignment) for the other threads."""

    state: PluginState
    discovery_heard: float  # monotonic time discovery was last heard from (the start, before it was)
    rescan_interval: float  # discovery's: it reports at least this often
    queue_problem: str = ""


def _silent(published: Published, now: float) -> str:
    silent = now - published.discovery_heard
    expected = SILENT_INTERVALS * published.rescan_interval + SILENT_SLACK
    if silent > expected:
        return f"discovery silent for {silent:.0f}s (expected within {expected:.0f}s): list may be stale"
    return ""


def readiness(published: Published, now: float) -> tuple[bool, str]:
    """(True, "ready: ...") exactly when pods may be admitted to every resource's devices, else why not.

    For every resource: registered with the kubelet.sock there is now, a live ListAndWatch
    stream of the registered server, and the list last sent on it is the complete current
    one (discovery's, not the empty list of a start without it, not cut to fit the kubelet's
    limit, not older than the latest change). Roles are not asked: a restarting discovery or
    watcher does not change what the kubelet holds; a discovery gone silent does.
    """
    problems = []
    state = published.state
    if not state.resources:
        problems.append("no resources")
    for r in state.resources:
        if not r.registered:
            problems.append(f"{r.name}: not registered: {r.state}")
        elif not state.kubelet or r.kubelet != state.kubelet:
            problems.append(f"{r.name}: registered with an earlier kubelet, not the one on kubelet.sock now")
        elif r.streams == 0:
            problems.append(f"{r.name}: registered, but the kubelet holds no live ListAndWatch stream")
        elif not r.have_devices:
            problems.append(f"{r.name}: no device list from discovery yet")
        elif not r.list_sent:
            problems.append(f"{r.name}: the current device list is not yet sent to the kubelet")
        if r.cut.dropped:
            problems.append(f"{r.name}: list cut to {r.cut.wanted - r.cut.dropped} of {r.cut.wanted} device IDs")
    if silent := _silent(published, now):
        problems.append(silent)
    if problems:
        return False, "; ".join(problems)
    return True, "ready: " + "; ".join(f"{r.name}, {r.devices} devices" for r in state.resources) + _degraded(state)


def verdict(published: Published, roles: list[str] | None, now: float) -> tuple[bool, str]:
    """(True, "ok: ...") or (False, every problem); `roles` names roles not RUNNING, None when unsupervised."""
    problems = []
    resources = published.state.resources
    for r in resources:
        if r.registered and r.streams == 0:
            problems.append(f"{r.name}: registered, but the kubelet holds no live ListAndWatch stream")
        elif not r.registered:
            error = f" ({r.last_error})" if r.last_error else ""
            problems.append(f"{r.name}: not registered: {r.state}{error}")
        if r.cut.dropped:
            problems.append(
                f"{r.name}: list cut to {r.cut.wanted - r.cut.dropped} of {r.cut.wanted} device IDs "
                f"to fit the kubelet's {constants.KUBELET_MAX_RECV_MESSAGE_BYTES} byte message limit"
            )
    problems.extend(roles or ())
    if silent := _silent(published, now):
        problems.append(silent)
    if published.queue_problem:
        problems.append(f"queue not listening: {published.queue_problem}")
    if problems:
        return False, "; ".join(problems)
    parts = [f"{r.name}, {r.devices} devices" for r in resources]
    unchecked = "" if roles is not None else " (not under supervisord: roles not checked)"
    return True, "ok: registered as " + "; ".join(parts) + unchecked + _degraded(published.state)


def _degraded(state: PluginState) -> str:
    return "; degraded: " + "; ".join(state.degraded) if state.degraded else ""
