"""Unit tests for colad.core.registration: the life cycle as a table of (state, event) -> (state, effects).

Each row names the edge and, where an end-to-end or chaos test covers it as well, that test.
States are built from a few named fixtures below; `now` is 100.0 unless a row says otherwise.
"""

from __future__ import annotations

import functools
from dataclasses import replace

import pytest

from colad.core.registration import (
    ANSWER_WITHIN,
    BACKOFF_MIN,
    EFFECTS,
    INITIAL_DEVICES_WAIT,
    REGISTER_BACKOFF_MAX,
    STREAM_EXPECTED_WITHIN,
    STREAM_GRACE,
    Accepted,
    CancelCall,
    CheckSocket,
    DevicesSeen,
    Effect,
    EffectFailed,
    Event,
    GaveUpWaiting,
    KubeletSeen,
    OptionsChanged,
    Phase,
    RegisterDone,
    RegisterSent,
    Registration,
    Restart,
    RetryAt,
    SendEmptyList,
    SendRegister,
    Serve,
    Served,
    ServerDied,
    Shutdown,
    SocketChecked,
    StopServer,
    StreamClosed,
    StreamOpened,
    Timer,
    Transition,
    Withdraw,
    step,
)

pytestmark = pytest.mark.unit

NOW = 100.0
KUBELET = "1:2:3"
AWAIT = NOW + ANSWER_WITHIN  # a pending registration's answer is lost after this
NEW_KUBELET = "1:9:9"

STARTING = Registration(started=NOW - 1.0)
# serving generation 1 on colad-1.sock, Register call 1 in flight
REGISTERING = replace(
    STARTING,
    phase=Phase.REGISTERING,
    generation=1,
    endpoint="colad-1.sock",
    call=1,
    calls=1,
    kubelet_identity=KUBELET,
    have_devices=True,
)
# accepted, the kubelet's stream on generation 1 live
REGISTERED = replace(REGISTERING, phase=Phase.REGISTERED, call=0, streams=((1, 1),))
# accepted, but the kubelet has not dialled back yet
AWAITING_STREAM = replace(REGISTERED, streams=(), stream_check_at=NOW + STREAM_EXPECTED_WITHIN)
# failed twice: back-off doubled to 0.4 s, the retry due at NOW
BACKOFF = replace(
    REGISTERED, phase=Phase.BACKOFF, streams=(), backoff=0.4, retry_at=NOW, last_error="UNAVAILABLE: connect failed"
)
# the last Register timed out: it may still be carried out, so the retry needs a fresh socket
BACKOFF_LATE = replace(BACKOFF, retry_fresh=True, last_error="DEADLINE_EXCEEDED: Deadline Exceeded")


def registered_transition(previous: Phase) -> Transition:
    return Transition(previous, Phase.REGISTERED, "kubelet accepted")


