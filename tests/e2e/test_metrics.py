"""colad's metrics scraped for real: promtool on the exposition, a real Prometheus server, /healthz."""

from __future__ import annotations

import json
import socket
import subprocess
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.fakes.kubelet import FakeKubelet
from tests.helpers import http_get, metrics_address, wait_until
from tests.service import ColadService

pytestmark = pytest.mark.e2e


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def test_scrape_passes_promtool_check_metrics(colad: ColadService, kubelet: FakeKubelet) -> None:
    kubelet.wait_registered()
    kubelet.wait_devices({"cocacola", "peisicola"})
    kubelet.allocate(["cocacola"])
    address = metrics_address(colad.run_dir)
    assert address.startswith("127.0.0.1:")
    roles = ("plugin", "discovery", "kubelet-watch", "supervisord")
    # kubelet-watch starts last (priority 300) and reports its pid over the queue: it may not have yet.
    status, text = wait_until(
        lambda: (
            (r := http_get(f"http://{address}/metrics"))[0] == 200
            and all(f'colad_process_resident_memory_bytes{{role="{role}"}}' in r[1] for role in roles)
            and r
        ),
        10,
        "every role's process metrics in the scrape",
    )
    check = subprocess.run(["promtool", "check", "metrics"], input=text, capture_output=True, text=True, timeout=30)
    assert check.returncode == 0, check.stdout + check.stderr
    samples = [line for line in text.splitlines() if line and not line.startswith("#")]
    assert 'colad_allocate_requests_total{resource="myway5.com/cola",result="success"} 1.0' in samples
    assert 'colad_devices{health="Healthy",resource="myway5.com/cola"} 2.0' in samples
    assert 'colad_registered{resource="myway5.com/cola"} 1.0' in samples
    for role in roles:
        assert any(s.startswith(f'colad_process_resident_memory_bytes{{role="{role}"}}') for s in samples), role
    assert any(s.startswith("colad_build_info{") for s in samples)
    assert not any("_created" in s for s in samples)
    # Counters of the other processes arrive over the queue.
    wait_until(
        lambda: 'colad_discovery_rescans_total{reason="start"} 1.0' in http_get(f"http://{address}/metrics")[1],
        10,
        "discovery's rescan counter in the scrape",
    )


def test_healthz_follows_registration_and_the_stream(colad: ColadService, kubelet: FakeKubelet) -> None:
    kubelet.wait_registered()
    url = f"http://{metrics_address(colad.run_dir)}/healthz"
    ok = wait_until(lambda: (r := http_get(url))[0] == 200 and r, 10, "/healthz 200")
    assert ok[1].startswith("ok: registered as myway5.com/cola")
    kubelet.stop()
    down = wait_until(lambda: (r := http_get(url))[0] == 503 and r, 15, "/healthz 503 while the kubelet is away")
    assert len(down[1].strip().splitlines()) == 1
    assert "not registered" in down[1] or "no live ListAndWatch stream" in down[1]
    kubelet.start()
    kubelet.wait_registered(count=2, timeout=15)
    wait_until(lambda: http_get(url)[0] == 200, 15, "/healthz 200 after re-registration")
    assert http_get(f"http://{metrics_address(colad.run_dir)}/nothing-here")[0] == 404


@pytest.fixture
def prometheus(colad: ColadService, short_tmp: Path) -> Iterator[str]:
    port = free_port()
    config = short_tmp / "prometheus.yml"
    config.write_text(
        "global: {scrape_interval: 1s, evaluation_interval: 1s}\n"
        "scrape_configs:\n"
        f"  - job_name: colad\n    static_configs: [{{targets: ['{metrics_address(colad.run_dir)}']}}]\n"
    )
    log = open(short_tmp / "prometheus.log", "wb")
    proc = subprocess.Popen(
        [
            "prometheus",
            f"--config.file={config}",
            f"--storage.tsdb.path={short_tmp / 'tsdb'}",
            f"--web.listen-address=127.0.0.1:{port}",
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    base = f"http://127.0.0.1:{port}"
    try:
        logs = [short_tmp / "prometheus.log"]
        wait_until(lambda: http_get(f"{base}/-/ready")[0] == 200, 30, "Prometheus ready", logs=logs)
        yield base
    finally:
        proc.terminate()
        proc.wait(20)
        log.close()


def query(base: str, expr: str) -> float | None:
    status, body = http_get(f"{base}/api/v1/query?" + urllib.parse.urlencode({"query": expr}))
    result = json.loads(body)["data"]["result"] if status == 200 else []
    return float(result[0]["value"][1]) if result else None


def test_a_real_prometheus_sees_allocations_and_devices(
    colad: ColadService, kubelet: FakeKubelet, prometheus: str
) -> None:
    kubelet.wait_registered()
    kubelet.wait_devices({"cocacola", "peisicola"})
    wait_until(lambda: query(prometheus, 'up{job="colad"}') == 1.0, 30, "Prometheus to scrape colad")
    wait_until(lambda: query(prometheus, 'colad_devices{health="Healthy"}') == 2.0, 20, "2 healthy devices")
    before = query(prometheus, 'colad_allocate_requests_total{result="success"}') or 0.0
    for ids in (["cocacola"], ["peisicola"], ["cocacola", "peisicola"]):
        kubelet.allocate(ids)
    wait_until(
        lambda: query(prometheus, 'colad_allocate_requests_total{result="success"}') == before + 3,
        20,
        "the allocation counter to rise by 3",
    )
    assert query(prometheus, 'colad_device_allocations_total{device_id="cocacola"}') == 2.0
    colad.add("fanta")
    wait_until(lambda: query(prometheus, 'colad_devices{health="Healthy"}') == 3.0, 20, "the devices gauge to follow")
    assert query(prometheus, "colad_registered") == 1.0
