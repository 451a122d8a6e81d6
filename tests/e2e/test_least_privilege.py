"""Nothing of colad listens on TCP but the configured metrics address, and only where configured."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.fakes.kubelet import FakeKubelet
from tests.helpers import metrics_address
from tests.service import ColadService

pytestmark = pytest.mark.e2e
LISTEN = "0A"


def socket_inodes(pid: int) -> set[str]:
    inodes = set()
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(target[8:-1])
    return inodes


def tcp_listeners() -> dict[str, str]:
    """inode -> "address:port" (hex as in /proc/net/tcp*) of every listening TCP socket."""
    found = {}
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            fields = line.split()
            if fields[3] == LISTEN:
                found[fields[9]] = fields[1]
    return found


def test_only_the_metrics_address_listens(colad: ColadService, kubelet: FakeKubelet) -> None:
    kubelet.wait_registered()
    address = metrics_address(colad.run_dir)
    pids = [*colad.pids().values(), colad.supervisord_pid()]
    listeners = tcp_listeners()
    ours = {inode: listeners[inode] for pid in pids for inode in socket_inodes(pid) if inode in listeners}
    port = int(address.rsplit(":", 1)[1])
    # 127.0.0.1 is 0100007F in /proc/net/tcp's little-endian hex.
    assert list(ours.values()) == [f"0100007F:{port:04X}"], ours
