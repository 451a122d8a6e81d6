"""Role `colad plugin`: serves the DevicePlugin API to the kubelet and keeps each resource registered.

Reads: DeviceSnapshots and KubeletStates from the local queue (it owns the
queue socket), and, to verify what the watcher reports, stat() of its own
sockets and of kubelet.sock. Writes: one gRPC socket per resource in the
kubelet directory, Register calls to kubelet.sock, and a small state file for
`colad status`. One thread owns the life cycle: a `Registration` per resource
(an explicit State enum, every transition logged with its reason); gRPC and
queue threads only post events to it. SIGHUP reloads the config: resources
added, removed or changed, the others left registered as they are.
"""

from __future__ import annotations

import enum
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
from colad.config import Config, Resource
from colad.devices import DeviceSet
from colad.errors import ConfigError, InstanceError
from colad.kubelet_watch import is_plugin_socket_name, socket_identity
from colad.metrics import Metrics, MetricsServer
from colad.podresources import InUseWatcher
from colad.queue import ForeignPathError, Peer, QueueServer, SocketRecord, claim_socket_path
from colad.service import (
    DeviceBroadcast,
    DevicePluginServicer,
    FittedList,
    RegisterCall,
    StreamEvents,
    build_server,
    fit_list,
)
from colad.status import RoleHealth

LOG = log.get(__name__)

BACKOFF_MIN = 0.1
BACKOFF_MAX = 5.0
INITIAL_DEVICES_WAIT = 3.0  # registering with an empty list would zero allocatable for a moment
SAFETY_CHECK_INTERVAL = 5.0  # stat our sockets and kubelet.sock even if the watcher is silent
STREAM_GRACE = 1.0  # registered but no live ListAndWatch for this long: register again
STREAM_EXPECTED_WITHIN = 10.0
CRASH_BUDGET = (5, 60.0)  # unexpected errors per window before we exit and let supervisord restart us
DRAIN_TIMEOUT = 1.0  # at shutdown, how long the empty device list may take to reach the kubelet
MAX_PENDING_SNAPSHOTS = 64  # snapshots kept for resources this plugin does not serve (yet): a reload may add them
SOCKET_RECORD_NAME = "state/sockets.json"  # the plugin sockets colad created: the only ones it ever removes
# Discovery reports at least once per rescan_interval (its periodic rescan bumps a counter it sends);
# silent for this many intervals (plus slack), the list the kubelet holds may be stale.
SILENT_INTERVALS = 3
SILENT_SLACK = 10.0


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
    resource: str = ""


