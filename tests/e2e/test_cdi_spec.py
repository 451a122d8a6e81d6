"""Discovery writes the CDI spec a real podman consumes, from the device file to the container.

colad runs under the real supervisord with its spec directory in the test's tree; podman runs in
a private mount namespace where that directory is /etc/cdi (tests/e2e/test_cdi_podman.py's
namespace trick), so the machine's own spec directories stay untouched. A change of the device
file reaches the spec and the next container; a graceful stop removes the spec. The NFD feature
file written beside it carries the resource's presence and healthy counts.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from colad.core import namemap
from colad.outputs import cdi
from tests.e2e.test_cdi_podman import RESOURCE, SEE, _machine_state, _run, _seen, needs_podman
from tests.fakes.kubelet import FakeKubelet
from tests.helpers import wait_until
from tests.oracles import nfd_labels
from tests.service import ColadService
from tests.unit.outputs.test_cdi import _schema

pytestmark = [pytest.mark.e2e, *needs_podman]


def _spec(path: Path) -> dict[str, object] | None:
    try:
        return dict(json.loads(path.read_text()))
    except (FileNotFoundError, ValueError):
        return None


def test_discovery_writes_the_spec_podman_uses_and_removes_it_on_stop(short_tmp: Path, kubelet: FakeKubelet) -> None:
    before = _machine_state()
    colad = ColadService(
        short_tmp,
        extra_env={
            "COLAD_RESOURCE_NAME": RESOURCE,
            "COLAD_CDI_SPEC_DIR": str(short_tmp / "cdi"),
            "COLAD_NFD_FEATURES_FILE": str(short_tmp / "features.d" / "colad"),
            "COLAD_RESCAN_INTERVAL": "3600",
        },
    )
    try:
        _scenario(short_tmp, colad, kubelet)
    finally:
        colad.stop()
    assert _machine_state() == before


def _scenario(root: Path, colad: ColadService, kubelet: FakeKubelet) -> None:
    spec_dir, host = root / "cdi", root / "host"
    spec_path = spec_dir / namemap.cdi_spec_file(RESOURCE)
    for d in (host / "dev", host / "share"):
        d.mkdir(parents=True)
    os.mknod(host / "dev" / "cola0", 0o666 | 0o020000, os.makedev(1, 3))  # /dev/null's numbers: harmless
    (host / "share" / "hello").write_text("from the host\n")
    content = f"""
[envs]
MODE = "fast"

[[device_nodes]]
host_path = "{host}/dev/cola0"
container_path = "/dev/cola"

[[mounts]]
host_path = "{host}/share"
container_path = "/opt/cola"
"""
    (colad.device_dir / "cola0").write_text(content)
    (colad.device_dir / "cola1").write_text(f'[[mounts]]\nhost_path = "{host}/absent"\ncontainer_path = "/x"\n')
    colad.start()
    kubelet.wait_devices({"cola0": "Healthy", "cola1": "Unhealthy"}, timeout=30, resource=RESOURCE)
    wait_until(lambda: _spec(spec_path) is not None, 30, "the spec written at start", logs=[colad.log_path])
    spec = _spec(spec_path)
    assert spec is not None and spec["kind"] == RESOURCE and spec["cdiVersion"] == "0.5.0", spec
    jsonschema = pytest.importorskip("jsonschema")
    assert [e.message for e in jsonschema.Draft7Validator(_schema()).iter_errors(spec)] == []  # the published schema
    assert spec["cdiVersion"] == cdi.required_version(spec)
    features = root / "features.d" / "colad"
    labels = nfd_labels(features.read_bytes())
    assert labels == {"myway5.com-cola.present": "true", "myway5.com-cola.devices": "2", "myway5.com-cola.healthy": "1"}

    seen = _seen(_run(root, spec_dir, "cola0", SEE))
    assert seen["marks"] == "COLA_DEVICE_cola0=cola0 ", seen
    assert seen["mode"] == "fast"
    assert seen["node"] == "character special file 1:3"
    assert seen["mount"] == "from the host"
    assert seen["write-mount"] == "refused"

    # A change of the device file reaches the spec (discovery rewrites it) and the next container.
    (colad.device_dir / "cola0").write_text(content.replace('"fast"', '"slow"') + "read_only = false\n")

    def slow() -> bool:
        spec = _spec(spec_path) or {}
        return any("MODE=slow" in d["containerEdits"]["env"] for d in spec.get("devices", []))  # type: ignore[attr-defined]

    wait_until(slow, 30, "MODE=slow in the spec", logs=[colad.log_path])
    seen = _seen(_run(root, spec_dir, "cola0", SEE))
    assert seen["mode"] == "slow" and seen["write-mount"] == "ok", seen
    (host / "absent").mkdir()
    wait_until(lambda: nfd_labels(features.read_bytes())["myway5.com-cola.healthy"] == "2", 30, "healthy=2")

    # Graceful stop: discovery takes the spec away, and podman no longer resolves the name.
    assert colad.stop() == 0
    assert not spec_path.exists()
    gone = _run(root, spec_dir, "cola0", "true")
    assert gone.returncode != 0 and "unresolvable CDI devices" in gone.stderr, gone.stderr
