"""The container image, run as the DaemonSet runs it: the pod in daemonset.yaml, translated into `podman run`.

tests/image.py's PodRun reads the manifest itself (security context, env, ConfigMap, emptyDirs as tmpfs,
hostPaths as bind mounts of test directories, the memory limit, the grace period), so the two cannot drift.
The strict fake kubelet and fake PodResources server run on the host and serve in the bind-mounted
directories, as a node's kubelet does; the probes are made at the container's own address. The image is
built from this checkout's .deb when storage has none for it (tests/image.py ensure_image).
"""

from __future__ import annotations

import http.client
import json
import re
import socket
import subprocess
import tempfile
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from colad.config import config
from tests import image
from tests.fakes.apiserver import FakeApiServer, Pki
from tests.fakes.dra_kubelet import Claim, FakeDraKubelet
from tests.fakes.kubelet import FakeKubelet
from tests.fakes.pluginwatcher import FakePluginWatcher
from tests.fakes.podresources import FakePodResources
from tests.helpers import in_network_namespace, wait_until

pytestmark = pytest.mark.e2e

WHY_NOT = image.unusable()
needs_podman = pytest.mark.skipif(WHY_NOT is not None, reason=WHY_NOT or "")
DEVICES = {"cocacola", "peisicola"}
ROLES = ("plugin", "discovery", "kubelet-watch")
NODE = "node-1"
DRIVER = "cola.myway5.com"  # derived from the default resource name myway5.com/cola
TOKEN = "pod-bound-token"
API_PORT = 6443
PODMAN_TIMEOUT = 180


@dataclass
class Pod:
    run: image.PodRun
    proc: subprocess.Popen[bytes]
    log_path: Path
    kubelet: FakeKubelet
    pod_resources: FakePodResources
    resource: str
    ip: str = ""
    pids: dict[str, int] | None = None

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def exec(self, *command: str, timeout: float = 30) -> subprocess.CompletedProcess[str]:
        return image.podman("exec", self.run.name, *command, check=False, timeout=timeout)

    def status(self) -> dict[str, Any]:
        result = self.exec("colad", "status", "--json")
        assert result.stdout, result.stderr
        found: dict[str, Any] = json.loads(result.stdout)
        return found

    def get(self, probe: dict[str, Any]) -> tuple[int, str]:
        """An httpGet probe as the kubelet makes it: to the pod's IP and the probe's port."""
        connection = http.client.HTTPConnection(self.ip, self.run.probe_port(probe), timeout=probe["timeoutSeconds"])
        try:
            connection.request("GET", probe["httpGet"]["path"])
            response = connection.getresponse()
            return response.status, response.read().decode()
        finally:
            connection.close()


def container_state(name: str) -> dict[str, Any] | None:
    found = image.podman("inspect", "--type", "container", "--format", "{{json .State}}", name, check=False)
    return json.loads(found.stdout) if found.returncode == 0 else None


def container_ip(name: str) -> str:
    found = image.podman("inspect", "--type", "container", "--format", "{{.NetworkSettings.IPAddress}}", name)
    return found.stdout.strip()


@pytest.fixture(scope="module")
def pod() -> Iterator[Pod]:
    if WHY_NOT is not None:
        pytest.skip(WHY_NOT)
    ref = image.ensure_image()
    root = Path(tempfile.mkdtemp(prefix="colad-img-", dir="/tmp"))
    root.chmod(0o755)
    name = f"colad-test-{root.name.rsplit('-', 1)[-1]}"
    run = image.PodRun(host_root=root / "host", name=name, image=ref)
    args = run.args()  # creates the hostPath and ConfigMap directories
    cfg_path = run.host_dir("config") / "colad.toml"
    cfg = config.load(flags={"config": str(cfg_path)}, env={})
    kubelet = FakeKubelet(run.host_path_of(cfg.kubelet_dir))
    pod_resources = FakePodResources(
        run.host_path_of(str(Path(cfg.pod_resources_socket).parent)) / Path(cfg.pod_resources_socket).name
    )
    for device in DEVICES:
        (run.host_path_of(cfg.resources[0].device_dir) / device).touch()
    kubelet.start()
    pod_resources.start()
    log_path = root / "podman-run.log"
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(
            ["podman", *args], stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=image.podman_env()
        )
    box = Pod(run, proc, log_path, kubelet, pod_resources, cfg.resources[0].name)
    try:
        wait_until(
            lambda: proc.poll() is None and (container_state(name) or {}).get("Running"),
            60,
            "the container running",
            logs=[log_path],
        )
        box.ip = container_ip(name)
        yield box
    finally:
        if proc.poll() is None:
            image.podman("stop", "--time", "5", name, check=False, timeout=60)
        image.podman("rm", "-f", "--ignore", name, check=False, timeout=60)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
        pod_resources.stop()
        kubelet.stop()
        subprocess.run(["rm", "-rf", "--one-file-system", str(root)], check=False)
    assert kubelet.violations == [], "the fake kubelet saw contract violations"
    assert pod_resources.violations == [], "the fake PodResources server saw contract violations"


