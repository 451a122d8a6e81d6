"""colad end to end: `colad supervise` (real supervisord, three processes) against the strict fake kubelet."""

from __future__ import annotations

import json
import os
import re
import stat
import subprocess
import sys
from pathlib import Path

import grpc
import pytest
from google.protobuf.message import Message

from colad.api import deviceplugin_pb2 as pb
from colad.health.rule import PROGRAMS
from tests.fakes.kubelet import FakeKubelet
from tests.helpers import http_get, metrics_address, wait_until
from tests.service import ColadService

pytestmark = pytest.mark.e2e


def settle(colad: ColadService, kubelet: FakeKubelet, count: int = 1, timeout: float = 15.0) -> None:
    """Registered at least `count` times, one live stream, and the kubelet holds exactly the directory."""
    kubelet.wait_registered(count=count, timeout=timeout)
    kubelet.wait_devices(colad.device_ids(), timeout=timeout)


def test_registers_serving_first_and_lists_the_initial_devices(colad: ColadService, kubelet: FakeKubelet) -> None:
    reg = kubelet.wait_registered()
    assert (reg.version, reg.resource_name, reg.ok) == ("v1beta1", "myway5.com/cola", True)
    assert reg.endpoint.startswith("colad-") and reg.endpoint.endswith(".sock")
    assert reg.options == (False, True)
    kubelet.wait_devices({"cocacola", "peisicola"})
    assert kubelet.options() == (False, True)
    assert kubelet.devices() == {"cocacola": "Healthy", "peisicola": "Healthy"}
    # The log says who wrote each line, with key=value fields.
    line = colad.wait_log('msg="register to kubelet successfully"')[0]
    assert "proc=plugin" in line and "resource=myway5.com/cola" in line and f"endpoint={reg.endpoint}" in line


def test_add_remove_and_rename_reach_list_and_watch(colad: ColadService, kubelet: FakeKubelet) -> None:
    settle(colad, kubelet)
    colad.add("fanta")
    kubelet.wait_devices({"cocacola", "peisicola", "fanta"})
    colad.remove("cocacola")
    kubelet.wait_devices({"peisicola", "fanta"})
    os.rename(colad.device_dir / "fanta", colad.device_dir / "sprite")  # rename inside
    kubelet.wait_devices({"peisicola", "sprite"})
    outside = colad.root / "pepsi"
    outside.write_bytes(b"")
    os.rename(outside, colad.device_dir / "pepsi")  # rename in
    kubelet.wait_devices({"peisicola", "sprite", "pepsi"})
    os.rename(colad.device_dir / "sprite", colad.root / "sprite")  # rename out
    kubelet.wait_devices({"peisicola", "pepsi"})
    # A write is an event too: it triggers a rescan that leaves the list as it is.
    before = len(kubelet.updates)
    (colad.device_dir / "pepsi").write_bytes(b"# written\n")
    colad.wait_log("reason=inotify", count=1)
    assert kubelet.devices() == {"peisicola": "Healthy", "pepsi": "Healthy"}
    assert len(kubelet.updates) == before, "an unchanged list must not be sent again"


def test_unsafe_names_are_skipped_with_one_warning(colad: ColadService, kubelet: FakeKubelet) -> None:
    settle(colad, kubelet)
    bad = [".hidden", "backup~", "two words", "a,b", "x" * 64]
    for name in bad:
        (colad.device_dir / name).write_bytes(b"")
    (colad.device_dir / "subdir").mkdir()
    os.symlink(colad.device_dir / "cocacola", colad.device_dir / "link")
    colad.add("valid-1")
    kubelet.wait_devices({"cocacola", "peisicola", "valid-1"})
    colad.add("valid-2")  # another rescan: the warnings must not repeat
    kubelet.wait_devices({"cocacola", "peisicola", "valid-1", "valid-2"})
    warnings = colad.log_lines("file skipped: not a valid device ID")
    for name in bad:
        assert len([w for w in warnings if f"name={name}" in w or f'name="{name}"' in w]) == 1, (name, warnings)
    assert not colad.log_lines("name=subdir") and not colad.log_lines("name=link")


def test_a_burst_of_1000_files_ends_exact(colad: ColadService, kubelet: FakeKubelet) -> None:
    settle(colad, kubelet)
    before = len(kubelet.updates)
    names = [f"burst-{i:04d}" for i in range(1000)]
    colad.add(*names)
    kubelet.wait_devices({"cocacola", "peisicola", *names}, timeout=30)
    burst_updates = len(kubelet.updates) - before
    assert burst_updates < 1000, "a burst must coalesce into fewer messages than files"
    colad.remove(*names[::2])
    kubelet.wait_devices({"cocacola", "peisicola", *names[1::2]}, timeout=30)


