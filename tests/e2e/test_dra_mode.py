"""DRA mode under the real supervisord, through the strict fake plugin watcher and the fake API server.

The plugin process reads a kubeconfig naming the fake's HTTPS URL, its CA and a token; it registers with
the plugin watcher, keeps this node's ResourceSlices exact as device files come, go and turn Unhealthy,
survives a kubelet restart (slices wiped) and an API-server outage, and never touches kubelet_dir.
A reload switches between the modes, withdrawing the side no longer served. A kubeconfig rewritten with a
new token is used without a restart; /metrics shows the driver's claims, latency and slices.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from colad.core.constants import SOCKET_RECORD_NAME
from colad.outputs.socketpath import SocketRecord
from tests import image
from tests.fakes.apiserver import FakeApiServer, Pki
from tests.fakes.dra_kubelet import Claim, FakeDraKubelet, FakeHealthWatcher
from tests.fakes.kubelet import FakeKubelet
from tests.fakes.pluginwatcher import FakePluginWatcher
from tests.helpers import http_get, metrics_address, wait_until
from tests.service import ColadService

pytestmark = pytest.mark.e2e

NODE = "node-1"
DRIVER = "cola.myway5.com"  # derived from the default resource name myway5.com/cola
TOKEN = "test-token"
WAIT = 30.0
MAX_DEVICES = 128  # resource/v1 ResourceSliceMaxDevices
PODMAN_TIMEOUT = 180


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    return Pki(tmp_path_factory.mktemp("pki"))


@pytest.fixture
def apiserver(pki: Pki) -> Iterator[FakeApiServer]:
    fake = FakeApiServer(pki, tokens={TOKEN}).start()
    fake.add_node(NODE, "node-uid-1")
    yield fake
    fake.stop()


@pytest.fixture
def watcher(short_tmp: Path) -> Iterator[FakePluginWatcher]:
    fake = FakePluginWatcher(short_tmp / "registry")
    fake.start()
    yield fake
    fake.stop()
    assert fake.violations() == [], "the fake plugin watcher saw contract violations"


def dra_keys(root: Path, apiserver: FakeApiServer) -> dict[str, str]:
    kubeconfig = root / "kubeconfig"
    kubeconfig.write_text(
        json.dumps(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "current-context": "fake",
                "contexts": [{"name": "fake", "context": {"cluster": "fake", "user": "colad"}}],
                "clusters": [
                    {
                        "name": "fake",
                        "cluster": {"server": apiserver.url, "certificate-authority": str(apiserver.pki.ca)},
                    }
                ],
                "users": [{"name": "colad", "user": {"token": TOKEN}}],
            }
        )
    )
    return {
        "node_name": NODE,
        "kubeconfig": str(kubeconfig),
        "plugins_registry_dir": str(root / "registry"),
        "plugins_dir": str(root / "plugins"),
    }


@pytest.fixture
def service(short_tmp: Path, apiserver: FakeApiServer, watcher: FakePluginWatcher) -> Iterator[ColadService]:
    env = {"COLAD_MODE": "dra", **{"COLAD_" + k.upper(): v for k, v in dra_keys(short_tmp, apiserver).items()}}
    colad = ColadService(short_tmp, extra_env=env)
    yield colad
    rc = colad.stop()
    assert rc == 0, f"supervisord exited with {rc}\n" + colad.log()[-4000:]


def registration_socket(colad: ColadService) -> Path:
    return Path(colad.env.get("COLAD_PLUGINS_REGISTRY_DIR") or colad.root / "registry") / f"{DRIVER}-reg.sock"


def slices(apiserver: FakeApiServer) -> list[dict[str, Any]]:
    return apiserver.node_slices(NODE, DRIVER)


def published(apiserver: FakeApiServer) -> set[str] | None:
    """The device names of this node's pool, when its slices are complete and valid; else None."""
    held = slices(apiserver)
    if not held:
        return None
    generation = max(s["spec"]["pool"]["generation"] for s in held)
    current = [s for s in held if s["spec"]["pool"]["generation"] == generation]
    if any(s["spec"]["pool"]["resourceSliceCount"] != len(current) for s in current):
        return None  # a pool still being written
    assert all(len(s["spec"].get("devices") or []) <= MAX_DEVICES for s in current)
    return {d["name"] for s in current for d in s["spec"].get("devices") or []}


