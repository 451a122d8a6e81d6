"""The gRPC side of the plugin: the DevicePlugin servicer, its server, and the Register call.

With device_list.py, the only module that touches protobuf types. Each RPC converts the request to
core types (the request_* functions: every field checked there, the message naming it), calls
devices/allocation, and converts back. Every method is served through rpc.py's boundary: a refusal
is a RequestError, answered INVALID_ARGUMENT or NOT_FOUND; nothing escapes as UNKNOWN.
Neighbours: colad/plugin/main.py builds servers from here and drives their life cycle.
"""

from __future__ import annotations

import functools
import logging
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from concurrent import futures
from dataclasses import dataclass

import grpc

from colad.api import deviceplugin_pb2 as pb
from colad.api import deviceplugin_pb2_grpc as pb_grpc
from colad.core import allocation, constants, trust
from colad.core.devices import DeviceSet, request_id_problem
from colad.core.errors import AllocationError, RequestError
from colad.core.names import DEFAULT_REPLICA_POLICY, DEFAULT_RESOURCE_NAME
from colad.deviceplugin.broadcast import DeviceBroadcast
from colad.deviceplugin.device_list import encoded_list
from colad.metrics.registry import Metrics
from colad.outputs import cdi
from colad.runtime import log, pathtrust, rpc

LOG = log.get(__name__)

# Streams and PreStartContainer calls beyond these are refused (RESOURCE_EXHAUSTED), so neither watchers
# (kubelet-sim, colad check...) nor prepares waiting for a turn can take every worker from Allocate: a
# refused Allocate fails the pod's admission for good, a refused PreStartContainer is retried by the
# kubelet with the container's start.
MAX_STREAMS = 4
MAX_PRE_STARTS = 6
ALLOCATE_RESERVE = 2  # workers only Allocate, GetPreferredAllocation and GetDevicePluginOptions reach
WORKERS = MAX_STREAMS + MAX_PRE_STARTS + ALLOCATE_RESERVE


def plugin_options(pre_start_required: bool) -> pb.DevicePluginOptions:
    """The options of a resource: in its Register request and from GetDevicePluginOptions, the same."""
    return pb.DevicePluginOptions(pre_start_required=pre_start_required, get_preferred_allocation_available=True)


def to_container_response(result: allocation.ContainerAllocation) -> pb.ContainerAllocateResponse:
    return pb.ContainerAllocateResponse(
        envs=result.envs,
        mounts=[
            pb.Mount(container_path=m.container_path, host_path=m.host_path, read_only=m.read_only)
            for m in result.mounts
        ],
        devices=[
            pb.DeviceSpec(container_path=n.container_path, host_path=n.host_path, permissions=n.permissions)
            for n in result.device_nodes
        ],
        annotations=result.annotations,
        cdi_devices=[pb.CDIDevice(name=name) for name in result.cdi_devices],
    )


def _encode(resource: str, result: allocation.ContainerAllocation) -> tuple[bytes, str]:
    """One container's answer as an AllocateResponse holding only it, and its log line but `check` (kept by answer)."""
    wire = pb.AllocateResponse(container_responses=[to_container_response(result)]).SerializeToString()
    fields = {
        "resource": resource,
        "devices": ",".join(result.device_ids),
        "device_nodes": len(result.device_nodes),
        "mounts": len(result.mounts),
        "cdi": len(result.cdi_devices),
    }
    return wire, log.event_line("allocate", fields) + " check="


def request_ids(field: str, values: Iterable[str]) -> tuple[str, ...]:
    """A repeated device ID field of a request, each entry an ID colad could advertise (else RequestError)."""
    ids = tuple(values)
    for index, device_id in enumerate(ids):
        problem = request_id_problem(device_id)
        if problem is not None:
            raise RequestError(f"{field}[{index}]: {problem}: {log.quote(device_id[:80])}")
    return ids


