"""`colad status` names every Unhealthy device and why, from the plugin's state file, end to end.

Under the real supervisord: a device whose host path is missing (discovery's reason crosses the
queue), a malformed device file (its problem) and one its file declares Unhealthy each get a line;
the state file lists them with their reasons; a host path that appears takes its line away.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.fakes.kubelet import FakeKubelet
from tests.helpers import wait_until
from tests.service import ColadService

pytestmark = pytest.mark.e2e


@pytest.fixture
def colad(short_tmp: Path, kubelet: FakeKubelet) -> Iterator[ColadService]:
    service = ColadService(short_tmp)
    service.add("cocacola")
    data = short_tmp / "host" / "cola0"
    (service.device_dir / "gone").write_text(f'[[mounts]]\nhost_path = "{data}"\ncontainer_path = "/opt/cola0"\n')
    (service.device_dir / "broken").write_text("numa_nodes = [1\n")
    (service.device_dir / "declared").write_text('health = "Unhealthy"\n')
    service.start()
    yield service
    rc = service.stop()
    assert rc == 0, f"supervisord exited with {rc}\n" + service.log()[-4000:]


def status_lines(colad: ColadService) -> list[str]:
    done = subprocess.run(
        [sys.executable, "-m", "colad", "status"], env=colad.env, capture_output=True, text=True, timeout=20
    )
    return [line for line in done.stdout.splitlines() if line.startswith("unhealthy:")]


def test_status_shows_each_unhealthy_device_and_why(colad: ColadService, kubelet: FakeKubelet, short_tmp: Path) -> None:
    sick = {"gone": "Unhealthy", "broken": "Unhealthy", "declared": "Unhealthy"}
    kubelet.wait_devices({"cocacola": "Healthy", **sick}, timeout=30)
    lines = wait_until(lambda: got if len(got := status_lines(colad)) == 3 else None, 30, "three unhealthy lines")
    assert lines[0].startswith("unhealthy:  broken: malformed device file: ") and "TOML" in lines[0]
    assert lines[1] == "unhealthy:  declared: no reason given"
    assert lines[2].startswith("unhealthy:  gone: ") and "cola0" in lines[2], lines
    state = json.loads((colad.run_dir / "state" / "plugin.json").read_text())["resources"][0]
    assert [d["id"] for d in state["unhealthy_devices"]] == ["broken", "declared", "gone"]
    assert state["unhealthy_more"] == 0 and state["unhealthy_devices"][0]["malformed"] is True
    (short_tmp / "host" / "cola0").mkdir(parents=True)  # the host path appears: healthy, its line goes
    kubelet.wait_devices({"cocacola": "Healthy", "gone": "Healthy", "broken": "Unhealthy", "declared": "Unhealthy"}, 30)
    wait_until(lambda: len(status_lines(colad)) == 2, 30, "the host path's line to go")
    assert not any("gone" in line for line in status_lines(colad))
