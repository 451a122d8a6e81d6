"""Unit tests for colad.outputs.cdi: generated specs against the published CDI JSON schema and version rules.

The schema is a verbatim copy (tests/schemas/README.md names the upstream commit). Its devices,
and the version rules of specs-go/version.go restated below, are checked over whole classes of
device sets: seeded random ones, every example of docs/DEVICES.md, replicas and awkward IDs.
jsonschema is in .venv (make setup); Debian's python3 may lack it, and then those tests skip.
"""

from __future__ import annotations

import copy
import json
import os
import random
import re
from pathlib import Path
from typing import Any

import pytest

from colad.core import device_rules, namemap
from colad.core.devices import Device, DeviceNode, DeviceSet, Mount, device_problem, replicate
from colad.discovery.devicefile import parse
from colad.outputs import cdi
from tests.oracles import Spec, cdi_spec, spec_bytes

pytestmark = pytest.mark.unit
ROOT = Path(__file__).resolve().parents[3]
SCHEMAS = ROOT / "tests" / "schemas" / "cdi"
DOCS = ROOT / "docs" / "DEVICES.md"
RESOURCE = "myway5.com/cola"
# What podman 4.3.1 (Debian bookworm) loads; a spec of any other version is ignored (PLATFORM-NOTES 8).
PODMAN_VERSIONS = ("0.3.0", "0.4.0", "0.5.0")


def _schema() -> dict[str, Any]:
    """schema.json with defs.json's definitions merged in, so no resolver API is needed
    (jsonschema's changed between Debian's 4.10 and the current one)."""
    schema = json.loads((SCHEMAS / "schema.json").read_text())
    defs = json.loads((SCHEMAS / "defs.json").read_text())
    text = json.dumps(schema).replace('"defs.json#/definitions/', '"#/definitions/')
    merged: dict[str, Any] = json.loads(text)
    merged["definitions"] = defs["definitions"]
    return merged


@pytest.fixture(scope="module")
def validator() -> Any:
    jsonschema = pytest.importorskip("jsonschema")
    schema = _schema()
    jsonschema.Draft7Validator.check_schema(schema)
    return jsonschema.Draft7Validator(schema)


def _errors(validator: Any, document: object) -> list[str]:
    return [f"{list(e.path)}: {e.message}" for e in validator.iter_errors(document)]


def _check(validator: Any, spec: Spec) -> None:
    """Everything a runtime checks on load, beyond the schema (pkg/cdi spec.go, device.go)."""
    document = json.loads(spec.encode())
    assert _errors(validator, document) == []
    assert document["cdiVersion"] == cdi.required_version(document)
    names = [d["name"] for d in document["devices"]]
    assert len(names) == len(set(names)) and names
    for device in document["devices"]:
        assert device_rules.cdi_device_name_problem(device["name"]) is None
        edits = device["containerEdits"]
        # podman 4.3 refuses the whole spec when one device has empty edits.
        assert edits.get("env") or edits.get("deviceNodes") or edits.get("mounts")
        for env in edits["env"]:
            assert env.index("=") > 0
        for node in edits.get("deviceNodes", []):
            assert set(node["permissions"]) <= set("rwm") and node["path"].startswith("/")


# --- the schema copy works as a test: it can fail --------------------------------------------


def test_validator_accepts_upstream_good_example(validator: Any) -> None:
    assert _errors(validator, json.loads((SCHEMAS / "good-minimal.json").read_text())) == []


def _one_device(edits: dict[str, Any]) -> dict[str, Any]:
    return {"cdiVersion": "0.3.0", "kind": "a.com/b", "devices": [{"name": "x", "containerEdits": edits}]}


@pytest.mark.parametrize(
    "document",
    [
        pytest.param({}, id="empty"),
        pytest.param({"cdiVersion": "0.3.0", "kind": "a.com/b"}, id="no-devices"),
        pytest.param({"cdiVersion": "0.3.0", "kind": "a.com/b", "devices": [{"name": "x"}]}, id="no-edits"),
        pytest.param(_one_device({"mounts": [{}]}), id="mount-without-paths"),
        pytest.param(_one_device({"deviceNodes": [{}]}), id="node-without-path"),
        pytest.param(_one_device({"env": "A=1"}), id="env-not-a-list"),
    ],
)
def test_validator_refuses_bad_documents(validator: Any, document: dict[str, Any]) -> None:
    assert _errors(validator, document) != []


# --- version rules (container-device-interface specs-go/version.go) ---------------------------

BASE = {"cdiVersion": "", "kind": "vendor.com/device", "devices": [{"name": "dev", "containerEdits": {"env": ["A=1"]}}]}