def request_allocate(request: pb.AllocateRequest) -> list[tuple[str, ...]]:
    """The device IDs of each container request, in order."""
    if not request.container_requests:
        raise AllocationError("Allocate request has no container requests")
    return [
        request_ids(f"container_requests[{i}].devices_ids", c.devices_ids)
        for i, c in enumerate(request.container_requests)
    ]


def request_preferred(request: pb.PreferredAllocationRequest) -> list[tuple[tuple[str, ...], tuple[str, ...], int]]:
    """(available, must_include, allocation_size) of each container request, in order.

    Any size is served (allocation.preferred answers best-effort: the answer is advisory); an ID that
    colad could never have advertised is refused (no kubelet sends one: it holds only IDs colad listed).
    """
    containers = []
    for i, c in enumerate(request.container_requests):
        field = f"container_requests[{i}]"
        available = request_ids(f"{field}.available_deviceIDs", c.available_deviceIDs)
        must = request_ids(f"{field}.must_include_deviceIDs", c.must_include_deviceIDs)
        containers.append((available, must, c.allocation_size))
    return containers


def request_pre_start(request: pb.PreStartContainerRequest) -> tuple[str, ...]:
    return request_ids("devices_ids", request.devices_ids)


def _is_check(context: grpc.ServicerContext) -> bool:
    return any(key == constants.CHECK_METADATA_KEY for key, _value in (context.invocation_metadata() or ()))


@dataclass
class StreamEvents:
    opened: Callable[[int], None]
    closed: Callable[[int], None]
    sent: Callable[[int, int], None]  # generation, device count