def wait_published(apiserver: FakeApiServer, expected: set[str], timeout: float = WAIT) -> None:
    wait_until(lambda: published(apiserver) == expected or None, timeout, f"slices listing {sorted(expected)}")


def leave_device_plugin_socket(colad: ColadService) -> Path:
    """A plugin socket a device-plugin colad made and left behind (killed): recorded, nobody listening."""
    path = colad.kubelet_dir / "colad-myway5.com-cola.sock"
    with socket.socket(socket.AF_UNIX) as sock:
        sock.bind(str(path))
    (colad.run_dir / "state").mkdir(mode=0o700, parents=True, exist_ok=True)
    colad.run_dir.chmod(0o700)
    SocketRecord(str(colad.run_dir / SOCKET_RECORD_NAME)).add(str(path))
    return path


def test_dra_mode_registers_and_keeps_the_slices_exact(
    short_tmp: Path, service: ColadService, watcher: FakePluginWatcher, apiserver: FakeApiServer, kubelet: FakeKubelet
) -> None:
    service.add("cola-a", "cola-b")
    left = leave_device_plugin_socket(service)
    service.start()
    registration = watcher.wait_registration(timeout=WAIT)
    assert (registration.name, registration.endpoint) == (DRIVER, str(short_tmp / "plugins" / DRIVER / "dra.sock"))
    watcher.wait_usable(DRIVER, timeout=WAIT)
    wait_published(apiserver, {"cola-a", "cola-b"})
    service.add("cola-c")
    wait_published(apiserver, {"cola-a", "cola-b", "cola-c"})
    service.remove("cola-b")
    wait_published(apiserver, {"cola-a", "cola-c"})
    missing = short_tmp / "nowhere"
    (service.device_dir / "cola-c").write_text(f'[[mounts]]\nhost_path = "{missing}"\ncontainer_path = "/x"\n')
    wait_published(apiserver, {"cola-a"})  # Unhealthy: not allocatable, left out
    # Never on kubelet.sock, nothing in kubelet_dir but the kubelet's own: the socket left there is gone.
    assert not left.exists()
    assert kubelet.registrations == []
    assert sorted(p.name for p in service.kubelet_dir.iterdir() if p.is_socket()) == ["kubelet.sock"]
    status = subprocess.run(
        [sys.executable, "-m", "colad", "status"], env=service.env, capture_output=True, text=True, timeout=30
    )
    assert status.returncode == 0, status.stdout + status.stderr
    assert f"mode:       dra (driver {DRIVER}, registration registered" in status.stdout, status.stdout


def test_the_kubelet_hears_a_device_turn_unhealthy_with_its_reason_and_healthy_again(
    short_tmp: Path, service: ColadService, watcher: FakePluginWatcher, apiserver: FakeApiServer
) -> None:
    share = short_tmp / "host" / "share"
    share.mkdir(parents=True)
    service.device_dir.mkdir(parents=True, exist_ok=True)
    (service.device_dir / "cola-a").write_text(f'[[mounts]]\nhost_path = "{share}"\ncontainer_path = "/opt/cola"\n')
    service.add("cola-b")
    service.start()
    registration = watcher.wait_registration(timeout=WAIT)
    wait_published(apiserver, {"cola-a", "cola-b"})
    known = {(NODE, "cola-a"), (NODE, "cola-b")}  # what the slices published: the kubelet's claims name these
    health = FakeHealthWatcher(registration.endpoint, registration.supported_versions, lambda: known).start()
    try:
        assert health.service == "v1.DRAResourceHealth"
        health.wait_held((NODE, "cola-a"), "Healthy", WAIT)
        assert {k: h.health for k, h in health.held().items()} == {k: "Healthy" for k in known}
        shutil.rmtree(share)
        sick = health.wait_held((NODE, "cola-a"), "Unhealthy", WAIT)
        assert str(share) in sick.message and "mounts[0]" in sick.message, sick
        assert health.held()[(NODE, "cola-b")].health == "Healthy"
        wait_published(apiserver, {"cola-b"})
        share.mkdir()
        assert health.wait_held((NODE, "cola-a"), "Healthy", WAIT).message == ""
        assert all(set(r) == known for r in health.responses), health.responses  # complete lists only
        assert health.violations == [] and health.errors == [] and health.opened == 1
    finally:
        health.stop()


