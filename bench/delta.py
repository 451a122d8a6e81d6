"""Bytes and CPU of one device change on the queue: full snapshots (before #14) against deltas.

In one process, no sockets: discovery's side (build and encode what goes on the wire) and
the plugin's side (decode, apply), at 1,000 / 10,000 / 50,000 bare devices with short names,
and what the plugin still spends per change after the queue (fit_list, the ListAndWatch
message). Run: .venv/bin/python -m bench.delta [counts...]
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable

from colad import devices, messages, service, snapshots
from colad.devices import Device, DeviceSet


def _cpu(fn: Callable[[], object], budget: float = 1.0) -> float:
    """Median CPU seconds of one call of `fn` (process time, repeated for about `budget` seconds)."""
    fn()
    runs: list[float] = []
    spent = 0.0
    while spent < budget or len(runs) < 5:
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
    found, _ = snapshots.delta(old, digest, full, 1, change)
    assert found is not None
    return messages.encode(found)


def measure(count: int) -> dict[str, float]:
    old = DeviceSet.of(Device(f"cola{i:05d}") for i in range(count))
    new = DeviceSet.of([*old, Device("cola99999x")])
    full = messages.DeviceSnapshot(1, 2, new)
    digest = messages.set_digest(old)
    change = devices.diff(old, new)
    found, _ = snapshots.delta(old, digest, full, 1, change)
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
        "devices": count,
        "full_bytes": len(full_bytes),
        "delta_bytes": len(delta_bytes),
        "full_encode_ms": _cpu(lambda: messages.encode(full)) * 1e3,
        "full_decode_ms": _cpu(lambda: messages.decode(full_bytes)) * 1e3,
        "diff_ms": _cpu(lambda: devices.diff(old, new)) * 1e3,  # done before #14 too (the log line)
        "delta_build_encode_ms": _cpu(lambda: _encode_delta(old, digest, full, change)) * 1e3,
        "delta_decode_apply_ms": _cpu(apply_delta) * 1e3,
        "fit_list_ms": _cpu(lambda: service.fit_list(new, 1)) * 1e3,
        "list_and_watch_ms": _cpu(lambda: service.to_response(new).SerializeToString()) * 1e3,
    }


def main(argv: list[str]) -> int:
    counts = [int(a) for a in argv] or [1_000, 10_000, 50_000]
    rows = [measure(n) for n in counts]
    keys = list(rows[0])
    print(" ".join(f"{k:>22}" for k in keys))
    for row in rows:
        print(" ".join(f"{row[k]:>22.3f}" if isinstance(row[k], float) else f"{row[k]:>22}" for k in keys))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
