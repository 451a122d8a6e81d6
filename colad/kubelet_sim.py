"""`colad kubelet-sim`: a kubelet stand-in for demos and for checking a plugin socket by hand.

Serves the kubelet's Registration service on <kubelet_dir>/kubelet.sock and,
like the real kubelet since 1.25, dials the plugin and asks for its options
before answering Register, then follows ListAndWatch and (optionally) calls
Allocate once, printing every step. It refuses to take over a live
kubelet.sock, so it is harmless next to a real kubelet.
"""

from __future__ import annotations

import os
import signal
import threading
from concurrent import futures
from typing import Any

import grpc

from colad import constants, log
from colad.api import deviceplugin_pb2 as pb
from colad.api import deviceplugin_pb2_grpc as pb_grpc
from colad.config import Config, resource_name_problem
from colad.errors import InstanceError
from colad.queue import claim_socket_path

LOG = log.get(__name__)


class Simulator(pb_grpc.RegistrationServicer):
    def __init__(self, cfg: Config, allocate: int, once: bool) -> None:
        self.cfg = cfg
        self.allocate_count = allocate
        self.once = once
        self.done = threading.Event()
        self.result = 1

    def Register(self, request: pb.RegisterRequest, context: grpc.ServicerContext) -> pb.Empty:
        LOG.info("register request", resource=request.resource_name, endpoint=request.endpoint, version=request.version)
        if request.version not in constants.SUPPORTED_VERSIONS:
            context.abort(grpc.StatusCode.UNKNOWN, f"requested API version {request.version!r} is not supported")
        problem = resource_name_problem(request.resource_name)
        if problem:
            context.abort(grpc.StatusCode.UNKNOWN, f"the ResourceName {request.resource_name!r} is invalid: {problem}")
        path = os.path.join(self.cfg.kubelet_dir, request.endpoint)
        channel = grpc.insecure_channel("unix:" + path)
        try:
            grpc.channel_ready_future(channel).result(timeout=constants.KUBELET_DIAL_TIMEOUT_S)
            options = pb_grpc.DevicePluginStub(channel).GetDevicePluginOptions(pb.Empty(), timeout=10)
        except (grpc.FutureTimeoutError, grpc.RpcError) as exc:
            channel.close()
            context.abort(grpc.StatusCode.UNKNOWN, f"failed to dial device plugin: {exc}")
        LOG.info(
            "plugin options",
            pre_start_required=options.pre_start_required,
            get_preferred_allocation_available=options.get_preferred_allocation_available,
        )
        threading.Thread(target=self.follow, args=(channel, request.endpoint), daemon=True).start()
        return pb.Empty()

    def follow(self, channel: grpc.Channel, endpoint: str) -> None:
        stub = pb_grpc.DevicePluginStub(channel)
        allocated = False
        try:
            for response in stub.ListAndWatch(pb.Empty()):
                ids = [d.ID for d in response.devices]
                healthy = [d.ID for d in response.devices if d.health == constants.HEALTHY]
                LOG.info(
                    "device list", endpoint=endpoint, count=len(ids), healthy=len(healthy), devices=",".join(ids) or "-"
                )
                if not allocated and self.allocate_count > 0 and len(healthy) >= self.allocate_count:
                    allocated = True
                    self.allocate(stub, healthy[: self.allocate_count])
                elif self.once and self.allocate_count == 0:
                    self.finish(0)
        except grpc.RpcError as exc:
            LOG.info("ListAndWatch ended", endpoint=endpoint, code=exc.code().name)  # type: ignore[attr-defined]
        finally:
            channel.close()

    def allocate(self, stub: Any, ids: list[str]) -> None:
        request = pb.AllocateRequest(container_requests=[pb.ContainerAllocateRequest(devices_ids=ids)])
        try:
            response = stub.Allocate(request, timeout=10)
        except grpc.RpcError as exc:
            LOG.error("allocate failed", devices=",".join(ids), code=exc.code().name, detail=exc.details())
            self.finish(1)
            return
        for container in response.container_responses:
            envs = " ".join(f"{k}={v}" for k, v in sorted(container.envs.items()))
            LOG.info("allocate answer", devices=",".join(ids), envs=envs)
        self.finish(0)

    def finish(self, result: int) -> None:
        if self.once:
            self.result = result
            self.done.set()


def main(args: Any = None, cfg: Config | None = None) -> int:
    assert cfg is not None
    log.setup("kubelet-sim", cfg.log_level)
    os.makedirs(cfg.kubelet_dir, mode=0o750, exist_ok=True)
    try:
        claim_socket_path(cfg.kubelet_socket)
    except InstanceError as exc:
        LOG.error("refusing to start", reason=str(exc))
        return 1
    sim = Simulator(cfg, getattr(args, "allocate", 1), getattr(args, "once", False))
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
    pb_grpc.add_RegistrationServicer_to_server(sim, server)
    server.add_insecure_port("unix:" + cfg.kubelet_socket)
    server.start()
    LOG.info("kubelet simulator listening", socket=cfg.kubelet_socket)
    stop = threading.Event()
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, lambda *_: stop.set())
    timeout = getattr(args, "timeout", 0.0) or None
    while not stop.is_set() and not sim.done.is_set():
        stop.wait(0.2 if timeout is None else min(0.2, timeout))
        if timeout is not None:
            timeout -= 0.2
            if timeout <= 0:
                LOG.error("nothing happened in time")
                break
    server.stop(grace=1).wait(2)
    try:
        os.unlink(cfg.kubelet_socket)
    except FileNotFoundError:
        pass
    LOG.info("kubelet simulator stopped")
    return sim.result if sim.done.is_set() else (0 if stop.is_set() else 1)
