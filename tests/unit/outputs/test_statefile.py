"""colad.outputs.statefile: the plugin's state file round-trips, keeps the keys its readers know, and fails typed.

Written with the real writer into tmp_path and read back with the real reader;
the flat one-resource shape from before [[resources]] is still understood.
"""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

import pytest

from colad.outputs import statefile
from colad.outputs.statefile import (
    ListCut,
    PluginState,
    ReloadResult,
    ResourceState,
    SliceStatus,
    StateFileError,
    StateFileMissing,
)

pytestmark = pytest.mark.unit

COLA = ResourceState(
    name="example.com/cola",
    device_dir="/d/cola",
    replicas=2,
    state="registered",
    registered=True,
    endpoint="colad-1.sock",
    devices=4,
    healthy=3,
    streams=1,
    open_streams=1,
    since=10.5,
    last_registered=11.0,
    cut=ListCut(size=100, wanted=4, dropped=0),
)
PEPSI = ResourceState(name="example.com/pepsi", state="backoff", last_error="kubelet refused", since=12.0)
# The keys `colad status`, `colad check`, `colad reload` and the e2e tests read (plugin.write_state's).
TOP_KEYS = {
    "pid",
    "state",
    "registered",
    "resource_name",
    "endpoint",
    "devices",
    "healthy",
    "streams",
    "since",
    "last_error",
    "metrics_address",
    "resources",
    "config_file",
    "reload",
}
RESOURCE_KEYS = {
    "name",
    "device_dir",
    "replicas",
    "state",
    "registered",
    "endpoint",
    "devices",
    "healthy",
    "streams",
    "since",
    "last_error",
}


def test_round_trip_through_the_file(tmp_path: Path) -> None:
    state = PluginState(
        pid=42,
        resources=(COLA, PEPSI),
        metrics_address="127.0.0.1:9400",
        config_file="/etc/colad.toml",
        reload=ReloadResult(at=5.0, ok=True, added=("a",), deferred=("run_dir",)),
        degraded=("discovery polls every 1s (inotify limit fs.inotify.max_user_watches reached)",),
    )
    path = str(tmp_path / "state" / "plugin.json")
    assert statefile.write(path, state) == ""
    assert statefile.read(path) == state
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    assert stat.S_IMODE(os.stat(tmp_path / "state").st_mode) == 0o700
    assert os.listdir(tmp_path / "state") == ["plugin.json"]  # no temporary file left


def test_flat_keys_describe_the_first_resource_not_registered() -> None:
    body = statefile.to_json(PluginState(pid=1, resources=(COLA, PEPSI)))
    assert TOP_KEYS <= set(body)
    assert all(RESOURCE_KEYS <= set(r) for r in body["resources"])  # type: ignore[attr-defined]
    assert (body["state"], body["registered"], body["last_error"], body["since"]) == (
        "backoff",
        False,
        "kubelet refused",
        12.0,
    )
    assert (body["resource_name"], body["endpoint"]) == ("example.com/cola", "colad-1.sock")
    assert (body["devices"], body["healthy"], body["streams"]) == (4, 3, 1)
    assert body["reload"] == {}


def test_a_refused_reload_says_why_and_nothing_else() -> None:
    body = statefile.to_json(PluginState(pid=1, reload=ReloadResult(at=1.0, ok=False, reason="bad key")))
    assert body["reload"] == {"at": 1.0, "ok": False, "reason": "bad key"}


def test_legacy_one_resource_shape_is_read(tmp_path: Path) -> None:
    path = tmp_path / "plugin.json"
    path.write_text(
        json.dumps(
            {
                "pid": 7,
                "state": "registered",
                "registered": True,
                "resource_name": "example.com/cola",
                "endpoint": "/k/colad-9.sock",
            }
        )
    )
    state = statefile.read(str(path))
    assert state.resources[0].name == "example.com/cola"
    assert state.by_endpoint("colad-9.sock") == state.resources[0]
    assert state.by_endpoint("colad-8.sock") is None


def test_missing_file_is_its_own_error(tmp_path: Path) -> None:
    with pytest.raises(StateFileMissing):
        statefile.read(str(tmp_path / "absent.json"))
    assert statefile.read_reload(str(tmp_path / "absent.json")) is None


