"""Discovery's health overlay with real inotify, real probes and a real QueueServer.

Host paths: a missing required device node or mount source makes the device Unhealthy (the
watch follows a tree as it is created); an optional one is left out. Probes: healthy, failing
with a reason, hanging past the timeout, flapping, and none delays another device's change.
Every change rewrites the CDI spec and the NFD feature file. The safety rescan is an hour away:
only inotify and the probe runner can have told discovery.
"""

from __future__ import annotations

import dataclasses
import json
import os
import random
import shutil
import stat
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from colad.config.config import Config
from colad.core.constants import HEALTHY, UNHEALTHY
from colad.core.devices import Device, DeviceSet
from colad.discovery import devicefile, hostpaths
from colad.discovery.main import Discovery
from colad.queue import device_wire
from colad.queue.messages import DeviceSnapshot
from tests.helpers import wait_until
from tests.integration.support import Inbox, RoleRunner, Serve, begin, make_config
from tests.oracles import nfd_labels

pytestmark = pytest.mark.integration

RESOURCE = "example.com/cola"
OPERATIONS = 300


def config(root: Path, **overrides: object) -> Config:
    os.makedirs(root / "devices", exist_ok=True)
    os.mkdir(root / "run", 0o700)
    values: dict[str, object] = {
        "resource_name": RESOURCE,
        "cdi_spec_dir": str(root / "cdi"),
        "nfd_features_file": str(root / "features.d" / "colad"),
    }
    values.update(overrides)
    return make_config(root, **values)


def start(cfg: Config, serve: Serve, runners: Callable[[Discovery], RoleRunner]) -> tuple[Discovery, Inbox]:
    _, inbox = serve(cfg.queue_socket)
    discovery = Discovery(cfg)
    runner = runners(discovery)
    begin(discovery)
    runner.start()
    return discovery, inbox


def devices(inbox: Inbox) -> dict[str, Device]:
    snap = inbox.latest(DeviceSnapshot)
    return {} if snap is None else {d.device_id: d for d in snap.devices}


def wait_health(inbox: Inbox, want: dict[str, str], timeout: float = 10.0) -> None:
    def exact() -> bool:
        got = {i: d.health for i, d in devices(inbox).items()}
        if got != want:
            raise AssertionError(f"health at the plugin side: {got}")
        return True

    wait_until(exact, timeout, f"health {want}")


def mount_file(host_path: Path, *, optional: bool = False, container: str = "/data") -> str:
    extra = "optional = true\n" if optional else ""
    return f'[[mounts]]\nhost_path = "{host_path}"\ncontainer_path = "{container}"\n{extra}'


def test_a_missing_mount_source_is_unhealthy_until_it_appears(
    short_tmp: Path, serve: Serve, runners: Callable[[Discovery], RoleRunner]
) -> None:
    cfg = config(short_tmp)
    source = short_tmp / "host" / "a" / "b" / "data"  # none of host/ exists yet: the watch must follow the tree
    (short_tmp / "devices" / "dev-0").write_text(mount_file(source))
    (short_tmp / "devices" / "dev-1").write_text("")
    discovery, inbox = start(cfg, serve, runners)
    wait_health(inbox, {"dev-0": UNHEALTHY, "dev-1": HEALTHY})
    for step in ("host", "host/a", "host/a/b"):
        os.mkdir(short_tmp / step)
    source.write_text("x")
    wait_health(inbox, {"dev-0": HEALTHY, "dev-1": HEALTHY})
    source.unlink()
    wait_health(inbox, {"dev-0": UNHEALTHY, "dev-1": HEALTHY})
    os.rename(short_tmp / "host" / "a", short_tmp / "host" / "gone")  # the watched parent moves away
    (short_tmp / "host" / "a" / "b").mkdir(parents=True)
    source.write_text("y")
    wait_health(inbox, {"dev-0": HEALTHY, "dev-1": HEALTHY})
    counters = discovery.stats.counters  # counted after the publish the plugin side saw: waited for
    wait_until(lambda: counters.get("health.recovered") == 2, 10, f"two recoveries counted: {counters}")
    assert counters.get("health.host_path") == 2 and counters.get("health.recovered") == 2, counters
    assert counters.get("rescans.periodic", 0) == 0  # inotify told, not the timer


