"""Two configured names that would map to one file or label stop colad with exit 2 and one line.

Through the real `python -m colad` (every role and `supervise`, which writes no supervisord.conf),
and under the real supervisord for `colad reload`: a clashing file is refused by the command and,
sent anyway, by every role, and the running resources stay registered and served.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.e2e.test_hostile_config import COLA, PEPSI, assert_refused, base_env, run_colad, write_config
from tests.fakes.kubelet import FakeKubelet
from tests.service import ColadService

pytestmark = pytest.mark.e2e

# (names, the keys before the [[resources]] tables, what the refusal must name)
CLASHES = [
    pytest.param(["a.com/x-y", "a.com-x/y"], "", "CDI spec file 'ROOT/cdi/colad-a.com-x-y.json'", id="spec-file"),
    pytest.param(
        ["a.com/x-y", "a.com-x/y"],
        'cdi = "off"\nnfd_features_file = "ROOT/features"\n',
        "NFD label 'feature.node.kubernetes.io/a.com-x-y.present'",
        id="nfd-label",
    ),
    pytest.param(
        ["a.com/gpu", "b.com/gpu"],
        'nfd_features_file = "ROOT/features"\nnfd_label_prefix = "example.com"\n',
        "NFD label 'example.com/gpu.present'",
        id="nfd-prefix",
    ),
]


def clash_config(root: Path, names: list[str], head: str) -> str:
    dirs = []
    for i in range(len(names)):
        (root / f"d{i}").mkdir(exist_ok=True)
        dirs.append(root / f"d{i}")
    text = f'cdi_spec_dir = "{root}/cdi"\n' + head.replace("ROOT", str(root))
    return text + "".join(
        f'[[resources]]\nname = "{n}"\ndevice_dir = "{d}"\n' for n, d in zip(names, dirs, strict=True)
    )


@pytest.mark.parametrize(("names", "head", "thing"), CLASHES)
def test_every_role_refuses_a_name_clash_with_one_line(
    names: list[str], head: str, thing: str, short_tmp: Path
) -> None:
    env = base_env(short_tmp)
    del env["COLAD_DEVICE_DIR"]
    env["COLAD_CDI_SPEC_DIR"] = str(short_tmp / "cdi")
    write_config(Path(env["COLAD_CONFIG"]), clash_config(short_tmp, names, head))
    for role in ("supervise", "discovery", "plugin", "kubelet-watch"):
        result = run_colad(role, env)
        shown = thing.replace("ROOT", str(short_tmp))
        assert_refused(result, "names: ", f"resource {names[0]!r} and resource {names[1]!r}", shown)
    assert not list(short_tmp.rglob("supervisord.conf*"))


@pytest.fixture
def cola_and_pepsi(short_tmp: Path, kubelet: FakeKubelet) -> Iterator[ColadService]:
    service = ColadService(short_tmp)
    del service.env["COLAD_DEVICE_DIR"]
    (short_tmp / "pepsis").mkdir()
    write_config(Path(service.env["COLAD_CONFIG"]), tables(service.device_dir, short_tmp / "pepsis", PEPSI))
    service.add("cocacola")
    (short_tmp / "pepsis" / "pepsi1").write_bytes(b"")
    service.start()
    yield service
    assert service.stop() == 0, service.log()[-4000:]


def tables(first: Path, second: Path, second_name: str, head: str = "") -> str:
    return (
        f'{head}[[resources]]\nname = "{COLA}"\ndevice_dir = "{first}"\n\n'
        f'[[resources]]\nname = "{second_name}"\ndevice_dir = "{second}"\n'
    )


def test_reload_refuses_a_name_clash_and_the_running_config_stays(
    cola_and_pepsi: ColadService, kubelet: FakeKubelet
) -> None:
    colad = cola_and_pepsi
    kubelet.wait_devices({"cocacola"}, resource=COLA)
    kubelet.wait_devices({"pepsi1"}, resource=PEPSI)
    endpoints = {r: kubelet.current_endpoint(r) for r in (COLA, PEPSI)}
    registrations = len(kubelet.successful_registrations())
    # myway5.com/cola and other.com/cola both become the labels example.com/cola.* under a prefix.
    head = f'nfd_features_file = "{colad.root}/features"\nnfd_label_prefix = "example.com"\n'
    write_config(
        Path(colad.env["COLAD_CONFIG"]), tables(colad.device_dir, colad.root / "pepsis", "other.com/cola", head)
    )
    result = run_colad("reload", colad.env)
    assert_refused(result, "names: ", f"resource {COLA!r} and resource 'other.com/cola'", "example.com/cola.present")
    colad.rpc().supervisor.signalProcessGroup("colad", "HUP")  # sent anyway: every role refuses it
    lines = colad.wait_log('msg="reload refused; the running config stays"', timeout=30, count=3)
    assert all("example.com/cola.present" in line for line in lines[-3:]), lines[-3:]
    assert sorted(kubelet.resources()) == sorted([COLA, PEPSI])
    assert {r: kubelet.current_endpoint(r) for r in (COLA, PEPSI)} == endpoints
    assert len(kubelet.successful_registrations()) == registrations
    assert not (colad.root / "features").exists()
    (colad.device_dir / "fanta").write_bytes(b"")
    kubelet.wait_devices({"cocacola", "fanta"}, resource=COLA)
    kubelet.wait_devices({"pepsi1"}, resource=PEPSI)


@pytest.mark.parametrize(
    ("key", "value", "shown"),
    [
        pytest.param(
            "COLAD_NFD_FEATURES_FILE",
            "RUN/queue.sock",
            "names: nfd_features_file and run_dir (the queue socket) both map to the path 'RUN/queue.sock'",
            id="nfd-file-is-the-queue-socket",
        ),
        pytest.param(
            "COLAD_NFD_FEATURES_FILE",
            "LINK/state/status.sock",
            "names: nfd_features_file and run_dir (the status socket) both map to the path 'RUN/state/status.sock'",
            id="nfd-file-is-the-status-socket-through-a-link",
        ),
        pytest.param(
            "COLAD_CDI_SPEC_DIR",
            "DEVICES",
            "names: cdi_spec_dir 'DEVICES' is in the device directory 'DEVICES'",
            id="spec-dir-is-the-device-dir",
        ),
    ],
)
def test_supervise_refuses_an_output_on_a_path_colad_owns_with_one_line(
    key: str, value: str, shown: str, short_tmp: Path
) -> None:
    env = base_env(short_tmp)
    run = Path(env["COLAD_RUN_DIR"])
    run.mkdir(parents=True, exist_ok=True)
    (short_tmp / "link").symlink_to(run)
    devices = Path(env["COLAD_DEVICE_DIR"])
    devices.mkdir(parents=True, exist_ok=True)

    def spelled(text: str) -> str:
        return text.replace("RUN", str(run)).replace("LINK", str(short_tmp / "link")).replace("DEVICES", str(devices))

    env[key] = spelled(value)
    result = run_colad("supervise", env)
    assert_refused(result, spelled(shown))
    assert not list(short_tmp.rglob("supervisord.conf*"))
