"""colad benchmarks: start-up, re-registration, change propagation and memory, as figures.

Starts the real `colad supervise` against the fake kubelet from tests/fakes and
prints a table (and JSON with --json PATH). Nothing here asserts a timing:
machines are shared and noisy, so figures are for reading and comparing.
Run with `make bench` (or `.venv/bin/python -m bench.run`).
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from tests.fakes.kubelet import FakeKubelet
from tests.helpers import wait_until
from tests.service import ColadService


def percentile(values: list[float], pct: float) -> float:
    ordered = sorted(values)
    index = min(len(ordered) - 1, max(0, round(pct / 100 * (len(ordered) - 1))))
    return ordered[index]


def summary(values: list[float]) -> dict[str, float]:
    return {
        "n": len(values),
        "p50_ms": round(statistics.median(values) * 1000, 2),
        "p99_ms": round(percentile(values, 99) * 1000, 2),
        "max_ms": round(max(values) * 1000, 2),
    }


def memory(pid: int) -> dict[str, float]:
    fields = {}
    for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines()[1:]:
        key, value = line.split(":", 1)
        fields[key] = int(value.split()[0])
    return {"rss_mib": round(fields["Rss"] / 1024, 1), "pss_mib": round(fields["Pss"] / 1024, 1)}


def first_update_with(kubelet: FakeKubelet, name: str, since: int) -> float | None:
    for update in kubelet.updates[since:]:
        if name in update.devices:
            return update.at
    return None


def measure(root: Path, changes: int, restarts: int) -> dict[str, Any]:
    kubelet = FakeKubelet(root / "kubelet")
    kubelet.start()
    service = ColadService(root, extra_env={"COLAD_LOG_LEVEL": "INFO"})
    service.add("cocacola", "peisicola")
    results: dict[str, Any] = {}
    try:
        t0 = time.monotonic()
        service.start()
        reg = kubelet.wait_registered(timeout=20)
        kubelet.wait_devices({"cocacola", "peisicola"})
        results["cold_start_to_registered_ms"] = round((reg.at - t0) * 1000, 1)
        results["cold_start_to_full_list_ms"] = round((kubelet.updates[-1].at - t0) * 1000, 1)

        latencies = []
        for i in range(changes):
            name = f"change-{i:04d}"
            since = len(kubelet.updates)
            start = time.monotonic()
            service.add(name)
            at = wait_until(lambda name=name, since=since: first_update_with(kubelet, name, since), 10, name)
            latencies.append(at - start)
        results["change_propagation"] = summary(latencies)

        rereg, relist = [], []
        for _ in range(restarts):
            count = len(kubelet.successful_registrations())
            kubelet.stop()
            start = time.monotonic()
            kubelet.start()
            reg = kubelet.wait_registered(count=count + 1, timeout=20)
            kubelet.wait_devices(service.device_ids(), timeout=20)
            rereg.append(reg.at - start)
            relist.append(kubelet.updates[-1].at - start)
        results["reregistration"] = summary(rereg)
        results["reregistration_to_full_list"] = summary(relist)

        pids = service.pids()
        pids["supervisord"] = service.supervisord_pid()
        mem = {name: memory(pid) for name, pid in pids.items()}
        mem["total"] = {k: round(sum(m[k] for m in mem.values()), 1) for k in ("rss_mib", "pss_mib")}
        results["memory_devices"] = len(service.device_ids())
        results["memory"] = mem
    finally:
        service.stop()
        kubelet.stop()
    return results


def render(results: dict[str, Any]) -> str:
    lines = [
        f"cold start -> Register answered      {results['cold_start_to_registered_ms']:>8} ms",
        f"cold start -> full list at kubelet   {results['cold_start_to_full_list_ms']:>8} ms",
    ]
    for key in ("change_propagation", "reregistration", "reregistration_to_full_list"):
        s = results[key]
        figures = f"p50 {s['p50_ms']:>7} ms  p99 {s['p99_ms']:>7} ms  max {s['max_ms']:>7} ms"
        lines.append(f"{key:<36} {figures}  (n={s['n']})")
    lines.append(f"memory at {results['memory_devices']} devices (MiB):")
    for name, m in results["memory"].items():
        lines.append(f"  {name:<14} RSS {m['rss_mib']:>6}  PSS {m['pss_mib']:>6}")
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--changes", type=int, default=200)
    parser.add_argument("--restarts", type=int, default=20)
    parser.add_argument("--json", type=Path, help="also write the results here")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="colad-bench-", dir="/tmp") as tmp:
        root = Path(tmp)
        root.chmod(0o755)
        results = measure(root, args.changes, args.restarts)
    print(render(results))
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(results, indent=2, sort_keys=True) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
