"""`colad kubelet-sim`: a kubelet stand-in for demos and for checking a plugin socket by hand.

Serves Registration on <kubelet_dir>/kubelet.sock; like the kubelet since 1.25 it dials the plugin
for its options before answering Register, then follows ListAndWatch and may Allocate once. It
never takes over a live kubelet.sock. --json prints one JSON object per step on stdout, ending in
{"event": "exit", ...}. Exit 0: --once done or signalled; 1: Allocate refused, timeout, or taken.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import sys
import threading
import time
from concurrent import futures
from typing import Any, NoReturn

import grpc

from colad.api import deviceplugin_pb2 as pb
from colad.api import deviceplugin_pb2_grpc as pb_grpc
from colad.config.config import Config
from colad.core import constants
from colad.core.errors import InstanceError, RequestError
from colad.core.names import resource_name_problem
from colad.metrics.registry import Metrics
from colad.outputs.socketpath import claim_socket_path
from colad.runtime import log, rpc

LOG = log.get(__name__)


class Simulator(pb_grpc.RegistrationServicer):
    """The kubelet's side of registration: checks a Register as the kubelet does, then follows the plugin."""

    def __init__(self, cfg: Config, allocate: int, once: bool, json_out: bool = False) -> None:
        self.cfg = cfg
        self.allocate_count = allocate
        self.once = once
        self.json_out = json_out
        self.done = threading.Event()
        self.result = 1
        self.reason = ""
        self._print_lock = threading.Lock()

    def emit(self, event: str, **fields: Any) -> None:
        """One JSON line on stdout with --json; the log lines say the same for people."""
        if not self.json_out:
            return
        line = json.dumps({"event": event, **fields}, sort_keys=True)
        with self._print_lock:
            print(line, flush=True)

    def Register(self, request: pb.RegisterRequest, context: grpc.ServicerContext) -> pb.Empty:
        LOG.info("register request", resource=request.resource_name, endpoint=request.endpoint, version=request.version)
        seen = {"resource": request.resource_name, "endpoint": request.endpoint, "version": request.version}
        if request.version not in constants.SUPPORTED_VERSIONS:
            self.refuse(context, seen, f"requested API version {request.version!r} is not supported")
        problem = resource_name_problem(request.resource_name)
        if problem:
            self.refuse(context, seen, f"the ResourceName {request.resource_name!r} is invalid: {problem}")
        path = os.path.join(self.cfg.kubelet_dir, request.endpoint)
        channel = grpc.insecure_channel("unix:" + path)
        try:
            grpc.channel_ready_future(channel).result(timeout=constants.KUBELET_DIAL_TIMEOUT_S)
            options = pb_grpc.DevicePluginStub(channel).GetDevicePluginOptions(pb.Empty(), timeout=10)
        except (grpc.FutureTimeoutError, grpc.RpcError) as exc:
            channel.close()
            self.refuse(context, seen, f"failed to dial device plugin: {exc}")
        LOG.info(
            "plugin options",
            pre_start_required=options.pre_start_required,
            get_preferred_allocation_available=options.get_preferred_allocation_available,
        )
        self.emit("register", ok=True, error="", **seen)
        self.emit(
            "options",
            endpoint=request.endpoint,
            pre_start_required=options.pre_start_required,
            get_preferred_allocation_available=options.get_preferred_allocation_available,
        )
        threading.Thread(target=self.follow, args=(channel, request.endpoint), daemon=True).start()
        return pb.Empty()

    def refuse(self, context: grpc.ServicerContext, seen: dict[str, str], error: str) -> NoReturn:
        LOG.warning("register refused", error=error, **seen)
        self.emit("register", ok=False, error=error, **seen)
        raise RequestError(error, status="UNKNOWN", logged=True)  # the kubelet's Register errors are UNKNOWN

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
                self.emit(
                    "devices", endpoint=endpoint, devices=[{"id": d.ID, "health": d.health} for d in response.devices]
                )
                if not allocated and self.allocate_count > 0 and len(healthy) >= self.allocate_count:
                    allocated = True
                    self.allocate(stub, healthy[: self.allocate_count])
                elif self.once and self.allocate_count == 0:
                    self.finish(0, "device list received")
        except grpc.RpcError as exc:
            LOG.info("ListAndWatch ended", endpoint=endpoint, code=exc.code().name)  # type: ignore[attr-defined]
            self.emit("stream_end", endpoint=endpoint, code=exc.code().name)  # type: ignore[attr-defined]
        finally:
            channel.close()

    def allocate(self, stub: Any, ids: list[str]) -> None:
        request = pb.AllocateRequest(container_requests=[pb.ContainerAllocateRequest(devices_ids=ids)])
        try:
            response = stub.Allocate(request, timeout=10)
        except grpc.RpcError as exc:
            LOG.error("allocate failed", devices=",".join(ids), code=exc.code().name, detail=exc.details())
            self.emit("allocate", devices=ids, ok=False, code=exc.code().name, error=exc.details() or "")
            self.finish(1, "allocate refused")
            return
        for container in response.container_responses:
            envs = " ".join(f"{k}={v}" for k, v in sorted(container.envs.items()))
            LOG.info("allocate answer", devices=",".join(ids), envs=envs)
        self.emit("allocate", devices=ids, ok=True, envs=[dict(c.envs) for c in response.container_responses])
        self.finish(0, "allocate answered")

    def finish(self, result: int, reason: str) -> None:
        if self.once:
            self.result = result
            self.reason = reason
            self.done.set()


