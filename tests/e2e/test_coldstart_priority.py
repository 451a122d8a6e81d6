"""Who gets the CPUs during a cold start, under the real supervisord.

The plugin's Register waits on its own imports and on discovery's first snapshot; kubelet-watch is
needed by neither (the plugin stats kubelet.sock itself at start), so it runs niced and leaves the
node's CPUs to the two on the path (the watchdog runs inside supervisord, not niced). Read from /proc,
as the kernel schedules.
"""

from __future__ import annotations

import os

import pytest

from tests.service import ColadService

pytestmark = pytest.mark.e2e


def nice_of(pid: int) -> int:
    with open(f"/proc/{pid}/stat") as handle:
        fields = handle.read().rsplit(")", 1)[1].split()
    return int(fields[16])  # field 19 of proc(5), counted after the command name's ")"


def test_only_the_roles_off_the_register_path_run_niced(colad: ColadService) -> None:
    base = os.nice(0)  # the test's own: the service inherits it
    pids = colad.pids()
    nices = {role: nice_of(pid) - base for role, pid in sorted(pids.items())}
    assert nices == {"discovery": 0, "kubelet-watch": 10, "plugin": 0}
    assert nice_of(colad.supervisord_pid()) - base == 0
