"""The fake API server is as strict as upstream validation: what it refuses, and the REST conventions it keeps."""

from __future__ import annotations

import copy
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from colad.kube.access import Access, Credentials, from_kubeconfig
from colad.kube.client import SLICES, KubeClient
from colad.kube.errors import ApiError, NotFound
from tests.fakes.apiserver import FakeApiServer, Pki

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def fake(tmp_path_factory: pytest.TempPathFactory) -> Iterator[FakeApiServer]:
    server = FakeApiServer(Pki(tmp_path_factory.mktemp("pki")), tokens={"t"}).start()
    yield server
    server.stop()


@pytest.fixture
def client(fake: FakeApiServer) -> KubeClient:
    return KubeClient(Credentials(Access(server=fake.url, ca_file=str(fake.pki.ca), token="t")), timeout=5)


def valid(**spec: Any) -> dict[str, Any]:
    body: dict[str, Any] = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceSlice",
        "metadata": {"generateName": "00000-cola.myway5.com-node-1-"},
        "spec": {
            "driver": "cola.myway5.com",
            "nodeName": "node-1",
            "pool": {"name": "node-1", "generation": 0, "resourceSliceCount": 1},
            "devices": [{"name": "cola1", "attributes": {"file": {"string": "cola1"}}}],
        },
    }
    body["spec"].update(spec)
    return body


def devices(n: int, **extra: Any) -> list[dict[str, Any]]:
    return [{"name": f"d{i}", **extra} for i in range(n)]


def refused(client: KubeClient, body: Any, method: str = "POST", path: str = SLICES) -> ApiError:
    with pytest.raises(ApiError) as raised:
        client.request(method, path, body=body)
    return raised.value


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"devices": devices(129)}, "must have at most 128 items"),
        ({"devices": devices(65, taints=[{"key": "k", "effect": "NoSchedule"}])}, "must have at most 64 items"),
        ({"devices": [{"name": "Cola1"}]}, "must be a DNS label"),
        ({"devices": [{"name": "a" * 64}]}, "must be a DNS label"),
        ({"devices": [{"name": "a"}, {"name": "a"}]}, "Duplicate value"),
        ({"devices": [{"name": "a", "attributes": {"file": {"string": "x" * 65}}}]}, "Too long"),
        ({"devices": [{"name": "a", "attributes": {"file": {"string": "x", "int": 1}}}]}, "exactly one value"),
        ({"devices": [{"name": "a", "attributes": {"bad-name": {"int": 1}}}]}, "C identifier"),
        ({"devices": [{"name": "a", "attributes": {"x" * 33: {"int": 1}}}]}, "C identifier"),
        ({"devices": [{"name": "a", "attributes": {"Bad.Domain/x": {"int": 1}}}]}, "DNS subdomain"),
        ({"devices": [{"name": "a", "attributes": {"v": {"version": "1.2"}}}]}, "semantic version"),
        ({"devices": [{"name": "a", "attributes": {f"a{i}": {"int": i} for i in range(33)}}]}, "at most 32"),
        ({"driver": ""}, "spec.driver: Required value"),
        ({"driver": "Not_A_Domain"}, "spec.driver: must be a DNS subdomain"),
        ({"pool": {"name": "", "resourceSliceCount": 1}}, "spec.pool.name: Required value"),
        ({"pool": {"name": "node-1", "resourceSliceCount": 0}}, "must be greater than zero"),
        ({"pool": {"name": "node-1", "generation": -1, "resourceSliceCount": 1}}, "greater than or equal to 0"),
        ({"nodeName": ""}, "must be either unset or set to a non-empty"),
        ({"allNodes": True}, "exactly one of nodeName"),
    ],
)
def test_an_invalid_slice_is_refused_with_422_and_a_status_naming_the_field(
    client: KubeClient, change: dict[str, Any], message: str
) -> None:
    error = refused(client, valid(**change))
    assert (error.status, error.reason) == (422, "Invalid")
    assert message in error.message


def test_128_devices_with_valid_names_and_attributes_are_accepted(client: KubeClient) -> None:
    created = client.create_slice(valid(devices=devices(128, attributes={"file": {"string": "x" * 64}})))
    assert len(created["spec"]["devices"]) == 128
    assert int(created["metadata"]["resourceVersion"]) > 0


def test_a_name_or_generate_name_is_required_and_generate_name_is_cut_to_58(client: KubeClient) -> None:
    body = valid()
    del body["metadata"]["generateName"]
    assert refused(client, body).status == 422
    body["metadata"]["generateName"] = "a" * 70
    name = client.create_slice(body)["metadata"]["name"]
    assert name.startswith("a" * 58) and len(name) == 63


def test_driver_pool_and_node_are_immutable(client: KubeClient) -> None:
    created = client.create_slice(valid())
    for key, value in (
        ("driver", "other.example.com"),
        ("nodeName", "node-2"),
        ("pool", {"name": "p", "resourceSliceCount": 1}),
    ):
        changed = copy.deepcopy(created)
        changed["spec"][key] = value
        error = refused(client, changed, "PUT", f"{SLICES}/{created['metadata']['name']}")
        assert error.status == 422 and "immutable" in error.message