def role_pids(box: Pod) -> dict[str, int]:
    processes = box.status()["processes"]
    return {role: processes[role]["pid"] for role in ROLES if processes[role]["state"] == "RUNNING"}


@needs_podman
def test_registers_through_the_bind_mounted_directory_with_an_exact_list(pod: Pod) -> None:
    registration = pod.kubelet.wait_registered(timeout=60)
    assert registration.resource_name == pod.resource
    pod.kubelet.wait_devices(DEVICES, timeout=30)
    # All three roles up under supervisord as PID 1 (the parent-death guard must not SIGTERM them).
    pod.pids = wait_until(
        lambda: (p := role_pids(pod)) and len(p) == 3 and p, 30, "three RUNNING roles", logs=[pod.log_path]
    )
    assert pod.exec("cat", "/proc/1/comm").stdout.strip().startswith(("supervisord", "python"))


@needs_podman
def test_files_added_and_removed_on_the_host_reach_the_kubelet(pod: Pod) -> None:
    device_dir = pod.run.host_path_of("/etc/colas")
    (device_dir / "fanta").touch()
    pod.kubelet.wait_devices(DEVICES | {"fanta"}, timeout=30)
    (device_dir / "peisicola").unlink()
    pod.kubelet.wait_devices({"cocacola", "fanta"}, timeout=30)
    (device_dir / "peisicola").touch()
    (device_dir / "fanta").unlink()
    pod.kubelet.wait_devices(DEVICES, timeout=30)


@needs_podman
def test_allocate(pod: Pod) -> None:
    pod.kubelet.wait_devices(DEVICES, timeout=30)
    answer = pod.kubelet.allocate(["peisicola", "cocacola"])
    assert answer["envs"] == {"COLA_DEVICES": "peisicola,cocacola"}


@needs_podman
def test_kubelet_restart_is_followed_by_a_new_registration(pod: Pod) -> None:
    before = len(pod.kubelet.successful_registrations())
    first = pod.kubelet.current_endpoint()
    pod.kubelet.restart()
    registration = pod.kubelet.wait_registered(count=before + 1, timeout=60)
    assert registration.endpoint != first, "a new socket after the kubelet's restart"
    pod.kubelet.wait_devices(DEVICES, timeout=30)


@needs_podman
def test_in_use_view_from_pod_resources(pod: Pod) -> None:
    pod.pod_resources.assign("default", "app", "main", pod.resource, ["cocacola"])
    holders = [
        {"resource": pod.resource, "device_id": "cocacola", "namespace": "default", "pod": "app", "container": "main"}
    ]
    # pod_resources_interval (10 s by default) paces the polling.
    wait_until(
        lambda: pod.status()["in_use"]["holders"] == holders, 45, "the holder in colad status", logs=[pod.log_path]
    )
    pod.pod_resources.release("default", "app")
    wait_until(lambda: pod.status()["in_use"]["holders"] == [], 45, "the holder gone", logs=[pod.log_path])


