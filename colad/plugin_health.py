"""The plugin's /healthz verdict, from the snapshot the life-cycle thread publishes. Pure.

Healthy means: every resource registered with a live stream and an uncut list, every
role RUNNING (when supervised), discovery heard from recently and the queue listening.
Otherwise one line naming every reason. The HTTP thread calls `verdict`; nothing here locks.
"""

from __future__ import annotations

from dataclasses import dataclass

from colad import constants
from colad.statefile import PluginState

# Discovery reports at least once per rescan_interval (its periodic rescan bumps a counter it sends);
# silent for this many intervals (plus slack), the list the kubelet holds may be stale.
SILENT_INTERVALS = 3
SILENT_SLACK = 10.0


@dataclass(frozen=True)
class Published:
    """What the life-cycle thread publishes (one attribute assignment) for the other threads."""

    state: PluginState
    discovery_heard: float  # monotonic time discovery was last heard from (the start, before it was)
    rescan_interval: float  # discovery's: it reports at least this often
    queue_problem: str = ""


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
    silent = now - published.discovery_heard
    expected = SILENT_INTERVALS * published.rescan_interval + SILENT_SLACK
    if silent > expected:
        problems.append(f"discovery silent for {silent:.0f}s (expected within {expected:.0f}s): list may be stale")
    if published.queue_problem:
        problems.append(f"queue not listening: {published.queue_problem}")
    if problems:
        return False, "; ".join(problems)
    parts = [f"{r.name}, {r.devices} devices" for r in resources]
    unchecked = "" if roles is not None else " (not under supervisord: roles not checked)"
    return True, "ok: registered as " + "; ".join(parts) + unchecked