class DevicePluginServicer(pb_grpc.DevicePluginServicer):
    def __init__(
        self,
        broadcast: DeviceBroadcast,
        generation: int,
        events: StreamEvents,
        metrics: Metrics,
        resource: str = DEFAULT_RESOURCE_NAME,
        policy: Callable[[], str] = lambda: DEFAULT_REPLICA_POLICY,
        *,
        cdi_mode: Callable[[], str] = lambda: "off",
        cdi_spec_dir: Callable[[], str] = lambda: "",
        prepare: Callable[[], tuple[tuple[str, ...], float]] = lambda: ((), 0.0),  # command, timeout
        trusted: Callable[[], frozenset[int]] = lambda: trust.ROOT_ONLY,  # whose prepare programs run
        pre_start_required: bool = False,  # fixed per server: the kubelet took it at Register
    ) -> None:
        self.broadcast = broadcast
        self.cdi_mode, self.cdi_spec_dir = cdi_mode, cdi_spec_dir
        self.cdi_specs, self.cdi_notes = cdi.SpecReader(), cdi.FallbackNotes()
        self.prepare, self.trusted = prepare, trusted
        self.options = plugin_options(pre_start_required)
        self.metrics = metrics
        self.resource = resource
        self.policy = policy
        self.generation = generation
        self.events = events
        self._streams = 0
        self._pre_starts = threading.BoundedSemaphore(MAX_PRE_STARTS)
        self._lock = threading.Lock()
        self._encode = functools.partial(_encode, resource)

    def GetDevicePluginOptions(self, request: pb.Empty, context: grpc.ServicerContext) -> pb.DevicePluginOptions:
        return self.options

    def ListAndWatch(self, request: pb.Empty, context: grpc.ServicerContext) -> Iterator[bytes]:
        """Each list as the serialized ListAndWatchResponse (encoded_list: protobuf's own bytes), sent as it is."""
        with self._lock:
            if self._streams >= MAX_STREAMS:
                raise RequestError(f"at most {MAX_STREAMS} ListAndWatch streams", status="RESOURCE_EXHAUSTED")
            self._streams += 1
        context.add_callback(self.broadcast.wake)
        self.events.opened(self.generation)
        try:
            version, devices = self.broadcast.snapshot()
            yield encoded_list(devices)
            self.events.sent(self.generation, len(devices))
            while True:
                change = self.broadcast.wait_change(version, self.generation, context.is_active)
                if change is None:
                    return
                version, devices = change
                yield encoded_list(devices)
                self.events.sent(self.generation, len(devices))
        finally:
            with self._lock:
                self._streams -= 1
            self.events.closed(self.generation)

    def Allocate(self, request: pb.AllocateRequest, context: grpc.ServicerContext) -> pb.AllocateResponse:
        started = time.perf_counter()
        check = _is_check(context)
        try:
            devices = self.broadcast.devices
            # Validate every container first: a refusal must not leave half an answer counted.
            try:
                containers = request_allocate(request)
                mode = self.cdi_mode()
                # Named by CDI only if the spec discovery wrote lists it (one stat while it is unchanged).
                listed = (
                    self.cdi_specs.read(self.cdi_spec_dir(), self.resource) if mode in allocation.CDI_NAMING else None
                )
                names = None if listed is None else listed.names
                for ids in containers:
                    self._recheck_host_paths(devices, ids)
                answers = [
                    allocation.answer(
                        devices,
                        ids,
                        self._encode,
                        resource_name=self.resource,
                        cdi_mode=mode,
                        cdi_listed=names,
                    )
                    for ids in containers
                ]
            except RequestError as exc:
                not_found = isinstance(exc, AllocationError) and exc.not_found
                if check:
                    self.metrics.check_allocations.inc()
                else:
                    self.metrics.allocate_requests.labels(self.resource, "not_found" if not_found else "invalid").inc()
                LOG.warning("allocate refused", resource=self.resource, reason=str(exc), check=check)
                exc.logged = True
                raise
            # Concatenated one-container AllocateResponses are the response of all (protobuf merges repeated fields).
            response = pb.AllocateResponse.FromString(b"".join(encoded[0] for _result, encoded in answers))
            results = [result for result, _encoded in answers]
            if listed is not None:
                self._note_cdi(listed, results, check)
            for result, (_wire, line) in answers:
                if check:
                    self.metrics.check_allocations.inc()
                else:
                    self.metrics.allocated(self.resource, result.device_ids)
                # LOG.info("allocate", ...)'s line, its fields but `check` formatted once per answer (_encode).
                LOG.formatted(logging.INFO, f"{line}{log.quote(check)}")
            return response
        finally:
            self.metrics.allocate_duration.observe(time.perf_counter() - started)

    def _recheck_host_paths(self, devices: DeviceSet, ids: Iterable[str]) -> None:
        """Refuse the request if the way to a host path of a requested device became untrusted since
        discovery judged it (hostpaths.py): a swap its watches have not reported yet. One lookup per
        path (lstat of each component, measured in docs/DEVICES.md); the CDI spec names the same paths."""
        for device_id in ids:
            device = devices.get(device_id)
            if device is None:
                continue  # allocation.answer says so
            for host_path in [n.host_path for n in device.device_nodes] + [m.host_path for m in device.mounts]:
                problem = pathtrust.host_path_problem(host_path, self.trusted())
                if problem is not None:
                    self.metrics.input_rejected["untrusted_host_path"] += 1
                    raise AllocationError(f"device {device_id!r}: host path {host_path!r} {problem}")

    def _note_cdi(self, listed: cdi.Listed, results: list[allocation.ContainerAllocation], check: bool) -> None:
        """Count each answer that fell back to the classic form; one line per change of reason, one when it ends."""
        unlisted = [i for r in results for i in r.cdi_unlisted]
        named = any(n.startswith(f"{self.resource}=") for r in results for n in r.cdi_devices)
        if not unlisted and not named:
            return  # no device that could have a CDI name: nothing learnt about the spec
        reason = (listed.reason or "not_listed") if unlisted else ""
        if reason and not check:
            self.metrics.cdi_fallbacks.labels(self.resource, reason).inc()
        if not self.cdi_notes.changed(reason):
            return
        if not reason:
            LOG.info("CDI spec lists the devices again: named by CDI", resource=self.resource)
            return
        problem = listed.problem or "the spec does not list them"
        LOG.warning(
            "devices not in colad's CDI spec: answered without CDI names",
            resource=self.resource,
            reason=reason,
            problem=problem,
            devices=",".join(unlisted[:8]),
            check=check,
        )

    def GetPreferredAllocation(
        self, request: pb.PreferredAllocationRequest, context: grpc.ServicerContext
    ) -> pb.PreferredAllocationResponse:
        started = time.perf_counter()
        try:
            response = pb.PreferredAllocationResponse()
            devices, policy = self.broadcast.devices, self.policy()
            for available, must, size in request_preferred(request):
                chosen = allocation.preferred(devices, available, must, size, policy)
                response.container_responses.add(deviceIDs=chosen)
            return response
        finally:
            self.metrics.preferred_duration.observe(time.perf_counter() - started)

    def PreStartContainer(
        self, request: pb.PreStartContainerRequest, context: grpc.ServicerContext
    ) -> pb.PreStartContainerResponse:
        """Run the prepare command(s) of the container's devices; an error names the devices and the reason."""
        if not self._pre_starts.acquire(blocking=False):
            self.metrics.pre_start_requests.labels(self.resource, "busy").inc()
            raise RequestError(
                f"at most {MAX_PRE_STARTS} PreStartContainer calls at once; the kubelet retries the start",
                status="RESOURCE_EXHAUSTED",
            )
        try:
            return self._pre_start(request, context)
        finally:
            self._pre_starts.release()

    def _pre_start(
        self, request: pb.PreStartContainerRequest, context: grpc.ServicerContext
    ) -> pb.PreStartContainerResponse:
        from colad.jobs import prestart

        started = time.perf_counter()
        command, timeout = self.prepare()
        requested = request_pre_start(request)
        try:
            steps = prestart.plan(self.resource, command, self.broadcast.devices, requested)
        except prestart.UnknownDevice as exc:
            self.metrics.pre_start_requests.labels(self.resource, "not_found").inc()
            LOG.warning("prepare refused", resource=self.resource, device=str(exc), reason="unknown device")
            raise RequestError(
                f"PreStartContainer: unknown device {str(exc)!r}", status="NOT_FOUND", logged=True
            ) from None
        # The kubelet's own deadline (30 s) may be nearer than ours when it has waited for a turn.
        remaining = context.time_remaining()
        budget = timeout if remaining is None else min(timeout, remaining - prestart.ANSWER_MARGIN)
        deadline = time.monotonic() + budget
        for step in steps:
            result = prestart.run(step, max(0.0, deadline - time.monotonic()), self.trusted())
            if result.leftovers:
                LOG.warning(
                    "prepare left processes running; killed",
                    resource=self.resource,
                    command=step.argv[0],
                    killed=result.leftovers,
                )
            if not result.ok:
                outcome = "timeout" if result.timed_out else "failed"
                if result.refused:
                    self.metrics.input_rejected["untrusted_program"] += 1
                self.metrics.pre_start_requests.labels(self.resource, outcome).inc()
                devices = ",".join(step.device_ids)
                LOG.warning(
                    "prepare failed",
                    resource=self.resource,
                    devices=devices,
                    command=step.argv[0],
                    reason=result.reason,
                )
                message = f"prepare command {step.argv[0]} failed for device {devices}: {result.reason}"
                raise RequestError(message, status="FAILED_PRECONDITION", logged=True)
        self.metrics.pre_start_requests.labels(self.resource, "success").inc()
        LOG.info(
            "prepared",
            resource=self.resource,
            devices=",".join(requested),
            commands=len(steps),
            seconds=f"{time.perf_counter() - started:.3f}",
        )
        return pb.PreStartContainerResponse()


