"""The health rule of colad, one owner for /healthz, /readyz and `colad status`. Pure.

Healthy (`assess`): every resource registered with a live stream and an uncut list, every
role RUNNING or STARTING (when supervised), discovery heard from recently, the queue listening,
the state file written and the last reload taken. Ready (/readyz): registered with the current
kubelet, streamed, and the list exact (see `readiness`); in DRA mode registered with the kubelet's
plugin watcher and this node's slices published and current (`dra_readiness`). Otherwise one line
naming every reason.
The plugin's HTTP thread and status socket call these on the published snapshot; nothing locks.
"""

from __future__ import annotations

from dataclasses import dataclass

from colad.core import constants
from colad.core.roles import PLUGIN, ROLES
from colad.outputs.statefile import PluginState, SliceStatus

# The programs of supervisord's colad group, in its order: the plugin first.
PROGRAMS = (PLUGIN.name, *(r.name for r in ROLES if r is not PLUGIN))
STARTING = "STARTING"  # supervisord's state for a process in its first startsecs
# A resource in these states, with no error yet, is on its way to registering, not failing.
_ON_ITS_WAY = ("starting", "registering")
# Discovery reports at least once per rescan_interval (its periodic rescan bumps a counter it sends);
# silent for this many intervals (plus slack), the list the kubelet holds may be stale.
SILENT_INTERVALS = 3
SILENT_SLACK = 10.0
# The DRA registration's phase once the kubelet said "registered" (colad.dra.registration.RegistrationPhase,
# a layer above: a test holds the two equal), and the one the kubelet's refusal leaves.
DRA_REGISTERED = "registered"
DRA_REFUSED = "refused"
DRA_SERVING = "serving"


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
class PluginSnapshot:
    """What the life-cycle thread publishes (one attribute assignment) for the other threads."""

    state: PluginState
    discovery_heard: float  # monotonic time discovery was last heard from (the start, before it was)
    rescan_interval: float  # discovery's: it reports at least this often
    queue_problem: str = ""
    state_file_problem: str = ""  # why the state file is not written now ("" when it is)


def _silent(snapshot: PluginSnapshot, now: float) -> str:
    silent = now - snapshot.discovery_heard
    expected = SILENT_INTERVALS * snapshot.rescan_interval + SILENT_SLACK
    if silent > expected:
        return f"discovery silent for {silent:.0f}s (expected within {expected:.0f}s): list may be stale"
    return ""


def readiness(snapshot: PluginSnapshot, now: float) -> tuple[bool, str]:
    """(True, "ready: ...") exactly when pods may be admitted to every resource's devices, else why not.

    For every resource: registered with the kubelet.sock there is now, a live ListAndWatch
    stream of the registered server, and the list last sent on it is the complete current
    one (discovery's, not the empty list of a start without it, not cut to fit the kubelet's
    limit, not older than the latest change). Roles are not asked: a restarting discovery or
    watcher does not change what the kubelet holds; a discovery gone silent does.
    """
    state = snapshot.state
    if state.dra_driver:
        return dra_readiness(state, _silent(snapshot, now))
    problems = []
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
    if silent := _silent(snapshot, now):
        problems.append(silent)
    if problems:
        return False, "; ".join(problems)
    return True, "ready: " + "; ".join(f"{r.name}, {r.devices} devices" for r in state.resources) + _degraded(state)


def dra_registration_problem(state: PluginState) -> str:
    """Why the DRA driver is not registered with the kubelet's plugin watcher ("" when it is)."""
    if state.dra_registration == DRA_REGISTERED:
        return ""
    if state.dra_registration == DRA_REFUSED:
        detail = f"refused: {state.dra_registration_error or 'no reason given'}"
    elif state.dra_problem:
        detail = state.dra_problem
    elif state.dra_registration == DRA_SERVING:
        detail = "the registration socket is served; no word from the kubelet yet"
    else:
        detail = state.dra_registration or "not started"
    return f"not registered with the kubelet plugin watcher ({detail})"


def slices_problem(slices: SliceStatus) -> str:
    """Why this node's slices are not current ("" when they are): what the API server may lack, and why."""
    if slices.current:
        return ""
    if not slices.wanted:
        why = "no device list from discovery yet"
    elif slices.failing:
        waits = "a change waits to be written" if slices.pending or not slices.published else "changes unseen"
        why = f"API server failing ({slices.failing}); {waits}"
    elif not slices.published:
        why = "not yet published"
    else:
        why = "a change not yet written"
    return f"slices not current: {why}"


def dra_readiness(state: PluginState, silent: str = "") -> tuple[bool, str]:
    """DRA mode's /readyz: (True, "ready: ...") exactly when the kubelet registered the driver and the API
    server holds this node's slices as discovery last reported them, else every reason why not.

    The scheduler allocates from the slices and the kubelet prepares through the registered driver:
    with either missing or stale, a pod may be bound to devices colad does not list now. A discovery
    gone silent leaves the slices stale as well.
    """
    problems = [p for p in (dra_registration_problem(state), slices_problem(state.dra_slices), silent) if p]
    if problems:
        return False, "; ".join(problems)
    s = state.dra_slices
    return True, f"ready: driver {state.dra_driver} registered; {s.devices} devices in {s.slices} slices" + _degraded(
        state
    )


