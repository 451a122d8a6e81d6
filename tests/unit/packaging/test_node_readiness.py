"""packaging/kubernetes/node-readiness: the NodeReadinessRule against the upstream CRD, the recipe's parts agree, and
the admission policy keeps the reporter's node-status writes to its own node's condition.

The CRD is a verbatim copy (tests/schemas/README.md). Its openAPIV3Schema is applied as the API server
does with strict field validation (unknown fields refused), and its create-time CEL rules are restated
here one by one: a rule upstream adds that this table lacks fails the test. The taint, the condition,
the endpoint and the node selector must agree across the rule, the kubelet snippet, the reporter and
colad's DaemonSet; the component renders with kustomize and its built-in objects validate strictly. The admission
policy's CEL is taken from its YAML file and evaluated with cel-python as the API server evaluates it (the evaluator
of tests/unit/packaging/test_dra_component.py) against the writes upstream's readiness-condition-reporter makes
(get the Node, set or append its condition, write the status back) and against writes it must refuse.
"""

from __future__ import annotations

import copy
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from colad.health.rule import DRA_SERVING, dra_registration_problem, slices_problem
from colad.outputs.statefile import PluginState, SliceStatus
from tests.unit.packaging.test_dra_component import NODE_NAME_KEY, OTHER_USERS, Verdict, evaluate, user
from tests.unit.packaging.test_dra_component import policy as slice_policy
from tests.unit.packaging.test_kubernetes_manifests import need

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


# --- the admission policy on the node-status writes, evaluated -------------------------------------

# NodeStatus fields with values as a kubelet reports them; `declaredFeatures` and `features` as a newer kubelet does.
KUBELET_STATUS: dict[str, Any] = {
    "capacity": {"cpu": "4", "memory": "16Gi", "pods": "110", "myway5.com/cola": "2"},
    "allocatable": {"cpu": "4", "memory": "15Gi", "pods": "110", "myway5.com/cola": "2"},
    "phase": "Running",
    "conditions": [
        {"type": "MemoryPressure", "status": "False", "reason": "KubeletHasSufficientMemory"},
        {"type": "Ready", "status": "True", "reason": "KubeletReady", "lastHeartbeatTime": "2026-01-01T00:00:00Z"},
    ],
    "addresses": [{"type": "InternalIP", "address": "10.0.0.1"}, {"type": "Hostname", "address": "node-1"}],
    "daemonEndpoints": {"kubeletEndpoint": {"Port": 10250}},
    "nodeInfo": {"kubeletVersion": "v1.37.0", "containerRuntimeVersion": "containerd://2.1.0"},
    "images": [{"names": ["registry.example/colad:0.1.0"], "sizeBytes": 146800640}],
    "volumesInUse": ["kubernetes.io/csi/x^vol-1"],
    "volumesAttached": [{"name": "kubernetes.io/csi/x^vol-1", "devicePath": ""}],
    "config": {"active": {"configMap": {"name": "kubelet", "namespace": "kube-system"}}},
    "runtimeHandlers": [{"name": "runc", "features": {"recursiveReadOnlyMounts": True}}],
    "features": {"supplementalGroupsPolicy": True},
    "declaredFeatures": ["InPlacePodVerticalScaling"],
}


def kubelets_node(name: str = "node-1") -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": name,
            "uid": f"{name}-uid",
            "resourceVersion": "41",
            "labels": {"kubernetes.io/hostname": name, "myway5.com/cola": "true"},
            "annotations": {"node.alpha.kubernetes.io/ttl": "0"},
        },
        "spec": {"taints": [{"key": "readiness.k8s.io/ColadReady", "value": "pending", "effect": "NoSchedule"}]},
        "status": copy.deepcopy(KUBELET_STATUS),
    }


def reported(node: dict[str, Any], status: str = "True") -> dict[str, Any]:
    """The Node as readiness-condition-reporter writes it back (UpdateStatus): its condition replaced or appended."""
    condition_type = _reporter_env()["CONDITION_TYPE"]
    new = copy.deepcopy(node)
    condition = {"type": condition_type, "status": status, "reason": "EndpointOK", "message": "ready"}
    conditions = new["status"]["conditions"]
    found = [i for i, c in enumerate(conditions) if c["type"] == condition_type]
    if found:
        conditions[found[0]] = condition
    else:
        conditions.append(condition)
    return new


def status_policy() -> dict[str, Any]:
    (found,) = [d for d in load(NRR / "admission-policy.yaml") if d["kind"] == "ValidatingAdmissionPolicy"]
    return found


def status_write(who: dict[str, Any], new: dict[str, Any], old: dict[str, Any]) -> str | list[str]:
    request = {
        "operation": "UPDATE",
        "name": new["metadata"]["name"],
        "userInfo": who,
        "resource": {"group": "", "version": "v1", "resource": "nodes"},
        "subResource": "status",
    }
    return evaluate(status_policy(), request, new, old)


def changed(node: dict[str, Any], change: Callable[[dict[str, Any]], object]) -> dict[str, Any]:
    new = copy.deepcopy(node)
    change(new)
    return new


