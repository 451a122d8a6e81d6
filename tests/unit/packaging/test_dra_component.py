"""packaging/kubernetes/dra: the DRA component's RBAC is exactly what colad calls and is bound to the pod's
ServiceAccount `colad`, its admission policy lets that ServiceAccount write only its own node's slices of
its own driver, and the DaemonSet patch gives colad what its config and its in-cluster credentials expect.

The ClusterRole is compared with the API calls colad's code makes: every KubeClient method is mapped to
the RBAC verb and resource it needs (a method added later fails the test until it is mapped), and the
methods called anywhere in colad outside colad/kube/ must be the ClusterRole's rules, no more, no less.
The policy's CEL is evaluated with cel-python, taken from the YAML file itself, as the API server
evaluates a ValidatingAdmissionPolicy: matchConditions, then the variables in order, then every
validation; an evaluation error denies (failurePolicy Fail).
"""

from __future__ import annotations

import ast
import importlib
import inspect
import os
from pathlib import Path
from typing import Any

import pytest

from colad.config import config
from colad.core.devices import Device, DeviceSet
from colad.core.slices import plan, pool, slice_object
from colad.kube import access
from colad.kube.client import KubeClient
from tests.unit.packaging.test_kubernetes_manifests import need

pytestmark = pytest.mark.unit
ROOT = Path(__file__).resolve().parents[3]
COLAD = ROOT / "colad"
KUBE = ROOT / "packaging" / "kubernetes"
DRA = KUBE / "dra"
# The oldest release with resource.k8s.io/v1 (the DeviceClass; the policy is v1 since 1.30).
K8S_VERSION = "1.34.0"
SERVICE_ACCOUNT = "system:serviceaccount:kube-system:colad"
NODE_NAME_KEY = "authentication.kubernetes.io/node-name"

# What each KubeClient method asks the API server for: (API group, resource, RBAC verb). `request` is the
# transport the others share; colad's code outside colad/kube/ must not call it (checked below).
CALLS: dict[str, tuple[str, str, str]] = {
    "create_slice": ("resource.k8s.io", "resourceslices", "create"),
    "get_slice": ("resource.k8s.io", "resourceslices", "get"),
    "update_slice": ("resource.k8s.io", "resourceslices", "update"),
    "delete_slice": ("resource.k8s.io", "resourceslices", "delete"),
    "list_slices": ("resource.k8s.io", "resourceslices", "list"),
    "watch_slices": ("resource.k8s.io", "resourceslices", "watch"),
    "get_claim": ("resource.k8s.io", "resourceclaims", "get"),
    "get_node": ("", "nodes", "get"),
}


def load(name: str, folder: Path = DRA) -> list[dict[str, Any]]:
    return [d for d in need("yaml").safe_load_all((folder / name).read_text(encoding="utf-8")) if d]


def one(docs: list[dict[str, Any]], kind: str) -> dict[str, Any]:
    (found,) = [d for d in docs if d["kind"] == kind]
    return found


def policy() -> dict[str, Any]:
    return one(load("admission-policy.yaml"), "ValidatingAdmissionPolicy")


# --- RBAC ------------------------------------------------------------------------------------------


def client_methods() -> set[str]:
    return {
        name
        for name, member in inspect.getmembers(KubeClient, inspect.isfunction)
        if not name.startswith("_") and name != "request"
    }


def called_methods() -> set[str]:
    """The KubeClient methods colad's code names outside colad/kube/ (called, or handed on as a callable)."""
    names = set(CALLS) | {"request"}
    found: set[str] = set()
    for path in COLAD.rglob("*.py"):
        if path.parent == COLAD / "kube" or path.parent == COLAD / "api":
            continue
        tree = ast.parse(path.read_text(encoding="utf-8"))
        uses_client = any(
            isinstance(node, ast.ImportFrom) and node.module == "colad.kube.client" for node in ast.walk(tree)
        )
        for node in ast.walk(tree):
            if isinstance(node, ast.Attribute) and node.attr in names:
                if node.attr == "request":
                    owner = node.value
                    if uses_client and isinstance(owner, ast.Attribute | ast.Name) and "client" in ast.unparse(owner):
                        pytest.fail(f"{path.relative_to(ROOT)}: a raw client.request() call the RBAC table cannot map")
                    continue
                found.add(node.attr)
    return found


def granted(role: dict[str, Any]) -> set[tuple[str, str, str]]:
    rules = set()
    for rule in role["rules"]:
        assert set(rule) == {"apiGroups", "resources", "verbs"}, f"no resourceNames or URLs expected: {rule}"
        for group in rule["apiGroups"]:
            for resource in rule["resources"]:
                for verb in rule["verbs"]:
                    rules.add((group, resource, verb))
    return rules