def test_an_update_without_a_resource_version_is_invalid(client: KubeClient) -> None:
    created = client.create_slice(valid())
    del created["metadata"]["resourceVersion"]
    error = refused(client, created, "PUT", f"{SLICES}/{created['metadata']['name']}")
    assert error.status == 422 and "must be specified for an update" in error.message


def test_a_spec_change_raises_metadata_generation(client: KubeClient) -> None:
    created = client.create_slice(valid())
    same = client.update_slice(copy.deepcopy(created))
    assert same["metadata"]["generation"] == 1
    same["spec"]["devices"] = []
    assert client.update_slice(same)["metadata"]["generation"] == 2


def test_an_unknown_field_selector_is_a_bad_request(client: KubeClient) -> None:
    with pytest.raises(ApiError) as raised:
        client.request("GET", SLICES, query={"fieldSelector": "spec.other=x"})
    assert raised.value.status == 400


def test_deletecollection_and_wipe_remove_only_the_nodes_slices(fake: FakeApiServer, client: KubeClient) -> None:
    client.create_slice(valid(nodeName="node-7"))
    client.create_slice(valid(nodeName="node-8"))
    client.request("DELETE", SLICES, query={"fieldSelector": "spec.nodeName=node-7"})
    assert fake.node_slices("node-7") == [] and len(fake.node_slices("node-8")) == 1
    assert fake.wipe_node("node-8") == 1 and fake.node_slices("node-8") == []


def test_unknown_paths_and_objects_are_not_found(client: KubeClient) -> None:
    with pytest.raises(NotFound):
        client.request("GET", "/apis/resource.k8s.io/v1beta1/resourceslices")
    with pytest.raises(NotFound):
        client.get_node("absent")
    with pytest.raises(NotFound):
        client.delete_slice("absent")


def test_a_watch_without_a_resource_version_starts_with_the_current_state(client: KubeClient) -> None:
    created = client.create_slice(valid(nodeName="node-9"))
    events = list(client.watch_slices("spec.nodeName=node-9", "", timeout_seconds=1))
    assert [(e.type, e.object["metadata"]["name"]) for e in events] == [("ADDED", created["metadata"]["name"])]


def test_an_allocated_claim_is_read_back_through_the_rest_call(fake: FakeApiServer, client: KubeClient) -> None:
    stored = fake.add_allocated_claim("default", "pair", "cola.myway5.com", "node-1", ["cola1", "cola2"])
    read = client.get_claim("default", "pair")
    assert read["metadata"]["uid"] == stored["metadata"]["uid"]
    assert [r["device"] for r in read["status"]["allocation"]["devices"]["results"]] == ["cola1", "cola2"]
    with pytest.raises(ValueError, match="pool: required"):
        fake.add_allocated_claim("default", "nowhere", "cola.myway5.com", "", ["cola1"])


def test_the_written_kubeconfig_names_this_server_its_ca_and_the_token(fake: FakeApiServer, tmp_path: Path) -> None:
    access = from_kubeconfig(str(fake.write_kubeconfig(tmp_path / "kubeconfig", "t")))
    assert (access.server, access.ca_file, access.token) == (fake.url, str(fake.pki.ca), "t")
    fake.add_allocated_claim("default", "kc", "cola.myway5.com", "node-1", ["cola1"])
    assert KubeClient(Credentials(access), timeout=5).get_claim("default", "kc")["metadata"]["name"] == "kc"


def test_a_pool_is_published_only_once_all_its_slices_are_in(fake: FakeApiServer, client: KubeClient) -> None:
    two = {"name": "node-10", "generation": 0, "resourceSliceCount": 2}
    assert fake.published("node-10", "cola.myway5.com") is None
    client.create_slice(valid(nodeName="node-10", pool=two, devices=devices(2)))
    assert fake.published("node-10", "cola.myway5.com") is None  # one of two slices
    client.create_slice(valid(nodeName="node-10", pool=two, devices=[{"name": "d9"}]))
    assert fake.published("node-10", "cola.myway5.com") == {"d0", "d1", "d9"}
    assert fake.published("node-10", "other.example.com") is None


def test_wait_published_returns_when_a_write_completes_the_pool_and_times_out_otherwise(
    fake: FakeApiServer, client: KubeClient
) -> None:
    pool = {"name": "node-11", "generation": 0, "resourceSliceCount": 1}
    writer = threading.Timer(0.2, lambda: client.create_slice(valid(nodeName="node-11", pool=pool, devices=devices(3))))
    writer.start()
    try:
        when = fake.wait_published("node-11", "cola.myway5.com", {"d0", "d1", "d2"}, timeout=10)
    finally:
        writer.join()
    assert when <= time.monotonic()
    with pytest.raises(TimeoutError, match="never listed the 2 devices expected; now 3 devices"):
        fake.wait_published("node-11", "cola.myway5.com", {"d0", "d1"}, timeout=0.2)
