"""Allocate's CDI answer by mode (tables), PreStartContainer's plan and runs, and the /readyz verdict.

allocation.allocate with cdi_mode "off" / "both" / "only"; prestart.plan (which command for which
devices, arguments and environment) and prestart.run on real processes (exit, first line, timeout
with a left-behind child, bounded output); rule.readiness over published snapshots.
"""

from __future__ import annotations

import time
from dataclasses import replace

import pytest

from colad.core.allocation import allocate
from colad.core.devices import Device, DeviceNode, DeviceSet, Mount
from colad.core.errors import AllocationError
from colad.health.rule import PluginSnapshot, readiness
from colad.jobs import prestart
from colad.outputs.statefile import ListCut, PluginState, ResourceState

pytestmark = pytest.mark.unit
R = "myway5.com/cola"
NODE = DeviceNode("/dev/cola1", "/dev/cola1", "rw")
MOUNT = Mount("/srv/fw", "/fw", True)
SET = DeviceSet.of(
    [
        Device("cola1", device_nodes=(NODE,), mounts=(MOUNT,), envs=(("FW", "1"),), annotations=(("a.io/k", "v"),)),
        Device("cola2", envs=(("FW", "2"),), cdi_devices=("vendor.com/gpu=0",)),
        Device("cola3-", envs=(("ODD", "yes"),)),  # ends in '-': not a CDI device name, so not in the spec
        Device("cola4::0"),
        Device("cola4::1"),
    ]
)

# mode, requested, (envs, device_nodes, mounts, annotations, cdi_devices)
TABLE = [
    pytest.param(
        "off",
        ["cola1", "cola2"],
        ({"FW": "1,2", "COLA_DEVICES": "cola1,cola2"}, (NODE,), (MOUNT,), {"a.io/k": "v"}, ("vendor.com/gpu=0",)),
        id="off-is-todays-answer",
    ),
    pytest.param(
        "both",
        ["cola1", "cola2"],
        (
            {"FW": "1,2", "COLA_DEVICES": "cola1,cola2"},
            (NODE,),
            (MOUNT,),
            {"a.io/k": "v"},
            (f"{R}=cola1", f"{R}=cola2", "vendor.com/gpu=0"),
        ),
        id="both-adds-cdi-names-first",
    ),
    pytest.param(
        "only",
        ["cola1", "cola2"],
        ({"COLA_DEVICES": "cola1,cola2"}, (), (), {"a.io/k": "v"}, (f"{R}=cola1", f"{R}=cola2", "vendor.com/gpu=0")),
        id="only-cdi-names-and-colas-own",
    ),
    pytest.param(
        "only",
        ["cola3-", "cola1"],
        ({"ODD": "yes", "COLA_DEVICES": "cola3-,cola1"}, (), (), {"a.io/k": "v"}, (f"{R}=cola1",)),
        id="only-keeps-the-classic-answer-of-a-device-without-a-cdi-name",
    ),
    pytest.param(
        "both",
        ["cola3-"],
        ({"ODD": "yes", "COLA_DEVICES": "cola3-"}, (), (), {}, ()),
        id="both-no-name-for-a-device-outside-the-spec",
    ),
    pytest.param(
        "only",
        ["cola4::1", "cola4::0"],
        (
            {"COLA_DEVICES": "cola4", "COLA_REPLICAS": "cola4::1,cola4::0"},
            (),
            (),
            {},
            (f"{R}=cola4::1", f"{R}=cola4::0"),
        ),
        id="only-replicas-keep-colas-lists-in-request-order",
    ),
]


@pytest.mark.parametrize("mode, requested, expected", TABLE)
def test_allocate_by_cdi_mode(mode: str, requested: list[str], expected: tuple[object, ...]) -> None:
    result = allocate(SET, requested, resource_name=R, cdi_mode=mode)
    assert (result.envs, result.device_nodes, result.mounts, result.annotations, result.cdi_devices) == expected
    assert result.device_ids == tuple(requested)


def test_no_cdi_names_when_the_resource_is_not_a_cdi_kind() -> None:
    result = allocate(SET, ["cola1"], resource_name="1x.example/cola", cdi_mode="both")
    assert result.cdi_devices == () and result.device_nodes == (NODE,)


