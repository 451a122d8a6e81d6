"""packaging/kubernetes/node-readiness: the NodeReadinessRule against the upstream CRD, and the recipe's parts agree.

The CRD is a verbatim copy (tests/schemas/README.md). Its openAPIV3Schema is applied as the API server
does with strict field validation (unknown fields refused), and its create-time CEL rules are restated
here one by one: a rule upstream adds that this table lacks fails the test. The taint, the condition,
the endpoint and the node selector must agree across the rule, the kubelet snippet, the reporter and
colad's DaemonSet; the component renders with kustomize and its built-in objects validate strictly.
"""

from __future__ import annotations

import copy
import importlib
import re
import sys
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from colad.health.rule import DRA_SERVING, dra_registration_problem, slices_problem
from colad.outputs.statefile import PluginState, SliceStatus

pytestmark = pytest.mark.unit
ROOT = Path(__file__).resolve().parents[3]
KUBE = ROOT / "packaging" / "kubernetes"
NRR = KUBE / "node-readiness"
CRD = ROOT / "tests" / "schemas" / "node-readiness" / "readiness.node.x-k8s.io_nodereadinessrules.yaml"
K8S_VERSION = "1.30.0"
# k8s.io/apimachinery metav1.Condition type: an optional DNS-subdomain prefix, then a qualified name part.
CONDITION_TYPE = re.compile(
    r"([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])\Z"
)


def need(name: str) -> ModuleType:
    """A module .venv must have (make setup); Debian's python3 for the .deb build may lack it."""
    try:
        return importlib.import_module(name)
    except ImportError:
        if sys.prefix != sys.base_prefix:
            pytest.fail(f"{name} is missing from .venv (make setup installs it)")
        pytest.skip(f"{name} is not installed")


def load(path: Path) -> list[dict[str, Any]]:
    return [d for d in need("yaml").safe_load_all(path.read_text()) if d]


def strict(schema: dict[str, Any]) -> dict[str, Any]:
    """The schema with unknown fields refused, as `kubectl apply` (field validation Strict) does."""
    schema = copy.deepcopy(schema)

    def walk(node: Any) -> None:
        if isinstance(node, dict):
            if node.get("type") == "object" and "properties" in node and "additionalProperties" not in node:
                node["additionalProperties"] = False
            for value in node.values():
                walk(value)
        elif isinstance(node, list):
            for value in node:
                walk(value)

    walk(schema)
    return schema


def crd_schema() -> dict[str, Any]:
    (crd,) = load(CRD)
    assert crd["spec"]["names"]["kind"] == "NodeReadinessRule" and crd["spec"]["scope"] == "Cluster"
    (version,) = [v for v in crd["spec"]["versions"] if v["name"] == "v1alpha1"]
    assert version["served"] and version["storage"]
    schema: dict[str, Any] = version["schema"]["openAPIV3Schema"]
    return schema


def rule() -> dict[str, Any]:
    (doc,) = load(NRR / "nodereadinessrule.yaml")
    return doc


# Every create-time CEL rule of the CRD, by its text, as a predicate on the object it sits on.
CEL: dict[str, Callable[[dict[str, Any]], bool]] = {
    "self.key.startsWith('readiness.k8s.io/')": lambda t: t["key"].startswith("readiness.k8s.io/"),
    "self.key.size() <= 253": lambda t: len(t["key"]) <= 253,
    "size(self.key.split('/')) == 2": lambda t: len(t["key"].split("/")) == 2,
    "size(self.key.split('/')[1]) > 0 && size(self.key.split('/')[1]) <= 63": lambda t: (
        0 < len(t["key"].split("/")[1]) <= 63
    ),
    "self.key.split('/')[1].matches('^[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$')": lambda t: bool(
        re.match(r"^[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$", t["key"].split("/")[1])
    ),
    "!has(self.value) || self.value.size() <= 63": lambda t: "value" not in t or len(t["value"]) <= 63,
    "self.effect in ['NoSchedule', 'PreferNoSchedule', 'NoExecute']": lambda t: (
        t["effect"] in ("NoSchedule", "PreferNoSchedule", "NoExecute")
    ),
}


def cel_rules(schema: dict[str, Any], obj: Any, path: str = "") -> list[tuple[str, str, Any]]:
    """(path, rule, object) for every x-kubernetes-validations rule on a part of `obj` that is present."""
    found = []
    for validation in schema.get("x-kubernetes-validations", []):
        found.append((path, validation["rule"], obj))
    if isinstance(obj, dict):
        for key, sub in schema.get("properties", {}).items():
            if key in obj:
                found += cel_rules(sub, obj[key], f"{path}.{key}")
    if isinstance(obj, list) and "items" in schema:
        for i, item in enumerate(obj):
            found += cel_rules(schema["items"], item, f"{path}[{i}]")
    return found


def check_cel(obj: dict[str, Any]) -> list[str]:
    failures = []
    for path, text, target in cel_rules(crd_schema(), obj):
        if "oldSelf" in text:
            continue  # transition rules (immutability): they only apply to updates
        assert text in CEL, f"a CEL rule this test does not know yet at {path}: {text}"
        if not CEL[text](target):
            failures.append(f"{path}: {text}")
    return failures


