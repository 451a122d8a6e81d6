"""DRA mode in the plugin process: the registration socket, the DRA service socket and this node's slices.

Reads the Config (driver, node, sockets, kubeconfig) and the device sets the plugin receives from
discovery; serves colad/dra/registration.py on <plugins_registry_dir>/<driver>-reg.sock and the DRA
services (`dra_services`) on <plugins_dir>/<driver>/dra.sock, and hands every device set to
colad/dra/publisher.py, whose threads do all API-server I/O (never the life-cycle or gRPC threads),
and to the health stream's broadcast (colad/dra/health.py).
The life-cycle thread (colad/plugin/main.py) calls start, publish, check and stop.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Mapping
from concurrent import futures

import grpc

from colad.config.config import Config
from colad.core.devices import DeviceSet
from colad.core.dra_registration import plugin_info
from colad.core.errors import ColadError
from colad.core.slices import pool_names
from colad.dra.health import MAX_HEALTH_STREAMS, HealthBroadcast, HealthService
from colad.dra.publisher import SlicePublisher
from colad.dra.registration import STOP_GRACE, RegistrationService, ensure_dir
from colad.dra.service import DraPluginService
from colad.kube.access import Credentials, from_kubeconfig, in_cluster
from colad.kube.client import KubeClient
from colad.metrics.registry import DraState, Metrics
from colad.outputs.socketpath import claim_socket_path
from colad.outputs.statefile import SliceStatus
from colad.runtime import log

TYPE_CHECKING = False  # typing is not loaded at run time: docs/DEVELOPING.md, "Import cost"
if TYPE_CHECKING:
    from typing import Protocol

    class Servable(Protocol):
        def add_to(self, server: grpc.Server) -> None: ...

        def close(self) -> None: ...


LOG = log.get(__name__)

# The kubelet calls NodePrepareResources / NodeUnprepareResources once per pod and driver, from each
# starting or ending pod's own worker, so a burst of pods is a burst of calls. CALL_WORKERS of them run at
# once (their claim reads in parallel, the rest in series: colad/dra/service.py), beside the health
# streams at their limit, each of which holds a worker for its life.
CALL_WORKERS = 8
DRA_WORKERS = MAX_HEALTH_STREAMS + CALL_WORKERS
# Calls past the workers wait for one, in order of arrival, up to this many: a refused call
# (RESOURCE_EXHAUSTED) fails the pod's sync until its next try 10 s later (kubernetes/kubernetes
# pkg/kubelet/kubelet.go backOffPeriod), so every pod of a full node (the kubelet's default maxPods, 110)
# starting at once waits instead. A call waiting past its deadline is answered at once, so the queue
# drains. Calls past this are refused, so that a flood holds bounded memory.
QUEUED_CALLS = 110
WITHDRAW_TIMEOUT = 5.0  # a mode switch waits this long for the slices to be deleted


def kube_client(cfg: Config) -> KubeClient:
    """The API server client: the kubeconfig's current context (read again when it is rewritten), else the
    pod's service account. Raises KubeconfigError naming the file and the field."""
    if cfg.kubeconfig:
        return KubeClient(Credentials(from_kubeconfig(cfg.kubeconfig), kubeconfig=cfg.kubeconfig))
    return KubeClient(Credentials(in_cluster(cfg.kube_service_host, cfg.kube_service_port)))


def dra_services(
    cfg: Config,
    client: KubeClient,
    devices: Callable[[], Mapping[str, DeviceSet]],
    metrics: Metrics,
    health: HealthBroadcast,
) -> tuple[Servable, ...]:
    """The services served on the DRA socket, each added to the server by its `add_to(server)`: the
    DRAPlugin service (v1 and v1beta1) and the health stream (v1 and v1alpha1). The claim checkpoint
    lives beside the DRA socket, in the plugin's own directory under plugins_dir, as upstream's helper
    keeps its data: it outlives a reboot, so a claim prepared before one is unprepared after it."""
    service = DraPluginService(
        driver=cfg.dra_driver_name,
        node_name=cfg.resolved_node_name,
        client=client,
        resources=cfg.resources,
        devices=devices,
        cdi_spec_dir=cfg.cdi_spec_dir,
        state_dir=os.path.dirname(cfg.dra_plugin_socket),
        metrics=metrics,
        trusted=cfg.trusted_uids,
    )
    return service, HealthService(driver=cfg.dra_driver_name, broadcast=health, metrics=metrics)


