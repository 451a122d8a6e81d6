"""The registration life cycle of one resource, as a pure state machine.

`step(state, event, now)` returns the next frozen `Registration` and the typed effects the
plugin shell (registrar.py) must carry out: stop or start a server, send or cancel Register, send
the kubelet an empty list. The shell posts what it observed back as events, and an effect it
could not carry out as `EffectFailed`: no effect can leave a resource waiting for ever. No I/O,
clocks, logging or metrics here; every edge is a row in tests/unit/core/test_registration.py.
"""

from __future__ import annotations

import enum
import re
import typing
from dataclasses import dataclass, field, replace

BACKOFF_MIN = 0.1
REGISTER_BACKOFF_MAX = 5.0
INITIAL_DEVICES_WAIT = 3.0  # registering with an empty list would zero allocatable for a moment
STREAM_GRACE = 1.0  # registered but no live ListAndWatch for this long: register again
STREAM_EXPECTED_WITHIN = 10.0  # the kubelet dials back within this long after accepting Register
# The shell answers Serve, CheckSocket and SendRegister at once, in the same pass: an answer still missing
# this long after was lost (the shell failed between effects), so the registration starts again.
ANSWER_WITHIN = 5.0


class Phase(enum.Enum):
    STARTING = "starting"  # waiting for the first device snapshot (at most INITIAL_DEVICES_WAIT)
    REGISTERING = "registering"  # serving; a Register call is in flight
    REGISTERED = "registered"  # the kubelet accepted; its stream is expected or live
    BACKOFF = "backoff"  # the last attempt failed; retry_at is set
    STOPPED = "stopped"  # shut down or removed by a reload


@dataclass(frozen=True)
class Registration:
    """One resource's registration: which server generation serves, which call is in flight, timers.

    `generation` numbers the servers (each on a fresh socket); `call` numbers Register calls
    (0: none in flight); `streams` counts live ListAndWatch streams per generation.
    """

    started: float
    phase: Phase = Phase.STARTING
    generation: int = 0
    endpoint: str = ""  # the socket's file name while a server runs, else ""
    call: int = 0
    calls: int = 0  # calls made so far: the next one is calls + 1
    pending: str = ""  # the reason of a Register waiting for a server (or a socket check)
    pending_cause: str = ""  # and its server-restart cause, should it need a new server
    answer_by: float | None = None  # the answer to `pending`, or to the call in flight, is lost after this
    kubelet_identity: str = ""  # the kubelet.sock the last Register went to
    backoff: float = BACKOFF_MIN
    retry_at: float | None = None
    retry_fresh: bool = False  # the retry must serve on a fresh socket (a late Register may still land)
    stream_check_at: float | None = None
    streams: tuple[tuple[int, int], ...] = ()
    have_devices: bool = False
    withdrawing: bool = False
    last_error: str = ""

    def live_streams(self) -> int:
        return dict(self.streams).get(self.generation, 0)

    def all_streams(self) -> int:
        return sum(count for _generation, count in self.streams)

    def due(self) -> float | None:
        """When the next Timer event must come (None: nothing pending)."""
        times = [t for t in (self.retry_at, self.stream_check_at, self.answer_by) if t is not None]
        if self.phase is Phase.STARTING:
            times.append(self.started + INITIAL_DEVICES_WAIT)
        return min(times) if times else None


# Events: what the shell observed.
@dataclass(frozen=True)
class DevicesSeen:
    """A device snapshot for this resource reached the plugin."""


@dataclass(frozen=True)
class Served:
    generation: int
    endpoint: str


@dataclass(frozen=True)
class SocketChecked:
    """Answer to CheckSocket: is our socket still the one we made (by stat())."""

    intact: bool


@dataclass(frozen=True)
class RegisterSent:
    """Answer to SendRegister: `identity` of kubelet.sock the call went to, "" when it is absent.

    `answer_by`: when its RegisterDone is overdue (the call's own deadline and some slack); None: never.
    """

    call: int
    identity: str
    answer_by: float | None = None


@dataclass(frozen=True)
class RegisterDone:
    call: int
    error: str | None
    late: bool = False  # we stopped waiting, but the kubelet may still carry it out