DEVICE_PLUGIN_SERVICE = pb.DESCRIPTOR.services_by_name["DevicePlugin"]
# Served with no serializer: its lists are bytes already (encoded_list). A serializer would parse each into
# a message and serialize it again: ~2 ms of the stream thread per change at 10,000 devices.
SENT_AS_ENCODED = ("ListAndWatch",)


class Workers(futures.ThreadPoolExecutor):
    """gRPC's worker pool, where a thread that cannot be started leaves the call queued instead of failing.

    grpc's server thread submits every call here; an exception from submit() (RuntimeError "can't start
    new thread" at a task limit) would end that thread and with it every call the server gets. The call
    is queued before the pool starts a thread for it, so it runs on the next free worker, or on the thread
    the next submit() starts. Overrides the executor's one thread-starting step (CPython 3.8 to 3.13).
    """

    def __init__(self, max_workers: int, thread_name_prefix: str) -> None:
        super().__init__(max_workers=max_workers, thread_name_prefix=thread_name_prefix)
        self.start_failures = 0

    def _adjust_thread_count(self) -> None:
        try:
            super()._adjust_thread_count()  # type: ignore[misc]
        except RuntimeError as exc:
            self.start_failures += 1
            if self.start_failures == 1 or self.start_failures % 100 == 0:
                LOG.warning(
                    "gRPC worker not started; the call waits for a free one",
                    error=str(exc),
                    workers=len(self._threads),
                    failures=self.start_failures,
                )


