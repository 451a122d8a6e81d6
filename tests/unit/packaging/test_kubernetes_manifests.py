"""packaging/kubernetes/: the manifests validate against a pinned Kubernetes schema and keep what colad needs.

kubernetes-validate (bundled JSON schemas, works offline) checks every built-in object in strict mode,
which rejects unknown fields. The PodMonitor is a prometheus-operator CRD that it has no schema for: it is
checked against a subset of the CRD's schema written below. The ConfigMap's colad.toml is loaded by colad's
own config loader and cross-checked with the volumes, the ports and the probes.

`make setup` installs kubernetes-validate and PyYAML into .venv, where a missing one is a failure. The .deb
build runs tests/unit on Debian's python3, which has neither: there the tests that need them are skipped.
"""

from __future__ import annotations

import copy
import importlib
import json
import re
import shlex
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from colad.config import config
from colad.core.errors import ConfigError
from colad.metrics.registry import parse_address
from tests.limits import plugin_fd_budget, task_budget

pytestmark = pytest.mark.unit
ROOT = Path(__file__).resolve().parents[3]
KUBE = ROOT / "packaging" / "kubernetes"
MANIFESTS = ("daemonset.yaml", "service.yaml", "podmonitor.yaml")
# The Kubernetes release whose schemas the manifests are validated against.
K8S_VERSION = "1.30.0"
KUBELET_DIRS = ("/var/lib/kubelet/device-plugins", "/var/lib/kubelet/pod-resources")
RBAC_KINDS = {"Role", "ClusterRole", "RoleBinding", "ClusterRoleBinding"}
# Measured in the container's memory cgroup by bench/image_memory.py (README.md beside the manifests): the
# working set with 10,000 devices, and the peak after a 10,000-file burst.
MEASURED_WORKING_SET_MIB = 72.2
MEASURED_PEAK_MIB = 78.4
REQUEST_MARGIN = 1.3  # the request is the working set plus 30 %