def test_the_status_policy_objects_validate_strictly_and_match_as_the_slice_policy_does() -> None:
    kubernetes_validate = need("kubernetes_validate")
    docs = load(NRR / "admission-policy.yaml")
    assert [d["kind"] for d in docs] == ["ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding"]
    for doc in docs:
        kubernetes_validate.validate(doc, K8S_VERSION, strict=True)
    policy, binding = docs
    assert binding["spec"] == {"policyName": policy["metadata"]["name"], "validationActions": ["Deny"]}
    spec = policy["spec"]
    assert spec["failurePolicy"] == "Fail"
    # A PATCH is admitted as an UPDATE of the patched object; the status subresource has no create or delete.
    assert spec["matchConstraints"]["resourceRules"] == [
        {"apiGroups": [""], "apiVersions": ["v1"], "operations": ["UPDATE"], "resources": ["nodes/status"]}
    ]
    assert spec["matchConditions"] == slice_policy()["spec"]["matchConditions"]
    role, _ = load(NRR / "reporter-rbac.yaml")
    assert {"apiGroups": [""], "resources": ["nodes/status"], "verbs": ["patch", "update"]} in role["rules"]


def test_the_status_policy_names_no_status_field_but_the_conditions() -> None:
    """A field the cluster's schema lacks fails the policy's type check, and failurePolicy Fail then refuses
    every write: the policy reads only fields every supported Kubernetes has."""
    expressions = " ".join(
        [v["expression"] for v in status_policy()["spec"]["variables"]]
        + [v["expression"] for v in status_policy()["spec"]["validations"]]
    )
    assert set(re.findall(r"\b(?:object|oldObject)\.status\.(\w+)", expressions)) == {"conditions"}
    assert "variables.status" not in expressions and "variables.oldStatus" not in expressions


@pytest.mark.parametrize(
    ("who", "old"),
    [
        pytest.param(user(), kubelets_node(), id="first-report"),
        pytest.param(user(), reported(kubelets_node(), "False"), id="report-again"),
        pytest.param(
            user(
                **{"authentication.kubernetes.io/pod-name": ["colad-x"], "authentication.kubernetes.io/pod-uid": ["u"]}
            ),
            kubelets_node(),
            id="pod-bound-token",
        ),
        pytest.param(user("system:serviceaccount:colad:colad"), kubelets_node(), id="other-namespace"),
        pytest.param(
            user(),
            changed(kubelets_node(), lambda n: [n["status"].pop(f) for f in ("config", "declaredFeatures")]),
            id="fields-absent-from-both",
        ),
    ],
)
def test_the_status_policy_allows_the_reporters_write_to_its_own_node(who: dict[str, Any], old: dict[str, Any]) -> None:
    assert status_write(who, reported(old), old) == Verdict.ALLOWED


@pytest.mark.parametrize(
    ("who", "new", "reason"),
    [
        pytest.param(user(), reported(kubelets_node("node-2")), "the status of node 'node-2'", id="other-node"),
        pytest.param(
            user(node=None, **{"authentication.kubernetes.io/credential-id": ["JTI=x"]}),
            reported(kubelets_node()),
            "no node in this user's token",
            id="no-node-extra",
        ),
        pytest.param(user(node=None), reported(kubelets_node()), "no node in this user's token", id="no-extra"),
        pytest.param(
            user(node=None, **{NODE_NAME_KEY: ["node-1", "node-2"]}),
            reported(kubelets_node()),
            "no node in this user's token",
            id="two-nodes",
        ),
        pytest.param(
            user(),
            changed(reported(kubelets_node()), lambda n: n["status"]["conditions"][1].update(status="False")),
            "not another condition",
            id="another-condition-changed",
        ),
        pytest.param(
            user(),
            changed(reported(kubelets_node()), lambda n: n["status"]["conditions"].pop(0)),
            "not another condition",
            id="another-condition-removed",
        ),
        pytest.param(
            user(),
            changed(reported(kubelets_node()), lambda n: n["status"]["conditions"].reverse()),
            "not another condition",
            id="conditions-reordered",
        ),
        pytest.param(
            user(),
            changed(
                reported(kubelets_node()),
                lambda n: n["status"]["conditions"].append({"type": "example.com/Other", "status": "True"}),
            ),
            "not another condition",
            id="another-condition-added",
        ),
        pytest.param(
            user(),
            changed(reported(kubelets_node()), lambda n: n["metadata"]["labels"].update({"node-role.example/x": ""})),
            "not the node's labels",
            id="label-added",
        ),
        pytest.param(
            user(),
            changed(reported(kubelets_node()), lambda n: n["metadata"].pop("annotations")),
            "not the node's labels",
            id="annotations-removed",
        ),
        pytest.param(
            user(),
            changed(reported(kubelets_node()), lambda n: n["metadata"].update(finalizers=["example.com/keep"])),
            "not the node's labels",
            id="finalizer-added",
        ),
    ],
)
def test_the_status_policy_refuses_other_writes(who: dict[str, Any], new: dict[str, Any], reason: str) -> None:
    old = kubelets_node(new["metadata"]["name"])
    verdict = status_write(who, new, old)
    assert isinstance(verdict, list) and any(reason in message for message in verdict), verdict


@pytest.mark.parametrize("name", OTHER_USERS)
def test_the_status_policy_leaves_other_users_to_their_own_rules(name: str) -> None:
    other_node = kubelets_node("node-2")
    new = changed(other_node, lambda n: n["status"].update(capacity={}))
    assert status_write(user(name), new, other_node) == Verdict.NOT_MATCHED
