"""The .deb, end to end: built from a clean copy of the tree, lintian-clean, run by the real systemd.

The package is installed with apt into a fresh Debian bookworm root (debootstrap, cached by
tests/nspawn.py), which is then booted with systemd-nspawn, so the installed colad.service starts
as it would on a host. The host directory bound as the container's /var/lib/kubelet is where the
strict fake kubelet serves: the sockets are the same inodes on both sides. Booting needs root and
the Debian mirror.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

import pytest

from colad import __version__
from tests import image
from tests.fakes.apiserver import FakeApiServer, Pki
from tests.fakes.dra_kubelet import Claim, FakeDraKubelet
from tests.fakes.kubelet import FakeKubelet
from tests.fakes.pluginwatcher import FakePluginWatcher
from tests.helpers import in_network_namespace, wait_until
from tests.nspawn import Container, base_tarball, container

pytestmark = [pytest.mark.e2e, pytest.mark.deb]

ROOT = Path(__file__).resolve().parents[2]
DEBIAN = ROOT / "packaging" / "debian"
UNIT = "colad.service"
DEVICES = {"cocacola", "peisicola"}
# Debian's own packages, never vendored copies.
RUNTIME_DEPENDS = {"python3-grpcio", "python3-protobuf", "python3-pyinotify", "python3-prometheus-client", "supervisor"}
CONFFILES = {"/etc/colad/colad.toml", "/etc/colad/supervisord.conf"}
TEMPLATE_LINE = 'supervisord_template = "/etc/colad/supervisord.conf"'

needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="debootstrap, chroot and systemd-nspawn need root")
WHY_NO_PODMAN = image.unusable()
needs_podman = pytest.mark.skipif(WHY_NO_PODMAN is not None, reason=WHY_NO_PODMAN or "")
NODE = "node-1"
DRIVER = "cola.myway5.com"  # derived from the default resource name myway5.com/cola
TOKEN = "node-bound-token"
PODMAN_TIMEOUT = 180


@pytest.fixture(scope="module")
def deb(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("dist")
    result = subprocess.run(
        [str(ROOT / "packaging" / "build-deb.sh"), str(out)], capture_output=True, text=True, timeout=600
    )
    assert result.returncode == 0, result.stderr[-6000:]
    lines = result.stdout.splitlines()
    assert len(lines) == 1, f"build-deb.sh must print only the path of the .deb, printed {result.stdout!r}"
    return Path(lines[0])


def extract(deb: Path, into: Path) -> Path:
    subprocess.run(["dpkg-deb", "-x", str(deb), str(into / "data")], check=True)
    subprocess.run(["dpkg-deb", "-e", str(deb), str(into / "control")], check=True)
    return into


def test_version_is_the_changelogs() -> None:
    first = (DEBIAN / "changelog").read_text().splitlines()[0]
    assert first.startswith(f"colad ({__version__}) "), f"debian/changelog says {first!r}, colad is {__version__}"


def test_deb_is_built_from_a_clean_copy(deb: Path) -> None:
    assert deb.name == f"colad_{__version__}_all.deb" and deb.is_file()
    # The build ran in a copy: nothing of dpkg-buildpackage or pybuild lands in the checkout.
    leftovers = [
        "debian",
        ".pybuild",
        "packaging/debian/colad",
        "packaging/debian/.debhelper",
        "packaging/debian/files",
        "packaging/debian/debhelper-build-stamp",
    ]
    assert [p for p in leftovers if (ROOT / p).exists()] == []


def test_package_contents(deb: Path, tmp_path: Path) -> None:
    got = extract(deb, tmp_path)
    data, control = got / "data", got / "control"
    fields = subprocess.run(["dpkg-deb", "-f", str(deb), "Depends"], capture_output=True, text=True, check=True)
    depends = {d.strip().split()[0] for d in fields.stdout.split(",")}
    assert RUNTIME_DEPENDS <= depends, fields.stdout
    # Recommended, not required: only a YAML kubeconfig (DRA mode) imports it; JSON and in-cluster do not.
    recommends = subprocess.run(["dpkg-deb", "-f", str(deb), "Recommends"], capture_output=True, text=True, check=True)
    assert recommends.stdout.split() == ["python3-yaml"], recommends.stdout
    assert set((control / "conffiles").read_text().split()) == CONFFILES
    assert (data / "usr/bin/colad").stat().st_mode & 0o111
    assert (data / "etc/colas").is_dir()
    assert (data / "usr/share/man/man8/colad.8.gz").is_file()
    assert (data / "lib/systemd/system" / UNIT).read_bytes() == (ROOT / "systemd" / UNIT).read_bytes()
    # The template ships once, as a conffile, and the installed config names it.
    assert not (data / "usr/share/colad").exists()
    assert (data / "etc/colad/supervisord.conf").read_bytes() == (ROOT / "conf/supervisord.conf").read_bytes()
    installed = (data / "etc/colad/colad.toml").read_text().splitlines()
    assert TEMPLATE_LINE in installed
    source = (ROOT / "conf/colad.toml").read_text().splitlines()
    assert [line for line in installed if line not in source] == [
        "# Set by the Debian package: the template is a conffile beside this file.",
        TEMPLATE_LINE,
    ]
    # colad only: every library comes from Debian's packages.
    site = data / "usr/lib/python3/dist-packages"
    assert sorted(p.name for p in site.iterdir()) == ["colad", f"colad-{__version__}.dist-info"]


def test_lintian_reports_no_errors_or_warnings(deb: Path) -> None:
    # As a user, not root: lintian warns when run as root. The copy is world-readable for it.
    with tempfile.TemporaryDirectory(prefix="colad-lintian-") as tmp:
        os.chmod(tmp, 0o755)
        copy = Path(tmp) / deb.name
        shutil.copy(deb, copy)
        copy.chmod(0o644)
        scratch = Path(tmp) / "tmp"  # lintian leaves files in TMPDIR: keep them in here
        scratch.mkdir()
        command = [
            "env",
            f"TMPDIR={scratch}",
            "lintian",
            "--info",
            "--display-info",
            "--pedantic",
            "--show-overrides",
            str(copy),
        ]
        if os.geteuid() == 0:
            shutil.chown(scratch, "nobody")
            command = ["runuser", "-u", "nobody", "--", *command]
        result = subprocess.run(command, capture_output=True, text=True, timeout=300, cwd=tmp)
    report = result.stdout + result.stderr
    assert [line for line in report.splitlines() if line.startswith(("E:", "W:"))] == [], report
    # Every override is still needed, matches, and has its reason (a comment) above it.
    assert "unused-override" not in report and "mismatched-override" not in report, report
    overrides = (DEBIAN / "colad.lintian-overrides").read_text().splitlines()
    for number, line in enumerate(overrides):
        if line and not line.startswith("#"):
            assert number and overrides[number - 1].startswith("#"), f"override without a reason: {line}"
            assert f"O: {line}" in report, report


class Steps:
    """Prints how long each step took: pytest shows it with a failure, and with -s."""

    def __init__(self) -> None:
        self.start = self.last = time.monotonic()

    def __call__(self, done: str) -> None:
        now = time.monotonic()
        print(f"{now - self.start:6.1f}s (+{now - self.last:4.1f}s) {done}")
        self.last = now


@needs_root
def test_installed_package_runs_under_systemd_and_purges_clean(deb: Path, short_tmp: Path) -> None:
    step = Steps()
    tarball, cached = base_tarball()
    step(f"base root {'from the cache' if cached else 'made with debootstrap'}: {tarball}")
    # Bound as the container's /var/lib/kubelet; device-plugins does not exist yet, as on a node
    # where colad starts before the kubelet ever ran.
    kubelet_root = short_tmp / "kubelet"
    kubelet_root.mkdir(mode=0o750)
    plugin_dir = kubelet_root / "device-plugins"
    with container(tarball) as box:
        step("extracted")
        installed = box.apt_install(deb)
        assert installed.returncode == 0, installed.stdout[-4000:] + installed.stderr[-4000:]
        step("installed with apt")
        # In a chroot no systemd runs: nothing was started, but the unit is enabled for the boot.
        assert (box.root / "etc/systemd/system/multi-user.target.wants" / UNIT).is_symlink()
        for name in DEVICES:
            (box.root / "etc/colas" / name).write_bytes(b"")
        box.boot({kubelet_root: "/var/lib/kubelet"})
        step("booted")
        kubelet = FakeKubelet(plugin_dir)
        try:
            check_service(box, kubelet, plugin_dir, step)
        except AssertionError as exc:  # WaitTimeout included: add what colad said
            tail = "\n".join(journal(box, check=False).splitlines()[-60:])
            raise AssertionError(f"{exc}\n--- journalctl -u {UNIT} (last 60 lines) ---\n{tail}") from None
        finally:
            kubelet.stop()
        assert kubelet.violations == []
        check_purge(box, plugin_dir)
        step("purged")
    step("powered off and removed")


def journal(box: Container, check: bool = True) -> str:
    return box.run("journalctl", "--no-pager", "-o", "cat", "-u", UNIT, check=check).stdout


def wait_journal(box: Container, needle: str, timeout: float = 15) -> None:
    wait_until(
        lambda: needle in journal(box),
        timeout,
        f"{needle!r} in the journal of {UNIT}",
        interval=0.2,
        logs=[box.log_path],
    )


def registered_because(text: str) -> str:
    """The reason of the attempt that led to the first registration, from the plugin's state lines."""
    reason = ""
    for state, why in re.findall(r'msg="plugin state" (?:resource=\S+ )?state=(\w+) .*?reason=("[^"]*"|\S+)', text):
        if state == "registering":
            reason = why.strip('"')
        elif state == "registered":
            return reason
    return ""