def test_three_hundred_devices_are_published_in_slices_of_at_most_128(
    service: ColadService, watcher: FakePluginWatcher, apiserver: FakeApiServer
) -> None:
    names = {f"cola-{i:03d}" for i in range(300)}
    service.add(*names)
    service.start()
    wait_published(apiserver, names, timeout=60)
    assert len(slices(apiserver)) == 3


def test_a_kubelet_restart_gets_registration_and_slices_back(
    service: ColadService, watcher: FakePluginWatcher, apiserver: FakeApiServer
) -> None:
    service.add("cola-a", "cola-b")
    service.start()
    watcher.wait_registration(timeout=WAIT)
    wait_published(apiserver, {"cola-a", "cola-b"})
    watcher.stop()
    assert apiserver.wipe_node(NODE) > 0  # the kubelet's start: every slice of the node deleted
    watcher.start()
    watcher.wait_registration(count=2, timeout=WAIT)
    watcher.wait_usable(DRIVER, timeout=WAIT)
    wait_published(apiserver, {"cola-a", "cola-b"})


def test_a_plugin_restart_never_publishes_fewer_devices(
    service: ColadService, watcher: FakePluginWatcher, apiserver: FakeApiServer
) -> None:
    names = {f"cola-{i:03d}" for i in range(130)}  # two slices
    service.add(*names)
    service.start()
    watcher.wait_registration(timeout=WAIT)
    wait_published(apiserver, names)
    held = {s["metadata"]["name"]: len(s["spec"]["devices"]) for s in slices(apiserver)}
    with apiserver.lock:
        seen = apiserver.events[-1][0]
    old = service.pids()["plugin"]
    service.kill("plugin")
    service.wait_running(exclude_pids={"plugin": old})
    watcher.wait_registration(count=2, timeout=WAIT)
    service.add("cola-new")  # published once the restarted plugin has heard discovery
    wait_published(apiserver, {*names, "cola-new"})
    with apiserver.lock:
        since = [
            (kind, obj["metadata"]["name"], len(obj["spec"].get("devices") or ()))
            for seq, _, kind, obj in apiserver.events
            if seq > seen
        ]
    assert since, "nothing written after the restart"
    fewer = [w for w in since if w[0] == "DELETED" or w[2] < held.get(w[1], 0)]
    assert fewer == [], f"writes with fewer devices than the {held} held before the restart: {since}"


def test_a_deleted_registration_socket_is_made_anew_and_registered_again(
    service: ColadService, watcher: FakePluginWatcher, apiserver: FakeApiServer
) -> None:
    service.add("cola-a")
    service.start()
    watcher.wait_registration(timeout=WAIT)
    registration_socket(service).unlink()
    watcher.wait_registration(count=2, timeout=WAIT)
    assert registration_socket(service).is_socket()


def test_slices_are_exact_again_after_an_api_server_outage(
    service: ColadService, watcher: FakePluginWatcher, apiserver: FakeApiServer
) -> None:
    service.add("cola-a", "cola-b")
    service.start()
    watcher.wait_usable(DRIVER, timeout=WAIT)
    wait_published(apiserver, {"cola-a", "cola-b"})
    claim = allocated_claim(apiserver, "during-outage", ["cola-b"])
    apiserver.stop()
    service.add("cola-c")
    service.remove("cola-a")
    service.wait_log("slices not published; retrying", timeout=WAIT)
    kubelet = FakeDraKubelet(str(service.root / "plugins" / DRIVER / "dra.sock"))
    try:  # the claim cannot be read: that claim's error, within the kubelet's deadline (the fake's timeout)
        outcome = kubelet.prepare([claim])
        assert outcome.failed == "" and set(outcome.errors) == {claim.uid}, outcome
    finally:
        kubelet.close()
    apiserver.start()
    wait_published(apiserver, {"cola-b", "cola-c"}, timeout=60)