class Registration:
    """One resource's registration: its server and socket, Register calls, back-off and streams.

    Runs on the plugin's lifecycle thread only; `broadcast` is what its
    ListAndWatch streams follow (the queue thread updates it directly).
    """

    def __init__(self, plugin: Plugin, resource: Resource) -> None:
        self.plugin = plugin
        self.resource = resource
        self.name = resource.name
        self.broadcast = DeviceBroadcast()
        self.state = State.STARTING
        self.generation = 0
        self.server: Any = None
        self.socket_path: str | None = None
        self.call: RegisterCall | None = None
        self.kubelet_identity = ""  # kubelet.sock we registered with
        self.backoff = BACKOFF_MIN
        self.retry_at: float | None = None
        self.retry_fresh = False
        self.stream_check_at: float | None = None
        self.streams: dict[int, int] = {}
        self.have_devices = False
        self.fit: FittedList | None = None  # the last list measured against the kubelet's limit
        self.last_error = ""
        self.since = plugin.wall()
        self.started = plugin.clock()
        self.draining = False
        self.drained = threading.Event()
        plugin.metrics.add_resource(self.name)

    @property
    def cfg(self) -> Config:
        return self.plugin.cfg

    def live_streams(self) -> int:
        return self.streams.get(self.generation, 0)

    def transition(self, state: State, reason: str, **fields: object) -> None:
        if state != self.state:
            LOG.info(
                "plugin state",
                resource=self.name,
                state=state.value,
                previous=self.state.value,
                reason=reason,
                **fields,
            )
            self.state = state
            self.since = self.plugin.wall()
        self.plugin.write_state()

    def summary(self) -> dict[str, object]:
        advertised = self.broadcast.devices
        return {
            "name": self.name,
            "device_dir": self.resource.device_dir,
            "replicas": self.resource.replicas,
            "state": self.state.value,
            "registered": self.state is State.REGISTERED,
            "endpoint": os.path.basename(self.socket_path) if self.socket_path else "",
            "devices": len(advertised),
            "healthy": advertised.count(constants.HEALTHY),
            "streams": self.live_streams(),
            "since": self.since,
            "last_error": self.last_error,
        }

    def _stream_events(self) -> StreamEvents:
        post = self.plugin.events.put
        return StreamEvents(
            opened=lambda g: post(_Event("stream", +1, g, self.name)),
            closed=lambda g: post(_Event("stream", -1, g, self.name)),
            sent=self._on_sent,
        )

    def _on_sent(self, generation: int, count: int) -> None:
        LOG.debug("ListAndWatch sent", resource=self.name, generation=generation, devices=count)
        if count == 0 and self.draining:
            self.drained.set()

    def stop_server(self) -> None:
        self.broadcast.close_generation(self.generation)
        if self.server is not None:
            self.server.stop(grace=0).wait(5)
            self.server = None
        if self.socket_path:
            self.plugin.sockets.remove(self.socket_path)  # only if it is still the socket we made
        self.socket_path = None

    def socket_intact(self) -> bool:
        return self.socket_path is not None and self.plugin.sockets.intact(self.socket_path)

    def _serve(self, cause: str) -> None:
        """Serve on a fresh, unique socket: the kubelet keys endpoints by socket path."""
        metrics = self.plugin.metrics
        metrics.server_restarts.labels(self.name, cause).inc()
        self.stop_server()
        self.generation += 1
        os.makedirs(self.cfg.kubelet_dir, mode=0o750, exist_ok=True)
        stamp = int(self.plugin.wall() * 1000)
        while True:
            name = f"{constants.PLUGIN_SOCKET_PREFIX}{stamp}{constants.PLUGIN_SOCKET_SUFFIX}"
            path = os.path.join(self.cfg.kubelet_dir, name)
            if not os.path.lexists(path) and path not in self.plugin.socket_paths():
                break
            stamp += 1
        servicer = DevicePluginServicer(
            self.broadcast,
            self.generation,
            self._stream_events(),
            metrics,
            self.name,
            lambda: self.resource.replica_policy,
        )
        server = build_server(servicer, path)
        server.start()
        self.server, self.socket_path = server, path
        self.plugin.sockets.add(path)
        LOG.info("serving", resource=self.name, endpoint=name, generation=self.generation)

    def register(self, reason: str, cause: str, *, fresh_server: bool = False) -> None:
        """Serve (if needed) and send Register: the single path every trigger takes.

        `cause` is the bounded reason label for colad_plugin_server_restarts_total.
        """
        self.cancel_call()
        self.retry_at = None
        try:
            if fresh_server or not self.socket_intact():
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
        call = RegisterCall(self.cfg.kubelet_socket, endpoint, self.name, self.cfg.register_timeout)
        self.call = call
        call.add_done_callback(lambda: self.plugin.events.put(_Event("registered", call, generation, self.name)))

    def cancel_call(self) -> None:
        if self.call is not None:
            self.call.cancel()
            self.call.close()
            self.call = None

    def _failed(self, error: str, *, fresh_server: bool = False) -> None:
        metrics = self.plugin.metrics
        self.retry_fresh = fresh_server
        metrics.registrations.labels(self.name, "failure").inc()
        metrics.registered.labels(self.name).set(0)
        self.last_error = error
        self.retry_at = self.plugin.clock() + self.backoff
        LOG.warning("register failed", resource=self.name, error=error, retry_in=f"{self.backoff:.2f}s")
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
        metrics = self.plugin.metrics
        self.backoff = BACKOFF_MIN
        self.last_error = ""
        metrics.registrations.labels(self.name, "success").inc()
        metrics.registered.labels(self.name).set(1)
        metrics.last_registration.labels(self.name).set(self.plugin.wall())
        self.stream_check_at = self.plugin.clock() + STREAM_EXPECTED_WITHIN
        LOG.info(
            "register to kubelet successfully",
            resource=self.name,
            endpoint=os.path.basename(self.socket_path or ""),
        )
        self.transition(State.REGISTERED, "kubelet accepted")

    def check_kubelet(self, identity: str, reason: str) -> None:
        """Register again if kubelet.sock is new or our socket is gone (verified by stat())."""
        if self.state is State.STARTING:
            return
        if identity and identity != self.kubelet_identity:
            self.backoff = BACKOFF_MIN
            self.register(f"kubelet.sock recreated ({reason})", "kubelet_restart", fresh_server=True)
        elif not self.socket_intact():
            self.register(f"plugin socket removed ({reason})", "socket_removed", fresh_server=True)

    def on_devices(self, physical: DeviceSet, changed: bool, seq: int, dir_present: bool) -> None:
        """Bookkeeping after the queue thread updated the broadcast (metrics, log, state file)."""
        first = not self.have_devices
        self.have_devices = True
        metrics = self.plugin.metrics
        if changed:
            metrics.device_set_changes.labels(self.name).inc()
        if changed or first:
            advertised = self.broadcast.devices
            for health in (constants.HEALTHY, constants.UNHEALTHY):
                metrics.devices.labels(self.name, health).set(advertised.count(health))
            metrics.forget_devices(self.name, set(advertised.ids))
            self._report_fit()
            LOG.info(
                "devices updated",
                resource=self.name,
                devices=len(physical),
                advertised=len(advertised),
                unhealthy=physical.count(constants.UNHEALTHY),
                seq=seq,
                dir_present=dir_present,
            )
            self.plugin.write_state()
        if first and self.state is State.STARTING:
            self.register("start", "start")

    def _report_fit(self) -> None:
        fit = self.fit
        if fit is None:
            return
        metrics = self.plugin.metrics
        metrics.list_bytes.labels(self.name).set(fit.size)
        metrics.list_dropped.labels(self.name).set(fit.dropped)
        if fit.dropped:
            metrics.list_cut.labels(self.name).inc()
            LOG.warning(
                "device list cut to fit the kubelet's message limit",
                resource=self.name,
                sent=len(fit.devices),
                wanted=fit.wanted,
                bytes=fit.size,
                limit=constants.KUBELET_MAX_RECV_MESSAGE_BYTES,
                replicas=self.resource.replicas,
            )

    def on_stream(self, event: _Event) -> None:
        self.streams[event.generation] = self.streams.get(event.generation, 0) + event.payload
        if self.streams[event.generation] <= 0:
            del self.streams[event.generation]
        self.plugin.metrics.streams.labels(self.name).set(sum(self.streams.values()))
        if event.generation != self.generation:
            return
        if event.payload > 0:
            self.stream_check_at = None
        elif self.state is State.REGISTERED and self.live_streams() == 0:
            self.stream_check_at = self.plugin.clock() + STREAM_GRACE
        self.plugin.write_state()

    def on_timer(self, now: float) -> None:
        if self.state is State.STARTING and now >= self.started + INITIAL_DEVICES_WAIT:
            LOG.warning(
                "no device snapshot yet; registering anyway", resource=self.name, waited=f"{INITIAL_DEVICES_WAIT}s"
            )
            self.register("start", "start")
        if self.retry_at is not None and now >= self.retry_at:
            self.register("retry", "register_retry", fresh_server=self.retry_fresh)
        if self.stream_check_at is not None and now >= self.stream_check_at:
            self.stream_check_at = None
            if self.state is State.REGISTERED and self.live_streams() == 0:
                self.register("no live ListAndWatch stream", "stream_lost", fresh_server=True)

    def due(self) -> list[float]:
        due = [m for m in (self.retry_at, self.stream_check_at) if m is not None]
        if self.state is State.STARTING:
            due.append(self.started + INITIAL_DEVICES_WAIT)
        return due

    def begin_withdraw(self) -> bool:
        """Send the kubelet an empty list (shutdown or removal); True when a stream will carry it."""
        if self.state is not State.REGISTERED or self.live_streams() == 0:
            return False
        self.draining = True
        self.broadcast.update(DeviceSet())
        return True

    def close(self) -> None:
        self.cancel_call()
        self.stop_server()
        self.plugin.metrics.registered.labels(self.name).set(0)
        self.transition(State.STOPPED, "shutdown")