def show(box: Container, prop: str) -> str:
    return box.run("systemctl", "show", "--value", "-p", prop, UNIT).stdout.strip()


def settle(kubelet: FakeKubelet, count: int, devices: set[str]) -> None:
    kubelet.wait_registered(count=count, timeout=30)
    kubelet.wait_devices(devices, timeout=15)


def check_service(box: Container, kubelet: FakeKubelet, plugin_dir: Path, step: Steps) -> None:
    # The real systemd accepts the installed unit as it is (verify exits 0 even on unknown keys: read stderr).
    verify = box.run("systemd-analyze", "verify", "--man=no", f"/lib/systemd/system/{UNIT}", check=False)
    assert (verify.returncode, verify.stderr) == (0, ""), verify.stderr
    assert box.run("test", "-f", "/usr/share/man/man8/colad.8.gz", check=False).returncode == 0
    step("the installed unit verifies")

    # Started at boot, before any kubelet: it made the kubelet's directory and waits for kubelet.sock.
    wait_journal(box, 'error="kubelet.sock absent"', timeout=30)
    assert show(box, "ActiveState") == "active"
    assert plugin_dir.is_dir() and (plugin_dir.stat().st_mode & 0o777) == 0o750
    step("colad started at boot, waiting for kubelet.sock")

    # The kubelet comes up: inotify tells colad at once, it registers and lists /etc/colas.
    kubelet.start()
    registration = kubelet.wait_registered(count=1, timeout=15)
    kubelet.wait_devices(DEVICES, timeout=15)
    wait_journal(box, "state=registered ")
    assert "(watcher)" in registered_because(journal(box)), "the registration was not set off by kubelet-watch"
    assert kubelet.allocate(["peisicola", "cocacola"])["envs"] == {"COLA_DEVICES": "peisicola,cocacola"}
    lines = [line for line in journal(box).splitlines() if 'msg="register to kubelet successfully"' in line]
    assert any("proc=plugin" in line and f"endpoint={registration.endpoint}" in line for line in lines), lines
    wait_until(lambda: box.run("colad", "status", check=False).returncode == 0, 15, "`colad status` to exit 0")
    # /healthz also waits for supervisord to call every program RUNNING (startsecs), which `colad status`
    # does not count as degraded: wait for it, and keep its 503 reasons if it never comes.
    health = wait_until(
        lambda: (
            (
                r := box.run(
                    "python3",
                    "-c",
                    "import urllib.request as u; print(u.urlopen("
                    "'http://127.0.0.1:9647/healthz', timeout=5).read().decode())",
                    check=False,
                )
            ).returncode
            == 0
            and r
        ),
        15,
        "/healthz to answer 200",
    )
    assert health.stdout.startswith("ok: registered as myway5.com/cola, 2 devices"), health.stdout
    step("registered, listed, allocated; status and /healthz answer")

    # inotify on /etc/colas and on the kubelet's directory work inside the sandbox.
    (box.root / "etc/colas/fanta").write_bytes(b"")
    devices = DEVICES | {"fanta"}
    kubelet.wait_devices(devices, timeout=15)
    kubelet.restart()
    settle(kubelet, 2, devices)
    step("device added; registered again after a kubelet restart")

    # systemctl restart: colad starts while the kubelet is already there.
    box.run("systemctl", "restart", UNIT)
    settle(kubelet, 3, devices)
    step("registered again after systemctl restart")

    # systemctl reload: `colad reload` checks the file and the processes apply it, keeping the registration.
    conf = box.root / "etc/colad/colad.toml"
    original = conf.read_text()
    endpoint = kubelet.current_endpoint()
    conf.write_text(original + '\nlog_level = "DEBUG"\n')
    box.run("systemctl", "reload", UNIT)
    wait_journal(box, 'msg="config reloaded"')
    conf.write_text(original + "\ncolour = 1\n")
    refused = box.run("systemctl", "reload", UNIT, check=False)
    assert refused.returncode != 0 and show(box, "ActiveState") == "active"
    assert "colour (file /etc/colad/colad.toml): unknown key" in journal(box)
    conf.write_text(original)
    assert kubelet.current_endpoint() == endpoint and len(kubelet.successful_registrations()) == 3
    kubelet.wait_devices(devices, timeout=5)
    step("systemctl reload applied a valid file, refused an invalid one, registration untouched")

    # SIGKILL of the main process (supervisord): systemd cleans the cgroup and starts colad again.
    main_pid = show(box, "MainPID")
    box.run("systemctl", "kill", "--signal=SIGKILL", "--kill-who=main", UNIT)
    wait_until(
        lambda: (
            show(box, "NRestarts") == "1"
            and show(box, "ActiveState") == "active"
            and show(box, "MainPID") not in ("0", main_pid)
        ),
        30,
        "systemd to restart colad after SIGKILL",
    )
    settle(kubelet, 4, devices)
    step("registered again after SIGKILL of the main process")

    # supervisord restarted no program the test did not kill (it killed supervisord itself once). Read
    # before the stop: systemd then signals the whole cgroup, and a program that exits on systemd's
    # SIGTERM before supervisord's own is logged as "not expected".
    unexpected = [line for line in journal(box).splitlines() if "not expected" in line and "exited:" in line]
    assert unexpected == [], unexpected

    # systemctl stop leaves no process, no run directory and no plugin socket behind.
    box.run("systemctl", "stop", UNIT)
    left = [(pid, cmd) for pid, cmd, cgroup in box.processes() if "colad" in cmd or UNIT in cgroup]
    assert left == [], left
    assert box.run("test", "-e", "/run/colad", check=False).returncode == 1
    assert sorted(p.name for p in plugin_dir.iterdir() if p.name.startswith("colad")) == []
    # The guard of the other e2e tests, for the installed package: no role ever printed a traceback.
    whole = journal(box)
    assert "Traceback (most recent call last)" not in whole, whole[-4000:]


