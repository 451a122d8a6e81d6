"""One resource's registration as the plugin runs it: carries out what registration.step decides.

The I/O half of a resource on the plugin's life-cycle thread: its device broadcast,
gRPC server and socket, Register calls in flight, counters and log lines (the gauges
come from the published snapshot, collectors.py). Servers and calls come from an
injected `Servers` factory, the seam the in-process tests use.
"""

from __future__ import annotations

import os
import queue
import threading
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

from colad.config.config import Resource
from colad.core import constants, trust
from colad.core import registration as reg
from colad.core.devices import DeviceSet
from colad.deviceplugin.broadcast import DeviceBroadcast
from colad.deviceplugin.device_list import FittedList, fit_list
from colad.deviceplugin.service import DevicePluginServicer, RegisterCall, StreamEvents, build_server
from colad.metrics.registry import Metrics
from colad.outputs.socketpath import SocketRecord
from colad.outputs.statefile import ListCut, ResourceState, SickList
from colad.plugin.events import Call, CallDone, EmptyListSent, ListSent, StopRequested, StreamChanged
from colad.queue.messages import DeviceSnapshot
from colad.queue.snapshots import keep_stats, stats_of
from colad.runtime import dirpath, log
from colad.runtime.kubeletdir import fresh_socket_path, socket_identity

LOG = log.get(__name__)
SHUTDOWN_GRACE = 1.0  # seconds the server waits at shutdown for ended streams to flush (normally ms)
CALL_SLACK = 5.0  # past its own deadline, a Register call whose answer has not come is given up as lost


@dataclass(frozen=True)
class Servers:
    """How servers and Register calls are made: gRPC on Unix sockets unless a test says otherwise."""

    build: Callable[[DevicePluginServicer, str], Any] = build_server  # bound to the path, not started
    # kubelet socket, endpoint, resource, timeout, pre_start_required
    register: Callable[[str, str, str, float, bool], Call] = RegisterCall


class SentBroadcast(DeviceBroadcast):
    """A DeviceBroadcast that remembers, per stream thread, which version it last handed out.

    service.ListAndWatch takes a version (snapshot / wait_change), yields it and then reports
    the send on the same thread: so the report can name the exact version that went out,
    which /readyz needs ("the list the kubelet holds is the current one").
    """

    def __init__(self) -> None:
        super().__init__()
        self._taken = threading.local()

    def snapshot(self) -> tuple[int, DeviceSet]:
        version, devices = super().snapshot()
        self._taken.version = version
        return version, devices

    def wait_change(self, seen: int, generation: int, alive: Callable[[], bool]) -> tuple[int, DeviceSet] | None:
        change = super().wait_change(seen, generation, alive)
        self._taken.version = change[0] if change is not None else None
        return change

    def taken(self) -> int | None:
        """The version this thread took last (None: none, or the stream is ending)."""
        return getattr(self._taken, "version", None)

    def snapshot_version(self) -> int:
        """The version of the list the broadcast holds now (the life-cycle thread's question, 2-3 a publish)."""
        # One int read, atomic under the GIL, as `devices` is: no lock round-trip for the version alone.
        return self._version


@dataclass(frozen=True)
class Context:
    """What every registrar of one plugin shares."""

    kubelet_dir: str
    kubelet_socket: str
    register_timeout: float
    metrics: Metrics
    sockets: SocketRecord
    post: Callable[[Any], None]
    wall: Callable[[], float]
    servers: Servers
    taken: Callable[[], set[str]]  # socket paths the other registrars serve on
    cdi_mode: Callable[[], str] = lambda: "both"  # the config's `cdi`, read per Allocate (a reload may change it)
    cdi_spec_dir: Callable[[], str] = lambda: ""  # the config's `cdi_spec_dir`, read per Allocate as well
    trusted: Callable[[], frozenset[int]] = lambda: trust.ROOT_ONLY  # Config.trusted_uids, per PreStartContainer


