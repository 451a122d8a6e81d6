"""colad.runtime.kubeletdir: colad's socket names, fresh endpoints, and the one liveness probe.

Sockets are real AF_UNIX sockets bound in tmp_path: a listening one is LIVE, a
bound-then-closed one (the file a dead process leaves) and a missing one DEAD.
"""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from colad.runtime import kubeletdir
from colad.runtime.kubeletdir import Dial

pytestmark = pytest.mark.integration


@pytest.mark.parametrize(
    ("name", "ours"),
    [
        pytest.param("colad-1700000000000.sock", True, id="stamped"),
        pytest.param("colad-.sock", True, id="empty-stamp"),
        pytest.param("kubelet.sock", False, id="kubelet"),
        pytest.param("colad-1.sock.tmp", False, id="suffix"),
        pytest.param("xcolad-1.sock", False, id="prefix"),
        pytest.param("kubelet_internal_checkpoint", False, id="checkpoint"),
    ],
)
def test_plugin_socket_names(name: str, ours: bool) -> None:
    assert kubeletdir.is_plugin_socket_name(name) is ours


def test_endpoint_names_are_ours() -> None:
    assert kubeletdir.endpoint_name(12) == "colad-12.sock"
    assert kubeletdir.is_plugin_socket_name(kubeletdir.endpoint_name(1_700_000_000_000))


def test_fresh_socket_path_skips_names_on_disk_and_taken(tmp_path: Path) -> None:
    (tmp_path / "colad-1000.sock").write_text("")
    taken = {str(tmp_path / "colad-1001.sock")}
    assert kubeletdir.fresh_socket_path(str(tmp_path), 1.0, taken) == str(tmp_path / "colad-1002.sock")
    assert kubeletdir.fresh_socket_path(str(tmp_path), 2.0) == str(tmp_path / "colad-2000.sock")


def _bound(path: Path, *, listen: bool) -> socket.socket:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.bind(str(path))
    if listen:
        sock.listen(1)
    return sock


def test_dial_tells_live_from_dead(short_tmp: Path) -> None:
    live = _bound(short_tmp / "live.sock", listen=True)
    _bound(short_tmp / "stale.sock", listen=False).close()
    try:
        assert kubeletdir.dial(str(short_tmp / "live.sock"), 1.0) == kubeletdir.SocketProbe(Dial.LIVE)
        stale = kubeletdir.dial(str(short_tmp / "stale.sock"), 1.0)
        assert (stale.answer, stale.reason) == (Dial.DEAD, "connection refused")
        assert kubeletdir.dial(str(short_tmp / "none.sock"), 1.0) == kubeletdir.SocketProbe(Dial.DEAD, "no such file")
        assert kubeletdir.dial("bad\0path", 1.0).dead
    finally:
        live.close()


def test_plugin_sockets_lists_only_sockets(short_tmp: Path) -> None:
    keep = _bound(short_tmp / "colad-2.sock", listen=False)
    (short_tmp / "colad-1.sock").mkdir()
    (short_tmp / "colad-3.sock").write_text("")
    try:
        assert kubeletdir.plugin_sockets(str(short_tmp)) == ("colad-2.sock",)
        assert kubeletdir.plugin_socket_names(str(short_tmp)) == ["colad-1.sock", "colad-2.sock", "colad-3.sock"]
        assert kubeletdir.plugin_sockets(str(short_tmp / "absent")) == ()
        identity = kubeletdir.socket_identity(str(short_tmp / "colad-2.sock"))
        assert identity.count(":") == 2
        assert kubeletdir.socket_identity(str(short_tmp / "colad-3.sock")) == ""
    finally:
        keep.close()