@dataclass(frozen=True)
class StreamOpened:
    generation: int


@dataclass(frozen=True)
class StreamClosed:
    generation: int


@dataclass(frozen=True)
class KubeletSeen:
    """kubelet.sock's identity ("" when absent) and our socket, checked by stat()."""

    identity: str
    own_socket_intact: bool
    reason: str


@dataclass(frozen=True)
class ServerDied:
    """The thread that serves gRPC calls ended with `error`: the kubelet's calls to our socket go unanswered."""

    error: str


@dataclass(frozen=True)
class Timer:
    pass


@dataclass(frozen=True)
class EffectFailed:
    """The shell could not carry out `effect` (an exception, a thread that could not start): `error` says why.

    The effects after it in the same step were not carried out: they assumed it had been.
    """

    effect: Effect
    error: str


@dataclass(frozen=True)
class OptionsChanged:
    """A reload changed the plugin options (pre_start_required): the kubelet reads them at Register."""


@dataclass(frozen=True)
class Withdraw:
    """Shutdown or removal by a reload: send the kubelet an empty list before the socket goes."""


@dataclass(frozen=True)
class Shutdown:
    pass


Event = (
    DevicesSeen
    | Served
    | SocketChecked
    | RegisterSent
    | RegisterDone
    | StreamOpened
    | StreamClosed
    | KubeletSeen
    | ServerDied
    | Timer
    | EffectFailed
    | OptionsChanged
    | Withdraw
    | Shutdown
)


# Effects: what the shell must do, in order.
@dataclass(frozen=True)
class StopServer:
    """End the streams of `generation` and older, stop its server, remove its socket."""

    generation: int


@dataclass(frozen=True)
class Serve:
    """Serve `generation` on a fresh socket; answer with Served. `cause` is a metric label."""

    generation: int
    cause: str


@dataclass(frozen=True)
class CheckSocket:
    """stat() our socket; answer with SocketChecked."""


@dataclass(frozen=True)
class SendRegister:
    """Register `endpoint` with the kubelet as call `call`; answer with RegisterSent, later RegisterDone."""

    call: int
    endpoint: str


@dataclass(frozen=True)
class CancelCall:
    call: int


@dataclass(frozen=True)
class RetryAt:
    """Register failed: retry at `at` (after `delay` seconds)."""

    at: float
    delay: float
    error: str


@dataclass(frozen=True)
class Accepted:
    endpoint: str


@dataclass(frozen=True)
class Transition:
    previous: Phase
    phase: Phase
    reason: str
    fields: tuple[tuple[str, str], ...] = field(default=())


@dataclass(frozen=True)
class GaveUpWaiting:
    """No device snapshot within INITIAL_DEVICES_WAIT: registering anyway."""

    waited: float


@dataclass(frozen=True)
class SendEmptyList:
    """Tell the kubelet the devices are gone, on the live stream."""


@dataclass(frozen=True)
class Restart:
    """gRPC in this process stopped reporting on calls (a Register unanswered past its own deadline): only a
    new process can be trusted with the next ones, so the plugin exits non-zero and supervisord starts it."""

    reason: str


Effect = (
    StopServer
    | Serve
    | CheckSocket
    | SendRegister
    | CancelCall
    | RetryAt
    | Accepted
    | Transition
    | GaveUpWaiting
    | SendEmptyList
    | Restart
)


EFFECTS: tuple[type, ...] = typing.get_args(Effect)


def effect_name(effect: Effect | type) -> str:
    """The effect's name in logs, errors and metric labels: `SendRegister` -> "send_register"."""
    kind = effect if isinstance(effect, type) else type(effect)
    return re.sub(r"(?<!^)(?=[A-Z])", "_", kind.__name__).lower()


