"""Role `colad plugin`: serves the DevicePlugin API to the kubelet and keeps it registered.

Reads: DeviceSnapshots and KubeletStates from the local queue (it owns the
queue socket), and, to verify what the watcher reports, stat() of its own
socket and of kubelet.sock. Writes: its gRPC socket in the kubelet directory,
Register calls to kubelet.sock, and a small state file for `colad status`.
One thread owns the life cycle (an explicit State enum, every transition
logged with its reason); gRPC and queue threads only post events to it.
"""

from __future__ import annotations

import enum
import json
import os
import queue
import signal
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from colad import config as config_mod
from colad import constants, log, messages, proc
from colad.config import Config
from colad.devices import DeviceSet
from colad.errors import InstanceError
from colad.kubelet_watch import plugin_sockets as _colad_sockets
from colad.kubelet_watch import socket_identity
from colad.metrics import Metrics, MetricsServer
from colad.queue import Peer, QueueServer, claim_socket_path
from colad.service import DeviceBroadcast, DevicePluginServicer, RegisterCall, StreamEvents, build_server

LOG = log.get(__name__)

BACKOFF_MIN = 0.1
BACKOFF_MAX = 5.0
INITIAL_DEVICES_WAIT = 3.0  # registering with an empty list would zero allocatable for a moment
SAFETY_CHECK_INTERVAL = 5.0  # stat our socket and kubelet.sock even if the watcher is silent
STREAM_GRACE = 1.0  # registered but no live ListAndWatch for this long: register again
STREAM_EXPECTED_WITHIN = 10.0
CRASH_BUDGET = (5, 60.0)  # unexpected errors per window before we exit and let supervisord restart us
DRAIN_TIMEOUT = 1.0  # at shutdown, how long the empty device list may take to reach the kubelet


class State(enum.Enum):
    STARTING = "starting"
    REGISTERING = "registering"
    REGISTERED = "registered"
    BACKOFF = "backoff"
    STOPPED = "stopped"


@dataclass
class _Event:
    kind: str
    payload: Any = None
    generation: int = -1


