"""The DRA driver's registration with the kubelet's plugin watcher: the Registration service and its socket.

The kubelet finds <plugins_registry_dir>/<driver>-reg.sock, calls GetInfo (answered from
colad/core/dra_registration.py) and then NotifyRegistrationStatus. A refusal is logged and counted, and
the socket is made anew after a back-off so that the kubelet tries again; a socket removed or replaced
is made anew at once. A server is built (bound) separately from started, and never on a path where
something answers. Neighbours: colad/runtime/rpc.py (the RPC boundary), colad/outputs/socketpath.py
(the stale-socket rule); the process hosting this calls `check()` from its loop.
"""

from __future__ import annotations

import enum
import os
import stat
import threading
import time
from collections.abc import Callable
from concurrent import futures
from dataclasses import dataclass

import grpc

from colad.api import pluginregistration_pb2 as regpb
from colad.api import pluginregistration_pb2_grpc as regpb_grpc
from colad.core.dra_registration import PluginInfo, retry_delay
from colad.core.errors import ColadError
from colad.metrics.registry import Metrics
from colad.outputs.socketpath import claim_socket_path
from colad.runtime import log, rpc

LOG = log.get(__name__)

REGISTRATION_SERVICE = regpb.DESCRIPTOR.services_by_name["Registration"]
# The kubelet makes one call at a time per socket (GetInfo, then NotifyRegistrationStatus); a second
# kubelet (a restart racing the old one) or a probe may add one more.
REGISTRATION_WORKERS = 2
STOP_GRACE = 1.0  # seconds a call in flight may finish when the server stops


class RegistrationPhase(enum.Enum):
    STOPPED = "stopped"
    SERVING = "serving"  # the socket is there; the kubelet has not said how its registration went
    REGISTERED = "registered"  # the kubelet's last word: registered
    REFUSED = "refused"  # the kubelet's last word: refused; the socket is made anew at retry_at


@dataclass(frozen=True)
class Status:
    """One NotifyRegistrationStatus, as the kubelet sent it."""

    registered: bool
    error: str


class RegistrationServicer(regpb_grpc.RegistrationServicer):
    """GetInfo answers `info`; NotifyRegistrationStatus hands the status on and always answers: a refusal
    is the kubelet's news, not a failed call."""

    def __init__(self, info: PluginInfo, on_status: Callable[[Status], None]) -> None:
        self.info = info
        self.on_status = on_status

    def GetInfo(self, request: regpb.InfoRequest, context: grpc.ServicerContext) -> regpb.PluginInfo:  # noqa: N802
        return regpb.PluginInfo(
            type=self.info.type,
            name=self.info.name,
            endpoint=self.info.endpoint,
            supported_versions=list(self.info.supported_versions),
        )

    def NotifyRegistrationStatus(  # noqa: N802
        self, request: regpb.RegistrationStatus, context: grpc.ServicerContext
    ) -> regpb.RegistrationStatusResponse:
        self.on_status(Status(request.plugin_registered, request.error))
        return regpb.RegistrationStatusResponse()


def ensure_dir(path: str) -> None:
    """Make `path` root-only (0700) if it is missing; an existing directory is the kubelet's and stays as it is."""
    if os.path.isdir(path):
        return
    os.makedirs(path, mode=0o700, exist_ok=True)
    os.chmod(path, 0o700)


def build_registration_server(servicer: RegistrationServicer, socket_path: str, metrics: Metrics) -> grpc.Server:
    """A server bound to `socket_path` (0600, its directory made 0700 if missing), not yet started.

    Raises InstanceError when something answers at the path (gRPC would unlink it and take its
    place), ForeignPathError when the path holds anything but a dead socket of ours, OSError when
    it cannot be bound.
    """
    ensure_dir(os.path.dirname(socket_path))
    claim_socket_path(socket_path)
    served = rpc.handlers(
        REGISTRATION_SERVICE, servicer, regpb, metrics.rpc_errors, fields={"driver": servicer.info.name}
    )
    server = grpc.server(
        futures.ThreadPoolExecutor(max_workers=REGISTRATION_WORKERS, thread_name_prefix="dra-registration"),
        handlers=[served],
        options=[("grpc.so_reuseport", 0)],
        maximum_concurrent_rpcs=REGISTRATION_WORKERS,
    )
    if server.add_insecure_port("unix:" + socket_path) == 0:
        raise OSError(f"cannot listen on {socket_path}")
    os.chmod(socket_path, 0o600)
    return server


def _identity(path: str) -> tuple[int, int] | None:
    try:
        st = os.lstat(path)
    except OSError:
        return None
    return (st.st_dev, st.st_ino) if stat.S_ISSOCK(st.st_mode) else None


