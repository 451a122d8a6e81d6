"""The one health rule (health.rule.assess) and what `colad status` makes of it and of a state file.

/healthz is 200 exactly when `colad status` would exit 0: both are the same `Verdict`. Each row
of the tables below is one thing that makes colad unhealthy, or only "on its way"; the state file
is judged by who wrote it (pid, start tick, boot ID) and how long ago, never as healthy.
"""

from __future__ import annotations

import json
import os
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from colad.cli import status
from colad.core import constants
from colad.health.rule import PluginSnapshot, RoleView, assess, degraded, readiness, role_view, verdict
from colad.outputs import statefile
from colad.outputs.statefile import ListCut, PluginState, ReloadResult, ResourceState
from colad.runtime import procid

pytestmark = pytest.mark.unit
NOW = 1000.0
GOOD = ResourceState(name="x.io/cola", state="registered", registered=True, devices=2, healthy=2, streams=1)


def snapshot(*resources: ResourceState, **fields: Any) -> PluginSnapshot:
    state_fields = {k: fields.pop(k) for k in ("reload",) if k in fields}
    state = PluginState(pid=1, resources=resources or (GOOD,), **state_fields)
    return PluginSnapshot(state, discovery_heard=NOW - 1, rescan_interval=30.0, **fields)


def info(name: str, state: str) -> dict[str, object]:
    return {"name": name, "statename": state}


RUNNING = [info("plugin", "RUNNING"), info("discovery", "RUNNING"), info("kubelet-watch", "RUNNING")]


@pytest.mark.parametrize(
    ("infos", "watchdog", "problems", "starting"),
    [
        (RUNNING, "", (), ()),
        ([*RUNNING[:2], info("kubelet-watch", "STARTING")], "", (), ("kubelet-watch",)),
        ([*RUNNING[:2], info("kubelet-watch", "STOPPED")], "", ("kubelet-watch is STOPPED",), ()),
        (
            [info("plugin", "RUNNING"), info("discovery", "FATAL")],
            "",
            ("kubelet-watch is MISSING", "discovery is FATAL"),
            (),
        ),
        ([*RUNNING[1:], info("plugin", "BACKOFF")], "", ("plugin is BACKOFF",), ()),
        (RUNNING, "no watchdog", ("no watchdog",), ()),
    ],
    ids=["all-running", "starting-is-no-problem", "stopped", "missing-and-fatal", "backoff", "no-watchdog"],
)
def test_the_role_rule(
    infos: list[dict[str, object]], watchdog: str, problems: tuple[str, ...], starting: tuple[str, ...]
) -> None:
    assert role_view(infos, watchdog=watchdog) == RoleView(problems, starting)


BACKOFF = replace(GOOD, state="backoff", registered=False, last_error="kubelet.sock absent")
REFUSED = ReloadResult(at=1.0, ok=False, reason="bad key")
UNHEALTHY = [
    ("not-registered", snapshot(BACKOFF), None, "not registered: backoff (kubelet.sock absent)"),
    ("list-cut", snapshot(replace(GOOD, cut=ListCut(10, 100, 5))), None, "list cut to 95 of 100"),
    ("role-down", snapshot(), RoleView(("discovery is FATAL",)), "discovery is FATAL"),
    ("discovery-silent", replace(snapshot(), discovery_heard=NOW - 500), None, "discovery silent for 500s"),
    ("queue", snapshot(queue_problem="queue.sock is a FIFO"), None, "queue not listening: queue.sock is a FIFO"),
    ("state-file", snapshot(state_file_problem="state file not written"), None, "state file not written"),
    ("reload-refused", snapshot(reload=REFUSED), None, "last reload refused, the running config stays: bad key"),
]