@needs_podman
def test_probes_and_metrics_answer_at_the_containers_address(pod: Pod) -> None:
    readiness, liveness = pod.run.container["readinessProbe"], pod.run.container["livenessProbe"]
    pod.kubelet.wait_devices(DEVICES, timeout=30)
    code, body = wait_until(
        lambda: (r := pod.get(readiness)) and r[0] == 200 and r, 30, "readiness 200", logs=[pod.log_path]
    )
    assert body.startswith("ok"), body
    with socket.create_connection((pod.ip, pod.run.probe_port(liveness)), timeout=liveness["timeoutSeconds"]):
        pass  # the tcpSocket liveness probe
    metrics = pod.get({"httpGet": {"path": "/metrics", "port": "metrics"}, "timeoutSeconds": 5})
    assert metrics[0] == 200
    samples = metrics[1].splitlines()
    assert f'colad_devices{{health="Healthy",resource="{pod.resource}"}} 2.0' in samples, metrics[1][:3000]
    assert f'colad_registered{{resource="{pod.resource}"}} 1.0' in samples


@needs_podman
def test_no_role_restarted_and_no_traceback(pod: Pod) -> None:
    wait_until(lambda: pod.pids is not None or role_pids(pod), 30, "the roles' pids")
    assert pod.pids is None or role_pids(pod) == pod.pids
    log = pod.log()
    assert "Traceback (most recent call last)" not in log, log[-4000:]
    spawned = Counter(re.findall(r" INFO spawned: '([^']+)'", log))
    assert set(ROLES) <= set(spawned) and set(spawned.values()) == {1}, spawned


@needs_podman
def test_podman_stop_within_the_grace_period_withdraws_the_devices_and_leaves_nothing(pod: Pod) -> None:
    pod.kubelet.wait_devices(DEVICES, timeout=30)
    endpoint = pod.kubelet.current_endpoint()
    plugin_dir = pod.kubelet.plugin_dir
    assert endpoint and (plugin_dir / endpoint).exists()
    started = time.monotonic()
    stop = image.podman("stop", "--time", str(pod.run.grace_period), pod.run.name, check=False, timeout=120)
    took = time.monotonic() - started
    assert stop.returncode == 0, stop.stderr
    assert pod.proc.wait(30) == 0, pod.log()[-4000:]
    assert took < pod.run.grace_period, f"podman stop took {took:.1f}s, past the grace period"
    assert pod.kubelet.devices() == {}, "the plugin withdrew its devices with an empty list"
    log = pod.log()
    for role in ROLES:  # each stopped by its SIGTERM, none killed after stopwaitsecs
        assert f"INFO stopped: {role} (exit status 0)" in log, log[-4000:]
    assert "SIGKILL" not in log, log[-4000:]
    # --rm: the container is gone; colad's socket left the kubelet's directory; nothing else is left.
    wait_until(lambda: container_state(pod.run.name) is None, 30, "the container removed")
    assert not (plugin_dir / endpoint).exists()
    leftovers = sorted(p.name for p in plugin_dir.iterdir() if p.name.startswith("colad"))
    assert leftovers == []
    print(
        f"podman stop: {took:.1f}s of a {pod.run.grace_period}s grace period; image {pod.run.image}, "
        f"{image.image_size(pod.run.image) / 2**20:.1f} MiB"
    )