def test_sigterm_removes_the_registration_socket(
    short_tmp: Path, service: ColadService, watcher: FakePluginWatcher, apiserver: FakeApiServer
) -> None:
    service.add("cola-a")
    service.start()
    watcher.wait_registration(timeout=WAIT)
    wait_published(apiserver, {"cola-a"})
    old = service.pids()["plugin"]
    service.expect_restart("plugin")
    service.rpc().supervisor.stopProcess("colad:plugin")  # SIGTERM, and no restart until asked
    assert not registration_socket(service).exists()
    assert not (short_tmp / "plugins" / DRIVER / "dra.sock").exists()
    watcher.wait_deregistered(DRIVER, timeout=WAIT)
    assert published(apiserver) == {"cola-a"}  # left for the kubelet's wipe, as upstream's helper does
    service.rpc().supervisor.startProcess("colad:plugin")
    service.wait_running(WAIT, exclude_pids={"plugin": old})
    watcher.wait_registration(count=2, timeout=WAIT)


def test_a_reload_switches_modes_and_withdraws_the_other_side(
    short_tmp: Path, apiserver: FakeApiServer, watcher: FakePluginWatcher, kubelet: FakeKubelet
) -> None:
    colad = ColadService(short_tmp)
    config = Path(colad.env["COLAD_CONFIG"])
    keys = "".join(f'{k} = "{v}"\n' for k, v in dra_keys(short_tmp, apiserver).items())
    config.write_text(keys)
    colad.add("cola-a", "cola-b")
    colad.start()
    try:
        kubelet.wait_devices({"cola-a": "Healthy", "cola-b": "Healthy"}, timeout=WAIT)
        endpoint = kubelet.current_endpoint()
        assert endpoint is not None
        config.write_text('mode = "dra"\n' + keys)
        reload(colad)
        watcher.wait_registration(timeout=WAIT)
        wait_published(apiserver, {"cola-a", "cola-b"})
        wait_until(lambda: kubelet.devices() == {} or None, WAIT, "the empty list at the kubelet")
        assert not (colad.kubelet_dir / os.path.basename(endpoint)).exists()
        config.write_text(keys)
        reload(colad)
        wait_until(lambda: slices(apiserver) == [] or None, WAIT, "the slices withdrawn")
        wait_until(lambda: not registration_socket(colad).exists() or None, WAIT, "the registration socket gone")
        kubelet.wait_devices({"cola-a": "Healthy", "cola-b": "Healthy"}, timeout=WAIT)
    finally:
        rc = colad.stop()
    assert rc == 0, f"supervisord exited with {rc}\n" + colad.log()[-4000:]


def reload(colad: ColadService) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "colad", "reload"], env=colad.env, capture_output=True, text=True, timeout=30
    )
    assert done.returncode == 0, done.stdout + done.stderr


def allocated_claim(apiserver: FakeApiServer, name: str, devices: list[str]) -> Claim:
    """A ResourceClaim the scheduler allocated to `devices` of this node's pool, as the API server holds it."""
    results = [{"request": "cola", "driver": DRIVER, "pool": NODE, "device": d} for d in devices]
    stored = apiserver.add_claim(
        {
            "metadata": {"namespace": "default", "name": name},
            "status": {"allocation": {"devices": {"results": results}}},
        }
    )
    return Claim("default", name, stored["metadata"]["uid"])


def claim_spec(service: ColadService, claim: Claim) -> Path:
    return service.root / "cdi" / f"k8s.{DRIVER}-claim_{claim.uid}.json"


