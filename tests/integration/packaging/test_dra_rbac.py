"""The DRA component's ClusterRole against what colad asks the API server for when it runs.

colad's slice publisher and DRA service run against the strict fake API server through a whole life: the
first publish (list, watch, the Node, create), a change (update), a claim read at prepare, and a
withdrawal (delete). Each recorded request is turned into the RBAC verb and resource the API server
would authorize it as (its request-info rules: a GET with watch is watch, without a name list, with one
get), and the set must be exactly the ClusterRole's rules. Every slice colad wrote must pass the
admission policy for a token bound to its own node.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import pytest

from colad.config.config import Config
from colad.core.backoff import Backoff
from colad.core.claims import ClaimRef
from colad.core.devices import Device, DeviceSet
from colad.dra.publisher import SlicePublisher
from colad.dra.service import DraPluginService
from colad.kube.access import Access, Credentials
from colad.kube.client import KubeClient
from tests.fakes.apiserver import FakeApiServer, Pki
from tests.helpers import wait_until
from tests.unit.packaging.test_dra_component import Verdict, granted, load, one, user, write

pytestmark = pytest.mark.integration

NODE = "node-1"
TOKEN = "test-token"
WAIT = 20.0


@pytest.fixture
def fake(tmp_path: Path) -> Iterator[FakeApiServer]:
    (tmp_path / "pki").mkdir()
    server = FakeApiServer(Pki(tmp_path / "pki"), tokens={TOKEN}).start()
    server.add_node(NODE, "node-uid-1")
    yield server
    server.stop()


def permission(method: str, target: str) -> tuple[str, str, str]:
    """(API group, resource, verb) of one request, as the API server's request-info resolver names it."""
    url = urlsplit(target)
    parts = url.path.strip("/").split("/")
    if parts[0] == "api":
        group, rest = "", parts[2:]
    else:
        group, rest = parts[1], parts[3:]
    if rest[0] == "namespaces" and len(rest) > 2:
        rest = rest[2:]
    resource, named = rest[0], len(rest) > 1
    if len(rest) > 2:
        resource += "/" + rest[2]
    watching = parse_qs(url.query).get("watch", [""])[0] in ("1", "true")
    verb = {
        "GET": "watch" if watching else ("get" if named else "list"),
        "POST": "create",
        "PUT": "update",
        "PATCH": "patch",
        "DELETE": "delete" if named else "deletecollection",
    }[method]
    return group, resource, verb


@pytest.mark.parametrize(
    ("method", "target", "expected"),
    [
        (
            "GET",
            "/apis/resource.k8s.io/v1/resourceslices?fieldSelector=x",
            ("resource.k8s.io", "resourceslices", "list"),
        ),
        ("GET", "/apis/resource.k8s.io/v1/resourceslices?watch=1", ("resource.k8s.io", "resourceslices", "watch")),
        ("GET", "/apis/resource.k8s.io/v1/resourceslices/s", ("resource.k8s.io", "resourceslices", "get")),
        (
            "DELETE",
            "/apis/resource.k8s.io/v1/resourceslices",
            ("resource.k8s.io", "resourceslices", "deletecollection"),
        ),
        ("GET", "/apis/resource.k8s.io/v1/namespaces/n/resourceclaims/c", ("resource.k8s.io", "resourceclaims", "get")),
        (
            "PUT",
            "/apis/resource.k8s.io/v1/namespaces/n/resourceclaims/c/status",
            ("resource.k8s.io", "resourceclaims/status", "update"),
        ),
        ("GET", "/api/v1/nodes/node-1", ("", "nodes", "get")),
    ],
)
def test_a_request_is_named_as_the_api_server_authorizes_it(
    method: str, target: str, expected: tuple[str, str, str]
) -> None:
    assert permission(method, target) == expected


def test_colad_asks_for_exactly_what_the_cluster_role_grants(fake: FakeApiServer, tmp_path: Path) -> None:
    cfg = Config()
    client = KubeClient(Credentials(Access(server=fake.url, ca_file=str(fake.pki.ca), token=TOKEN)), timeout=5.0)
    resource = cfg.resources[0].name
    errors: list[tuple[str, str]] = []
    publisher = SlicePublisher(
        client,
        driver=cfg.dra_driver_name,
        node_name=NODE,
        resource_names=[resource],
        count_error=lambda verb, code: errors.append((verb, code)),
        backoff=Backoff(first=0.02, cap=0.2),
    ).start()
    written: list[dict[str, Any]] = []
    try:
        publisher.publish({resource: DeviceSet.of([Device("cola0")])})
        wait_until(lambda: len(fake.node_slices(NODE)) == 1 or None, WAIT, "the slice created")
        written += fake.node_slices(NODE)
        publisher.publish({resource: DeviceSet.of([Device("cola0"), Device("cola1")])})
        wait_until(
            lambda: [len(s["spec"]["devices"]) for s in fake.node_slices(NODE)] == [2] or None,
            WAIT,
            "the slice updated",
        )
        written += fake.node_slices(NODE)
        wait_until(lambda: any("watch=1" in target for _, target, _ in fake.requests) or None, WAIT, "a watch")

        service = DraPluginService(
            driver=cfg.dra_driver_name,
            node_name=NODE,
            client=client,
            resources=cfg.resources,
            devices=lambda: {},
            cdi_spec_dir=str(tmp_path / "cdi"),
            state_dir=str(tmp_path / "state"),
        )
        try:
            claim = ClaimRef("default", "pod-claim", str(uuid.uuid4()))
            assert "not found" in str(service.prepare([claim])[claim.uid])
        finally:
            service.close()

        assert publisher.withdraw(WAIT)
        assert fake.node_slices(NODE) == []
    finally:
        publisher.stop()
    assert errors == []

    asked = {permission(method, target) for method, target, _ in fake.requests}
    assert asked == granted(one(load("rbac.yaml"), "ClusterRole"))
    for obj in written:
        assert obj["spec"]["nodeName"] == NODE
        for operation in ("CREATE", "UPDATE", "DELETE"):
            assert write(operation, user(node=NODE), obj) == Verdict.ALLOWED, (operation, obj["metadata"]["name"])