class Plugin:
    def __init__(
        self,
        cfg: Config,
        *,
        clock: Callable[[], float] = time.monotonic,
        wall: Callable[[], float] = time.time,
    ) -> None:
        self.cfg = cfg
        self.clock = clock
        self.wall = wall
        self.metrics = Metrics(per_device=cfg.metrics_per_device)
        self.metrics_server = (
            MetricsServer(self.metrics, cfg.metrics_address, self.health) if cfg.metrics_address else None
        )
        self.events: queue.Queue[_Event] = queue.Queue()
        self.queue: QueueServer | None = None
        self.registrations: dict[str, Registration] = {}
        # The latest physical device set per resource, also for resources not (yet) served:
        # discovery may reload before the plugin does. Read and written on the queue thread,
        # read on the lifecycle thread when a reload adds a resource.
        self.snapshots: dict[str, messages.DeviceSnapshot] = {}
        self.snapshots_lock = threading.Lock()
        self.seen_identity: str | None = None  # the last kubelet.sock we saw, to count restarts
        self.next_safety_check = 0.0
        self.errors: list[float] = []
        self.started = clock()
        self.last_reload: dict[str, object] = {}
        self.sockets = SocketRecord(os.path.join(cfg.run_dir, SOCKET_RECORD_NAME))
        self.roles = RoleHealth(cfg)
        self.last_heard = {"discovery": clock()}  # from the start: a discovery that never reports is silent too
        self.queue_problem = ""
        self.warned: set[str] = set()  # problems already logged once (a foreign object is named once)
        for resource in cfg.resources:
            self.registrations[resource.name] = Registration(self, resource)
        # Who holds which device, from the kubelet's PodResources API; reads self.cfg, so a reload counts.
        self.inuse = InUseWatcher(cfg, self.metrics, lambda: {r.name for r in self.cfg.resources})

    # Called from other threads: only post events (and bump counters).
    def _on_message(self, message: messages.Message, peer: Peer) -> None:
        self.metrics.queue_events["received"] += 1
        if isinstance(message, messages.Stats):
            self.metrics.peers.update(message.role, peer.pid, message.counters)
            self.last_heard[message.role] = self.clock()
            return
        role = "discovery" if isinstance(message, messages.DeviceSnapshot) else "kubelet-watch"
        self.metrics.peers.update(role, peer.pid)
        self.last_heard[role] = self.clock()
        changed = False
        if isinstance(message, messages.DeviceSnapshot):
            with self.snapshots_lock:
                if message.resource in self.snapshots or len(self.snapshots) < MAX_PENDING_SNAPSHOTS:
                    self.snapshots[message.resource] = message
                registration = self.registrations.get(message.resource)
                # Straight to the streams from this thread: the lifecycle thread's bookkeeping
                # (metrics, log, state file) is not on the path of a change to the kubelet.
                if registration is not None:
                    changed = self._advertise(registration, message.devices)
        self.events.put(_Event("message", (message, changed)))

    @staticmethod
    def _advertise(registration: Registration, physical: DeviceSet) -> bool:
        # Measured against the kubelet's 4 MiB receive limit: a list that does not fit is cut
        # (deterministically, see fit_list), never sent to fail at the kubelet and end the stream.
        fit = fit_list(physical, registration.resource.replicas)
        registration.fit = fit
        return registration.broadcast.update(fit.devices)

    def _on_reject(self, reason: str) -> None:
        self.metrics.queue_events["dropped" if reason == "stale" else "rejected"] += 1

    def health(self) -> tuple[bool, str]:
        """For /healthz: every resource registered with a live stream and an exact list, every role
        RUNNING, discovery heard from recently; or every reason why not (one line)."""
        registrations = list(self.registrations.values())
        problems = []
        for r in registrations:
            if r.state is State.REGISTERED and r.live_streams() == 0:
                problems.append(f"{r.name}: registered, but the kubelet holds no live ListAndWatch stream")
            elif r.state is not State.REGISTERED:
                error = f" ({r.last_error})" if r.last_error else ""
                problems.append(f"{r.name}: not registered: {r.state.value}{error}")
            fit = r.fit
            if fit is not None and fit.dropped:
                problems.append(
                    f"{r.name}: list cut to {len(fit.devices)} of {fit.wanted} device IDs "
                    f"to fit the kubelet's {constants.KUBELET_MAX_RECV_MESSAGE_BYTES} byte message limit"
                )
        roles = self.roles.problems()
        problems.extend(roles or ())
        silent = self.clock() - self.last_heard.get("discovery", self.started)
        expected = SILENT_INTERVALS * self.cfg.rescan_interval + SILENT_SLACK
        if silent > expected:
            problems.append(f"discovery silent for {silent:.0f}s (expected within {expected:.0f}s): list may be stale")
        if self.queue_problem:
            problems.append(f"queue not listening: {self.queue_problem}")
        if problems:
            return False, "; ".join(problems)
        parts = [f"{r.name}, {len(r.broadcast.devices)} devices" for r in registrations]
        unchecked = "" if roles is not None else " (not under supervisord: roles not checked)"
        return True, "ok: registered as " + "; ".join(parts) + unchecked

    def warn_once(self, key: str, msg: str, **fields: object) -> None:
        if key not in self.warned:
            self.warned.add(key)
            LOG.warning(msg, **fields)

    def stop(self) -> None:
        self.events.put(_Event("stop"))

    def reload_requested(self) -> None:
        self.events.put(_Event("reload"))

    def socket_paths(self) -> set[str]:
        return {r.socket_path for r in self.registrations.values() if r.socket_path}

    def write_state(self) -> None:
        registrations = list(self.registrations.values())
        resources = [r.summary() for r in registrations]
        # The top-level fields (the shape before [[resources]]): the first resource not registered, else the first.
        waiting = next((r for r in registrations if r.state is not State.REGISTERED), registrations[0])
        first = resources[0]
        body = {
            "pid": os.getpid(),
            "state": waiting.state.value,
            "registered": waiting.state is State.REGISTERED,
            "resource_name": first["name"],
            "endpoint": first["endpoint"],
            "devices": sum(len(r.broadcast.devices) for r in registrations),
            "healthy": sum(r.broadcast.devices.count(constants.HEALTHY) for r in registrations),
            "streams": sum(r.live_streams() for r in registrations),
            "since": waiting.since,
            "last_error": waiting.last_error,
            "metrics_address": self.metrics_server.bound if self.metrics_server else "",
            "resources": resources,
            "config_file": self.cfg.config_file,
            "reload": self.last_reload,
        }
        proc.write_state_file(self.cfg.plugin_state_file, body)

    # The life cycle, on the owning thread.
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
        identity = socket_identity(self.cfg.kubelet_socket)
        if identity and identity != self.seen_identity:
            if self.seen_identity is not None:
                self.metrics.kubelet_restarts.inc()
            self.seen_identity = identity
        for registration in list(self.registrations.values()):
            registration.check_kubelet(identity, reason)

    def on_message(self, message: messages.Message, changed: bool) -> None:
        if isinstance(message, messages.DeviceSnapshot):
            registration = self.registrations.get(message.resource)
            if registration is None:
                LOG.debug("snapshot for a resource not served (yet)", resource=message.resource)
                return
            registration.on_devices(message.devices, changed, message.seq, message.dir_present)
        else:
            self.check_kubelet("watcher")

    def on_timer(self) -> None:
        now = self.clock()
        for registration in list(self.registrations.values()):
            registration.on_timer(now)
        if now >= self.next_safety_check:
            self.check_queue()
            self.check_kubelet("periodic")

    def next_timeout(self) -> float:
        due = [self.next_safety_check]
        for registration in self.registrations.values():
            due.extend(registration.due())
        return max(0.0, min(due) - self.clock())

    def reload(self) -> None:
        """Re-read the config (SIGHUP): validate all of it, then apply it, or keep the running one.

        A resource whose settings did not change keeps its registration, socket
        and streams untouched; a removed one withdraws its devices first.
        """
        try:
            applied, deferred = proc.reload_config(self.cfg)
        except ConfigError as exc:
            self.last_reload = {"at": self.wall(), "ok": False, "reason": str(exc)}
            self.write_state()
            return
        self.cfg = applied
        wanted = {r.name: r for r in applied.resources}
        removed = [r for name, r in self.registrations.items() if name not in wanted]
        self._withdraw(removed)
        added, changed = [], []
        with self.snapshots_lock:
            registrations = {name: r for name, r in self.registrations.items() if name in wanted}
            for name, resource in wanted.items():
                current = registrations.get(name)
                if current is None:
                    registrations[name] = Registration(self, resource)
                    added.append(name)
                elif current.resource != resource:
                    current.resource = resource  # same name: same socket and registration, new devices
                    changed.append(name)
                snapshot = self.snapshots.get(name)
                if snapshot is not None and (name in added or name in changed):
                    self._advertise(registrations[name], snapshot.devices)
            self.registrations = {name: registrations[name] for name in wanted}  # config order
        for registration in removed:
            registration.close()
            self.metrics.remove_resource(registration.name)
            LOG.info("resource removed", resource=registration.name)
        for name in added + changed:
            snapshot = self.snapshots.get(name)
            if snapshot is not None:
                self.registrations[name].on_devices(snapshot.devices, True, snapshot.seq, snapshot.dir_present)
        unchanged = len(wanted) - len(added) - len(changed)
        LOG.info(
            "config reloaded",
            added=",".join(added) or "-",
            removed=",".join(r.name for r in removed) or "-",
            changed=",".join(changed) or "-",
            unchanged=unchanged,
            deferred=",".join(deferred) or "-",
        )
        self.last_reload = {
            "at": self.wall(),
            "ok": True,
            "reason": "",
            "added": added,
            "removed": [r.name for r in removed],
            "changed": changed,
            "deferred": list(deferred),
        }
        self.write_state()

    def start_queue(self, reason: str) -> None:
        """(Re)listen on the queue socket; on failure log one clear line and retry on the safety timer."""
        if self.queue is not None:
            self.queue.stop()
            self.queue = None
        server = QueueServer(self.cfg.queue_socket, self._on_message, on_reject=self._on_reject)
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
        self.queue_problem = ""
        self.queue = server

    def claim_instance(self) -> None:
        """Remove colad sockets a dead plugin left in the kubelet directory; refuse to run beside a live one.

        A previous plugin of ours may still be shutting down (supervisord restarts us
        quickly), so a live socket gets a few seconds to go away before we give up.
        """
        deadline = self.clock() + 5.0
        while True:
            try:
                for name in self._colad_names():
                    self._claim(os.path.join(self.cfg.kubelet_dir, name))
                self.sockets.prune()
                self.start_queue("start")
                return
            except InstanceError:
                if self.clock() >= deadline:
                    raise
                time.sleep(0.1)

    def _colad_names(self) -> list[str]:
        """Every entry named like our sockets, whatever it is: a foreign one is named in the log once."""
        try:
            return sorted(n for n in os.listdir(self.cfg.kubelet_dir) if is_plugin_socket_name(n))
        except OSError as exc:
            self.warn_once(self.cfg.kubelet_dir, "kubelet directory not listed", path=self.cfg.kubelet_dir, error=exc)
            return []

    def _claim(self, path: str) -> None:
        """Remove a stale socket colad recorded creating; leave (and name once) anything else."""
        try:
            claim_socket_path(path, owns=lambda st: self.sockets.owns(path, st))
        except ForeignPathError as exc:
            if path not in self.warned:
                self.metrics.input_rejected["foreign_path"] += 1
            self.warn_once(path, "kubelet directory entry left alone", path=path, reason=str(exc))
        except OSError as exc:
            self.warn_once(path, "kubelet directory entry not checked; left alone", path=path, error=exc)

    def run(self) -> int:
        self.claim_instance()
        if self.metrics_server is not None:
            self.metrics_server.start()
        self.inuse.start()
        self.started = self.clock()
        for registration in self.registrations.values():
            registration.started = self.started
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
        registration = self.registrations.get(event.resource)
        if event.kind == "message":
            self.on_message(*event.payload)
        elif event.kind == "reload":
            self.reload()
        elif event.kind == "registered":
            if registration is not None:
                registration.on_registered(event)
            else:
                event.payload.close()
        elif event.kind == "stream":
            if registration is not None:
                registration.on_stream(event)
        self.on_timer()

    def _over_budget(self) -> bool:
        now = self.clock()
        count, window = CRASH_BUDGET
        self.errors = [t for t in self.errors if now - t < window] + [now]
        return len(self.errors) > count

    def _withdraw(self, registrations: list[Registration]) -> None:
        """Tell the kubelet these resources' devices are gone (an empty list) before their streams end.

        Otherwise a stopped plugin leaves its devices advertised (as unhealthy) for the
        kubelet's 5-minute grace period. Bounded: never waits more than a second in all.
        """
        waiting = [r for r in registrations if r.begin_withdraw()]
        deadline = self.clock() + DRAIN_TIMEOUT
        for registration in waiting:
            if registration.drained.wait(max(0.0, deadline - self.clock())):
                LOG.info("told the kubelet the devices are gone", resource=registration.name)
            else:
                LOG.warning(
                    "empty device list not confirmed sent", resource=registration.name, waited=f"{DRAIN_TIMEOUT}s"
                )

    def shutdown(self) -> None:
        self.inuse.stop()
        self._withdraw(list(self.registrations.values()))
        for registration in self.registrations.values():
            registration.close()
        if self.queue is not None:
            self.queue.stop()
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
    handled = stop_signals | {signal.SIGHUP}
    signal.pthread_sigmask(signal.SIG_BLOCK, handled)
    plugin = Plugin(cfg)

    def wait_for_signal() -> None:
        while True:
            signum = signal.sigwait(handled)
            LOG.info("signal received", signal=signal.Signals(signum).name)
            if signum in stop_signals:
                plugin.stop()
                return
            plugin.reload_requested()

    threading.Thread(target=wait_for_signal, name="signals", daemon=True).start()
    LOG.info(
        "plugin starting",
        resources=",".join(r.name for r in cfg.resources),
        kubelet_dir=cfg.kubelet_dir,
        queue=cfg.queue_socket,
    )
    try:
        return plugin.run()
    except InstanceError as exc:
        LOG.error("refusing to start", reason=str(exc))
        return 1