def test_the_reason_reaches_the_plugin_side_and_goes_when_healthy_again(
    short_tmp: Path, serve: Serve, runners: Callable[[Discovery], RoleRunner]
) -> None:
    """Device.reason on the queue: what the state file and `colad status` show, as discovery logs it."""
    command = probe_script(short_tmp)
    cfg = config(short_tmp, probe=(command,), probe_timeout=5.0, probe_interval=0.3)
    source = short_tmp / "host" / "data"
    (short_tmp / "verdicts" / "path").write_text("ok")
    (short_tmp / "verdicts" / "probe").write_text("overheated")
    (short_tmp / "devices" / "path").write_text(mount_file(source))
    (short_tmp / "devices" / "probe").write_text("")
    discovery, inbox = start(cfg, serve, runners)
    missing = f"mounts[0].host_path '{source}' does not exist"
    want = {"path": (UNHEALTHY, missing), "probe": (UNHEALTHY, "probe probe.sh: firmware says: overheated")}

    def reasons(expected: dict[str, tuple[str, str]]) -> bool:
        got = {i: (d.health, d.reason) for i, d in devices(inbox).items()}
        if got != expected:
            raise AssertionError(f"(health, reason) at the plugin side: {got}")
        return True

    wait_until(lambda: reasons(want), 10, f"the reasons {want}")
    assert discovery.watches[RESOURCE].health.reasons == {i: r for i, (_, r) in want.items()}
    source.parent.mkdir()
    source.write_text("")
    (short_tmp / "verdicts" / "probe").write_text("ok")
    wait_until(lambda: reasons({"path": (HEALTHY, ""), "probe": (HEALTHY, "")}), 10, "Healthy, no reason")
    (short_tmp / "verdicts" / "probe").write_text("fan stopped")
    source.unlink()
    want = {"path": (UNHEALTHY, missing), "probe": (UNHEALTHY, "probe probe.sh: firmware says: fan stopped")}
    wait_until(lambda: reasons(want), 10, f"the reasons again {want}")
    counters = discovery.stats.counters  # counted after the publish the plugin side saw: waited for
    wait_until(lambda: counters.get("health.probe") == 2, 10, f"two probe failures counted: {counters}")
    assert counters.get("health.host_path") == 2 and counters.get("health.probe") == 2, counters


def test_device_nodes_must_be_device_nodes_and_optional_entries_do_not_matter(
    short_tmp: Path, serve: Serve, runners: Callable[[Discovery], RoleRunner]
) -> None:
    cfg = config(short_tmp)
    nodes = short_tmp / "nodes"
    nodes.mkdir()
    os.mknod(nodes / "null", 0o600 | stat.S_IFCHR, os.makedev(1, 3))
    (nodes / "plain").write_text("")
    d = short_tmp / "devices"
    (d / "node").write_text(f'[[device_nodes]]\nhost_path = "{nodes / "null"}"\ncontainer_path = "/dev/x"\n')
    (d / "plain").write_text(f'[[device_nodes]]\nhost_path = "{nodes / "plain"}"\ncontainer_path = "/dev/x"\n')
    (d / "opt").write_text(mount_file(short_tmp / "missing", optional=True) + mount_file(nodes, container="/n"))
    _, inbox = start(cfg, serve, runners)
    wait_health(inbox, {"node": HEALTHY, "plain": UNHEALTHY, "opt": HEALTHY})
    opt = devices(inbox)["opt"]
    assert [m.container_path for m in opt.mounts] == ["/n"]  # the missing optional mount is left out
    (short_tmp / "missing").mkdir()
    wait_until(lambda: len(devices(inbox)["opt"].mounts) == 2, 10, "the optional mount once its source exists")
    (nodes / "null").unlink()
    wait_health(inbox, {"node": UNHEALTHY, "plain": UNHEALTHY, "opt": HEALTHY})


def probe_script(root: Path) -> str:
    """A probe whose behaviour per device is the content of <root>/verdicts/<device ID>."""
    script = root / "probe.sh"
    script.write_text(
        "#!/bin/sh\n"
        f'v=$(cat "{root}/verdicts/$COLA_DEVICE_ID" 2>/dev/null)\n'
        'case "$v" in\n'
        "  ok) exit 0 ;;\n"
        "  hang) echo still thinking; exec sleep 60 ;;\n"
        '  *) echo "firmware says: $v"; exit 3 ;;\n'
        "esac\n"
    )
    script.chmod(0o755)
    (root / "verdicts").mkdir()
    return str(script)


