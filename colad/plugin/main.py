"""Role `colad plugin`: serves the DevicePlugin API to the kubelet and keeps each resource registered.

The life-cycle thread (`Plugin.run`) owns every mutable thing: the registrars (registrar.py,
one per resource, stepped by registration.py), the snapshots, the queue server and the
`PluginSnapshot`. Queue, gRPC and signal threads only post typed events (colad/plugin/events.py);
the HTTP thread only reads the published snapshot. SIGHUP: reload_plan.plan, then its execution.
What Register does not need (prometheus_client, the HTTP server, the in-use watcher) loads once it is sent.
"""

from __future__ import annotations

import json
import os
import queue
import signal
import threading
import time
import traceback
from collections import deque
from collections.abc import Callable
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from colad.config import config
from colad.config.config import Config, Resource
from colad.core import registration as reg
from colad.core.errors import ConfigError, InstanceError
from colad.core.roles import DISCOVERY, KUBELET_WATCH, PLUGIN
from colad.health.rule import PluginSnapshot, Verdict, assess, degraded, readiness
from colad.jobs import commands
from colad.metrics.registry import Metrics
from colad.outputs import statefile
from colad.outputs.socketpath import SocketRecord
from colad.plugin import events as ev
from colad.plugin import reload_plan
from colad.plugin.registrar import Context, ResourceRegistrar, Servers, withdraw
from colad.plugin.sockets import Sockets
from colad.queue import messages
from colad.queue.framing import Peer
from colad.runtime import log, pathtrust, proc
from colad.runtime.kubeletdir import socket_identity

if TYPE_CHECKING:
    from colad.health.supervisor import RoleHealth
    from colad.metrics.httpserver import MetricsServer
    from colad.plugin.dra_host import DraHost
    from colad.plugin.podresources import InUseWatcher
    from colad.plugin.status_socket import StatusSocket

LOG = log.get(__name__)

SAFETY_CHECK_INTERVAL = 5.0  # stat our sockets and kubelet.sock even if the watcher is silent
CRASH_BUDGET = (5, 60.0)  # unexpected errors per window before we exit and let supervisord restart us
DRAIN_TIMEOUT = 1.0  # at shutdown, how long the empty device list may take to reach the kubelet
MAX_PENDING_SNAPSHOTS = 64  # snapshots kept for resources this plugin does not serve (yet): a reload may add them
# The state file is written at once after a quiet spell, else at most once per this interval: the events
# of one change or re-registration cost one or two writes, not one each (a change waits for its send, ms
# later); the file is never more than this behind the published snapshot.
STATE_FILE_INTERVAL = 0.05
STATE_FILE_RETRY = 1.0  # a state file that could not be written (a full run directory) is tried again this often


def dra_identity(cfg: Config) -> tuple[object, ...]:
    """What a DRA host is built from: a reload that changes any of it serves DRA afresh."""
    return (
        cfg.dra_driver_name,
        cfg.resolved_node_name,
        cfg.kubeconfig,
        cfg.dra_registration_socket,
        cfg.dra_plugin_socket,
        tuple(r.name for r in cfg.resources),
    )