CASES = [
    # --- start: wait for the first snapshot, then register -------------------------------------
    pytest.param(
        STARTING,
        DevicesSeen(),
        replace(STARTING, have_devices=True, generation=1, answer_by=AWAIT, pending="start", pending_cause="start"),
        [StopServer(0), Serve(1, "start")],
        id="first-snapshot-while-starting-serves-generation-1",
    ),
    pytest.param(
        REGISTERED,
        DevicesSeen(),
        REGISTERED,
        [],
        id="later-snapshot-changes-nothing-in-the-life-cycle",
    ),
    pytest.param(
        STARTING,
        Timer(),
        STARTING,
        [],
        id="initial-wait-not-over-keeps-waiting",
    ),
    pytest.param(
        replace(STARTING, started=NOW - INITIAL_DEVICES_WAIT),
        Timer(),
        replace(
            STARTING,
            started=NOW - INITIAL_DEVICES_WAIT,
            generation=1,
            answer_by=AWAIT,
            pending="start",
            pending_cause="start",
        ),
        [GaveUpWaiting(INITIAL_DEVICES_WAIT), StopServer(0), Serve(1, "start")],
        id="initial-wait-over-registers-with-no-snapshot",
    ),
    pytest.param(
        STARTING,
        KubeletSeen(NEW_KUBELET, False, "watcher"),
        STARTING,
        [],
        id="kubelet-seen-while-starting-waits-for-the-snapshot",
    ),
    # --- serving, then Register --------------------------------------------------------------------
    pytest.param(
        replace(STARTING, generation=1, answer_by=AWAIT, pending="start", pending_cause="start", have_devices=True),
        Served(1, "colad-1.sock"),
        replace(
            STARTING,
            generation=1,
            answer_by=AWAIT,
            pending="start",
            pending_cause="start",
            have_devices=True,
            endpoint="colad-1.sock",
            call=1,
            calls=1,
        ),
        [SendRegister(1, "colad-1.sock")],
        id="served-sends-register-on-the-new-socket",
    ),
    pytest.param(
        replace(STARTING, generation=1, answer_by=AWAIT, pending="start", endpoint="colad-1.sock", call=1, calls=1),
        RegisterSent(1, KUBELET),
        replace(
            STARTING,
            phase=Phase.REGISTERING,
            generation=1,
            endpoint="colad-1.sock",
            call=1,
            calls=1,
            kubelet_identity=KUBELET,
        ),
        [Transition(Phase.STARTING, Phase.REGISTERING, "start", (("endpoint", "colad-1.sock"),))],
        id="register-sent-is-registering",
    ),
    pytest.param(
        replace(STARTING, generation=1, answer_by=AWAIT, pending="start", endpoint="colad-1.sock", call=1, calls=1),
        RegisterSent(1, ""),
        replace(
            STARTING,
            phase=Phase.BACKOFF,
            generation=1,
            endpoint="colad-1.sock",
            calls=1,
            retry_at=NOW + BACKOFF_MIN,
            backoff=2 * BACKOFF_MIN,
            last_error="kubelet.sock absent",
        ),
        [
            RetryAt(NOW + BACKOFF_MIN, BACKOFF_MIN, "kubelet.sock absent"),
            Transition(Phase.STARTING, Phase.BACKOFF, "kubelet.sock absent"),
        ],
        id="kubelet-sock-absent-backs-off-keeping-the-server",
    ),
    pytest.param(
        replace(STARTING, generation=1, pending="start", pending_cause="start", answer_by=AWAIT),
        EffectFailed(Serve(1, "start"), "OSError: cannot listen"),
        replace(
            STARTING,
            phase=Phase.BACKOFF,
            generation=1,
            retry_at=NOW + BACKOFF_MIN,
            retry_fresh=True,
            backoff=2 * BACKOFF_MIN,
            last_error="serve failed: OSError: cannot listen",
        ),
        [
            RetryAt(NOW + BACKOFF_MIN, BACKOFF_MIN, "serve failed: OSError: cannot listen"),
            Transition(Phase.STARTING, Phase.BACKOFF, "serve failed: OSError: cannot listen"),
        ],
        id="serve-failed-backs-off",
    ),
    pytest.param(
        replace(REGISTERING, generation=2),
        Served(1, "colad-old.sock"),
        replace(REGISTERING, generation=2),
        [],
        id="served-answer-of-an-older-generation-is-ignored",
    ),
    # --- Register answered -------------------------------------------------------------------------
    pytest.param(
        REGISTERING,
        RegisterDone(1, None),
        replace(REGISTERING, phase=Phase.REGISTERED, call=0, stream_check_at=NOW + STREAM_EXPECTED_WITHIN),
        [Accepted("colad-1.sock"), registered_transition(Phase.REGISTERING)],
        id="register-accepted-expects-a-stream-within-10s",
    ),
    pytest.param(
        replace(REGISTERING, backoff=REGISTER_BACKOFF_MAX),
        RegisterDone(1, None),
        replace(REGISTERING, phase=Phase.REGISTERED, call=0, stream_check_at=NOW + STREAM_EXPECTED_WITHIN),
        [Accepted("colad-1.sock"), registered_transition(Phase.REGISTERING)],
        id="register-accepted-resets-the-back-off",
    ),
    pytest.param(
        REGISTERING,
        RegisterDone(1, "UNKNOWN: bad resource"),
        replace(
            REGISTERING,
            phase=Phase.BACKOFF,
            call=0,
            retry_at=NOW + BACKOFF_MIN,
            backoff=2 * BACKOFF_MIN,
            last_error="UNKNOWN: bad resource",
        ),
        [
            RetryAt(NOW + BACKOFF_MIN, BACKOFF_MIN, "UNKNOWN: bad resource"),
            Transition(Phase.REGISTERING, Phase.BACKOFF, "UNKNOWN: bad resource"),
        ],
        id="register-refused-backs-off-on-the-same-socket",
    ),
    pytest.param(
        # a Register the kubelet carries out after its deadline (tests/e2e/test_plugin_contract.py)
        REGISTERING,
        RegisterDone(1, "DEADLINE_EXCEEDED: Deadline Exceeded", late=True),
        replace(
            REGISTERING,
            phase=Phase.BACKOFF,
            call=0,
            retry_at=NOW + BACKOFF_MIN,
            backoff=2 * BACKOFF_MIN,
            retry_fresh=True,
            last_error="DEADLINE_EXCEEDED: Deadline Exceeded",
        ),
        [
            RetryAt(NOW + BACKOFF_MIN, BACKOFF_MIN, "DEADLINE_EXCEEDED: Deadline Exceeded"),
            Transition(Phase.REGISTERING, Phase.BACKOFF, "DEADLINE_EXCEEDED: Deadline Exceeded"),
        ],
        id="register-timed-out-may-land-late-so-the-retry-needs-a-fresh-socket",
    ),
    pytest.param(
        replace(REGISTERING, backoff=REGISTER_BACKOFF_MAX),
        RegisterDone(1, "UNAVAILABLE: x"),
        replace(
            REGISTERING,
            phase=Phase.BACKOFF,
            call=0,
            retry_at=NOW + REGISTER_BACKOFF_MAX,
            backoff=REGISTER_BACKOFF_MAX,
            last_error="UNAVAILABLE: x",
        ),
        [
            RetryAt(NOW + REGISTER_BACKOFF_MAX, REGISTER_BACKOFF_MAX, "UNAVAILABLE: x"),
            Transition(Phase.REGISTERING, Phase.BACKOFF, "UNAVAILABLE: x"),
        ],
        id="back-off-is-capped-at-5s",
    ),
    pytest.param(
        replace(REGISTERING, call=2, calls=2),
        RegisterDone(1, None),
        replace(REGISTERING, call=2, calls=2),
        [],
        id="answer-of-a-cancelled-call-is-ignored",
    ),
    pytest.param(
        REGISTERED,
        RegisterDone(1, "cancelled"),
        REGISTERED,
        [],
        id="answer-after-registered-with-no-call-is-ignored",
    ),
    # --- retries -------------------------------------------------------------------------------------
    pytest.param(
        BACKOFF,
        Timer(),
        replace(BACKOFF, retry_at=None, answer_by=AWAIT, pending="retry", pending_cause="register_retry"),
        [CheckSocket()],
        id="retry-due-reuses-the-socket-if-it-is-still-ours",
    ),
    pytest.param(
        replace(BACKOFF, answer_by=AWAIT, pending="retry", pending_cause="register_retry", retry_at=None),
        SocketChecked(True),
        replace(
            BACKOFF, answer_by=AWAIT, pending="retry", pending_cause="register_retry", retry_at=None, call=2, calls=2
        ),
        [SendRegister(2, "colad-1.sock")],
        id="retry-socket-intact-registers-it-again",
    ),
    pytest.param(
        replace(BACKOFF, answer_by=AWAIT, pending="retry", pending_cause="register_retry", retry_at=None),
        SocketChecked(False),
        replace(
            BACKOFF,
            answer_by=AWAIT,
            pending="retry",
            pending_cause="register_retry",
            retry_at=None,
            generation=2,
            endpoint="",
        ),
        [StopServer(1), Serve(2, "register_retry")],
        id="retry-socket-gone-serves-anew",
    ),
    pytest.param(
        BACKOFF_LATE,
        Timer(),
        replace(
            BACKOFF_LATE,
            retry_at=None,
            generation=2,
            endpoint="",
            answer_by=AWAIT,
            pending="retry",
            pending_cause="register_retry",
        ),
        [StopServer(1), Serve(2, "register_retry")],
        id="retry-after-a-late-register-serves-on-a-fresh-socket",
    ),
    pytest.param(
        replace(BACKOFF, retry_at=NOW + 0.3),
        Timer(),
        replace(BACKOFF, retry_at=NOW + 0.3),
        [],
        id="retry-not-due-waits",
    ),
    # --- the kubelet and our socket, checked by stat() ------------------------------------------------
    pytest.param(
        REGISTERED,
        KubeletSeen(KUBELET, True, "watcher"),
        REGISTERED,
        [],
        id="same-kubelet-and-socket-intact-changes-nothing",
    ),
    pytest.param(
        REGISTERED,
        KubeletSeen(NEW_KUBELET, False, "watcher"),
        replace(
            REGISTERED,
            generation=2,
            endpoint="",
            answer_by=AWAIT,
            kubelet_identity=NEW_KUBELET,
            pending="kubelet.sock recreated (watcher)",
            pending_cause="kubelet_restart",
        ),
        [StopServer(1), Serve(2, "kubelet_restart")],
        id="kubelet-restarted-serves-on-a-fresh-socket",
    ),
    pytest.param(
        # chaos kubelet_restart during kubelet_away: the new kubelet must not wait out a 5 s back-off
        replace(BACKOFF, backoff=REGISTER_BACKOFF_MAX, retry_at=NOW + 4.0),
        KubeletSeen(NEW_KUBELET, True, "watcher"),
        replace(
            BACKOFF,
            backoff=BACKOFF_MIN,
            retry_at=None,
            generation=2,
            endpoint="",
            answer_by=AWAIT,
            kubelet_identity=NEW_KUBELET,
            pending="kubelet.sock recreated (watcher)",
            pending_cause="kubelet_restart",
        ),
        [StopServer(1), Serve(2, "kubelet_restart")],
        id="kubelet-restarted-during-back-off-resets-it-and-retries-at-once",
    ),
    pytest.param(
        REGISTERING,
        KubeletSeen(NEW_KUBELET, True, "periodic"),
        replace(
            REGISTERING,
            call=0,
            generation=2,
            endpoint="",
            answer_by=AWAIT,
            kubelet_identity=NEW_KUBELET,
            pending="kubelet.sock recreated (periodic)",
            pending_cause="kubelet_restart",
        ),
        [CancelCall(1), StopServer(1), Serve(2, "kubelet_restart")],
        id="kubelet-restarted-while-registering-cancels-the-hanging-call",
    ),
    pytest.param(
        REGISTERED,
        KubeletSeen(KUBELET, False, "watcher"),
        replace(
            REGISTERED,
            generation=2,
            endpoint="",
            answer_by=AWAIT,
            pending="plugin socket removed (watcher)",
            pending_cause="socket_removed",
        ),
        [StopServer(1), Serve(2, "socket_removed")],
        id="own-socket-gone-serves-anew",
    ),
    pytest.param(
        # a report of the kubelet whose Register keeps failing (every new socket is one) waits for the back-off
        replace(BACKOFF, kubelet_identity=NEW_KUBELET, retry_at=NOW + 0.4),
        KubeletSeen(NEW_KUBELET, True, "watcher"),
        replace(BACKOFF, kubelet_identity=NEW_KUBELET, retry_at=NOW + 0.4),
        [],
        id="the-same-new-kubelet-reported-again-leaves-the-retry-to-the-back-off",
    ),
    pytest.param(
        BACKOFF,
        KubeletSeen("", True, "watcher"),
        BACKOFF,
        [],
        id="kubelet-away-leaves-the-back-off-to-its-timer",
    ),
    # --- streams -------------------------------------------------------------------------------------
    pytest.param(
        AWAITING_STREAM,
        StreamOpened(1),
        replace(AWAITING_STREAM, streams=((1, 1),), stream_check_at=None),
        [],
        id="stream-opened-after-register-cancels-the-check",
    ),
    pytest.param(
        # the kubelet dials while Register is in flight (current kubelets do)
        REGISTERING,
        StreamOpened(1),
        replace(REGISTERING, streams=((1, 1),)),
        [],
        id="stream-opened-before-register-answers-is-counted",
    ),
    pytest.param(
        REGISTERING,
        StreamClosed(1),
        REGISTERING,
        [],
        id="stream-closed-before-register-answers-sets-no-grace",
    ),
    pytest.param(
        REGISTERED,
        StreamClosed(1),
        replace(REGISTERED, streams=(), stream_check_at=NOW + STREAM_GRACE),
        [],
        id="stream-closed-after-register-starts-the-1s-grace",
    ),
    pytest.param(
        replace(REGISTERED, streams=((1, 2),)),
        StreamClosed(1),
        replace(REGISTERED, streams=((1, 1),)),
        [],
        id="one-of-two-streams-closed-keeps-the-live-one",
    ),
    pytest.param(
        replace(REGISTERED, generation=2, streams=((1, 1), (2, 1))),
        StreamClosed(1),
        replace(REGISTERED, generation=2, streams=((2, 1),)),
        [],
        id="old-generation-stream-closed-is-only-counted",
    ),
    pytest.param(
        replace(REGISTERED, generation=2, streams=((2, 1),)),
        StreamOpened(1),
        replace(REGISTERED, generation=2, streams=((1, 1), (2, 1))),
        [],
        id="old-generation-stream-opened-is-not-the-live-one",
    ),
    pytest.param(
        replace(REGISTERED, streams=(), stream_check_at=NOW),
        Timer(),
        replace(
            REGISTERED,
            streams=(),
            generation=2,
            endpoint="",
            answer_by=AWAIT,
            pending="no live ListAndWatch stream",
            pending_cause="stream_lost",
        ),
        [StopServer(1), Serve(2, "stream_lost")],
        id="grace-over-without-a-stream-registers-on-a-fresh-socket",
    ),
    pytest.param(
        replace(REGISTERED, stream_check_at=NOW),
        Timer(),
        REGISTERED,
        [],
        id="grace-over-with-a-live-stream-again-does-nothing",
    ),
    pytest.param(
        replace(BACKOFF, retry_at=NOW + 1.0, stream_check_at=NOW),
        Timer(),
        replace(BACKOFF, retry_at=NOW + 1.0),
        [],
        id="stale-stream-check-in-back-off-is-dropped",
    ),
    pytest.param(
        replace(AWAITING_STREAM, stream_check_at=NOW + 9.0),
        Timer(),
        replace(AWAITING_STREAM, stream_check_at=NOW + 9.0),
        [],
        id="safety-timer-before-the-stream-is-due-does-nothing",
    ),
    # --- withdraw and shutdown ------------------------------------------------------------------------
    pytest.param(
        REGISTERED,
        Withdraw(),
        replace(REGISTERED, withdrawing=True),
        [SendEmptyList()],
        id="withdraw-registered-with-a-stream-sends-an-empty-list",
    ),
    pytest.param(
        AWAITING_STREAM,
        Withdraw(),
        AWAITING_STREAM,
        [],
        id="withdraw-without-a-live-stream-sends-nothing",
    ),
    pytest.param(
        BACKOFF,
        Withdraw(),
        BACKOFF,
        [],
        id="withdraw-not-registered-sends-nothing",
    ),
    pytest.param(
        replace(REGISTERED, withdrawing=True),
        Shutdown(),
        replace(REGISTERED, withdrawing=True, phase=Phase.STOPPED, endpoint=""),
        [StopServer(1), Transition(Phase.REGISTERED, Phase.STOPPED, "shutdown")],
        id="shutdown-after-withdraw-stops-the-server",
    ),
    pytest.param(
        REGISTERING,
        Shutdown(),
        replace(REGISTERING, phase=Phase.STOPPED, endpoint="", call=0),
        [CancelCall(1), StopServer(1), Transition(Phase.REGISTERING, Phase.STOPPED, "shutdown")],
        id="shutdown-while-registering-cancels-the-call",
    ),
    pytest.param(
        replace(BACKOFF, retry_at=NOW),
        Shutdown(),
        replace(BACKOFF, phase=Phase.STOPPED, endpoint="", retry_at=None),
        [StopServer(1), Transition(Phase.BACKOFF, Phase.STOPPED, "shutdown")],
        id="shutdown-in-back-off-drops-the-retry",
    ),
    pytest.param(
        replace(REGISTERED, phase=Phase.STOPPED),
        KubeletSeen(NEW_KUBELET, False, "watcher"),
        replace(REGISTERED, phase=Phase.STOPPED),
        [],
        id="stopped-ignores-everything",
    ),
]


