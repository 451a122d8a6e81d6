"""How many series colad's /metrics exposes at 10 and at 10,000 devices, each allocated once.

The per-device allocation counter is the only series family that grows with the
device count; `metrics_per_device = false` removes it. Prints one line per case.
"""

from __future__ import annotations

import json
import tempfile
import urllib.request
from pathlib import Path

from tests.fakes.kubelet import FakeKubelet
from tests.helpers import wait_until
from tests.service import ColadService


def series(root: Path, devices: int, per_device: bool) -> tuple[int, int]:
    kubelet = FakeKubelet(root / "kubelet")
    kubelet.start()
    service = ColadService(root, extra_env={"COLAD_LOG_LEVEL": "WARNING", "COLAD_METRICS_PER_DEVICE": str(per_device)})
    names = [f"cola-{i:05d}" for i in range(devices)]
    service.add(*names)
    try:
        service.start()
        kubelet.wait_registered(timeout=30)
        kubelet.wait_devices(set(names), timeout=120)
        for name in names:
            kubelet.allocate([name])
        state_file = service.run_dir / "state" / "plugin.json"
        state = wait_until(lambda: json.loads(state_file.read_text()).get("metrics_address"), 10, "metrics address")
        text = urllib.request.urlopen(f"http://{state}/metrics", timeout=30).read()
        lines = [line for line in text.decode().splitlines() if line and not line.startswith("#")]
        return len(lines), len(text)
    finally:
        service.stop()
        kubelet.stop()


def main() -> int:
    for devices in (10, 10_000):
        for per_device in (True, False):
            with tempfile.TemporaryDirectory(prefix="colad-series-", dir="/tmp") as tmp:
                Path(tmp).chmod(0o755)
                count, size = series(Path(tmp), devices, per_device)
            flag = str(per_device).lower()
            print(f"devices={devices:<6} metrics_per_device={flag:<5} series={count:<6} bytes={size}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
