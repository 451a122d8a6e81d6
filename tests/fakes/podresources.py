"""A strict fake of the kubelet's PodResources server (v1), for tests of the in-use view.

Serves v1.PodResourcesLister on a Unix socket with a view the test sets (`assign`, `release`).
Written from kubernetes/kubelet pkg/apis/podresources/v1/api.proto and kubernetes/kubernetes
pkg/kubelet/apis/podresources (server_v1.go: List answers every active pod with each container,
devices grouped by resource; GetAllocatableResources answers UNIMPLEMENTED on kubelets before 1.23;
constants.go + grpc/ratelimit.go: a token bucket of 100 calls/s, burst 10, RESOURCE_EXHAUSTED
"rejected by rate limit"). A client that calls without a deadline is recorded in `violations`.
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from concurrent import futures
from pathlib import Path

import grpc

from colad.api import podresources_pb2 as pb
from colad.api import podresources_pb2_grpc as pb_grpc

# kubernetes/kubernetes pkg/kubelet/apis/podresources/constants.go
DEFAULT_QPS = 100
DEFAULT_BURST_TOKENS = 10


class _Servicer(pb_grpc.PodResourcesListerServicer):
    def __init__(self, fake: FakePodResources) -> None:
        self._fake = fake

    def List(
        self,
        request: pb.ListPodResourcesRequest,
        context: grpc.ServicerContext,  # noqa: N802
    ) -> pb.ListPodResourcesResponse:
        self._fake._admit("List", context)
        return self._fake._list()

    def GetAllocatableResources(
        self,
        request: pb.AllocatableResourcesRequest,  # noqa: N802
        context: grpc.ServicerContext,
    ) -> pb.AllocatableResourcesResponse:
        self._fake._admit("GetAllocatableResources", context)
        if not self._fake.allocatable:  # the generated servicer's answer, as a kubelet < 1.23 gives it
            context.abort(
                grpc.StatusCode.UNIMPLEMENTED,
                "unknown method GetAllocatableResources for service v1.PodResourcesLister",
            )
        return self._fake._allocatable()


class FakePodResources:
    """The kubelet's PodResources endpoint with a settable view; `calls` counts the RPCs by name."""

    def __init__(self, socket_path: str | Path, *, allocatable: bool = True) -> None:
        self.socket_path = Path(socket_path)
        self.allocatable = allocatable
        self._lock = threading.Lock()
        # (namespace, pod) -> container -> resource -> device IDs; dicts keep insertion order, like pod lists
        self._pods: dict[tuple[str, str], dict[str, dict[str, list[str]]]] = {}
        self._allocatable_devices: dict[str, list[str]] = {}
        self._calls: Counter[str] = Counter()
        self._violations: list[str] = []
        self._tokens = float(DEFAULT_BURST_TOKENS)
        self._refilled = time.monotonic()
        self._server: grpc.Server | None = None

    # ---- life cycle ----
    def start(self) -> None:
        if self._server is not None:
            raise RuntimeError("fake pod resources already started")
        self.socket_path.parent.mkdir(mode=0o750, parents=True, exist_ok=True)
        self.socket_path.unlink(missing_ok=True)  # the kubelet removes a stale socket before it listens
        server = grpc.server(futures.ThreadPoolExecutor(max_workers=4, thread_name_prefix="fake-podresources"))
        pb_grpc.add_PodResourcesListerServicer_to_server(_Servicer(self), server)  # type: ignore[no-untyped-call]
        if not server.add_insecure_port("unix:" + str(self.socket_path)):
            raise RuntimeError(f"cannot listen on {self.socket_path}")
        server.start()
        self._server = server

    def stop(self) -> None:
        server, self._server = self._server, None
        if server is not None:
            server.stop(grace=None).wait(5)
        self.socket_path.unlink(missing_ok=True)

    def __enter__(self) -> FakePodResources:
        self.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    # ---- the view ----
    def assign(self, namespace: str, pod: str, container: str, resource: str, device_ids: list[str]) -> None:
        """Give `container` of pod `namespace/pod` these devices of `resource` (added to what it has)."""
        with self._lock:
            held = self._pods.setdefault((namespace, pod), {}).setdefault(container, {}).setdefault(resource, [])
            held.extend(i for i in device_ids if i not in held)

    def add_container(self, namespace: str, pod: str, container: str) -> None:
        """A container without devices: List still names it, with an empty device list."""
        with self._lock:
            self._pods.setdefault((namespace, pod), {}).setdefault(container, {})

    def release(self, namespace: str, pod: str, container: str | None = None) -> None:
        """The pod ends (container None) or one container of it stops holding devices."""
        with self._lock:
            if container is None:
                self._pods.pop((namespace, pod), None)
            elif (namespace, pod) in self._pods:
                self._pods[(namespace, pod)].pop(container, None)

    def set_allocatable(self, resource: str, device_ids: list[str]) -> None:
        with self._lock:
            self._allocatable_devices[resource] = list(device_ids)

    # ---- observations ----
    @property
    def calls(self) -> Counter[str]:
        with self._lock:
            return Counter(self._calls)

    @property
    def violations(self) -> list[str]:
        with self._lock:
            return list(self._violations)

    # ---- serving ----
    def _admit(self, method: str, context: grpc.ServicerContext) -> None:
        with self._lock:
            self._calls[method] += 1
            if context.time_remaining() is None:
                self._violations.append(f"{method} called without a deadline")
            now = time.monotonic()
            self._tokens = min(float(DEFAULT_BURST_TOKENS), self._tokens + (now - self._refilled) * DEFAULT_QPS)
            self._refilled = now
            limited = self._tokens < 1
            if not limited:
                self._tokens -= 1
        if limited:
            context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, "rejected by rate limit")

    def _list(self) -> pb.ListPodResourcesResponse:
        with self._lock:
            return pb.ListPodResourcesResponse(
                pod_resources=[
                    pb.PodResources(
                        name=pod,
                        namespace=namespace,
                        containers=[
                            pb.ContainerResources(
                                name=container,
                                devices=[
                                    pb.ContainerDevices(resource_name=resource, device_ids=ids)
                                    for resource, ids in resources.items()
                                    if ids
                                ],
                            )
                            for container, resources in containers.items()
                        ],
                    )
                    for (namespace, pod), containers in self._pods.items()
                ]
            )

    def _allocatable(self) -> pb.AllocatableResourcesResponse:
        with self._lock:
            return pb.AllocatableResourcesResponse(
                devices=[
                    pb.ContainerDevices(resource_name=resource, device_ids=ids)
                    for resource, ids in self._allocatable_devices.items()
                ]
            )