@needs_podman
def test_the_dra_component_makes_a_pod_that_registers_publishes_and_prepares_a_claim_podman_resolves() -> None:
    """daemonset.yaml with the dra/ component (kubectl kustomize), run as the kubelet would run that pod.

    The fake API server listens on the loopback of the pod's own network namespace (hostNetwork: false)
    at the address the kubelet's KUBERNETES_SERVICE_HOST/_PORT name: 127.0.0.1 is the one the fake's
    certificate names. The token and CA are the projected volume's files. The fake plugin watcher serves
    in the plugins_registry hostPath and dials the endpoint colad names through the container's root, as
    the kubelet dials it on a node, where the hostPath has the same path on both sides.
    """
    ref = image.ensure_image()
    root = Path(tempfile.mkdtemp(prefix="colad-img-", dir="/tmp"))
    root.chmod(0o755)
    (root / "pki").mkdir()
    pki = Pki(root / "pki")
    run = image.PodRun(
        host_root=root / "host",
        name=f"colad-test-dra-{root.name.rsplit('-', 1)[-1]}",
        image=ref,
        components=(image.DRA_COMPONENT,),
        node_name=NODE,
        api_server=("127.0.0.1", API_PORT),
        token=TOKEN,
        cluster_ca=pki.ca,
    )
    args = run.args()
    device_dir = run.host_path_of("/etc/colas")
    (device_dir / "cola-a").write_text('[envs]\nMODE = "fast"\n')
    (device_dir / "cola-b").touch()
    apiserver = FakeApiServer(pki, tokens={TOKEN})
    apiserver.port = API_PORT
    apiserver.add_node(NODE, "node-uid-1")
    watcher: FakePluginWatcher | None = None
    log_path = root / "podman-run.log"
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(
            ["podman", *args], stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=image.podman_env()
        )
    try:
        state = wait_until(
            lambda: proc.poll() is None and (s := container_state(run.name) or {}).get("Running") and s,
            60,
            "the container running",
            logs=[log_path],
        )
        pid = int(state["Pid"])
        in_network_namespace(pid, apiserver.start)
        watcher = FakePluginWatcher(run.host_path_of("/var/lib/kubelet/plugins_registry"), root=f"/proc/{pid}/root")
        watcher.start()
        check_dra_pod(run, apiserver, watcher, root, log_path)
        stop = image.podman("stop", "--time", str(run.grace_period), run.name, check=False, timeout=120)
        assert stop.returncode == 0 and proc.wait(30) == 0, log_path.read_text(errors="replace")[-4000:]
        log = log_path.read_text(errors="replace")
        assert "Traceback (most recent call last)" not in log, log[-4000:]
        registry = run.host_path_of("/var/lib/kubelet/plugins_registry")
        assert sorted(p.name for p in registry.iterdir()) == [], "the registration socket withdrawn at the stop"
    finally:
        if proc.poll() is None:
            image.podman("stop", "--time", "5", run.name, check=False, timeout=60)
        image.podman("rm", "-f", "--ignore", run.name, check=False, timeout=60)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
        if watcher is not None:
            watcher.stop()
        apiserver.stop()
        subprocess.run(["rm", "-rf", "--one-file-system", str(root)], check=False)
    assert watcher.violations() == [], "the fake plugin watcher saw contract violations"


def check_dra_pod(
    run: image.PodRun, apiserver: FakeApiServer, watcher: FakePluginWatcher, root: Path, log_path: Path
) -> None:
    plugin_dir = run.host_path_of(f"/var/lib/kubelet/plugins/{DRIVER}")
    try:
        registration = watcher.wait_registration(timeout=60)
        assert (registration.name, registration.endpoint) == (DRIVER, f"/var/lib/kubelet/plugins/{DRIVER}/dra.sock")
        watcher.wait_usable(DRIVER, timeout=30)
        apiserver.wait_published(NODE, DRIVER, {"cola-a", "cola-b"}, timeout=60)
    except (AssertionError, TimeoutError) as exc:  # WaitTimeout included: add what colad said
        raise AssertionError(f"{exc}\n--- podman run ---\n{log_path.read_text(errors='replace')[-4000:]}") from None
    assert set(apiserver.identities) == {f"token:{TOKEN}"}
    stored = apiserver.add_allocated_claim("default", "pair", DRIVER, NODE, ["cola-a", "cola-b"])
    claim = Claim("default", "pair", stored["metadata"]["uid"])
    kubelet = FakeDraKubelet(str(plugin_dir / "dra.sock"))
    try:
        outcome = kubelet.prepare([claim])
        assert outcome.errors == {} and outcome.failed == "" and kubelet.violations == [], outcome
        cdi_ids = [i for d in outcome.devices[claim.uid] for i in d.cdi_device_ids]
        # The cdi hostPath is the node's /var/run/cdi: the runtime resolves the claim's IDs from it.
        spec_dir = run.host_path_of("/var/run/cdi")
        script = 'echo "devices $COLA_DEVICES"; echo "mode $MODE"'
        result = image.run_with_cdi(root, spec_dir, cdi_ids, script, PODMAN_TIMEOUT)
        assert result.returncode == 0, f"podman exited {result.returncode}:\n{result.stdout}\n{result.stderr}"
        seen = dict(line.split(" ", 1) for line in result.stdout.splitlines() if " " in line)
        assert seen == {"devices": "cola-a,cola-b", "mode": "fast"}, result.stdout
        assert kubelet.unprepare([claim]).errors == {}
    finally:
        kubelet.close()
    assert not (run.host_path_of("/var/run/cdi") / f"k8s.{DRIVER}-claim_{claim.uid}.json").exists()
