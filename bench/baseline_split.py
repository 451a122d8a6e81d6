"""The baseline plugin cut into colad's three processes, and nothing more: the design card's floor.

bench/baseline_plugin.py as it is, but its two watches run in processes of their own, as colad's roles
do: `discovery` watches the device directory and sends the sorted names, whole, to the plugin over a
Unix stream socket (4-byte length, JSON); `kubelet-watch` watches the kubelet directory and sends a
line when kubelet.sock is created; `plugin` listens on that socket, one thread reading it, and serves
gRPC as the baseline does. No supervisord, no delta, no state file, no log line per change, no health,
no CDI, no metrics: what the split alone costs. Started as three processes by bench.subjects.Split.
With SPLIT_CARD_IMPORTS=1 in the environment each role also loads what the design card and the house style
make every colad role load whatever its code: `dataclasses` (a typed config, STYLE.md) and, in the plugin
once it has registered (as colad's plugin loads them), `prometheus_client` with a counter and a histogram
(the card's allocation metrics); none of them used.
Usage: python -m bench.baseline_split plugin DEVICES KUBELET QUEUE | discovery DEVICES QUEUE |
kubelet-watch KUBELET QUEUE
"""

from __future__ import annotations

import json
import os
import signal
import socket
import struct
import sys
import threading
import time
from typing import Any

import pyinotify

HEADER = struct.Struct("!I")
CARD_IMPORTS_ENV = "SPLIT_CARD_IMPORTS"
KEPT: list[object] = []  # what card_imports() loaded, alive for the process' life
DEVICE_EVENTS = pyinotify.IN_CREATE | pyinotify.IN_DELETE | pyinotify.IN_MOVED_FROM | pyinotify.IN_MOVED_TO


def scan(device_dir: str) -> list[str]:
    return sorted(e.name for e in os.scandir(device_dir) if e.is_file(follow_symlinks=False))


def split_plugin(device_dir: str, kubelet_dir: str) -> Any:
    """The baseline's servicer and registration; its device list and kubelet events come off the socket.

    Defined here, when the plugin role starts: the watchers import neither grpc nor the stubs.
    """
    from bench.baseline_plugin import Plugin

    class SplitPlugin(Plugin):
        def __init__(self, device_dir: str, kubelet_dir: str) -> None:
            self.first = threading.Event()  # set by the first list from discovery
            super().__init__(device_dir, kubelet_dir)

        def rescan(self) -> None:  # the list comes from discovery, as in colad
            pass

        def take(self, names: list[str]) -> None:
            with self.cond:
                if names != self.devices or not self.first.is_set():
                    self.devices, self.version = names, self.version + 1
                    self.cond.notify_all()
            self.first.set()

        def serve_queue(self, path: str) -> None:
            listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            listener.bind(path)
            listener.listen(4)
            for _ in range(2):  # discovery and kubelet-watch, one connection each
                conn, _ = listener.accept()
                threading.Thread(target=self.read, args=(conn,), daemon=True).start()

        def read(self, conn: socket.socket) -> None:
            buffer = b""
            while chunk := conn.recv(1 << 17):
                buffer += chunk
                while len(buffer) >= HEADER.size:
                    (size,) = HEADER.unpack_from(buffer)
                    if len(buffer) < HEADER.size + size:
                        break
                    message = json.loads(buffer[HEADER.size : HEADER.size + size])
                    buffer = buffer[HEADER.size + size :]
                    if "devices" in message:
                        self.take(message["devices"])
                    else:
                        self.serve_and_register()

    return SplitPlugin(device_dir, kubelet_dir)


def connect(path: str) -> socket.socket:
    while True:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.connect(path)
            return sock
        except OSError:
            sock.close()
            time.sleep(0.005)


def send(sock: socket.socket, message: object) -> None:
    data = json.dumps(message).encode()
    sock.sendall(HEADER.pack(len(data)) + data)


def watch(directory: str, mask: int, on_event: pyinotify.ProcessEvent | object) -> None:
    manager = pyinotify.WatchManager()
    manager.add_watch(directory, mask)
    pyinotify.Notifier(manager, default_proc_fun=on_event).loop()


def card_imports(role: str) -> list[object]:
    """What the card and the house style load in `role` (SPLIT_CARD_IMPORTS): kept alive, never used."""
    import dataclasses

    kept: list[object] = [dataclasses]
    if role == "plugin":
        import prometheus_client

        registry = prometheus_client.CollectorRegistry()
        kept += [
            prometheus_client.Counter("split_allocations", "Allocate answers", ["resource"], registry=registry),
            prometheus_client.Histogram("split_allocate_seconds", "Allocate duration", registry=registry),
        ]
    return kept


def main(argv: list[str]) -> int:
    signal.signal(signal.SIGTERM, lambda *_: os._exit(0))
    role, args = argv[0], argv[1:]
    card = bool(os.environ.get(CARD_IMPORTS_ENV))
    if card and role != "plugin":
        KEPT.extend(card_imports(role))
    if role == "plugin":
        device_dir, kubelet_dir, queue = args
        signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM, signal.SIGINT})  # threads inherit the mask
        plugin = split_plugin(device_dir, kubelet_dir)
        threading.Thread(target=plugin.serve_queue, args=(queue,), daemon=True).start()
        plugin.first.wait(10)  # Register with the list, as colad does (it waits for discovery's first snapshot)
        plugin.serve_and_register()
        if card:
            KEPT.extend(card_imports(role))  # after Register, as colad loads its metrics
        signal.sigwait({signal.SIGTERM, signal.SIGINT})
        return 0
    if role == "discovery":
        device_dir, queue = args
        sock = connect(queue)
        names = scan(device_dir)
        send(sock, {"devices": names})

        def on_device_event(event: pyinotify.Event) -> None:
            nonlocal names
            if (now := scan(device_dir)) != names:
                names = now
                send(sock, {"devices": names})

        watch(device_dir, DEVICE_EVENTS, on_device_event)
        return 0
    if role == "kubelet-watch":
        kubelet_dir, queue = args
        sock = connect(queue)

        def on_kubelet_event(event: pyinotify.Event) -> None:
            if event.name == "kubelet.sock":
                send(sock, {"kubelet": True})

        watch(kubelet_dir, pyinotify.IN_CREATE, on_kubelet_event)
        return 0
    raise SystemExit(f"unknown role {role!r}")


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