def _with(path: str, value: object) -> dict[str, Any]:
    document = copy.deepcopy(BASE)
    target: Any = document
    *parents, last = path.split(".")
    for part in parents:
        target = target[int(part)] if part.isdigit() else target[part]
    target[last] = value
    return document


@pytest.mark.parametrize(
    ("document", "version"),
    [
        pytest.param(BASE, "0.3.0", id="plain"),
        pytest.param(_with("devices.0.name", "0dev"), "0.5.0", id="name-starts-with-digit-0.5.0"),
        pytest.param(
            _with("devices.0.containerEdits.deviceNodes", [{"path": "/dev/x", "hostPath": "/dev/y"}]),
            "0.5.0",
            id="hostPath-0.5.0",
        ),
        pytest.param(
            _with("devices.0.containerEdits.mounts", [{"hostPath": "/a", "containerPath": "/b", "type": "bind"}]),
            "0.4.0",
            id="mount-type-0.4.0",
        ),
        pytest.param(_with("kind", "vendor.com/dev.ice"), "0.6.0", id="dot-in-class-0.6.0"),
        pytest.param(_with("annotations", {"a": "b"}), "0.6.0", id="spec-annotations-0.6.0"),
        pytest.param(_with("devices.0.annotations", {"a": "b"}), "0.6.0", id="device-annotations-0.6.0"),
    ],
)
def test_required_version_follows_upstream_rules(document: dict[str, Any], version: str) -> None:
    assert cdi.required_version(document) == version


# --- what build() writes ------------------------------------------------------------------------

FULL = Device(
    "cola1",
    numa_nodes=(0,),
    device_nodes=(DeviceNode("/dev/cola1", "/dev/cola1", "rw"), DeviceNode("/dev/cola1-ctl", "/dev/ctl", "rwm")),
    mounts=(Mount("/opt/cola", "/opt/cola", True), Mount("/var/cola", "/data", False)),
    envs=(("MODE", "fast"),),
    annotations=(("example.com/k", "v"),),
    cdi_devices=("vendor.com/x=y",),
)


def test_full_device_edits() -> None:
    spec = cdi_spec(RESOURCE, DeviceSet.of([FULL]))
    assert spec is not None
    assert spec.kind == RESOURCE and spec.version == "0.5.0"  # the renamed node needs hostPath
    assert spec.document["devices"] == [
        {
            "name": "cola1",
            "containerEdits": {
                "env": ["COLA_DEVICE_cola1=cola1", "MODE=fast"],
                "deviceNodes": [
                    {"path": "/dev/cola1", "permissions": "rw"},
                    {"path": "/dev/ctl", "hostPath": "/dev/cola1-ctl", "permissions": "rwm"},
                ],
                "mounts": [
                    {"hostPath": "/opt/cola", "containerPath": "/opt/cola", "options": ["rbind", "ro"]},
                    {"hostPath": "/var/cola", "containerPath": "/data", "options": ["rbind", "rw"]},
                ],
            },
        }
    ]


@pytest.mark.parametrize(
    ("devices", "version"),
    [
        pytest.param([Device("cocacola"), Device("peisicola")], "0.3.0", id="bare-letters-0.3.0"),
        pytest.param([Device("0cola")], "0.5.0", id="digit-id-0.5.0"),
        pytest.param([Device("cola", device_nodes=(DeviceNode("/dev/c", "/dev/c"),))], "0.3.0", id="same-path-0.3.0"),
        pytest.param([FULL], "0.5.0", id="renamed-node-0.5.0"),
    ],
)
def test_lowest_version(validator: Any, devices: list[Device], version: str) -> None:
    spec = cdi_spec(RESOURCE, DeviceSet.of(devices))
    assert spec is not None and spec.version == version
    _check(validator, spec)


def test_replicas_are_devices_with_the_physical_edits(validator: Any) -> None:
    spec = cdi_spec(RESOURCE, replicate(DeviceSet.of([FULL, Device("cola2")]), 3))
    assert spec is not None
    _check(validator, spec)
    by_name = {d["name"]: d["containerEdits"] for d in spec.document["devices"]}
    assert sorted(by_name) == [f"cola{n}::{r}" for n in (1, 2) for r in range(3)]
    assert by_name["cola1::2"]["deviceNodes"] == by_name["cola1::0"]["deviceNodes"]
    assert by_name["cola1::2"]["env"][0] == "COLA_DEVICE_cola1_3A_3A2=cola1::2"
    assert namemap.cdi_device_name(RESOURCE, "cola1::2") == "myway5.com/cola=cola1::2"