# mode, what the spec file lists, requested -> (cdi_devices, device_nodes, FW env, cdi_unlisted)
LISTED = [
    pytest.param(
        "both",
        {"cola1", "cola2"},
        ["cola1", "cola2"],
        ((f"{R}=cola1", f"{R}=cola2", "vendor.com/gpu=0"), (NODE,), "1,2", ()),
        id="both-all-listed",
    ),
    pytest.param(
        "both",
        {"cola2"},
        ["cola1", "cola2"],
        ((f"{R}=cola2", "vendor.com/gpu=0"), (NODE,), "1,2", ("cola1",)),
        id="both-one-unlisted",
    ),
    pytest.param(
        "only",
        {"cola2"},
        ["cola1", "cola2"],
        ((f"{R}=cola2", "vendor.com/gpu=0"), (NODE,), "1", ("cola1",)),
        id="only-unlisted-is-classic",
    ),
    pytest.param(
        "only",
        set(),
        ["cola1", "cola2"],
        (("vendor.com/gpu=0",), (NODE,), "1,2", ("cola1", "cola2")),
        id="only-no-spec-is-all-classic",
    ),
    pytest.param("only", set(), ["cola3-"], ((), (), None, ()), id="a-device-outside-any-spec-is-not-unlisted"),
    pytest.param("off", set(), ["cola1"], ((), (NODE,), "1", ()), id="off-asks-no-spec"),
    pytest.param(
        "only",
        {"cola4::0"},
        ["cola4::1", "cola4::0"],
        ((f"{R}=cola4::0",), (), None, ("cola4::1",)),
        id="only-replicas-by-their-own-names",
    ),
]


@pytest.mark.parametrize("mode, listed, requested, expected", LISTED)
def test_only_devices_the_spec_lists_are_named_by_cdi(
    mode: str, listed: set[str], requested: list[str], expected: tuple[object, ...]
) -> None:
    result = allocate(SET, requested, resource_name=R, cdi_mode=mode, cdi_listed=frozenset(listed))
    got = (result.cdi_devices, result.device_nodes, result.envs.get("FW"), result.cdi_unlisted)
    assert got == expected
    # Unknown (None) is the answer as before: every device with a CDI name is named.
    assert allocate(SET, requested, resource_name=R, cdi_mode=mode).cdi_unlisted == ()


@pytest.mark.parametrize("mode", ["off", "both", "only"])
def test_refusals_do_not_depend_on_the_mode(mode: str) -> None:
    clash = replace(SET.by_id["cola2"], device_nodes=(DeviceNode("/dev/other", "/dev/cola1"),))
    devices = DeviceSet.of([*SET, clash, Device("sick", "Unhealthy")])
    for requested, text in ((["nope"], "unknown device"), (["sick"], "Unhealthy"), (["cola1", "cola2"], "/dev/cola1")):
        with pytest.raises(AllocationError, match=text):
            allocate(devices, requested, resource_name=R, cdi_mode=mode)


# --- PreStartContainer ---------------------------------------------------------------------------

CMD = ("/usr/bin/reset",)


def test_plan_groups_devices_by_their_command() -> None:
    devices = DeviceSet.of(
        [Device("a"), Device("b::0"), Device("b::1"), Device("c", prepare=()), Device("d", prepare=("/x", "-y"))]
    )
    steps = prestart.plan(R, CMD, devices, ["d", "b::1", "a", "c", "b::0", "a"])
    assert [(s.argv, s.device_ids) for s in steps] == [
        (("/x", "-y", "d"), ("d",)),
        (("/usr/bin/reset", "b", "a"), ("b::1", "a", "b::0")),
    ]
    assert dict(steps[1].env) == {"COLA_RESOURCE_NAME": R, "COLA_DEVICES": "b,a", "COLA_REPLICAS": "b::1,a,b::0"}
    assert dict(steps[0].env) == {"COLA_RESOURCE_NAME": R, "COLA_DEVICES": "d"}
    assert prestart.plan(R, (), devices, ["a", "c"]) == []  # nothing to run
    with pytest.raises(prestart.UnknownDevice, match="gone"):
        prestart.plan(R, CMD, devices, ["a", "gone"])


def sh(script: str) -> prestart.Step:
    return prestart.Step(("/bin/sh", "-c", script, "sh", "cola1"), ("cola1",), (("COLA_DEVICES", "cola1"),))