def step(state: Registration, event: Event, now: float) -> tuple[Registration, list[Effect]]:
    """The one transition function: the next state and the effects, in the order they must run."""
    if state.phase is Phase.STOPPED:
        return state, []
    effects: list[Effect] = []
    match event:
        case DevicesSeen():
            if not state.have_devices:  # every change is a DevicesSeen: no new record for the ones after the first
                state = replace(state, have_devices=True)
                if state.phase is Phase.STARTING:
                    state = _register(state, effects, now, "start", "start")
        case Served(generation=generation, endpoint=endpoint) if generation == state.generation and state.pending:
            state = replace(state, endpoint=endpoint)
            state = _send(state, effects)
        case SocketChecked(intact=intact) if state.pending:
            if intact:
                state = _send(state, effects)
            else:
                state = _serve(state, effects, state.pending_cause)
        case RegisterSent(call=call, identity=identity, answer_by=answer_by) if call == state.call:
            state = replace(state, kubelet_identity=identity)
            if not identity:  # no call was made
                state = _failed(replace(_settled(state), call=0), effects, now, "kubelet.sock absent")
            else:
                reason, state = state.pending, replace(_settled(state), answer_by=answer_by)
                state = _transition(state, effects, Phase.REGISTERING, reason, endpoint=state.endpoint)
        case EffectFailed(effect=effect, error=error):
            if state.pending:  # the answer it waits for will not come: start again, on a fresh socket
                state = _retry_fresh(state, effects, now, f"{effect_name(effect)} failed: {error}")
            # Otherwise nothing the registration waits on was lost: a report (a log line, a counter), or
            # the empty list of a withdrawal, which only ends in the shutdown or removal that follows.
        case RegisterDone(call=call, error=error, late=late) if call == state.call and call:
            state = replace(state, call=0, answer_by=None)
            if error:
                # A Register we stopped waiting for may still be carried out: retry on a new socket,
                # so that a late one dials a socket that is gone instead of opening a second stream.
                state = _failed(state, effects, now, error, fresh=late)
            else:
                state = replace(state, backoff=BACKOFF_MIN, last_error="", stream_check_at=now + STREAM_EXPECTED_WITHIN)
                effects.append(Accepted(state.endpoint))
                state = _transition(state, effects, Phase.REGISTERED, "kubelet accepted")
        case StreamOpened(generation=generation):
            state = replace(state, streams=_count(state.streams, generation, +1))
            if generation == state.generation:
                state = replace(state, stream_check_at=None)
        case StreamClosed(generation=generation):
            state = replace(state, streams=_count(state.streams, generation, -1))
            if generation == state.generation and state.phase is Phase.REGISTERED and state.live_streams() == 0:
                state = replace(state, stream_check_at=now + STREAM_GRACE)
        case KubeletSeen(identity=identity, own_socket_intact=intact, reason=reason):
            if state.phase is Phase.STARTING or state.pending:
                pass
            elif identity and identity != state.kubelet_identity:
                # A new kubelet: no reason to wait, once. Taken as the one to register with, so that while
                # its Register keeps failing, reports of the same kubelet leave the retries to the back-off.
                state = replace(state, backoff=BACKOFF_MIN, kubelet_identity=identity)
                cause = f"kubelet.sock recreated ({reason})"
                state = _register(state, effects, now, cause, "kubelet_restart", fresh=True)
            elif not intact:
                state = _register(
                    state, effects, now, f"plugin socket removed ({reason})", "socket_removed", fresh=True
                )
        case ServerDied(error=error):
            if state.endpoint and not state.pending:  # a Serve that failed after it answered: back off, serve anew
                state = _retry_fresh(state, effects, now, f"server stopped serving: {error}")
        case Timer():
            state = _on_timer(state, effects, now)
        case OptionsChanged():
            if state.phase is not Phase.STARTING and not state.withdrawing:
                # A fresh socket: the kubelet must dial a new endpoint to read the new options.
                state = _register(state, effects, now, "plugin options changed", "options_changed", fresh=True)
        case Withdraw():
            if state.phase is Phase.REGISTERED and state.live_streams() > 0 and not state.withdrawing:
                state = replace(state, withdrawing=True)
                effects.append(SendEmptyList())
        case Shutdown():
            state = _cancel(state, effects)
            effects.append(StopServer(state.generation))
            state = replace(_settled(state), endpoint="", retry_at=None, stream_check_at=None)
            state = _transition(state, effects, Phase.STOPPED, "shutdown")
        case _:
            pass  # an answer that no longer matters (an older generation or call)
    return state, effects


