"""Host paths a user outside trusted_owners could redirect, under the real supervisord and the strict fake kubelet.

A root-owned, trusted device file names host paths in a directory uid 65534 can write; that user
swaps in symbolic links (`data -> /etc`, `node -> /dev/null`). The device is Unhealthy with the
reason, neither path is in an Allocate answer or the CDI spec, discovery logs one line and counts
`untrusted_host_path` once. A way made writable after discovery judged it (no watch tells) is
refused at Allocate, which looks at it again.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from tests.e2e.test_hostile_plugin import sample
from tests.fakes.kubelet import FakeKubelet
from tests.helpers import wait_until
from tests.service import ColadService

pytestmark = [pytest.mark.e2e, pytest.mark.skipif(os.geteuid() != 0, reason="chown needs root")]
H, U = "Healthy", "Unhealthy"
NOBODY = 65534


@pytest.fixture
def service(short_tmp: Path) -> Iterator[ColadService]:
    colad = ColadService(
        short_tmp,
        extra_env={"COLAD_RESCAN_INTERVAL": "3600", "COLAD_CDI_SPEC_DIR": str(short_tmp / "cdi")},
    )
    yield colad
    rc = colad.stop()
    assert rc == 0, f"supervisord exited with {rc}\n" + colad.log()[-4000:]


def as_nobody(script: str) -> None:
    subprocess.run(
        ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", "sh", "-c", script], check=True, timeout=30
    )


def device_text(source: Path, node: Path) -> str:
    return (
        f'[[mounts]]\nhost_path = "{source}"\ncontainer_path = "/data"\nread_only = false\n'
        f'[[device_nodes]]\nhost_path = "{node}"\ncontainer_path = "/dev/cola"\n'
    )


def spec_text(colad: ColadService) -> str:
    return "".join(p.read_text() for p in sorted((colad.root / "cdi").iterdir()))


@pytest.mark.parametrize("how", ["owned_by_65534", "mode_0777"])
def test_host_paths_a_user_can_redirect_are_never_handed_out(
    short_tmp: Path, service: ColadService, kubelet: FakeKubelet, how: str
) -> None:
    userdir = short_tmp / "userdir"
    userdir.mkdir()
    if how == "owned_by_65534":
        os.chown(userdir, NOBODY, NOBODY)
    else:
        userdir.chmod(0o777)
    as_nobody(f"ln -s /etc {userdir}/data && ln -s /dev/null {userdir}/node")
    (service.device_dir / "evil").write_text(device_text(userdir / "data", userdir / "node"))
    (service.device_dir / "good").write_text(device_text(Path("/etc"), Path("/dev/null")))
    service.start()
    kubelet.wait_devices({"evil": U, "good": H}, timeout=30)
    good = kubelet.allocate(["good"])
    assert good["mounts"] == [{"container_path": "/data", "host_path": "/etc", "read_only": False}]
    with pytest.raises(grpc.RpcError) as refused:
        kubelet.allocate(["evil"])
    assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT, refused.value
    wait_until(lambda: "good" in spec_text(service) and "evil" in spec_text(service), 30, "the CDI spec")
    assert str(userdir) not in spec_text(service)
    lines = service.wait_log('msg="device unhealthy" resource=myway5.com/cola device=evil')
    assert "untrusted: directory" in lines[0] and str(userdir) in lines[0], lines
    series = 'colad_input_rejected_total{reason="untrusted_host_path",role="discovery"}'
    wait_until(lambda: sample(service, series) == 1, 30, f"{series} == 1", logs=[service.log_path])
    (service.device_dir / "more").write_text("")  # another turn of discovery: nothing new said of evil
    kubelet.wait_devices({"evil": U, "good": H, "more": H}, timeout=30)
    assert len(service.log_lines("device=evil")) == 1
    assert sample(service, series) == 1
    # Made safe (the links now root's, in a directory only root can write): Healthy, handed out.
    os.chown(userdir, 0, 0)
    userdir.chmod(0o755)
    for link in ("data", "node"):
        os.lchown(userdir / link, 0, 0)
    kubelet.wait_devices({"evil": H, "good": H, "more": H}, timeout=30)
    assert kubelet.allocate(["evil"])["mounts"][0]["host_path"] == str(userdir / "data")


def test_a_way_made_writable_after_it_was_trusted_is_refused_at_allocate(
    short_tmp: Path, service: ColadService, kubelet: FakeKubelet
) -> None:
    base = short_tmp / "base"
    (base / "share" / "data").mkdir(parents=True)
    (service.device_dir / "cola").write_text(device_text(base / "share" / "data", Path("/dev/null")))
    service.start()
    kubelet.wait_devices({"cola": H}, timeout=30)
    assert kubelet.allocate(["cola"])["mounts"][0]["host_path"] == str(base / "share" / "data")
    # An ancestor above the watched parent tells only of its own move or removal: discovery has
    # not looked again, so the plugin still advertises it Healthy. Allocate looks for itself.
    base.chmod(0o777)
    with pytest.raises(grpc.RpcError) as refused:
        kubelet.allocate(["cola"])
    assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT, refused.value
    assert f"untrusted: directory {base} is writable by group and others" in str(refused.value.details())
    series = 'colad_input_rejected_total{reason="untrusted_host_path",role="plugin"}'
    assert sample(service, series) == 1
    assert len(service.wait_log('msg="allocate refused"')) == 1
    # The user then swaps the way (share -> a directory of theirs holding a link to /etc): the watch
    # on share tells discovery, which finds the way untrusted.
    as_nobody(
        f"mkdir {base}/mine && ln -s /etc {base}/mine/data && mv {base}/share {base}/old && ln -s mine {base}/share"
    )
    kubelet.wait_devices({"cola": U}, timeout=30)
    assert str(base) not in spec_text(service)
    # Counted once for the change (a later chmod that changes the reason is another change).
    wait_until(
        lambda: sample(service, 'colad_input_rejected_total{reason="untrusted_host_path",role="discovery"}') == 1,
        30,
        "counted",
    )
    base.chmod(0o755)