class ResourceRegistrar:
    """A resource's broadcast, server, socket and calls; `state` is its pure registration record."""

    def __init__(self, ctx: Context, resource: Resource, now: float) -> None:
        self.ctx = ctx
        self.resource = resource
        self.name = resource.name
        # The directory discovery lists (dirpath's rule), for the state file: looked up again at each list.
        self.listed_dir = dirpath.resolve(resource.device_dir)
        self.broadcast = SentBroadcast()
        self.ignored_prepares: tuple[str, ...] = ()  # devices whose own prepare never runs (warned once)
        self.closing = False  # close() was called: the plugin stops
        self.sent: dict[int, int] = {}  # server generation -> the newest list version its streams sent
        # The options the current server was registered with: a reload that changes them registers again.
        self.pre_start_required = resource.pre_start_required
        self.state = reg.Registration(started=now)
        self.server: Any = None
        self.server_died = False  # a gRPC serving thread died: maybe this server's (which one is not known)
        self.failed = False  # an effect failed since the plugin last wrote its state file
        self.socket_path: str | None = None
        self.calls: dict[int, Call] = {}
        self.fit: FittedList | None = None  # the last list measured against the kubelet's limit
        self.since = ctx.wall()
        self.last_registered = 0.0
        self.draining = False
        ctx.metrics.add_resource(self.name)

    def apply(self, event: reg.Event, now: float) -> None:
        """Step the registration and carry out its effects; answers, and failures, are stepped in turn, at once."""
        pending: deque[reg.Event] = deque([event])
        while pending:
            self.state, effects = reg.step(self.state, pending.popleft(), now)
            for effect in effects:
                answer = self.carry_out(effect, now)
                if answer is not None:
                    pending.append(answer)
                if isinstance(answer, reg.EffectFailed):
                    break  # the effects after it were decided on the premise that it had been carried out

    def carry_out(self, effect: reg.Effect, now: float) -> reg.Event | None:
        """Carry out one effect: its answer, or EffectFailed however it failed (logged once, counted).

        The one boundary of every effect: an OSError, a thread that cannot start (RuntimeError),
        a gRPC error or a MemoryError alike becomes an event the registration backs off and retries on.
        """
        try:
            return self._execute(effect, now)
        except Exception as exc:  # the effect boundary: whatever failed, the registration must hear of it
            kind = reg.effect_name(effect)
            error = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
            self.ctx.metrics.effect_failures.labels(self.name, kind).inc()
            self.failed = True  # the plugin writes its state file at once: status names the failure
            LOG.warning("registration effect failed", resource=self.name, effect=kind, error=error)
            return reg.EffectFailed(effect, error)

    def _execute(self, effect: reg.Effect, now: float) -> reg.Event | None:
        metrics, name = self.ctx.metrics, self.name
        match effect:
            case reg.StopServer(generation=generation):
                self.stop_server(generation)
            case reg.Serve(generation=generation, cause=cause):
                metrics.server_restarts.labels(name, cause).inc()
                return self._serve(generation)
            case reg.CheckSocket():
                return reg.SocketChecked(self.socket_intact())
            case reg.SendRegister(call=call, endpoint=endpoint):
                identity = socket_identity(self.ctx.kubelet_socket)
                ctx = self.ctx
                if identity:
                    handle = ctx.servers.register(
                        ctx.kubelet_socket, endpoint, name, ctx.register_timeout, self.pre_start_required
                    )
                    self.calls[call] = handle  # before the callback: a CancelCall after a failure here closes it
                    handle.add_done_callback(lambda: ctx.post(CallDone(name, call, handle)))
                return reg.RegisterSent(call, identity, now + ctx.register_timeout + CALL_SLACK)
            case reg.CancelCall(call=call):
                cancelled = self.calls.pop(call, None)
                if cancelled is not None:
                    try:
                        cancelled.cancel()
                    finally:
                        cancelled.close()
            case reg.RetryAt(delay=delay, error=error):
                metrics.registrations.labels(name, "failure").inc()
                LOG.warning("register failed", resource=name, error=error, retry_in=f"{delay:.2f}s")
            case reg.Accepted(endpoint=endpoint):
                self.last_registered = self.ctx.wall()
                metrics.registrations.labels(name, "success").inc()
                LOG.info("register to kubelet successfully", resource=name, endpoint=endpoint)
            case reg.Transition(previous=previous, phase=phase, reason=reason, fields=fields):
                self.since = self.ctx.wall()
                LOG.info(
                    "plugin state",
                    resource=name,
                    state=phase.value,
                    previous=previous.value,
                    reason=reason,
                    **dict(fields),
                )
            case reg.GaveUpWaiting(waited=waited):
                LOG.warning("no device snapshot yet; registering anyway", resource=name, waited=f"{waited}s")
            case reg.Restart(reason=reason):
                LOG.error(
                    "gRPC no longer answers; exiting so supervisord restarts the plugin", resource=name, reason=reason
                )
                self.ctx.post(StopRequested(1, reason))
            case reg.SendEmptyList():
                self.broadcast.update(DeviceSet())
                self.draining = True  # only once it is on its way: withdraw() waits for its send
        return None

    def _serve(self, generation: int) -> reg.Served:
        """Serve on a fresh, unique socket: the kubelet keys endpoints by socket path."""
        os.makedirs(self.ctx.kubelet_dir, mode=0o750, exist_ok=True)
        path = fresh_socket_path(self.ctx.kubelet_dir, self.ctx.wall(), self.ctx.taken())
        post, name = self.ctx.post, self.name

        broadcast = self.broadcast

        def sent(g: int, count: int) -> None:
            LOG.debug("ListAndWatch sent", resource=name, generation=g, devices=count)
            version = broadcast.taken()
            if version is not None:
                post(ListSent(name, g, version))
            if count == 0:
                post(EmptyListSent(name, g))

        events = StreamEvents(
            opened=lambda g: post(StreamChanged(name, g, True)),
            closed=lambda g: post(StreamChanged(name, g, False)),
            sent=sent,
        )
        policy = lambda: self.resource.replica_policy  # noqa: E731 - read per request: a reload may change it
        prepare = lambda: (self.resource.prepare, self.resource.prepare_timeout)  # noqa: E731 - as policy
        self.pre_start_required = self.resource.pre_start_required
        servicer = DevicePluginServicer(
            self.broadcast,
            generation,
            events,
            self.ctx.metrics,
            name,
            policy,
            cdi_mode=self.ctx.cdi_mode,
            cdi_spec_dir=self.ctx.cdi_spec_dir,
            prepare=prepare,
            pre_start_required=self.pre_start_required,
            trusted=self.ctx.trusted,
        )
        server = self.ctx.servers.build(servicer, path)
        self.ctx.sockets.add(path)
        try:
            server.start()  # a thread: it cannot start under a task limit
        except BaseException:
            self.ctx.sockets.remove(path)  # bound, never served: gone before the retry makes another
            raise
        self.server, self.socket_path = server, path
        endpoint = os.path.basename(path)
        LOG.info("serving", resource=name, endpoint=endpoint, generation=generation)
        return reg.Served(generation, endpoint)

    def stop_server(self, generation: int) -> None:
        """Stop the server and remove its socket; on a failure what is left stays, for the retry to stop."""
        self.broadcast.close_generation(generation)
        if self.server is not None:
            # At shutdown the streams were just ended (close_generation): a moment's grace lets the
            # withdrawal's empty list flush to the kubelet; elsewhere the peer is gone or replaced.
            # A server whose serving thread died never reports its stop: not waited for.
            self.server.stop(grace=SHUTDOWN_GRACE if self.closing else 0).wait(0 if self.server_died else 5)
            self.server, self.server_died = None, False
        if self.socket_path:
            self.ctx.sockets.remove(self.socket_path)  # only if it is still the socket we made
        self.socket_path = None

    def socket_intact(self) -> bool:
        return self.socket_path is not None and self.ctx.sockets.intact(self.socket_path)

    def call_done(self, call: int, handle: Call, now: float) -> None:
        error = handle.error()
        late = bool(error) and handle.may_still_complete()
        handle.close()
        self.calls.pop(call, None)
        self.apply(reg.RegisterDone(call, error, late), now)

    def list_sent(self, generation: int, version: int) -> None:
        self.sent[generation] = max(version, self.sent.get(generation, -1))
        for old in [g for g in self.sent if g < generation]:
            del self.sent[old]

    def list_current(self) -> bool:
        """The current server's streams have sent the kubelet the list the broadcast holds now."""
        return self.sent.get(self.state.generation) == self.broadcast.snapshot_version()

    def sending(self) -> bool:
        """A live stream has yet to send the list the broadcast holds (its ListSent is on the way)."""
        return self.state.live_streams() > 0 and not self.list_current()

    def options_changed(self, now: float) -> None:
        """A reload changed pre_start_required: the kubelet takes options only at Register."""
        if self.resource.pre_start_required != self.pre_start_required:
            self.apply(reg.OptionsChanged(), now)

    def thread_died(self, error: str, now: float) -> None:
        """A gRPC server's serving thread ended: if it was ours, nothing answers on our socket any more."""
        self.server_died = self.server is not None
        self.apply(reg.ServerDied(error), now)

    def stream_changed(self, generation: int, opened: bool, now: float) -> None:
        self.apply(reg.StreamOpened(generation) if opened else reg.StreamClosed(generation), now)

    def advertise(self, physical: DeviceSet) -> bool:
        """Hand the list to the streams first: bookkeeping is not on the path of a change to the kubelet.

        Measured against the kubelet's 4 MiB receive limit: a list that does not fit is cut
        (deterministically, see fit_list), never sent to fail at the kubelet and end the stream.
        """
        self.fit = fit = fit_list(physical, self.resource.replicas)
        if fit.devices is not physical and not fit.dropped:  # each device `replicas` times: so are the counts
            keep_stats(fit.devices, stats_of(physical).times(self.resource.replicas))
        return self.broadcast.update(fit.devices)

    def take(self, snapshot: DeviceSnapshot, now: float, *, changed: bool | None = None) -> None:
        """A device snapshot for this resource: advertise it, then the bookkeeping (metrics, log)."""
        moved = self.advertise(snapshot.devices)
        changed = moved if changed is None else changed
        self.devices_seen(snapshot.devices, changed, snapshot.seq, snapshot.dir_present, now)

    def devices_seen(self, physical: DeviceSet, changed: bool, seq: int, dir_present: bool, now: float) -> None:
        first = not self.state.have_devices
        metrics = self.ctx.metrics
        self.listed_dir = dirpath.resolve(self.resource.device_dir)
        if changed:
            metrics.device_set_changes.labels(self.name).inc()
        if changed or first:
            advertised = self.broadcast.devices
            if metrics.per_device:  # a set of every ID: only when there are per-device series to drop
                metrics.forget_devices(self.name, set(advertised.ids))
            self._report_fit()
            # Discovery's "device set changed" line, same seq, already tells an operator of each change:
            # the plugin says so at INFO for its first set only (each line is also a supervisord wake-up).
            (LOG.info if first else LOG.debug)(
                "devices updated",
                resource=self.name,
                devices=len(physical),
                advertised=len(advertised),
                unhealthy=stats_of(physical).unhealthy,
                seq=seq,
                dir_present=dir_present,
            )
            self._warn_ignored_prepares(physical)
        self.apply(reg.DevicesSeen(), now)

    def _warn_ignored_prepares(self, physical: DeviceSet) -> None:
        """A device's prepare runs only on a resource with one (registered with pre_start_required): say so once."""
        # No pass over the set when no device names a prepare (the counts come with the set); nor an import.
        if not stats_of(physical).prepares:
            self.ignored_prepares = ()
            return
        from colad.jobs import prestart

        ignored = prestart.ignored_prepares(self.resource.prepare, physical)
        if ignored and ignored != self.ignored_prepares:
            LOG.warning(
                "device prepare ignored: the resource has no prepare, so the kubelet never calls PreStartContainer",
                resource=self.name,
                devices=len(ignored),
                first=ignored[0],
            )
        self.ignored_prepares = ignored

    def _report_fit(self) -> None:
        fit, metrics = self.fit, self.ctx.metrics
        if fit is None:
            return
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

    def restart_clock(self, now: float) -> None:
        self.state = replace(self.state, started=now)

    def close(self, now: float) -> None:
        self.closing = True
        self.apply(reg.Shutdown(), now)
        # The registration has stopped and retries nothing: what a failed effect left behind goes here.
        left: list[reg.Effect] = [reg.StopServer(self.state.generation)] if self.server or self.socket_path else []
        for effect in left + [reg.CancelCall(call) for call in self.calls]:
            self.carry_out(effect, now)

    def resource_state(self) -> ResourceState:
        advertised, state, fit = self.broadcast.devices, self.state, self.fit
        stats = stats_of(advertised)  # once per set; carried over a delta (snapshots.Receiver) and replicas
        return ResourceState(
            name=self.name,
            device_dir=self.listed_dir,
            replicas=self.resource.replicas,
            state=state.phase.value,
            registered=state.phase is reg.Phase.REGISTERED,
            endpoint=os.path.basename(self.socket_path) if self.socket_path else "",
            devices=len(advertised),
            healthy=stats.healthy,
            streams=state.live_streams(),
            open_streams=state.all_streams(),
            since=self.since,
            last_error=state.last_error,
            last_registered=self.last_registered,
            cut=ListCut(fit.size, fit.wanted, fit.dropped) if fit else ListCut(),
            have_devices=state.have_devices,
            list_sent=self.list_current() and state.live_streams() > 0,
            kubelet=state.kubelet_identity,
            pre_start_required=self.pre_start_required,
            sick=SickList.of(advertised) if stats.unhealthy else SickList(),
        )


def withdraw(
    registrars: list[ResourceRegistrar],
    events: queue.SimpleQueue[Any],
    deferred: deque[Any],
    clock: Callable[[], float],
    wait: float,
) -> None:
    """Tell the kubelet these resources' devices are gone (an empty list) before their streams end.

    Otherwise a stopped plugin leaves its devices advertised (as unhealthy) for the kubelet's
    5-minute grace period. Bounded by `wait` in all. Runs on the life-cycle thread: other
    events that arrive meanwhile go to `deferred`, in order, for its loop.
    """
    now = clock()
    for registrar in registrars:
        registrar.apply(reg.Withdraw(), now)
    waiting = {e.name for e in registrars if e.draining}
    deadline = now + wait
    while waiting and (left := deadline - clock()) > 0:
        try:
            event = events.get(timeout=left)
        except queue.Empty:
            break
        if isinstance(event, EmptyListSent) and event.resource in waiting:
            LOG.info("told the kubelet the devices are gone", resource=event.resource)
            waiting.discard(event.resource)
        else:
            deferred.append(event)
    for name in sorted(waiting):
        LOG.warning("empty device list not confirmed sent", resource=name, waited=f"{wait}s")