def build_dra_server(socket_path: str, services: tuple[Servable, ...]) -> grpc.Server:
    """A server bound to `socket_path` (0600, its directory made 0700 if missing), not yet started;
    raises as build_registration_server does."""
    ensure_dir(os.path.dirname(socket_path))
    claim_socket_path(socket_path)
    server = grpc.server(
        futures.ThreadPoolExecutor(max_workers=DRA_WORKERS, thread_name_prefix="dra-plugin"),
        options=[("grpc.so_reuseport", 0)],
        maximum_concurrent_rpcs=DRA_WORKERS + QUEUED_CALLS,
    )
    for service in services:
        service.add_to(server)
    if server.add_insecure_port("unix:" + socket_path) == 0:
        raise OSError(f"cannot listen on {socket_path}")
    os.chmod(socket_path, 0o600)
    return server


def _identity(path: str) -> tuple[int, int] | None:
    try:
        st = os.lstat(path)
    except OSError:
        return None
    return st.st_dev, st.st_ino


class DraHost:
    """One DRA driver served from the plugin process: start(), publish() per device-set change, check() on
    the life-cycle loop's timer and on the watcher's word, stop(withdraw=...) at the end or a mode switch.
    `on_change()` is called from the registration's and the publisher's threads when what `slices()` or
    `phase` say may have changed, so the life-cycle thread publishes it."""

    def __init__(
        self,
        cfg: Config,
        metrics: Metrics,
        *,
        client_factory: Callable[[Config], KubeClient] = kube_client,
        clock: Callable[[], float] = time.monotonic,
        on_change: Callable[[], None] = lambda: None,
    ) -> None:
        self.cfg, self.metrics, self.clock = cfg, metrics, clock
        self.on_change = on_change
        self.driver = cfg.dra_driver_name
        self.node_name = cfg.resolved_node_name
        self.plugin_socket = cfg.dra_plugin_socket
        self.registration = RegistrationService(
            plugin_info(self.driver, self.plugin_socket),
            cfg.dra_registration_socket,
            metrics,
            clock=clock,
            on_change=on_change,
        )
        self.client_factory = client_factory
        self.client: KubeClient | None = None
        self.publisher: SlicePublisher | None = None
        self.problem = ""  # why the API server or a socket is not served ("" none), said once per change
        self._devices: Mapping[str, DeviceSet] = {}  # replaced whole on each publish: read from gRPC threads
        self.health = HealthBroadcast(pool_names(self.node_name, [r.name for r in cfg.resources]))
        self._published = False  # publish() was called: the publisher has something to keep
        self._server: grpc.Server | None = None
        self._services: tuple[Servable, ...] = ()
        self._server_identity: tuple[int, int] | None = None
        self._registering = False  # registration.start() was called: from then on its check() keeps it
        metrics.add_driver(self.driver)
        metrics.dra_state = self.state

    @property
    def phase(self) -> str:
        """The registration phase (stopped, serving, registered, refused), for status and the state file."""
        return self.registration.phase.value

    def devices(self) -> Mapping[str, DeviceSet]:
        return self._devices

    def state(self) -> DraState:
        """Claims prepared and slices held now, for the metrics (read at scrape time, from its thread)."""
        status = self.slices()
        return DraState(self.driver, self.claims_prepared(), status.slices, status.current)

    def slices(self) -> SliceStatus:
        """This node's slices as the publisher knows them (none yet without an API-server client)."""
        publisher = self.publisher
        return publisher.status() if publisher is not None else SliceStatus()

    def claims_prepared(self) -> int:
        return sum(s.prepared() for s in self._services if isinstance(s, DraPluginService))

    def start(self) -> None:
        """Serve both sockets and start publishing; what fails is logged and tried again by check()."""
        self.check()

    def _say(self, problem: str) -> None:
        if problem and problem != self.problem:
            LOG.error("dra mode not fully served; trying again", driver=self.driver, problem=problem)
        elif not problem and self.problem:
            LOG.info("dra mode served again", driver=self.driver)
        self.problem = problem

    def _connect(self) -> None:
        if self.publisher is not None:
            return
        try:
            self.client = self.client_factory(self.cfg)
        except ColadError as exc:
            self._say(f"API server: {exc}")
            return
        family, writes = self.metrics.dra_api_errors, self.metrics.dra_slice_writes
        self.publisher = SlicePublisher(
            self.client,
            driver=self.driver,
            node_name=self.node_name,
            resource_names=[r.name for r in self.cfg.resources],
            count_error=lambda verb, code: family.labels(verb, code).inc(),
            count_write=lambda verb: writes.labels(self.driver, verb).inc(),
            on_change=self.on_change,
        ).start()
        if self._published:
            self.publisher.publish(self._devices)

    def _serve_plugin(self) -> None:
        if self.client is None:
            return  # the services need the API server's client
        if self._server is not None:
            if _identity(self.plugin_socket) == self._server_identity:
                return
            LOG.info("dra socket removed; serving anew", socket=self.plugin_socket)
            self._stop_plugin()
        services: tuple[Servable, ...] = ()
        try:
            services = dra_services(self.cfg, self.client, self.devices, self.metrics, self.health)
            server = build_dra_server(self.plugin_socket, services)
            server.start()
        except (ColadError, OSError, RuntimeError) as exc:
            for service in services:
                service.close()
            self._say(f"{self.plugin_socket}: {exc}")
            return
        self._server, self._server_identity, self._services = server, _identity(self.plugin_socket), services
        LOG.info("dra socket served", driver=self.driver, socket=self.plugin_socket)

    def _stop_plugin(self) -> None:
        server, self._server, self._server_identity = self._server, None, None
        services, self._services = self._services, ()
        if server is not None:
            server.stop(STOP_GRACE).wait()
        for service in services:
            service.close()

    def publish(self, device_sets: Mapping[str, DeviceSet]) -> None:
        """The device sets of every resource served, as discovery last sent them; returns at once."""
        self._devices = dict(device_sets)
        self._published = True
        self.health.update(self._devices)
        if self.publisher is not None:
            self.publisher.publish(self._devices)

    def check(self) -> None:
        """Keep everything there: the client, the DRA socket, then the registration socket (only once the
        DRA socket is served: the kubelet dials the endpoint GetInfo names at once)."""
        self._connect()
        self._serve_plugin()
        if self._server is None:
            return
        self._say("")
        if self._registering:
            self.registration.check()
            return
        self._registering = True
        try:
            self.registration.start("start")
        except (ColadError, OSError, RuntimeError) as exc:  # served again by the next check()
            LOG.error("registration socket not served; trying again", socket=self.registration.socket_path, error=exc)

    def stop(self, *, withdraw: bool) -> None:
        """Stop serving: the registration socket goes first (the kubelet deregisters the driver), then
        the DRA socket. `withdraw`: delete the slices too (a switch to device-plugin mode, another driver);
        else they stay for the kubelet's own wipe, as upstream's helper leaves them (docs/DEVELOPING.md)."""
        self.registration.stop("stop")
        self._registering = False
        self.metrics.dra_state = lambda: None  # nothing served: no gauges (a switch back must not alert)
        self._stop_plugin()
        if self.publisher is not None:
            if withdraw:
                self.publisher.withdraw(WITHDRAW_TIMEOUT)
            self.publisher.stop()
            self.publisher = None
