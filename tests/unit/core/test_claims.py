"""A ResourceClaim read as this driver's devices on this node, the CDI names of its spec, the checkpoint."""

from __future__ import annotations

from typing import Any

import pytest

from colad.core.claims import (
    CheckpointError,
    ClaimDevice,
    ClaimError,
    ClaimRef,
    PreparedClaim,
    PreparedDevice,
    claim_cdi_id,
    claim_devices,
    claim_spec_file,
    decode_checkpoint,
    encode_checkpoint,
    uid_problem,
)
from colad.core.devices import Device, DeviceSet
from colad.core.slices import published_names

pytestmark = pytest.mark.unit

DRIVER = "cola.myway5.com"
A, B = "myway5.com/cola", "myway5.com/pepsi"
POOLS = {A: "node-1/cola", B: "node-1/pepsi"}
SETS = {A: DeviceSet.of([Device("cola0"), Device("cola1"), Device("x_y")]), B: DeviceSet.of([Device("p0")])}
REF = ClaimRef("default", "c", "uid-1")


def claim(*results: tuple[str, str, str, str], uid: str = "uid-1", allocated: bool = True) -> dict[str, Any]:
    status: dict[str, Any] = {}
    if allocated:
        rows = [{"request": r, "driver": d, "pool": p, "device": v} for r, d, p, v in results]
        status["allocation"] = {"devices": {"results": rows}}
    return {"metadata": {"uid": uid}, "status": status}


def test_results_of_this_driver_map_back_to_device_ids_with_base_request_names() -> None:
    odd = published_names(SETS[A])["x_y"]
    found = claim_devices(
        claim(
            ("r/sub", DRIVER, POOLS[A], "cola1"),
            ("r", "other.example.com", "p", "d"),
            ("s", DRIVER, POOLS[B], "p0"),
            ("t", DRIVER, POOLS[A], odd),
        ),
        REF,
        DRIVER,
        POOLS,
        SETS,
    )
    assert found == (
        ClaimDevice(A, "cola1", POOLS[A], "cola1", ("r",)),
        ClaimDevice(B, "p0", POOLS[B], "p0", ("s",)),
        ClaimDevice(A, "x_y", POOLS[A], odd, ("t",)),
    )


def test_one_device_of_two_requests_is_one_device_with_both_names() -> None:
    found = claim_devices(
        claim(("a", DRIVER, POOLS[A], "cola0"), ("b", DRIVER, POOLS[A], "cola0")), REF, DRIVER, POOLS, SETS
    )
    assert found == (ClaimDevice(A, "cola0", POOLS[A], "cola0", ("a", "b")),)


@pytest.mark.parametrize(
    ("obj", "says"),
    [
        pytest.param(claim(("r", DRIVER, POOLS[A], "cola0"), uid="uid-2"), "replaced", id="uid-mismatch"),
        pytest.param(claim(allocated=False), "not allocated", id="not-allocated"),
        pytest.param(claim(("r", "gpu.example.com", "p", "d")), "only of gpu.example.com", id="other-driver-only"),
        pytest.param(claim(), "no device of driver", id="no-results"),
        pytest.param(claim(("r", DRIVER, "node-2", "cola0")), "not in a pool of this node", id="other-node"),
        pytest.param(claim(("r", DRIVER, POOLS[A], "cola9")), "not published", id="unknown-device"),
        pytest.param(claim(("r", DRIVER, POOLS[A], "p0")), "not published", id="device-of-another-pool"),
    ],
)
def test_a_claim_this_node_cannot_prepare_says_why(obj: dict[str, Any], says: str) -> None:
    with pytest.raises(ClaimError, match=says):
        claim_devices(obj, REF, DRIVER, POOLS, SETS)


def test_an_unhealthy_device_is_not_published_so_not_prepared() -> None:
    sets = {A: DeviceSet.of([Device("cola0", health="Unhealthy")])}
    with pytest.raises(ClaimError, match="not published"):
        claim_devices(claim(("r", DRIVER, "node-1", "cola0")), REF, DRIVER, {A: "node-1"}, sets)


def test_cdi_names_carry_the_claim_uid() -> None:
    assert claim_cdi_id(DRIVER, "uid-1", "cola0") == "k8s.cola.myway5.com/claim=uid-1-cola0"
    assert claim_spec_file(DRIVER, "uid-1") == "k8s.cola.myway5.com-claim_uid-1.json"


@pytest.mark.parametrize("uid", ["", "../x", "a/b", ".hidden", "x" * 200])
def test_a_uid_that_could_name_another_file_is_refused(uid: str) -> None:
    assert uid_problem(uid) is not None


def test_the_checkpoint_decodes_to_what_was_encoded() -> None:
    prepared = {
        "uid-1": PreparedClaim(REF, (PreparedDevice(A, "cola0", "node-1", "cola0", ("r",), ("k=uid-1-cola0",)),)),
        "uid-2": PreparedClaim(ClaimRef("ns", "d", "uid-2"), ()),
    }
    data = encode_checkpoint(DRIVER, prepared.values())
    assert decode_checkpoint(data, DRIVER) == prepared
    assert encode_checkpoint(DRIVER, reversed(list(prepared.values()))) == data


@pytest.mark.parametrize(
    "data",
    [
        b"not json",
        b"[]",
        b'{"kind":"colad-dra-claims","version":2,"driver":"cola.myway5.com","claims":[]}',
        b'{"kind":"colad-dra-claims","version":1,"driver":"other","claims":[]}',
        b'{"kind":"colad-dra-claims","version":1,"driver":"cola.myway5.com","claims":[{"uid":"../x"}]}',
    ],
)
def test_a_checkpoint_this_version_did_not_write_is_refused(data: bytes) -> None:
    with pytest.raises(CheckpointError):
        decode_checkpoint(data, DRIVER)