def test_allocate_answers_and_refuses(colad: ColadService, kubelet: FakeKubelet) -> None:
    settle(colad, kubelet)
    answer = kubelet.allocate(["peisicola", "cocacola"])
    assert answer["envs"] == {"COLA_DEVICES": "peisicola,cocacola"}
    cases = [
        (["fanta"], grpc.StatusCode.NOT_FOUND, "fanta"),
        (["cocacola", "cocacola"], grpc.StatusCode.INVALID_ARGUMENT, "cocacola"),
        ([], grpc.StatusCode.INVALID_ARGUMENT, "no devices"),
    ]
    for ids, code, needle in cases:
        with pytest.raises(grpc.RpcError) as err:
            kubelet.allocate(ids)
        assert err.value.code() == code, ids
        assert needle in err.value.details(), ids
    # The plugin is intact after refusing.
    assert kubelet.allocate(["cocacola"])["envs"] == {"COLA_DEVICES": "cocacola"}
    assert kubelet.get_preferred_allocation(["peisicola", "cocacola"], ["peisicola"], 2) == ["peisicola", "cocacola"]
    assert kubelet.get_preferred_allocation(["peisicola", "cocacola"], [], 1) == ["cocacola"]
    assert kubelet.stream_alive()


LONG = ["1" * 5000]
PREFERRED = pb.PreferredAllocationRequest(
    container_requests=[pb.ContainerPreferredAllocationRequest(available_deviceIDs=LONG, allocation_size=1)]
)


@pytest.mark.parametrize(
    ("method", "request_message", "field"),
    [
        ("GetPreferredAllocation", PREFERRED, "container_requests[0].available_deviceIDs[0]: not a device ID"),
        (
            "Allocate",
            pb.AllocateRequest(container_requests=[pb.ContainerAllocateRequest(devices_ids=LONG)]),
            "container_requests[0].devices_ids[0]: not a device ID",
        ),
        (
            "PreStartContainer",
            pb.PreStartContainerRequest(devices_ids=["cola::" + "9" * 5000]),
            "devices_ids[0]: replica index",
        ),
    ],
    ids=["preferred", "allocate", "pre-start"],
)
def test_an_id_of_5000_digits_is_invalid_argument_in_the_supervised_plugin(
    colad: ColadService, kubelet: FakeKubelet, method: str, request_message: Message, field: str
) -> None:
    """The guard (no traceback, no unasked exit) holds; the line and colad_rpc_errors_total say what happened."""
    settle(colad, kubelet)
    endpoint = kubelet.wait_registered().endpoint
    with grpc.insecure_channel(f"unix:{kubelet.plugin_dir / endpoint}") as channel:
        call = channel.unary_unary(f"/v1beta1.DevicePlugin/{method}", request_serializer=None)
        with pytest.raises(grpc.RpcError) as refused:
            call(request_message.SerializeToString(), timeout=10)
    assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT  # type: ignore[attr-defined]
    assert refused.value.details().startswith(field)  # type: ignore[attr-defined]
    address = metrics_address(colad.run_dir)
    series = f'colad_rpc_errors_total{{code="INVALID_ARGUMENT",method="v1beta1.DevicePlugin/{method}"}} 1.0'
    wait_until(lambda: series in http_get(f"http://{address}/metrics")[1], 10, series)
    assert kubelet.get_preferred_allocation(["peisicola", "cocacola"], [], 1) == ["cocacola"]
    assert kubelet.stream_alive()


def test_pre_start_container_answers_though_not_required(colad: ColadService, kubelet: FakeKubelet) -> None:
    settle(colad, kubelet)
    assert kubelet.options() == (False, True)
    # The real kubelet never calls it with pre_start_required false; a stand-in tool might.
    kubelet.pre_start_container(["cocacola"])
    assert kubelet.violations == ["PreStartContainer called although pre_start_required is false"]
    kubelet.clear_violations()


def test_five_kubelet_restarts_each_reregister_with_the_current_list(colad: ColadService, kubelet: FakeKubelet) -> None:
    settle(colad, kubelet)
    for restart in range(1, 6):
        kubelet.restart()
        colad.add(f"after-restart-{restart}")
        settle(colad, kubelet, count=1 + restart)
    endpoints = [r.endpoint for r in kubelet.successful_registrations()]
    assert len(set(endpoints)) == len(endpoints), "each serve uses a fresh socket name"
    # Five more in quick succession, without waiting in between.
    done = len(kubelet.successful_registrations())
    for _ in range(5):
        kubelet.restart()
    settle(colad, kubelet, count=done + 1)
    assert kubelet.live_streams() == 1


def test_kubelet_away_then_back(colad: ColadService, kubelet: FakeKubelet) -> None:
    settle(colad, kubelet)
    kubelet.stop(leave_stale_socket=True)  # a SIGKILLed kubelet leaves kubelet.sock behind
    colad.add("while-away")
    wait_until(lambda: not kubelet.stream_alive(), 10, "the stream to end")
    kubelet.start()
    settle(colad, kubelet, count=2)