@pytest.mark.parametrize(("pub", "roles", "needle"), [row[1:] for row in UNHEALTHY], ids=[row[0] for row in UNHEALTHY])
def test_each_problem_makes_healthz_and_status_unhealthy(
    pub: PluginSnapshot, roles: RoleView | None, needle: str
) -> None:
    found = assess(pub, roles, NOW)
    assert not found.ok and any(needle in p for p in found.problems), found
    assert found.waiting == ()
    assert verdict(pub, roles, NOW) == (False, "; ".join(found.problems))
    assert status.exit_code({"running": True, "problems": list(found.problems), "waiting": []}) == 1


WAITING = [
    ("starting", snapshot(replace(GOOD, state="starting", registered=False, streams=0)), None),
    ("registering", snapshot(replace(GOOD, state="registering", registered=False, streams=0)), None),
    ("no-stream-yet", snapshot(replace(GOOD, streams=0)), None),
    ("plugin-in-startsecs", snapshot(BACKOFF), RoleView((), ("plugin",))),
]


@pytest.mark.parametrize(("pub", "roles"), [row[1:] for row in WAITING], ids=[row[0] for row in WAITING])
def test_on_its_way_is_waiting_not_degraded(pub: PluginSnapshot, roles: RoleView | None) -> None:
    found = assess(pub, roles, NOW)
    assert not found.ok and found.problems == () and found.waiting, found
    assert verdict(pub, roles, NOW)[0] is False  # /healthz: 503 all the same
    assert status.exit_code({"running": True, "problems": [], "waiting": list(found.waiting)}) == 4


def test_healthy_is_200_and_exit_0_and_starting_roles_are_not_a_problem() -> None:
    found = assess(snapshot(), RoleView((), ("discovery",)), NOW)
    assert found.ok and found.line() == "ok: registered as x.io/cola, 2 devices"
    assert status.exit_code({"running": True, "problems": [], "waiting": []}) == 0
    unasked = assess(snapshot(), None, NOW, unasked="status socket gone")
    assert not unasked.ok and unasked.problems == ("status socket gone",)


# --- the state file: who wrote it, and when --------------------------------------------------


def test_a_written_state_file_names_its_writer_and_age(tmp_path: Path) -> None:
    path = str(tmp_path / "plugin.json")
    assert statefile.write(path, PluginState(pid=os.getpid(), resources=(GOOD,))) == ""
    stamp = statefile.stamp_of(statefile.read_raw(path))
    assert stamp.writer == procid.current() and procid.alive(stamp.writer)
    age = stamp.age()
    assert age is not None and 0 <= age < 5


@pytest.mark.parametrize("wall", [0.0, 4102444800.0], ids=["clock-stepped-back", "clock-stepped-ahead"])
def test_the_age_of_a_state_file_does_not_follow_the_wall_clock(tmp_path: Path, wall: float) -> None:
    body = statefile.stamped(PluginState(pid=os.getpid(), resources=(GOOD,)))
    body["written"] = {**body["written"], "wall": wall}  # type: ignore[dict-item]
    age = statefile.stamp_of(body).age()
    assert age is not None and 0 <= age < 5
    other_boot = {**body, "writer": {**body["writer"], "boot_id": "another-boot"}}  # type: ignore[dict-item]
    assert statefile.stamp_of(other_boot).age() is None  # another boot's clock: no age at all


def _stamped_file(path: Path, **writer: object) -> None:
    body = statefile.stamped(PluginState(pid=os.getpid(), resources=(GOOD,)))
    body["writer"] = {**body["writer"], **writer}  # type: ignore[dict-item]
    path.write_text(json.dumps(body))


DEAD_PID = 4 * 1024 * 1024 + 1  # over Linux's PID_MAX_LIMIT: no process has it


