"""A device directory configured through a symlink and '..' is watched where it is listed (real supervisord).

The configured path a/link/../colas leads the kernel to the directory beside link's target;
its lexical normalisation, a/colas, is another directory (a decoy here). A device file created
in the directory the kernel reaches gets to the kubelet at once, by inotify, not by the safety
rescan (an hour here), and the state file names that directory.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from colad.core import constants
from tests.fakes.kubelet import FakeKubelet
from tests.service import ColadService

pytestmark = pytest.mark.e2e
BASE = {"cocacola", "peisicola"}


@pytest.fixture
def through_link(short_tmp: Path) -> Iterator[ColadService]:
    (short_tmp / "a" / "colas").mkdir(parents=True)  # the decoy: where normpath would land
    (short_tmp / "target" / "x").mkdir(parents=True)
    os.symlink(short_tmp / "target" / "x", short_tmp / "a" / "link")
    (short_tmp / "target" / "colas").mkdir()
    configured = f"{short_tmp}/a/link/../colas"
    colad = ColadService(short_tmp, extra_env={"COLAD_DEVICE_DIR": configured, "COLAD_RESCAN_INTERVAL": "3600"})
    colad.device_dir = short_tmp / "target" / "colas"  # where add() and remove() write: the kernel's directory
    colad.add(*BASE)
    colad.start()
    yield colad
    rc = colad.stop()
    assert rc == 0, f"supervisord exited with {rc}\n" + colad.log()[-4000:]


def test_a_file_created_through_a_symlink_and_dotdot_path_reaches_the_kubelet_at_once(
    through_link: ColadService, kubelet: FakeKubelet
) -> None:
    colad = through_link
    kubelet.wait_devices(BASE, timeout=30)
    colad.add("fanta")
    kubelet.wait_devices(BASE | {"fanta"}, timeout=3)  # inotify; the rescan would take an hour
    colad.remove("peisicola")
    kubelet.wait_devices({"cocacola", "fanta"}, timeout=3)
    state = json.loads((colad.run_dir / constants.PLUGIN_STATE_NAME).read_text())
    assert [r["device_dir"] for r in state["resources"]] == [str(colad.device_dir)]
    assert "directory absent" not in colad.log()
