"""colad/kube against the strict fake API server: TLS verified, token and certificate auth, conflicts,
watch, token rotation, and outages that end in a typed error within the call's time."""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from colad.core.devices import Device, DeviceSet
from colad.core.slices import plan, pool, read_slice, slice_object
from colad.kube.access import Access, Credentials, from_kubeconfig, in_cluster
from colad.kube.client import KubeClient, WatchEvent, field_selector
from colad.kube.errors import ApiError, Conflict, Expired, KubeconfigError, NotFound, Unreachable
from tests.fakes.apiserver import FakeApiServer, Pki
from tests.helpers import wait_until

pytestmark = pytest.mark.integration

DRIVER = "cola.myway5.com"
NODE = "node-1"
TOKEN = "test-token"


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    return Pki(tmp_path_factory.mktemp("pki"))


@pytest.fixture
def fake(pki: Pki) -> Iterator[FakeApiServer]:
    server = FakeApiServer(pki, tokens={TOKEN}).start()
    server.add_node(NODE, "node-uid-1")
    yield server
    server.hang.clear()
    server.stop()


def client_for(fake: FakeApiServer, *, token: str = TOKEN, timeout: float = 5.0, **kwargs: object) -> KubeClient:
    access = Access(server=fake.url, ca_file=str(fake.pki.ca), token=token, **kwargs)  # type: ignore[arg-type]
    return KubeClient(Credentials(access), timeout=timeout)


def a_slice(index: int = 0, n: int = 2) -> dict[str, object]:
    made = pool(NODE, "myway5.com/cola", DeviceSet.of(Device(f"cola{i}") for i in range(n)))
    desired = plan(DRIVER, NODE, [made], []).create[0]
    return slice_object(desired, DRIVER, NODE, "node-uid-1")


def test_create_get_update_delete_a_slice(fake: FakeApiServer) -> None:
    client = client_for(fake)
    created = client.create_slice(a_slice())
    name = created["metadata"]["name"]
    assert name.startswith("00000-cola.myway5.com-node-1-")
    assert client.get_slice(name)["spec"] == created["spec"]
    created["spec"]["devices"] = created["spec"]["devices"][:1]
    updated = client.update_slice(created)
    assert updated["metadata"]["resourceVersion"] != created["metadata"]["resourceVersion"]
    client.delete_slice(name, uid=updated["metadata"]["uid"], resource_version=updated["metadata"]["resourceVersion"])
    with pytest.raises(NotFound):
        client.get_slice(name)


def test_a_stale_update_is_a_conflict_and_a_fresh_read_succeeds(fake: FakeApiServer) -> None:
    client = client_for(fake)
    created = client.create_slice(a_slice())
    client.update_slice(json.loads(json.dumps(created)))
    with pytest.raises(Conflict) as raised:
        client.update_slice(created)
    assert raised.value.status == 409 and raised.value.reason == "Conflict"
    fresh = client.get_slice(created["metadata"]["name"])
    client.update_slice(fresh)


def test_a_delete_with_a_stale_precondition_is_a_conflict(fake: FakeApiServer) -> None:
    client = client_for(fake)
    created = client.create_slice(a_slice())
    client.update_slice(created)
    with pytest.raises(Conflict):
        client.delete_slice(created["metadata"]["name"], resource_version=created["metadata"]["resourceVersion"])


def test_list_selects_this_node_and_driver(fake: FakeApiServer) -> None:
    client = client_for(fake)
    client.create_slice(a_slice())
    other = a_slice()
    other["spec"]["driver"] = "other.example.com"  # type: ignore[index]
    client.create_slice(other)
    items, version = client.list_slices(field_selector(node_name=NODE, driver=DRIVER))
    assert [i["spec"]["driver"] for i in items] == [DRIVER] and int(version) > 0
    assert len(client.list_slices(field_selector(node_name=NODE))[0]) == 2
    assert client.list_slices(field_selector(node_name="node-2"))[0] == []


