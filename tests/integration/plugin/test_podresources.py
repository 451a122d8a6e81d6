"""The in-use watcher against the strict fake PodResources server, on real Unix sockets.

Holders, the state file and the metrics follow assign/release; an absent socket and a kubelet
without GetAllocatableResources degrade with one log line each, and the view recovers.
"""

from __future__ import annotations

import json
import logging
import os
import stat
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import generate_latest

from colad.core import constants
from colad.metrics.registry import Metrics
from colad.plugin.podresources import NO_ALLOCATABLE, InUseWatcher
from tests.fakes.podresources import FakePodResources
from tests.helpers import wait_until
from tests.integration.support import make_config

pytestmark = pytest.mark.integration

COLA = "myway5.com/cola"


@pytest.fixture
def socket_path(short_tmp: Path) -> Path:
    return short_tmp / "pod-resources" / "kubelet.sock"


@pytest.fixture
def fake(socket_path: Path) -> Iterator[FakePodResources]:
    server = FakePodResources(socket_path)
    server.start()
    yield server
    server.stop()
    assert server.violations == [], "the fake PodResources server saw contract violations"


def make_watcher(
    root: Path,
    socket_path: Path,
    *,
    interval: float = 3600.0,
    per_device: bool = True,
    resources: set[str] | None = None,
) -> tuple[InUseWatcher, Metrics]:
    cfg = make_config(
        root, pod_resources_socket=str(socket_path), pod_resources_interval=interval, metrics_per_device=per_device
    )
    metrics = Metrics(per_device=per_device)
    served = {COLA} if resources is None else resources
    return InUseWatcher(cfg, metrics, lambda: set(served)), metrics


def state(root: Path) -> dict[str, Any]:
    return json.loads((root / "run" / constants.INUSE_STATE_NAME).read_text())  # type: ignore[no-any-return]


def messages(caplog: pytest.LogCaptureFixture, level: int | None = None) -> list[str]:
    return [
        r.getMessage()
        for r in caplog.records
        if r.name == "colad.plugin.podresources" and (level is None or r.levelno == level)
    ]


def holder_info(metrics: Metrics, device: str, namespace: str, pod: str, container: str) -> float | None:
    return metrics.registry.get_sample_value(
        "colad_device_holder_info",
        {"resource": COLA, "device_id": device, "namespace": namespace, "pod": pod, "container": container},
    )


def test_holders_state_file_and_metrics_follow_assign_and_release(
    short_tmp: Path,
    socket_path: Path,
    fake: FakePodResources,
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO)
    watcher, metrics = make_watcher(short_tmp, socket_path, interval=0.05)
    fake.assign("default", "other", "main", "nvidia.com/gpu", ["GPU-1"])  # not colad's: never counted
    watcher.start()
    try:
        wait_until(lambda: metrics.registry.get_sample_value("colad_pod_resources_up") == 1, 5, "up")
        assert metrics.registry.get_sample_value("colad_devices_in_use", {"resource": COLA}) == 0
        assert state(short_tmp)["holders"] == []

        fake.assign("default", "app", "main", COLA, ["cocacola"])
        wait_until(lambda: state(short_tmp)["holders"], 5, "the holder in the state file")
        body = state(short_tmp)
        assert body["available"] is True and body["reason"] == ""
        assert body["holders"] == [
            {"resource": COLA, "device_id": "cocacola", "namespace": "default", "pod": "app", "container": "main"}
        ]
        assert metrics.registry.get_sample_value("colad_devices_in_use", {"resource": COLA}) == 1
        assert holder_info(metrics, "cocacola", "default", "app", "main") == 1
        scrape = generate_latest(metrics.registry).decode()
        assert 'colad_devices_in_use{resource="myway5.com/cola"} 1.0' in scrape
        assert "GPU-1" not in scrape

        # Two replicas of one physical device in two pods: one device in use, two holders.
        fake.assign("prod", "batch", "worker", COLA, ["peisicola::0"])
        fake.assign("prod", "batch2", "worker", COLA, ["peisicola::1"])
        wait_until(
            lambda: metrics.registry.get_sample_value("colad_devices_in_use", {"resource": COLA}) == 2,
            5,
            "two devices in use",
        )
        assert holder_info(metrics, "peisicola", "prod", "batch", "worker") == 1
        assert holder_info(metrics, "peisicola", "prod", "batch2", "worker") == 1

        fake.release("default", "app")
        fake.release("prod", "batch", "worker")
        wait_until(
            lambda: metrics.registry.get_sample_value("colad_devices_in_use", {"resource": COLA}) == 1, 5, "the release"
        )
        assert holder_info(metrics, "cocacola", "default", "app", "main") is None  # series removed
        assert holder_info(metrics, "peisicola", "prod", "batch", "worker") is None
        assert [h["pod"] for h in state(short_tmp)["holders"]] == ["batch2"]
    finally:
        watcher.stop()
    path = short_tmp / "run" / constants.INUSE_STATE_NAME
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    assert stat.S_IMODE(os.stat(path.parent).st_mode) == 0o700
    assert not [p for p in path.parent.iterdir() if p.name.endswith(".tmp")]  # no temporary file left
    lines = messages(caplog, logging.INFO)
    assert (
        'msg="device in use" resource=myway5.com/cola device=cocacola namespace=default pod=app container=main' in lines
    )
    assert any(line.startswith('msg="device released" resource=myway5.com/cola device=cocacola') for line in lines)
    assert sum('msg="device in use"' in line and "device=peisicola" in line for line in lines) == 2
    assert fake.calls["GetAllocatableResources"] == 1  # once per connection, not per poll
    assert fake.calls["List"] > 3


