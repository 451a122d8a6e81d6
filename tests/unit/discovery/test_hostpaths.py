"""Unit tests for colad.discovery.hostpaths: a device whose host paths are missing is Unhealthy, with a reason.

The rule is tested as a table over PathState maps; the shell once on a real directory tree in
tmp_path with a real character device (mknod 1:3), both ways: removed -> Unhealthy, restored ->
Healthy. Optional entries use a subclass carrying the field devices.py does not have yet.
"""

from __future__ import annotations

import os
import random
from dataclasses import dataclass
from pathlib import Path

import pytest

from colad.core.constants import HEALTHY, UNHEALTHY
from colad.core.devices import Device, DeviceNode, DeviceSet, Mount, device_problem
from colad.discovery import hostpaths
from colad.discovery.devicefile import parse
from colad.discovery.hostpaths import MISSING, PathState

pytestmark = pytest.mark.unit
DEV = PathState(device=True)
FILE = PathState()


@dataclass(frozen=True, order=True)
class OptionalNode(DeviceNode):
    optional: bool = True


@dataclass(frozen=True, order=True)
class OptionalMount(Mount):
    optional: bool = True


def _opt(entry: DeviceNode | Mount) -> bool:
    return isinstance(entry, (OptionalNode, OptionalMount))


COLA = Device(
    "cola1",
    device_nodes=(DeviceNode("/dev/cola1", "/dev/cola1"),),
    mounts=(Mount("/opt/cola", "/opt/cola"),),
    envs=(("MODE", "fast"),),
)


NODE = "device_nodes[0].host_path '/dev/cola1'"


@pytest.mark.parametrize(
    ("states", "health", "reason"),
    [
        pytest.param({"/dev/cola1": DEV, "/opt/cola": FILE}, HEALTHY, None, id="all-present"),
        pytest.param({"/opt/cola": FILE}, UNHEALTHY, f"{NODE} does not exist", id="node-missing"),
        pytest.param({"/dev/cola1": DEV}, UNHEALTHY, "mounts[0].host_path '/opt/cola' does not exist", id="mount-gone"),
        pytest.param(
            {"/dev/cola1": FILE, "/opt/cola": FILE},
            UNHEALTHY,
            "device_nodes[0].host_path '/dev/cola1' is not a device node",
            id="node-is-a-regular-file",
        ),
        pytest.param(
            {"/dev/cola1": PathState("cannot be checked: Permission denied"), "/opt/cola": DEV},
            UNHEALTHY,
            "device_nodes[0].host_path '/dev/cola1' cannot be checked: Permission denied",
            id="unreadable",
        ),
        pytest.param({}, UNHEALTHY, "device_nodes[0].host_path '/dev/cola1' does not exist (and 1 more)", id="both"),
    ],
)
def test_rule(states: dict[str, PathState], health: str, reason: str | None) -> None:
    result = hostpaths.apply(DeviceSet.of([COLA]), states)
    device = result.devices.get("cola1")
    assert device is not None and device.health == health
    assert result.by_id.get("cola1") == reason
    # Everything else is kept (the device stays well-formed: only its health changes).
    assert device.device_nodes == COLA.device_nodes and device.mounts == COLA.mounts and device.envs == COLA.envs
    assert device.problem == "" and device_problem(device) is None


def test_optional_entries_that_are_missing_are_left_out_and_do_not_matter() -> None:
    device = Device(
        "cola1",
        device_nodes=(DeviceNode("/dev/cola1", "/dev/cola1"), OptionalNode("/dev/cola1-ctl", "/dev/ctl")),
        mounts=(OptionalMount("/opt/extra", "/opt/extra"), Mount("/opt/cola", "/opt/cola")),
    )
    result = hostpaths.apply(DeviceSet.of([device]), {"/dev/cola1": DEV, "/opt/cola": FILE})
    out = result.devices.get("cola1")
    assert out is not None and out.health == HEALTHY and result.reasons == ()
    assert [n.host_path for n in out.device_nodes] == ["/dev/cola1"]
    assert [m.host_path for m in out.mounts] == ["/opt/cola"]
    present = {"/dev/cola1": DEV, "/dev/cola1-ctl": DEV, "/opt/extra": FILE, "/opt/cola": FILE}
    assert hostpaths.apply(DeviceSet.of([device]), present).devices.get("cola1") == device  # present: kept