def test_probes_healthy_failing_hanging_flapping_and_no_delay(
    short_tmp: Path, serve: Serve, runners: Callable[[Discovery], RoleRunner]
) -> None:
    command = probe_script(short_tmp)
    cfg = config(short_tmp, probe=(command,), probe_timeout=1.5, probe_interval=0.3)
    verdicts = short_tmp / "verdicts"
    for name, verdict in (("ok", "ok"), ("bad", "overheated"), ("hung", "hang"), ("flap", "ok")):
        (verdicts / name).write_text(verdict)
        (short_tmp / "devices" / name).write_text("")
    discovery, inbox = start(cfg, serve, runners)
    wait_health(inbox, {"ok": HEALTHY, "bad": UNHEALTHY, "hung": UNHEALTHY, "flap": HEALTHY})
    reasons = discovery.watches[RESOURCE].health.reasons
    assert reasons["bad"] == "probe probe.sh: firmware says: overheated", reasons
    wait_until(lambda: reasons.get("hung", "").startswith("probe probe.sh: timed out after 1.5s"), 10, "a timeout")
    # While "hung" hangs again and again, a new device file reaches the plugin at once.
    (verdicts / "new").write_text("ok")
    began = time.monotonic()
    (short_tmp / "devices" / "new").write_text("")
    wait_until(lambda: "new" in devices(inbox), 10, "the new device")
    took = time.monotonic() - began
    assert took < 1.0, f"a new device took {took:.2f}s to reach the plugin while a probe hung"
    wait_health(inbox, {"ok": HEALTHY, "bad": UNHEALTHY, "hung": UNHEALTHY, "flap": HEALTHY, "new": HEALTHY})
    for _ in range(3):  # flapping: every turn reaches the plugin
        (verdicts / "flap").write_text("flaky")
        wait_until(lambda: devices(inbox)["flap"].health == UNHEALTHY, 10, "flap Unhealthy")
        (verdicts / "flap").write_text("ok")
        wait_until(lambda: devices(inbox)["flap"].health == HEALTHY, 10, "flap Healthy")
    assert discovery.stats.counters.get("health.probe", 0) >= 5  # bad, hung, flap x3
    assert discovery.health.runner.in_flight <= cfg.probe_max_in_flight


def test_the_cdi_spec_and_the_feature_file_follow_every_change(
    short_tmp: Path, serve: Serve, runners: Callable[[Discovery], RoleRunner]
) -> None:
    cfg = config(short_tmp, replicas=2)
    d = short_tmp / "devices"
    (d / "dev-0").write_text('[envs]\nMODE = "fast"\n')
    (d / "dev-1").write_text(mount_file(short_tmp / "absent"))
    spec_path = short_tmp / "cdi" / "colad-example.com-cola.json"
    features = short_tmp / "features.d" / "colad"
    _, inbox = start(cfg, serve, runners)

    def spec_names() -> list[str]:
        return sorted(dev["name"] for dev in json.loads(spec_path.read_text())["devices"])

    want = ["dev-0::0", "dev-0::1", "dev-1::0", "dev-1::1"]
    wait_until(lambda: spec_path.exists() and spec_names() == want, 10, "the spec")
    spec = json.loads(spec_path.read_text())
    assert spec["kind"] == RESOURCE
    edits = {dev["name"]: dev["containerEdits"] for dev in spec["devices"]}
    assert "MODE=fast" in edits["dev-0::0"]["env"]
    wait_until(features.exists, 10, "the feature file (written at the end of the turn, after the spec)")
    labels = nfd_labels(features.read_bytes())
    assert labels["example.com-cola.devices"] == "2" and labels["example.com-cola.healthy"] == "1", labels
    (d / "dev-2").write_text("")
    (d / "dev-0").write_text('[envs]\nMODE = "slow"\n')
    wait_until(lambda: len(spec_names()) == 6, 10, "dev-2 in the spec")

    def first_env() -> list[str]:
        return list(json.loads(spec_path.read_text())["devices"][0]["containerEdits"]["env"])

    wait_until(lambda: "MODE=slow" in first_env(), 10, "MODE=slow in the spec")
    (short_tmp / "absent").mkdir()
    wait_until(lambda: nfd_labels(features.read_bytes())["example.com-cola.healthy"] == "3", 10, "healthy=3")
    assert "# +expiry-time=" in features.read_text()
    assert not [n for n in os.listdir(spec_path.parent) if n != spec_path.name]  # no temporary left behind