@pytest.mark.parametrize(("state", "event", "expected", "effects"), CASES)
def test_step(state: Registration, event: Event, expected: Registration, effects: list[Effect]) -> None:
    assert step(state, event, NOW) == (expected, effects)


def run(state: Registration, events: list[tuple[float, Event]]) -> tuple[Registration, list[Effect]]:
    done: list[Effect] = []
    for now, event in events:
        state, effects = step(state, event, now)
        done.extend(effects)
    return state, done


def test_a_whole_life_start_register_stream_kubelet_restart_and_shutdown() -> None:
    state, effects = run(
        Registration(started=0.0),
        [
            (0.5, DevicesSeen()),
            (0.5, Served(1, "colad-1.sock")),
            (0.5, RegisterSent(1, KUBELET)),
            (0.5, StreamOpened(1)),
            (0.6, RegisterDone(1, None)),
            (9.0, KubeletSeen(NEW_KUBELET, False, "watcher")),
            (9.0, Served(2, "colad-2.sock")),
            (9.0, RegisterSent(2, NEW_KUBELET)),
            (9.0, StreamClosed(1)),  # the old generation's stream ends: not the live one
            (9.1, RegisterDone(2, None)),
            (9.1, StreamOpened(2)),
            (20.0, Timer()),  # the stream check of the first Register was replaced, and the stream is live
        ],
    )
    assert state.phase is Phase.REGISTERED
    assert (state.generation, state.endpoint, state.live_streams()) == (2, "colad-2.sock", 1)
    assert state.stream_check_at is None
    assert [e for e in effects if isinstance(e, Serve)] == [Serve(1, "start"), Serve(2, "kubelet_restart")]
    assert [e for e in effects if isinstance(e, Accepted)] == [Accepted("colad-1.sock"), Accepted("colad-2.sock")]
    state, effects = run(state, [(30.0, Withdraw()), (30.1, Shutdown())])
    assert effects == [SendEmptyList(), StopServer(2), Transition(Phase.REGISTERED, Phase.STOPPED, "shutdown")]