class Plugin:
    """The shell around the pure registrations: runs their effects, publishes one snapshot."""

    def __init__(
        self,
        cfg: Config,
        *,
        clock: Callable[[], float] = time.monotonic,
        wall: Callable[[], float] = time.time,
        servers: Servers | None = None,
    ) -> None:
        self.cfg, self.clock, self.wall = cfg, clock, wall
        # Current state (devices, registered, streams, list size) is scraped from the published snapshot.
        # It counts at once; its registry, the HTTP server, the role check and the in-use watcher come
        # once the first Register is sent (`observers`): none of them is on the path to it.
        self.metrics = Metrics(
            per_device=cfg.metrics_per_device, snapshot=lambda: self.snapshot.state, dra=cfg.dra_mode
        )
        self.metrics_server: MetricsServer | None = None
        self.roles: RoleHealth | None = None
        self.status_socket: StatusSocket | None = None
        self.inuse: InUseWatcher | None = None
        self.observers = ""  # "": not asked yet; "loading"; "up"
        self.observers_failed = False  # its thread could not start (said once)
        # A SimpleQueue: put and get in C, no Python Condition per hand-off (every change crosses it twice).
        self.events: queue.SimpleQueue[ev.LifecycleEvent] = queue.SimpleQueue()
        self.deferred: deque[ev.LifecycleEvent] = deque()  # taken off the queue while draining, handled next
        self.record = SocketRecord(cfg.socket_record_file)
        self.sockets = Sockets(cfg, self.record, self.metrics, self.on_message, self._on_reject)
        self.ctx = Context(
            cfg.kubelet_dir,
            cfg.kubelet_socket,
            cfg.register_timeout,
            self.metrics,
            self.record,
            self.events.put,
            wall,
            servers or Servers(),
            lambda: {e.socket_path for e in self.registrars.values() if e.socket_path},
            lambda: self.cfg.cdi,
            lambda: self.cfg.cdi_spec_dir,
            lambda: self.cfg.trusted_uids,
        )
        # DRA mode: no registrar (nothing on kubelet.sock); the DRA host serves the devices (started by run()).
        self.registrars = {r.name: ResourceRegistrar(self.ctx, r, clock()) for r in cfg.resources if not cfg.dra_mode}
        self.dra: DraHost | None = None
        # The latest physical device set per resource, also for resources not (yet) served:
        # discovery may reload before the plugin does.
        self.snapshots: dict[str, messages.DeviceSnapshot] = {}
        self.seen_identity: str | None = None  # the last kubelet.sock we saw, to count restarts
        self.kubelet_now = ""  # kubelet.sock's identity at the last stat() ("" absent), for /readyz
        self.next_safety_check = 0.0
        self.errors: list[float] = []
        self.last_reload: statefile.ReloadResult | None = None
        self.discovery_heard = clock()  # from the start: a discovery that never reports is silent too
        self.degraded: dict[str, str] = {}  # role -> its degraded mode as its last Stats said ("" none)
        self.snapshot = PluginSnapshot(
            statefile.PluginState(pid=os.getpid()), self.discovery_heard, cfg.rescan_interval
        )
        self.state_due: float | None = None  # when the state file must catch up with `snapshot` (None: it has)
        self.state_written = -STATE_FILE_INTERVAL  # monotonic time of the last write
        self.state_failures = 0  # failed writes in a row (each counted in the metric)
        self.state_problem = ""  # for /healthz and status while writes fail

    # Called from other threads: only post events.
    def on_message(self, message: messages.Message, peer: Peer) -> None:
        """A message from a queue peer: posted to the life-cycle thread (the queue server's callback)."""
        self.events.put(ev.Received(message, peer, self.clock()))

    def _on_reject(self, reason: str) -> None:
        self.events.put(ev.QueueRejected(reason))

    def stop(self) -> None:
        self.events.put(ev.StopRequested())

    def thread_died(self, args: threading.ExceptHookArgs) -> None:
        """threading.excepthook: one line instead of a traceback, and an event for the life-cycle thread.

        gRPC's serving thread (grpc/_server.py `_serve`) ends when it cannot start a worker thread
        (a task limit): its server then leaves every call unanswered, so it must be replaced.
        """
        if args.exc_type is SystemExit:
            return
        name = args.thread.name if args.thread is not None else "-"
        error = f"{args.exc_type.__name__}: {args.exc_value}"
        grpc_file = os.path.join("grpc", "_server.py")
        frames = traceback.walk_tb(args.exc_traceback)
        grpc_server = any(f.f_code.co_name == "_serve" and f.f_code.co_filename.endswith(grpc_file) for f, _ in frames)
        LOG.error("thread ended with an error", thread=name, error=error, grpc_server=grpc_server)
        self.events.put(ev.ThreadDied(name, error, grpc_server))

    def reload_requested(self) -> None:
        self.events.put(ev.ReloadRequested())

    def health(self) -> tuple[bool, str]:
        """For /healthz (the HTTP thread): the published snapshot and the roles, never live fields."""
        found = self.assess()
        return found.ok, found.line()

    def assess(self, *, fresh: bool = False) -> Verdict:
        """The health rule on the published snapshot; `fresh`: ask supervisord now, not from the cache."""
        roles = self.roles
        if roles is None:  # asked before the observers are up (a test may): a check of its own
            from colad.health.supervisor import RoleHealth

            roles = RoleHealth(self.cfg)
        unasked = self.status_socket.problem() if self.status_socket is not None else ""
        found = ((r.name, pathtrust.directory_problem(r.device_dir, self.cfg.trusted_uids)) for r in self.cfg.resources)
        refused = tuple(f"{name}: {why}" for name, why in found if why is not None)  # a few lstats each
        return assess(self.snapshot, roles.view(fresh=fresh), self.clock(), unasked=unasked, refused=refused)

    def status_answer(self) -> bytes:
        """For the status socket (its thread): the verdict, readiness and published state, stamped."""
        snapshot = self.snapshot
        found = self.assess(fresh=True)
        ready, why = readiness(snapshot, self.clock())
        body = {
            **statefile.stamped(snapshot.state),
            "health": {"ok": found.ok, "reason": found.line(), "problems": found.problems, "waiting": found.waiting},
            "ready": {"ok": ready, "reason": why},
        }
        return json.dumps(body).encode()

    def ready(self) -> tuple[bool, str]:
        """For /readyz (the HTTP thread): registered, streamed, list exact; from the published snapshot."""
        return readiness(self.snapshot, self.clock())

    # The life cycle, on the owning thread.
    def publish(self) -> None:
        state = statefile.PluginState(
            pid=self.snapshot.state.pid,  # os.getpid() once: a syscall per publish otherwise
            resources=tuple(e.resource_state() for e in self.registrars.values()),
            metrics_address=self.metrics_server.bound if self.metrics_server else "",
            config_file=self.cfg.config_file,
            reload=self.last_reload,
            kubelet=self.kubelet_now,
            degraded=tuple(text for _, text in sorted(self.degraded.items()) if text),
            **(self._dra_fields() if self.dra else {}),
        )
        held, changed = self.snapshot, state != self.snapshot.state  # the one deep comparison
        kept = state if changed else held.state  # unchanged: the same object, compared by identity below
        snapshot = PluginSnapshot(
            kept, self.discovery_heard, self.cfg.rescan_interval, self.sockets.queue_problem, self.state_problem
        )
        if snapshot == held:
            return
        if changed:
            now = self.clock()
            # A list on its way to the kubelet reports its send within ms: one write for the change
            # and its send, not one each; never later than the interval, whatever the stream does.
            if any(e.sending() for e in self.registrars.values()):
                due = now + STATE_FILE_INTERVAL
            else:
                due = max(now, self.state_written + STATE_FILE_INTERVAL)
            self.state_due = due if self.state_due is None else min(self.state_due, due)
        self.snapshot = snapshot

    def _dra_fields(self) -> dict[str, Any]:
        """The DRA host's part of the published state."""
        assert self.dra is not None
        registration = self.dra.registration
        return {
            "dra_driver": self.dra.driver,
            "dra_registration": self.dra.phase,
            "dra_registration_error": registration.last_error,
            "dra_problem": self.dra.problem
            or (registration.serve_problem and f"{registration.socket_path}: {registration.serve_problem}"),
            "dra_slices": self.dra.slices(),
            "dra_claims": self.dra.claims_prepared(),
        }

    def write_state(self, *, now: bool = False) -> None:
        """Write the published snapshot to the state file once it is due (or `now`), if it changed.

        At once after a failed effect: the next one may block (gRPC's core waits for a thread it cannot start).
        """
        if failed := [e for e in self.registrars.values() if e.failed]:
            for registrar in failed:
                registrar.failed = False
            now = True
        at = self.clock()
        if self.state_due is None or not (now or at >= self.state_due):
            return
        self.state_due, self.state_written = None, at
        path = self.cfg.plugin_state_file
        error = statefile.write(path, self.snapshot.state)
        if error:
            # Retried until it is written; said once, counted each time, on /healthz and status meanwhile.
            self.state_due = at + STATE_FILE_RETRY
            self.state_failures += 1
            self.metrics.state_file_failures.inc()
            if self.state_failures == 1:
                LOG.warning("state file not written; retrying", path=path, error=error, every_s=STATE_FILE_RETRY)
            problem = f"state file not written: {path}: {error} (retrying every {STATE_FILE_RETRY:g}s)"
        else:
            if self.state_failures:
                LOG.info("state file written again", path=path, failures=self.state_failures)
            self.state_failures, problem = 0, ""
        if problem != self.state_problem:
            self.state_problem = problem
            self.snapshot = replace(self.snapshot, state_file_problem=problem)

    def handle(self, event: ev.LifecycleEvent) -> None:
        now = self.clock()
        match event:
            case ev.Received(message=message, peer=peer, at=at):
                self._received(message, peer, at, now)
            case ev.QueueRejected(reason=reason):
                self.metrics.queue_events["dropped" if reason == "stale" else "rejected"] += 1
            case ev.ReloadRequested():
                self.reload()
            case ev.StreamChanged(resource=name, generation=generation, opened=opened) if name in self.registrars:
                self.registrars[name].stream_changed(generation, opened, now)
            case ev.ListSent(resource=name, generation=generation, version=version) if name in self.registrars:
                self.registrars[name].list_sent(generation, version)
            case ev.CallDone(resource=name, call=call, handle=handle):
                if name in self.registrars:
                    self.registrars[name].call_done(call, handle, now)
                else:
                    handle.close()
            case ev.ObserversLoaded(error=error):
                self._observers_loaded(error)
            case ev.ThreadDied(error=error, grpc_server=grpc_server):
                self.metrics.thread_failures.inc()
                if grpc_server:  # which resource's is not known: each serves anew, on a fresh socket
                    for registrar in list(self.registrars.values()):
                        registrar.thread_died(error, now)
        self.on_timer()
        self.publish()

    def _received(self, message: messages.Message, peer: Peer, at: float, now: float) -> None:
        self.metrics.queue_events["received"] += 1
        if isinstance(message, messages.Stats):
            self.metrics.peers.update(message.role, peer.pid, message.counters)
            self.degraded[message.role] = degraded(message.role, message.counters)
            if message.role == DISCOVERY.name:
                self.discovery_heard = at
            return
        if isinstance(message, messages.DeviceSnapshot):
            self.metrics.peers.update(DISCOVERY.name, peer.pid)
            self.discovery_heard = at
            if message.resource in self.snapshots or len(self.snapshots) < MAX_PENDING_SNAPSHOTS:
                self.snapshots[message.resource] = message
            if self.dra is not None:
                self.publish_dra()
            registrar = self.registrars.get(message.resource)
            if registrar is None:
                LOG.debug("snapshot for a resource not served (yet)", resource=message.resource)
                return
            registrar.take(message, now)
        else:
            self.metrics.peers.update(KUBELET_WATCH.name, peer.pid)
            self.check_kubelet("watcher")

    def check_kubelet(self, reason: str) -> None:
        """Verify by stat() what the watcher (or the safety timer) suggests."""
        now = self.clock()
        self.next_safety_check = now + SAFETY_CHECK_INTERVAL
        identity = socket_identity(self.cfg.kubelet_socket)
        self.kubelet_now = identity
        if identity and identity != self.seen_identity:
            if self.seen_identity is not None:
                self.metrics.kubelet_restarts.inc()
            self.seen_identity = identity
        for registrar in list(self.registrars.values()):
            registrar.apply(reg.KubeletSeen(identity, registrar.socket_intact(), reason), now)
        if self.dra is not None:
            self.dra.check()

    def publish_dra(self) -> None:
        """Hand the DRA host the device set of every resource served, as discovery last sent it; a resource
        discovery has not reported since this process started has none, and its slices stay as held."""
        if self.dra is not None:
            served = (r.name for r in self.cfg.resources)
            self.dra.publish({name: s.devices for name in served if (s := self.snapshots.get(name)) is not None})

    def start_dra(self) -> None:
        """Enter DRA mode. The device-plugin sockets are gone by then: claim_instance removed those a dead
        plugin left, and a registrar's close() its own."""
        from colad.plugin.dra_host import DraHost

        self.metrics.serve_dra()
        self.dra = DraHost(self.cfg, self.metrics, clock=self.clock, on_change=lambda: self.events.put(ev.DraChanged()))
        self.dra.start()
        self.publish_dra()

    def stop_dra(self, *, withdraw: bool) -> None:
        if self.dra is not None:
            self.dra.stop(withdraw=withdraw)
            self.dra = None

    def _registers_sent(self) -> bool:
        """Every resource has sent its first Register (or cannot yet: no server, stopped)."""
        done = (reg.Phase.BACKOFF, reg.Phase.STOPPED)
        return all(e.state.calls > 0 or e.state.phase in done for e in self.registrars.values())

    def load_observers(self) -> None:
        """Once the first Registers are sent: load what only metrics and health need, in a thread of its own.

        The imports (~60 ms of CPU on a loaded 2-CPU node) would otherwise come before Register. Counts
        made meanwhile wait in Metrics; /metrics, /healthz and /readyz do not listen until it is done.
        """
        if self.observers or not self._registers_sent():
            return
        self.observers = "loading"

        def load() -> None:
            try:
                self.metrics.bind()
                import colad.health.supervisor  # noqa: F401
                import colad.jobs.prestart  # noqa: F401 - before the first PreStartContainer needs it
                import colad.metrics.httpserver  # noqa: F401 - loaded here, used by _observers_loaded
                import colad.plugin.podresources  # noqa: F401
                import colad.plugin.status_socket  # noqa: F401
            except Exception as exc:  # a broken install: the plugin still serves the kubelet
                LOG.exception("metrics and health not available")
                self.events.put(ev.ObserversLoaded(str(exc) or type(exc).__name__))
                return
            self.events.put(ev.ObserversLoaded())

        try:
            threading.Thread(target=load, name="observers", daemon=True).start()
        except RuntimeError as exc:  # a task limit: tried again after the next event or timer
            self.observers = ""
            if not self.observers_failed:
                LOG.warning("metrics and health not loaded yet; retrying", error=str(exc))
            self.observers_failed = True

    def _observers_loaded(self, error: str) -> None:
        if error or self.observers == "up":
            return
        from colad.health.supervisor import RoleHealth
        from colad.metrics.httpserver import MetricsServer
        from colad.plugin.status_socket import StatusSocket

        self.observers = "up"
        self.roles = RoleHealth(self.cfg)
        self.status_socket = StatusSocket(self.cfg.status_socket, self.status_answer)
        self.status_socket.start()
        if self.cfg.metrics_address:
            refused = self.metrics.http_refused
            self.metrics_server = MetricsServer(
                self.metrics,
                self.cfg.metrics_address,
                self.health,
                self.ready,
                on_refuse=lambda reason: refused.labels(reason).inc(),
            )
            self.metrics_server.start()
        self.start_inuse()

    def start_inuse(self) -> None:
        """Who holds which device, from the kubelet's PodResources API; the published names, so a reload counts."""
        from colad.plugin.podresources import InUseWatcher

        inuse = InUseWatcher(self.cfg, self.metrics, lambda: {r.name for r in self.snapshot.state.resources})
        try:
            inuse.start()
        except RuntimeError as exc:  # its thread cannot start (a task limit): retried on the safety timer
            LOG.warning("in-use view not started; retrying", error=str(exc))
            return
        self.inuse = inuse

    def on_timer(self) -> bool:
        """Step what is due; False when nothing was (the state file's wake: nothing to publish)."""
        now = self.clock()
        due = [e for e in self.registrars.values() if (at := e.state.due()) is not None and now >= at]
        for registrar in due:
            registrar.apply(reg.Timer(), now)
        if safety := now >= self.next_safety_check:
            self.sockets.check_queue()
            if self.metrics_server is not None and self.metrics_server.server is None:
                self.metrics_server.start()
            if self.status_socket is not None and not self.status_socket.intact():
                self.status_socket.stop()
                self.status_socket.start()
            if self.observers == "up" and self.inuse is None:
                self.start_inuse()
            self.check_kubelet("periodic")
        return bool(due) or safety

    def next_timeout(self) -> float:
        due = [self.next_safety_check] + [d for e in self.registrars.values() if (d := e.state.due()) is not None]
        if self.state_due is not None:
            due.append(self.state_due)
        return max(0.0, min(due) - self.clock())

    def reload(self) -> None:
        """Re-read the config (SIGHUP): validate all of it, then apply it, or keep the running one."""
        try:
            applied, deferred = config.reload_config(self.cfg)
        except ConfigError as exc:
            self.last_reload = statefile.ReloadResult(at=self.wall(), ok=False, reason=str(exc))
            return
        running, self.cfg = self.cfg, applied
        if running.dra_mode or applied.dra_mode:
            self._reload_mode(running, applied, deferred)
            return
        wanted: dict[str, Resource] = {r.name: r for r in applied.resources}
        todo = reload_plan.plan({name: e.resource for name, e in self.registrars.items()}, applied.resources)
        removed = [self.registrars[name] for name in todo.removed]
        withdraw(removed, self.events, self.deferred, self.clock, DRAIN_TIMEOUT)
        now = self.clock()
        for name in todo.added:
            self.registrars[name] = ResourceRegistrar(self.ctx, wanted[name], now)
        for name in todo.changed:
            self.registrars[name].resource = wanted[name]  # same name: same socket and registration, new devices
            self.registrars[name].options_changed(now)  # unless pre_start_required changed: then a new Register
        for registrar in removed:
            registrar.close(now)
            del self.registrars[registrar.name]
            self.metrics.remove_resource(registrar.name)
            LOG.info("resource removed", resource=registrar.name)
        self.registrars = {name: self.registrars[name] for name in todo.order}  # config order
        for name in todo.added + todo.changed:
            if (snapshot := self.snapshots.get(name)) is not None:
                self.registrars[name].take(snapshot, now, changed=True)
        LOG.info(
            "config reloaded",
            added=",".join(todo.added) or "-",
            removed=",".join(todo.removed) or "-",
            changed=",".join(todo.changed) or "-",
            unchanged=len(todo.unchanged),
            deferred=",".join(deferred) or "-",
        )
        self.last_reload = statefile.ReloadResult(
            self.wall(), True, "", todo.added, todo.removed, todo.changed, tuple(deferred)
        )

    def _reload_mode(self, running: Config, applied: Config, deferred: tuple[str, ...]) -> None:
        """A reload in or into DRA mode: the side no longer served is withdrawn (device plugin: the empty
        list and its sockets; DRA: its slices and its sockets), and what is served now starts afresh."""
        now = self.clock()
        switched = running.dra_mode != applied.dra_mode
        if applied.dra_mode and not switched and dra_identity(running) == dra_identity(applied):
            LOG.info("config reloaded", mode=applied.mode, changed="-", deferred=",".join(deferred) or "-")
            self.last_reload = statefile.ReloadResult(self.wall(), True, "", deferred=tuple(deferred))
            return
        if applied.dra_mode:
            removed = list(self.registrars.values())
            withdraw(removed, self.events, self.deferred, self.clock, DRAIN_TIMEOUT)
            for registrar in removed:
                registrar.close(now)
                self.metrics.remove_resource(registrar.name)
            self.registrars = {}
            self.stop_dra(withdraw=True)  # another driver, node or resource list: the old slices go
            self.start_dra()
        else:
            self.stop_dra(withdraw=True)
            self.registrars = {r.name: ResourceRegistrar(self.ctx, r, now) for r in applied.resources}
            for name, registrar in self.registrars.items():
                if (snapshot := self.snapshots.get(name)) is not None:
                    registrar.take(snapshot, now, changed=True)
            self.check_kubelet("mode")
        LOG.info("config reloaded", mode=applied.mode, was=running.mode, deferred=",".join(deferred) or "-")
        self.last_reload = statefile.ReloadResult(self.wall(), True, "", deferred=tuple(deferred))

    def _over_budget(self) -> bool:
        now = self.clock()
        count, window = CRASH_BUDGET
        self.errors = [t for t in self.errors if now - t < window] + [now]
        return len(self.errors) > count

    def _next_event(self) -> ev.LifecycleEvent | None:
        if self.deferred:
            return self.deferred.popleft()
        try:
            return self.events.get(timeout=self.next_timeout())
        except queue.Empty:
            return None  # a timer is due

    def run(self) -> int:
        self.sockets.claim_instance()
        if self.cfg.dra_mode:
            self.start_dra()
        started = self.clock()
        for registrar in self.registrars.values():
            registrar.restart_clock(started)
        self.next_safety_check = started + SAFETY_CHECK_INTERVAL
        self.kubelet_now = socket_identity(self.cfg.kubelet_socket)
        self.publish()
        self.write_state(now=True)
        self.load_observers()  # at once if there is nothing to register
        try:
            while not isinstance(event := self._next_event(), ev.StopRequested):
                try:
                    if event is None:
                        if self.on_timer():  # else only the state file was due: no publish
                            self.publish()
                    else:
                        self.handle(event)
                    self.load_observers()
                    self.write_state()
                except Exception:  # the loop boundary: log once, count, continue
                    LOG.exception("plugin loop error", event=type(event).__name__)
                    if self._over_budget():
                        LOG.error("too many errors; exiting so supervisord restarts the plugin")
                        return 1
        finally:
            self.shutdown()
        return event.code

    def shutdown(self) -> None:
        with commands.stopping():  # a prepare still running is killed with what it started; no new one
            if self.inuse is not None:
                self.inuse.stop()
            withdraw(list(self.registrars.values()), self.events, self.deferred, self.clock, DRAIN_TIMEOUT)
            now = self.clock()
            for registrar in self.registrars.values():
                registrar.close(now)
            # The slices stay: the kubelet wipes them once no DRA socket of the driver is connected, and a
            # restart (an upgrade) publishes them again before then (docs/DEVELOPING.md, "DRA mode").
            self.stop_dra(withdraw=False)
            self.publish()
            self.write_state(now=True)
            self.sockets.stop()
            if self.status_socket is not None:
                self.status_socket.stop()
            if self.metrics_server is not None:
                self.metrics_server.stop()
        LOG.info("plugin stopped")