def test_unhealthy_and_malformed_devices_stay_resolvable(validator: Any) -> None:
    declared = Device("down", "Unhealthy", mounts=(Mount("/opt/x", "/opt/x"),))
    malformed = parse("broken", b"colour = 1")
    assert malformed.problem
    spec = cdi_spec(RESOURCE, DeviceSet.of([declared, malformed]))
    assert spec is not None
    _check(validator, spec)
    edits = {d["name"]: d["containerEdits"] for d in spec.document["devices"]}
    assert edits["broken"] == {"env": ["COLA_DEVICE_broken=broken"]}  # nothing from a malformed file
    assert edits["down"]["mounts"][0]["hostPath"] == "/opt/x"


@pytest.mark.parametrize("device_id", ["a_", "cola-", "cola."])
def test_ids_that_are_not_cdi_names_are_skipped_with_a_reason(validator: Any, device_id: str) -> None:
    spec = cdi_spec(RESOURCE, DeviceSet.of([Device(device_id), Device("ok")]))
    assert spec is not None
    _check(validator, spec)
    assert [d["name"] for d in spec.document["devices"]] == ["ok"]
    assert [(s.name, bool(s.reason)) for s in spec.skipped] == [(device_id, True)]
    assert cdi_spec(RESOURCE, DeviceSet.of([Device(device_id)])) is None  # no devices: no spec


@pytest.mark.parametrize(
    ("resource", "problem"),
    [
        (RESOURCE, False),
        ("example.com/gpu-a_b", False),
        ("example.com/x.y", True),  # valid from CDI 0.6.0 on only, whose specs podman 4.3 ignores
        ("1example.com/gpu", True),
        ("example.com/1gpu", True),
        ("example.com/gpu-", True),
        ("nocolon", True),
    ],
)
def test_kind_problem(resource: str, problem: bool) -> None:
    assert (namemap.cdi_kind_problem(resource) is not None) is problem
    assert (cdi_spec(resource, DeviceSet.of([Device("a")])) is None) is problem


def test_empty_set_has_no_spec() -> None:
    assert cdi_spec(RESOURCE, DeviceSet()) is None


def test_encoding_is_canonical() -> None:
    a = cdi_spec(RESOURCE, DeviceSet.of([FULL, Device("b")]))
    b = cdi_spec(RESOURCE, DeviceSet.of([Device("b"), FULL]))
    assert a is not None and b is not None and a.encode() == b.encode()


# --- whole classes -------------------------------------------------------------------------------

_ID_FIRST = "abcXYZ019"
_ID_REST = "abcXYZ019._-"


def _random_id(rng: random.Random, rest: str, length: int) -> str:
    return rng.choice(_ID_FIRST) + "".join(rng.choice(rest) for _ in range(rng.randint(0, length)))


def _random_device(rng: random.Random, device_id: str) -> Device:
    paths = rng.sample([f"/dev/p{i}" for i in range(8)] + [f"/opt/m{i}" for i in range(8)], rng.randint(0, 6))
    cut = rng.randint(0, len(paths))
    permissions = ["r", "rw", "rwm", "m"]
    nodes = tuple(DeviceNode(p, rng.choice([p, p + "-in"]), rng.choice(permissions)) for p in paths[:cut])
    mounts = tuple(Mount(p, rng.choice([p, p + "-in"]), rng.random() < 0.5) for p in paths[cut:])
    values = ["", "x", "a,b", "ünï", "=="]
    envs = tuple(sorted({f"E{rng.randint(0, 9)}": rng.choice(values) for _ in range(rng.randint(0, 4))}.items()))
    return Device(device_id, rng.choice(["Healthy", "Unhealthy"]), device_nodes=nodes, mounts=mounts, envs=envs)


def test_random_device_sets_validate(validator: Any) -> None:
    rng = random.Random(15)
    specs = 0
    for _ in range(300):
        ids = {_random_id(rng, _ID_REST, 10) for _ in range(rng.randint(1, 8))}
        devices = [_random_device(rng, i) for i in sorted(ids)]
        devices = [d for d in devices if device_problem(d) is None]
        device_set = replicate(DeviceSet.of(devices), rng.choice([1, 1, 2, 3]))
        spec = cdi_spec(RESOURCE, device_set)
        carried = [d.device_id for d in device_set if device_rules.cdi_device_name_problem(d.device_id) is None]
        if spec is None:
            assert carried == []
            continue
        specs += 1
        _check(validator, spec)
        assert spec.version in PODMAN_VERSIONS
        assert [d["name"] for d in spec.document["devices"]] == carried
        assert len(spec.skipped) == len(device_set) - len(carried)
    assert specs > 250


