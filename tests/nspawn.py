"""A fresh Debian bookworm root, booted with systemd-nspawn, for testing the installed .deb under the real systemd.

`base_tarball()` makes a debootstrap root (minbase, systemd-sysv, dbus) from the Debian mirror that this
machine's apt already uses, and caches it as a tarball in /var/cache/colad-test; later runs reuse it for
a week. `Container` extracts a fresh copy, installs a .deb with apt in a chroot (no systemd runs there,
as in an image build), boots it with systemd-nspawn and runs commands inside with nsenter. The
dependencies' .debs are kept beside the tarball between runs. Needs root, debootstrap,
systemd-container and the mirror. Neighbours: tests/e2e/test_deb.py.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import re
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from tests.helpers import wait_until

SUITE = "bookworm"
VARIANT = "minbase"
# systemd-sysv makes systemd the init that nspawn boots; dbus lets systemctl talk to it.
INCLUDE = ("systemd-sysv", "dbus")
CACHE_DIR = Path("/var/cache/colad-test")
CACHE_MAX_AGE = 7 * 24 * 3600.0  # then debootstrap again, so the base keeps up with point releases
BASE_FORMAT = 2  # part of the cache key: bump when what base_tarball() puts in the root changes
SYSTEM_PATH = "/usr/sbin:/usr/bin:/sbin:/bin"
# What a command inside gets instead of the test's environment (venv PATH, COLAD_*, ...).
CLEAN_ENV = ("env", "-i", f"PATH={SYSTEM_PATH}", "LANG=C.UTF-8", "DEBIAN_FRONTEND=noninteractive")


def _sources() -> Iterator[tuple[str, list[str], list[str]]]:
    """(uri, suites, components) of every enabled `deb` source, one-line and deb822 formats."""
    files = [Path("/etc/apt/sources.list")]
    parts = Path("/etc/apt/sources.list.d")
    if parts.is_dir():
        files += sorted(p for p in parts.iterdir() if p.suffix in (".list", ".sources"))
    for path in files:
        try:
            text = path.read_text(errors="replace")
        except OSError:
            continue
        if path.suffix == ".sources":
            for stanza in re.split(r"\n\s*\n", text):
                fields: dict[str, str] = {}
                for line in stanza.splitlines():
                    if line.startswith("#") or ":" not in line or line[:1].isspace():
                        continue
                    key, _, value = line.partition(":")
                    fields[key.strip().lower()] = value.strip()
                if "deb" not in fields.get("types", "").split() or fields.get("enabled", "yes").lower() == "no":
                    continue
                for uri in fields.get("uris", "").split():
                    yield uri, fields.get("suites", "").split(), fields.get("components", "").split()
        else:
            for line in text.splitlines():
                words = re.sub(r"\[[^]]*\]", " ", line.split("#", 1)[0]).split()  # drop [options]
                if len(words) >= 4 and words[0] == "deb":
                    yield words[1], [words[2]], words[3:]


def debian_mirror(suite: str = SUITE) -> str:
    """The mirror apt on this machine uses for `suite` main: nothing is hard-coded."""
    for uri, suites, components in _sources():
        if suite in suites and "main" in components:
            return uri
    raise RuntimeError(f"no apt source for {suite} main in /etc/apt/sources.list(.d): cannot debootstrap")


def _arch() -> str:
    return subprocess.run(["dpkg", "--print-architecture"], capture_output=True, text=True, check=True).stdout.strip()


def base_tarball(cache_dir: Path = CACHE_DIR, include: tuple[str, ...] = INCLUDE) -> tuple[Path, bool]:
    """The cached base root as a tarball, made with debootstrap when missing or stale; (path, was it cached).

    `include=()` gives the bare minbase root that tests/image.py turns into the container image's base.
    """
    mirror, arch = debian_mirror(), _arch()
    spec = f"{BASE_FORMAT} {SUITE} {VARIANT} {','.join(include)} {mirror} {arch}"
    key = hashlib.sha256(spec.encode()).hexdigest()[:12]
    label = "base" if include else VARIANT  # each kind of root is cached (and aged out) on its own
    tarball = cache_dir / f"{SUITE}-{label}-{key}.tar"
    cache_dir.mkdir(parents=True, exist_ok=True)
    with open(cache_dir / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # two test runs at once build it once
        if tarball.is_file() and time.time() - tarball.stat().st_mtime < CACHE_MAX_AGE:
            return tarball, True
        work = Path(tempfile.mkdtemp(prefix="debootstrap-", dir=cache_dir))
        try:
            root, log = work / "root", work / "debootstrap.log"
            root.mkdir(mode=0o755)
            with open(log, "wb") as out:
                result = subprocess.run(
                    [
                        "debootstrap",
                        f"--variant={VARIANT}",
                        *([f"--include={','.join(include)}"] if include else []),
                        f"--arch={arch}",
                        SUITE,
                        str(root),
                        mirror,
                    ],
                    stdout=out,
                    stderr=subprocess.STDOUT,
                    env={"PATH": SYSTEM_PATH},
                    timeout=900,
                )
            if result.returncode != 0:
                tail = log.read_text(errors="replace").splitlines()[-30:]
                raise RuntimeError(f"debootstrap failed ({result.returncode}):\n" + "\n".join(tail))
            for package in (root / "var/cache/apt/archives").glob("*.deb"):
                package.unlink()  # debootstrap's downloads: 40 MB every run would extract for nothing
            partial = work / "base.tar"
            subprocess.run(
                ["tar", "--numeric-owner", "--xattrs", "-C", str(root), "-cf", str(partial), "."],
                check=True,
                timeout=300,
            )
            os.replace(partial, tarball)  # atomic: a killed run never leaves half a cache
        finally:
            subprocess.run(["rm", "-rf", "--one-file-system", str(work)], check=False)
        for old in cache_dir.glob(f"{SUITE}-{label}-*.tar"):
            if old != tarball:
                old.unlink(missing_ok=True)
        return tarball, False


def _link(source: Path, target: Path) -> None:
    try:
        os.link(source, target)
    except FileExistsError:
        pass
    except OSError:  # another file system
        shutil.copy2(source, target)


@dataclass
class Run:
    returncode: int
    stdout: str
    stderr: str


class Container:
    """One fresh root from the base tarball; boot() it, run() inside, and close() removes everything."""

    def __init__(self, parent: str = "/var/tmp") -> None:
        self.root = Path(tempfile.mkdtemp(prefix="colad-nspawn-", dir=parent))
        self.root.chmod(0o755)  # dbus-daemon (user messagebus) must traverse / or the boot never finishes
        self.name = f"colad-test-{os.getpid()}"
        self.log_path = self.root.with_name(self.root.name + ".log")
        self.proc: subprocess.Popen[bytes] | None = None
        self.leader = 0

    def extract(self, tarball: Path) -> None:
        subprocess.run(
            ["tar", "--numeric-owner", "--xattrs", "-C", str(self.root), "-xf", str(tarball)], check=True, timeout=300
        )
        shutil.copy("/etc/resolv.conf", self.root / "etc" / "resolv.conf")

    # ---- before boot: a chroot, as when a package goes into an image ----
    def chroot(self, *command: str, timeout: float = 300) -> Run:
        result = subprocess.run(
            ["chroot", str(self.root), *CLEAN_ENV, *command], capture_output=True, text=True, timeout=timeout
        )
        return Run(result.returncode, result.stdout, result.stderr)

    def apt_install(self, deb: Path, archives: Path = CACHE_DIR / "apt-archives") -> Run:
        """`apt-get install ./colad_*.deb`: apt resolves every dependency from the Debian mirror.

        The lists are fetched fresh each time. The dependencies' .debs that apt downloaded last time
        are put back in its archive first: apt checks them against the lists and fetches only what
        changed. Afterwards `archives` holds exactly what this install used.
        """
        inside = Path("/root") / deb.name
        shutil.copy(deb, self.root / inside.relative_to("/"))
        own = self.root / "var/cache/apt/archives"
        archives.mkdir(parents=True, exist_ok=True)
        for package in archives.glob("*.deb"):
            _link(package, own / package.name)
        try:
            update = self.chroot("apt-get", "-q", "update")
            if update.returncode != 0:
                return update
            # unsafe-io: no fsync per file; the root is thrown away after the test anyway.
            install = self.chroot(
                "apt-get",
                "-q",
                "-o",
                "Dpkg::Options::=--force-unsafe-io",
                "install",
                "-y",
                "--no-install-recommends",
                str(inside),
            )
            if install.returncode == 0:
                with open(archives.parent / ".lock", "w") as lock:
                    fcntl.flock(lock, fcntl.LOCK_EX)
                    used = {p.name for p in own.glob("*.deb")}
                    for package in archives.glob("*.deb"):
                        if package.name not in used:
                            package.unlink()
                    for name in used - {p.name for p in archives.glob("*.deb")}:
                        _link(own / name, archives / name)
            return install
        finally:
            (self.root / inside.relative_to("/")).unlink()

    # ---- booted ----
    def boot(self, binds: dict[Path, str], timeout: float = 60) -> None:
        command = [
            "systemd-nspawn",
            "--quiet",
            f"--directory={self.root}",
            f"--machine={self.name}",
            "--boot",
            # The host has no systemd: no machined to register with, no unit to move into.
            "--register=no",
            "--keep-unit",
            "--console=passive",
            # Its own loopback: colad's metrics port cannot clash with the host's.
            "--private-network",
            *[f"--bind={host}:{inside}" for host, inside in binds.items()],
        ]
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(
                command,
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env={"PATH": SYSTEM_PATH},
                start_new_session=True,
            )
        self.leader = wait_until(self._find_leader, timeout, "the container's systemd", logs=[self.log_path])

        def booted() -> str | None:
            state = self.run("systemctl", "is-system-running", check=False).stdout.strip()
            return state if state in ("running", "degraded") else None

        wait_until(booted, timeout, "the boot to finish (running or degraded)", interval=0.1, logs=[self.log_path])

    def _find_leader(self) -> int:
        assert self.proc is not None
        if self.proc.poll() is not None:
            raise AssertionError(f"systemd-nspawn exited with {self.proc.returncode}")
        for tid in os.listdir(f"/proc/{self.proc.pid}/task"):
            children = Path(f"/proc/{self.proc.pid}/task/{tid}/children").read_text().split()
            for child in children:
                if Path(f"/proc/{child}/comm").read_text().strip() == "systemd":
                    return int(child)
        return 0

    def run(self, *command: str, check: bool = True, timeout: float = 120) -> Run:
        """Run a command in all of the container's namespaces, with a clean environment."""
        result = subprocess.run(
            ["nsenter", "-t", str(self.leader), "-a", *CLEAN_ENV, *command],
            capture_output=True,
            text=True,
            timeout=timeout,
        )
        run = Run(result.returncode, result.stdout, result.stderr)
        if check and run.returncode != 0:
            raise AssertionError(f"{' '.join(command)} exited {run.returncode}:\n{run.stdout}{run.stderr}")
        return run

    def processes(self) -> list[tuple[int, str, str]]:
        """(host pid, command line, cgroup) of every process in the container's PID namespace."""
        namespace = os.readlink(f"/proc/{self.leader}/ns/pid")
        found = []
        for entry in os.listdir("/proc"):
            if not entry.isdigit():
                continue
            try:
                if os.readlink(f"/proc/{entry}/ns/pid") != namespace:
                    continue
                cmdline = Path(f"/proc/{entry}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
                cgroup = Path(f"/proc/{entry}/cgroup").read_text()
            except OSError:
                continue  # it exited meanwhile
            found.append((int(entry), cmdline.strip(), cgroup))
        return found

    def poweroff(self, timeout: float = 30) -> None:
        if self.proc is None:
            return
        if self.proc.poll() is None and self.leader:
            self.run("systemctl", "poweroff", check=False, timeout=timeout)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                pass
        if self.proc.poll() is None:  # a stuck shutdown: end the PID namespace, then nspawn
            for pid in (self.leader, self.proc.pid):
                if pid:
                    try:
                        os.kill(pid, signal.SIGKILL)
                    except ProcessLookupError:
                        pass
            self.proc.wait(10)

    def close(self) -> None:
        try:
            self.poweroff()
        finally:
            # nspawn's mounts live in its own namespace; --one-file-system never follows a stray one.
            subprocess.run(["rm", "-rf", "--one-file-system", str(self.root)], check=False, timeout=300)

    def log(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except OSError:
            return ""


@contextmanager
def container(tarball: Path) -> Iterator[Container]:
    box = Container()
    try:
        box.extract(tarball)
        yield box
    finally:
        box.close()
        box.log_path.unlink(missing_ok=True)
