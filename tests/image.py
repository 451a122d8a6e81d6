"""colad's container image in local podman storage: its base, its build from the .deb, and podman itself.

`ensure_base()` imports `localhost/debian:bookworm-slim` from a debootstrapped minbase root (tests/nspawn.py),
slimmed the way Debian's slim image is (no docs, man pages or locales), when storage lacks it: no registry
is reachable. `ensure_image()` builds the image with packaging/build-image.sh from a fresh .deb unless one
labelled with the digest of this checkout exists. `PodRun` turns daemonset.yaml's pod into `podman run`
arguments. `podman()` uses packaging/kubernetes/containers.conf. `python -m tests.image base|build` is what
`make image-base` and `make image` run.
"""

from __future__ import annotations

import hashlib
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
DAEMONSET = ROOT / "packaging" / "kubernetes" / "daemonset.yaml"
DRA_COMPONENT = ROOT / "packaging" / "kubernetes" / "dra"
CONTAINERS_CONF = ROOT / "packaging" / "kubernetes" / "containers.conf"
BASE_IMAGE = "localhost/debian:bookworm-slim"
IMAGE_NAME = "localhost/colad"
SOURCE_LABEL = "io.github.colad.source-digest"
# What Debian's slim image leaves out (its /etc/dpkg/dpkg.cfg.d/docker), kept out of later installs too.
SLIM_DPKG_CFG = """\
# As in Debian's bookworm-slim image: no documentation, manual pages or translations.
path-exclude /usr/share/doc/*
path-include /usr/share/doc/*/copyright
path-exclude /usr/share/man/*
path-exclude /usr/share/groff/*
path-exclude /usr/share/info/*
path-exclude /usr/share/lintian/*
path-exclude /usr/share/linda/*
path-exclude /usr/share/locale/*
"""
SLIM_REMOVE = (
    "usr/share/man",
    "usr/share/groff",
    "usr/share/info",
    "usr/share/lintian",
    "usr/share/linda",
    "usr/share/locale",
    "var/cache/apt",
    "var/lib/apt/lists",
    "var/log",
)


def podman_env() -> dict[str, str]:
    env = dict(os.environ)
    env.setdefault("CONTAINERS_CONF", str(CONTAINERS_CONF))
    return env