def test_marker_is_injective_and_a_portable_env_name() -> None:
    rng = random.Random(3)
    seen: dict[str, str] = {}
    for _ in range(5000):
        device_id = _random_id(rng, _ID_REST + ":", 6)
        name, _, value = cdi.marker(device_id).partition("=")
        assert re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", name) and value == device_id
        assert seen.setdefault(name, device_id) == device_id


def _doc_examples() -> list[str]:
    return re.findall(r"```toml\n(.*?)```", DOCS.read_text(), re.DOTALL)


def test_every_devices_md_example_gives_a_valid_spec(validator: Any) -> None:
    examples = _doc_examples()
    assert len(examples) >= 3
    for n, text in enumerate(examples):
        device = parse(f"cola{n}", text.encode())
        assert device.problem == "", text
        spec = cdi_spec(RESOURCE, DeviceSet.of([device]))
        assert spec is not None
        _check(validator, spec)


# --- the writer ------------------------------------------------------------------------------------


def test_writer_writes_atomically_once_and_removes(tmp_path: Path) -> None:
    spec_dir = tmp_path / "cdi"
    writer = cdi.SpecWriter(str(spec_dir))
    spec = cdi_spec(RESOURCE, DeviceSet.of([FULL]))
    assert writer.write_bytes(RESOURCE, spec_bytes(spec)) is True
    path = spec_dir / "colad-myway5.com-cola.json"
    assert spec is not None and path.read_bytes() == spec.encode()
    assert oct(path.stat().st_mode & 0o777) == "0o644"
    inode = path.stat().st_ino
    # unchanged: untouched
    assert writer.write_bytes(RESOURCE, spec_bytes(spec)) is False and path.stat().st_ino == inode
    changed = cdi_spec(RESOURCE, DeviceSet.of([FULL, Device("cola2")]))
    assert writer.write_bytes(RESOURCE, spec_bytes(changed)) is True and path.stat().st_ino != inode  # renamed over
    assert sorted(os.listdir(spec_dir)) == [path.name]  # no temporary left, and none named *.json
    path.unlink()
    # deleted behind its back: rewritten
    assert writer.write_bytes(RESOURCE, spec_bytes(changed)) is True and path.exists()
    assert writer.write_bytes(RESOURCE, None) is True and not path.exists()
    assert writer.remove(RESOURCE) is False


def test_writer_leaves_no_temporary_when_the_rename_fails(tmp_path: Path) -> None:
    spec_dir = tmp_path / "cdi"
    writer = cdi.SpecWriter(str(spec_dir))
    (spec_dir / "colad-myway5.com-cola.json").mkdir(parents=True)  # a directory in the way: rename fails
    with pytest.raises(OSError):
        writer.write_bytes(RESOURCE, spec_bytes(cdi_spec(RESOURCE, DeviceSet.of([Device("a")]))))
    assert os.listdir(spec_dir) == ["colad-myway5.com-cola.json"]


# --- the reader (Allocate's side) ------------------------------------------------------------------


def test_reader_lists_what_the_writer_wrote(tmp_path: Path) -> None:
    writer, reader = cdi.SpecWriter(str(tmp_path)), cdi.SpecReader()
    writer.write_bytes(RESOURCE, spec_bytes(cdi_spec(RESOURCE, DeviceSet.of([FULL, Device("cola2-")]))))
    listed = reader.read(str(tmp_path), RESOURCE)
    assert listed == cdi.Listed(frozenset({"cola1"}))  # "cola2-" ends in no CDI name character: not in the spec
    # renamed over: a new inode
    writer.write_bytes(RESOURCE, spec_bytes(cdi_spec(RESOURCE, replicate(DeviceSet.of([FULL]), 2))))
    assert reader.read(str(tmp_path), RESOURCE).names == {"cola1::0", "cola1::1"} and reader.reads == 2


def test_reader_reads_a_file_again_only_when_it_changed(tmp_path: Path) -> None:
    writer, reader = cdi.SpecWriter(str(tmp_path)), cdi.SpecReader()
    writer.write_bytes(RESOURCE, spec_bytes(cdi_spec(RESOURCE, DeviceSet.of([Device("cola1")]))))
    for _ in range(5):
        assert reader.read(str(tmp_path), RESOURCE).names == {"cola1"}
    assert reader.reads == 1  # the stat matched: cache hits
    path = Path(writer.path(RESOURCE))
    data = path.read_bytes().replace(b'"cola1"', b'"cola9"')
    path.write_bytes(data)  # same inode and size; a new mtime
    os.utime(path, ns=(path.stat().st_atime_ns, path.stat().st_mtime_ns + 1))
    assert reader.read(str(tmp_path), RESOURCE).names == {"cola9"} and reader.reads == 2