def test_back_off_doubles_from_100ms_to_5s_while_the_kubelet_is_away() -> None:
    state = replace(REGISTERING, call=0, calls=0)
    delays = []
    now = 0.0
    for call in range(1, 10):
        state, effects = run(state, [(now, Timer())] if state.phase is Phase.BACKOFF else [])
        state = replace(state, call=call, calls=call, pending="")
        state, effects = step(state, RegisterDone(call, "UNAVAILABLE: connect failed"), now)
        retry = [e for e in effects if isinstance(e, RetryAt)]
        delays.append(retry[0].delay)
        now = retry[0].at
    assert delays == [0.1, 0.2, 0.4, 0.8, 1.6, 3.2, 5.0, 5.0, 5.0]


def test_due_names_the_earliest_timer() -> None:
    assert STARTING.due() == STARTING.started + INITIAL_DEVICES_WAIT
    assert REGISTERED.due() is None
    assert replace(BACKOFF, stream_check_at=NOW - 1.0).due() == NOW - 1.0
    assert AWAITING_STREAM.due() == NOW + STREAM_EXPECTED_WITHIN


# --- an effect that fails is an event ---------------------------------------------------------------
FAILURE = "RuntimeError: can't start new thread"

FAILED_CASES = [
    pytest.param(
        replace(REGISTERED, generation=2, endpoint="", answer_by=AWAIT, pending="retry", pending_cause="stream_lost"),
        EffectFailed(StopServer(1), FAILURE),
        replace(
            REGISTERED,
            phase=Phase.BACKOFF,
            generation=2,
            endpoint="",
            retry_at=NOW + BACKOFF_MIN,
            retry_fresh=True,
            backoff=2 * BACKOFF_MIN,
            last_error=f"stop_server failed: {FAILURE}",
        ),
        [
            RetryAt(NOW + BACKOFF_MIN, BACKOFF_MIN, f"stop_server failed: {FAILURE}"),
            Transition(Phase.REGISTERED, Phase.BACKOFF, f"stop_server failed: {FAILURE}"),
        ],
        id="stop-server-failed-backs-off-to-serve-anew",
    ),
    pytest.param(
        replace(BACKOFF, retry_at=None, answer_by=AWAIT, pending="retry", pending_cause="register_retry"),
        EffectFailed(CheckSocket(), FAILURE),
        replace(
            BACKOFF, retry_at=NOW + 0.4, retry_fresh=True, backoff=0.8, last_error=f"check_socket failed: {FAILURE}"
        ),
        [RetryAt(NOW + 0.4, 0.4, f"check_socket failed: {FAILURE}")],
        id="check-socket-failed-backs-off-doubling-and-retries-on-a-fresh-socket",
    ),
    pytest.param(
        # the call may have left before the thread that waits for it failed to start: it is cancelled,
        # and the retry serves a fresh socket so a Register that lands late dials one that is gone
        replace(STARTING, generation=1, endpoint="colad-1.sock", call=1, calls=1, answer_by=AWAIT, pending="start"),
        EffectFailed(SendRegister(1, "colad-1.sock"), FAILURE),
        replace(
            STARTING,
            phase=Phase.BACKOFF,
            generation=1,
            endpoint="colad-1.sock",
            calls=1,
            retry_at=NOW + BACKOFF_MIN,
            retry_fresh=True,
            backoff=2 * BACKOFF_MIN,
            last_error=f"send_register failed: {FAILURE}",
        ),
        [
            CancelCall(1),
            RetryAt(NOW + BACKOFF_MIN, BACKOFF_MIN, f"send_register failed: {FAILURE}"),
            Transition(Phase.STARTING, Phase.BACKOFF, f"send_register failed: {FAILURE}"),
        ],
        id="send-register-failed-cancels-the-call-and-backs-off",
    ),
    pytest.param(
        replace(STARTING, generation=1, answer_by=AWAIT, pending="start", pending_cause="start", have_devices=True),
        EffectFailed(GaveUpWaiting(INITIAL_DEVICES_WAIT), "OSError: [Errno 5] Input/output error"),
        replace(
            STARTING,
            phase=Phase.BACKOFF,
            generation=1,
            have_devices=True,
            retry_at=NOW + BACKOFF_MIN,
            retry_fresh=True,
            backoff=2 * BACKOFF_MIN,
            last_error="gave_up_waiting failed: OSError: [Errno 5] Input/output error",
        ),
        [
            RetryAt(NOW + BACKOFF_MIN, BACKOFF_MIN, "gave_up_waiting failed: OSError: [Errno 5] Input/output error"),
            Transition(Phase.STARTING, Phase.BACKOFF, "gave_up_waiting failed: OSError: [Errno 5] Input/output error"),
        ],
        id="a-report-failed-before-the-effects-a-registration-waits-on-backs-off-too",
    ),
    pytest.param(
        REGISTERED,
        EffectFailed(Accepted("colad-1.sock"), "MemoryError"),
        REGISTERED,
        [],
        id="a-report-failed-with-nothing-awaited-changes-nothing",
    ),
    pytest.param(
        replace(REGISTERED, withdrawing=True),
        EffectFailed(SendEmptyList(), FAILURE),
        replace(REGISTERED, withdrawing=True),
        [],
        id="the-empty-list-failed-is-left-to-the-shutdown-that-follows",
    ),
    pytest.param(
        replace(REGISTERED, phase=Phase.STOPPED),
        EffectFailed(StopServer(1), FAILURE),
        replace(REGISTERED, phase=Phase.STOPPED),
        [],
        id="stopped-leaves-a-failed-effect-to-the-shell",
    ),
    pytest.param(
        REGISTERED,
        ServerDied(FAILURE),
        replace(
            REGISTERED,
            phase=Phase.BACKOFF,
            retry_at=NOW + BACKOFF_MIN,
            retry_fresh=True,
            backoff=2 * BACKOFF_MIN,
            last_error=f"server stopped serving: {FAILURE}",
        ),
        [
            RetryAt(NOW + BACKOFF_MIN, BACKOFF_MIN, f"server stopped serving: {FAILURE}"),
            Transition(Phase.REGISTERED, Phase.BACKOFF, f"server stopped serving: {FAILURE}"),
        ],
        id="a-server-whose-thread-died-backs-off-to-serve-anew",
    ),
    pytest.param(
        STARTING,
        ServerDied(FAILURE),
        STARTING,
        [],
        id="a-server-thread-died-before-any-server-changes-nothing",
    ),
    # --- an answer that never comes --------------------------------------------------------------------
    pytest.param(
        replace(BACKOFF, retry_at=None, generation=2, endpoint="", answer_by=NOW, pending="retry"),
        Timer(),
        replace(
            BACKOFF,
            generation=2,
            endpoint="",
            retry_at=NOW + 0.4,
            retry_fresh=True,
            backoff=0.8,
            last_error="no answer to the serve effect",
        ),
        [RetryAt(NOW + 0.4, 0.4, "no answer to the serve effect")],
        id="a-lost-answer-is-noticed-on-the-timer-and-retried",
    ),
    pytest.param(
        replace(REGISTERING, answer_by=NOW),
        Timer(),
        replace(
            REGISTERING,
            phase=Phase.BACKOFF,
            call=0,
            retry_at=NOW + BACKOFF_MIN,
            retry_fresh=True,
            backoff=2 * BACKOFF_MIN,
            last_error="Register call 1 not answered in time",
        ),
        [
            CancelCall(1),
            RetryAt(NOW + BACKOFF_MIN, BACKOFF_MIN, "Register call 1 not answered in time"),
            Transition(Phase.REGISTERING, Phase.BACKOFF, "Register call 1 not answered in time"),
            Restart("Register call 1 not answered in time, not even by its own deadline"),
        ],
        id="a-register-call-never-answered-is-cancelled-past-its-deadline",
    ),
    pytest.param(
        replace(STARTING, generation=1, endpoint="colad-1.sock", call=1, calls=1, answer_by=AWAIT, pending="start"),
        RegisterSent(1, KUBELET, NOW + 20.0),
        replace(
            STARTING,
            phase=Phase.REGISTERING,
            generation=1,
            endpoint="colad-1.sock",
            call=1,
            calls=1,
            kubelet_identity=KUBELET,
            answer_by=NOW + 20.0,
        ),
        [Transition(Phase.STARTING, Phase.REGISTERING, "start", (("endpoint", "colad-1.sock"),))],
        id="register-sent-awaits-its-answer-until-the-calls-deadline",
    ),
    pytest.param(
        replace(REGISTERING, answer_by=NOW + 20.0),
        RegisterDone(1, None),
        replace(REGISTERING, phase=Phase.REGISTERED, call=0, stream_check_at=NOW + STREAM_EXPECTED_WITHIN),
        [Accepted("colad-1.sock"), registered_transition(Phase.REGISTERING)],
        id="register-answered-awaits-nothing-more",
    ),
]