def test_every_client_method_is_mapped_to_the_permission_it_needs() -> None:
    assert client_methods() == set(CALLS)


def test_the_cluster_role_grants_exactly_the_calls_colad_makes() -> None:
    called = called_methods()
    assert {"create_slice", "list_slices", "get_claim", "get_node"} <= called, called  # the scan finds calls
    needed = {CALLS[m] for m in called}
    role = one(load("rbac.yaml"), "ClusterRole")
    assert granted(role) == needed
    # Upstream's dra-example-driver grants these too; colad makes none of these calls.
    for dropped in [
        ("resource.k8s.io", "resourceslices", "get"),
        ("resource.k8s.io", "resourceslices", "patch"),
        ("resource.k8s.io", "resourceclaims", "list"),
        ("resource.k8s.io", "resourceclaims", "watch"),
        ("resource.k8s.io", "resourceclaims/status", "update"),
        ("resource.k8s.io", "resourceclaims/driver", "associated-node:update"),
    ]:
        assert dropped not in granted(role)


def test_the_binding_gives_the_role_to_the_service_account_the_pod_runs_as() -> None:
    docs = load("rbac.yaml")
    assert [d["kind"] for d in docs] == ["ClusterRole", "ClusterRoleBinding"]  # no identity of its own
    role, binding = one(docs, "ClusterRole"), one(docs, "ClusterRoleBinding")
    base = load("daemonset.yaml", KUBE)
    account, daemonset = one(base, "ServiceAccount"), one(base, "DaemonSet")
    assert account["automountServiceAccountToken"] is False  # the token is mounted into colad's container only
    assert daemonset["spec"]["template"]["spec"]["serviceAccountName"] == account["metadata"]["name"]
    assert binding["roleRef"] == {
        "apiGroup": "rbac.authorization.k8s.io",
        "kind": "ClusterRole",
        "name": role["metadata"]["name"],
    }
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": account["metadata"]["name"], "namespace": account["metadata"]["namespace"]}
    ]
    (patch,) = load("daemonset-dra.yaml")
    assert "serviceAccountName" not in patch["spec"]["template"]["spec"]  # the base's identity stays
    meta = account["metadata"]
    assert f"system:serviceaccount:{meta['namespace']}:{meta['name']}" == SERVICE_ACCOUNT


def test_the_rbac_and_policy_objects_validate_strictly() -> None:
    kubernetes_validate = need("kubernetes_validate")
    for name in ("rbac.yaml", "admission-policy.yaml", "deviceclass.yaml"):
        for doc in load(name):
            kubernetes_validate.validate(doc, K8S_VERSION, strict=True)
    binding = one(load("admission-policy.yaml"), "ValidatingAdmissionPolicyBinding")
    assert binding["spec"] == {"policyName": policy()["metadata"]["name"], "validationActions": ["Deny"]}
    spec = policy()["spec"]
    assert spec["failurePolicy"] == "Fail"
    assert spec["matchConstraints"]["resourceRules"] == [
        {
            "apiGroups": ["resource.k8s.io"],
            "apiVersions": ["v1"],
            "operations": ["CREATE", "UPDATE", "DELETE"],
            "resources": ["resourceslices"],
        }
    ]
    assert spec["matchConstraints"]["matchPolicy"] == "Equivalent"


# --- the admission policy, evaluated ----------------------------------------------------------------


class Verdict:
    NOT_MATCHED = "not matched"
    ALLOWED = "allowed"


def evaluate(
    policy_: dict[str, Any], request: dict[str, Any], obj: dict[str, Any] | None, old: dict[str, Any] | None
) -> str | list[str]:
    """A ValidatingAdmissionPolicy's answer for one write: not matched, allowed, or the messages of the
    failed validations."""
    celpy = need("celpy")
    celtypes = importlib.import_module("celpy.celtypes")
    env = celpy.Environment()
    spec = policy_["spec"]
    base = {
        "request": celpy.json_to_cel(request),
        "object": celpy.json_to_cel(obj),
        "oldObject": celpy.json_to_cel(old),
    }
    variables: dict[str, Any] = {}

    def run(expression: str) -> Any:
        activation = dict(base, variables=celtypes.MapType({celtypes.StringType(k): v for k, v in variables.items()}))
        return env.program(env.compile(expression)).evaluate(activation)

    for condition in spec["matchConditions"]:
        if not run(condition["expression"]):
            return Verdict.NOT_MATCHED
    failures = []
    try:
        for variable in spec["variables"]:
            variables[variable["name"]] = run(variable["expression"])
        for validation in spec["validations"]:
            if not run(validation["expression"]):
                failures.append(
                    str(run(validation["messageExpression"]))
                    if "messageExpression" in validation
                    else validation["message"]
                )
    except celpy.CELEvalError as exc:  # failurePolicy Fail: an error denies
        failures.append(f"error: {exc}")
    return failures or Verdict.ALLOWED