def test_a_prepared_claim_is_unprepared_after_a_plugin_kill_and_the_claims_deletion(
    service: ColadService, watcher: FakePluginWatcher, apiserver: FakeApiServer
) -> None:
    service.add("cola-a", "cola-b", "cola-c")
    service.start()
    watcher.wait_usable(DRIVER, timeout=WAIT)
    wait_published(apiserver, {"cola-a", "cola-b", "cola-c"})
    claim = allocated_claim(apiserver, "pair", ["cola-a", "cola-b"])
    endpoint = str(service.root / "plugins" / DRIVER / "dra.sock")
    kubelet = FakeDraKubelet(endpoint)
    try:
        first = kubelet.prepare([claim])
        assert first.errors == {}, first.errors
        assert kubelet.prepare([claim]).devices == first.devices  # prepared twice: the same answer
    finally:
        kubelet.close()
    spec = json.loads(claim_spec(service, claim).read_text())
    envs = {e for d in spec["devices"] for e in d["containerEdits"].get("env", [])}
    assert "COLA_DEVICES=cola-a,cola-b" in envs, spec
    old = service.pids()["plugin"]
    service.kill("plugin")
    service.wait_running(exclude_pids={"plugin": old})
    apiserver.delete_claim("default", "pair")  # unprepare must not need the API server's claim
    watcher.wait_usable(DRIVER, timeout=WAIT)
    kubelet = FakeDraKubelet(endpoint)
    try:
        wait_until(lambda: kubelet.unprepare([claim]).errors == {} or None, WAIT, "the claim unprepared")
        assert not claim_spec(service, claim).exists()
        assert kubelet.unprepare([claim]).errors == {}  # unprepared twice: still no error
        assert kubelet.violations == []
    finally:
        kubelet.close()


@pytest.mark.usefixtures("base_image")
@pytest.mark.skipif(image.unusable() is not None, reason=image.unusable() or "")
def test_podman_resolves_a_claim_prepared_by_the_running_colad(
    service: ColadService, watcher: FakePluginWatcher, apiserver: FakeApiServer
) -> None:
    host = service.root / "host"
    (host / "dev").mkdir(parents=True)
    (host / "share").mkdir()
    os.mknod(host / "dev" / "cola0", 0o666 | 0o020000, os.makedev(1, 3))  # /dev/null's numbers: harmless
    (host / "share" / "hello").write_text("from the host\n")
    service.device_dir.mkdir(parents=True, exist_ok=True)
    (service.device_dir / "cola-a").write_text(
        f'[envs]\nMODE = "fast"\n\n[[device_nodes]]\nhost_path = "{host}/dev/cola0"\ncontainer_path = "/dev/cola"\n\n'
        f'[[mounts]]\nhost_path = "{host}/share"\ncontainer_path = "/opt/cola"\n'
    )
    (service.device_dir / "cola-b").write_text('[envs]\nMODE = "slow"\n')
    service.start()
    watcher.wait_usable(DRIVER, timeout=WAIT)
    wait_published(apiserver, {"cola-a", "cola-b"})
    claim = allocated_claim(apiserver, "pair", ["cola-a", "cola-b"])
    kubelet = FakeDraKubelet(str(service.root / "plugins" / DRIVER / "dra.sock"))
    try:
        outcome = kubelet.prepare([claim])
        assert outcome.errors == {}, outcome.errors
        cdi_ids = [i for d in outcome.devices[claim.uid] for i in d.cdi_device_ids]
        script = (
            'echo "devices $COLA_DEVICES"; echo "mode $MODE"; '
            'echo "node $(stat -c "%F %t:%T" /dev/cola)"; echo "mount $(cat /opt/cola/hello)"'
        )
        result = image.run_with_cdi(service.root, service.root / "cdi", cdi_ids, script, PODMAN_TIMEOUT)
        assert result.returncode == 0, f"podman exited {result.returncode}:\n{result.stdout}\n{result.stderr}"
        seen = dict(line.split(" ", 1) for line in result.stdout.splitlines() if " " in line)
        assert seen == {
            "devices": "cola-a,cola-b",
            "mode": "fast,slow",
            "node": "character special file 1:3",
            "mount": "from the host",
        }
        assert kubelet.unprepare([claim]).errors == {}
    finally:
        kubelet.close()


