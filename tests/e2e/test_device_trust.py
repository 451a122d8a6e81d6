"""A device file a non-root user wrote, under the real supervisord and the strict fake kubelet.

The file asks for /etc mounted writable, /dev/null and a probe that leaves a marker. Owned by
uid 65534, its device reaches the kubelet Unhealthy, Allocate refuses it, the probe never runs,
`colad status` says why, and discovery logs one line and counts it once.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from tests.e2e.test_hostile_plugin import sample
from tests.fakes.kubelet import FakeKubelet
from tests.helpers import wait_until
from tests.service import ColadService

pytestmark = [pytest.mark.e2e, pytest.mark.skipif(os.geteuid() != 0, reason="chown needs root")]
H, U = "Healthy", "Unhealthy"
NOBODY = 65534


@pytest.fixture
def service(short_tmp: Path) -> Iterator[ColadService]:
    colad = ColadService(short_tmp, extra_env={"COLAD_PROBE_INTERVAL": "0.5", "COLAD_RESCAN_INTERVAL": "3600"})
    yield colad
    rc = colad.stop()
    assert rc == 0, f"supervisord exited with {rc}\n" + colad.log()[-4000:]


def write(colad: ColadService, name: str, owner: int) -> Path:
    path = colad.device_dir / name
    path.write_text(
        f'probe = ["/usr/bin/touch", "{colad.root}/ran-{name}"]\n'
        '[[mounts]]\nhost_path = "/etc"\nread_only = false\n'
        '[[device_nodes]]\nhost_path = "/dev/null"\n'
    )
    os.chown(path, owner, -1)
    return path


def test_a_device_file_of_uid_65534_gets_no_probe_no_mount_and_one_line(
    service: ColadService, kubelet: FakeKubelet
) -> None:
    write(service, "good", 0)
    evil = write(service, "evil", NOBODY)
    service.start()
    kubelet.wait_devices({"good": H, "evil": U}, timeout=30)
    answer = kubelet.allocate(["good"])
    assert answer["mounts"] == [{"container_path": "/etc", "host_path": "/etc", "read_only": False}]
    assert [d["host_path"] for d in answer["devices"]] == ["/dev/null"]
    with pytest.raises(grpc.RpcError) as refused:
        kubelet.allocate(["evil"])
    assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT, refused.value
    first = wait_until(lambda: (service.root / "ran-good").stat().st_mtime_ns, 10, "the trusted probe")
    wait_until(lambda: (service.root / "ran-good").stat().st_mtime_ns != first, 10, "the trusted probe again")
    assert not (service.root / "ran-evil").exists()
    status = subprocess.run(
        [sys.executable, "-m", "colad", "status"], env=service.env, capture_output=True, text=True, timeout=30
    )
    assert f"unhealthy:  evil: untrusted: {evil} is owned by uid 65534" in status.stdout, status.stdout
    series = 'colad_input_rejected_total{reason="untrusted_file",role="discovery"}'
    wait_until(lambda: sample(service, series) == 1, 30, f"{series} == 1", logs=[service.log_path])
    (service.device_dir / "more").write_text("")  # another turn of discovery: nothing new said of evil
    kubelet.wait_devices({"good": H, "evil": U, "more": H}, timeout=30)
    assert len(service.log_lines('msg="device file untrusted')) == 1
    assert sample(service, series) == 1


def test_probe_and_prepare_programs_others_can_write_never_run(short_tmp: Path, kubelet: FakeKubelet) -> None:
    shared = short_tmp / "shared"
    shared.mkdir()
    shared.chmod(0o777)  # anyone could swap the programs in here
    for name in ("probe", "prepare"):
        (shared / name).write_text(f"#!/bin/sh\ntouch {short_tmp}/ran-{name}\n")
        (shared / name).chmod(0o755)
    env = {"COLAD_PROBE": str(shared / "probe"), "COLAD_PREPARE": str(shared / "prepare")}
    colad = ColadService(short_tmp, extra_env={**env, "COLAD_PROBE_INTERVAL": "0.5"})
    try:
        colad.add("cola")
        colad.start()
        kubelet.wait_devices({"cola": U}, timeout=30)
        why = f"untrusted: directory {shared} is writable by group and others (mode 0777)"
        colad.wait_log(f'device=cola reason="probe probe: not run: {why}"', timeout=30)
        with pytest.raises(grpc.RpcError) as refused:
            kubelet.pre_start_container(["cola"])
        assert refused.value.code() == grpc.StatusCode.FAILED_PRECONDITION, refused.value
        assert refused.value.details() == f"prepare command {shared}/prepare failed for device cola: not run: {why}"
        for role in ("discovery", "plugin"):
            series = f'colad_input_rejected_total{{reason="untrusted_program",role="{role}"}}'
            wait_until(lambda s=series: sample(colad, s) == 1, 30, f"{series} == 1", logs=[colad.log_path])
        shared.chmod(0o755)  # fixed: the probe's next run goes ahead, and so does the next container
        kubelet.wait_devices({"cola": H}, timeout=30)
        kubelet.pre_start_container(["cola"])
        assert (short_tmp / "ran-probe").exists() and (short_tmp / "ran-prepare").exists()
    finally:
        assert colad.stop() == 0, colad.log()[-4000:]


def test_a_device_directory_others_can_write_is_refused_and_status_says_why(
    service: ColadService, kubelet: FakeKubelet
) -> None:
    service.add("cola1", "cola2")
    service.device_dir.chmod(0o777)
    service.start()
    kubelet.wait_registered(timeout=30)
    why = f"untrusted: device directory {service.device_dir} is writable by group and others (mode 0777)"
    service.wait_log('msg="device directory untrusted: refused', timeout=30)
    wait_until(lambda: kubelet.devices() == {}, 30, "an empty list at the kubelet")
    status = subprocess.run(
        [sys.executable, "-m", "colad", "status"], env=service.env, capture_output=True, text=True, timeout=30
    )
    assert status.returncode == 1 and f"problem: myway5.com/cola: {why}" in status.stdout, status.stdout
    service.device_dir.chmod(0o755)  # its own event: listed at once
    kubelet.wait_devices({"cola1": H, "cola2": H}, timeout=30)
    service.wait_log('msg="device directory trusted again"', timeout=30)
    assert len(service.log_lines('msg="device directory untrusted: refused')) == 1
    status = subprocess.run(
        [sys.executable, "-m", "colad", "status"], env=service.env, capture_output=True, text=True, timeout=30
    )
    assert status.returncode == 0, status.stdout


def test_a_tmpfs_mounted_without_a_mode_is_refused_until_chmod(service: ColadService, kubelet: FakeKubelet) -> None:
    service.add("cola")
    service.start()
    kubelet.wait_devices({"cola": H}, timeout=30)
    # A tmpfs root is 1777 unless mounted with mode=: sticky, but anyone can add a device file.
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "colad-trust", str(service.device_dir)], check=True)
    try:
        service.add("dropped")
        service.wait_log("mode 1777", timeout=30)
        kubelet.wait_devices({"cola": U}, timeout=30)  # the device known stays, Unhealthy; nothing new is read
        service.device_dir.chmod(0o755)
        kubelet.wait_devices({"dropped": H}, timeout=30)
    finally:
        subprocess.run(["umount", str(service.device_dir)], check=True)
    kubelet.wait_devices({"cola": H}, timeout=30)