class Plugin:
    def __init__(
        self,
        cfg: Config,
        *,
        broadcast: DeviceBroadcast | None = None,
        clock: Callable[[], float] = time.monotonic,
        wall: Callable[[], float] = time.time,
    ) -> None:
        self.cfg = cfg
        self.clock = clock
        self.wall = wall
        self.broadcast = broadcast or DeviceBroadcast()
        self.metrics = Metrics(per_device=cfg.metrics_per_device)
        self.metrics_server = (
            MetricsServer(self.metrics, cfg.metrics_address, self.health) if cfg.metrics_address else None
        )
        self.events: queue.Queue[_Event] = queue.Queue()
        self.queue: QueueServer | None = None
        self.state = State.STARTING
        self.generation = 0
        self.server: Any = None
        self.socket_path: str | None = None
        self.call: RegisterCall | None = None
        self.kubelet_identity = ""  # kubelet.sock we registered with
        self.seen_identity: str | None = None  # the last kubelet.sock we saw, to count restarts
        self.backoff = BACKOFF_MIN
        self.retry_at: float | None = None
        self.retry_fresh = False
        self.stream_check_at: float | None = None
        self.next_safety_check = 0.0
        self.streams: dict[int, int] = {}
        self.have_devices = False
        self.last_error = ""
        self.since = wall()
        self.errors: list[float] = []
        self.started = clock()
        self.draining = False
        self.drained = threading.Event()

    # Called from other threads: only post events (and bump counters).
    def _on_message(self, message: messages.Message, peer: Peer) -> None:
        self.metrics.queue_events["received"] += 1
        if isinstance(message, messages.Stats):
            self.metrics.peers.update(message.role, peer.pid, message.counters)
            return
        role = "discovery" if isinstance(message, messages.DeviceSnapshot) else "kubelet-watch"
        self.metrics.peers.update(role, peer.pid)
        changed = False
        if isinstance(message, messages.DeviceSnapshot):
            # Straight to the streams from this thread: the lifecycle thread's bookkeeping
            # (metrics, log, state file) is not on the path of a change to the kubelet.
            changed = self.broadcast.update(message.devices)
        self.events.put(_Event("message", (message, changed)))

    def _on_reject(self, reason: str) -> None:
        self.metrics.queue_events["dropped" if reason == "stale" else "rejected"] += 1

    def health(self) -> tuple[bool, str]:
        """For /healthz: registered with a live ListAndWatch stream, or why not (one line)."""
        state, streams = self.state, self.live_streams()
        if state is State.REGISTERED and streams > 0:
            return True, f"ok: registered as {self.cfg.resource_name}, {len(self.broadcast.devices)} devices"
        if state is State.REGISTERED:
            return False, "registered, but the kubelet holds no live ListAndWatch stream"
        return False, f"not registered: {state.value}" + (f" ({self.last_error})" if self.last_error else "")

    def _stream_events(self) -> StreamEvents:
        return StreamEvents(
            opened=lambda g: self.events.put(_Event("stream", +1, g)),
            closed=lambda g: self.events.put(_Event("stream", -1, g)),
            sent=self._on_sent,
        )

    def _on_sent(self, generation: int, devices: int) -> None:
        LOG.debug("ListAndWatch sent", generation=generation, devices=devices)
        if devices == 0 and self.draining:
            self.drained.set()

    def stop(self) -> None:
        self.events.put(_Event("stop"))

    # The life cycle, on the owning thread.
    def transition(self, state: State, reason: str, **fields: object) -> None:
        if state != self.state:
            LOG.info("plugin state", state=state.value, previous=self.state.value, reason=reason, **fields)
            self.state = state
            self.since = self.wall()
        self.write_state()

    def live_streams(self) -> int:
        return self.streams.get(self.generation, 0)

    def write_state(self) -> None:
        devices = self.broadcast.devices
        body = {
            "pid": os.getpid(),
            "state": self.state.value,
            "registered": self.state is State.REGISTERED,
            "resource_name": self.cfg.resource_name,
            "endpoint": os.path.basename(self.socket_path) if self.socket_path else "",
            "devices": len(devices),
            "healthy": devices.count(constants.HEALTHY),
            "streams": self.live_streams(),
            "since": self.since,
            "last_error": self.last_error,
            "metrics_address": self.metrics_server.bound if self.metrics_server else "",
        }
        tmp = self.cfg.plugin_state_file + ".tmp"
        try:
            os.makedirs(os.path.dirname(tmp), mode=0o700, exist_ok=True)
            with open(tmp, "w", encoding="utf-8") as handle:
                json.dump(body, handle)
            os.replace(tmp, self.cfg.plugin_state_file)
        except OSError as exc:
            LOG.warning("state file not written", path=self.cfg.plugin_state_file, error=exc)

    def _stop_server(self) -> None:
        self.broadcast.close_generation(self.generation)
        if self.server is not None:
            self.server.stop(grace=0).wait(5)
            self.server = None
        if self.socket_path and os.path.lexists(self.socket_path):
            try:
                os.unlink(self.socket_path)
            except OSError as exc:
                LOG.warning("old socket not removed", path=self.socket_path, error=exc)
        self.socket_path = None

    def _serve(self, cause: str) -> None:
        """Serve on a fresh, unique socket: the kubelet keys endpoints by socket path."""
        self.metrics.server_restarts.labels(cause).inc()
        self._stop_server()
        self.generation += 1
        os.makedirs(self.cfg.kubelet_dir, mode=0o750, exist_ok=True)
        stamp = int(self.wall() * 1000)
        while True:
            name = f"{constants.PLUGIN_SOCKET_PREFIX}{stamp}{constants.PLUGIN_SOCKET_SUFFIX}"
            path = os.path.join(self.cfg.kubelet_dir, name)
            if not os.path.lexists(path):
                break
            stamp += 1
        servicer = DevicePluginServicer(self.broadcast, self.generation, self._stream_events(), self.metrics)
        server = build_server(servicer, path)
        server.start()
        self.server, self.socket_path = server, path
        LOG.info("serving", endpoint=name, generation=self.generation)

    def register(self, reason: str, cause: str, *, fresh_server: bool = False) -> None:
        """Serve (if needed) and send Register: the single path every trigger takes.

        `cause` is the bounded reason label for colad_plugin_server_restarts_total.
        """
        if self.call is not None:
            self.call.cancel()
            self.call.close()
            self.call = None
        self.retry_at = None
        try:
            if fresh_server or self.socket_path is None or not os.path.exists(self.socket_path):
                self._serve(cause)
        except (OSError, RuntimeError) as exc:  # grpc raises RuntimeError when it cannot bind
            self._failed(f"cannot serve: {exc}")
            return
        assert self.socket_path is not None
        self.kubelet_identity = socket_identity(self.cfg.kubelet_socket)
        if not self.kubelet_identity:
            self._failed("kubelet.sock absent")
            return
        endpoint = os.path.basename(self.socket_path)
        self.transition(State.REGISTERING, reason, endpoint=endpoint)
        generation = self.generation
        call = RegisterCall(self.cfg.kubelet_socket, endpoint, self.cfg.resource_name, self.cfg.register_timeout)
        self.call = call
        call.add_done_callback(lambda: self.events.put(_Event("registered", call, generation)))

    def _failed(self, error: str, *, fresh_server: bool = False) -> None:
        self.retry_fresh = fresh_server
        self.metrics.registrations.labels("failure").inc()
        self.metrics.registered.set(0)
        self.last_error = error
        self.retry_at = self.clock() + self.backoff
        LOG.warning("register failed", error=error, retry_in=f"{self.backoff:.2f}s")
        self.backoff = min(self.backoff * 2, BACKOFF_MAX)
        self.transition(State.BACKOFF, error)

    def on_registered(self, event: _Event) -> None:
        call: RegisterCall = event.payload
        if call is not self.call:
            call.close()
            return
        error = call.error()
        late = bool(error) and call.may_still_complete()
        call.close()
        self.call = None
        if error:
            # A Register we stopped waiting for may still be carried out: retry on a new socket,
            # so that a late one dials a socket that is gone instead of opening a second stream.
            self._failed(error, fresh_server=late)
            return
        self.backoff = BACKOFF_MIN
        self.last_error = ""
        self.metrics.registrations.labels("success").inc()
        self.metrics.registered.set(1)
        self.metrics.last_registration.set(self.wall())
        self.stream_check_at = self.clock() + STREAM_EXPECTED_WITHIN
        LOG.info(
            "register to kubelet successfully",
            resource=self.cfg.resource_name,
            endpoint=os.path.basename(self.socket_path or ""),
        )
        self.transition(State.REGISTERED, "kubelet accepted")

    def check_queue(self) -> None:
        if self.queue is None or not self.queue.intact():
            if self.queue is not None:
                LOG.warning("queue socket removed or replaced; listening again", path=self.cfg.queue_socket)
            try:
                self.start_queue("queue socket lost")
            except InstanceError as exc:
                LOG.error("queue socket taken by another process", error=str(exc))
        if self.metrics_server is not None and self.metrics_server.server is None:
            self.metrics_server.start()

    def check_kubelet(self, reason: str) -> None:
        """Verify by stat() what the watcher (or the safety timer) suggests."""
        self.next_safety_check = self.clock() + SAFETY_CHECK_INTERVAL
        if self.state is State.STARTING:
            return
        identity = socket_identity(self.cfg.kubelet_socket)
        if identity and identity != self.seen_identity:
            if self.seen_identity is not None:
                self.metrics.kubelet_restarts.inc()
            self.seen_identity = identity
        if identity and identity != self.kubelet_identity:
            self.backoff = BACKOFF_MIN
            self.register(f"kubelet.sock recreated ({reason})", "kubelet_restart", fresh_server=True)
        elif self.socket_path is None or not os.path.exists(self.socket_path):
            self.register(f"plugin socket removed ({reason})", "socket_removed", fresh_server=True)

    def on_message(self, message: messages.Message, changed: bool) -> None:
        if isinstance(message, messages.DeviceSnapshot):
            first = not self.have_devices
            self.have_devices = True
            if changed:
                self.metrics.device_set_changes.inc()
            if changed or first:
                self.metrics.devices.labels(constants.HEALTHY).set(message.devices.count(constants.HEALTHY))
                self.metrics.devices.labels(constants.UNHEALTHY).set(message.devices.count(constants.UNHEALTHY))
                self.metrics.forget_devices(set(message.devices.ids))
                LOG.info(
                    "devices updated", devices=len(message.devices), seq=message.seq, dir_present=message.dir_present
                )
                self.write_state()
            if first and self.state is State.STARTING:
                self.register("start", "start")
        else:
            self.check_kubelet("watcher")

    def on_stream(self, event: _Event) -> None:
        self.streams[event.generation] = self.streams.get(event.generation, 0) + event.payload
        if self.streams[event.generation] <= 0:
            del self.streams[event.generation]
        self.metrics.streams.set(sum(self.streams.values()))
        if event.generation != self.generation:
            return
        if event.payload > 0:
            self.stream_check_at = None
        elif self.state is State.REGISTERED and self.live_streams() == 0:
            self.stream_check_at = self.clock() + STREAM_GRACE
        self.write_state()

    def on_timer(self) -> None:
        now = self.clock()
        if self.state is State.STARTING and now >= self.started + INITIAL_DEVICES_WAIT:
            LOG.warning("no device snapshot yet; registering anyway", waited=f"{INITIAL_DEVICES_WAIT}s")
            self.register("start", "start")
        if self.retry_at is not None and now >= self.retry_at:
            self.register("retry", "register_retry", fresh_server=self.retry_fresh)
        if self.stream_check_at is not None and now >= self.stream_check_at:
            self.stream_check_at = None
            if self.state is State.REGISTERED and self.live_streams() == 0:
                self.register("no live ListAndWatch stream", "stream_lost", fresh_server=True)
        if now >= self.next_safety_check:
            self.check_queue()
            self.check_kubelet("periodic")

    def next_timeout(self) -> float:
        now = self.clock()
        due = [self.next_safety_check]
        if self.state is State.STARTING:
            due.append(self.started + INITIAL_DEVICES_WAIT)
        for moment in (self.retry_at, self.stream_check_at):
            if moment is not None:
                due.append(moment)
        return max(0.0, min(due) - now)

    def start_queue(self, reason: str) -> None:
        """(Re)listen on the queue socket; on failure log one clear line and retry on the safety timer."""
        if self.queue is not None:
            self.queue.stop()
            self.queue = None
        server = QueueServer(self.cfg.queue_socket, self._on_message, on_reject=self._on_reject)
        try:
            os.makedirs(self.cfg.run_dir, mode=0o700, exist_ok=True)
            server.start()
        except InstanceError:
            server.stop()
            raise
        except OSError as exc:
            server.stop()
            LOG.error("run directory not usable; retrying", run_dir=self.cfg.run_dir, reason=reason, error=exc)
            return
        self.queue = server

    def claim_instance(self) -> None:
        """Remove colad sockets a dead plugin left in the kubelet directory; refuse to run beside a live one.

        A previous plugin of ours may still be shutting down (supervisord restarts us
        quickly), so a live socket gets a few seconds to go away before we give up.
        """
        deadline = self.clock() + 5.0
        while True:
            try:
                for name in _colad_sockets(self.cfg.kubelet_dir):
                    claim_socket_path(os.path.join(self.cfg.kubelet_dir, name))
                self.start_queue("start")
                return
            except InstanceError:
                if self.clock() >= deadline:
                    raise
                time.sleep(0.1)

    def run(self) -> int:
        self.claim_instance()
        if self.metrics_server is not None:
            self.metrics_server.start()
        self.started = self.clock()
        self.next_safety_check = self.started + SAFETY_CHECK_INTERVAL
        self.write_state()
        try:
            while True:
                try:
                    event = self.events.get(timeout=self.next_timeout())
                except queue.Empty:
                    event = _Event("timer")
                if event.kind == "stop":
                    break
                try:
                    self.handle(event)
                except Exception:  # the loop boundary: log once, count, continue
                    LOG.exception("plugin loop error", event=event.kind)
                    if self._over_budget():
                        LOG.error("too many errors; exiting so supervisord restarts the plugin")
                        return 1
        finally:
            self.shutdown()
        return 0

    def handle(self, event: _Event) -> None:
        if event.kind == "message":
            self.on_message(*event.payload)
        elif event.kind == "registered":
            self.on_registered(event)
        elif event.kind == "stream":
            self.on_stream(event)
        self.on_timer()

    def _over_budget(self) -> bool:
        now = self.clock()
        count, window = CRASH_BUDGET
        self.errors = [t for t in self.errors if now - t < window] + [now]
        return len(self.errors) > count

    def withdraw_devices(self) -> None:
        """Tell the kubelet the devices are gone (an empty list) before the stream ends.

        Otherwise a stopped plugin leaves its devices advertised (as unhealthy) for the
        kubelet's 5-minute grace period. Bounded: shutdown never waits more than a second.
        """
        if self.state is not State.REGISTERED or self.live_streams() == 0:
            return
        self.draining = True
        self.broadcast.update(DeviceSet())
        if self.drained.wait(DRAIN_TIMEOUT):
            LOG.info("told the kubelet the devices are gone", resource=self.cfg.resource_name)
        else:
            LOG.warning("empty device list not confirmed sent", waited=f"{DRAIN_TIMEOUT}s")

    def shutdown(self) -> None:
        if self.call is not None:
            self.call.cancel()
            self.call.close()
        self.withdraw_devices()
        self._stop_server()
        if self.queue is not None:
            self.queue.stop()
        self.metrics.registered.set(0)
        self.transition(State.STOPPED, "shutdown")
        if self.metrics_server is not None:
            self.metrics_server.stop()
        LOG.info("plugin stopped")


def main(args: object = None, cfg: Config | None = None) -> int:
    cfg = cfg or config_mod.load()
    log.setup("plugin", cfg.log_level)
    proc.setup_role()
    # Signals are taken by a thread of their own (sigwait) rather than a handler:
    # a handler runs on the lifecycle thread and could re-enter its event queue's
    # lock. Blocked here, before gRPC starts its threads, so they inherit the mask.
    stop_signals = {signal.SIGTERM, signal.SIGINT}
    signal.pthread_sigmask(signal.SIG_BLOCK, stop_signals)
    plugin = Plugin(cfg)

    def wait_for_signal() -> None:
        signum = signal.sigwait(stop_signals)
        LOG.info("signal received", signal=signal.Signals(signum).name)
        plugin.stop()

    threading.Thread(target=wait_for_signal, name="signals", daemon=True).start()
    LOG.info("plugin starting", resource=cfg.resource_name, kubelet_dir=cfg.kubelet_dir, queue=cfg.queue_socket)
    try:
        return plugin.run()
    except InstanceError as exc:
        LOG.error("refusing to start", reason=str(exc))
        return 1