def test_a_plan_carried_out_leaves_the_slices_exact(fake: FakeApiServer) -> None:
    client = client_for(fake)
    node_uid = client.get_node(NODE)["metadata"]["uid"]
    selector = field_selector(node_name=NODE, driver=DRIVER)
    for n in (300, 301, 120):
        wanted = [pool(NODE, "myway5.com/cola", DeviceSet.of(Device(f"cola{i:03d}") for i in range(n)))]
        existing = [read_slice(o) for o in client.list_slices(selector)[0]]
        todo = plan(DRIVER, NODE, wanted, existing)
        for gone in todo.delete:
            client.delete_slice(gone.name, uid=gone.uid, resource_version=gone.resource_version)
        for held, desired in todo.update:
            client.update_slice(slice_object(desired, DRIVER, NODE, node_uid, held))
        for desired in todo.create:
            client.create_slice(slice_object(desired, DRIVER, NODE, node_uid))
        held_now = [read_slice(o) for o in client.list_slices(selector)[0]]
        assert sum(len(s.devices) for s in held_now) == n
        assert not plan(DRIVER, NODE, wanted, held_now)
    assert fake.node_slices(NODE)[0]["metadata"]["ownerReferences"][0]["uid"] == "node-uid-1"


def test_claim_and_node_reads(fake: FakeApiServer) -> None:
    fake.add_claim({"metadata": {"namespace": "ns", "name": "claim-a"}, "status": {"allocation": {}}})
    client = client_for(fake)
    assert client.get_claim("ns", "claim-a")["metadata"]["uid"] == "claim-uid-claim-a"
    with pytest.raises(NotFound):
        client.get_claim("ns", "missing")
    assert client.get_node(NODE)["metadata"]["uid"] == "node-uid-1"


def test_a_watch_sees_changes_after_its_resource_version_and_bookmarks(fake: FakeApiServer) -> None:
    client = client_for(fake)
    selector = field_selector(node_name=NODE, driver=DRIVER)
    client.create_slice(a_slice())
    _, version = client.list_slices(selector)
    watch = client.watch_slices(selector, version, timeout_seconds=30)
    seen: list[WatchEvent] = []
    reader = threading.Thread(target=lambda: seen.extend(watch), daemon=True)
    reader.start()
    created = client.create_slice(a_slice(n=3))
    other = a_slice()
    other["spec"]["driver"] = "other.example.com"  # type: ignore[index]
    client.create_slice(other)
    assert fake.wipe_node(NODE) == 3
    fake.bookmark()
    wait_until(lambda: any(e.type == "BOOKMARK" for e in seen), 10, "a bookmark")
    watch.close()
    reader.join(10)
    kinds = [(e.type, e.object["metadata"].get("name")) for e in seen if e.type != "BOOKMARK"]
    assert kinds[0] == ("ADDED", created["metadata"]["name"])
    assert [k for k, _ in kinds] == ["ADDED", "DELETED", "DELETED"]  # the other driver's slice never shows
    assert seen[-1].resource_version == str(fake.resource_version)


def test_a_watch_from_a_compacted_version_is_expired(fake: FakeApiServer) -> None:
    client = client_for(fake)
    client.create_slice(a_slice())
    fake.compact()
    client.create_slice(a_slice())
    with pytest.raises(Expired):
        list(client.watch_slices("", "1", timeout_seconds=5))


def test_the_server_ends_a_watch_at_its_timeout(fake: FakeApiServer) -> None:
    client = client_for(fake)
    assert list(client.watch_slices("", "", timeout_seconds=1)) == []


def test_no_token_or_a_wrong_one_is_unauthorized(fake: FakeApiServer) -> None:
    for token in ("", "wrong"):
        with pytest.raises(ApiError) as raised:
            client_for(fake, token=token).list_slices()
        assert raised.value.status == 401


def test_a_server_certificate_from_another_ca_fails_verification(fake: FakeApiServer, tmp_path: Path) -> None:
    other = Pki(tmp_path)
    client = KubeClient(Credentials(Access(server=fake.url, ca_file=str(other.ca), token=TOKEN)), timeout=5)
    with pytest.raises(Unreachable, match="TLS verification failed"):
        client.list_slices()


def test_tls_server_name_checks_the_certificate_for_that_name(fake: FakeApiServer) -> None:
    client_for(fake, tls_server_name="localhost").list_slices()
    with pytest.raises(Unreachable, match="TLS verification failed"):
        client_for(fake, tls_server_name="elsewhere.example.com").list_slices()


def test_a_client_certificate_authenticates(fake: FakeApiServer) -> None:
    cert, key = fake.pki.issue("system:node:node-1")
    client = client_for(fake, token="", cert_file=str(cert), key_file=str(key))
    assert client.list_slices()[0] == []
    in_memory = client_for(fake, token="", cert_data=cert.read_bytes(), key_data=key.read_bytes())
    assert in_memory.list_slices()[0] == []