def test_each_claims_error_is_its_own_while_a_valid_claim_in_the_same_call_prepares(
    service: ColadService, watcher: FakePluginWatcher, apiserver: FakeApiServer
) -> None:
    service.add("cola-a", "cola-b")
    service.start()
    watcher.wait_usable(DRIVER, timeout=WAIT)
    wait_published(apiserver, {"cola-a", "cola-b"})
    valid = allocated_claim(apiserver, "valid", ["cola-a"])
    missing = Claim("default", "missing", "uid-of-nothing")
    stale = Claim("default", "valid", "another-uid")  # the name of a claim, the UID of an earlier one
    foreign = apiserver.add_claim(
        {
            "metadata": {"namespace": "default", "name": "foreign"},
            "status": {
                "allocation": {
                    "devices": {
                        "results": [{"request": "r", "driver": "other.example.com", "pool": NODE, "device": "x"}]
                    }
                }
            },
        }
    )
    other_driver = Claim("default", "foreign", foreign["metadata"]["uid"])
    unpublished = allocated_claim(apiserver, "unpublished", ["cola-z"])
    kubelet = FakeDraKubelet(str(service.root / "plugins" / DRIVER / "dra.sock"))
    try:
        outcome = kubelet.prepare([valid, missing, other_driver, unpublished])
        assert outcome.failed == "" and kubelet.violations == []
        assert set(outcome.errors) == {missing.uid, other_driver.uid, unpublished.uid}, outcome.errors
        assert [d.device_name for d in outcome.devices[valid.uid]] == ["cola-a"]
        mismatch = kubelet.prepare([stale])
        assert set(mismatch.errors) == {stale.uid} and "has uid" in mismatch.errors[stale.uid], mismatch.errors
    finally:
        kubelet.close()
    # What an operator scrapes: the claims by result, the latency, what is prepared and published, and the
    # claim read the API server answered 404, without a claim's name or uid in any label.
    address = metrics_address(service.run_dir)
    driver = {"driver": DRIVER}

    def sample(name: str, labels: dict[str, str]) -> float | None:
        for family in text_string_to_metric_families(http_get(f"http://{address}/metrics")[1]):
            for s in family.samples:
                if s.name == name and s.labels == labels:
                    return float(s.value)
        return None

    wait_until(lambda: sample("colad_dra_slices_current", driver) == 1 or None, WAIT, "the slices current")
    assert sample("colad_dra_prepare_claims_total", {**driver, "result": "success"}) == 1
    assert sample("colad_dra_prepare_claims_total", {**driver, "result": "error"}) == 4
    assert sample("colad_dra_prepare_duration_seconds_count", driver) == 2
    assert sample("colad_dra_prepared_claims", driver) == 1
    assert sample("colad_dra_slices", driver) == 1
    assert (sample("colad_dra_slice_writes_total", {**driver, "verb": "create"}) or 0) >= 1
    assert sample("colad_dra_api_errors_total", {"verb": "get", "code": "404"}) == 1
    exposed = http_get(f"http://{address}/metrics")[1]
    for claim in (valid, missing, stale, other_driver, unpublished):
        assert f'"{claim.name}"' not in exposed and f'"{claim.uid}"' not in exposed


def test_a_rotated_kubeconfig_token_is_used_without_a_restart(
    short_tmp: Path, service: ColadService, watcher: FakePluginWatcher, apiserver: FakeApiServer
) -> None:
    service.add("cola-a")
    service.start()
    watcher.wait_usable(DRIVER, timeout=WAIT)
    wait_published(apiserver, {"cola-a"})
    pid = service.pids()["plugin"]
    kubeconfig = Path(service.env["COLAD_KUBECONFIG"])
    doc = json.loads(kubeconfig.read_text())
    doc["users"][0]["user"]["token"] = "rotated-token"
    fresh = kubeconfig.with_name("kubeconfig.new")
    fresh.write_text(json.dumps(doc))
    apiserver.tokens = {TOKEN, "rotated-token"}
    os.replace(fresh, kubeconfig)
    service.add("cola-b")
    wait_published(apiserver, {"cola-a", "cola-b"})
    with apiserver.lock:
        apiserver.tokens = {"rotated-token"}  # the old token expires: the server refuses it from now on
        seen = len(apiserver.identities)
    service.add("cola-c")
    wait_published(apiserver, {"cola-a", "cola-b", "cola-c"})
    assert service.pids()["plugin"] == pid, "the plugin was restarted"
    with apiserver.lock:
        since = set(apiserver.identities[seen:])
        refused = [r for r in apiserver.requests if r[2] == 401]
    assert since == {"token:rotated-token"} and refused == [], (since, refused)