def user(name: str = SERVICE_ACCOUNT, node: str | None = "node-1", **extra: list[str]) -> dict[str, Any]:
    info: dict[str, Any] = {"username": name, "groups": ["system:serviceaccounts", "system:authenticated"]}
    if node is not None:
        extra = {NODE_NAME_KEY: [node], **extra}
    if extra:
        info["extra"] = extra
    return info


def colads_slice(node: str = "node-1", driver: str = "") -> dict[str, Any]:
    """The slice colad itself would create on `node` for the default resource."""
    driver = driver or config.Config().dra_driver_name
    todo = plan(driver, node, [pool(node, config.Config().resources[0].name, DeviceSet.of([Device("cola0")]))], [])
    return slice_object(todo.create[0], driver, node, "node-uid") | {"metadata": {"name": f"00000-{driver}-{node}-x"}}


def without_node(obj: dict[str, Any]) -> dict[str, Any]:
    spec = {k: v for k, v in obj["spec"].items() if k != "nodeName"}
    return obj | {"spec": spec | {"allNodes": True}}


def write(operation: str, who: dict[str, Any], slice_: dict[str, Any]) -> str | list[str]:
    request = {
        "operation": operation,
        "userInfo": who,
        "resource": {"group": "resource.k8s.io", "resource": "resourceslices"},
    }
    if operation == "DELETE":
        return evaluate(policy(), request, None, slice_)
    if operation == "UPDATE":
        return evaluate(policy(), request, slice_, slice_)
    return evaluate(policy(), request, slice_, None)


@pytest.mark.parametrize(
    ("operation", "who", "slice_"),
    [
        pytest.param("CREATE", user(), colads_slice(), id="create-own"),
        pytest.param("UPDATE", user(), colads_slice(), id="update-own"),
        pytest.param("DELETE", user(), colads_slice(), id="delete-own"),
        pytest.param(
            "CREATE",
            user(
                **{"authentication.kubernetes.io/pod-name": ["colad-x"], "authentication.kubernetes.io/pod-uid": ["u"]}
            ),
            colads_slice(),
            id="pod-bound-token",
        ),
        # kustomize `namespace:` moves the ServiceAccount; the policy follows it.
        pytest.param("CREATE", user("system:serviceaccount:colad:colad"), colads_slice(), id="other-namespace"),
        # The namespace is free, so one named like the ServiceAccount does not confuse the match.
        pytest.param("CREATE", user("system:serviceaccount:colad-x:colad"), colads_slice(), id="namespace-like-name"),
    ],
)
def test_the_policy_allows_colads_own_slices(operation: str, who: dict[str, Any], slice_: dict[str, Any]) -> None:
    assert write(operation, who, slice_) == Verdict.ALLOWED


@pytest.mark.parametrize(
    ("operation", "who", "slice_", "reason"),
    [
        pytest.param("CREATE", user(), colads_slice("node-2"), "ResourceSlices of node 'node-2'", id="other-node"),
        pytest.param(
            "UPDATE", user(), colads_slice("node-2"), "ResourceSlices of node 'node-2'", id="update-other-node"
        ),
        pytest.param(
            "DELETE", user(), colads_slice("node-2"), "ResourceSlices of node 'node-2'", id="delete-other-node"
        ),
        pytest.param(
            "CREATE", user(), colads_slice(driver="gpu.example.com"), "not 'gpu.example.com'", id="other-driver"
        ),
        pytest.param(
            "DELETE", user(), colads_slice(driver="gpu.example.com"), "not 'gpu.example.com'", id="delete-other-driver"
        ),
        pytest.param(
            "CREATE", user(), without_node(colads_slice()), "ResourceSlices without a node", id="no-node-name"
        ),
        # A Secret's long-lived token: extra without the node (here only a credential id), or no extra at all.
        pytest.param(
            "CREATE",
            user(node=None, **{"authentication.kubernetes.io/credential-id": ["JTI=x"]}),
            colads_slice(),
            "no node in this user's token",
            id="no-node-extra",
        ),
        pytest.param("CREATE", user(node=None), colads_slice(), "no node in this user's token", id="no-extra"),
        pytest.param(
            "CREATE",
            user(node=None, **{NODE_NAME_KEY: ["node-1", "node-2"]}),
            colads_slice(),
            "no node in this user's token",
            id="two-nodes",
        ),
    ],
)
def test_the_policy_refuses_other_slices(
    operation: str, who: dict[str, Any], slice_: dict[str, Any], reason: str
) -> None:
    verdict = write(operation, who, slice_)
    assert isinstance(verdict, list) and any(reason in message for message in verdict), verdict