def test_a_rotated_token_file_is_read_again(fake: FakeApiServer, tmp_path: Path) -> None:
    token_file = tmp_path / "token"
    token_file.write_text(TOKEN + "\n")
    client = KubeClient(Credentials(Access(server=fake.url, ca_file=str(fake.pki.ca), token_file=str(token_file))))
    client.list_slices()
    fake.tokens = {"rotated"}
    with pytest.raises(ApiError):
        client.list_slices()
    fresh = tmp_path / "token.new"
    fresh.write_text("rotated")
    os.replace(fresh, token_file)
    client.list_slices()


def project(directory: Path, files: dict[str, bytes]) -> None:
    """Write `files` into `directory` as the kubelet's projected volumes do (pkg/volume/util/atomic_writer.go):
    a new timestamped directory, a `..data` symlink swapped to it by rename, each file a link through it."""
    directory.mkdir(exist_ok=True)
    version = directory / f"..2026_{len(list(directory.glob('..2026_*'))):04d}"
    version.mkdir()
    for name, data in files.items():
        (version / name).write_bytes(data)
    (directory / "..data_tmp").symlink_to(version.name)
    os.replace(directory / "..data_tmp", directory / "..data")
    for name in files:
        if not (directory / name).is_symlink():
            (directory / name).symlink_to(f"..data/{name}")


def test_a_token_rotated_by_a_symlink_swap_is_used_from_the_next_call(fake: FakeApiServer, tmp_path: Path) -> None:
    account = tmp_path / "serviceaccount"
    project(account, {"token": b"first", "ca.crt": fake.pki.ca.read_bytes()})
    fake.tokens = {"first", "second"}
    client = KubeClient(Credentials(in_cluster("127.0.0.1", str(fake.port), str(account))))
    client.list_slices()
    project(account, {"token": b"second", "ca.crt": fake.pki.ca.read_bytes()})
    client.list_slices()
    client.get_node(NODE)
    assert fake.identities == ["token:first", "token:second", "token:second"]
    fake.tokens = {"second"}  # the old token expires: the server refuses it, the client never sends it again
    with pytest.raises(ApiError) as refused:
        client_for(fake, token="first").list_slices()
    assert refused.value.status == 401
    client.list_slices()
    assert fake.identities[-1] == "token:second"