def colad_command(colad: ColadService, *words: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "colad", *words], env=colad.env, capture_output=True, text=True, timeout=60
    )


def wait_readyz(url: str, status: int, needle: str) -> str:
    """The body of /readyz once it answers `status` with `needle` in it."""

    def seen() -> str:
        code, body = http_get(url)
        if code != status or needle not in body:
            raise AssertionError(f"/readyz answered {code} {body!r}")  # wait_until reports the last one
        return body

    return wait_until(seen, WAIT, f"/readyz {status} saying {needle!r}")


def test_readyz_status_and_check_follow_the_registration_and_the_slices(
    short_tmp: Path, service: ColadService, watcher: FakePluginWatcher, apiserver: FakeApiServer
) -> None:
    watcher.stop()  # no kubelet yet: the registration socket is served, nobody registers the driver
    service.add("cola-a", "cola-b")
    service.start()
    readyz = f"http://{metrics_address(service.run_dir)}/readyz"
    wait_published(apiserver, {"cola-a", "cola-b"})
    wait_readyz(readyz, 503, "not registered with the kubelet plugin watcher (the registration socket is served")
    waiting = colad_command(service, "status")
    assert waiting.returncode == 4, waiting.stdout + waiting.stderr  # on its way, not failing
    assert "registered: no: not registered with the kubelet plugin watcher" in waiting.stdout, waiting.stdout

    watcher.start()
    watcher.wait_usable(DRIVER, timeout=WAIT)
    assert wait_readyz(readyz, 200, "ready") == f"ready: driver {DRIVER} registered; 2 devices in 1 slices\n"
    status = colad_command(service, "status")
    assert status.returncode == 0, status.stdout + status.stderr
    for line in ("slices:     1 published, 2 devices, current", "claims:     0 prepared", "api error:  none"):
        assert line in status.stdout, status.stdout
    check = colad_command(service, "check")
    assert check.returncode == 0, check.stdout + check.stderr
    assert f"  GetInfo:    DRAPlugin {DRIVER} endpoint {short_tmp / 'plugins' / DRIVER / 'dra.sock'}" in check.stdout
    assert "NodePrepareResources (no claims): answered (v1.DRAPlugin)" in check.stdout, check.stdout
    assert f"spec.nodeName={NODE},spec.driver={DRIVER}" in check.stdout and "1 slice(s), 2 device(s)" in check.stdout

    apiserver.stop()  # an outage: not ready while the API server may hold what colad does not know
    wait_readyz(readyz, 503, "slices not current: API server failing")
    service.add("cola-c")
    body = wait_readyz(readyz, 503, "a change waits to be written")
    assert "not registered" not in body, body
    status = colad_command(service, "status")
    assert status.returncode == 0, status.stdout + status.stderr  # readiness, not health
    assert "ready:      no: slices not current: API server failing" in status.stdout, status.stdout
    assert "(failing now)" in status.stdout, status.stdout
    check = colad_command(service, "check", "--json")
    assert check.returncode == 1, check.stdout + check.stderr
    found = json.loads(check.stdout)
    assert found["registration"]["problems"] == [] and found["service"]["answered"], found
    assert found["slices"]["problems"][0].startswith("list failed: "), found
    assert found["reason"].startswith("slices: list failed: "), found

    apiserver.start()
    wait_published(apiserver, {"cola-a", "cola-b", "cola-c"})
    assert wait_readyz(readyz, 200, "ready") == f"ready: driver {DRIVER} registered; 3 devices in 1 slices\n"
    status = colad_command(service, "status")
    assert "slices:     1 published, 3 devices, current" in status.stdout, status.stdout
    assert "(answered since)" in status.stdout, status.stdout

    service.expect_restart("plugin")
    service.rpc().supervisor.stopProcess("colad:plugin")  # both sockets gone; the slices stay for the kubelet
    check = colad_command(service, "check")
    assert check.returncode == 3, check.stdout + check.stderr
    assert f"{registration_socket(service)}: " in check.stderr and "(is colad running?)" in check.stderr
    assert "1 slice(s), 3 device(s)" in check.stdout, check.stdout
