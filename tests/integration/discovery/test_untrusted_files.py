"""Discovery honours only device files and directories that no untrusted user can write.

Real files owned by uid 65534 (chown: the tests run as root), real modes, real inotify and a
real QueueServer: an untrusted file's probe never runs and its host paths reach neither the
queue nor the CDI spec; a directory writable by others is refused until it is fixed; each is
logged once and counted; trusted_owners makes the same files trusted.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Callable
from pathlib import Path

import pytest

from colad.config.config import Config
from colad.core.constants import HEALTHY, UNHEALTHY
from colad.core.devices import Device, Mount
from colad.core.trust import UNTRUSTED
from colad.discovery.main import Discovery
from colad.queue.messages import DeviceSnapshot
from colad.runtime.pathtrust import directory_chain, directory_problem
from tests.helpers import wait_until
from tests.integration.support import Inbox, RoleRunner, Serve, begin, make_config

pytestmark = pytest.mark.integration

pytestmark = [pytest.mark.integration, pytest.mark.skipif(os.geteuid() != 0, reason="chown needs root")]
NOBODY = 65534


@pytest.fixture
def root(short_tmp: Path) -> Path:
    (short_tmp / "run").mkdir(mode=0o700)
    (short_tmp / "devices").mkdir()
    return short_tmp


def start(cfg: Config, serve: Serve, runners: Callable[[Discovery], RoleRunner]) -> tuple[Discovery, Inbox]:
    _, inbox = serve(cfg.queue_socket)
    discovery = Discovery(cfg)
    runner = runners(discovery)
    begin(discovery)
    runner.start()
    return discovery, inbox


def wait_snapshot(inbox: Inbox, check: Callable[[DeviceSnapshot], bool], what: str) -> DeviceSnapshot:
    def ok() -> DeviceSnapshot | None:
        latest = inbox.latest(DeviceSnapshot)
        return latest if latest is not None and check(latest) else None

    return wait_until(ok, 10, what)


def device_file(root: Path, name: str, owner: int = 0) -> Path:
    """A device file that would run a probe (leaving a marker) and mount /etc writable."""
    path = root / "devices" / name
    path.write_text(
        f'probe = ["/usr/bin/touch", "{root}/ran-{name}"]\n'
        f'[envs]\nVENDOR_MODE = "x"\n[[mounts]]\nhost_path = "/etc"\nread_only = false\n'
    )
    os.chown(path, owner, -1)
    return path


def spec_entry(cfg: Config, device_id: str) -> dict[str, object]:
    """The device's entry in the resource's CDI spec on disk."""
    (spec,) = Path(cfg.cdi_spec_dir).glob("colad-*.json")
    devices = json.loads(spec.read_text())["devices"]
    return next(d for d in devices if d["name"] == device_id)


def lines(caplog: pytest.LogCaptureFixture, needle: str) -> list[str]:
    return [r.getMessage() for r in caplog.records if needle in r.getMessage()]


def test_an_untrusted_device_file_gives_nothing_and_its_probe_never_runs(
    root: Path, serve: Serve, runners: Callable[[Discovery], RoleRunner], caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="colad")
    cfg = make_config(root, probe_interval=0.2)
    device_file(root, "good")
    evil = device_file(root, "evil", NOBODY)
    discovery, inbox = start(cfg, serve, runners)
    got = wait_snapshot(inbox, lambda s: s.devices.get("good") == good_device(), "good Healthy, its probe passed")
    why = f"{UNTRUSTED}{evil} is owned by uid 65534, which is neither root nor in trusted_owners"
    assert got.devices.get("evil") == Device("evil", UNHEALTHY, problem=why)  # no mount, env or probe
    # The good device's probe ran (again and again, every 0.2 s); the evil one's, started with it, never.
    wait_until(lambda: (root / "ran-good").exists(), 10, "the trusted file's probe to run")
    first = (root / "ran-good").stat().st_mtime_ns
    wait_until(lambda: (root / "ran-good").stat().st_mtime_ns != first, 10, "the trusted probe to run again")
    assert not (root / "ran-evil").exists()
    wait_until(lambda: Path(cfg.cdi_spec_dir).is_dir() and spec_entry(cfg, "evil") is not None, 10, "the CDI spec")
    assert spec_entry(cfg, "evil") == {
        "name": "evil",
        "containerEdits": {"env": ["COLA_DEVICE_evil=evil"]},
    }  # colad's marker
    assert spec_entry(cfg, "good")["containerEdits"]["mounts"][0]["hostPath"] == "/etc"  # type: ignore[index]
    # Touched again and again (each an event and a re-read): still one line and one count.
    for n in range(3):
        os.utime(evil, ns=(n * 10**9, n * 10**9))
        (root / "devices" / f"later{n}").write_text("")
        wait_snapshot(inbox, lambda s, n=n: f"later{n}" in s.devices, f"later{n}")  # type: ignore[misc]
    assert len(lines(caplog, "device file untrusted")) == 1
    assert f'reason="{why[len(UNTRUSTED) :]}"' in lines(caplog, "device file untrusted")[0]
    assert discovery.stats.counters["input.untrusted_file"] == 1
    assert not (root / "ran-evil").exists()
    # Given to root, the same file is honoured: its mount, and its probe.
    os.chown(evil, 0, -1)
    wait_snapshot(inbox, lambda s: s.devices.get("evil") == good_device("evil"), "evil trusted and Healthy")
    wait_until(lambda: (root / "ran-evil").exists(), 10, "the probe of the file now trusted")
    assert discovery.stats.counters["input.untrusted_file"] == 1


def good_device(name: str = "good") -> Device:
    return Device(
        name,
        HEALTHY,
        mounts=(Mount("/etc", "/etc", read_only=False),),
        envs=(("VENDOR_MODE", "x"),),
    )


@pytest.mark.parametrize("mode", [0o664, 0o646, 0o666], ids=["0664", "0646", "0666"])
def test_a_device_file_its_group_or_others_can_write_is_untrusted(
    root: Path, mode: int, serve: Serve, runners: Callable[[Discovery], RoleRunner]
) -> None:
    path = device_file(root, "cola")
    path.chmod(mode)
    _, inbox = start(make_config(root), serve, runners)
    got = wait_snapshot(inbox, lambda s: "cola" in s.devices, "cola")
    assert got.devices.get("cola") == Device("cola", UNHEALTHY, problem=f"{UNTRUSTED}{path} is " + writable(mode))
    assert not (root / "ran-cola").exists()
    path.chmod(0o644)
    wait_snapshot(inbox, lambda s: s.devices.get("cola") == good_device("cola"), "cola trusted again")


def writable(mode: int) -> str:
    who = {0o664: "group", 0o646: "others", 0o666: "group and others"}[mode]
    return f"writable by {who} (mode {mode:04o})"


def test_a_device_directory_others_can_write_is_refused_until_fixed(
    root: Path, serve: Serve, runners: Callable[[Discovery], RoleRunner], caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="colad")
    cfg = make_config(root)
    devices = root / "devices"
    device_file(root, "cola1")
    devices.chmod(0o777)
    discovery, inbox = start(cfg, serve, runners)
    wait_snapshot(inbox, lambda s: len(s.devices) == 0, "no device from the open directory")
    (devices / "cola2").write_text("")  # a file dropped in by anyone: nothing read from it
    wait_until(lambda: discovery.stats.counters.get("rescans.inotify", 0) >= 1, 10, "the event's rescan")
    assert len(inbox.of(DeviceSnapshot)[-1].devices) == 0
    assert not (root / "ran-cola1").exists()
    devices.chmod(0o755)  # its own IN_ATTRIB: listed again at once
    wait_snapshot(inbox, lambda s: s.devices.ids == ("cola1", "cola2") and s.devices.count(UNHEALTHY) == 0, "fixed")
    refused = lines(caplog, "device directory untrusted")
    assert len(refused) == 1 and f"device_dir={devices}" in refused[0] and "mode 0777" in refused[0]
    assert discovery.stats.counters["input.untrusted_dir"] == 1
    assert len(lines(caplog, "device directory trusted again")) == 1
    # A directory above, opened to all (no event in the device directory says so): the next event
    # there finds it, and the devices known stay, Unhealthy and carrying nothing.
    root.chmod(0o777)
    (devices / "cola3").write_text("")
    got = wait_snapshot(inbox, lambda s: s.devices.count(UNHEALTHY) == 2, "the devices held Unhealthy")
    assert got.devices.ids == ("cola1", "cola2")
    problem = f"{UNTRUSTED}directory {root} is writable by group and others (mode 0777)"
    assert set(got.devices) == {Device(i, UNHEALTHY, problem=problem) for i in ("cola1", "cola2")}
    assert discovery.stats.counters["input.untrusted_dir"] == 2
    root.chmod(0o1777)  # sticky, as /tmp: the entries below it are checked on their own (retried every 2 s)
    wait_snapshot(inbox, lambda s: len(s.devices) == 3 and s.devices.count(UNHEALTHY) == 0, "trusted again")
    assert len(lines(caplog, "device directory untrusted")) == 2


def test_trusted_owners_make_a_delegated_directory_and_its_files_trusted(
    root: Path, serve: Serve, runners: Callable[[Discovery], RoleRunner], caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="colad")
    os.chown(root / "devices", NOBODY, -1)
    device_file(root, "cola", NOBODY)
    discovery, inbox = start(make_config(root, trusted_owners=(str(NOBODY),)), serve, runners)
    wait_snapshot(inbox, lambda s: s.devices.get("cola") == good_device("cola"), "cola trusted, Healthy")
    wait_until(lambda: (root / "ran-cola").exists(), 10, "the delegated file's probe to run")
    assert not lines(caplog, "untrusted")
    assert "input.untrusted_file" not in discovery.stats.counters


def test_a_reload_that_drops_a_trusted_owner_refuses_its_directory(
    root: Path, serve: Serve, runners: Callable[[Discovery], RoleRunner]
) -> None:
    os.chown(root / "devices", NOBODY, -1)
    device_file(root, "cola")
    cfg = make_config(root, trusted_owners=(str(NOBODY),))
    _, inbox = serve(cfg.queue_socket)
    discovery = Discovery(cfg)
    runner = runners(discovery)
    begin(discovery)
    runner.start()
    wait_snapshot(inbox, lambda s: s.devices.get("cola") == good_device("cola"), "cola trusted")
    runner.stop()
    discovery.cfg = make_config(root)  # as loop.WatcherLoop.reload() applies a new config
    discovery.apply_config(cfg)
    runner.start()
    wait_snapshot(inbox, lambda s: len(s.devices) == 0, "the directory refused after the reload")


def test_the_way_to_a_directory_counts_every_directory_a_symlink_passes_through(short_tmp: Path) -> None:
    real = short_tmp / "real"
    (real / "colas").mkdir(parents=True)
    open_dir = short_tmp / "open"
    open_dir.mkdir()
    open_dir.chmod(0o777)  # whoever can write here can point the link elsewhere
    (open_dir / "link").symlink_to(real)
    chain = [path for path, _, _ in directory_chain(f"{open_dir}/link/colas")]
    assert chain == ["/", "/tmp", str(short_tmp), str(open_dir), str(real), str(real / "colas")]
    assert (
        directory_problem(f"{open_dir}/link/colas")
        == f"{UNTRUSTED}directory {open_dir} is writable by group and others (mode 0777)"
    )
    (short_tmp / "link").symlink_to("real/../real")  # relative, with '..': resolved as the kernel does
    assert [p for p, _, _ in directory_chain(f"{short_tmp}/link/colas")][-2:] == [str(real), str(real / "colas")]
    assert directory_problem(f"{short_tmp}/link/colas") is None
    assert directory_problem(f"{short_tmp}/missing") is None  # listing it says it is missing