@pytest.mark.parametrize("victims", [["plugin"], ["discovery"], ["kubelet-watch"], list(PROGRAMS)], ids="+".join)
def test_sigkill_recovers_exact_list_and_live_registration(
    colad: ColadService, kubelet: FakeKubelet, victims: list[str]
) -> None:
    settle(colad, kubelet)
    registered = len(kubelet.successful_registrations())
    old = colad.pids()
    for victim in victims:
        colad.kill(victim)
    # Change the world while they are dead: nothing may be lost.
    colad.add("added-while-dead")
    colad.remove("cocacola")
    colad.wait_running(exclude_pids={v: old[v] for v in victims})
    expected_registrations = registered + (1 if "plugin" in victims else 0)
    settle(colad, kubelet, count=expected_registrations)
    assert kubelet.devices() == {"peisicola": "Healthy", "added-while-dead": "Healthy"}
    # And the restarted set still follows the kubelet and the directory.
    kubelet.restart()
    colad.add("after-kill")
    settle(colad, kubelet, count=expected_registrations + 1)


def test_status_shows_processes_registration_and_device_count(colad: ColadService, kubelet: FakeKubelet) -> None:
    settle(colad, kubelet)

    def status() -> subprocess.CompletedProcess[str]:
        command = [sys.executable, "-m", "colad", "status", "--json"]
        return subprocess.run(command, env=colad.env, capture_output=True, text=True, timeout=20)

    result = wait_until(lambda: (r := status()).returncode == 0 and r, 10, "colad status to report healthy")
    report = json.loads(result.stdout)
    states = {name: info["state"] for name, info in report["processes"].items()}
    assert states == dict.fromkeys(PROGRAMS, "RUNNING")  # the watchdog runs inside supervisord: no process
    assert report["restarts"] == []
    assert report["plugin"]["registered"] is True
    assert report["plugin"]["devices"] == 2
    table = subprocess.run(
        [sys.executable, "-m", "colad", "status"], env=colad.env, capture_output=True, text=True, timeout=20
    )
    assert table.returncode == 0 and "registered: yes" in table.stdout and "devices:    2" in table.stdout
    kubelet.stop()
    degraded = wait_until(lambda: (r := status()).returncode == 1 and r, 15, "colad status to report not registered")
    assert "not registered" in degraded.stdout


def test_sockets_and_run_dir_are_root_only(colad: ColadService, kubelet: FakeKubelet) -> None:
    reg = kubelet.wait_registered()
    assert stat.S_IMODE(os.stat(colad.run_dir).st_mode) == 0o700
    for path in (colad.run_dir / "queue.sock", colad.kubelet_dir / reg.endpoint):
        mode = os.stat(path).st_mode
        assert stat.S_ISSOCK(mode) and stat.S_IMODE(mode) & 0o077 == 0, (path, oct(mode))


def test_stop_ends_every_process_and_removes_the_plugin_socket(short_tmp: Path, kubelet: FakeKubelet) -> None:
    service = ColadService(short_tmp)
    service.add("cocacola")
    service.start()
    reg = kubelet.wait_registered()
    pids = [*service.pids().values(), service.supervisord_pid()]
    assert service.stop() == 0
    for pid in pids:
        wait_until(lambda pid=pid: not _alive(pid), 10, f"pid {pid} to be gone")
    assert not (short_tmp / "kubelet" / reg.endpoint).exists()


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as handle:
            return handle.read().split(")")[-1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def test_second_instance_refuses_to_start(colad: ColadService, kubelet: FakeKubelet) -> None:
    kubelet.wait_registered()
    second = subprocess.run(
        [sys.executable, "-m", "colad", "supervise"], env=colad.env, capture_output=True, text=True, timeout=30
    )
    assert second.returncode == 1
    assert "already running" in second.stderr
    assert colad.states()["plugin"][0] == "RUNNING"


def test_stop_tells_the_kubelet_the_devices_are_gone(short_tmp: Path, kubelet: FakeKubelet) -> None:
    service = ColadService(short_tmp)
    service.add("cocacola", "peisicola")
    service.start()
    reg = kubelet.wait_registered()
    kubelet.wait_devices({"cocacola", "peisicola"})
    assert service.stop() == 0
    wait_until(lambda: kubelet.live_streams() == 0, 30, "the kubelet saw the stream end")  # read on its own thread
    last = [u for u in kubelet.updates if u.endpoint == reg.endpoint][-1]
    assert last.devices == {}, "the last list before the stream ended is empty"
    assert kubelet.devices() == {}
    assert service.log_lines("told the kubelet the devices are gone")


def test_the_start_waker_wakes_supervisord_once_and_is_reaped(colad: ColadService, kubelet: FakeKubelet) -> None:
    """`colad supervise` forks a waker that ends supervisord's idle first poll (cold start).

    It connects once when supervisord's pid file names it, logs one line, and exits 0; supervisord,
    its parent after the exec, reaps it: no process of it is left.
    """
    kubelet.wait_registered()
    line = colad.wait_log('msg="supervisord woken"', timeout=20)[0]
    found = re.search(r"waker_pid=(\d+)", line)
    assert found is not None, line
    pid = int(found.group(1))
    colad.wait_log(f"reaped unknown pid {pid} (exit status 0)", timeout=20)
    assert not _alive(pid)
    assert len(colad.log_lines('msg="supervisord woken"')) == 1
    assert colad.log().index('msg="supervisord woken"') < colad.log().index("spawned: 'plugin'")
