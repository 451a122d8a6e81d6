"""Allocate names a CDI device only when colad's spec on disk lists it, real daemon.

With `cdi = "only"`, a device the spec file does not list (the spec deleted, its directory
unusable so discovery cannot write it) is answered in the classic form (mounts, envs): a CDI
name would fail the container at the runtime. One warning per change of reason, one line when
the spec lists the devices again, and CDI names again from then on.
"""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from colad.core import namemap
from tests.e2e.test_hostile_plugin import sample
from tests.fakes.kubelet import FakeKubelet
from tests.helpers import wait_until
from tests.service import ColadService

pytestmark = pytest.mark.e2e
RESOURCE = "myway5.com/cola"
FALLBACK = "devices not in colad's CDI spec"


@pytest.fixture
def service(short_tmp: Path) -> Iterator[ColadService]:
    env = {"COLAD_CDI": "only", "COLAD_RESCAN_INTERVAL": "3600", "COLAD_CDI_SPEC_DIR": str(short_tmp / "cdi")}
    colad = ColadService(short_tmp, extra_env=env)
    yield colad
    rc = colad.stop()
    assert rc == 0, f"supervisord exited with {rc}\n" + colad.log()[-4000:]


def fallbacks(colad: ColadService, reason: str) -> float | None:
    return sample(colad, f'colad_cdi_fallbacks_total{{reason="{reason}",resource="{RESOURCE}"}}')


def device_file(share: Path, mode: str) -> str:
    return f'[envs]\nMODE = "{mode}"\n[[mounts]]\nhost_path = "{share}"\ncontainer_path = "/opt/cola"\n'


def test_cdi_names_only_for_devices_the_written_spec_lists(
    short_tmp: Path, service: ColadService, kubelet: FakeKubelet
) -> None:
    share, spec_dir = short_tmp / "share", short_tmp / "cdi"
    spec_path = spec_dir / namemap.cdi_spec_file(RESOURCE)
    share.mkdir()
    (service.device_dir / "cola0").write_text(device_file(share, "fast"))
    service.start()
    kubelet.wait_devices({"cola0": "Healthy"}, timeout=30)
    wait_until(spec_path.exists, 30, "the spec written", logs=[service.log_path])
    by_cdi = {"envs": {"COLA_DEVICES": "cola0"}, "mounts": [], "cdi_devices": [f"{RESOURCE}=cola0"]}
    classic = {
        "envs": {"MODE": "fast", "COLA_DEVICES": "cola0"},
        "mounts": [{"container_path": "/opt/cola", "host_path": str(share), "read_only": True}],
        "cdi_devices": [],
    }

    def answer() -> dict[str, object]:
        got = kubelet.allocate(["cola0"])
        return {k: got[k] for k in ("envs", "mounts", "cdi_devices")}

    assert answer() == by_cdi
    assert fallbacks(service, "missing") == 0.0

    # The spec deleted behind colad's back: nothing a runtime could resolve the name with.
    spec_path.unlink()
    assert answer() == classic
    assert answer() == classic
    lines = service.wait_log(FALLBACK, timeout=30)
    assert len(lines) == 1 and "reason=missing" in lines[0] and "devices=cola0" in lines[0], lines
    assert fallbacks(service, "missing") == 2.0  # each answer counted, the line said once

    # A change makes discovery write the spec again: named by CDI again, and said once.
    (service.device_dir / "cola0").write_text(device_file(share, "slow"))
    wait_until(spec_path.exists, 30, "the spec written again", logs=[service.log_path])
    wait_until(lambda: answer()["cdi_devices"] == [f"{RESOURCE}=cola0"], 30, "a CDI name again")
    assert answer() == by_cdi
    assert len(service.wait_log("CDI spec lists the devices again", timeout=30)) == 1

    # The spec directory unusable (a file in its place): discovery cannot write the spec of a new device.
    shutil.rmtree(spec_dir)
    spec_dir.write_text("not a directory\n")
    (service.device_dir / "cola1").write_text(device_file(share, "new"))
    kubelet.wait_devices({"cola0": "Healthy", "cola1": "Healthy"}, timeout=30)
    service.wait_log('msg="cannot write file; retried at the next change or rescan" file="cdi', timeout=30)
    got = kubelet.allocate(["cola1"])
    assert got["cdi_devices"] == [] and got["envs"]["MODE"] == "new" and len(got["mounts"]) == 1, got
    lines = service.wait_log(FALLBACK, timeout=30, count=2)
    assert len(lines) == 2 and "reason=unreadable" in lines[1] and "devices=cola1" in lines[1], lines
    assert fallbacks(service, "unreadable") == 1.0

    # The directory usable again: the next change writes the spec, and both devices are named by CDI.
    spec_dir.unlink()
    (service.device_dir / "cola1").write_text(device_file(share, "newer"))
    wait_until(spec_path.exists, 30, "the spec in the usable directory", logs=[service.log_path])
    want = [f"{RESOURCE}=cola1", f"{RESOURCE}=cola0"]
    wait_until(lambda: kubelet.allocate(["cola1", "cola0"])["cdi_devices"] == want, 30, "both named by CDI")
    assert len(service.log_lines("CDI spec lists the devices again")) == 2
    assert len(service.log_lines(FALLBACK)) == 2
    assert (fallbacks(service, "missing"), fallbacks(service, "not_listed")) == (2.0, 0.0)