# Users colad's admission policies must not match: their own RBAC, the node authorizer and NodeRestriction
# decide (both policies match colad's ServiceAccount alike; test_node_readiness.py uses these too).
OTHER_USERS = [
    pytest.param("system:serviceaccount:kube-system:colad-readiness-reporter", id="another-service-account"),
    pytest.param("system:serviceaccount:kube-system:colad-dra", id="a-longer-name"),
    pytest.param("system:serviceaccount:kube-system:xcolad", id="a-name-ending-in-colad"),
    pytest.param("system:serviceaccount:colad:colad-x", id="the-namespace-colad"),
    pytest.param("system:node:node-1", id="the-kubelet"),
    pytest.param("system:node:colad", id="a-node-named-colad"),
    pytest.param("colad", id="a-certificate-user"),
    pytest.param("x:colad", id="a-certificate-user-ending-in-colad"),
]


@pytest.mark.parametrize("name", OTHER_USERS)
def test_the_policy_leaves_other_users_to_their_own_rules(name: str) -> None:
    assert write("CREATE", user(name), colads_slice("node-2")) == Verdict.NOT_MATCHED


# --- the DaemonSet patch and colad's config --------------------------------------------------------


def patched_container() -> tuple[dict[str, Any], dict[str, Any]]:
    (patch,) = load("daemonset-dra.yaml")
    pod = patch["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    return pod, container


def test_the_patch_loads_as_a_dra_config_with_the_node_from_the_downward_api(tmp_path: Path) -> None:
    (configmap,) = [
        d for d in need("yaml").safe_load_all((KUBE / "daemonset.yaml").read_text()) if d["kind"] == "ConfigMap"
    ]
    path = tmp_path / "colad.toml"
    path.write_text(configmap["data"]["colad.toml"], encoding="utf-8")
    _, container = patched_container()
    env = {e["name"]: e for e in container["env"]}
    assert env["NODE_NAME"]["valueFrom"] == {"fieldRef": {"fieldPath": "spec.nodeName"}}
    values = {name: e["value"] for name, e in env.items() if "value" in e}
    values["NODE_NAME"] = "node-1"  # what the kubelet puts there
    values |= {"KUBERNETES_SERVICE_HOST": "10.96.0.1", "KUBERNETES_SERVICE_PORT": "443"}
    cfg = config.load(flags={"config": str(path)}, env=values)
    assert cfg.dra_mode and cfg.resolved_node_name == "node-1" and cfg.kubeconfig == ""
    mounts = {m["name"]: m for m in container["volumeMounts"]}
    assert mounts["plugins-registry"]["mountPath"] == cfg.plugins_registry_dir
    assert mounts["dra-plugin"]["mountPath"] == os.path.dirname(cfg.dra_plugin_socket)
    assert mounts["api-token"]["mountPath"] == access.SERVICE_ACCOUNT_DIR and mounts["api-token"]["readOnly"]


def test_the_sockets_have_the_same_path_on_the_host_and_the_token_holds_what_colad_reads() -> None:
    pod, container = patched_container()
    volumes = {v["name"]: v for v in pod["volumes"]}
    for mount in container["volumeMounts"]:
        volume = volumes[mount["name"]]
        if "hostPath" in volume:  # the kubelet dials the path colad names in GetInfo
            assert volume["hostPath"]["path"] == mount["mountPath"]
    sources = volumes["api-token"]["projected"]["sources"]
    files = {item["path"] for s in sources for part in s.values() for item in part.get("items", [part])}
    # in_cluster() needs the token and the CA (colad/kube/access.py).
    assert {"token", "ca.crt"} <= files
    (token,) = [s["serviceAccountToken"] for s in sources if "serviceAccountToken" in s]
    assert "audience" not in token  # the API server's own audience


def test_the_policy_driver_is_the_one_colad_derives_and_the_device_class_selects() -> None:
    (device_class,) = load("deviceclass.yaml")
    driver = config.Config().dra_driver_name
    assert f'device.driver == "{driver}"' in device_class["spec"]["selectors"][0]["cel"]["expression"]
    assert write("CREATE", user(), colads_slice(driver=driver)) == Verdict.ALLOWED
    other = config.Config(dra_driver="other.example.com").dra_driver_name
    assert write("CREATE", user(), colads_slice(driver=other)) != Verdict.ALLOWED