@pytest.mark.parametrize(
    "text",
    [
        pytest.param("{", id="half-written"),
        pytest.param("[]", id="not-an-object"),
        pytest.param('{"pid": "7"}', id="pid-a-string"),
        pytest.param('{"pid": true}', id="pid-a-bool"),
        pytest.param('{"pid": 1, "resources": {}}', id="resources-not-a-list"),
        pytest.param('{"pid": 1, "resources": [1]}', id="resource-not-an-object"),
        pytest.param('{"pid": 1, "resources": [{"devices": 1.5}]}', id="count-a-float"),
        pytest.param('{"pid": 1, "reload": {"ok": true, "added": "a"}}', id="reload-names-a-string"),
        pytest.param("\xff", id="not-utf8"),
    ],
)
def test_foreign_files_raise_one_typed_error_naming_the_path(tmp_path: Path, text: str) -> None:
    path = tmp_path / "plugin.json"
    path.write_bytes(text.encode("latin-1"))
    with pytest.raises(StateFileError, match="plugin.json"):
        statefile.read(str(path))


def test_write_never_raises(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("")
    assert "Not a directory" in statefile.write(str(blocker / "state" / "plugin.json"), PluginState(pid=1))
    assert statefile.write_json(str(tmp_path / "x.json"), {"not": object()}) is False


# --- the Unhealthy devices and why -----------------------------------------------------


def test_unhealthy_devices_and_their_reasons_round_trip(tmp_path: Path) -> None:
    from colad.core.constants import UNHEALTHY
    from colad.core.devices import Device, DeviceSet, replicate

    physical = DeviceSet.of(
        [
            Device("cola1"),
            Device("cola2", UNHEALTHY, reason="device_nodes[0].host_path /dev/cola2 does not exist"),
            Device("cola3", UNHEALTHY, problem="line 2: bad key"),
            Device("cola4", UNHEALTHY),
        ]
    )
    sick = statefile.SickList.of(replicate(physical, 3))  # replicas are one physical device
    assert sick == statefile.SickList(
        (
            statefile.SickDevice("cola2", "device_nodes[0].host_path /dev/cola2 does not exist"),
            statefile.SickDevice("cola3", "line 2: bad key", malformed=True),
            statefile.SickDevice("cola4", ""),
        )
    )
    state = PluginState(pid=3, resources=(ResourceState(name="example.com/cola", sick=sick), PEPSI))
    path = str(tmp_path / "plugin.json")
    assert statefile.write(path, state) == ""
    assert statefile.read(path) == state
    body = json.loads(Path(path).read_text())
    assert body["resources"][0]["unhealthy_devices"][1] == {
        "id": "cola3",
        "reason": "line 2: bad key",
        "malformed": True,
    }
    assert body["resources"][1]["unhealthy_devices"] == [] and body["resources"][1]["unhealthy_more"] == 0


def test_the_unhealthy_list_is_bounded_at_the_largest_list(tmp_path: Path) -> None:
    from colad.core.constants import UNHEALTHY
    from colad.core.devices import MAX_REASON_BYTES, Device, DeviceSet

    # 226,600 devices (the most whose list fits the kubelet's 4 MiB), all Unhealthy with the longest reason.
    count = 226_600
    advertised = DeviceSet.of(Device(str(i), UNHEALTHY, reason="r" * MAX_REASON_BYTES) for i in range(count))
    sick = statefile.SickList.of(advertised)
    assert len(sick.listed) == statefile.MAX_LISTED_UNHEALTHY and sick.more == count - statefile.MAX_LISTED_UNHEALTHY
    assert [d.device_id for d in sick.listed] == sorted(str(i) for i in range(count))[: statefile.MAX_LISTED_UNHEALTHY]
    assert all(len(d.reason) == statefile.MAX_LISTED_REASON and d.reason.endswith("...") for d in sick.listed)
    assert statefile.SickList.of(advertised) is sick  # once per set: publishing again costs nothing
    path = str(tmp_path / "plugin.json")
    assert statefile.write(path, PluginState(pid=3, resources=(ResourceState(name="x.io/y", sick=sick),))) == ""
    assert os.path.getsize(path) < 20_000
    assert statefile.read(path).resources[0].sick == sick


@pytest.mark.parametrize(
    "entry",
    [
        pytest.param('"unhealthy_devices": {}', id="not-a-list"),
        pytest.param('"unhealthy_devices": ["cola1"]', id="entry-not-an-object"),
        pytest.param('"unhealthy_devices": [{"id": 1}]', id="id-not-a-string"),
        pytest.param('"unhealthy_more": "7"', id="more-not-a-number"),
    ],
)
def test_a_foreign_unhealthy_list_is_a_typed_error(tmp_path: Path, entry: str) -> None:
    path = tmp_path / "plugin.json"
    path.write_text('{"pid": 1, "resources": [{"name": "x.io/y", ' + entry + "}]}")
    with pytest.raises(StateFileError, match="plugin.json"):
        statefile.read(str(path))


def test_status_prints_a_line_per_unhealthy_device() -> None:
    from colad.cli import status

    sick = statefile.SickList(
        (
            statefile.SickDevice("cola2", "probe /bin/check exited 1: \x1b[31mfan stopped"),
            statefile.SickDevice("cola3", "line 2: bad key", malformed=True),
            statefile.SickDevice("cola4"),
        ),
        more=12,
    )
    plugin = statefile.to_json(PluginState(pid=3, resources=(ResourceState(name="x.io/y", sick=sick),)))
    text = status.render_status({"processes": {}, "plugin": plugin, "problems": []})
    assert text.splitlines()[-4:] == [
        "unhealthy:  cola2: probe /bin/check exited 1: \\x1b[31mfan stopped",
        "unhealthy:  cola3: malformed device file: line 2: bad key",
        "unhealthy:  cola4: no reason given",
        "unhealthy:  ... and 12 more (the state file lists the first by ID)",
    ]


def test_check_shows_why_each_unhealthy_device_is() -> None:
    from colad.cli import check

    sick = statefile.SickList(
        (statefile.SickDevice("cola2", "probe fan: stopped\x07"), statefile.SickDevice("b", "x", True))
    )
    state = PluginState(pid=3, resources=(ResourceState(name="x.io/y", endpoint="colad-1.sock", sick=sick),))
    report = check.SocketReport(
        "/k/colad-1.sock",
        devices=[
            check.DeviceReport("cola1", "Healthy", []),
            check.DeviceReport("cola2::1", "Unhealthy", []),
            check.DeviceReport("b", "Unhealthy", []),
            check.DeviceReport("c", "Unhealthy", []),  # beyond the state file's 50: no reason known
        ],
    )
    check.add_reasons(report, state, "colad-1.sock")
    assert [d.why for d in report.devices or []] == ["", "probe fan: stopped\x07", "malformed device file: x", ""]
    text = check.render_reports([report], "ok")
    assert "why: probe fan: stopped\\x07" in text and "why: malformed device file: x" in text
    assert text.count("why:") == 2
    check.add_reasons(report, state, "colad-9.sock")  # another socket's resource: nothing changes
    assert report.devices is not None and report.devices[1].why == "probe fan: stopped\x07"


def test_dra_mode_is_written_only_in_dra_mode_and_read_back() -> None:
    assert "dra" not in statefile.to_json(PluginState(pid=1))
    state = PluginState(
        pid=1,
        dra_driver="cola.myway5.com",
        dra_registration="registered",
        dra_slices=SliceStatus(wanted=True, published=True, last_error="list: refused", slices=1, devices=2),
        dra_claims=3,
    )
    written = statefile.to_json(state)
    assert written["dra"] == {
        "driver": "cola.myway5.com",
        "registration": "registered",
        "registration_error": "",
        "problem": "",
        "claims_prepared": 3,
        "slices": {
            "wanted": True,
            "published": True,
            "pending": False,
            "current": True,
            "failing": "",
            "last_error": "list: refused",
            "count": 1,
            "devices": 2,
        },
    }
    assert statefile.from_json(json.loads(json.dumps(written))) == state
    short = {"driver": "cola.myway5.com", "registration": "serving"}  # a writer without the slices' part
    assert statefile.from_json({**written, "dra": short}).dra_slices == SliceStatus()
    with pytest.raises(StateFileError, match="dra"):
        statefile.from_json({**written, "dra": ["registered"]})
    with pytest.raises(StateFileError, match="dra.slices"):
        statefile.from_json({**written, "dra": {**short, "slices": ["current"]}})