def test_malformed_declared_and_bare_devices() -> None:
    malformed = parse("broken", b"colour = 1")
    declared = Device("down", UNHEALTHY, mounts=(Mount("/gone", "/gone"),))
    result = hostpaths.apply(DeviceSet.of([malformed, declared, Device("bare")]), {})
    assert result.devices.get("broken") == malformed and result.devices.get("bare") == Device("bare")
    assert result.by_id == {"down": "mounts[0].host_path '/gone' does not exist"}


def test_watch_dirs_follow_the_nearest_existing_ancestor() -> None:
    states = {"/dev/cola1": DEV, "/dev/dri/by-path/x": MISSING, "/dev/dri/by-path": MISSING, "/dev/dri": MISSING}
    assert hostpaths.watch_dirs(states.keys() - {"/dev/dri/by-path", "/dev/dri"}, states) == {"/dev"}
    states["/dev/dri"] = FILE  # /dev/dri appeared: the watch moves down to it
    assert hostpaths.watch_dirs(["/dev/dri/by-path/x"], states) == {"/dev/dri"}
    assert hostpaths.watch_dirs(["/top"], {}) == {"/"}


def test_watch_dirs_are_bounded() -> None:
    many = [f"/d{i}/x" for i in range(hostpaths.MAX_WATCH_DIRS * 2)]
    assert len(hostpaths.watch_dirs(many, {})) == hostpaths.MAX_WATCH_DIRS


def test_the_verdict_is_a_function_of_the_states_over_random_classes() -> None:
    rng = random.Random(15)
    pool = [f"/dev/p{i}" for i in range(6)] + [f"/opt/m{i}" for i in range(6)]
    for _ in range(500):
        chosen = rng.sample(pool, rng.randint(0, 5))
        cut = rng.randint(0, len(chosen))
        nodes = tuple((OptionalNode if rng.random() < 0.3 else DeviceNode)(p, p) for p in chosen[:cut])
        mounts = tuple((OptionalMount if rng.random() < 0.3 else Mount)(p, p) for p in chosen[cut:])
        device = Device("d", device_nodes=nodes, mounts=mounts)
        states = {p: rng.choice([DEV, FILE, MISSING]) for p in pool if rng.random() < 0.8}
        result = hostpaths.apply(DeviceSet.of([device]), states)
        out = result.devices.get("d")
        assert out is not None
        required_bad = [
            p
            for p, optional, node in [(n.host_path, isinstance(n, OptionalNode), True) for n in nodes]
            + [(m.host_path, isinstance(m, OptionalMount), False) for m in mounts]
            if not optional and (not states.get(p, MISSING).exists or (node and not states[p].device))
        ]
        assert (out.health == UNHEALTHY) is bool(required_bad)
        assert ("d" in result.by_id) is bool(required_bad)

        def usable(path: str, node: bool, states: dict[str, PathState] = states) -> bool:
            state = states.get(path, MISSING)
            return state.exists and (state.device or not node)

        assert out.device_nodes == tuple(n for n in nodes if not _opt(n) or usable(n.host_path, True))
        assert out.mounts == tuple(m for m in mounts if not _opt(m) or usable(m.host_path, False))
        assert device_problem(out) is None