def test_the_rule_validates_against_the_crd_schema() -> None:
    jsonschema = need("jsonschema")
    validator = jsonschema.Draft7Validator(strict(crd_schema()))
    doc = rule()
    assert [e.message for e in validator.iter_errors(doc)] == []
    assert doc["apiVersion"] == "readiness.node.x-k8s.io/v1alpha1" and doc["kind"] == "NodeReadinessRule"
    assert check_cel(doc) == []
    for condition in doc["spec"]["conditions"]:
        assert CONDITION_TYPE.match(condition["type"]), condition


@pytest.mark.parametrize(
    ("change", "schema_error", "cel_error"),
    [
        pytest.param(lambda s: s.update(enforcementMode="always"), True, False, id="unknown-mode"),
        pytest.param(lambda s: s.pop("nodeSelector"), True, False, id="no-node-selector"),
        pytest.param(lambda s: s.update(conditions=[]), True, False, id="no-conditions"),
        pytest.param(lambda s: s["taint"].update(efect="NoSchedule"), True, False, id="misspelt-field"),
        pytest.param(lambda s: s["taint"].update(key="example.com/ColadReady"), False, True, id="taint-prefix"),
        pytest.param(lambda s: s["taint"].update(effect="NoEvict"), False, True, id="taint-effect"),
        pytest.param(lambda s: s["taint"].update(value="x" * 64), False, True, id="taint-value-length"),
    ],
)
def test_the_checks_can_fail(change: Callable[[dict[str, Any]], object], schema_error: bool, cel_error: bool) -> None:
    jsonschema = need("jsonschema")
    validator = jsonschema.Draft7Validator(strict(crd_schema()))
    doc = copy.deepcopy(rule())
    change(doc["spec"])
    assert bool(list(validator.iter_errors(doc))) is schema_error
    if not schema_error:
        assert bool(check_cel(doc)) is cel_error


def _daemonset() -> dict[str, Any]:
    (ds,) = [d for d in load(KUBE / "daemonset.yaml") if d["kind"] == "DaemonSet"]
    return ds


def _reporter_env() -> dict[str, Any]:
    (patch,) = load(NRR / "reporter-sidecar.yaml")
    (container,) = patch["spec"]["template"]["spec"]["containers"]
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in container["env"]}


def test_the_recipe_agrees_with_itself_and_with_colads_daemonset() -> None:
    spec = rule()["spec"]
    (kubelet,) = load(NRR / "kubelet-config.yaml")
    assert kubelet["kind"] == "KubeletConfiguration"
    assert kubelet["registerWithTaints"] == [spec["taint"]]  # the taint the node starts with is the one removed
    env = _reporter_env()
    assert [c["type"] for c in spec["conditions"]] == [env["CONDITION_TYPE"]]
    pod = _daemonset()["spec"]["template"]["spec"]
    assert spec["nodeSelector"]["matchLabels"] == pod["nodeSelector"]
    assert {"operator": "Exists"} in pod["tolerations"]  # colad itself starts on the tainted node
    (colad,) = pod["containers"]
    (port,) = [p["containerPort"] for p in colad["ports"] if p["name"] == "metrics"]
    assert env["CHECK_ENDPOINT"] == f"http://127.0.0.1:{port}/readyz"
    assert env["NODE_NAME"] == {"fieldRef": {"fieldPath": "spec.nodeName"}}


def test_the_reporter_runs_as_the_pods_identity_with_a_token_of_its_own() -> None:
    """The role is bound to the base's ServiceAccount; the patch leaves the pod's identity alone and mounts the
    token into the reporter alone, so the component combines with dra/, which binds its role to the same account."""
    docs = load(NRR / "reporter-rbac.yaml")
    assert [d["kind"] for d in docs] == ["ClusterRole", "ClusterRoleBinding"]
    role, binding = docs
    assert binding["roleRef"]["name"] == role["metadata"]["name"]
    (account,) = [d for d in load(KUBE / "daemonset.yaml") if d["kind"] == "ServiceAccount"]
    pod = _daemonset()["spec"]["template"]["spec"]
    assert pod["serviceAccountName"] == account["metadata"]["name"] and account["automountServiceAccountToken"] is False
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": account["metadata"]["name"], "namespace": account["metadata"]["namespace"]}
    ]
    (patch,) = load(NRR / "reporter-sidecar.yaml")
    spec = patch["spec"]["template"]["spec"]
    assert "serviceAccountName" not in spec
    (container,) = spec["containers"]
    (volume,) = spec["volumes"]
    assert any("serviceAccountToken" in s for s in volume["projected"]["sources"])
    assert [m["name"] for m in container["volumeMounts"]] == [volume["name"]]


def test_the_readme_quotes_the_reasons_dra_mode_gives() -> None:
    """The recipe reads the same /readyz in both modes; what its README says DRA mode answers is what it answers."""
    text = " ".join((NRR / "README.md").read_text().split())
    waiting = PluginState(pid=1, dra_driver="d", dra_registration=DRA_SERVING, dra_slices=SliceStatus(wanted=True))
    assert f"`{dra_registration_problem(waiting)}`" in text
    outage = SliceStatus(wanted=True, published=True, pending=True, failing="list: ...")
    assert f"`{slices_problem(outage)}`" in text