@pytest.mark.parametrize(("state", "event", "expected", "effects"), FAILED_CASES)
def test_step_on_a_failed_effect(
    state: Registration, event: Event, expected: Registration, effects: list[Effect]
) -> None:
    assert step(state, event, NOW) == (expected, effects)


class SimulatedShell:
    """Carries out effects as registrar.py does, against a kubelet that accepts every Register.

    The effect numbered `fail_at` (counted across the whole pass) fails instead: it is posted back
    as EffectFailed and the effects after it in its step are dropped, as the real shell does. A
    SendRegister that fails may still have left: its call is kept, to land late in `recover`.
    """

    def __init__(self, kubelet: str, fail_at: int | None = None) -> None:
        self.kubelet, self.fail_at = kubelet, fail_at
        self.count = 0
        self.failed: Effect | None = None
        self.sent: list[tuple[int, int]] = []  # (call, generation) the kubelet may still answer

    def apply(self, state: Registration, event: Event, now: float) -> Registration:
        events = [event]
        while events:
            state, effects = step(state, events.pop(0), now)
            for effect in effects:
                self.count += 1
                if self.count - 1 == self.fail_at:
                    self.failed = effect
                    if isinstance(effect, SendRegister):
                        self.sent.append((effect.call, state.generation))
                    events.append(EffectFailed(effect, FAILURE))
                    break
                if isinstance(effect, Restart):  # supervisord starts a new plugin: it registers from scratch
                    state, events = Registration(started=now), [DevicesSeen()]
                    self.sent.clear()
                    break
                if (answer := self.answer(effect, state, now)) is not None:
                    events.append(answer)
        return state

    def answer(self, effect: Effect, state: Registration, now: float) -> Event | None:
        match effect:
            case Serve(generation=generation):
                return Served(generation, f"colad-{generation}.sock")
            case CheckSocket():
                return SocketChecked(True)
            case SendRegister(call=call):
                if self.kubelet:
                    self.sent.append((call, state.generation))
                return RegisterSent(call, self.kubelet, now + 20.0)
        return None


