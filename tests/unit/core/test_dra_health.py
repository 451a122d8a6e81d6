"""Unit tests for colad.core.dra_health: the health list the kubelet's DRA health stream receives."""

from __future__ import annotations

import pytest

from colad.core.constants import HEALTHY, UNHEALTHY
from colad.core.devices import Device, DeviceSet
from colad.core.dra_health import (
    DECLARED_UNHEALTHY,
    ELLIPSIS,
    MAX_MESSAGE_LENGTH,
    ReportedHealth,
    health_message,
    health_reason,
    health_report,
)
from colad.core.slices import pool_names

pytestmark = pytest.mark.unit

NODE = "node-1"
COLA, GPU = "myway5.com/cola", "myway5.com/gpu"


@pytest.mark.parametrize(
    ("length", "expected"),
    [
        pytest.param(0, 0, id="empty"),
        pytest.param(MAX_MESSAGE_LENGTH - 1, MAX_MESSAGE_LENGTH - 1, id="below"),
        pytest.param(MAX_MESSAGE_LENGTH, MAX_MESSAGE_LENGTH, id="at-the-limit"),
        pytest.param(MAX_MESSAGE_LENGTH + 1, MAX_MESSAGE_LENGTH, id="one-over"),
        pytest.param(10_000, MAX_MESSAGE_LENGTH, id="far-over"),
    ],
)
def test_a_message_over_1024_characters_is_cut_to_1021_and_three_dots(length: int, expected: int) -> None:
    text = "".join(chr(ord("a") + i % 26) for i in range(length))
    message = health_message(text)
    assert len(message) == expected
    if length > MAX_MESSAGE_LENGTH:
        assert message == text[:1021] + ELLIPSIS
    else:
        assert message == text


def test_the_limit_counts_characters_not_bytes_and_the_message_is_valid_utf8() -> None:
    assert health_message("é" * MAX_MESSAGE_LENGTH) == "é" * MAX_MESSAGE_LENGTH
    assert health_message("bad \udcff byte") == "bad ? byte"  # a surrogate-escaped byte from a file name


@pytest.mark.parametrize(
    ("device", "reason"),
    [
        pytest.param(Device("a"), "", id="healthy"),
        pytest.param(
            Device("a", UNHEALTHY, reason="host path /dev/cola0 is missing"),
            "host path /dev/cola0 is missing",
            id="missing-host-path",
        ),
        pytest.param(
            Device("a", UNHEALTHY, reason="probe check-cola: fan stopped"), "probe check-cola: fan stopped", id="probe"
        ),
        pytest.param(
            Device("a", UNHEALTHY, problem="numa_nodes: 99 is not in 0..63"),
            "numa_nodes: 99 is not in 0..63",
            id="malformed-file",
        ),
        pytest.param(Device("a", UNHEALTHY), DECLARED_UNHEALTHY, id="declared-by-its-file"),
    ],
)
def test_the_reason_is_what_colad_knows(device: Device, reason: str) -> None:
    assert health_reason(device) == reason


def test_the_report_is_the_complete_list_of_every_pool_healthy_or_not() -> None:
    sets = {
        COLA: DeviceSet.of(
            [Device("cola-a"), Device("cola-b", UNHEALTHY, reason="host path /x is missing"), Device("Odd_Name")]
        ),
        GPU: DeviceSet.of([Device("gpu-0", UNHEALTHY)]),
    }
    pools = pool_names(NODE, [COLA, GPU])
    report = health_report(sets, pools)
    odd = [e.device for e in report if e.device.startswith("odd-name-")]
    assert len(odd) == 1
    assert report == tuple(
        sorted(
            [
                ReportedHealth(pools[COLA], "cola-a", True),
                ReportedHealth(pools[COLA], "cola-b", False, "host path /x is missing"),
                ReportedHealth(pools[COLA], odd[0], True),
                ReportedHealth(pools[GPU], "gpu-0", False, DECLARED_UNHEALTHY),
            ]
        )
    )
    assert {e.pool for e in report} == set(pools.values()) and len(pools) == 2


def test_a_resource_without_devices_yet_adds_nothing_and_one_resource_is_the_nodes_pool() -> None:
    assert health_report({}, pool_names(NODE, [COLA])) == ()
    only = health_report({COLA: DeviceSet.of([Device("cola-a")])}, pool_names(NODE, [COLA]))
    assert only == (ReportedHealth(NODE, "cola-a", True),)


def test_a_long_reason_reaches_the_report_cut() -> None:
    long = Device("a", UNHEALTHY, problem="x" * 5000)
    (entry,) = health_report({COLA: DeviceSet.of([long])}, {COLA: NODE})
    assert entry.message == "x" * 1021 + ELLIPSIS


@pytest.mark.parametrize("health", [HEALTHY, UNHEALTHY])
def test_every_device_of_a_set_is_reported_once(health: str) -> None:
    sets = {COLA: DeviceSet.of(Device(f"cola{i:04d}", health) for i in range(300))}
    report = health_report(sets, {COLA: NODE})
    assert len(report) == 300 == len({(e.pool, e.device) for e in report})
    assert all(e.healthy is (health == HEALTHY) for e in report)
