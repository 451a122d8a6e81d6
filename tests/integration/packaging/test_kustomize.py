"""`kubectl kustomize` renders the shipped manifests, and them with the node-readiness or DRA component, into objects
that validate.

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
from tests.unit.packaging.test_dra_component import DRA, Verdict, colads_slice, user, write
from tests.unit.packaging.test_dra_component import K8S_VERSION as DRA_K8S_VERSION
from tests.unit.packaging.test_kubernetes_manifests import K8S_VERSION, KUBE, docs, need
from tests.unit.packaging.test_node_readiness import NRR

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


def test_the_component_renders_and_only_the_reporter_holds_a_token(tmp_path: Path) -> None:
    yaml = need("yaml")
    kubernetes_validate = need("kubernetes_validate")
    kubectl = shutil.which("kubectl")
    if kubectl is None:
        if sys.prefix != sys.base_prefix:
            pytest.fail("kubectl is not installed (make deps installs Debian's kubernetes-client)")
        pytest.skip("kubectl is not installed (the .deb build's environment)")
    (tmp_path / "kustomization.yaml").write_text(
        f"resources:\n  - {os.path.relpath(KUBE, tmp_path)}\ncomponents:\n  - {os.path.relpath(NRR, tmp_path)}\n"
    )
    rendered = subprocess.run([kubectl, "kustomize", str(tmp_path)], capture_output=True, text=True, timeout=60)
    assert rendered.returncode == 0, rendered.stderr
    objects = [d for d in yaml.safe_load_all(rendered.stdout) if d]
    kinds = sorted(d["kind"] for d in objects)
    assert kinds == sorted(
        [
            "ServiceAccount",
            "ServiceAccount",
            "ClusterRole",
            "ClusterRoleBinding",
            "ConfigMap",
            "DaemonSet",
            "Service",
            "NodeReadinessRule",
        ]
    )
    for obj in objects:
        if obj["kind"] != "NodeReadinessRule":
            kubernetes_validate.validate(obj, K8S_VERSION, strict=True)
    (ds,) = [d for d in objects if d["kind"] == "DaemonSet"]
    pod = ds["spec"]["template"]["spec"]
    assert pod["serviceAccountName"] == "colad-readiness-reporter" and pod["automountServiceAccountToken"] is False
    by_name = {c["name"]: c for c in pod["containers"]}
    assert sorted(by_name) == ["colad", "readiness-reporter"]
    assert "reporter-token" not in {m["name"] for m in by_name["colad"].get("volumeMounts", [])}
    assert "reporter-token" in {m["name"] for m in by_name["readiness-reporter"]["volumeMounts"]}
    (binding,) = [d for d in objects if d["kind"] == "ClusterRoleBinding"]
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": "colad-readiness-reporter", "namespace": "kube-system"}
    ]
    (role,) = [d for d in objects if d["kind"] == "ClusterRole"]
    assert role["rules"] == [
        {"apiGroups": [""], "resources": ["nodes"], "verbs": ["get"]},
        {"apiGroups": [""], "resources": ["nodes/status"], "verbs": ["patch", "update"]},
    ]


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


def test_the_dra_component_renders_a_dra_driver_with_its_own_identity(tmp_path: Path) -> None:
    kubernetes_validate = need("kubernetes_validate")
    base = os.path.relpath(KUBE, tmp_path)
    objects = render(tmp_path, f"resources:\n  - {base}\ncomponents:\n  - {os.path.relpath(DRA, tmp_path)}\n")
    names = sorted((d["kind"], d["metadata"]["name"]) for d in objects)
    assert names == sorted(
        [
            ("ServiceAccount", "colad"),
            ("ConfigMap", "colad-config"),
            ("DaemonSet", "colad"),
            ("Service", "colad-metrics"),
            ("ServiceAccount", "colad-dra"),
            ("ClusterRole", "colad-dra"),
            ("ClusterRoleBinding", "colad-dra"),
            ("ValidatingAdmissionPolicy", "colad-dra-resourceslices"),
            ("ValidatingAdmissionPolicyBinding", "colad-dra-resourceslices"),
            ("DeviceClass", "cola.myway5.com"),
        ]
    )
    for obj in objects:
        kubernetes_validate.validate(obj, DRA_K8S_VERSION, strict=True)
    (ds,) = [d for d in objects if d["kind"] == "DaemonSet"]
    pod = ds["spec"]["template"]["spec"]
    assert pod["serviceAccountName"] == "colad-dra" and pod["automountServiceAccountToken"] is False
    (colad,) = pod["containers"]
    env = {e["name"]: e.get("value", e.get("valueFrom")) for e in colad["env"]}
    assert env == {"COLAD_MODE": "dra", "NODE_NAME": {"fieldRef": {"fieldPath": "spec.nodeName"}}}
    mounts = {m["mountPath"] for m in colad["volumeMounts"]}
    # The base's mounts stay (device files, CDI, run and config directories), DRA's are added.
    assert {"/etc/colas", "/var/run/cdi", "/run/colad", "/etc/colad"} <= mounts
    assert {"/var/lib/kubelet/plugins_registry", "/var/lib/kubelet/plugins/cola.myway5.com"} <= mounts
    (account,) = [d for d in objects if d["kind"] == "ServiceAccount" and d["metadata"]["name"] == "colad"]
    assert account["automountServiceAccountToken"] is False  # device-plugin mode's identity stays tokenless
    (binding,) = [d for d in objects if d["kind"] == "ClusterRoleBinding"]
    assert [s["name"] for s in binding["subjects"]] == ["colad-dra"]


def test_the_admission_policy_follows_the_service_account_into_another_namespace(tmp_path: Path) -> None:
    base = os.path.relpath(KUBE, tmp_path)
    objects = render(
        tmp_path, f"namespace: colad\nresources:\n  - {base}\ncomponents:\n  - {os.path.relpath(DRA, tmp_path)}\n"
    )
    (ds,) = [d for d in objects if d["kind"] == "DaemonSet"]
    (binding,) = [d for d in objects if d["kind"] == "ClusterRoleBinding"]
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": "colad-dra", "namespace": "colad"}]
    username = (
        f"system:serviceaccount:{ds['metadata']['namespace']}:{ds['spec']['template']['spec']['serviceAccountName']}"
    )
    assert write("CREATE", user(username), colads_slice()) == Verdict.ALLOWED
    assert write("CREATE", user(username), colads_slice("node-2")) != Verdict.ALLOWED
