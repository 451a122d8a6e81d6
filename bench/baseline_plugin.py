"""The single-process device plugin colad is measured against: the obvious way to write one.

One process: a grpcio DevicePlugin server on a Unix socket in the kubelet directory, a pyinotify
ThreadedNotifier on the device and kubelet directories, the full list on every change, COLA_DEVICES
from Allocate (one log line each, as colad), and a fresh server plus Register whenever kubelet.sock is
created. colad's own stubs, so the wire is the same. Usage: python -m bench.baseline_plugin DEVICES KUBELET
"""

from __future__ import annotations

import logging
import os
import signal
import sys
import threading
import time
from concurrent import futures

import grpc
import pyinotify

from colad.api import deviceplugin_pb2 as pb
from colad.api import deviceplugin_pb2_grpc as pb_grpc

LOG = logging.getLogger("baseline")
DEVICE_EVENTS = pyinotify.IN_CREATE | pyinotify.IN_DELETE | pyinotify.IN_MOVED_FROM | pyinotify.IN_MOVED_TO


class Plugin(pb_grpc.DevicePluginServicer):
    def __init__(self, device_dir: str, kubelet_dir: str) -> None:
        self.device_dir, self.kubelet_dir = device_dir, kubelet_dir
        self.cond = threading.Condition()
        self.devices: list[str] = []
        self.version = 0
        self.server: grpc.Server | None = None
        self.rescan()

    def rescan(self) -> None:
        names = sorted(e.name for e in os.scandir(self.device_dir) if e.is_file(follow_symlinks=False))
        with self.cond:
            if names != self.devices:
                self.devices, self.version = names, self.version + 1
                self.cond.notify_all()

    def on_event(self, event: pyinotify.Event) -> None:
        # An IN_Q_OVERFLOW event has no path: rescan, as for any device event (an AttributeError here
        # would end the notifier thread, and the plugin would never see a change again).
        if getattr(event, "path", None) != self.kubelet_dir:
            self.rescan()
        elif event.name == "kubelet.sock":
            self.serve_and_register()

    def serve_and_register(self) -> None:
        if self.server is not None:
            self.server.stop(grace=None)
        endpoint = f"baseline-{time.time_ns()}.sock"
        self.server = grpc.server(futures.ThreadPoolExecutor(max_workers=10))
        pb_grpc.add_DevicePluginServicer_to_server(self, self.server)
        self.server.add_insecure_port(f"unix:{self.kubelet_dir}/{endpoint}")
        self.server.start()
        request = pb.RegisterRequest(version="v1beta1", endpoint=endpoint, resource_name="myway5.com/cola")
        try:
            with grpc.insecure_channel(f"unix:{self.kubelet_dir}/kubelet.sock") as channel:
                pb_grpc.RegistrationStub(channel).Register(request, timeout=10, wait_for_ready=True)
            LOG.info("registered as %s", endpoint)
        except grpc.RpcError as exc:
            LOG.warning("register failed: %s", exc)

    def GetDevicePluginOptions(self, request, context):  # noqa: N802
        return pb.DevicePluginOptions()

    def ListAndWatch(self, request, context):  # noqa: N802
        def wake() -> None:
            with self.cond:
                self.cond.notify_all()

        context.add_callback(wake)
        seen = 0
        while True:
            with self.cond:
                while self.version == seen and context.is_active():
                    self.cond.wait()
                if not context.is_active():
                    return
                seen, devices = self.version, self.devices
            yield pb.ListAndWatchResponse(devices=[pb.Device(ID=d, health="Healthy") for d in devices])

    def Allocate(self, request, context):  # noqa: N802
        response = pb.AllocateResponse()
        for container in request.container_requests:
            response.container_responses.add(envs={"COLA_DEVICES": ",".join(container.devices_ids)})
            LOG.info("allocate %s", ",".join(container.devices_ids))
        return response


def main() -> int:
    logging.basicConfig(level=logging.INFO, stream=sys.stdout, format="%(asctime)s %(levelname)s %(message)s")
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM, signal.SIGINT})  # threads inherit the mask
    plugin = Plugin(*sys.argv[1:3])
    manager = pyinotify.WatchManager()
    notifier = pyinotify.ThreadedNotifier(manager, default_proc_fun=plugin.on_event)
    notifier.daemon = True
    manager.add_watch(plugin.device_dir, DEVICE_EVENTS)
    manager.add_watch(plugin.kubelet_dir, pyinotify.IN_CREATE)
    notifier.start()
    plugin.serve_and_register()
    signal.sigwait({signal.SIGTERM, signal.SIGINT})
    notifier.stop()
    if plugin.server is not None:
        plugin.server.stop(grace=None).wait(5)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