def build_server(servicer: DevicePluginServicer, socket_path: str) -> grpc.Server:
    """A server bound to `socket_path`, not yet started; every method of the service through rpc.handlers."""
    served = rpc.handlers(
        DEVICE_PLUGIN_SERVICE,
        servicer,
        pb,
        servicer.metrics.rpc_errors,
        raw=SENT_AS_ENCODED,
        fields={"resource": servicer.resource},
    )
    server = grpc.server(
        Workers(WORKERS, "grpc"),
        handlers=[served],
        options=[("grpc.so_reuseport", 0)],
        # Calls past this are refused (RESOURCE_EXHAUSTED), never queued without bound behind busy workers.
        maximum_concurrent_rpcs=WORKERS,
    )
    if server.add_insecure_port("unix:" + socket_path) == 0:
        raise OSError(f"cannot listen on {socket_path}")
    return server


class RegisterCall:
    """One Register call in flight; the lifecycle thread owns it and closes it."""

    def __init__(
        self, kubelet_socket: str, endpoint: str, resource_name: str, timeout: float, pre_start_required: bool = False
    ) -> None:
        self.channel = grpc.insecure_channel("unix:" + kubelet_socket)
        stub = pb_grpc.RegistrationStub(self.channel)
        request = pb.RegisterRequest(
            version=constants.VERSION,
            endpoint=endpoint,
            resource_name=resource_name,
            options=plugin_options(pre_start_required),
        )
        # Fail fast when nobody listens: kubelet.sock appearing is reported by the watcher.
        try:
            self.future = stub.Register.future(request, timeout=timeout, wait_for_ready=False)
        except BaseException:  # e.g. the thread that waits for the answer cannot start: the channel goes too
            self.channel.close()
            raise

    def add_done_callback(self, callback: Callable[[], None]) -> None:
        self.future.add_done_callback(lambda _f: callback())

    def error(self) -> str | None:
        """None when Register succeeded, else the kubelet's (or the transport's) reason."""
        try:
            self.future.result(timeout=0)
        except grpc.RpcError as exc:
            return f"{exc.code().name}: {exc.details()}"  # type: ignore[attr-defined]
        except (futures.CancelledError, grpc.FutureCancelledError):
            return "cancelled"
        except Exception as exc:  # the boundary: whatever grpc raised, it is a failed Register
            return repr(exc)
        return None

    def may_still_complete(self) -> bool:
        """True when the kubelet may yet act on this call (we gave up waiting, it did not refuse).

        The kubelet goes on with a Register whose caller has gone: it dials the
        endpoint and opens a ListAndWatch stream. Serving again on the same socket
        would then leave it holding two streams to us.
        """
        try:
            self.future.result(timeout=0)
        except grpc.RpcError as exc:
            return exc.code() in (grpc.StatusCode.DEADLINE_EXCEEDED, grpc.StatusCode.CANCELLED)  # type: ignore[attr-defined]
        except Exception:
            return True
        return False

    def cancel(self) -> None:
        self.future.cancel()

    def close(self) -> None:
        self.channel.close()