def _on_timer(state: Registration, effects: list[Effect], now: float) -> Registration:
    if state.answer_by is not None and now >= state.answer_by:
        if state.pending:
            return _retry_fresh(state, effects, now, f"no answer to the {effect_name(_awaited(state))} effect")
        reason = f"Register call {state.call} not answered in time"
        state = _retry_fresh(state, effects, now, reason)
        effects.append(Restart(f"{reason}, not even by its own deadline"))
        return state
    if state.pending:
        return state
    if state.phase is Phase.STARTING and now >= state.started + INITIAL_DEVICES_WAIT:
        effects.append(GaveUpWaiting(INITIAL_DEVICES_WAIT))
        state = _register(state, effects, now, "start", "start")
    if not state.pending and state.retry_at is not None and now >= state.retry_at:
        state = _register(state, effects, now, "retry", "register_retry", fresh=state.retry_fresh)
    if state.stream_check_at is not None and now >= state.stream_check_at:
        state = replace(state, stream_check_at=None)
        if not state.pending and state.phase is Phase.REGISTERED and state.live_streams() == 0:
            state = _register(state, effects, now, "no live ListAndWatch stream", "stream_lost", fresh=True)
    return state


def _awaited(state: Registration) -> type:
    """The effect whose answer a pending registration waits for: a server, a socket check or Register."""
    if state.call:
        return SendRegister
    return CheckSocket if state.endpoint else Serve


def _retry_fresh(state: Registration, effects: list[Effect], now: float, error: str) -> Registration:
    """What was awaited will not come: cancel the call, back off, then serve anew (a late Register may land)."""
    state = _settled(_cancel(state, effects))
    return _failed(state, effects, now, error, fresh=True)


def _register(
    state: Registration, effects: list[Effect], now: float, reason: str, cause: str, *, fresh: bool = False
) -> Registration:
    """The single path every trigger takes: cancel the call in flight, serve if needed, then Register."""
    state = _cancel(state, effects)
    state = replace(state, retry_at=None, pending=reason, pending_cause=cause, answer_by=now + ANSWER_WITHIN)
    if fresh or not state.endpoint:
        return _serve(state, effects, cause)
    effects.append(CheckSocket())  # serving already: reuse the socket if it is still ours
    return state


def _cancel(state: Registration, effects: list[Effect]) -> Registration:
    """No Register call in flight any more: the one there was is cancelled."""
    if state.call:
        effects.append(CancelCall(state.call))
    return replace(state, call=0, answer_by=None)


def _settled(state: Registration) -> Registration:
    """No Register waiting for a server or a socket check any more."""
    return replace(state, pending="", pending_cause="", answer_by=None)


def _serve(state: Registration, effects: list[Effect], cause: str) -> Registration:
    """A fresh, unique socket per server: the kubelet keys endpoints by socket path."""
    effects.append(StopServer(state.generation))
    generation = state.generation + 1
    effects.append(Serve(generation, cause))
    return replace(state, generation=generation, endpoint="")


def _send(state: Registration, effects: list[Effect]) -> Registration:
    call = state.calls + 1
    effects.append(SendRegister(call, state.endpoint))
    return replace(state, call=call, calls=call)


def _failed(state: Registration, effects: list[Effect], now: float, error: str, *, fresh: bool = False) -> Registration:
    effects.append(RetryAt(now + state.backoff, state.backoff, error))
    state = replace(
        state,
        retry_fresh=fresh,
        last_error=error,
        retry_at=now + state.backoff,
        backoff=min(state.backoff * 2, REGISTER_BACKOFF_MAX),
    )
    return _transition(state, effects, Phase.BACKOFF, error)


def _transition(state: Registration, effects: list[Effect], phase: Phase, reason: str, **fields: str) -> Registration:
    if phase is not state.phase:
        effects.append(Transition(state.phase, phase, reason, tuple(fields.items())))
        state = replace(state, phase=phase)
    return state


def _count(streams: tuple[tuple[int, int], ...], generation: int, delta: int) -> tuple[tuple[int, int], ...]:
    counts = dict(streams)
    counts[generation] = counts.get(generation, 0) + delta
    if counts[generation] <= 0:
        del counts[generation]
    return tuple(sorted(counts.items()))