def check_purge(box: Container, plugin_dir: Path) -> None:
    listed = box.run("dpkg", "-L", "colad").stdout.split()
    purge = box.run("apt-get", "-q", "purge", "-y", "colad", check=False)
    assert purge.returncode == 0, purge.stdout + purge.stderr
    paths = [box.root / p.lstrip("/") for p in listed]
    assert [str(p) for p in paths if p.exists() and not p.is_dir()] == []
    # Nothing named after colad anywhere: unit links, deb-systemd-helper state, /etc/colad, /etc/colas,
    # dpkg's info files, byte-code. (/run and /tmp are the container's own tmpfs: asked inside.)
    leftovers = [
        str(Path(d, n).relative_to(box.root))
        for d, dirs, files in os.walk(box.root)
        for n in dirs + files
        if "colad" in n or n == "colas"
    ]
    assert leftovers == []
    inside = box.run("find", "/run", "/tmp", "-name", "*colad*").stdout.split()
    assert inside == []
    assert [p.name for p in plugin_dir.iterdir() if p.name.startswith("colad")] == []


@needs_root
@needs_podman
@pytest.mark.usefixtures("base_image")
def test_installed_package_runs_dra_mode_as_docs_dra_sets_it_up(deb: Path, short_tmp: Path) -> None:
    """The operator's path of docs/DRA.md on the installed unit: a JSON kubeconfig with a token file and the
    CA in /etc/colad, mode, kubeconfig and node_name in colad.toml, `systemctl reload colad`.

    The fake API server listens on the loopback of the container's own network namespace (the boot's
    --private-network): the URL, 127.0.0.1, is the one the fake's certificate names. The fake plugin
    watcher serves in the bind-mounted plugins_registry and dials the endpoint colad names through the
    container's root, as the kubelet dials it in the namespace they share on a node.
    """
    step = Steps()
    tarball, _cached = base_tarball()
    kubelet_root = short_tmp / "kubelet"
    kubelet_root.mkdir(mode=0o750)
    with container(tarball) as box:
        installed = box.apt_install(deb)
        assert installed.returncode == 0, installed.stdout[-4000:] + installed.stderr[-4000:]
        (box.root / "etc/colas/cola-a").write_text('[envs]\nMODE = "fast"\n')
        (box.root / "etc/colas/cola-b").write_bytes(b"")
        box.boot({kubelet_root: "/var/lib/kubelet"})
        step("installed with apt and booted")
        (short_tmp / "pki").mkdir()
        pki = Pki(short_tmp / "pki")
        apiserver = in_network_namespace(box.leader, FakeApiServer(pki, tokens={TOKEN}).start)
        apiserver.add_node(NODE, "node-uid-1")
        watcher = FakePluginWatcher(kubelet_root / "plugins_registry", root=f"/proc/{box.leader}/root")
        watcher.start()
        try:
            check_dra(box, apiserver, watcher, kubelet_root, short_tmp, step)
        except (AssertionError, TimeoutError) as exc:  # WaitTimeout included: add what colad said
            tail = "\n".join(journal(box, check=False).splitlines()[-60:])
            raise AssertionError(f"{exc}\n--- journalctl -u {UNIT} (last 60 lines) ---\n{tail}") from None
        finally:
            watcher.stop()
            apiserver.stop()
        assert watcher.violations() == [], "the fake plugin watcher saw contract violations"
    step("powered off and removed")


