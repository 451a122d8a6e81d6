"""bench/dra.py: DRA mode's yardsticks, read from colad's device-plugin figures of the same phase, and its table.

A yardstick adds to colad's device-plugin figure what the DRA path does and the device-plugin path
does not (a claim read, the API calls of a start); a part the run lacks leaves no yardstick.
"""

from __future__ import annotations

import copy
from typing import Any

import pytest

from bench import dra

pytestmark = pytest.mark.unit


def results() -> dict[str, Any]:
    memory = {"total": {"rss_mib": 100.0, "pss_mib": 60.0}}
    return {
        "dra": {
            "devices": 10,
            "devices_for_claims": 16,
            "scale_count": 10_000,
            "violations": [],
            dra.DP: {
                "start": {"runs_ms": [400.0, 500.0, 450.0], "median_ms": 450.0},
                "allocate_sequential": {"p50_ms": 1.0, "p99_ms": 2.0, "max_ms": 3.0},
                "allocate_concurrent": {"p50_ms": 2.0, "p99_ms": 4.0, "max_ms": 5.0, "refused": 0},
                "propagation": {"p50_ms": 2.0, "p99_ms": 3.0, "max_ms": 4.0},
                "memory": memory,
                "scale": {"10000": {"start_ms": 900.0, "memory": {"total": {"pss_mib": 70.0}}}},
            },
            dra.DRA: {
                "start": {"runs_ms": [600.0], "median_ms": 600.0},
                "slices": 1,
                "prepare_sequential": {"p50_ms": 5.0, "p99_ms": 9.0, "max_ms": 12.0, "refused": 0},
                "prepare_concurrent": {"p50_ms": 9.0, "p99_ms": 14.0, "max_ms": 20.0, "refused": 3},
                "slice_update": {"p50_ms": 8.0, "p99_ms": 10.0, "max_ms": 11.0},
                "api_calls_per_change": {"PUT a slice": 1.0},
                "api_calls_at_start": {"LIST slices": 1, "POST slices": 1, "WATCH slices": 1},
                "memory": {"total": {"rss_mib": 104.0, "pss_mib": 63.5}},
                "scale": {
                    "10000": {
                        "start_ms": 1500.0,
                        "slices": 79,
                        "api_calls_at_start": {"POST slices": 79},
                        "memory": {"total": {"pss_mib": 90.0}},
                    }
                },
            },
            "api": {
                "claim_read_sequential": {"p50_ms": 3.0, "p99_ms": 5.0},
                "claim_read_concurrent": {"p50_ms": 6.0, "p99_ms": 8.0},
            },
        }
    }


YARDSTICKS = [
    (dra.PREPARE, "colad's Allocate p99 2 + a claim read p99 5 = 7 ms", 7.0),
    (dra.PREPARE_AT_ONCE, "colad's Allocate p99, 16 callers 4 + a claim read p99, 16 readers 8 = 12 ms", 12.0),
    (dra.SLICE_UPDATE, "colad's change -> kubelet p99 3 + a claim read p99 5 = 8 ms", 8.0),
    (dra.START, "colad's start -> full list 450 + 3 API calls at a claim read's p50 3 ms 9 = 459 ms", 459.0),
    (
        dra.START_AT_SCALE,
        "colad's start -> full list at 10,000 900 + 81 API calls at a claim read's p50 3 ms 243 = 1143 ms",
        1143.0,
    ),
    (dra.PSS, "colad in device-plugin mode 60 MiB", 60.0),
    (dra.PSS_AT_SCALE, "colad in device-plugin mode at 10,000 70 MiB", 70.0),
]


@pytest.mark.parametrize(("name", "text", "value"), YARDSTICKS, ids=[row[0] for row in YARDSTICKS])
def test_each_yardstick_names_its_parts_and_adds_them_up(name: str, text: str, value: float) -> None:
    stick = dra.yardsticks(results())[name]
    assert stick is not None and (stick.text(), stick.value) == (text, value)


@pytest.mark.parametrize(
    ("missing", "name"),
    [
        ("api.claim_read_sequential", dra.PREPARE),
        ("api.claim_read_sequential", dra.START),  # the API calls are priced at a claim read
        (f"{dra.DRA}.slices", dra.START),
        (f"{dra.DP}.scale", dra.PSS_AT_SCALE),
    ],
)
def test_a_yardstick_with_a_part_not_measured_is_none(missing: str, name: str) -> None:
    got = copy.deepcopy(results())
    *path, last = missing.split(".")
    holder = got["dra"]
    for key in path:
        holder = holder[key]
    del holder[last]
    assert dra.yardsticks(got)[name] is None


def test_no_dra_figures_give_no_yardsticks() -> None:
    assert set(dra.yardsticks({}).values()) == {None}


def test_the_table_shows_both_modes_their_ratio_the_scale_and_what_stopped_the_phase() -> None:
    got = results()
    got["dra"]["error"] = "DraFailure: NodePrepareResources of claim-00001: failed='' errors={'u': 'no'}"
    got["dra"]["violations"] = ["DRA kubelet: claim u: a device without pool_name or device_name"]
    lines = dra.table(got).splitlines()
    assert lines[0].split()[-3:] == ["plugin", "DRA", "ratio"]
    row = next(line for line in lines if line.startswith("one claim: Allocate | prepare p99"))
    assert row.split()[-3:] == ["2", "9", "4.5"]
    assert next(line for line in lines if line.startswith("one claim: unprepare p50")).split()[-3:] == ["-", "-", "-"]
    assert "10,000 devices, each mode alone (79 slices)" in lines
    assert "start runs, ms: colad 400.0 / 500.0 / 450.0; colad-dra 600.0" in lines
    assert "API calls per file change, DRA: PUT a slice 1" in lines
    assert "API calls at the start, 10 devices, DRA: LIST slices 1, POST slices 1, WATCH slices 1" in lines
    assert "API calls at the start, 10,000 devices, DRA: POST slices 79" in lines
    assert lines[-2].startswith("contract violations: DRA kubelet: claim u")
    assert lines[-1].startswith("the DRA phase stopped: DraFailure")


def test_order_turns_every_other_round() -> None:
    assert [list(dra.order(i, ("a", "b"))) for i in range(3)] == [["a", "b"], ["b", "a"], ["a", "b"]]


@pytest.mark.parametrize(
    ("method", "path", "name"),
    [
        ("GET", "/apis/resource.k8s.io/v1/resourceslices?fieldSelector=spec.nodeName%3Dnode-1", "LIST slices"),
        ("GET", "/apis/resource.k8s.io/v1/resourceslices?watch=1&resourceVersion=7", "WATCH slices"),
        ("GET", "/apis/resource.k8s.io/v1/resourceslices?resourceVersion=7&watch=true", "WATCH slices"),
        ("GET", "/apis/resource.k8s.io/v1/resourceslices?watch=false", "LIST slices"),
        ("POST", "/apis/resource.k8s.io/v1/resourceslices", "POST slices"),
        ("PUT", "/apis/resource.k8s.io/v1/resourceslices/00000-cola.myway5.com-node-1-q7rcl", "PUT a slice"),
        ("GET", "/api/v1/nodes/node-1", "GET /api/v1/nodes/node-1"),
    ],
)
def test_api_calls_are_named_by_verb_and_kind_not_by_slice_name(method: str, path: str, name: str) -> None:
    assert dra.call_name(method, path) == name