def test_check_on_a_real_tree_both_ways(tmp_path: Path) -> None:
    node = tmp_path / "dev" / "cola1"
    share = tmp_path / "share"
    node.parent.mkdir()
    share.mkdir()
    os.mknod(node, 0o600 | 0o020000, os.makedev(1, 3))
    device = Device("cola1", device_nodes=(DeviceNode(str(node), "/dev/cola1"),), mounts=(Mount(str(share), "/s"),))
    devices = DeviceSet.of([device])
    assert hostpaths.check(devices).reasons == ()
    node.unlink()
    result = hostpaths.check(devices)
    assert result.by_id == {"cola1": f"device_nodes[0].host_path '{node}' does not exist"}
    assert str(node.parent) in result.watch_dirs
    node.parent.rmdir()
    assert str(tmp_path) in hostpaths.check(devices).watch_dirs  # watched where it will be created
    node.parent.mkdir()
    node.write_text("")  # a regular file is not a device node: the runtime would refuse it
    assert "is not a device node" in hostpaths.check(devices).by_id["cola1"]
    node.unlink()
    os.mknod(node, 0o600 | 0o020000, os.makedev(1, 3))
    healed = hostpaths.check(devices)
    assert healed.reasons == () and healed.devices.get("cola1") == device


def test_a_path_under_a_regular_file_is_watched_in_the_directory_above(tmp_path: Path) -> None:
    # A watch can only be on a directory: one on the file would fail at every turn.
    (tmp_path / "file").write_text("")
    device = Device("d", mounts=(Mount(str(tmp_path / "file" / "x"), "/x"),))
    result = hostpaths.check(DeviceSet.of([device]))
    assert "cannot be checked: Not a directory" in result.by_id["d"]
    assert result.watch_dirs == {str(tmp_path)}
    states = {"/a/f/x": hostpaths.MISSING, "/a/f": hostpaths.PathState(directory=False)}
    assert hostpaths.watch_dirs(["/a/f/x", "/a/f/y"], states) == {"/a"}


UNTRUSTED_WAY = PathState(untrusted="untrusted: directory /opt is writable by group and others (mode 0777)")


@pytest.mark.parametrize("optional", [False, True])
def test_an_untrusted_host_path_is_left_out_and_its_device_unhealthy_reason_first(optional: bool) -> None:
    mount = OptionalMount("/opt/cola", "/opt/cola") if optional else Mount("/opt/cola", "/opt/cola")
    device = Device("cola1", device_nodes=(DeviceNode("/dev/cola1", "/dev/cola1"),), mounts=(mount,))
    result = hostpaths.apply(DeviceSet.of([device]), {"/opt/cola": UNTRUSTED_WAY})  # the node missing too
    (out,) = result.devices
    assert out.health == UNHEALTHY
    assert out.mounts == () and out.device_nodes == device.device_nodes
    assert result.by_id["cola1"] == (
        "mounts[0].host_path '/opt/cola' untrusted: directory /opt is writable by group and others (mode 0777)"
        " (and 1 more)"
    )
    assert "/opt" in result.watch_dirs  # watched: a repair is seen


def test_check_judges_the_way_on_a_real_tree(tmp_path: Path) -> None:
    open_dir = tmp_path / "open"
    open_dir.mkdir()
    open_dir.chmod(0o777)
    (open_dir / "data").symlink_to("/etc")
    closed = tmp_path / "closed"
    closed.mkdir()
    (closed / "data").symlink_to("/etc")
    device = Device("cola1", mounts=(Mount(str(open_dir / "data"), "/a"), Mount(str(closed / "data"), "/b")))
    result = hostpaths.check(DeviceSet.of([device]))
    (out,) = result.devices
    assert [m.host_path for m in out.mounts] == [str(closed / "data")]
    assert result.by_id["cola1"].startswith(f"mounts[0].host_path '{open_dir}/data' untrusted: directory {open_dir}")
    assert hostpaths.trust_path(str(closed / "data")) == PathState(device=True)
    assert hostpaths.trust_path(str(open_dir / "data")).untrusted
