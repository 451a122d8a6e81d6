"""colad.statefile: the plugin's state file round-trips, keeps the keys its readers know, and fails typed.

Written with the real writer into tmp_path and read back with the real reader;
the flat one-resource shape from before [[resources]] is still understood.
"""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

import pytest

from colad import statefile
from colad.statefile import ListCut, PluginState, ReloadResult, ResourceState, StateFileError, StateFileMissing

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
    )
    path = str(tmp_path / "state" / "plugin.json")
    assert statefile.write(path, state)
    assert statefile.read(path) == state
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    assert stat.S_IMODE(os.stat(tmp_path / "state").st_mode) == 0o700
    assert not os.path.exists(path + ".tmp")


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
    assert statefile.write(str(blocker / "state" / "plugin.json"), PluginState(pid=1)) is False
    assert statefile.write_json(str(tmp_path / "x.json"), {"not": object()}) is False
