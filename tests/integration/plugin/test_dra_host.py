"""The DRA host of the plugin process against the strict fake plugin watcher and the fake API server:
nothing registered before the API server's client can be made, both sockets and the slices once it
can, a removed DRA socket served anew, a stop that leaves the slices or withdraws them, and the gauges of
what it serves, gone once it stops."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from colad.config.config import Config
from colad.core.devices import Device, DeviceSet
from colad.kube.access import Access, Credentials
from colad.kube.client import KubeClient
from colad.kube.errors import KubeconfigError
from colad.metrics.registry import Metrics
from colad.plugin.dra_host import DraHost
from tests.fakes.apiserver import FakeApiServer, Pki
from tests.fakes.pluginwatcher import FakePluginWatcher
from tests.helpers import wait_until
from tests.integration.support import make_config

pytestmark = pytest.mark.integration

NODE = "node-1"
TOKEN = "test-token"
WAIT = 20.0


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
def cfg(short_tmp: Path) -> Config:
    return make_config(
        short_tmp,
        mode="dra",
        node_name=NODE,
        plugins_registry_dir=str(short_tmp / "registry"),
        plugins_dir=str(short_tmp / "plugins"),
    )


@pytest.fixture
def watcher(cfg: Config) -> Iterator[FakePluginWatcher]:
    fake = FakePluginWatcher(cfg.plugins_registry_dir)
    fake.start()
    yield fake
    fake.stop()
    assert fake.violations() == []


@pytest.fixture
def hosts() -> Iterator[list[DraHost]]:
    made: list[DraHost] = []
    yield made
    for host in made:
        host.stop(withdraw=False)


def devices(*ids: str) -> DeviceSet:
    return DeviceSet.of(Device(i) for i in ids)


def test_nothing_is_registered_until_the_api_server_client_can_be_made(
    cfg: Config, apiserver: FakeApiServer, watcher: FakePluginWatcher, hosts: list[DraHost]
) -> None:
    answers: list[KubeClient | Exception] = [KubeconfigError("kubeconfig /nowhere: missing")]

    def factory(_cfg: Config) -> KubeClient:
        answer = answers.pop(0) if answers else None
        if isinstance(answer, Exception):
            raise answer
        return KubeClient(Credentials(Access(server=apiserver.url, ca_file=str(apiserver.pki.ca), token=TOKEN)))

    host = DraHost(cfg, Metrics(dra=True), client_factory=factory)
    hosts.append(host)
    host.start()
    host.publish({cfg.resources[0].name: devices("cola-a")})
    assert "kubeconfig /nowhere" in host.problem
    assert not Path(cfg.dra_registration_socket).exists() and not Path(cfg.dra_plugin_socket).exists()
    host.check()  # the next look: the client can be made now
    assert host.problem == ""
    watcher.wait_registration(timeout=WAIT)
    watcher.wait_usable(host.driver, timeout=WAIT)
    wait_until(lambda: len(apiserver.node_slices(NODE)) == 1 or None, WAIT, "the slice published")

    Path(cfg.dra_plugin_socket).unlink()
    host.check()
    assert Path(cfg.dra_plugin_socket).is_socket()  # served anew (the kubelet dials again on ConnEnd)

    host.stop(withdraw=False)  # a stop: the sockets go, the slices stay for the kubelet's wipe
    assert not Path(cfg.dra_registration_socket).exists() and not Path(cfg.dra_plugin_socket).exists()
    watcher.wait_deregistered(host.driver, timeout=WAIT)
    assert len(apiserver.node_slices(NODE)) == 1


def test_a_withdrawing_stop_deletes_the_slices(
    cfg: Config, apiserver: FakeApiServer, watcher: FakePluginWatcher, hosts: list[DraHost]
) -> None:
    host = DraHost(
        cfg,
        Metrics(dra=True),
        client_factory=lambda _cfg: KubeClient(
            Credentials(Access(server=apiserver.url, ca_file=str(apiserver.pki.ca), token=TOKEN))
        ),
    )
    hosts.append(host)
    host.start()
    host.publish({cfg.resources[0].name: devices("cola-a", "cola-b")})
    wait_until(lambda: len(apiserver.node_slices(NODE)) == 1 or None, WAIT, "the slice published")
    host.stop(withdraw=True)
    assert apiserver.node_slices(NODE) == []


def test_the_metrics_show_the_hosts_slices_and_claims_while_it_serves(
    cfg: Config, apiserver: FakeApiServer, watcher: FakePluginWatcher, hosts: list[DraHost]
) -> None:
    metrics = Metrics(dra=True)
    host = DraHost(
        cfg,
        metrics,
        client_factory=lambda _cfg: KubeClient(
            Credentials(Access(server=apiserver.url, ca_file=str(apiserver.pki.ca), token=TOKEN))
        ),
    )
    hosts.append(host)
    value = metrics.registry.get_sample_value
    driver = {"driver": host.driver}
    assert value("colad_dra_slices_current", driver) == 0  # nothing published yet
    assert value("colad_dra_prepare_claims_total", {**driver, "result": "error"}) == 0  # made at zero
    host.start()
    host.publish({cfg.resources[0].name: devices("cola-a", "cola-b")})
    wait_until(lambda: value("colad_dra_slices_current", driver) == 1 or None, WAIT, "the slices current")
    assert value("colad_dra_slices", driver) == 1
    assert value("colad_dra_prepared_claims", driver) == 0
    assert value("colad_dra_slice_writes_total", {**driver, "verb": "create"}) == 1
    host.stop(withdraw=False)
    assert value("colad_dra_slices_current", driver) is None  # a switch back to the device plugin: no alert


def test_the_host_tells_when_the_kubelet_registered_it_and_when_its_slices_are_current(
    cfg: Config, apiserver: FakeApiServer, watcher: FakePluginWatcher, hosts: list[DraHost]
) -> None:
    told: list[tuple[str, bool]] = []  # (phase, slices current) as seen at each call: what the plugin publishes
    host = DraHost(
        cfg,
        Metrics(dra=True),
        client_factory=lambda _cfg: KubeClient(
            Credentials(Access(server=apiserver.url, ca_file=str(apiserver.pki.ca), token=TOKEN))
        ),
        on_change=lambda: told.append((host.phase, host.slices().current)),
    )
    hosts.append(host)
    assert not host.slices().wanted and host.claims_prepared() == 0  # nothing served yet
    host.start()
    host.publish({cfg.resources[0].name: devices("cola-a", "cola-b")})
    watcher.wait_registration(timeout=WAIT)
    wait_until(lambda: ("registered", True) in told or None, WAIT, "told of the registration and current slices")
    held = host.slices()
    assert (held.current, held.slices, held.devices) == (True, 1, 2)
    apiserver.stop()
    wait_until(lambda: any(not current for _, current in told[-1:]) or None, WAIT, "told of the outage")
    assert host.slices().failing and host.phase == "registered"