class RegistrationService:
    """The registration socket of one driver and its life cycle: start, stop, and `check()` to keep it there.

    `registered` and `refused` count the kubelet's answers. Statuses arrive on gRPC threads; every
    server start and stop happens on the caller's thread (start, stop, check), never on a gRPC one.
    `on_change()` is called on the gRPC thread after each status, so the host can publish the new phase.
    """

    def __init__(
        self,
        info: PluginInfo,
        socket_path: str,
        metrics: Metrics,
        *,
        clock: Callable[[], float] = time.monotonic,
        on_change: Callable[[], None] = lambda: None,
    ) -> None:
        self.info, self.socket_path, self.metrics, self.clock = info, socket_path, metrics, clock
        self.on_change = on_change
        self.servicer = RegistrationServicer(info, self._notified)
        self.phase = RegistrationPhase.STOPPED
        self.registered = 0
        self.refused = 0
        self.last_error = ""
        self.retry_at: float | None = None
        self._refusals_in_a_row = 0
        self._server: grpc.Server | None = None
        self._identity: tuple[int, int] | None = None
        self._wanted = False  # between start() and stop(): check() keeps a socket there
        self.serve_problem = ""  # why the last attempt to serve again failed ("" = it did not)
        self._lock = threading.Lock()

    def start(self, reason: str = "start") -> None:
        """Build and start the server; raises as build_registration_server does, leaving the service stopped
        (the caller decides whether a first failure is worth an exit). From then on check() keeps it there."""
        self._wanted = True
        self._serve(reason)

    def _serve(self, reason: str) -> None:
        server = build_registration_server(self.servicer, self.socket_path, self.metrics)
        try:
            server.start()
        except BaseException:
            server.stop(None)
            raise
        with self._lock:
            self._server, self._identity, self.retry_at = server, _identity(self.socket_path), None
            self._transition(RegistrationPhase.SERVING, reason)

    def stop(self, reason: str = "stop") -> None:
        """Stop serving; gRPC removes the socket, so the kubelet deregisters the driver."""
        self._wanted = False
        self._halt(reason)

    def _halt(self, reason: str) -> None:
        with self._lock:
            server, self._server, self._identity, self.retry_at = self._server, None, None, None
            if server is None:
                return
            self._transition(RegistrationPhase.STOPPED, reason)
        server.stop(STOP_GRACE).wait()

    def restart(self, reason: str) -> None:
        """Serve on a new socket; a failure is logged and tried again by the next check(), never raised."""
        self._halt(reason)
        try:
            self._serve(reason)
        except (ColadError, OSError, RuntimeError) as exc:  # a foreign file or live socket there, a full disk...
            if str(exc) != self.serve_problem:
                LOG.error("registration socket not served; trying again", socket=self.socket_path, error=str(exc))
            self.serve_problem = str(exc)
            return
        self.serve_problem = ""

    def intact(self) -> bool:
        """Is our socket still at its path (not removed, not replaced)?"""
        with self._lock:
            return self._identity is not None and _identity(self.socket_path) == self._identity

    def check(self) -> None:
        """Make the socket anew if it was removed or replaced, or when a refusal's back-off is over."""
        if not self._wanted:
            return
        with self._lock:
            serving = self._server is not None
            due = self.retry_at is not None and self.clock() >= self.retry_at
        if not serving:
            self.restart("not serving")
        elif not self.intact():
            self.restart("socket removed")
        elif due:
            self.restart("registration refused")

    def _on_status(self, status: Status) -> None:
        with self._lock:
            if status.registered:
                self.registered += 1
                self._refusals_in_a_row, self.last_error, self.retry_at = 0, "", None
                self._transition(RegistrationPhase.REGISTERED, "the kubelet registered the driver")
                return
            self.refused += 1
            self.metrics.dra_registration_refusals.labels(self.info.name).inc()
            self._refusals_in_a_row += 1
            delay = retry_delay(self._refusals_in_a_row)
            self.last_error, self.retry_at = status.error, self.clock() + delay
            LOG.warning(
                "registration refused by the kubelet; registering again",
                driver=self.info.name,
                error=status.error,
                refused=self.refused,
                retry_in=f"{delay:g}s",
            )
            self._transition(RegistrationPhase.REFUSED, "the kubelet refused the registration")

    def _notified(self, status: Status) -> None:
        self._on_status(status)
        self.on_change()

    def _transition(self, phase: RegistrationPhase, reason: str) -> None:
        if phase is not self.phase:
            LOG.info(
                "dra registration",
                driver=self.info.name,
                phase=phase.value,
                was=self.phase.value,
                reason=reason,
                socket=self.socket_path,
            )
        self.phase = phase
