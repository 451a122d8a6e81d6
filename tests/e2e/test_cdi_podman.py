"""A real CDI consumer: podman resolves `--device myway5.com/cola=<id>` from the spec colad wrote.

Device files on disk are parsed by colad/discovery/devicefile.py, turned into a spec by colad/outputs/cdi.py and
written by its SpecWriter, as discovery will do; podman 4.3 (Debian's) then runs a container with
the CDI name Allocate answers, and the container must see the env, the mount (read-only) and a
real device node (a char device 1:3, made with mknod). podman reads specs only from /etc/cdi and
/var/run/cdi (PLATFORM-NOTES section 8), so it runs in a private mount namespace where /etc is an
overlay holding /etc/cdi bound to the test's spec directory and /run/cdi, if present, is hidden:
the machine's own spec directories stay untouched, and the test checks that they do.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from colad.core import namemap
from colad.core.devices import DeviceSet, replicate
from colad.discovery.devicefile import parse
from colad.outputs import cdi
from tests import image
from tests.oracles import cdi_spec, spec_bytes

RESOURCE = "myway5.com/cola"
MACHINE_SPEC_DIRS = ("/etc/cdi", "/var/run/cdi", "/run/cdi")
PODMAN_TIMEOUT = 180  # the machine is shared and loaded; one run takes about 0.3 s when idle


def _why_not() -> str | None:
    if shutil.which("unshare") is None:
        return "unshare (util-linux) is not installed"
    return image.unusable()


WHY_NOT = _why_not()


# Podman usable, then the base image (tests/e2e/conftest.py): a missing image is imported, not a reason to skip.
needs_podman = [pytest.mark.skipif(WHY_NOT is not None, reason=WHY_NOT or ""), pytest.mark.usefixtures("base_image")]
pytestmark = [pytest.mark.e2e, *needs_podman]


def _machine_state() -> dict[str, object]:
    return {p: sorted(os.listdir(p)) if os.path.isdir(p) else os.path.lexists(p) for p in MACHINE_SPEC_DIRS}


def _scan(device_dir: Path, replicas: int = 1) -> DeviceSet:
    """What discovery builds from the directory (file name = ID, content parsed)."""
    devices = [parse(p.name, p.read_bytes()) for p in sorted(device_dir.iterdir()) if p.is_file()]
    return replicate(DeviceSet.of(devices), replicas)


def _run(root: Path, spec_dir: Path, device_id: str, script: str) -> subprocess.CompletedProcess[str]:
    return image.run_with_cdi(root, spec_dir, [namemap.cdi_device_name(RESOURCE, device_id)], script, PODMAN_TIMEOUT)


SEE = (
    'echo "marks $(env | grep ^COLA_DEVICE_ | sort | tr "\\n" " ")"; '
    'echo "mode $MODE"; '
    'echo "node $(stat -c "%F %t:%T" /dev/cola)"; '
    'echo "write-node $(echo x > /dev/cola && echo ok || echo refused)"; '
    'echo "mount $(cat /opt/cola/hello)"; '
    'echo "write-mount $( (echo x > /opt/cola/y) 2>/dev/null && echo ok || echo refused)"'
)


def _seen(result: subprocess.CompletedProcess[str]) -> dict[str, str]:
    assert result.returncode == 0, f"podman exited {result.returncode}:\n{result.stdout}\n{result.stderr}"
    return dict(line.split(" ", 1) for line in result.stdout.splitlines() if " " in line)


def test_podman_gives_the_container_what_the_device_file_says_and_follows_a_change(short_tmp: Path) -> None:
    before = _machine_state()
    device_dir, spec_dir, host = short_tmp / "colas", short_tmp / "cdi", short_tmp / "host"
    for d in (device_dir, host / "dev", host / "share"):
        d.mkdir(parents=True)
    os.mknod(host / "dev" / "cola0", 0o666 | 0o020000, os.makedev(1, 3))  # /dev/null's numbers: harmless
    (host / "share" / "hello").write_text("from the host\n")
    device_file = device_dir / "cola0"
    content = f"""
[envs]
MODE = "fast"

[[device_nodes]]
host_path = "{host}/dev/cola0"
container_path = "/dev/cola"
permissions = "rw"

[[mounts]]
host_path = "{host}/share"
container_path = "/opt/cola"
"""
    device_file.write_text(content)
    (device_dir / "cola1").write_text("")
    writer = cdi.SpecWriter(str(spec_dir))
    spec = cdi_spec(RESOURCE, _scan(device_dir))
    assert writer.write_bytes(RESOURCE, spec_bytes(spec)) is True
    assert spec is not None and spec.version == "0.5.0"  # a renamed device node needs hostPath
    assert os.listdir(spec_dir) == ["colad-myway5.com-cola.json"]

    seen = _seen(_run(short_tmp, spec_dir, "cola0", SEE))
    assert seen["marks"] == "COLA_DEVICE_cola0=cola0 ", seen  # cola0 alone: the container got one device
    assert seen["mode"] == "fast"
    assert seen["node"] == "character special file 1:3"
    assert seen["write-node"] == "ok"
    assert seen["mount"] == "from the host"
    assert seen["write-mount"] == "refused"  # read_only defaults to true

    # A change of the device file reaches the spec, and the next container: a new value, a
    # writable mount, and two replicas of every device.
    device_file.write_text(content.replace('"fast"', '"slow"') + "read_only = false\n")
    changed = cdi_spec(RESOURCE, _scan(device_dir, replicas=2))
    assert writer.write_bytes(RESOURCE, spec_bytes(changed)) is True
    seen = _seen(_run(short_tmp, spec_dir, "cola0::1", SEE))
    assert seen["mode"] == "slow"
    assert seen["marks"] == "COLA_DEVICE_cola0_3A_3A1=cola0::1 ", seen
    assert seen["node"] == "character special file 1:3"
    assert seen["write-mount"] == "ok"
    assert (host / "share" / "y").read_text() == "x\n"

    # A bare device (an empty file) resolves too: its marker keeps its edits non-empty.
    bare = _seen(_run(short_tmp, spec_dir, "cola1::0", 'echo "marks $(env | grep ^COLA_DEVICE_)"'))
    assert bare["marks"] == "COLA_DEVICE_cola1_3A_3A0=cola1::0"

    # Stop: the spec is removed, and podman no longer resolves the name.
    assert writer.write_bytes(RESOURCE, None) is True
    gone = _run(short_tmp, spec_dir, "cola0::1", "true")
    assert gone.returncode != 0 and "unresolvable CDI devices" in gone.stderr, gone.stderr
    assert _machine_state() == before
