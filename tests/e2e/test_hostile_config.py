"""Hostile configuration end to end: bad values stop colad with exit 2 and one line, never a traceback.

Paths and addresses the code cannot use, and one device directory through two resources or nested,
through the real `python -m colad`, under the real supervisord for start and
`colad reload`; a seeded sample of the in-process fuzz (tests/unit/config/test_hostile.py) as subprocesses.
"""

from __future__ import annotations

import random
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.fakes.kubelet import FakeKubelet
from tests.service import ColadService
from tests.unit.config import test_hostile as fuzz

pytestmark = pytest.mark.e2e

COLA = "myway5.com/cola"
PEPSI = "myway5.com/pepsi"


def run_colad(role: str, env: dict[str, str], timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "colad", role],
        env=env,
        capture_output=True,
        text=True,
        errors="backslashreplace",
        stdin=subprocess.DEVNULL,
        timeout=timeout,
    )


def assert_refused(result: subprocess.CompletedProcess[str], *fragments: str) -> None:
    """Exit 2, exactly one line on stderr naming the key, nothing else; no traceback anywhere."""
    described = f"rc={result.returncode} stdout={result.stdout!r} stderr={result.stderr!r}"
    assert result.returncode == 2, described
    assert len(result.stderr.splitlines()) == 1 and result.stderr.startswith("colad: "), described
    assert "Traceback" not in result.stderr + result.stdout, described
    for fragment in fragments:
        assert fragment in result.stderr, described


def base_env(root: Path) -> dict[str, str]:
    """A ColadService environment in `root`, without starting anything."""
    return dict(ColadService(root).env)


# --- each bad path class, through COLAD_* ---------------------------------------------------------

BAD_PATHS = [
    pytest.param("COLAD_DEVICE_DIR", "{root}/bad\udcff\udcfe", "device_dir", id="device-dir-not-utf8"),
    pytest.param("COLAD_KUBELET_DIR", "{root}/k\udcff", "kubelet_dir", id="kubelet-dir-not-utf8"),
    pytest.param("COLAD_RUN_DIR", "{root}/run\udcff", "run_dir", id="run-dir-not-utf8"),
    pytest.param("COLAD_POD_RESOURCES_SOCKET", "{root}/p\udcff.sock", "pod_resources_socket", id="pod-not-utf8"),
    pytest.param("COLAD_SUPERVISORD_TEMPLATE", "{root}/t\udcff", "supervisord_template", id="template-not-utf8"),
    pytest.param("COLAD_RUN_DIR", "{root}/" + "r" * 90, "run_dir", id="run-dir-too-long"),
    pytest.param("COLAD_KUBELET_DIR", "{root}/" + "k" * 90, "kubelet_dir", id="kubelet-dir-too-long"),
    pytest.param("COLAD_KUBELET_DIR", "{root}/k#1", "kubelet_dir", id="kubelet-dir-grpc-fragment"),
    pytest.param("COLAD_RUN_DIR", "{root}/run%(here)s", "run_dir", id="run-dir-percent"),
    pytest.param("COLAD_RUN_DIR", "{root}/run ;x", "run_dir", id="run-dir-comment"),
    pytest.param("COLAD_RUN_DIR", "run", "run_dir", id="run-dir-relative"),
    pytest.param("COLAD_DEVICE_DIR", "{root}/a\tb", "device_dir", id="device-dir-control"),
    pytest.param("COLAD_METRICS_ADDRESS", "a" * 64 + ":9647", "metrics_address", id="metrics-host-label-64"),
    pytest.param("COLAD_CONFIG", "{root}/c\udcff.toml", "config file", id="config-path-not-utf8"),
]


@pytest.mark.parametrize("var, value, key", BAD_PATHS)
def test_supervise_refuses_a_bad_path_with_one_line(var: str, value: str, key: str, short_tmp: Path) -> None:
    env = base_env(short_tmp)
    env[var] = value.format(root=short_tmp)
    assert_refused(run_colad("supervise", env), key)
    # Nothing was rendered: no supervisord.conf, empty or otherwise, anywhere under the root.
    assert not list(short_tmp.rglob("supervisord.conf*"))


@pytest.mark.parametrize("role", ["discovery", "plugin", "kubelet-watch", "reload", "status", "check"])
@pytest.mark.parametrize("var, value, key", [BAD_PATHS[0], BAD_PATHS[1], BAD_PATHS[6]])
def test_every_role_refuses_a_bad_path_with_one_line(
    role: str, var: str, value: str, key: str, short_tmp: Path
) -> None:
    env = base_env(short_tmp)
    env[var] = value.format(root=short_tmp)
    assert_refused(run_colad(role, env), key)


def test_a_run_dir_that_is_a_file_is_one_line_and_no_conf(short_tmp: Path) -> None:
    env = base_env(short_tmp)
    (short_tmp / "run").write_text("not a directory\n")
    result = run_colad("supervise", env)
    assert result.returncode == 1 and len(result.stderr.splitlines()) == 1, result
    assert "run_dir" in result.stderr and "Traceback" not in result.stderr
    assert not list(short_tmp.rglob("supervisord.conf*"))


# --- aliases and nesting, at start and on reload --------------------------------------------------


def write_config(path: Path, text: str) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(text)
    tmp.replace(path)


def two_tables(first: Path | str, second: Path | str) -> str:
    return (
        f'[[resources]]\nname = "{COLA}"\ndevice_dir = "{first}"\n\n'
        f'[[resources]]\nname = "{PEPSI}"\ndevice_dir = "{second}"\nreplicas = 2\n'
    )