def recovered(state: Registration) -> bool:
    return state.phase is Phase.REGISTERED and state.live_streams() > 0 and not state.pending and not state.call


def recover(state: Registration, now: float, shell: SimulatedShell) -> tuple[Registration, float]:
    """Every effect succeeds from here on, the kubelet answers each call and dials back: registered again?"""
    shell.fail_at, shell.kubelet = None, shell.kubelet or "1:5:5"
    if state.call:
        shell.sent.append((state.call, state.generation))
    for _ in range(100):
        if recovered(state):
            return state, now
        if shell.sent:
            call, generation = shell.sent.pop(0)
            state = shell.apply(state, RegisterDone(call, None), now)
            state = shell.apply(state, StreamOpened(generation), now)
            continue
        due = state.due()
        assert due is not None, f"wedged: nothing awaited, nothing due, not registered: {state}"
        now = max(now, due)
        state = shell.apply(state, Timer(), now)
    raise AssertionError(f"not registered after 100 steps: {state}")


def world_events(state: Registration, now: float, kubelet: str) -> list[tuple[Event, float, str]]:
    """What may happen next, with the time and the kubelet.sock identity after it ("": kubelet away)."""
    g, later = state.generation, max(now, state.due() or now)
    new = f"1:{len(kubelet) + now:.0f}:9"
    events: list[tuple[Event, float, str]] = [
        (DevicesSeen(), now, kubelet),
        (Timer(), later, kubelet),
        (Timer(), now + REGISTER_BACKOFF_MAX + STREAM_EXPECTED_WITHIN + 30.0, kubelet),  # every deadline passed
        (KubeletSeen(new, True, "watcher"), now, new),
        (KubeletSeen("", True, "watcher"), now, ""),
        (KubeletSeen(kubelet, False, "watcher"), now, kubelet),
        (StreamOpened(g), now, kubelet),
        (StreamClosed(g), now, kubelet),
        (OptionsChanged(), now, kubelet),
        (ServerDied(FAILURE), now, kubelet),
        (Withdraw(), now, kubelet),
    ]
    if state.call:
        for error, late in ((None, False), ("UNAVAILABLE: x", False), ("DEADLINE_EXCEEDED: x", True)):
            events.append((RegisterDone(state.call, error, late), now, kubelet))
    return events