# The part of prometheus-operator's PodMonitor CRD (monitoring.coreos.com_podmonitors.yaml, v1) these
# manifests use, closed with additionalProperties: false so a misspelt field fails.
DURATION = r"^(0|(([0-9]+)y)?(([0-9]+)w)?(([0-9]+)d)?(([0-9]+)h)?(([0-9]+)m)?(([0-9]+)s)?(([0-9]+)ms)?)$"
RELABEL_ACTIONS = [
    "replace",
    "Replace",
    "keep",
    "Keep",
    "drop",
    "Drop",
    "hashmod",
    "HashMod",
    "labelmap",
    "LabelMap",
    "labeldrop",
    "LabelDrop",
    "labelkeep",
    "LabelKeep",
    "lowercase",
    "Lowercase",
    "uppercase",
    "Uppercase",
    "keepequal",
    "KeepEqual",
    "dropequal",
    "DropEqual",
]
STRINGS = {"type": "array", "items": {"type": "string"}}
POD_MONITOR_SCHEMA: dict[str, Any] = {
    "type": "object",
    "required": ["apiVersion", "kind", "metadata", "spec"],
    "additionalProperties": False,
    "properties": {
        "apiVersion": {"const": "monitoring.coreos.com/v1"},
        "kind": {"const": "PodMonitor"},
        "metadata": {
            "type": "object",
            "required": ["name"],
            "properties": {
                "name": {"type": "string", "pattern": r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"},
                "namespace": {"type": "string"},
                "labels": {"type": "object", "additionalProperties": {"type": "string"}},
            },
        },
        "spec": {
            "type": "object",
            "required": ["selector", "podMetricsEndpoints"],
            "additionalProperties": False,
            "properties": {
                "jobLabel": {"type": "string"},
                "selector": {
                    "type": "object",
                    "additionalProperties": False,
                    "properties": {
                        "matchLabels": {"type": "object", "additionalProperties": {"type": "string"}},
                        "matchExpressions": {"type": "array"},
                    },
                },
                "namespaceSelector": {
                    "type": "object",
                    "additionalProperties": False,
                    "properties": {"any": {"type": "boolean"}, "matchNames": STRINGS},
                },
                "podMetricsEndpoints": {
                    "type": "array",
                    "minItems": 1,
                    "items": {
                        "type": "object",
                        "additionalProperties": False,
                        "properties": {
                            "port": {"type": "string"},
                            "path": {"type": "string"},
                            "scheme": {"enum": ["http", "https", "HTTP", "HTTPS"]},
                            "interval": {"type": "string", "pattern": DURATION},
                            "scrapeTimeout": {"type": "string", "pattern": DURATION},
                            "honorLabels": {"type": "boolean"},
                            "relabelings": {
                                "type": "array",
                                "items": {
                                    "type": "object",
                                    "additionalProperties": False,
                                    "properties": {
                                        "action": {"enum": RELABEL_ACTIONS},
                                        "sourceLabels": STRINGS,
                                        "separator": {"type": "string"},
                                        "targetLabel": {"type": "string"},
                                        "regex": {"type": "string"},
                                        "replacement": {"type": "string"},
                                        "modulus": {"type": "integer"},
                                    },
                                },
                            },
                        },
                    },
                },
            },
        },
    },
}


def need(module: str) -> ModuleType:
    """Import `module`; in .venv (`make setup` installs it) a missing one fails, elsewhere the test is skipped."""
    if sys.prefix != sys.base_prefix:
        return importlib.import_module(module)
    found: ModuleType = pytest.importorskip(module, reason=f"{module} is not installed (the .deb build's python3)")
    return found


@pytest.fixture(scope="module")
def docs() -> list[dict[str, Any]]:
    yaml = need("yaml")
    found = []
    for name in MANIFESTS:
        for doc in yaml.safe_load_all((KUBE / name).read_text(encoding="utf-8")):
            assert isinstance(doc, dict) and doc.get("kind"), f"{name}: empty or kindless document"
            doc["__file__"] = name
            found.append(doc)
    return found


def one(docs: list[dict[str, Any]], kind: str) -> dict[str, Any]:
    matches = [d for d in docs if d["kind"] == kind]
    assert len(matches) == 1, f"expected one {kind}, found {len(matches)}"
    return matches[0]


def pod_spec(docs: list[dict[str, Any]]) -> dict[str, Any]:
    spec: dict[str, Any] = one(docs, "DaemonSet")["spec"]["template"]["spec"]
    return spec


def container(docs: list[dict[str, Any]]) -> dict[str, Any]:
    containers = pod_spec(docs)["containers"]
    assert len(containers) == 1
    found: dict[str, Any] = containers[0]
    return found


def mebibytes(quantity: str) -> float:
    units = {"Ki": 1 / 1024, "Mi": 1, "Gi": 1024, "k": 1e3 / 2**20, "M": 1e6 / 2**20, "G": 1e9 / 2**20}
    match = re.fullmatch(r"([0-9.]+)([A-Za-z]*)", str(quantity))
    assert match, quantity
    return float(match.group(1)) * (units[match.group(2)] if match.group(2) else 1 / 2**20)


def configmap_config(docs: list[dict[str, Any]], tmp_path: Path) -> config.Config:
    path = tmp_path / "colad.toml"
    path.write_text(one(docs, "ConfigMap")["data"]["colad.toml"], encoding="utf-8")
    return config.load(flags={"config": str(path)}, env={})


def mounts_by_path(docs: list[dict[str, Any]]) -> dict[str, tuple[dict[str, Any], dict[str, Any]]]:
    """mountPath -> (volumeMount, volume)."""
    volumes = {v["name"]: v for v in pod_spec(docs)["volumes"]}
    return {m["mountPath"]: (m, volumes[m["name"]]) for m in container(docs)["volumeMounts"]}


def test_every_builtin_object_validates_strictly(docs: list[dict[str, Any]]) -> None:
    kubernetes_validate = need("kubernetes_validate")
    builtin = [d for d in docs if not d["apiVersion"].startswith("monitoring.coreos.com/")]
    assert {d["kind"] for d in builtin} == {"ServiceAccount", "ConfigMap", "DaemonSet", "Service"}
    for doc in builtin:
        body = {k: v for k, v in doc.items() if k != "__file__"}
        kubernetes_validate.validate(body, K8S_VERSION, strict=True)


def test_strict_validation_rejects_an_unknown_field(docs: list[dict[str, Any]]) -> None:
    kubernetes_validate = need("kubernetes_validate")
    daemonset = copy.deepcopy({k: v for k, v in one(docs, "DaemonSet").items() if k != "__file__"})
    daemonset["spec"]["template"]["spec"]["containers"][0]["securityContxt"] = {}
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(daemonset, K8S_VERSION, strict=True)


def test_podmonitor_matches_the_crd_and_scrapes_the_metrics_port(docs: list[dict[str, Any]]) -> None:
    jsonschema = need("jsonschema")
    monitor = one(docs, "PodMonitor")
    jsonschema.validate({k: v for k, v in monitor.items() if k != "__file__"}, POD_MONITOR_SCHEMA)
    template = one(docs, "DaemonSet")["spec"]["template"]
    spec = monitor["spec"]
    assert spec["selector"]["matchLabels"].items() <= template["metadata"]["labels"].items()
    assert one(docs, "DaemonSet")["metadata"]["namespace"] in spec["namespaceSelector"]["matchNames"]
    (endpoint,) = spec["podMetricsEndpoints"]
    assert endpoint["port"] == "metrics" and endpoint["path"] == "/metrics"
    assert "metrics" in {p["name"] for p in container(docs)["ports"]}
    # The shipped alerts select job="colad": the job label comes from this pod label.
    assert template["metadata"]["labels"][spec["jobLabel"]] == "colad"
    assert 'job="colad"' in (ROOT / "conf" / "prometheus" / "colad-alerts.yml").read_text()
    # colad_device_holder_info's namespace/pod/container must not be overwritten by the scraped pod's own.
    assert endpoint["honorLabels"] is True


def test_kustomization_lists_the_manifests_and_the_image() -> None:
    yaml = need("yaml")
    kustomization = yaml.safe_load((KUBE / "kustomization.yaml").read_text())
    assert kustomization["kind"] == "Kustomization"
    assert {"daemonset.yaml", "service.yaml"} <= set(kustomization["resources"])
    assert all((KUBE / name).is_file() for name in kustomization["resources"])
    yaml_docs = list(yaml.safe_load_all((KUBE / "daemonset.yaml").read_text()))
    image = next(d for d in yaml_docs if d["kind"] == "DaemonSet")["spec"]["template"]["spec"]["containers"][0]
    assert image["image"].split(":")[0] in {i["name"] for i in kustomization["images"]}


def test_no_rbac_and_no_service_account_token(docs: list[dict[str, Any]]) -> None:
    assert not [d["kind"] for d in docs if d["kind"] in RBAC_KINDS]
    kustomization = (KUBE / "kustomization.yaml").read_text()
    assert not any(kind in kustomization for kind in RBAC_KINDS)
    account = one(docs, "ServiceAccount")
    assert account["automountServiceAccountToken"] is False
    spec = pod_spec(docs)
    assert spec["serviceAccountName"] == account["metadata"]["name"]
    assert spec["automountServiceAccountToken"] is False


def test_daemonset_placement_priority_and_shutdown(docs: list[dict[str, Any]]) -> None:
    daemonset = one(docs, "DaemonSet")
    spec = pod_spec(docs)
    assert spec["priorityClassName"] == "system-node-critical"
    assert spec["nodeSelector"], "colad runs only on labelled nodes"
    assert spec["tolerations"]
    assert spec["terminationGracePeriodSeconds"] >= 15
    assert (
        daemonset["spec"]["selector"]["matchLabels"].items()
        <= daemonset["spec"]["template"]["metadata"]["labels"].items()
    )
    for namespaced in docs:
        if namespaced["kind"] != "PodMonitor":
            assert namespaced["metadata"]["namespace"] == daemonset["metadata"]["namespace"], namespaced["kind"]


def test_least_privilege(docs: list[dict[str, Any]]) -> None:
    spec = pod_spec(docs)
    pod_security = spec["securityContext"]
    security = container(docs)["securityContext"]
    assert not spec.get("hostNetwork") and not spec.get("hostPID") and not spec.get("hostIPC")
    assert pod_security["runAsUser"] == 0 and security.get("runAsUser", 0) == 0  # the kubelet's dir is root's
    assert security["allowPrivilegeEscalation"] is False
    assert security.get("privileged", False) is False
    assert security["capabilities"]["drop"] == ["ALL"] and not security["capabilities"].get("add")
    assert security["readOnlyRootFilesystem"] is True
    seccomp = security.get("seccompProfile") or pod_security.get("seccompProfile")
    assert seccomp == {"type": "RuntimeDefault"}
    # Service links would add COLAD_METRICS_* variables for the colad-metrics Service.
    assert spec["enableServiceLinks"] is False
    assert not container(docs).get("env") and not container(docs).get("envFrom")


def test_service_links_would_stop_colad(docs: list[dict[str, Any]], tmp_path: Path) -> None:
    """Why enableServiceLinks is false: a Service with a cluster IP named colad-* would add refused variables.

    The kubelet skips headless Services (kubelet_pods.go getServiceEnvVarMap: no cluster IP, no variables),
    so the shipped colad-metrics adds none; any other colad-* Service in the namespace would.
    """
    service = one(docs, "Service")
    assert service["spec"]["clusterIP"] == "None", "headless: its own Service injects no variables"
    prefix = service["metadata"]["name"].upper().replace("-", "_")
    path = tmp_path / "colad.toml"
    path.write_text(one(docs, "ConfigMap")["data"]["colad.toml"], encoding="utf-8")
    with pytest.raises(ConfigError, match="unknown variable"):
        config.load(flags={"config": str(path)}, env={f"{prefix}_SERVICE_HOST": "10.96.0.10"})


def test_resources_match_the_measured_footprint(docs: list[dict[str, Any]]) -> None:
    resources = container(docs)["resources"]
    requests, limits = resources["requests"], resources["limits"]
    assert requests["cpu"] and requests["memory"] and limits["memory"]
    assert mebibytes(requests["memory"]) >= REQUEST_MARGIN * MEASURED_WORKING_SET_MIB
    assert mebibytes(limits["memory"]) >= 2 * MEASURED_PEAK_MIB
    assert "cpu" not in limits, "no CPU limit: throttling only slows a burst or a re-registration"


def test_volumes(docs: list[dict[str, Any]], tmp_path: Path) -> None:
    mounts = mounts_by_path(docs)
    for path in KUBELET_DIRS:
        mount, volume = mounts[path]
        assert volume["hostPath"] == {"path": path, "type": "Directory"}, path
        assert "subPath" not in mount
    assert not mounts["/var/lib/kubelet/device-plugins"][0].get("readOnly"), "colad creates its socket there"
    cfg = configmap_config(docs, tmp_path)
    for resource in cfg.resources:
        mount, volume = mounts[resource.device_dir]
        assert volume["hostPath"] == {"path": resource.device_dir, "type": "DirectoryOrCreate"}
        assert mount["readOnly"] is True
    mount, volume = mounts[cfg.kubelet_dir]
    assert volume["hostPath"]["path"] == cfg.kubelet_dir
    pod_resources = getattr(cfg, "pod_resources_socket", "")
    if pod_resources:
        assert mounts[str(Path(pod_resources).parent)][1]["hostPath"]["path"] == str(Path(pod_resources).parent)
    mount, volume = mounts[cfg.run_dir]
    assert volume["emptyDir"]["medium"] == "Memory"
    # The root file system is read-only, and supervisord fails at start without a writable temp directory.
    assert "emptyDir" in mounts["/tmp"][1] and not mounts["/tmp"][0].get("readOnly")
    mount, volume = mounts["/etc/colad"]
    assert volume["configMap"]["name"] == one(docs, "ConfigMap")["metadata"]["name"]
    assert "subPath" not in mount, "the whole directory, so an edited ConfigMap reaches the pod"
    assert mount["readOnly"] is True


def test_configmap_loads_with_colads_loader(docs: list[dict[str, Any]], tmp_path: Path) -> None:
    cfg = configmap_config(docs, tmp_path)
    assert cfg.config_file == str(tmp_path / "colad.toml")
    # The file lands at colad's default path: no --config or COLAD_CONFIG needed in the pod.
    assert config.DEFAULT_CONFIG_PATH == "/etc/colad/colad.toml"
    # The mount hides the package's /etc/colad/supervisord.conf; the Dockerfile copies it here.
    assert cfg.supervisord_template == "/usr/share/colad/supervisord.conf"
    assert cfg.supervisord_template in (KUBE / "Dockerfile").read_text()


def test_ports_and_probes_follow_colads_metrics_address(docs: list[dict[str, Any]], tmp_path: Path) -> None:
    _, default_port = parse_address(config.Config().metrics_address)
    host, port = parse_address(configmap_config(docs, tmp_path).metrics_address)
    assert host in {"0.0.0.0", "::"}, "the probes and Prometheus reach the pod's address"
    (container_port,) = container(docs)["ports"]
    assert container_port == {"name": "metrics", "containerPort": default_port, "protocol": "TCP"}
    assert port == default_port
    service = one(docs, "Service")
    assert service["spec"]["clusterIP"] == "None"
    (service_port,) = service["spec"]["ports"]
    assert service_port["name"] == "metrics" and service_port["port"] == default_port
    assert service_port["targetPort"] in ("metrics", default_port)
    labels = one(docs, "DaemonSet")["spec"]["template"]["metadata"]["labels"]
    assert service["spec"]["selector"].items() <= labels.items()
    readiness = container(docs)["readinessProbe"]
    assert readiness["httpGet"]["path"] == "/healthz" and readiness["httpGet"]["port"] in ("metrics", default_port)
    # Liveness must not kill a colad that only waits for its kubelet (/healthz says 503 then).
    liveness = container(docs)["livenessProbe"]
    assert liveness.get("httpGet", {}).get("path") != "/healthz"
    probe = liveness.get("tcpSocket") or liveness.get("httpGet")
    assert probe and probe["port"] in ("metrics", default_port)
    assert liveness["failureThreshold"] * liveness["periodSeconds"] >= 60


def dockerfile_instructions() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) with continuation lines joined and comments dropped."""
    text = (KUBE / "Dockerfile").read_text(encoding="utf-8")
    lines = [line for line in text.splitlines() if not line.lstrip().startswith("#")]
    joined = re.sub(r"\\\n", " ", "\n".join(lines))
    found = []
    for line in joined.splitlines():
        if line.strip():
            instruction, _, args = line.strip().partition(" ")
            found.append((instruction.upper(), " ".join(args.split())))
    return found


def test_dockerfile_installs_the_deb_on_bookworm_and_runs_colad_supervise() -> None:
    instructions = dockerfile_instructions()
    assert instructions[0][0] == "FROM" and re.fullmatch(r"debian:bookworm(-slim)?", instructions[0][1])
    assert len([i for i, _ in instructions if i == "FROM"]) == 1
    copies = [args for i, args in instructions if i == "COPY"]
    assert any(re.search(r"\bcolad_\*(_all)?\.deb\b", args) for args in copies), copies
    runs = " && ".join(args for i, args in instructions if i == "RUN")
    assert re.search(r"apt-get install -y --no-install-recommends \S*colad_\*(_all)?\.deb", runs), runs
    assert "rm -rf /var/lib/apt/lists/*" in runs
    entrypoint = [args for i, args in instructions if i == "ENTRYPOINT"]
    assert len(entrypoint) == 1 and json.loads(entrypoint[0]) == ["colad", "supervise"]
    assert not [i for i, _ in instructions if i in {"USER", "CMD"}], "root, and nothing after `supervise`"
    for command in runs.split("&&"):
        assert shlex.split(command), runs


def test_task_and_file_limits_no_pod_field_sets_are_documented_and_supervisord_states_its_own() -> None:
    text = (ROOT / "packaging" / "kubernetes" / "daemonset.yaml").read_text()
    match = re.search(r"podPidsLimit.*?keep it >= (\d+)", text, re.S)
    assert match, "the DaemonSet says nothing of the node's podPidsLimit"
    assert int(match.group(1)) >= task_budget()
    template = (ROOT / "conf" / "supervisord.conf").read_text()
    minfds = int(re.search(r"^minfds=(\d+)$", template, re.M).group(1))  # type: ignore[union-attr]
    assert minfds >= plugin_fd_budget()
    assert re.search(r"^minprocs=\d+$", template, re.M)
