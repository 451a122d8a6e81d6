"""`kubectl kustomize` renders the shipped manifests, and them with the node-readiness or DRA component or both, into
objects that validate, where the pod's one identity is the base's ServiceAccount `colad` and only the containers that
call the API server hold its token.

kubectl is Debian's kubernetes-client, installed by `make setup`; the .deb build's environment lacks it.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from colad import __version__
from colad.kube.access import SERVICE_ACCOUNT_DIR
from tests.unit.packaging.test_dra_component import DRA, Verdict, colads_slice, user, write
from tests.unit.packaging.test_dra_component import K8S_VERSION as DRA_K8S_VERSION
from tests.unit.packaging.test_kubernetes_manifests import K8S_VERSION, KUBE, docs, need
from tests.unit.packaging.test_node_readiness import NRR, kubelets_node, reported, status_write

pytestmark = pytest.mark.integration
__all__ = ["docs"]  # the manifests fixture, shared with the unit tests of the manifests


def test_kustomize_renders_objects_that_validate(docs: list[dict[str, Any]]) -> None:
    """`kubectl kustomize packaging/kubernetes` (what `kubectl apply -k` applies) renders, and validates strictly."""
    yaml = need("yaml")
    kubernetes_validate = need("kubernetes_validate")
    kubectl = shutil.which("kubectl")
    if kubectl is None:
        if sys.prefix != sys.base_prefix:
            pytest.fail("kubectl is not installed (make deps installs Debian's kubernetes-client)")
        pytest.skip("kubectl is not installed (the .deb build's environment)")
    rendered = subprocess.run([kubectl, "kustomize", str(KUBE)], capture_output=True, text=True, timeout=60)
    assert rendered.returncode == 0, rendered.stderr
    objects = [d for d in yaml.safe_load_all(rendered.stdout) if d]
    source = {(d["kind"], d["metadata"]["name"]) for d in docs if d["kind"] != "PodMonitor"}
    assert {(d["kind"], d["metadata"]["name"]) for d in objects} == source
    for obj in objects:
        kubernetes_validate.validate(obj, K8S_VERSION, strict=True)
    (daemonset,) = [d for d in objects if d["kind"] == "DaemonSet"]
    kustomization = yaml.safe_load((KUBE / "kustomization.yaml").read_text())
    (image,) = kustomization["images"]
    assert daemonset["spec"]["template"]["spec"]["containers"][0]["image"] == f"{image['newName']}:{image['newTag']}"
    assert image["newTag"] == __version__, "make image tags localhost/colad:<version>"


def render(tmp_path: Path, kustomization: str) -> list[dict[str, Any]]:
    yaml = need("yaml")
    kubectl = shutil.which("kubectl")
    if kubectl is None:
        if sys.prefix != sys.base_prefix:
            pytest.fail("kubectl is not installed (make deps installs Debian's kubernetes-client)")
        pytest.skip("kubectl is not installed (the .deb build's environment)")
    (tmp_path / "kustomization.yaml").write_text(kustomization)
    rendered = subprocess.run([kubectl, "kustomize", str(tmp_path)], capture_output=True, text=True, timeout=60)
    assert rendered.returncode == 0, rendered.stderr
    return [d for d in yaml.safe_load_all(rendered.stdout) if d]


def kustomization(tmp_path: Path, *components: Path, namespace: str = "") -> str:
    lines = [f"namespace: {namespace}"] if namespace else []
    lines += ["resources:", f"  - {os.path.relpath(KUBE, tmp_path)}", "components:"]
    lines += [f"  - {os.path.relpath(c, tmp_path)}" for c in components]
    return "\n".join(lines) + "\n"


def pod_of(objects: list[dict[str, Any]]) -> dict[str, Any]:
    (ds,) = [d for d in objects if d["kind"] == "DaemonSet"]
    pod: dict[str, Any] = ds["spec"]["template"]["spec"]
    return pod


def token_holders(pod: dict[str, Any]) -> dict[str, str]:
    """Container name -> where it mounts a ServiceAccount token (a projected volume with a serviceAccountToken)."""
    tokens = {
        v["name"]
        for v in pod["volumes"]
        if any("serviceAccountToken" in s for s in v.get("projected", {}).get("sources", []))
    }
    holders = {}
    for container in pod["containers"]:
        for mount in container.get("volumeMounts", []):
            if mount["name"] in tokens:
                assert container["name"] not in holders, f"{container['name']} mounts two tokens"
                holders[container["name"]] = mount["mountPath"]
    return holders


def bindings(objects: list[dict[str, Any]]) -> dict[str, list[dict[str, str]]]:
    """ClusterRole name -> the subjects of its binding."""
    return {d["roleRef"]["name"]: d["subjects"] for d in objects if d["kind"] == "ClusterRoleBinding"}


COLAD_SA = [{"kind": "ServiceAccount", "name": "colad", "namespace": "kube-system"}]
READYZ = "http://127.0.0.1:9647/readyz"


def env_of(container: dict[str, Any]) -> dict[str, Any]:
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in container.get("env", [])}


def test_the_node_readiness_component_renders_and_only_the_reporter_holds_a_token(tmp_path: Path) -> None:
    kubernetes_validate = need("kubernetes_validate")
    objects = render(tmp_path, kustomization(tmp_path, NRR))
    names = sorted((d["kind"], d["metadata"]["name"]) for d in objects)
    assert names == sorted(
        [
            ("ServiceAccount", "colad"),
            ("ConfigMap", "colad-config"),
            ("DaemonSet", "colad"),
            ("Service", "colad-metrics"),
            ("ClusterRole", "colad-readiness-reporter"),
            ("ClusterRoleBinding", "colad-readiness-reporter"),
            ("ValidatingAdmissionPolicy", "colad-readiness-node-status"),
            ("ValidatingAdmissionPolicyBinding", "colad-readiness-node-status"),
            ("NodeReadinessRule", "colad-ready"),
        ]
    )
    for obj in objects:
        if obj["kind"] != "NodeReadinessRule":
            kubernetes_validate.validate(obj, K8S_VERSION, strict=True)
    pod = pod_of(objects)
    assert pod["serviceAccountName"] == "colad" and pod["automountServiceAccountToken"] is False
    assert sorted(c["name"] for c in pod["containers"]) == ["colad", "readiness-reporter"]
    # colad itself has no token at all: device-plugin mode never calls the API server.
    assert token_holders(pod) == {"readiness-reporter": SERVICE_ACCOUNT_DIR}
    assert bindings(objects) == {"colad-readiness-reporter": COLAD_SA}
    (role,) = [d for d in objects if d["kind"] == "ClusterRole"]
    assert role["rules"] == [
        {"apiGroups": [""], "resources": ["nodes"], "verbs": ["get"]},
        {"apiGroups": [""], "resources": ["nodes/status"], "verbs": ["patch", "update"]},
    ]


def test_the_dra_component_renders_a_dra_driver_bound_to_the_pods_identity(tmp_path: Path) -> None:
    kubernetes_validate = need("kubernetes_validate")
    objects = render(tmp_path, kustomization(tmp_path, DRA))
    names = sorted((d["kind"], d["metadata"]["name"]) for d in objects)
    assert names == sorted(
        [
            ("ServiceAccount", "colad"),
            ("ConfigMap", "colad-config"),
            ("DaemonSet", "colad"),
            ("Service", "colad-metrics"),
            ("ClusterRole", "colad-dra"),
            ("ClusterRoleBinding", "colad-dra"),
            ("ValidatingAdmissionPolicy", "colad-dra-resourceslices"),
            ("ValidatingAdmissionPolicyBinding", "colad-dra-resourceslices"),
            ("DeviceClass", "cola.myway5.com"),
        ]
    )
    for obj in objects:
        kubernetes_validate.validate(obj, DRA_K8S_VERSION, strict=True)
    pod = pod_of(objects)
    assert pod["serviceAccountName"] == "colad" and pod["automountServiceAccountToken"] is False
    (colad,) = pod["containers"]
    assert env_of(colad) == {"COLAD_MODE": "dra", "NODE_NAME": {"fieldRef": {"fieldPath": "spec.nodeName"}}}
    mounts = {m["mountPath"] for m in colad["volumeMounts"]}
    # The base's mounts stay (device files, CDI, run and config directories), DRA's are added.
    assert {"/etc/colas", "/var/run/cdi", "/run/colad", "/etc/colad"} <= mounts
    assert {"/var/lib/kubelet/plugins_registry", "/var/lib/kubelet/plugins/cola.myway5.com"} <= mounts
    assert token_holders(pod) == {"colad": SERVICE_ACCOUNT_DIR}
    (account,) = [d for d in objects if d["kind"] == "ServiceAccount"]
    assert account["automountServiceAccountToken"] is False  # no container gets a token unless mounted
    assert bindings(objects) == {"colad-dra": COLAD_SA}


@pytest.mark.parametrize("order", [pytest.param((DRA, NRR), id="dra-first"), pytest.param((NRR, DRA), id="nrr-first")])
def test_both_components_share_the_pods_identity_in_either_order(tmp_path: Path, order: tuple[Path, Path]) -> None:
    """DRA mode with the readiness recipe: one ServiceAccount holds both roles, each container its own token."""
    kubernetes_validate = need("kubernetes_validate")
    objects = render(tmp_path, kustomization(tmp_path, *order))
    for obj in objects:
        if obj["kind"] != "NodeReadinessRule":
            kubernetes_validate.validate(obj, DRA_K8S_VERSION, strict=True)
    assert [d["metadata"]["name"] for d in objects if d["kind"] == "ServiceAccount"] == ["colad"]
    assert {d["kind"] for d in objects} >= {"NodeReadinessRule", "DeviceClass"}
    policies = {d["metadata"]["name"] for d in objects if d["kind"] == "ValidatingAdmissionPolicy"}
    bound = {d["spec"]["policyName"] for d in objects if d["kind"] == "ValidatingAdmissionPolicyBinding"}
    assert policies == bound == {"colad-dra-resourceslices", "colad-readiness-node-status"}
    pod = pod_of(objects)
    assert pod["serviceAccountName"] == "colad" and pod["automountServiceAccountToken"] is False
    assert bindings(objects) == {"colad-dra": COLAD_SA, "colad-readiness-reporter": COLAD_SA}
    by_name = {c["name"]: c for c in pod["containers"]}
    assert sorted(by_name) == ["colad", "readiness-reporter"]
    assert token_holders(pod) == {"colad": SERVICE_ACCOUNT_DIR, "readiness-reporter": SERVICE_ACCOUNT_DIR}
    assert env_of(by_name["colad"]) == {
        "COLAD_MODE": "dra",
        "NODE_NAME": {"fieldRef": {"fieldPath": "spec.nodeName"}},
    }
    mounts = {m["mountPath"] for m in by_name["colad"]["volumeMounts"]}
    assert {"/var/lib/kubelet/plugins_registry", "/var/lib/kubelet/plugins/cola.myway5.com"} <= mounts
    reporter = env_of(by_name["readiness-reporter"])
    assert reporter["CHECK_ENDPOINT"] == READYZ and reporter["NODE_NAME"] == {
        "fieldRef": {"fieldPath": "spec.nodeName"}
    }
    # Both tokens are the pod's: the policy confines slice writes made with either to this node.
    username = f"system:serviceaccount:kube-system:{pod['serviceAccountName']}"
    assert write("CREATE", user(username), colads_slice()) == Verdict.ALLOWED
    assert write("CREATE", user(username), colads_slice("node-2")) != Verdict.ALLOWED
    # ... and node-status writes made with either to this node's condition myway5.com/ColadReady.
    node = kubelets_node()
    assert status_write(user(username), reported(node), node) == Verdict.ALLOWED
    other = kubelets_node("node-2")
    assert status_write(user(username), reported(other), other) != Verdict.ALLOWED


def test_the_admission_policies_follow_the_service_account_into_another_namespace(tmp_path: Path) -> None:
    objects = render(tmp_path, kustomization(tmp_path, DRA, namespace="colad"))
    (ds,) = [d for d in objects if d["kind"] == "DaemonSet"]
    assert bindings(objects) == {"colad-dra": [{"kind": "ServiceAccount", "name": "colad", "namespace": "colad"}]}
    username = (
        f"system:serviceaccount:{ds['metadata']['namespace']}:{ds['spec']['template']['spec']['serviceAccountName']}"
    )
    assert write("CREATE", user(username), colads_slice()) == Verdict.ALLOWED
    assert write("CREATE", user(username), colads_slice("node-2")) != Verdict.ALLOWED
    # The node-status policy matches the same way.
    objects = render(tmp_path, kustomization(tmp_path, NRR, namespace="colad"))
    assert bindings(objects) == {
        "colad-readiness-reporter": [{"kind": "ServiceAccount", "name": "colad", "namespace": "colad"}]
    }
    node, other = kubelets_node(), kubelets_node("node-2")
    assert status_write(user(username), reported(node), node) == Verdict.ALLOWED
    assert status_write(user(username), reported(other), other) != Verdict.ALLOWED