def write_spec(tmp_path: Path, data: bytes | str) -> None:
    (tmp_path / namemap.cdi_spec_file(RESOURCE)).write_bytes(data.encode() if isinstance(data, str) else data)


@pytest.mark.parametrize(
    "data, reason, problem",
    [
        (None, "missing", "does not exist"),
        ("{", "invalid", "not valid JSON"),
        (b"\xff\xfe", "invalid", "not valid JSON"),
        ("[" * 100_000 + "]" * 100_000, "invalid", "not valid JSON"),  # nested past the recursion limit
        ("[]", "invalid", "not a JSON object"),
        ('{"cdiVersion": "0.3.0", "kind": "other.com/gpu", "devices": [{"name": "cola1"}]}', "other_kind", "other"),
        ('{"kind": 7}', "other_kind", "its kind is '7'"),
        ('{"kind": "myway5.com/cola", "devices": {"cola1": {}}}', "invalid", "no device list"),
    ],
)
def test_reader_says_why_a_file_lists_no_device(
    tmp_path: Path, data: bytes | str | None, reason: str, problem: str
) -> None:
    if data is not None:
        write_spec(tmp_path, data)
    listed = cdi.SpecReader().read(str(tmp_path), RESOURCE)
    assert listed.names == frozenset() and listed.reason == reason and problem in listed.problem, listed


def test_reader_device_absent_and_odd_entries(tmp_path: Path) -> None:
    devices = [{"name": "cola1", "containerEdits": {}}, {"name": 3}, "cola2", {}, {"name": "cola3"}]
    write_spec(tmp_path, json.dumps({"cdiVersion": "0.3.0", "kind": RESOURCE, "devices": devices}))
    listed = cdi.SpecReader().read(str(tmp_path), RESOURCE)
    assert listed == cdi.Listed(frozenset({"cola1", "cola3"})) and "cola2" not in listed.names


def test_reader_of_no_directory_a_directory_in_the_way_and_an_unreadable_dir(tmp_path: Path) -> None:
    assert cdi.SpecReader().read("", RESOURCE).reason == "missing"
    (tmp_path / namemap.cdi_spec_file(RESOURCE)).mkdir()
    assert cdi.SpecReader().read(str(tmp_path), RESOURCE).reason == "invalid"
    assert cdi.SpecReader().read(str(tmp_path / "nowhere\x00"), RESOURCE).reason == "unreadable"


def test_fallback_notes_change_once_per_reason() -> None:
    notes = cdi.FallbackNotes()
    assert [notes.changed(r) for r in ("", "missing", "missing", "invalid", "", "")] == [
        False,
        True,
        False,
        True,
        True,
        False,
    ]


def test_a_claim_spec_gives_each_device_its_own_nodes_and_mounts_and_the_requests_envs() -> None:
    a = Device("cola0", envs=(("MODE", "fast"),), device_nodes=(DeviceNode("/dev/null", "/dev/null"),))
    b = Device("cola1", mounts=(Mount("/srv/x", "/opt/x"),))
    envs = {"MODE": "fast", "COLA_DEVICES": "cola0,cola1"}
    data = cdi.encode_claim_spec("k8s.cola.myway5.com/claim", [("u-cola0", a, envs), ("u-cola1", b, envs)])
    spec = json.loads(data)
    assert spec["kind"] == "k8s.cola.myway5.com/claim" and spec["cdiVersion"] == "0.3.0"
    first, second = spec["devices"]
    assert first == {
        "name": "u-cola0",
        "containerEdits": {
            "env": [cdi.marker("cola0"), "MODE=fast", "COLA_DEVICES=cola0,cola1"],
            "deviceNodes": [{"path": "/dev/null", "permissions": "rw"}],
        },
    }
    assert second["containerEdits"]["env"] == [cdi.marker("cola1"), "MODE=fast", "COLA_DEVICES=cola0,cola1"]
    assert second["containerEdits"]["mounts"] == [
        {"hostPath": "/srv/x", "containerPath": "/opt/x", "options": ["rbind", "ro"]}
    ]
    assert data.endswith(b"\n") and data == cdi.encode_claim_spec(
        spec["kind"], [("u-cola0", a, envs), ("u-cola1", b, envs)]
    )


def test_a_claim_spec_needs_the_version_its_names_need() -> None:
    data = cdi.encode_claim_spec("k8s.d/claim", [("5d0c-cola0", Device("cola0"), {})])
    assert json.loads(data)["cdiVersion"] == "0.5.0"  # a name that starts with a digit
