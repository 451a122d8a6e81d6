"""CPU of one device change along the whole path: discovery, the queue (full snapshot against delta), the plugin.

At 1,000 / 10,000 / 50,000 bare devices with short names. The queue's side runs in one
process, no sockets; discovery's is one real Discovery over a real directory (one file
created, one step); the plugin's is fit_list and one ListAndWatch message, each on a set
it has not seen (one device more than the last). Run: .venv/bin/python -m bench.delta [counts...]
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
import time
from collections.abc import Callable
from itertools import count as counter

from colad.config.config import Config
from colad.core import devices
from colad.core.devices import Device, DeviceSet
from colad.deviceplugin import device_list
from colad.discovery.main import Discovery
from colad.queue import device_wire, messages, snapshots
from tests.oracles import snapshot_delta

Timed = Callable[[], object]


def _cpu(make: Callable[[], Timed], budget: float = 1.0) -> float:
    """Median CPU seconds of one call of what `make` returns (process time, about `budget` seconds).

    `make` runs outside the measured time, so each call can get a set nothing was cached for.
    """
    make()()
    runs: list[float] = []
    spent = 0.0
    while spent < budget or len(runs) < 5:
        fn = make()
        started = time.process_time()
        fn()
        took = time.process_time() - started
        runs.append(took)
        spent += took
        if len(runs) >= 200:
            break
    runs.sort()
    return runs[len(runs) // 2]


def _encode_delta(old: DeviceSet, digest: int, full: messages.DeviceSnapshot, change: devices.DeviceDiff) -> bytes:
    found, _ = snapshot_delta(old, digest, full, 1, change)
    assert found is not None
    return messages.encode(found)


def _queue(count: int, old: DeviceSet, new: DeviceSet) -> dict[str, float]:
    full = messages.DeviceSnapshot(1, 2, new)
    digest = device_wire.set_digest(old)
    change = devices.diff(old, new)
    found, _ = snapshot_delta(old, digest, full, 1, change)
    assert found is not None
    full_bytes, delta_bytes = messages.encode(full), messages.encode(found)
    receiver = snapshots.Receiver()
    receiver.apply(messages.DeviceSnapshot(1, 1, old))
    held = receiver.held[full.key]
    held = snapshots.Held(held.snapshot, held.ids, digest, None)

    def apply_delta() -> None:
        message = messages.decode(delta_bytes)
        assert isinstance(message, messages.DeviceDelta)
        snapshots.apply_delta(held, message, None)

    return {
        "full_bytes": len(full_bytes),
        "delta_bytes": len(delta_bytes),
        "full_encode_ms": _cpu(lambda: lambda: messages.encode(full)) * 1e3,
        "full_decode_ms": _cpu(lambda: lambda: messages.decode(full_bytes)) * 1e3,
        "delta_build_encode_ms": _cpu(lambda: lambda: _encode_delta(old, digest, full, change)) * 1e3,
        "delta_decode_apply_ms": _cpu(lambda: apply_delta) * 1e3,
    }


def _plugin(old: DeviceSet) -> dict[str, float]:
    """The plugin after the queue: every run gets `old` (already advertised) plus one device never seen."""
    device_list.fit_list(old, 1)
    device_list.fit_list(old, 2)
    fresh = counter()

    def one_more() -> DeviceSet:
        return DeviceSet((*old.devices, Device(f"zz{next(fresh):07d}")))  # sorts after every "cola..." ID

    def change(replicas: int) -> Timed:
        new = one_more()

        def run() -> None:
            fitted = device_list.fit_list(new, replicas)
            device_list.to_response(fitted.devices).SerializeToString()  # one stream's send, as gRPC serializes it

        return run

    return {
        "fit_list_ms": _cpu(lambda: (lambda new: lambda: device_list.fit_list(new, 1))(one_more())) * 1e3,
        "list_and_watch_ms": _cpu(
            lambda: (lambda new: lambda: device_list.to_response(new).SerializeToString())(one_more())
        )
        * 1e3,
        "plugin_change_ms": _cpu(lambda: change(1)) * 1e3,
        "plugin_change_x2_ms": _cpu(lambda: change(2)) * 1e3,
    }


def _discovery(count: int) -> dict[str, float]:
    """One real Discovery (no plugin listening) over `count` files: the step after one file is created."""
    root = tempfile.mkdtemp(prefix="cd")
    try:
        device_dir = os.path.join(root, "devices")
        os.mkdir(device_dir)
        os.mkdir(os.path.join(root, "run"), 0o700)  # the queue socket's directory (nobody listens)
        settled = time.time() - 3600  # older than the racy window: trusted from the first scan
        for i in range(count):
            path = os.path.join(device_dir, f"cola{i:05d}")
            with open(path, "w"):
                pass
            os.utime(path, (settled, settled))
        run_dir, kubelet_dir = os.path.join(root, "run"), os.path.join(root, "kubelet")
        cfg = Config(
            device_dir=device_dir,
            kubelet_dir=kubelet_dir,
            run_dir=run_dir,
            rescan_interval=3600.0,
            cdi_spec_dir=os.path.join(run_dir, "cdi"),
        )
        discovery = Discovery(cfg)
        discovery.rescan("start")
        fresh = counter()

        def one_file() -> Timed:
            with open(os.path.join(device_dir, f"zz{next(fresh):07d}"), "w"):
                pass
            return lambda: discovery.step(5.0)

        found = {"discovery_change_ms": _cpu(one_file) * 1e3}
        rw = next(iter(discovery.watches.values()))
        # The racy files' follow-up, as step() makes it (the files created above are racy for 2 s).
        racy = {rw.resource.name: set(rw.racy)}
        found["discovery_followup_ms"] = _cpu(lambda: lambda: discovery.rescan("followup", [rw], racy, ())) * 1e3
        found["discovery_full_rescan_ms"] = _cpu(lambda: lambda: discovery.rescan("periodic")) * 1e3
        discovery.close()
        return found
    finally:
        shutil.rmtree(root)


def measure(count: int) -> dict[str, float]:
    old = DeviceSet.of(Device(f"cola{i:05d}") for i in range(count))
    new = DeviceSet.of([*old, Device("cola99999x")])
    return {
        "devices": count,
        **_queue(count, old, new),
        "diff_ms": _cpu(lambda: lambda: devices.diff(old, new)) * 1e3,
        **_discovery(count),
        **_plugin(old),
    }


def main(argv: list[str]) -> int:
    counts = [int(a) for a in argv] or [1_000, 10_000, 50_000]
    rows = [measure(n) for n in counts]
    for key in rows[0]:
        print(
            f"{key:>24}"
            + "".join(f"{row[key]:>12.3f}" if isinstance(row[key], float) else f"{row[key]:>12}" for row in rows)
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
