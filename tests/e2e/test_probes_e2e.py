"""Health probes under the real supervisord, seen at the strict fake kubelet.

One probe command for the resource (COLAD_PROBE), its behaviour per device set by a file the
test writes: healthy, failing with a reason, hanging past the timeout (killed, Unhealthy),
flapping; a new device file reaches the kubelet while a probe hangs, long before its timeout.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.e2e.test_hostile_plugin import sample
from tests.fakes.kubelet import FakeKubelet
from tests.helpers import wait_until
from tests.service import ColadService

pytestmark = pytest.mark.e2e
H, U = "Healthy", "Unhealthy"
HANG_TIMEOUT = 20.0  # the probe's timeout: a change of another device must not wait for it


@pytest.fixture
def service(short_tmp: Path) -> Iterator[ColadService]:
    script = short_tmp / "probe.sh"
    script.write_text(
        "#!/bin/sh\n"
        f'v=$(cat "{short_tmp}/verdicts/$COLA_DEVICE_ID" 2>/dev/null)\n'
        'case "$v" in\n'
        "  ok) exit 0 ;;\n"
        f'  hang) echo still thinking; exec "{short_tmp}/sleeper" 600 ;;\n'
        '  *) echo "firmware says: $v"; exit 3 ;;\n'
        "esac\n"
    )
    script.chmod(0o755)
    (short_tmp / "sleeper").symlink_to("/bin/sleep")  # a hung probe names the test's directory in /proc
    (short_tmp / "verdicts").mkdir()
    env = {
        "COLAD_RESCAN_INTERVAL": "3600",
        "COLAD_CDI_SPEC_DIR": str(short_tmp / "cdi"),
        "COLAD_PROBE": str(script),
        "COLAD_PROBE_TIMEOUT": str(HANG_TIMEOUT),
        "COLAD_PROBE_INTERVAL": "0.5",
    }
    colad = ColadService(short_tmp, extra_env=env)
    yield colad
    rc = colad.stop()
    assert rc == 0, f"supervisord exited with {rc}\n" + colad.log()[-4000:]


def test_probe_verdicts_reach_the_kubelet_and_a_hung_probe_delays_nothing(
    short_tmp: Path, service: ColadService, kubelet: FakeKubelet
) -> None:
    verdicts = short_tmp / "verdicts"
    for name, verdict in (("ok", "ok"), ("bad", "overheated"), ("hung", "hang"), ("flap", "ok")):
        (verdicts / name).write_text(verdict)
        service.add(name)
    service.start()
    kubelet.wait_devices({"ok": H, "bad": U, "hung": U, "flap": H}, timeout=30)
    service.wait_log('device=bad reason="probe probe.sh: firmware says: overheated"')
    assert not service.log_lines("device=hung reason=")  # pending is not a failure: nothing said yet
    # "hung" is in flight; a new device reaches the kubelet in far less than its timeout.
    (verdicts / "new").write_text("ok")
    began = time.monotonic()
    service.add("new")
    wait_until(lambda: "new" in (kubelet.devices() or {}), HANG_TIMEOUT / 2, "the new device at the kubelet")
    took = time.monotonic() - began
    assert took < HANG_TIMEOUT / 4, f"{took:.1f}s for a new device while a probe hung"
    print(f"new device at the kubelet after {took:.3f}s while a probe hung")
    kubelet.wait_devices({"ok": H, "bad": U, "hung": U, "flap": H, "new": H}, timeout=30)
    service.wait_log(f'device=hung reason="probe probe.sh: timed out after {HANG_TIMEOUT:g}s: still thinking"', 60)
    for turn in range(2):  # flapping: each turn reaches the kubelet, and is logged once
        (verdicts / "flap").write_text("flaky")
        kubelet.wait_devices({"ok": H, "bad": U, "hung": U, "flap": U, "new": H}, timeout=30)
        (verdicts / "flap").write_text("ok")
        kubelet.wait_devices({"ok": H, "bad": U, "hung": U, "flap": H, "new": H}, timeout=30)
        assert len(service.log_lines('device=flap reason="probe probe.sh: firmware says: flaky"')) == turn + 1
    series = 'colad_device_health_changes_total{reason="probe"}'
    wait_until(lambda: (sample(service, series) or 0) >= 4, 30, f"{series} >= 4", logs=[service.log_path])
    assert hung_probes(short_tmp) >= 1  # the hung probe runs again after each timeout
    # A graceful stop kills the probe in flight: nothing of it is left running.
    assert service.stop() == 0
    wait_until(lambda: hung_probes(short_tmp) == 0, 10, "no hung probe left after the stop")


def hung_probes(root: Path) -> int:
    count = 0
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            count += f"{root}/sleeper".encode() in Path(f"/proc/{pid}/cmdline").read_bytes()
        except OSError:
            pass
    return count
