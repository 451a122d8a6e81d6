"""Memory of the colad pod where the kubelet measures it: the container's memory cgroup.

Runs the image as the DaemonSet does (tests/image.py PodRun, so the same limits and mounts) against the
fake kubelet, with 10 and with 10,000 device files, and prints the cgroup v1 figures podman's cgroupfs
manager gives it (/sys/fs/cgroup/memory/libpod_parent/libpod-<id>/): the working set (usage minus
total_inactive_file, what the kubelet evicts and the OOM killer acts on), RSS, cache and the peak.
`python -m bench.image_memory` (root, podman; builds the image if this checkout has none).
"""

from __future__ import annotations

import argparse
import subprocess
import tempfile
import time
from pathlib import Path

from tests import image
from tests.fakes.kubelet import FakeKubelet

CGROUP = Path("/sys/fs/cgroup/memory/libpod_parent")
MIB = 2**20


def cgroup_figures(container_id: str) -> dict[str, float]:
    base = CGROUP / f"libpod-{container_id}"
    stat = dict(line.split() for line in (base / "memory.stat").read_text().splitlines())
    usage = int((base / "memory.usage_in_bytes").read_text())
    return {
        "working_set": (usage - int(stat["total_inactive_file"])) / MIB,
        "usage": usage / MIB,
        "rss": int(stat["total_rss"]) / MIB,
        "cache": int(stat["total_cache"]) / MIB,
        "peak": int((base / "memory.max_usage_in_bytes").read_text()) / MIB,
        "limit": int((base / "memory.limit_in_bytes").read_text()) / MIB,
    }


def measure(count: int, ref: str, settle: float) -> dict[str, float]:
    root = Path(tempfile.mkdtemp(prefix="colad-mem-", dir="/tmp"))
    name = f"colad-bench-{root.name.rsplit('-', 1)[-1]}"
    run = image.PodRun(host_root=root / "host", name=name, image=ref)
    args = run.args()
    device_dir = run.host_path_of("/etc/colas")
    names = {f"cola{i:05d}" for i in range(count)}
    for device in names:
        (device_dir / device).touch()
    kubelet = FakeKubelet(run.host_path_of("/var/lib/kubelet/device-plugins"))
    kubelet.start()
    proc = subprocess.Popen(
        ["podman", *args], stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT, env=image.podman_env()
    )
    try:
        kubelet.wait_registered(timeout=120)
        kubelet.wait_devices(names, timeout=180)
        time.sleep(settle)  # idle after the first list: what the pod holds in steady state
        found = image.podman("inspect", "--type", "container", "--format", "{{.ID}}", name)
        figures = cgroup_figures(found.stdout.strip())
        # A burst on top: every file rewritten at once, then the idle figure's peak is the burst's.
        for device in names:
            (device_dir / device).write_text("")
        for device in list(names)[: max(1, count // 10)]:
            (device_dir / device).unlink()
        kubelet.wait_devices(names - set(list(names)[: max(1, count // 10)]), timeout=180)
        after = cgroup_figures(found.stdout.strip())
        figures["peak_after_burst"] = after["peak"]
        figures["working_set_after_burst"] = after["working_set"]
        return figures
    finally:
        image.podman("rm", "-f", "--ignore", "--time", "5", name, check=False, timeout=60)
        proc.wait(30)
        kubelet.stop()
        subprocess.run(["rm", "-rf", "--one-file-system", str(root)], check=False)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--devices", type=int, nargs="+", default=[10, 10_000])
    parser.add_argument("--settle", type=float, default=20.0, help="idle seconds after the first list")
    args = parser.parse_args()
    why = image.unusable()
    if why:
        print(f"image_memory: {why}")
        return 1
    ref = image.ensure_image()
    print(f"image {ref}: {image.image_size(ref) / MIB:.1f} MiB")
    keys = ("working_set", "rss", "cache", "usage", "peak", "working_set_after_burst", "peak_after_burst", "limit")
    print(f"{'devices':>8}  " + "  ".join(f"{k:>24}" for k in keys) + "   (MiB)")
    for count in args.devices:
        figures = measure(count, ref, args.settle)
        print(f"{count:>8}  " + "  ".join(f"{figures[k]:>24.1f}" for k in keys), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