@dataclass(frozen=True)
class RoleView:
    """supervisord's processes as health sees them: not doing their job, and in their start window."""

    problems: tuple[str, ...] = ()  # "<name> is <STATE>", a missing program, or why supervisord cannot tell
    starting: tuple[str, ...] = ()  # in supervisord's STARTING window (startsecs): not a problem by itself


def role_view(infos: list[dict[str, object]], *, watchdog: str = "") -> RoleView:
    """The rule for supervisord's answer (pure): every process not RUNNING or STARTING is a problem.

    A role in BACKOFF, FATAL, EXITED or STOPPED is colad not doing its job, whoever stopped it.
    STARTING (the first startsecs after a spawn) is not a problem by itself: what it means for
    registration is decided in `assess`. `watchdog` names why a FATAL role would stay down, if it would.
    """
    states = {str(i.get("name")): str(i.get("statename")) for i in infos}
    problems = [f"{name} is MISSING" for name in PROGRAMS if name not in states]
    problems += [f"{name} is {state}" for name, state in sorted(states.items()) if state not in ("RUNNING", STARTING)]
    if watchdog:
        problems.append(watchdog)
    return RoleView(tuple(problems), tuple(sorted(n for n, s in states.items() if s == STARTING)))


@dataclass(frozen=True)
class Verdict:
    """The health of the plugin at one moment: what is wrong, what is only on its way, and the 200 line."""

    problems: tuple[str, ...] = ()  # degraded: `colad status` exits 1
    waiting: tuple[str, ...] = ()  # not registered yet for no reason but the start: `colad status` exits 4
    fine: str = ""  # the /healthz line when there is neither

    @property
    def ok(self) -> bool:
        return not self.problems and not self.waiting

    def line(self) -> str:
        return self.fine if self.ok else "; ".join(self.waiting + self.problems)


def assess(
    snapshot: PluginSnapshot, roles: RoleView | None, now: float, *, unasked: str = "", refused: tuple[str, ...] = ()
) -> Verdict:
    """The one health rule, for /healthz and `colad status` alike; `roles` None: not under supervisord.

    Unhealthy: a resource not registered, without a live stream or with a cut list; a role not doing
    its job; discovery silent; the queue not listening; the state file not written; the config on
    disk refused (the running one stays, but a restart would not start). A resource still on its
    way (starting, or registering without an error yet, or registered with the kubelet's stream not
    yet dialled back) is waiting, as is everything while supervisord says the plugin itself is STARTING.
    `unasked` says why `colad status` cannot ask the plugin now: then it cannot say healthy, nor may this.
    `refused` names device directories the trust rule refuses now (a directory refused from the
    start has no device to carry the reason): each is a problem. In DRA mode a driver the kubelet
    refused, or whose sockets are not served, is a problem; one served with no word from the kubelet
    yet is waiting. Slices not current are a matter of readiness, not health: an API-server outage is
    not mended by restarting colad.
    """
    problems: list[str] = []
    waiting: list[str] = []
    state = snapshot.state
    plugin_starting = roles is not None and PLUGIN.name in roles.starting
    for r in state.resources:
        if r.registered and r.streams == 0:
            waiting.append(f"{r.name}: registered, but the kubelet holds no live ListAndWatch stream")
        elif not r.registered:
            error = f" ({r.last_error})" if r.last_error else ""
            on_its_way = r.state in _ON_ITS_WAY and not r.last_error
            where = waiting if on_its_way or plugin_starting else problems
            where.append(f"{r.name}: not registered: {r.state}{error}")
        if r.cut.dropped:
            problems.append(
                f"{r.name}: list cut to {r.cut.wanted - r.cut.dropped} of {r.cut.wanted} device IDs "
                f"to fit the kubelet's {constants.KUBELET_MAX_RECV_MESSAGE_BYTES} byte message limit"
            )
    if state.dra_driver and (unregistered := dra_registration_problem(state)):
        on_its_way = state.dra_registration == DRA_SERVING and not state.dra_problem
        (waiting if on_its_way or plugin_starting else problems).append(unregistered)
    problems.extend(roles.problems if roles is not None else ())
    if silent := _silent(snapshot, now):
        problems.append(silent)
    if snapshot.queue_problem:
        problems.append(f"queue not listening: {snapshot.queue_problem}")
    if snapshot.state_file_problem:
        problems.append(snapshot.state_file_problem)
    if unasked:
        problems.append(unasked)
    problems.extend(refused)
    if state.reload is not None and not state.reload.ok:
        problems.append(f"last reload refused, the running config stays: {state.reload.reason}")
    parts = [f"{r.name}, {r.devices} devices" for r in state.resources]
    if state.dra_driver:
        parts = [f"DRA driver {state.dra_driver}, {state.dra_slices.devices} devices published"]
    unchecked = "" if roles is not None else " (not under supervisord: roles not checked)"
    return Verdict(
        tuple(problems), tuple(waiting), "ok: registered as " + "; ".join(parts) + unchecked + _degraded(state)
    )


def _degraded(state: PluginState) -> str:
    return "; degraded: " + "; ".join(state.degraded) if state.degraded else ""


def verdict(snapshot: PluginSnapshot, roles: RoleView | None, now: float) -> tuple[bool, str]:
    """/healthz: (True, "ok: ...") or (False, every problem), by `assess`."""
    found = assess(snapshot, roles, now)
    return found.ok, found.line()