def test_device_changes_hands(
    short_tmp: Path, socket_path: Path, fake: FakePodResources, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)
    watcher, _ = make_watcher(short_tmp, socket_path)
    fake.assign("default", "a", "main", COLA, ["cocacola"])
    watcher.poll()
    fake.release("default", "a")
    fake.assign("default", "b", "side", COLA, ["cocacola"])
    watcher.poll()
    watcher.stop()
    assert messages(caplog, logging.INFO)[-1] == (
        'msg="device changed hands" resource=myway5.com/cola device=cocacola namespace=default pod=b '
        "container=side from_namespace=default from_pod=a from_container=main"
    )


def test_holder_series_off_without_per_device_metrics(
    short_tmp: Path, socket_path: Path, fake: FakePodResources
) -> None:
    watcher, metrics = make_watcher(short_tmp, socket_path, per_device=False)
    fake.assign("default", "a", "main", COLA, ["cocacola"])
    watcher.poll()
    watcher.stop()
    assert metrics.registry.get_sample_value("colad_devices_in_use", {"resource": COLA}) == 1
    assert "colad_device_holder_info{" not in generate_latest(metrics.registry).decode()
    assert state(short_tmp)["holders"][0]["pod"] == "a"  # the state file keeps the detail


def test_absent_socket_degrades_then_recovers(
    short_tmp: Path, socket_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    watcher, metrics = make_watcher(short_tmp, socket_path)
    for _ in range(3):
        watcher.poll()
    body = state(short_tmp)
    assert body["available"] is False and body["holders"] == []
    assert body["reason"] == f"no socket at {socket_path}"
    assert metrics.registry.get_sample_value("colad_pod_resources_up") == 0
    assert metrics.registry.get_sample_value("colad_devices_in_use", {"resource": COLA}) is None
    warnings = messages(caplog, logging.WARNING)
    assert len(warnings) == 1 and "pod resources unavailable" in warnings[0] and str(socket_path) in warnings[0]
    assert len([m for m in messages(caplog, logging.DEBUG) if "still unavailable" in m]) == 2

    fake = FakePodResources(socket_path)
    fake.assign("default", "a", "main", COLA, ["cocacola"])
    with fake:
        watcher.poll()
        watcher.poll()
        assert state(short_tmp)["available"] is True
        assert metrics.registry.get_sample_value("colad_pod_resources_up") == 1
        assert metrics.registry.get_sample_value("colad_devices_in_use", {"resource": COLA}) == 1
        assert len([m for m in messages(caplog, logging.INFO) if "pod resources available" in m]) == 1
    # The kubelet goes away while connected (a restart): one new warning, the view turns unknown.
    watcher.poll()
    watcher.poll()
    watcher.stop()
    assert len(messages(caplog, logging.WARNING)) == 2
    assert state(short_tmp)["available"] is False
    assert (
        metrics.registry.get_sample_value(
            "colad_device_holder_info",
            {"resource": COLA, "device_id": "cocacola", "namespace": "default", "pod": "a", "container": "main"},
        )
        is None
    )
    assert fake.violations == []


def test_no_get_allocatable_resources_degrades_once(
    short_tmp: Path, socket_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)
    fake = FakePodResources(socket_path, allocatable=False)
    fake.assign("default", "a", "main", COLA, ["cocacola"])
    watcher, metrics = make_watcher(short_tmp, socket_path)
    with fake:
        for _ in range(3):
            watcher.poll()
        fake.stop()  # a kubelet restart: a new connection asks again, but says it only once
        watcher.poll()
        fake.start()
        watcher.poll()
    watcher.stop()
    assert fake.calls["GetAllocatableResources"] == 2
    assert messages(caplog, logging.INFO).count(f"msg={NO_ALLOCATABLE!r}".replace("'", '"')) == 1
    assert state(short_tmp)["holders"][0]["device_id"] == "cocacola"  # List alone still gives the view
    assert metrics.registry.get_sample_value("colad_pod_resources_up") == 1
    assert fake.violations == []


def test_allocatable_is_logged_per_served_resource(
    short_tmp: Path, socket_path: Path, fake: FakePodResources, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)
    fake.set_allocatable(COLA, ["cocacola", "peisicola"])
    fake.set_allocatable("nvidia.com/gpu", ["GPU-1"])
    watcher, _ = make_watcher(short_tmp, socket_path)
    watcher.poll()
    watcher.stop()
    allocatable = [m for m in messages(caplog) if "kubelet allocatable devices" in m]
    assert allocatable == ['msg="kubelet allocatable devices" resource=myway5.com/cola devices=2']


def test_off_when_the_socket_is_empty(short_tmp: Path) -> None:
    cfg = make_config(short_tmp, pod_resources_socket="")
    metrics = Metrics()
    watcher = InUseWatcher(cfg, metrics, lambda: {COLA})
    watcher.start()
    watcher.stop()
    assert state(short_tmp)["available"] is False
    assert state(short_tmp)["reason"].startswith("off")
    assert metrics.registry.get_sample_value("colad_pod_resources_up") == 0


def test_a_kubelet_that_hangs_costs_one_deadline(short_tmp: Path, socket_path: Path) -> None:
    """Something listens on the socket but never answers: List gives up after its 2 s deadline."""
    import socket
    import time

    socket_path.parent.mkdir(parents=True)
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as mute:
        mute.bind(str(socket_path))
        mute.listen(1)
        watcher, metrics = make_watcher(short_tmp, socket_path)
        started = time.monotonic()
        watcher.poll()
        took = time.monotonic() - started
        watcher.stop()
    assert took < 4
    assert state(short_tmp)["available"] is False
    assert metrics.registry.get_sample_value("colad_pod_resources_up") == 0