@pytest.mark.parametrize(
    ("writer", "note"),
    [
        ({}, "the running plugin"),
        ({"boot_id": "another-boot"}, "of an earlier boot"),
        ("dead", "which has exited"),
        ({"start": 1}, "which has exited"),  # the pid reused by another process
        ("other-plugin", "not supervisord's plugin"),
        ("no-writer", "did not record its writer"),
    ],
    ids=["this-plugin", "earlier-boot", "dead-writer", "pid-reused", "another-pid", "older-colad"],
)
def test_status_without_an_answer_shows_the_file_as_not_live_and_never_healthy(
    tmp_path: Path, writer: object, note: str
) -> None:
    from tests.integration.support import make_config

    cfg = make_config(tmp_path)
    path = Path(cfg.plugin_state_file)
    path.parent.mkdir(parents=True)
    plugin_pid = os.getpid()
    if writer == "dead":
        _stamped_file(path, pid=DEAD_PID)
    elif writer == "other-plugin":
        _stamped_file(path)
        plugin_pid = 1
    elif writer == "no-writer":
        path.write_text(json.dumps(statefile.to_json(PluginState(pid=os.getpid(), resources=(GOOD,)))))
    else:
        assert isinstance(writer, dict)
        _stamped_file(path, **writer)
    report: dict[str, Any] = {
        "processes": {"plugin": {"state": "RUNNING", "pid": plugin_pid, "uptime": 1}},
        "problems": [],
        "waiting": [],
    }
    status._from_file(cfg, report, RoleView(), "no answer within 3s")
    assert report["source"]["live"] is False and note in report["source"]["writer"], report["source"]
    assert status.exit_code({"running": True, **report}) == 1
    assert any("plugin not answering: no answer within 3s" in p for p in report["problems"])
    text = status.render_status({**report, "in_use": None})
    assert (
        "NOT LIVE" in text
        and "registered: yes (registered since" in text
        and "; from the state file, not live)" in text
    ), text


@pytest.mark.parametrize("content", ["", '{"pid": 1, "resour', "[]"], ids=["empty", "torn", "foreign"])
def test_an_unreadable_state_file_is_no_source_and_no_health(tmp_path: Path, content: str) -> None:
    from tests.integration.support import make_config

    cfg = make_config(tmp_path)
    Path(cfg.plugin_state_file).parent.mkdir(parents=True)
    Path(cfg.plugin_state_file).write_text(content)
    report: dict[str, Any] = {
        "processes": {"plugin": {"state": "STARTING", "pid": 5, "uptime": 1}},
        "problems": [],
        "waiting": [],
    }
    status._from_file(cfg, report, RoleView(), "connection refused")
    assert report["source"]["live"] is False and "plugin.json" in report["source"]["note"]
    assert report.get("plugin") is None
    assert status.exit_code({"running": True, **report}) == 4  # the plugin is in its startsecs: waiting
    assert "none: the plugin does not answer" in status.render_status({**report, "in_use": None})


@pytest.mark.parametrize(
    ("counters", "said"),
    [
        pytest.param((), "", id="no-counters"),
        pytest.param(((constants.INOTIFY_DEGRADED + "max_user_watches", 0),), "", id="left"),
        pytest.param(((constants.INOTIFY_LIMIT_REACHED, 3),), "", id="only-the-count"),
        pytest.param(
            ((constants.INOTIFY_DEGRADED + "max_user_instances", 1),),
            "discovery polls every 1s (inotify limit fs.inotify.max_user_instances reached)",
            id="instances",
        ),
    ],
)
def test_degraded_reads_the_roles_stats(counters: tuple[tuple[str, int], ...], said: str) -> None:
    assert degraded("discovery", counters) == said


def test_degraded_is_healthy_and_ready_and_says_so() -> None:
    resource = ResourceState(
        name="example.com/dev", registered=True, streams=1, have_devices=True, list_sent=True, kubelet="k", devices=2
    )
    text = "discovery polls every 1s (inotify limit fs.inotify.max_user_watches reached)"
    state = PluginState(pid=1, resources=(resource,), kubelet="k", degraded=(text,))
    found = PluginSnapshot(state, discovery_heard=0.0, rescan_interval=30.0)
    ok, reason = verdict(found, RoleView(), now=1.0)
    assert ok and reason.endswith("; degraded: " + text), reason
    ready, why = readiness(found, now=1.0)
    assert ready and why.endswith("; degraded: " + text), why
