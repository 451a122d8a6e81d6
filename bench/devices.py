"""Cost of the device model: device files with content, the snapshot, preferred allocation.

Prints figures, not verdicts: `python -m bench.devices`. Everything runs in this process on real files
in a temporary directory (no colad processes), so the figures isolate discovery's scan and the pure core.
Ratios compare with empty device files measured in the same run.
"""

from __future__ import annotations

import argparse
import functools
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from colad.config.config import Resource
from colad.core import allocation, devices
from colad.discovery import devicefile
from colad.discovery.scan import ResourceWatch
from colad.queue import messages
from colad.watchers.inotify import Inotify

CONTENT = """version = 1
numa_nodes = [{node}]
cdi_devices = ["myway5.com/cola={name}"]
[envs]
SERIAL = "x"
[[device_nodes]]
host_path = "/dev/{name}"
[[mounts]]
host_path = "/opt/cola/{name}"
"""


def timed(fn: Callable[[], object], repeat: int) -> list[float]:
    out = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        out.append((time.perf_counter() - start) * 1000)
    return out


def row(name: str, values: list[float], unit: str = "ms") -> None:
    p50 = statistics.median(values)
    print(f"{name:<58}{p50:>10.2f} {unit} (p50 of {len(values)}, max {max(values):.2f})")


def scan_figures(root: Path, count: int, with_content: bool) -> tuple[list[float], list[float], int]:
    directory = root / ("full" if with_content else "empty")
    directory.mkdir()
    for n in range(count):
        name = f"cola{n}"
        text = CONTENT.format(node=n % 4, name=name) if with_content else ""
        (directory / name).write_text(text)
    inotify = Inotify()
    rw = ResourceWatch(inotify, Resource("myway5.com/cola", str(directory)))

    def cold() -> None:
        rw.cache = {}
        rw.scan(None)

    cold_ms = timed(cold, 5)
    rw.scan(None)
    (directory / "cola1").write_text(CONTENT.format(node=1, name="cola1") if with_content else "")
    warm_ms = timed(lambda: rw.scan({"cola1"}), 20)
    found = rw.scan(None).devices
    size = len(messages.encode(messages.DeviceSnapshot(1, 1, found)))
    inotify.close()
    return cold_ms, warm_ms, size


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--devices", type=int, default=10_000)
    args = parser.parse_args()
    print(f"colad device-model bench, {args.devices} device files")
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        empty = scan_figures(root, args.devices, False)
        full = scan_figures(root, args.devices, True)
    row("scan, cold cache, empty files", empty[0])
    row("scan, cold cache, files with content (9 keys)", full[0])
    print(f"{'  ratio content/empty, cold':<58}{statistics.median(full[0]) / statistics.median(empty[0]):>10.2f}")
    row("rescan after one file changed, empty files", empty[1])
    row("rescan after one file changed, files with content", full[1])
    print(f"{'  ratio content/empty, one change':<58}{statistics.median(full[1]) / statistics.median(empty[1]):>10.2f}")
    print(f"{'snapshot message, empty files':<58}{empty[2] / 1024:>10.1f} KiB")
    print(
        f"{'snapshot message, files with content':<58}{full[2] / 1024:>10.1f} KiB "
        f"(limit {messages.MAX_MESSAGE_BYTES // 1024} KiB)"
    )
    data = CONTENT.format(node=0, name="cola0").encode()
    row("parse one device file", timed(lambda: devicefile.parse("cola0", data), 2000), "ms")

    for size, nodes in ((64, 2), (1024, 8), (4096, 16)):
        devs = devices.DeviceSet.of(devices.Device(f"cola{n}", numa_nodes=(n % nodes,)) for n in range(size))
        ids = list(devs.ids)
        row(
            f"preferred(), {size} devices on {nodes} NUMA nodes, size 4",
            timed(functools.partial(allocation.preferred, devs, ids, [], 4), 50),
        )
    replicated = devices.replicate(devices.DeviceSet.of(devices.Device(f"cola{n}") for n in range(256)), 8)
    rids = list(replicated.ids)
    for policy in ("spread", "pack"):
        row(
            f"preferred(), 256 devices x 8 replicas, size 8, {policy}",
            timed(functools.partial(allocation.preferred, replicated, rids, [], 8, policy), 50),
        )
    request = [f"cola{n}" for n in range(0, 64)]
    devs = devices.DeviceSet.of(
        devicefile.parse(f"cola{n}", CONTENT.format(node=n % 4, name=f"cola{n}").encode()) for n in range(64)
    )
    row("allocate(), 64 devices with content merged", timed(lambda: allocation.allocate(devs, request), 200))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