def bad_pairs(root: Path) -> list[tuple[str, str, str, str]]:
    colas = root / "colas"
    (root / "alias").symlink_to(colas)
    (colas / "inner").mkdir(exist_ok=True)
    return [
        ("trailing-slash", str(colas), f"{colas}/", "same directory"),
        ("dot", str(colas), f"{root}/./colas", "same directory"),
        ("symlink", str(colas), str(root / "alias"), "same directory"),
        ("nested", str(colas), str(colas / "inner"), "is inside"),
    ]


def test_supervise_refuses_aliases_and_nesting(short_tmp: Path) -> None:
    env = base_env(short_tmp)
    del env["COLAD_DEVICE_DIR"]
    for name, first, second, reason in bad_pairs(short_tmp):
        write_config(Path(env["COLAD_CONFIG"]), two_tables(first, second))
        result = run_colad("supervise", env)
        assert_refused(result, "resources[1].device_dir", reason)
        assert not list(short_tmp.rglob("supervisord.conf*")), name


@pytest.fixture
def two_resources(short_tmp: Path, kubelet: FakeKubelet) -> Iterator[ColadService]:
    service = ColadService(short_tmp)
    del service.env["COLAD_DEVICE_DIR"]
    pepsis = short_tmp / "pepsis"
    pepsis.mkdir()
    write_config(Path(service.env["COLAD_CONFIG"]), two_tables(service.device_dir, pepsis))
    service.add("cocacola")
    (pepsis / "pepsi1").write_bytes(b"")
    service.start()
    yield service
    assert service.stop() == 0, service.log()[-4000:]


def test_reload_refuses_aliases_and_nesting_and_the_running_config_stays(
    two_resources: ColadService, kubelet: FakeKubelet
) -> None:
    colad = two_resources
    kubelet.wait_devices({"cocacola"}, resource=COLA)
    kubelet.wait_devices({"pepsi1::0", "pepsi1::1"}, resource=PEPSI)
    endpoints = {r: kubelet.current_endpoint(r) for r in (COLA, PEPSI)}
    registrations = len(kubelet.successful_registrations())
    config_path = Path(colad.env["COLAD_CONFIG"])
    refusals = 0
    for name, first, second, reason in bad_pairs(colad.root):
        write_config(config_path, two_tables(first, second))
        result = run_colad("reload", colad.env)
        assert_refused(result, "resources[1].device_dir", reason)
        # Sent anyway (kill -HUP, systemctl reload): every process refuses it and keeps running.
        colad.rpc().supervisor.signalProcessGroup("colad", "HUP")
        refusals += 3
        lines = colad.wait_log('msg="reload refused; the running config stays"', timeout=30, count=refusals)
        assert reason in lines[-1], (name, lines[-1])
    # The running config stayed: same resources, endpoints and registrations, and it still works.
    assert sorted(kubelet.resources()) == sorted([COLA, PEPSI])
    assert {r: kubelet.current_endpoint(r) for r in (COLA, PEPSI)} == endpoints
    assert len(kubelet.successful_registrations()) == registrations
    (colad.device_dir / "fanta").write_bytes(b"")
    kubelet.wait_devices({"cocacola", "fanta"}, resource=COLA)
    kubelet.wait_devices({"pepsi1::0", "pepsi1::1"}, resource=PEPSI)


# --- the fuzz, as subprocesses -----------------------------------------------------------------


def test_fuzzed_refused_configs_exit_2_with_one_line(short_tmp: Path) -> None:
    """A seeded sample of the in-process fuzz's refused inputs, through `python -m colad <role>`."""
    roles = ["discovery", "plugin", "kubelet-watch", "supervise", "reload"]
    checked = 0
    for seed in range(10_000):
        if checked == 25:
            break
        rng = random.Random(seed)
        path = short_tmp / "c.toml"
        path.write_bytes(fuzz.random_file(rng, short_tmp))
        env = {**base_env(short_tmp), **fuzz.random_env(rng, path)}
        if any("=" in k or "\x00" in k + v for k, v in env.items()):
            continue  # not an environment a process can have
        try:
            fuzz.load({}, env)
            continue  # accepted: shown by the next test
        except fuzz.ConfigError:
            pass
        result = run_colad(rng.choice(roles), env)
        assert_refused(result)
        checked += 1
    assert checked == 25


def test_fuzzed_accepted_configs_run_under_supervisord(short_tmp: Path, kubelet: FakeKubelet) -> None:
    """Near-valid random files that load: colad starts all three roles and lists the devices."""
    keys = ["log_level", "rescan_interval", "register_timeout", "replicas", "replica_policy", "metrics_per_device"]
    for seed in range(3):
        rng = random.Random(seed)
        service = ColadService(short_tmp)
        values = {k: rng.choice(fuzz.USABLE[k]) for k in rng.sample(keys, rng.randint(1, len(keys)))}
        values["replicas"] = min(int(values.get("replicas", 1)), 2)  # keep the list readable
        body = "".join(f"{k} = {fuzz.toml_value(v)}\n" for k, v in values.items())
        write_config(Path(service.env["COLAD_CONFIG"]), body)
        assert isinstance(fuzz.check_outcome({}, service.env), fuzz.Config), body
        service.add("cocacola")
        service.start()
        try:
            ids = {"cocacola"} if values["replicas"] == 1 else {"cocacola::0", "cocacola::1"}
            kubelet.wait_devices(ids, timeout=30)
        finally:
            assert service.stop() == 0, service.log()[-4000:]
        assert "Traceback" not in service.log()
        service.remove("cocacola")