def main(args: object = None, cfg: Config | None = None) -> int:
    cfg = cfg or config.load()
    log.setup(PLUGIN.name, cfg.log_level)
    proc.setup_role()
    commands.become_subreaper()  # a prepare command's orphans are re-parented here, to be found and reaped
    # Signals are taken by a thread of their own (sigwait) rather than a handler:
    # a handler runs on the lifecycle thread and could re-enter its event queue's
    # lock. Blocked here, before gRPC starts its threads, so they inherit the mask.
    stop_signals = {signal.SIGTERM, signal.SIGINT}
    handled = stop_signals | {signal.SIGHUP}
    signal.pthread_sigmask(signal.SIG_BLOCK, handled)
    plugin = Plugin(cfg)
    threading.excepthook = plugin.thread_died

    def wait_for_signal() -> None:
        while True:
            signum = signal.sigwait(handled)
            LOG.info("signal received", signal=signal.Signals(signum).name)
            if signum in stop_signals:
                plugin.stop()
                return
            plugin.reload_requested()

    threading.Thread(target=wait_for_signal, name="signals", daemon=True).start()
    resources = ",".join(r.name for r in cfg.resources)
    LOG.info("plugin starting", resources=resources, kubelet_dir=cfg.kubelet_dir, queue=cfg.queue_socket)
    try:
        return plugin.run()
    except InstanceError as exc:
        LOG.error("refusing to start", reason=str(exc))
        return 1
    except Exception as exc:  # the life-cycle loop cannot go on: exit non-zero, supervisord starts the plugin again
        LOG.error("plugin life cycle failed; exiting", error=f"{type(exc).__name__}: {exc}")
        return 1