def check_dra(
    box: Container,
    apiserver: FakeApiServer,
    watcher: FakePluginWatcher,
    kubelet_root: Path,
    short_tmp: Path,
    step: Steps,
) -> None:
    etc = box.root / "etc/colad"
    shutil.copy(apiserver.pki.ca, etc / "ca.crt")
    (etc / "token").write_text(TOKEN + "\n")
    (etc / "token").chmod(0o600)
    kubeconfig = {
        "apiVersion": "v1",
        "kind": "Config",
        "current-context": "colad",
        "clusters": [{"name": "cluster", "cluster": {"server": apiserver.url, "certificate-authority": "ca.crt"}}],
        "users": [{"name": "colad-dra", "user": {"tokenFile": "token"}}],
        "contexts": [{"name": "colad", "context": {"cluster": "cluster", "user": "colad-dra"}}],
    }
    (etc / "kubeconfig").write_text(json.dumps(kubeconfig))
    (etc / "kubeconfig").chmod(0o600)
    conf = etc / "colad.toml"
    conf.write_text(conf.read_text() + f'\nmode = "dra"\nkubeconfig = "/etc/colad/kubeconfig"\nnode_name = "{NODE}"\n')
    wait_until(lambda: show(box, "ActiveState") == "active", 30, f"{UNIT} active")
    # Type=exec makes the unit active at exec: a reload before the plugin holds SIGHUP (it logs "plugin
    # starting" once it does) could find supervisord not up yet, or end the plugin instead.
    wait_journal(box, 'msg="plugin starting"')
    box.run("systemctl", "reload", UNIT)
    step("kubeconfig written, colad.toml set to DRA mode, reloaded")

    # Registered with the plugin watcher through the bind-mounted plugins_registry, at the path the unit
    # lets it write; its slices published with the token of the kubeconfig the unit can read.
    registration = watcher.wait_registration(timeout=30)
    endpoint = f"/var/lib/kubelet/plugins/{DRIVER}/dra.sock"
    assert (registration.name, registration.endpoint) == (DRIVER, endpoint)
    watcher.wait_usable(DRIVER, timeout=30)
    apiserver.wait_published(NODE, DRIVER, {"cola-a", "cola-b"}, timeout=30)
    assert apiserver.identities and set(apiserver.identities) == {f"token:{TOKEN}"}
    step("registered with the plugin watcher, slices published")

    stored = apiserver.add_allocated_claim("default", "pair", DRIVER, NODE, ["cola-a", "cola-b"])
    claim = Claim("default", "pair", stored["metadata"]["uid"])
    kubelet = FakeDraKubelet(str(kubelet_root / "plugins" / DRIVER / "dra.sock"))
    try:
        outcome = kubelet.prepare([claim])
        assert outcome.errors == {} and outcome.failed == "" and kubelet.violations == [], outcome
        cdi_ids = [i for d in outcome.devices[claim.uid] for i in d.cdi_device_ids]
        # The spec is in the container's /run/cdi (a tmpfs of its own): the runtime on the host resolves it.
        spec_name = f"k8s.{DRIVER}-claim_{claim.uid}.json"
        spec_dir = short_tmp / "cdi"
        spec_dir.mkdir()
        shutil.copy(f"/proc/{box.leader}/root/run/cdi/{spec_name}", spec_dir / spec_name)
        script = 'echo "devices $COLA_DEVICES"; echo "mode $MODE"'
        result = image.run_with_cdi(short_tmp, spec_dir, cdi_ids, script, PODMAN_TIMEOUT)
        assert result.returncode == 0, f"podman exited {result.returncode}:\n{result.stdout}\n{result.stderr}"
        seen = dict(line.split(" ", 1) for line in result.stdout.splitlines() if " " in line)
        assert seen == {"devices": "cola-a,cola-b", "mode": "fast"}, result.stdout
        step("a claim prepared; podman resolved its CDI IDs")
        assert kubelet.unprepare([claim]).errors == {}
    finally:
        kubelet.close()
    assert box.run("test", "-e", f"/run/cdi/{spec_name}", check=False).returncode == 1
    status = box.run("colad", "status", check=False)
    assert f"mode:       dra (driver {DRIVER}, registration registered" in status.stdout, status.stdout
    assert "Traceback (most recent call last)" not in journal(box)
    step("unprepared; `colad status` shows DRA mode")