def podman(*args: str, check: bool = True, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    result = subprocess.run(["podman", *args], capture_output=True, text=True, env=podman_env(), timeout=timeout)
    if check and result.returncode != 0:
        raise RuntimeError(f"podman {' '.join(args)} exited {result.returncode}: {result.stderr.strip()}")
    return result


def run_with_cdi(
    root: Path, spec_dir: Path, cdi_devices: list[str], script: str, timeout: float
) -> subprocess.CompletedProcess[str]:
    """`sh -c script` in a podman container given `cdi_devices`, resolved from the specs in `spec_dir` alone.

    podman reads specs only from /etc/cdi and /var/run/cdi, so it runs in a private mount namespace where
    /etc is an overlay (its upper and work directories under `root`) holding /etc/cdi bound to `spec_dir`,
    and /run/cdi, if present, is hidden: the machine's own spec directories stay untouched.
    """
    name = f"colad-cdi-{uuid.uuid4().hex[:12]}"
    upper, work = root / "etc-upper", root / "etc-work"
    shutil.rmtree(upper, ignore_errors=True)
    shutil.rmtree(work, ignore_errors=True)
    upper.mkdir()
    work.mkdir()
    argv = [
        "podman",
        "run",
        "--rm",
        "--name",
        name,
        "--pull=never",
        "--network=none",
        *(arg for device in cdi_devices for arg in ("--device", device)),
        BASE_IMAGE,
        "sh",
        "-c",
        script,
    ]
    namespace = " && ".join(
        [
            "set -e",
            f"mount -t overlay overlay -o lowerdir=/etc,upperdir={upper},workdir={work} /etc",
            "mkdir -p /etc/cdi",
            f"mount --bind {shlex.quote(str(spec_dir))} /etc/cdi",
            "if [ -d /run/cdi ]; then mount -t tmpfs tmpfs /run/cdi; fi",
            "exec " + shlex.join(argv),
        ]
    )
    try:
        return subprocess.run(
            ["unshare", "--mount", "--propagation", "private", "sh", "-c", namespace],
            capture_output=True,
            text=True,
            env=podman_env(),
            timeout=timeout,
        )
    finally:
        podman("rm", "-f", "--ignore", name, check=False, timeout=timeout)


def unusable() -> str | None:
    """Why podman cannot run containers here, or None: `make test` installs it, so this is rare."""
    if shutil.which("podman") is None:
        return "podman is not installed (make deps installs it)"
    if os.geteuid() != 0:
        return "the image test runs rootful podman, as the DaemonSet's runtime does"
    info = podman("info", "--format", "{{.Host.OCIRuntime.Name}}", check=False)
    if info.returncode != 0:
        return f"podman info fails: {info.stderr.strip()[-300:]}"
    return None


def version() -> str:
    sys.path.insert(0, str(ROOT))
    from colad import __version__

    return __version__


def source_digest() -> str:
    """Digest of the files the .deb is built from (tracked and untracked-but-not-ignored, as build-deb.sh).

    tests/ and bench/ are left out: they do not reach the image, and editing a test must not rebuild it.
    """
    names = subprocess.run(
        ["git", "-C", str(ROOT), "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        capture_output=True,
        check=True,
    ).stdout.split(b"\0")
    digest = hashlib.sha256()
    for name in sorted(n for n in names if n and not n.startswith((b"tests/", b"bench/"))):
        path = ROOT / os.fsdecode(name)
        if path.is_file() and not path.is_symlink():
            digest.update(name + b"\0" + hashlib.sha256(path.read_bytes()).digest())
    return digest.hexdigest()[:16]


def ensure_base() -> str:
    """`localhost/debian:bookworm-slim` in local storage, imported from a debootstrapped root if missing."""
    if podman("image", "exists", BASE_IMAGE, check=False).returncode == 0:
        return BASE_IMAGE
    from tests.nspawn import base_tarball

    tarball, _cached = base_tarball(include=())
    work = Path(tempfile.mkdtemp(prefix="colad-slim-", dir="/var/tmp"))
    try:
        root = work / "root"
        root.mkdir()
        subprocess.run(["tar", "--numeric-owner", "-C", str(root), "-xf", str(tarball)], check=True, timeout=300)
        for rel in SLIM_REMOVE:
            shutil.rmtree(root / rel, ignore_errors=True)
        for rel in ("var/cache/apt/archives/partial", "var/lib/apt/lists/partial", "var/log/apt"):
            (root / rel).mkdir(parents=True, exist_ok=True)
        for doc in (root / "usr/share/doc").glob("*"):
            for item in doc.iterdir() if doc.is_dir() and not doc.is_symlink() else ():
                if item.name != "copyright":
                    shutil.rmtree(item) if item.is_dir() and not item.is_symlink() else item.unlink()
        (root / "etc/dpkg/dpkg.cfg.d/colad-slim").write_text(SLIM_DPKG_CFG)
        # apt in an image build: no cache of .debs left behind (as Debian's image sets it).
        (root / "etc/apt/apt.conf.d/docker-clean").write_text(
            'DPkg::Post-Invoke { "rm -f /var/cache/apt/archives/*.deb /var/cache/apt/*.bin || true"; };\n'
            'Binary::apt::APT::Keep-Downloaded-Packages "false";\n'
        )
        (root / "etc/resolv.conf").unlink(missing_ok=True)  # the runtime provides one
        slim = work / "slim.tar"
        subprocess.run(["tar", "--numeric-owner", "-C", str(root), "-cf", str(slim), "."], check=True, timeout=300)
        podman("import", "--change", 'CMD ["bash"]', str(slim), BASE_IMAGE, timeout=600)
    finally:
        subprocess.run(["rm", "-rf", "--one-file-system", str(work)], check=False)
    return BASE_IMAGE


def image_ref() -> str:
    return f"{IMAGE_NAME}:{version()}"


def build(deb: Path | None = None, digest: str | None = None) -> str:
    """Build the image from `deb` (a fresh one from packaging/build-deb.sh if None); returns its reference."""
    ensure_base()
    digest = digest or source_digest()
    with tempfile.TemporaryDirectory(prefix="colad-image-") as out:
        if deb is None:
            with open(Path(out) / "build-deb.log", "wb") as log:
                made = subprocess.run(
                    [str(ROOT / "packaging" / "build-deb.sh"), out],
                    stdout=subprocess.PIPE,
                    stderr=log,
                    check=False,
                    timeout=1800,
                )
            if made.returncode != 0:
                tail = (Path(out) / "build-deb.log").read_text(errors="replace").splitlines()[-40:]
                raise RuntimeError("packaging/build-deb.sh failed:\n" + "\n".join(tail))
            deb = Path(made.stdout.decode().strip().splitlines()[-1])
        built = subprocess.run(
            [str(ROOT / "packaging" / "build-image.sh"), str(deb), digest],
            stdout=subprocess.PIPE,
            stderr=sys.stderr,
            text=True,
            env=podman_env(),
            timeout=1800,
        )
    if built.returncode != 0:
        raise RuntimeError(f"packaging/build-image.sh exited {built.returncode}")
    return built.stdout.strip().splitlines()[-1]


def ensure_image() -> str:
    """The image of this checkout: reused when its label carries this checkout's digest, else built."""
    ref, digest = image_ref(), source_digest()
    found = podman("image", "inspect", "--format", f'{{{{index .Labels "{SOURCE_LABEL}"}}}}', ref, check=False)
    if found.returncode == 0 and found.stdout.strip() == digest:
        return ref
    return build(digest=digest)


def image_size(ref: str) -> int:
    return int(podman("image", "inspect", "--format", "{{.Size}}", ref).stdout.strip())


def quantity_bytes(quantity: str) -> int:
    """A Kubernetes memory quantity (`256Mi`, `1G`, `1048576`) in bytes."""
    units = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "k": 10**3, "M": 10**6, "G": 10**9, "": 1}
    number = str(quantity).rstrip("KMGikm")
    return int(float(number) * units[str(quantity)[len(number) :]])


def cpu_shares(quantity: str) -> int:
    """The kubelet's MilliCPUToShares: a CPU request as cgroup v1 cpu.shares."""
    milli = float(quantity[:-1]) if str(quantity).endswith("m") else float(quantity) * 1000
    return max(2, int(milli * 1024 / 1000))


@dataclass
class PodRun:
    """The DaemonSet's pod as one `podman run`: every setting that shapes the container, or an error.

    hostPath volumes become bind mounts of `<host_root>/<volume name>`, emptyDirs tmpfs mounts, the
    ConfigMap a directory holding its keys. A field this does not know raises, so a new setting in
    daemonset.yaml cannot silently go untested.

    `components` are kustomize Components rendered onto the manifest's directory with `kubectl kustomize`,
    as `kubectl apply -k` would. What the kubelet fills in comes from the other fields: `node_name` for
    the downward API's spec.nodeName, `api_server` (host, port) for KUBERNETES_SERVICE_HOST and _PORT,
    `token` and `cluster_ca` for a projected volume's service account token and kube-root-ca.crt.
    """

    host_root: Path
    name: str
    image: str
    manifest: Path = DAEMONSET
    components: tuple[Path, ...] = ()
    node_name: str = "node-1"
    api_server: tuple[str, int] | None = None
    token: str = ""
    cluster_ca: Path | None = None
    docs: list[dict[str, Any]] = field(default_factory=list)

    def __post_init__(self) -> None:
        import yaml

        if not self.components:
            self.docs = [d for d in yaml.safe_load_all(self.manifest.read_text(encoding="utf-8")) if d]
            return
        with tempfile.TemporaryDirectory(prefix="colad-kustomize-") as tmp:
            lines = ["resources:", f"  - {os.path.relpath(self.manifest.parent, tmp)}", "components:"]
            lines += [f"  - {os.path.relpath(c, tmp)}" for c in self.components]
            (Path(tmp) / "kustomization.yaml").write_text("\n".join(lines) + "\n")
            rendered = subprocess.run(["kubectl", "kustomize", tmp], capture_output=True, text=True, timeout=60)
        if rendered.returncode != 0:
            raise RuntimeError(f"kubectl kustomize: {rendered.stderr.strip()}")
        self.docs = [d for d in yaml.safe_load_all(rendered.stdout) if d]

    def one(self, kind: str) -> dict[str, Any]:
        (found,) = [d for d in self.docs if d["kind"] == kind]
        return found

    @property
    def pod(self) -> dict[str, Any]:
        spec: dict[str, Any] = self.one("DaemonSet")["spec"]["template"]["spec"]
        return spec

    @property
    def container(self) -> dict[str, Any]:
        (only,) = self.pod["containers"]
        return dict(only)

    @property
    def grace_period(self) -> int:
        return int(self.pod.get("terminationGracePeriodSeconds", 30))

    def host_dir(self, volume: str) -> Path:
        return self.host_root / volume

    def host_path_of(self, mount_path: str) -> Path:
        """The test directory behind the container path `mount_path` (a hostPath volume)."""
        for mount in self.container["volumeMounts"]:
            if mount["mountPath"] == mount_path:
                return self.host_dir(mount["name"])
        raise KeyError(mount_path)

    def probe_port(self, probe: dict[str, Any]) -> int:
        port = (probe.get("httpGet") or probe.get("tcpSocket") or {})["port"]
        if isinstance(port, int):
            return port
        (number,) = [p["containerPort"] for p in self.container.get("ports", []) if p["name"] == port]
        return int(number)

    def args(self) -> list[str]:
        pod, box = self.pod, self.container
        known_pod = {
            "priorityClassName",
            "nodeSelector",
            "tolerations",
            "serviceAccountName",
            "containers",
            "automountServiceAccountToken",
            "enableServiceLinks",
            "hostNetwork",
            "hostPID",
            "hostIPC",
            "terminationGracePeriodSeconds",
            "securityContext",
            "volumes",
        }
        known_box = {
            "name",
            "image",
            "imagePullPolicy",
            "ports",
            "resources",
            "securityContext",
            "readinessProbe",
            "livenessProbe",
            "volumeMounts",
            "env",
        }
        for where, got, known in (("pod", pod, known_pod), ("container", box, known_box)):
            unknown = set(got) - known
            if unknown:
                raise ValueError(f"daemonset.yaml: {where} fields {sorted(unknown)} have no podman translation here")
        args = ["run", "--rm", "--pull=never", f"--name={self.name}", f"--stop-timeout={self.grace_period}"]
        # Scheduling-only fields (priority, node selector, tolerations, the service account without a token)
        # do not shape the container; service links would only add variables, and they are off.
        if pod.get("enableServiceLinks", True) or pod.get("automountServiceAccountToken", True):
            raise ValueError("daemonset.yaml: service links or a token would add env/mounts not modelled here")
        for key, flag in (("hostNetwork", "--network=host"), ("hostPID", "--pid=host"), ("hostIPC", "--ipc=host")):
            if pod.get(key):
                args.append(flag)
        args += self._security(pod.get("securityContext", {}), box.get("securityContext", {}))
        if self.api_server is not None:  # the kubelet sets these in every container, service links or not
            host, port = self.api_server
            args += [f"--env=KUBERNETES_SERVICE_HOST={host}", f"--env=KUBERNETES_SERVICE_PORT={port}"]
        for variable in box.get("env", []):
            if set(variable) == {"name", "value"}:
                args.append(f"--env={variable['name']}={variable['value']}")
            elif variable.get("valueFrom") == {"fieldRef": {"fieldPath": "spec.nodeName"}}:
                args.append(f"--env={variable['name']}={self.node_name}")
            else:
                raise ValueError(f"daemonset.yaml: env {variable} is neither a plain value nor the node's name")
        resources = box.get("resources", {})
        limits, requests = resources.get("limits", {}), resources.get("requests", {})
        if "memory" in limits:
            args.append(f"--memory={quantity_bytes(limits['memory'])}")
        if "memory" in requests:
            args.append(f"--memory-reservation={quantity_bytes(requests['memory'])}")
        if "cpu" in requests:
            args.append(f"--cpu-shares={cpu_shares(requests['cpu'])}")
        if "cpu" in limits:
            raise ValueError("daemonset.yaml: a CPU limit is not modelled here")
        args += self._volumes(pod.get("volumes", []), box.get("volumeMounts", []))
        args.append(self.image)
        return args

    def _security(self, pod: dict[str, Any], box: dict[str, Any]) -> list[str]:
        merged = {**pod, **box}
        known = {
            "runAsUser",
            "runAsGroup",
            "runAsNonRoot",
            "seccompProfile",
            "privileged",
            "allowPrivilegeEscalation",
            "readOnlyRootFilesystem",
            "capabilities",
        }
        if set(merged) - known:
            raise ValueError(f"daemonset.yaml: securityContext {sorted(set(merged) - known)} not modelled here")
        args = [f"--user={merged.get('runAsUser', 0)}:{merged.get('runAsGroup', 0)}"]
        seccomp = merged.get("seccompProfile", {"type": "RuntimeDefault"})
        if seccomp != {"type": "RuntimeDefault"}:
            raise ValueError(f"daemonset.yaml: seccomp {seccomp} is not modelled here")
        # RuntimeDefault: podman's default seccomp profile applies when none is named.
        if merged.get("privileged"):
            args.append("--privileged")
        if merged.get("allowPrivilegeEscalation") is False:
            args.append("--security-opt=no-new-privileges")
        if merged.get("readOnlyRootFilesystem"):
            # --read-only alone mounts tmpfs on /run, /tmp and /var/tmp and would hide a missing emptyDir.
            args += ["--read-only", "--read-only-tmpfs=false"]
        capabilities = merged.get("capabilities", {})
        args += [f"--cap-drop={c.lower()}" for c in capabilities.get("drop", [])]
        args += [f"--cap-add={c.lower()}" for c in capabilities.get("add", [])]
        return args

    def _volumes(self, volumes: list[dict[str, Any]], mounts: list[dict[str, Any]]) -> list[str]:
        by_name = {v["name"]: v for v in volumes}
        args = []
        for mount in mounts:
            if set(mount) - {"name", "mountPath", "readOnly"}:
                raise ValueError(f"daemonset.yaml: volumeMount {mount} not modelled here")
            volume, target = by_name[mount["name"]], mount["mountPath"]
            ro = ",ro=true" if mount.get("readOnly") else ""
            if "hostPath" in volume:
                source = self.host_dir(volume["name"])
                if volume["hostPath"].get("type") in ("Directory", "DirectoryOrCreate"):
                    source.mkdir(mode=0o750, parents=True, exist_ok=True)
                args.append(f"--mount=type=bind,source={source},destination={target}{ro}")
            elif "emptyDir" in volume:
                size = volume["emptyDir"].get("sizeLimit")
                limit = f",tmpfs-size={quantity_bytes(size)}" if size else ""
                # An emptyDir starts empty: never copy the image's files at that path in.
                args.append(f"--mount=type=tmpfs,destination={target},notmpcopyup{limit}")
            elif "configMap" in volume:
                source = self.host_dir(volume["name"])
                source.mkdir(mode=0o755, parents=True, exist_ok=True)
                data = self.config_map(volume["configMap"]["name"])["data"]
                for key, text in data.items():
                    (source / key).write_text(text, encoding="utf-8")
                args.append(f"--mount=type=bind,source={source},destination={target},ro=true")
            elif "projected" in volume:
                source = self.host_dir(volume["name"])
                source.mkdir(mode=0o755, parents=True, exist_ok=True)
                for path, data in self.projected(volume["projected"]).items():
                    (source / path).write_bytes(data)
                args.append(f"--mount=type=bind,source={source},destination={target}{ro}")
            else:
                raise ValueError(f"daemonset.yaml: volume {volume} not modelled here")
        return args

    def projected(self, volume: dict[str, Any]) -> dict[str, bytes]:
        """The files of a projected volume: the pod's token, the cluster's CA, the pod's namespace."""
        files: dict[str, bytes] = {}
        for source in volume["sources"]:
            if set(source) == {"serviceAccountToken"}:
                if not self.token:
                    raise ValueError("daemonset.yaml: a service account token is projected and PodRun has none")
                files[source["serviceAccountToken"]["path"]] = self.token.encode()
            elif source.get("configMap", {}).get("name") == "kube-root-ca.crt" and self.cluster_ca is not None:
                for item in source["configMap"]["items"]:
                    if item["key"] != "ca.crt":
                        raise ValueError(f"daemonset.yaml: kube-root-ca.crt has no key {item['key']}")
                    files[item["path"]] = self.cluster_ca.read_bytes()
            elif set(source) == {"downwardAPI"}:
                for item in source["downwardAPI"]["items"]:
                    if item != {"path": item["path"], "fieldRef": {"fieldPath": "metadata.namespace"}}:
                        raise ValueError(f"daemonset.yaml: downwardAPI item {item} not modelled here")
                    files[item["path"]] = self.one("DaemonSet")["metadata"]["namespace"].encode()
            else:
                raise ValueError(f"daemonset.yaml: projected source {source} not modelled here")
        return files

    def config_map(self, name: str) -> dict[str, Any]:
        (found,) = [d for d in self.docs if d["kind"] == "ConfigMap" and d["metadata"]["name"] == name]
        return found


def main(argv: list[str]) -> int:
    if argv[:1] == ["base"]:
        print(ensure_base())
        return 0
    if argv[:1] == ["build"]:
        deb = Path(argv[1]) if len(argv) > 1 else None
        ref = build(deb)
        print(f"image size: {image_size(ref) / 2**20:.1f} MiB", file=sys.stderr)
        print(ref)
        return 0
    print("usage: python -m tests.image base | build [DEB]", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
