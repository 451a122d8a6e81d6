"""NodePrepareResources and NodeUnprepareResources through the strict DRA client and the strict fake API
server: a claim's CDI spec, per-claim errors beside a claim that prepares, idempotence both ways, unprepare
from the checkpoint after a restart and the claim's deletion, bounded answers while the API server is down."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from concurrent import futures
from pathlib import Path
from typing import Any

import grpc
import pytest

from colad.config.config import Resource
from colad.core import claims
from colad.core.devices import Device, DeviceNode, DeviceSet, Mount
from colad.core.slices import published_names
from colad.dra.service import DraPluginService
from colad.kube.access import Access, Credentials
from colad.kube.client import KubeClient
from colad.metrics.registry import Metrics
from tests.fakes.apiserver import FakeApiServer, Pki
from tests.fakes.dra_kubelet import Claim, FakeDraKubelet

pytestmark = pytest.mark.integration

DRIVER = "cola.myway5.com"
RESOURCE = "myway5.com/cola"
NODE = "node-1"
TOKEN = "test-token"
NS = "default"


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    return Pki(tmp_path_factory.mktemp("pki"))


@pytest.fixture
def fake(pki: Pki) -> Iterator[FakeApiServer]:
    server = FakeApiServer(pki, tokens={TOKEN}).start()
    yield server
    server.hang.clear()
    server.stop()


def device_set() -> DeviceSet:
    return DeviceSet.of(
        [
            Device(
                "cola0",
                envs=(("MODE", "fast"),),
                device_nodes=(DeviceNode("/dev/null", "/dev/cola0"),),
                mounts=(Mount("/srv/cola0", "/opt/cola0"),),
            ),
            Device("cola1", envs=(("MODE", "slow"),), device_nodes=(DeviceNode("/dev/zero", "/dev/cola1"),)),
            Device("cola_2"),  # not a DNS label: published under a generated name
            Device("cola3", health="Unhealthy"),
        ]
    )


class Plugin:
    """A DraPluginService served on a temp socket, rebuilt on demand from the same state directory."""

    def __init__(self, root: Path, fake: FakeApiServer, timeout: float = 5.0, call_timeout: float = 10.0) -> None:
        self.root, self.fake, self.timeout, self.call_timeout = root, fake, timeout, call_timeout
        self.spec_dir, self.state_dir = root / "cdi", root / "state"
        self.socket = str(root / "dra.sock")
        self.devices: dict[str, DeviceSet] = {RESOURCE: device_set()}
        self.server: grpc.Server | None = None
        self.service: DraPluginService | None = None
        self.metrics = Metrics(dra=True)
        self.start()

    def start(self) -> None:
        client = KubeClient(
            Credentials(Access(server=self.fake.url, ca_file=str(self.fake.pki.ca), token=TOKEN)),
            timeout=self.timeout,
        )
        self.service = DraPluginService(
            driver=DRIVER,
            node_name=NODE,
            client=client,
            resources=[Resource(RESOURCE, "/etc/colas")],
            devices=lambda: self.devices,
            cdi_spec_dir=str(self.spec_dir),
            state_dir=str(self.state_dir),
            metrics=self.metrics,
            call_timeout=self.call_timeout,
        )
        self.server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
        self.service.add_to(self.server)
        self.server.add_insecure_port("unix:" + self.socket)
        self.server.start()

    def stop(self) -> None:
        if self.server is not None:
            self.server.stop(None).wait()
        if self.service is not None:
            self.service.close()

    def restart(self) -> None:
        self.stop()
        self.start()

    def specs(self) -> list[str]:
        return sorted(os.listdir(self.spec_dir)) if self.spec_dir.exists() else []


@pytest.fixture
def plugin(short_tmp: Path, fake: FakeApiServer) -> Iterator[Plugin]:
    made = Plugin(short_tmp, fake)
    yield made
    made.stop()


@pytest.fixture(params=["v1", "v1beta1"])
def kubelet(request: pytest.FixtureRequest, plugin: Plugin) -> Iterator[FakeDraKubelet]:
    client = FakeDraKubelet(plugin.socket, request.param)
    yield client
    client.close()
    assert client.violations == []


def add_claim(fake: FakeApiServer, name: str, *results: tuple[str, str, str, str]) -> Claim:
    """A claim allocated the given (request, driver, pool, device) results."""
    obj = fake.add_claim(
        {
            "metadata": {"namespace": NS, "name": name, "uid": f"0c1a{len(fake.claims):04d}-uid-{name}"},
            "spec": {"devices": {"requests": [{"name": "gpus"}]}},
            "status": {
                "allocation": {
                    "devices": {
                        "results": [{"request": r, "driver": d, "pool": p, "device": v} for r, d, p, v in results]
                    }
                }
            },
        }
    )
    return Claim(NS, name, obj["metadata"]["uid"])


def two_device_claim(fake: FakeApiServer, name: str = "pair") -> Claim:
    return add_claim(fake, name, ("gpus", DRIVER, NODE, "cola0"), ("gpus/sub", DRIVER, NODE, "cola1"))


def write_program(path: Path, text: str) -> str:
    path.write_text(text)
    path.chmod(0o755)
    return str(path)


def spec_of(plugin: Plugin, claim: Claim) -> dict[str, Any]:
    spec: dict[str, Any] = json.loads((plugin.spec_dir / claims.claim_spec_file(DRIVER, claim.uid)).read_text())
    return spec


def test_a_two_device_claim_gets_one_spec_with_both_devices(
    plugin: Plugin, fake: FakeApiServer, kubelet: FakeDraKubelet
) -> None:
    claim = two_device_claim(fake)
    outcome = kubelet.prepare([claim])
    assert outcome.errors == {} and outcome.failed == ""
    kind = claims.claim_cdi_kind(DRIVER)
    assert [(d.pool_name, d.device_name, d.request_names, d.cdi_device_ids) for d in outcome.devices[claim.uid]] == [
        (NODE, "cola0", ("gpus",), (f"{kind}={claim.uid}-cola0",)),
        (NODE, "cola1", ("gpus",), (f"{kind}={claim.uid}-cola1",)),
    ]
    spec = spec_of(plugin, claim)
    assert spec["kind"] == kind and spec["cdiVersion"] == "0.5.0"  # a name with a digit first, a renamed node
    edits = {d["name"]: d["containerEdits"] for d in spec["devices"]}
    assert sorted(edits) == [f"{claim.uid}-cola0", f"{claim.uid}-cola1"]
    for name in edits:
        assert "COLA_DEVICES=cola0,cola1" in edits[name]["env"]
        assert "MODE=fast,slow" in edits[name]["env"]  # Allocate's merge, on each device of the request
    assert edits[f"{claim.uid}-cola0"]["deviceNodes"] == [
        {"hostPath": "/dev/null", "path": "/dev/cola0", "permissions": "rw"}
    ]
    assert edits[f"{claim.uid}-cola0"]["mounts"] == [
        {"containerPath": "/opt/cola0", "hostPath": "/srv/cola0", "options": ["rbind", "ro"]}
    ]
    assert edits[f"{claim.uid}-cola1"]["deviceNodes"][0]["path"] == "/dev/cola1"
    assert plugin.service is not None and plugin.service.prepared() == 1


def test_prepare_twice_answers_the_same_and_unprepare_twice_succeeds(
    plugin: Plugin, fake: FakeApiServer, kubelet: FakeDraKubelet
) -> None:
    claim = two_device_claim(fake)
    first = kubelet.prepare([claim])
    reads = len(fake.requests)
    again = kubelet.prepare([claim])
    assert again.devices == first.devices and again.errors == {}
    assert len(fake.requests) == reads  # answered from the checkpoint
    assert kubelet.unprepare([claim]).errors == {}
    assert plugin.specs() == []
    assert kubelet.unprepare([claim]).errors == {}
    assert kubelet.unprepare([Claim(NS, "never", "0c1affff-never")]).errors == {}
    assert plugin.service is not None and plugin.service.prepared() == 0


def test_each_claim_error_is_its_own_while_a_valid_claim_prepares(
    plugin: Plugin, fake: FakeApiServer, kubelet: FakeDraKubelet
) -> None:
    good = two_device_claim(fake)
    replaced = add_claim(fake, "replaced", ("gpus", DRIVER, NODE, "cola0"))
    other = add_claim(fake, "other", ("gpus", "gpu.example.com", NODE, "gpu0"))
    unpublished = add_claim(fake, "gone", ("gpus", DRIVER, NODE, "cola9"))
    unhealthy = add_claim(fake, "sick", ("gpus", DRIVER, NODE, "cola3"))
    elsewhere = add_claim(fake, "elsewhere", ("gpus", DRIVER, "node-2", "cola0"))
    missing = Claim(NS, "missing", "0c1a9999-missing")
    outcome = kubelet.prepare(
        [good, Claim(NS, "replaced", "0c1a8888-old"), other, unpublished, unhealthy, elsewhere, missing]
    )
    assert outcome.failed == ""
    assert set(outcome.devices) == {good.uid}
    errors = outcome.errors
    assert "not found" in errors[missing.uid]
    assert "replaced" in errors["0c1a8888-old"] and replaced.uid in errors["0c1a8888-old"]
    assert "only of gpu.example.com" in errors[other.uid]
    assert "not published by this node" in errors[unpublished.uid]
    assert "not published by this node" in errors[unhealthy.uid]  # an Unhealthy device is in no slice
    assert "not in a pool of this node" in errors[elsewhere.uid]
    assert plugin.specs() == [claims.claim_spec_file(DRIVER, good.uid)]


def test_claims_are_counted_by_result_and_each_call_timed_without_claim_names(
    plugin: Plugin, fake: FakeApiServer, kubelet: FakeDraKubelet
) -> None:
    good = two_device_claim(fake)
    missing = Claim(NS, "missing", "0c1a9999-missing")
    kubelet.prepare([good, missing])
    kubelet.unprepare([good])
    value = plugin.metrics.registry.get_sample_value
    driver = {"driver": DRIVER}
    assert value("colad_dra_prepare_claims_total", {**driver, "result": "success"}) == 1
    assert value("colad_dra_prepare_claims_total", {**driver, "result": "error"}) == 1
    assert value("colad_dra_unprepare_claims_total", {**driver, "result": "success"}) == 1
    assert value("colad_dra_prepare_duration_seconds_count", driver) == 1
    assert value("colad_dra_unprepare_duration_seconds_count", driver) == 1
    assert value("colad_dra_api_errors_total", {"verb": "get", "code": "404"}) == 1  # the missing claim's read
    from prometheus_client import generate_latest

    exposed = generate_latest(plugin.metrics.registry).decode()
    for named in (good.name, good.uid, missing.name, missing.uid, NS):
        assert f'"{named}"' not in exposed


def test_a_device_with_a_generated_name_maps_back_to_its_file(
    plugin: Plugin, fake: FakeApiServer, kubelet: FakeDraKubelet
) -> None:
    name = published_names(plugin.devices[RESOURCE])["cola_2"]
    claim = add_claim(fake, "odd", ("gpus", DRIVER, NODE, name))
    outcome = kubelet.prepare([claim])
    assert [d.device_name for d in outcome.devices[claim.uid]] == [name]
    assert "COLA_DEVICES=cola_2" in spec_of(plugin, claim)["devices"][0]["containerEdits"]["env"]


def test_unprepare_works_from_the_checkpoint_after_a_restart_and_the_claims_deletion(
    plugin: Plugin, fake: FakeApiServer, kubelet: FakeDraKubelet
) -> None:
    claim = two_device_claim(fake)
    assert kubelet.prepare([claim]).errors == {}
    plugin.restart()
    fake.delete_claim(NS, claim.name)
    fake.stop()  # unprepare needs no API server
    assert plugin.service is not None and plugin.service.prepared() == 1
    again = kubelet.prepare([claim])  # the kubelet asks again after its own restart
    assert again.errors == {} and len(again.devices[claim.uid]) == 2
    assert kubelet.unprepare([claim]).errors == {}
    assert plugin.specs() == [] and plugin.service.prepared() == 0


def test_the_api_server_down_or_silent_gives_claim_errors_within_the_call_time(
    short_tmp: Path, fake: FakeApiServer
) -> None:
    claim = two_device_claim(fake)
    plugin = Plugin(short_tmp, fake, timeout=30.0, call_timeout=1.5)
    client = FakeDraKubelet(plugin.socket, timeout=10.0)  # the call must end long before this
    try:
        fake.hang.set()  # accepts, answers nothing: only the service's own bound ends the call
        outcome = client.prepare([claim, Claim(NS, "b", "0c1a7777-b")])
        assert outcome.failed == "", outcome.failed
        assert set(outcome.errors) == {claim.uid, "0c1a7777-b"}
        assert all("no answer from the API server in time" in e for e in outcome.errors.values())
        fake.hang.clear()
        fake.stop()
        outcome = client.prepare([claim])
        assert outcome.failed == "" and "unreachable" in outcome.errors[claim.uid]
        assert plugin.specs() == []
        assert client.violations == []
    finally:
        client.close()
        plugin.stop()


def test_a_prepare_command_runs_at_prepare_and_its_failure_is_the_claims_error(
    short_tmp: Path, fake: FakeApiServer
) -> None:
    log = short_tmp / "prepared.log"
    good = write_program(short_tmp / "ok.sh", f'#!/bin/sh\necho "$@ $COLA_DEVICES" >> {log}\n')
    bad = write_program(short_tmp / "bad.sh", "#!/bin/sh\necho device busy\nexit 3\n")
    plugin = Plugin(short_tmp, fake)
    client = FakeDraKubelet(plugin.socket)
    try:
        assert plugin.service is not None
        plugin.service.resources[RESOURCE] = Resource(RESOURCE, "/etc/colas", prepare=(good,))
        claim = two_device_claim(fake)
        assert client.prepare([claim]).errors == {}
        assert log.read_text() == "cola0 cola1 cola0,cola1\n"
        plugin.service.resources[RESOURCE] = Resource(RESOURCE, "/etc/colas", prepare=(bad,))
        failing = add_claim(fake, "busy", ("gpus", DRIVER, NODE, "cola1"))
        errors = client.prepare([failing]).errors
        assert f"prepare command {bad} failed for device cola1: device busy" == errors[failing.uid]
        assert not (plugin.spec_dir / claims.claim_spec_file(DRIVER, failing.uid)).exists()
    finally:
        client.close()
        plugin.stop()


def test_an_empty_call_is_answered_empty(kubelet: FakeDraKubelet) -> None:
    # dra-example-driver's liveness probe sends exactly this.
    outcome = kubelet.prepare([])
    assert (outcome.devices, outcome.errors, outcome.failed) == ({}, {}, "")


def test_a_spec_removed_behind_the_drivers_back_is_written_again_on_the_next_prepare(
    plugin: Plugin, fake: FakeApiServer, kubelet: FakeDraKubelet
) -> None:
    claim = two_device_claim(fake)
    first = kubelet.prepare([claim])
    (plugin.spec_dir / claims.claim_spec_file(DRIVER, claim.uid)).unlink()
    again = kubelet.prepare([claim])
    assert again.devices == first.devices
    assert plugin.specs() == [claims.claim_spec_file(DRIVER, claim.uid)]


def test_a_checkpoint_that_cannot_be_written_fails_the_claim_and_leaves_no_spec(
    plugin: Plugin, fake: FakeApiServer, kubelet: FakeDraKubelet
) -> None:
    plugin.state_dir.write_text("a file where the state directory should be")
    claim = two_device_claim(fake)
    outcome = kubelet.prepare([claim])
    assert "checkpoint not written" in outcome.errors[claim.uid]
    assert plugin.specs() == []
    assert plugin.service is not None and plugin.service.prepared() == 0


def test_a_refused_checkpoint_starts_empty_and_unprepare_still_removes_the_spec(
    plugin: Plugin, fake: FakeApiServer, kubelet: FakeDraKubelet
) -> None:
    claim = two_device_claim(fake)
    assert kubelet.prepare([claim]).errors == {}
    (plugin.state_dir / claims.CHECKPOINT_FILE).write_text("{not json")
    plugin.restart()
    assert plugin.service is not None and plugin.service.prepared() == 0
    assert kubelet.unprepare([claim]).errors == {}
    assert plugin.specs() == []