def test_a_reload_moves_the_spec_and_the_feature_file(
    short_tmp: Path, serve: Serve, runners: Callable[[Discovery], RoleRunner]
) -> None:
    cfg = config(short_tmp)
    (short_tmp / "devices" / "dev-0").write_text(mount_file(short_tmp / "absent"))
    old_spec = short_tmp / "cdi" / "colad-example.com-cola.json"
    old_features = short_tmp / "features.d" / "colad"
    _, inbox = serve(cfg.queue_socket)
    discovery = Discovery(cfg)
    runner = runners(discovery)
    begin(discovery)
    runner.start()
    wait_until(lambda: old_spec.exists() and old_features.exists(), 10, "the spec and the feature file")
    runner.stop()
    new = dataclasses.replace(
        cfg,
        cdi_spec_dir=str(short_tmp / "cdi2"),
        nfd_features_file=str(short_tmp / "nfd2" / "colad"),
        nfd_label_prefix="example.com",
        host_path_check=False,
    )
    discovery.cfg = new
    discovery.apply_config(cfg)
    runner.start()
    wait_until(lambda: (short_tmp / "cdi2" / old_spec.name).exists(), 10, "the spec in the new directory")
    # The spec goes before the publish, the feature file at the end of the turn.
    wait_until(lambda: (short_tmp / "nfd2" / "colad").exists(), 10, "the feature file at its new path")
    assert not old_spec.exists() and not old_features.exists()
    wait_health(inbox, {"dev-0": HEALTHY})  # host paths are no longer checked
    labels = nfd_labels((short_tmp / "nfd2" / "colad").read_bytes())
    want = {"present": "true", "devices": "1", "healthy": "1"}
    assert labels == {f"example.com/cola.{k}": v for k, v in want.items()}


@pytest.mark.parametrize(
    "seed", [1515, 7, 2026, 13]
)  # 1515: a watched directory moved away, then made again; 13: the same, while its watch changed mask
def test_host_path_health_equals_a_fresh_check_after_random_file_operations(
    short_tmp: Path, serve: Serve, runners: Callable[[Discovery], RoleRunner], seed: int
) -> None:
    """The property: whatever happens to the host paths, once inotify has told, the advertised
    set is what hostpaths.check() of the device files says now (no watch missed, nothing stale)."""
    rng = random.Random(seed)
    cfg = config(short_tmp)
    host = short_tmp / "host"
    dirs = [Path(*parts) for parts in (("a",), ("a", "b"), ("a", "b", "c"), ("d",), ("d", "e"))]
    leaves = [host / d / name for d in dirs for name in ("x", "y")]
    texts = {}
    for i in range(4):
        chosen = rng.sample(leaves, 2)
        optional = "optional = true\n" if i == 3 else ""
        texts[f"dev-{i}"] = "".join(
            f'[[mounts]]\nhost_path = "{p}"\ncontainer_path = "/m{j}"\n{optional if j else ""}'
            for j, p in enumerate(chosen)
        )
        (short_tmp / "devices" / f"dev-{i}").write_text(texts[f"dev-{i}"])
    _, inbox = start(cfg, serve, runners)

    def expected() -> dict[str, Device]:
        raw = DeviceSet.of(devicefile.parse(n, t.encode()) for n, t in texts.items())
        checked = hostpaths.check(raw)
        why = checked.by_id
        return {d.device_id: dataclasses.replace(d, reason=why.get(d.device_id, "")) for d in checked.devices}

    def operate() -> str:
        target = host / rng.choice(dirs) / rng.choice(("x", "y", ""))
        kind = rng.choice(("make", "make", "remove", "move"))
        if kind == "make":
            target.parent.mkdir(parents=True, exist_ok=True)
            if target.name in ("x", "y") and not target.exists():
                target.write_text("")
        elif kind == "remove" and target.exists():
            if target.is_dir():
                shutil.rmtree(target)
            else:
                target.unlink()
        elif kind == "move" and target.exists():  # away, then gone: the watched directory itself may move
            moved = short_tmp / f"moved-{len(done)}"
            target.rename(moved)
        return f"{kind} {target.relative_to(short_tmp)}"

    def agrees(want: dict[str, Device]) -> bool:
        # As the wire carries them (an entry's `optional` stays in discovery).
        got = {i: device_wire.device_entry(d) for i, d in devices(inbox).items()}
        want = {i: device_wire.device_entry(d) for i, d in want.items()}  # type: ignore[misc]
        if got != want:
            wrong = {i: (got.get(i), want[i]) for i in want if got.get(i) != want[i]}
            raise AssertionError(f"advertised (got, want): {wrong}")
        return True

    done: list[str] = []
    for _ in range(OPERATIONS):
        done.append(operate())
        want = expected()
        wait_until(lambda w=want: agrees(w), 10, f"the fresh check after {done[-5:]}")  # type: ignore[misc]
