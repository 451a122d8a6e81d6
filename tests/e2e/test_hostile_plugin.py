"""Hostile input to the plugin role, under the real supervisord.

A device list over the kubelet's 4 MiB receive limit, and objects named like
colad's sockets (or its queue socket) that colad did not make. Each must end in
a stream the strict fake kubelet accepts, a plugin that never exits, and
nothing foreign removed.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Iterator
from pathlib import Path

import pytest

from colad.core import constants
from tests.fakes.kubelet import FakeKubelet
from tests.helpers import http_get, metrics_address, wait_until
from tests.service import ColadService

pytestmark = pytest.mark.e2e


def sample(colad: ColadService, line_start: str) -> float | None:
    _, text = http_get(f"http://{metrics_address(colad.run_dir)}/metrics")
    for line in text.splitlines():
        if line.startswith(line_start + " "):
            return float(line.rsplit(" ", 1)[1])
    return None


@pytest.fixture
def service(short_tmp: Path, request: pytest.FixtureRequest) -> Iterator[ColadService]:
    """colad under supervisord, not started: each test prepares the node first."""
    env = getattr(request, "param", None) or {}
    colad = ColadService(short_tmp, extra_env=env)
    yield colad
    rc = colad.stop()
    assert rc == 0, f"supervisord exited with {rc}\n" + colad.log()[-4000:]
    assert "Traceback" not in colad.log()


# 58 characters: with "::999" the replica IDs are 63, the kubelet's maximum. 70 x 1000 replicas
# of ~76 encoded bytes each is ~5.3 MB, well over the 4 MiB a kubelet's gRPC client takes.
LONG_NAMES = [f"d{i:02d}" + "x" * 55 for i in range(70)]


@pytest.mark.parametrize("service", [{"COLAD_REPLICAS": "1000"}], indirect=True)
def test_a_list_over_the_kubelets_limit_is_cut_and_kept_not_re_registered(
    service: ColadService, kubelet: FakeKubelet
) -> None:
    service.add(*LONG_NAMES)
    service.start()
    pids = service.wait_running()
    kubelet.wait_registered(timeout=30)

    def listed() -> dict[str, str] | None:
        devices = kubelet.devices()
        return devices if devices and len(devices) > 50_000 else None

    devices = wait_until(listed, 60, "a long list at the kubelet", logs=[service.log_path])
    update = kubelet.updates[-1]
    assert update.size_bytes <= constants.KUBELET_MAX_RECV_MESSAGE_BYTES
    # Every physical device keeps as many replicas as fit (replica 0 of all first, then 1, ...).
    physical = {device_id.split("::")[0] for device_id in devices}
    assert physical == set(LONG_NAMES)
    counts = sorted(sum(1 for i in devices if i.startswith(name + "::")) for name in LONG_NAMES)
    assert counts[-1] - counts[0] <= 1, counts[:3] + counts[-3:]
    # Deterministic and steady: one registration, one stream, no resend loop.
    registered = len(kubelet.successful_registrations())
    url = f"http://{metrics_address(service.run_dir)}/healthz"
    status, body = wait_until(lambda: (r := http_get(url))[0] == 503 and "list cut" in r[1] and r, 20, "/healthz 503")
    assert f"list cut to {len(devices)} of 70000 device IDs" in body
    assert len(kubelet.successful_registrations()) == registered == 1
    assert kubelet.stream_alive()
    assert {k: v for k, v in service.pids().items() if k in pids} == pids
    assert sample(service, 'colad_list_and_watch_dropped_devices{resource="myway5.com/cola"}') == 70000 - len(devices)
    assert sample(service, 'colad_list_and_watch_message_bytes{resource="myway5.com/cola"}') == update.size_bytes
    assert len(service.log_lines("device list cut to fit the kubelet's message limit")) == 1
    # Allocate answers for a replica that made it into the list.
    some = sorted(devices)[0]
    assert kubelet.allocate([some])["envs"]["COLA_DEVICES"] == some.split("::")[0]


def _stale_socket(path: Path) -> None:
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.bind(str(path))


def test_objects_named_like_colad_sockets_are_left_alone_and_colad_serves(
    service: ColadService, kubelet: FakeKubelet, short_tmp: Path
) -> None:
    k = service.kubelet_dir
    outside = short_tmp / "precious"
    outside.write_text("keep me\n")
    (k / "colad-1.sock").mkdir()
    (k / "colad-2.sock").write_text("not a socket\n")
    (k / "colad-3.sock").symlink_to(outside)
    _stale_socket(k / "colad-4.sock")  # ours by uid, but colad has no record of making it
    foreign = {"colad-1.sock", "colad-2.sock", "colad-3.sock", "colad-4.sock"}
    service.add("cocacola", "peisicola")
    service.start()
    pids = service.wait_running()
    kubelet.wait_registered(timeout=30)
    kubelet.wait_devices({"cocacola", "peisicola"}, timeout=30)
    assert kubelet.current_endpoint() not in foreign
    for name in sorted(foreign):
        lines = service.log_lines("kubelet directory entry left alone")
        assert len([line for line in lines if f"colad-{name[6]}.sock" in line]) == 1, lines
    assert (k / "colad-1.sock").is_dir()
    assert (k / "colad-2.sock").read_text() == "not a socket\n"
    assert os.readlink(k / "colad-3.sock") == str(outside) and outside.read_text() == "keep me\n"
    assert (k / "colad-4.sock").is_socket()
    assert sample(service, 'colad_input_rejected_total{reason="foreign_path",role="plugin"}') == 4
    # A socket colad did make is removed once stale: kill the plugin, its successor cleans up.
    old = kubelet.current_endpoint()
    assert old is not None
    service.kill("plugin")
    service.wait_running(exclude_pids={"plugin": pids["plugin"]}, timeout=30)
    kubelet.wait_registered(count=2, timeout=30)
    wait_until(lambda: not (k / old).exists(), 20, f"stale own socket {old} removed", logs=[service.log_path])
    assert {p.name for p in k.iterdir()} >= foreign
    assert service.pids()["discovery"] == pids["discovery"]


def test_a_foreign_object_at_queue_sock_is_left_alone_and_named(service: ColadService, kubelet: FakeKubelet) -> None:
    queue = service.run_dir / constants.QUEUE_SOCKET_NAME
    service.run_dir.mkdir(mode=0o700, parents=True)
    queue.mkdir()
    (queue / "inside").write_text("x")
    service.add("cocacola")
    service.start()
    pids = service.wait_running(timeout=30)
    url = f"http://{metrics_address(service.run_dir)}/healthz"
    _, body = wait_until(lambda: (r := http_get(url))[0] == 503 and "queue not listening" in r[1] and r, 30, "named")
    assert "is a directory" in body
    assert (queue / "inside").read_text() == "x"
    assert len(service.log_lines("queue socket path holds something colad did not make")) == 1
    # The operator removes it: the plugin listens on the next safety check, the list arrives.
    (queue / "inside").unlink()
    queue.rmdir()
    kubelet.wait_devices({"cocacola"}, timeout=30)
    wait_until(lambda: http_get(url)[0] == 200, 30, "/healthz 200 once the queue listens", logs=[service.log_path])
    assert {k: v for k, v in service.pids().items() if k in pids} == pids