@pytest.mark.parametrize(
    "script, ok, reason",
    [
        ('test "$COLA_DEVICES $1" = "cola1 cola1"', True, ""),
        ("echo; echo '  firmware\tmissing  '; exit 3", False, "firmware missing"),
        ("exit 7", False, "exit status 7"),
        ("kill -TERM $$", False, "killed by SIGTERM"),
        ('test -z "$HOME$SECRET" && test "$PATH" != \'\'', True, ""),  # a fixed environment, nothing inherited
    ],
)
def test_run_verdicts(script: str, ok: bool, reason: str) -> None:
    result = prestart.run(sh(script), 10)
    assert (result.ok, result.reason, result.timed_out) == (ok, reason, False)


def test_run_kills_a_hung_command_and_what_it_left_behind(tmp_path: object) -> None:
    started = time.monotonic()
    result = prestart.run(sh("sleep 60 & echo resetting; sleep 60"), 0.5)
    took = time.monotonic() - started
    assert (result.ok, result.timed_out, result.reason) == (False, True, "timed out after 0.5s: resetting")
    assert took < 5, took


def test_run_does_not_wait_for_a_left_behind_child() -> None:
    started = time.monotonic()
    assert prestart.run(sh("sleep 60 & exit 0"), 10).ok
    assert time.monotonic() - started < 5


def test_run_bounds_the_output_and_never_stalls() -> None:
    result = prestart.run(sh("head -c 5000000 /dev/zero | tr '\\0' x; exit 1"), 20)
    assert not result.ok and not result.timed_out and len(result.reason) <= 200


def test_run_names_a_command_that_cannot_start() -> None:
    result = prestart.run(prestart.Step(("/nonexistent/reset",), ("cola1",), ()), 5)
    assert not result.ok and result.reason == "cannot run /nonexistent/reset: No such file or directory"


# --- /readyz ----------------------------------------------------------------------------------------

K = "1:2:3"
READY = ResourceState(
    R,
    state="registered",
    registered=True,
    devices=2,
    healthy=2,
    streams=1,
    have_devices=True,
    list_sent=True,
    kubelet=K,
)


def snapshot(*resources: ResourceState, kubelet: str = K, heard: float = 100.0) -> PluginSnapshot:
    return PluginSnapshot(PluginState(pid=1, resources=resources, kubelet=kubelet), heard, 30.0)


@pytest.mark.parametrize(
    "change, kubelet, reason",
    [
        ({}, K, None),
        ({"registered": False, "state": "registering"}, K, "not registered: registering"),
        ({}, "9:9:9", "registered with an earlier kubelet"),
        ({}, "", "registered with an earlier kubelet"),
        ({"streams": 0}, K, "no live ListAndWatch stream"),
        ({"have_devices": False}, K, "no device list from discovery yet"),
        ({"list_sent": False}, K, "not yet sent"),
        ({"cut": ListCut(100, 10, 1)}, K, "list cut to 9 of 10"),
    ],
)
def test_readiness(change: dict[str, object], kubelet: str, reason: str | None) -> None:
    ok, text = readiness(snapshot(replace(READY, **change), kubelet=kubelet), 101.0)  # type: ignore[arg-type]
    if reason is None:
        assert ok and text == f"ready: {R}, 2 devices"
    else:
        assert not ok and reason in text, text


def test_readiness_needs_every_resource_and_a_discovery_that_reports() -> None:
    other = replace(READY, name="myway5.com/pepsi", list_sent=False)
    ok, text = readiness(snapshot(READY, other), 101.0)
    assert not ok and text.startswith("myway5.com/pepsi: the current device list")
    assert not readiness(snapshot(), 101.0)[0]
    ok, text = readiness(snapshot(READY, heard=0.0), 1000.0)
    assert not ok and "discovery silent" in text


# --- a reload that changes pre_start_required registers again ----------------------------------


def test_options_changed_registers_again_on_a_fresh_socket() -> None:
    from colad.core import registration as reg

    registered = reg.Registration(
        started=0.0,
        phase=reg.Phase.REGISTERED,
        generation=3,
        endpoint="colad-1.sock",
        have_devices=True,
        kubelet_identity=K,
        streams=((3, 1),),
    )
    state, effects = reg.step(registered, reg.OptionsChanged(), 10.0)
    assert effects == [reg.StopServer(3), reg.Serve(4, "options_changed")]
    assert state.generation == 4 and state.pending == "plugin options changed"
    starting = reg.Registration(started=0.0)
    assert reg.step(starting, reg.OptionsChanged(), 1.0) == (starting, [])  # its first Register takes them
    withdrawing = replace(registered, withdrawing=True)
    assert reg.step(withdrawing, reg.OptionsChanged(), 1.0) == (withdrawing, [])