def test_a_401_reads_the_token_file_again_though_its_stat_is_unchanged(fake: FakeApiServer, tmp_path: Path) -> None:
    token_file = tmp_path / "token"
    token_file.write_text("aaaa")
    stat = token_file.stat()
    client = KubeClient(Credentials(Access(server=fake.url, ca_file=str(fake.pki.ca), token_file=str(token_file))))
    fake.tokens = {"aaaa"}
    client.list_slices()
    token_file.write_text("bbbb")  # same inode, same size, and the old times put back
    os.utime(token_file, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    fake.tokens = {"bbbb"}
    with pytest.raises(ApiError) as refused:
        client.list_slices()  # the token read before is refused
    assert refused.value.status == 401
    client.list_slices()
    assert fake.identities == ["token:aaaa", "token:bbbb"]


def kubeconfig_for(path: Path, server: str, ca: Path, user: dict[str, str]) -> None:
    """Write a kubeconfig (JSON) by replacing the file, as an operator's tooling or a Secret mount does."""
    doc = {
        "apiVersion": "v1",
        "kind": "Config",
        "current-context": "here",
        "clusters": [{"name": "c", "cluster": {"server": server, "certificate-authority": str(ca)}}],
        "users": [{"name": "u", "user": user}],
        "contexts": [{"name": "here", "context": {"cluster": "c", "user": "u"}}],
    }
    fresh = path.with_name(path.name + ".new")
    fresh.write_text(json.dumps(doc))
    os.replace(fresh, path)


def test_a_rewritten_kubeconfig_is_used_from_the_next_call(fake: FakeApiServer, tmp_path: Path) -> None:
    config = tmp_path / "kubeconfig"
    kubeconfig_for(config, fake.url, fake.pki.ca, {"token": TOKEN})
    client = KubeClient(Credentials(from_kubeconfig(str(config)), kubeconfig=str(config)))
    client.list_slices()
    cert, key = fake.pki.issue("colad-node-1")
    kubeconfig_for(config, fake.url, fake.pki.ca, {"client-certificate": str(cert), "client-key": str(key)})
    client.list_slices()
    assert fake.identities == [f"token:{TOKEN}", "x509:colad-node-1"]
    # Another server with another CA and token: the client follows the kubeconfig there.
    (tmp_path / "other-pki").mkdir()
    other = FakeApiServer(Pki(tmp_path / "other-pki"), tokens={"elsewhere"}).start()
    try:
        kubeconfig_for(config, other.url, other.pki.ca, {"token": "elsewhere"})
        client.list_slices()
        assert other.identities == ["token:elsewhere"]
    finally:
        other.stop()


def test_a_renewed_client_certificate_is_presented_from_the_next_call(fake: FakeApiServer, tmp_path: Path) -> None:
    cert, key = fake.pki.issue("colad-first")
    held_cert, held_key = tmp_path / "client.crt", tmp_path / "client.key"
    held_cert.write_bytes(cert.read_bytes())
    held_key.write_bytes(key.read_bytes())
    client = client_for(fake, token="", cert_file=str(held_cert), key_file=str(held_key))
    client.list_slices()
    cert, key = fake.pki.issue("colad-renewed")
    for source, target in ((key, held_key), (cert, held_cert)):
        target.with_suffix(".new").write_bytes(source.read_bytes())
        os.replace(target.with_suffix(".new"), target)
    client.list_slices()
    assert fake.identities == ["x509:colad-first", "x509:colad-renewed"]


def test_in_cluster_access_reads_the_service_account_files(fake: FakeApiServer, tmp_path: Path) -> None:
    (tmp_path / "token").write_text(TOKEN)
    (tmp_path / "ca.crt").write_bytes(fake.pki.ca.read_bytes())
    access = in_cluster("127.0.0.1", str(fake.port), str(tmp_path))
    assert KubeClient(Credentials(access)).list_slices()[0] == []
    with pytest.raises(KubeconfigError, match="KUBERNETES_SERVICE_HOST"):
        in_cluster("", "443", str(tmp_path))
    with pytest.raises(KubeconfigError, match="missing"):
        in_cluster("127.0.0.1", "443", str(tmp_path / "absent"))


def test_a_kubeconfig_with_relative_files_and_yaml_reaches_the_server(fake: FakeApiServer, tmp_path: Path) -> None:
    (tmp_path / "ca.crt").write_bytes(fake.pki.ca.read_bytes())
    (tmp_path / "token").write_text(TOKEN)
    config = tmp_path / "kubeconfig"
    config.write_text(
        "apiVersion: v1\nkind: Config\ncurrent-context: here\n"
        f"clusters:\n- name: c\n  cluster:\n    server: {fake.url}\n    certificate-authority: ca.crt\n"
        "users:\n- name: u\n  user:\n    tokenFile: token\n"
        "contexts:\n- name: here\n  context:\n    cluster: c\n    user: u\n"
    )
    assert KubeClient(Credentials(from_kubeconfig(str(config)))).list_slices()[0] == []


def test_a_server_that_is_down_is_unreachable_at_once_and_reachable_when_back(fake: FakeApiServer) -> None:
    client = client_for(fake, timeout=2)
    client.create_slice(a_slice())
    fake.stop()
    with pytest.raises(Unreachable):
        client.list_slices()
    fake.start()
    assert len(client.list_slices()[0]) == 1  # the objects outlive the outage


def test_a_server_that_hangs_is_unreachable_within_the_timeout(fake: FakeApiServer) -> None:
    client = client_for(fake, timeout=0.5)
    fake.hang.set()
    done = threading.Event()
    errors: list[Exception] = []

    def call() -> None:
        try:
            client.list_slices()
        except Exception as exc:  # the thread reports what it saw
            errors.append(exc)
        done.set()

    threading.Thread(target=call, daemon=True).start()
    assert done.wait(20), "the call never returned"
    assert len(errors) == 1 and isinstance(errors[0], Unreachable)


def test_a_watch_cut_by_an_outage_is_unreachable(fake: FakeApiServer) -> None:
    client = client_for(fake)
    watch = client.watch_slices("", "", timeout_seconds=60)
    errors: list[Exception] = []

    def read() -> None:
        try:
            list(watch)
        except Exception as exc:  # the thread reports what it saw
            errors.append(exc)

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    wait_until(lambda: any("watch=1" in path for _, path, _ in fake.requests), 10, "the watch request")
    fake.stop()
    reader.join(20)
    assert not reader.is_alive()
    assert errors == [] or isinstance(errors[0], Unreachable)
