"""Host-path health under the real supervisord, seen at the strict fake kubelet.

A device whose mount source or device node is missing is Unhealthy at the kubelet, Healthy again
when the path appears, Unhealthy when it goes; an optional entry's path does not matter. The
reason is logged once per change and counted in colad_device_health_changes. The safety rescan
is an hour away: inotify alone tells discovery.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.e2e.test_hostile_plugin import sample
from tests.fakes.kubelet import FakeKubelet
from tests.helpers import wait_until
from tests.service import ColadService

pytestmark = pytest.mark.e2e
H, U = "Healthy", "Unhealthy"


@pytest.fixture
def service(short_tmp: Path) -> Iterator[ColadService]:
    colad = ColadService(
        short_tmp, extra_env={"COLAD_RESCAN_INTERVAL": "3600", "COLAD_CDI_SPEC_DIR": str(short_tmp / "cdi")}
    )
    yield colad
    rc = colad.stop()
    assert rc == 0, f"supervisord exited with {rc}\n" + colad.log()[-4000:]


def test_a_missing_host_path_keeps_the_device_unhealthy_at_the_kubelet(
    short_tmp: Path, service: ColadService, kubelet: FakeKubelet
) -> None:
    host = short_tmp / "host"
    source, node = host / "share" / "data", host / "dev" / "cola0"
    files = {
        "mounted": f'[[mounts]]\nhost_path = "{source}"\ncontainer_path = "/data"\n',
        "noded": f'[[device_nodes]]\nhost_path = "{node}"\ncontainer_path = "/dev/cola"\n',
        "optional": f'[[mounts]]\nhost_path = "{host / "nowhere"}"\ncontainer_path = "/x"\noptional = true\n',
        "plain": "",
    }
    for name, text in files.items():
        (service.device_dir / name).write_text(text)
    service.start()
    kubelet.wait_devices({"mounted": U, "noded": U, "optional": H, "plain": H}, timeout=30)
    assert len(service.wait_log('reason="mounts[0].host_path')) == 1
    (host / "share").mkdir(parents=True)  # two levels at once: the watch follows the tree
    source.write_text("x")
    kubelet.wait_devices({"mounted": H, "noded": U, "optional": H, "plain": H}, timeout=30)
    (host / "dev").mkdir()
    (host / "dev" / "cola0").write_text("not a device node")
    service.wait_log("is not a device node", timeout=30)
    assert kubelet.devices() == {"mounted": H, "noded": U, "optional": H, "plain": H}
    # Replaced in one rename: an unlink first would be a moment of "does not exist", a fifth change.
    os.mknod(node.with_name("new"), 0o600 | stat.S_IFCHR, os.makedev(1, 3))
    os.rename(node.with_name("new"), node)
    kubelet.wait_devices({"mounted": H, "noded": H, "optional": H, "plain": H}, timeout=30)
    source.unlink()
    kubelet.wait_devices({"mounted": U, "noded": H, "optional": H, "plain": H}, timeout=30)
    # Discovery logs after it publishes (the kubelet hears first): wait for the line, then count.
    assert len(service.wait_log('msg="device unhealthy" resource=myway5.com/cola device=mounted', count=2)) == 2
    series = 'colad_device_health_changes_total{reason="host_path"}'
    # mounted and noded at start, noded's reason changing to "not a device node", mounted's source gone.
    unhealthy = 'msg="device unhealthy"'

    def counted() -> bool:
        value = sample(service, series)
        if value != 4.0:
            raise AssertionError(f"{series} {value}; logged: {service.log_lines(unhealthy)}")
        return True

    wait_until(counted, 30, f"{series} 4", logs=[service.log_path])
    assert sample(service, 'colad_device_health_changes_total{reason="recovered"}') == 2.0