def shape(state: Registration, kubelet: str) -> tuple[object, ...]:
    """A state with its times, numbers and texts left out: the exploration visits each shape once."""
    return (
        state.phase,
        bool(state.pending),
        bool(state.call),
        bool(state.endpoint),
        state.live_streams() > 0,
        state.all_streams() > state.live_streams(),
        state.have_devices,
        state.withdrawing,
        state.retry_at is None,
        state.retry_fresh,
        state.stream_check_at is None,
        state.answer_by is None,
        state.kubelet_identity == kubelet,
        bool(kubelet),
        state.backoff == BACKOFF_MIN,
    )


def explore() -> list[tuple[Registration, float, str]]:
    """Breadth-first from the start over world events, each also with every one of its effects failing.

    Until no new shape turns up (a dozen levels): every shape reachable from the start, one state each.
    """
    start = (Registration(started=0.0), 0.0, "1:2:3")
    seen, frontier, found = {shape(start[0], start[2])}, [start], [start]
    while frontier:
        following = []
        for state, now, kubelet in frontier:
            for event, at, after in world_events(state, now, kubelet):
                runs = SimulatedShell(after)
                nxt = [(runs.apply(state, event, at), at, after)]
                for index in range(runs.count):
                    shell = SimulatedShell(after, fail_at=index)
                    nxt.append((shell.apply(state, event, at), at, after))
                for node in nxt:
                    if node[0].phase is not Phase.STOPPED and (key := shape(node[0], node[2])) not in seen:
                        seen.add(key)
                        following.append(node)
        found += following
        frontier = following
    return found