def main(args: Any = None, cfg: Config | None = None) -> int:
    assert cfg is not None
    json_out = bool(getattr(args, "json", False))
    log.setup("kubelet-sim", cfg.log_level)
    if json_out:  # stdout carries only the JSON lines
        for handler in logging.getLogger().handlers:
            if isinstance(handler, logging.StreamHandler):
                handler.setStream(sys.stderr)
    sim = Simulator(cfg, getattr(args, "allocate", 1), getattr(args, "once", False), json_out)
    os.makedirs(cfg.kubelet_dir, mode=0o750, exist_ok=True)
    try:
        claim_socket_path(cfg.kubelet_socket)
    except InstanceError as exc:
        LOG.error("refusing to start", reason=str(exc))
        sim.emit("exit", code=1, reason=f"refusing to start: {exc}")
        return 1
    registration = rpc.handlers(pb.DESCRIPTOR.services_by_name["Registration"], sim, pb, Metrics().rpc_errors)
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4), handlers=[registration])
    server.add_insecure_port("unix:" + cfg.kubelet_socket)
    server.start()
    LOG.info("kubelet simulator listening", socket=cfg.kubelet_socket)
    sim.emit("listening", socket=cfg.kubelet_socket)
    stop = threading.Event()
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, lambda *_: stop.set())
    timeout = getattr(args, "timeout", 0.0) or None
    deadline = None if timeout is None else time.monotonic() + timeout
    timed_out = False
    while not stop.is_set() and not sim.done.is_set():
        left = None if deadline is None else deadline - time.monotonic()
        if left is not None and left <= 0:
            LOG.error("nothing happened in time")
            timed_out = True
            break
        stop.wait(0.2 if left is None else min(0.2, left))
    server.stop(grace=1).wait(2)
    try:
        os.unlink(cfg.kubelet_socket)
    except FileNotFoundError:
        pass
    LOG.info("kubelet simulator stopped")
    if sim.done.is_set():
        code, reason = sim.result, sim.reason
    elif stop.is_set():
        code, reason = 0, "stopped by a signal"
    else:
        code, reason = 1, f"nothing happened within {timeout:g} s" if timed_out else "stopped"
    sim.emit("exit", code=code, reason=reason)
    return code