@functools.cache
def reachable() -> list[tuple[Registration, float, str]]:
    return explore()  # seconds: explored when a test asks, not at collection


def test_the_exploration_reaches_every_phase_but_stopped() -> None:
    assert {state.phase for state, _, _ in reachable()} == set(Phase) - {Phase.STOPPED}
    assert len(reachable()) > 500


def test_every_effect_that_fails_from_every_reachable_state_is_posted_back_and_registration_returns() -> None:
    failed: set[type] = set()
    for state, now, kubelet in reachable():
        for event, at, after in world_events(state, now, kubelet):
            for index in range(64):
                shell = SimulatedShell(after, fail_at=index)
                after_failure = shell.apply(state, event, at)
                if shell.failed is None:
                    break  # fewer effects than that in this pass
                failed.add(type(shell.failed))
                final, _ = recover(after_failure, at, shell)
                assert recovered(final), (state, event, shell.failed)
    assert failed == set(EFFECTS), f"effect types never failed by the exploration: {set(EFFECTS) - failed}"


def test_every_reachable_state_registers_once_effects_succeed() -> None:
    for state, now, kubelet in reachable():
        final, _ = recover(state, now, SimulatedShell(kubelet))
        assert recovered(final), state


def test_shutdown_from_every_reachable_state_stops_whatever_effect_fails() -> None:
    for state, now, kubelet in reachable():
        for index in range(4):
            shell = SimulatedShell(kubelet, fail_at=index)
            stopped = shell.apply(state, Shutdown(), now)
            assert stopped.phase is Phase.STOPPED
            assert step(stopped, Timer(), now + 100.0) == (stopped, [])
