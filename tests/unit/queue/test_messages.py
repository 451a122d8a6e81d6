"""Unit tests for colad.queue.messages: wire round trips, strict decoding; and snapshots.SequenceTracker."""

from __future__ import annotations

import json
import random
from typing import Any

import pytest

from colad.core.constants import HEALTHY, MAX_DEVICE_ID_LENGTH, UNHEALTHY
from colad.core.devices import Device, DeviceSet
from colad.core.errors import ColadError, MessageError
from colad.queue.device_wire import device_entry, device_wire_size, moved_digest, set_digest
from colad.queue.messages import (
    MAX_MESSAGE_BYTES,
    WIRE_VERSION,
    DeviceDelta,
    DeviceSnapshot,
    KubeletState,
    Message,
    Stats,
    decode,
    encode,
    snapshot_size,
)
from colad.queue.snapshots import SequenceTracker

pytestmark = pytest.mark.unit

SOME_DEVICES = DeviceSet.of([Device("cola1"), Device("cola2", UNHEALTHY), Device("peisicola")])

ROUND_TRIPS = [
    pytest.param(DeviceSnapshot(0, 0, DeviceSet()), id="snapshot-empty"),
    pytest.param(DeviceSnapshot(1700000000123, 7, SOME_DEVICES), id="snapshot-devices"),
    pytest.param(DeviceSnapshot(1, 2, DeviceSet(), dir_present=False), id="snapshot-dir-missing"),
    pytest.param(DeviceSnapshot(2**62, 2**62, SOME_DEVICES), id="snapshot-huge-numbers"),
    pytest.param(KubeletState(5, 1), id="kubelet"),
    pytest.param(KubeletState(2**62, 2**62), id="kubelet-huge-numbers"),
    pytest.param(DeviceDelta(1, 2, 1), id="delta-empty"),
    pytest.param(DeviceDelta(1, 9, 8, (Device("cola3", UNHEALTHY),), ("cola1", "cola2"), 2**64 - 1), id="delta"),
]


@pytest.mark.parametrize("message", ROUND_TRIPS)
def test_round_trip(message: Message) -> None:
    data = encode(message)
    assert isinstance(data, bytes)
    data.decode("ascii")  # ensure_ascii: the wire is plain ASCII
    assert decode(data) == message


def test_snapshot_wire_format() -> None:
    body = json.loads(encode(DeviceSnapshot(3, 4, SOME_DEVICES, dir_present=True)))
    assert body == {
        "v": WIRE_VERSION,
        "type": "device_snapshot",
        "epoch": 3,
        "seq": 4,
        "resource": "myway5.com/cola",
        "dir_present": True,
        "devices": [["cola1", HEALTHY], ["cola2", UNHEALTHY], ["peisicola", HEALTHY]],
    }


def test_kubelet_state_wire_format() -> None:
    # The envelope only: the plugin looks at the kubelet directory itself.
    body = json.loads(encode(KubeletState(3, 4)))
    assert body == {"v": WIRE_VERSION, "type": "kubelet_state", "epoch": 3, "seq": 4}


def test_message_types_are_fixed() -> None:
    assert DeviceSnapshot(0, 0, DeviceSet()).type == "device_snapshot"
    assert KubeletState(0, 0).type == "kubelet_state"


def test_ten_thousand_long_ids_fit() -> None:
    devices = DeviceSet.of(
        Device(f"{i:05d}".ljust(MAX_DEVICE_ID_LENGTH, "x"), UNHEALTHY if i % 3 else HEALTHY) for i in range(10_000)
    )
    assert len(devices) == 10_000
    assert all(len(d.device_id) == MAX_DEVICE_ID_LENGTH for d in devices)
    message = DeviceSnapshot(1, 1, devices)
    data = encode(message)
    assert len(data) < MAX_MESSAGE_BYTES
    assert decode(data) == message


def test_encode_refuses_oversize() -> None:
    with pytest.raises(MessageError, match="limit"):
        encode(Stats(1, 1, "discovery", (("x" * MAX_MESSAGE_BYTES, 1),)))


def test_decode_accepts_exactly_the_limit() -> None:
    data = encode(KubeletState(1, 1))
    padded = data + b" " * (MAX_MESSAGE_BYTES - len(data))
    assert len(padded) == MAX_MESSAGE_BYTES
    assert decode(padded) == KubeletState(1, 1)


def test_decode_rejects_one_byte_over_the_limit() -> None:
    data = encode(KubeletState(1, 1))
    padded = data + b" " * (MAX_MESSAGE_BYTES + 1 - len(data))
    with pytest.raises(MessageError, match="limit"):
        decode(padded)


def test_message_error_is_a_colad_error() -> None:
    assert issubclass(MessageError, ColadError)


# --- decode rejections ---------------------------------------------------------------------


def _snapshot(**changes: Any) -> bytes:
    body: dict[str, Any] = {
        "v": 1,
        "type": "device_snapshot",
        "epoch": 1,
        "seq": 1,
        "resource": "myway5.com/cola",
        "dir_present": True,
        "devices": [["cola1", "Healthy"]],
    }
    body.update(changes)
    return json.dumps({k: v for k, v in body.items() if v is not _DROP}).encode()


def _kubelet(**changes: Any) -> bytes:
    """A kubelet_state as an older watcher sent it, with kubelet_socket and plugin_sockets (ignored now)."""
    body: dict[str, Any] = {
        "v": 1,
        "type": "kubelet_state",
        "epoch": 1,
        "seq": 1,
        "kubelet_socket": "1:2:3",
        "plugin_sockets": [],
    }
    body.update(changes)
    return json.dumps({k: v for k, v in body.items() if v is not _DROP}).encode()


_DROP = object()


def _raw_kubelet(seq: bytes) -> bytes:
    """A kubelet_state whose seq is raw JSON text (for values json.dumps will not write)."""
    return b'{"v":1,"type":"kubelet_state","epoch":1,"seq":' + seq + b',"kubelet_socket":"","plugin_sockets":[]}'


def test_fixture_messages_are_valid() -> None:
    # Each rejection below changes exactly one thing in these.
    assert decode(_snapshot()) == DeviceSnapshot(1, 1, DeviceSet.of([Device("cola1")]))
    assert decode(_kubelet()) == KubeletState(1, 1)


REJECTED = [
    # framing
    pytest.param(b"", id="empty"),
    pytest.param(b"not json", id="not-json"),
    pytest.param(b'{"v": 1', id="truncated"),
    pytest.param(b"\xff\xfe{}", id="not-utf8"),
    pytest.param(b'{"v":1,"type":"kubelet_state","kubelet_socket":"\xc3"}', id="invalid-utf8-in-string"),
    pytest.param(b"\xef\xbb\xbf" + _kubelet(), id="utf8-bom"),
    pytest.param(b"[]", id="json-array"),
    pytest.param(b"null", id="json-null"),
    pytest.param(b"1", id="json-number"),
    pytest.param(b'"device_snapshot"', id="json-string"),
    pytest.param(b"[" * 100_000 + b"]" * 100_000, id="deeply-nested"),
    pytest.param(_kubelet() + b" {}", id="trailing-data"),
    # version
    pytest.param(_snapshot(v=_DROP), id="no-version"),
    pytest.param(_snapshot(v=0), id="version-0"),
    pytest.param(_snapshot(v=2), id="version-2"),
    pytest.param(_snapshot(v="1"), id="version-string"),
    pytest.param(_snapshot(v=None), id="version-null"),
    # type
    pytest.param(_snapshot(type="device_delta"), id="unknown-type"),
    pytest.param(_snapshot(type=_DROP), id="no-type"),
    pytest.param(_snapshot(type=None), id="null-type"),
    pytest.param(_snapshot(type=["device_snapshot"]), id="list-type"),
    # epoch and seq
    pytest.param(_snapshot(epoch=_DROP), id="no-epoch"),
    pytest.param(_snapshot(seq=_DROP), id="no-seq"),
    pytest.param(_snapshot(epoch=True), id="bool-epoch"),
    pytest.param(_snapshot(seq=True), id="bool-seq"),
    pytest.param(_kubelet(seq=False), id="kubelet-bool-seq"),
    pytest.param(_snapshot(seq=1.0), id="float-seq"),
    pytest.param(_snapshot(epoch="1"), id="string-epoch"),
    pytest.param(_snapshot(seq=None), id="null-seq"),
    pytest.param(_snapshot(seq=-1), id="negative-seq"),
    pytest.param(_kubelet(epoch=-5), id="negative-epoch"),
    pytest.param(_raw_kubelet(b"NaN"), id="nan-seq"),
    pytest.param(_raw_kubelet(b"Infinity"), id="infinity-seq"),
    pytest.param(_raw_kubelet(b"1e400"), id="overflowing-float-seq"),
    pytest.param(_raw_kubelet(b"9" * 5000), id="5000-digit-seq"),
    # device snapshot body
    pytest.param(_snapshot(devices=_DROP), id="no-devices"),
    pytest.param(_snapshot(devices={"cola1": "Healthy"}), id="devices-object"),
    pytest.param(_snapshot(devices="cola1"), id="devices-string"),
    pytest.param(_snapshot(devices=["cola1"]), id="device-bare-string"),
    pytest.param(_snapshot(devices=[["cola1"]]), id="device-one-element"),
    pytest.param(_snapshot(devices=[["cola1", "Healthy", 0]]), id="device-three-elements"),
    pytest.param(_snapshot(devices=[{"id": "cola1", "colour": "red"}]), id="device-unknown-key"),
    pytest.param(_snapshot(devices=[[1, "Healthy"]]), id="device-int-id"),
    pytest.param(_snapshot(devices=[["cola1", True]]), id="device-bool-health"),
    pytest.param(_snapshot(devices=[["", "Healthy"]]), id="device-empty-id"),
    pytest.param(_snapshot(devices=[[".hidden", "Healthy"]]), id="device-hidden-id"),
    pytest.param(_snapshot(devices=[["a,b", "Healthy"]]), id="device-comma-id"),
    pytest.param(_snapshot(devices=[["x" * 64, "Healthy"]]), id="device-64-char-id"),
    pytest.param(_snapshot(devices=[["caf\u00e9", "Healthy"]]), id="device-non-ascii-id"),
    pytest.param(_snapshot(devices=[["\udcff", "Healthy"]]), id="device-surrogate-id"),
    pytest.param(_snapshot(devices=[["cola1", "healthy"]]), id="device-lowercase-health"),
    pytest.param(_snapshot(devices=[["cola1", "Sick"]]), id="device-unknown-health"),
    pytest.param(_snapshot(devices=[["cola1", ""]]), id="device-empty-health"),
    pytest.param(_snapshot(devices=[["cola1", "Healthy"], ["cola1", "Healthy"]]), id="duplicate-ids"),
    pytest.param(_snapshot(devices=[["cola1", "Healthy"], ["cola1", "Unhealthy"]]), id="duplicate-ids-other-health"),
    pytest.param(_snapshot(dir_present=_DROP), id="no-dir-present"),
    pytest.param(_snapshot(dir_present=1), id="int-dir-present"),
    pytest.param(_snapshot(dir_present="true"), id="string-dir-present"),
    pytest.param(_snapshot(resource=_DROP), id="no-resource"),
    pytest.param(_snapshot(resource="cola"), id="resource-without-domain"),
    pytest.param(_snapshot(resource=7), id="int-resource"),
    pytest.param(_snapshot(devices=[{"id": "cola1", "numa_nodes": [-1]}]), id="negative-numa"),
    pytest.param(_snapshot(devices=[{"id": "cola1", "mounts": [["rel", "/x", True]]}]), id="relative-mount"),
]


@pytest.mark.parametrize("data", REJECTED)
def test_decode_rejects(data: bytes) -> None:
    with pytest.raises(MessageError):
        decode(data)


@pytest.mark.parametrize(
    "version",
    [pytest.param(True, id="bool-true"), pytest.param(1.0, id="float-1.0")],
)
def test_decode_rejects_version_of_wrong_type(version: object) -> None:
    with pytest.raises(MessageError):
        decode(_kubelet(v=version))


ACCEPTED = [
    pytest.param(_snapshot(devices=[]), DeviceSnapshot(1, 1, DeviceSet()), id="no-devices"),
    pytest.param(
        _snapshot(devices=[["b", "Unhealthy"], ["a", "Healthy"]]),
        DeviceSnapshot(1, 1, DeviceSet.of([Device("a"), Device("b", UNHEALTHY)])),
        id="devices-any-order",
    ),
    pytest.param(_snapshot(extra="ignored"), DeviceSnapshot(1, 1, DeviceSet.of([Device("cola1")])), id="extra-field"),
    pytest.param(_kubelet(epoch=0, seq=0), KubeletState(0, 0), id="zero-epoch-seq"),
    pytest.param(b"  \n" + _kubelet() + b"\n", KubeletState(1, 1), id="surrounding-whitespace"),
    # an older watcher's payload is not read, whatever it holds
    pytest.param(_kubelet(kubelet_socket=_DROP, plugin_sockets=_DROP), KubeletState(1, 1), id="kubelet-envelope-only"),
    pytest.param(_kubelet(kubelet_socket=123), KubeletState(1, 1), id="kubelet-int-socket-ignored"),
    pytest.param(_kubelet(plugin_sockets=["a.sock", 1]), KubeletState(1, 1), id="kubelet-bad-sockets-ignored"),
]


@pytest.mark.parametrize("data, expected", ACCEPTED)
def test_decode_accepts(data: bytes, expected: Message) -> None:
    assert decode(data) == expected


# --- decode never raises anything but MessageError -----------------------------------------


def _check_only_message_error(data: bytes) -> bool:
    """Decode `data`; True if it is a valid message, False on MessageError; anything else fails."""
    try:
        message = decode(data)
    except MessageError:
        return False
    # Whatever decodes must be a proper message that survives a round trip.
    assert isinstance(message, (DeviceSnapshot, KubeletState))
    assert decode(encode(message)) == message
    return True


def test_random_bytes_only_raise_message_error() -> None:
    rng = random.Random(20240501)
    alphabet = b'{}[]",:0123456789-.eEtruefalsnl \\u' + bytes(range(0, 256, 7))
    for _ in range(3000):
        length = rng.randrange(0, 64)
        if rng.random() < 0.5:
            data = bytes(rng.randrange(256) for _ in range(length))
        else:
            data = bytes(rng.choice(alphabet) for _ in range(length))
        _check_only_message_error(data)


def test_mutated_messages_only_raise_message_error() -> None:
    rng = random.Random(7)
    seeds = [
        encode(DeviceSnapshot(12, 34, SOME_DEVICES)),
        encode(KubeletState(12, 34)),
    ]
    decoded = 0
    for _ in range(3000):
        data = bytearray(rng.choice(seeds))
        for _ in range(rng.randrange(1, 4)):
            action = rng.randrange(3)
            position = rng.randrange(len(data) + 1)
            if action == 0 and data:
                del data[min(position, len(data) - 1)]
            elif action == 1:
                data.insert(position, rng.randrange(256))
            elif data:
                data[min(position, len(data) - 1)] = rng.choice(b'{}[]",:01-aHU \\')
        decoded += _check_only_message_error(bytes(data))
    assert 0 < decoded < 3000  # some mutations (a digit, a space) still decode


def _random_json(rng: random.Random, depth: int = 0) -> Any:
    choice = rng.randrange(9 if depth < 3 else 6)
    if choice == 0:
        return None
    if choice == 1:
        return rng.choice([True, False])
    if choice == 2:
        return rng.choice([0, 1, -1, 2**70, 7])
    if choice == 3:
        return rng.choice([0.5, -0.0, 1.0, 1e300])
    if choice == 4:
        return rng.choice(["", "cola1", "Healthy", "Unhealthy", "device_snapshot", "kubelet_state", "\u00e9"])
    if choice == 5:
        return rng.choice([[], ["cola1", "Healthy"], ["x"]])
    if choice in (6, 7):
        return [_random_json(rng, depth + 1) for _ in range(rng.randrange(4))]
    keys = ["v", "type", "devices", "epoch"]
    return {rng.choice(keys): _random_json(rng, depth + 1) for _ in range(rng.randrange(4))}


_VALID_FIELDS: dict[str, list[Any]] = {
    "v": [1],
    "type": ["device_snapshot", "kubelet_state"],
    "epoch": [0, 1, 2**40],
    "seq": [0, 3, 2**40],
    "devices": [[], [["cola1", "Healthy"]], [["a", "Unhealthy"], ["b", "Healthy"]]],
    "dir_present": [True, False],
    "kubelet_socket": ["", "1:2:3"],
    "plugin_sockets": [[], ["colad-1.sock"]],
}


def test_random_json_bodies_only_raise_message_error() -> None:
    # Each field is usually valid, so that many bodies decode and the rest fail
    # on one or two defects at a time.
    rng = random.Random(99)
    decoded = 0
    for _ in range(3000):
        body: dict[str, Any] = {}
        for key, valid in _VALID_FIELDS.items():
            roll = rng.random()
            if roll < 0.85:
                body[key] = rng.choice(valid)
            elif roll < 0.95:
                body[key] = _random_json(rng)
        decoded += _check_only_message_error(json.dumps(body).encode())
    assert 0 < decoded < 3000  # the generator exercises both outcomes


# --- SequenceTracker -----------------------------------------------------------------------


def _snap(epoch: int, seq: int) -> DeviceSnapshot:
    return DeviceSnapshot(epoch, seq, DeviceSet())


def _kube(epoch: int, seq: int) -> KubeletState:
    return KubeletState(epoch, seq)


TRACKER_CASES = [
    # (sequence of (epoch, seq) device snapshots, expected accept() results)
    pytest.param([(1, 0)], [True], id="first-message"),
    pytest.param([(1, 5)], [True], id="first-message-any-seq"),
    pytest.param([(1, 1), (1, 2), (1, 3)], [True, True, True], id="increasing"),
    pytest.param([(1, 1), (1, 5), (1, 9)], [True, True, True], id="gaps-allowed"),
    pytest.param([(1, 1), (1, 1)], [True, False], id="duplicate"),
    pytest.param([(1, 1), (1, 2), (1, 1)], [True, True, False], id="replay-older"),
    pytest.param([(1, 5), (1, 2), (1, 6)], [True, False, True], id="old-then-new"),
    pytest.param([(1, 9), (2, 0)], [True, True], id="newer-epoch-overtakes"),
    pytest.param([(1, 9), (2, 0), (1, 10)], [True, True, False], id="older-epoch-rejected-after-overtake"),
    pytest.param([(5, 1), (4, 100)], [True, False], id="older-epoch-rejected"),
    pytest.param([(2, 3), (2, 3), (2, 4), (2, 4)], [True, False, True, False], id="every-duplicate"),
]


@pytest.mark.parametrize("positions, expected", TRACKER_CASES)
def test_sequence_tracker(positions: list[tuple[int, int]], expected: list[bool]) -> None:
    tracker = SequenceTracker()
    assert [tracker.accept(_snap(e, s)) for e, s in positions] == expected


def test_sequence_tracker_types_are_independent() -> None:
    tracker = SequenceTracker()
    assert tracker.accept(_snap(1, 10))
    assert tracker.accept(_kube(1, 1))  # lower seq, other type
    assert not tracker.accept(_kube(1, 1))
    assert tracker.accept(_snap(1, 11))
    assert not tracker.accept(_snap(1, 10))
    assert tracker.accept(_kube(1, 2))


def test_forget_lets_an_older_epoch_in() -> None:
    # A restarted sender whose clock stepped back: refused until the receiver
    # forgets the old connection's position.
    tracker = SequenceTracker()
    assert tracker.accept(_snap(100, 7))
    assert not tracker.accept(_snap(50, 0))
    tracker.forget("device_snapshot:myway5.com/cola")
    assert tracker.accept(_snap(50, 0))
    assert not tracker.accept(_snap(50, 0))


def test_forget_is_per_type() -> None:
    tracker = SequenceTracker()
    assert tracker.accept(_snap(100, 7))
    assert tracker.accept(_kube(100, 7))
    tracker.forget("kubelet_state")
    assert tracker.accept(_kube(1, 0))
    assert not tracker.accept(_snap(1, 0))


def test_forget_unknown_type_is_harmless() -> None:
    tracker = SequenceTracker()
    tracker.forget("device_snapshot")
    tracker.forget("no_such_type")
    assert tracker.accept(_snap(0, 0))


def test_rejected_message_does_not_move_the_position() -> None:
    tracker = SequenceTracker()
    assert tracker.accept(_snap(2, 5))
    assert not tracker.accept(_snap(1, 100))
    assert tracker.accept(_snap(2, 6))


def test_snapshot_carries_device_details() -> None:
    from colad.core.devices import DeviceNode, Mount

    device = Device(
        "cola1",
        numa_nodes=(0, 1),
        device_nodes=(DeviceNode("/dev/cola1", "/dev/cola"),),
        mounts=(Mount("/opt/cola", "/opt/cola"),),
        envs=(("A", "b"),),
        annotations=(("example.com/k", "v"),),
        cdi_devices=("example.com/cola=cola1",),
    )
    message = DeviceSnapshot(1, 2, DeviceSet.of([device, Device("bare")]), resource="example.com/pop")
    assert decode(encode(message)) == message
    assert message.key == "device_snapshot:example.com/pop"


def test_snapshots_of_two_resources_are_two_streams() -> None:
    tracker = SequenceTracker()
    assert tracker.accept(DeviceSnapshot(5, 9, DeviceSet(), resource="example.com/a"))
    assert tracker.accept(DeviceSnapshot(5, 3, DeviceSet(), resource="example.com/b"))
    assert not tracker.accept(DeviceSnapshot(5, 2, DeviceSet(), resource="example.com/b"))


# --- deltas and the set digest ---------------------------------------------------------

A_DELTA = DeviceDelta(
    3, 9, 4, (Device("cola4"), Device("cola5", numa_nodes=(1,))), ("cola1",), 0x0123456789ABCDEF, False, "x.io/y"
)


def test_delta_wire_format() -> None:
    body = json.loads(encode(A_DELTA))
    assert body == {
        "v": WIRE_VERSION,
        "type": "device_delta",
        "epoch": 3,
        "seq": 9,
        "base": 4,
        "resource": "x.io/y",
        "dir_present": False,
        "upsert": [["cola4", HEALTHY], {"id": "cola5", "numa_nodes": [1]}],
        "remove": ["cola1"],
        "digest": "0123456789abcdef",
    }
    assert decode(encode(A_DELTA)) == A_DELTA
    assert A_DELTA.key == DeviceSnapshot(0, 0, DeviceSet(), resource="x.io/y").key  # one stream per resource


def _delta_body(**changes: Any) -> bytes:
    body = json.loads(encode(A_DELTA))
    body.update(changes)
    return json.dumps(body).encode()


@pytest.mark.parametrize(
    ("data", "fragment"),
    [
        pytest.param(_delta_body(base=9), "base", id="base-not-before-seq"),
        pytest.param(_delta_body(base=-1), "base", id="negative-base"),
        pytest.param(_delta_body(base=True), "base", id="bool-base"),
        pytest.param(_delta_body(digest="0123456789ABCDEF"), "digest", id="uppercase-digest"),
        pytest.param(_delta_body(digest=12), "digest", id="digest-not-a-string"),
        pytest.param(_delta_body(digest="0" * 17), "digest", id="digest-too-long"),
        pytest.param(_delta_body(remove=["cola1", "cola1"]), "removed twice", id="remove-twice"),
        pytest.param(_delta_body(remove=["cola4"]), "both removed and upserted", id="remove-and-upsert"),
        pytest.param(_delta_body(remove=["cola::1"]), "invalid removed device ID", id="remove-replica-id"),
        pytest.param(_delta_body(remove=[7]), "invalid removed device ID", id="remove-not-a-string"),
        pytest.param(_delta_body(upsert=[["a", HEALTHY], ["a", HEALTHY]]), "duplicate", id="upsert-twice"),
        pytest.param(_delta_body(upsert=[["a", "Sick"]]), "invalid device entry", id="upsert-bad-health"),
        pytest.param(_delta_body(resource="no-slash"), "resource", id="bad-resource"),
    ],
)
def test_decode_rejects_bad_deltas(data: bytes, fragment: str) -> None:
    with pytest.raises(MessageError, match=fragment):
        decode(data)


DIGEST_DEVICES = [
    Device("a"),
    Device("a", UNHEALTHY),
    Device("b", numa_nodes=(0, 3)),
    Device("c", envs=(("MODE", "caf\u00e9"),)),
    Device("d", UNHEALTHY, problem="bad \udcff name"),
]


@pytest.mark.parametrize("device", DIGEST_DEVICES, ids=lambda d: f"{d.device_id}-{d.health}")
def test_device_entry_is_the_exact_encoded_entry(device: Device) -> None:
    body = encode(DeviceSnapshot(1, 1, DeviceSet.of([device])))
    assert device_entry(device) in body
    assert len(device_entry(device)) == device_wire_size(device)
    assert len(body) == snapshot_size(DeviceSnapshot(1, 1, DeviceSet.of([device])))


def test_digest_follows_every_change_incrementally() -> None:
    rng = random.Random(14)
    held: dict[str, Device] = {}
    digest = set_digest([])
    for _ in range(500):
        device = rng.choice(DIGEST_DEVICES)
        device = Device(f"{device.device_id}{rng.randrange(8)}", device.health, device.numa_nodes, envs=device.envs)
        old = held.get(device.device_id)
        if old is not None and rng.random() < 0.3:
            del held[device.device_id]
            digest = moved_digest(digest, [old], [])
        else:
            held[device.device_id] = device
            digest = moved_digest(digest, [old] if old else [], [device])
        assert digest == set_digest(held.values())
    assert set_digest([Device("a")]) != set_digest([Device("a", UNHEALTHY)])
    assert set_digest([Device("a"), Device("b")]) == set_digest([Device("b"), Device("a")])


# --- why a well-formed device is Unhealthy ---------------------------------------------


def test_reason_round_trips_and_is_not_bare() -> None:
    from colad.core.devices import MAX_REASON_BYTES

    sick = Device("cola1", UNHEALTHY, reason="host path /dev/cola1 is missing")
    longest = Device("cola2", UNHEALTHY, reason="x" * MAX_REASON_BYTES)
    assert not sick.bare and Device("cola1", UNHEALTHY).bare
    message = DeviceSnapshot(1, 2, DeviceSet.of([sick, longest, Device("cola3", UNHEALTHY)]))
    assert decode(encode(message)) == message
    assert json.loads(device_entry(sick)) == {"id": "cola1", "health": UNHEALTHY, "reason": sick.reason}
    assert device_entry(Device("cola3", UNHEALTHY)) == b'["cola3","Unhealthy"]'  # "" is not encoded
    delta = DeviceDelta(1, 3, 2, (sick,), (), set_digest([sick]))
    assert decode(encode(delta)) == delta


def test_a_reason_change_is_a_change() -> None:
    a, b = Device("cola1", UNHEALTHY, reason="probe: exit 1"), Device("cola1", UNHEALTHY, reason="probe: exit 2")
    assert device_entry(a) != device_entry(b)
    assert set_digest([a]) != set_digest([b]) != set_digest([Device("cola1", UNHEALTHY)])
    from colad.core.devices import diff

    assert diff(DeviceSet.of([a]), DeviceSet.of([b])).changed == ("cola1",)


def _reason_entry(reason: object, health: str = UNHEALTHY) -> bytes:
    return _snapshot(devices=[{"id": "cola1", "health": health, "reason": reason}])


@pytest.mark.parametrize(
    ("data", "fragment"),
    [
        pytest.param(_reason_entry("x" * 513), "longer than 512", id="reason-too-long"),
        pytest.param(_reason_entry("\u00e9" * 257), "longer than 512", id="reason-too-many-bytes"),
        pytest.param(_reason_entry("x" * 10**6), "longer than 512", id="reason-huge"),
        pytest.param(_reason_entry(7), "not a string", id="reason-not-a-string"),
        pytest.param(_reason_entry("gone", HEALTHY), "only an Unhealthy", id="reason-on-healthy"),
        pytest.param(_reason_entry("a\nb"), "one line", id="reason-two-lines"),
        pytest.param(_reason_entry("a\x00b"), "NUL", id="reason-nul"),
        pytest.param(
            _snapshot(devices=[{"id": "c", "health": UNHEALTHY, "problem": "p", "reason": "r"}]),
            "carry nothing else",
            id="reason-on-malformed",
        ),
        pytest.param(_snapshot(devices=[{"id": "c", "reasons": "r"}]), "unknown device keys", id="unknown-key"),
    ],
)
def test_decode_bounds_the_reason(data: bytes, fragment: str) -> None:
    with pytest.raises(MessageError, match=fragment):
        decode(data)


def test_clip_reason_makes_a_valid_reason() -> None:
    from colad.core.devices import MAX_REASON_BYTES, clip_reason, device_problem

    for text in ("", "fine", "first\nsecond", "\u00e9" * 600, "a\x00b", "bad \udcff byte", "x" * 5000):
        reason = clip_reason(text)
        assert len(reason.encode("utf-8")) <= MAX_REASON_BYTES
        assert device_problem(Device("d", UNHEALTHY, reason=reason)) is None
    assert clip_reason("first\nsecond") == "first"


# --- a device's own prepare crosses the queue to PreStartContainer --------------------


def test_prepare_round_trips_none_empty_and_a_command() -> None:
    own = Device("cola1", prepare=("/usr/bin/reset", "--hard"))
    none_here = Device("cola2", prepare=())
    message = DeviceSnapshot(1, 2, DeviceSet.of([own, none_here, Device("cola3")]))
    decoded = decode(encode(message))
    assert decoded == message
    assert isinstance(decoded, DeviceSnapshot) and decoded.devices.by_id["cola3"].prepare is None
    assert json.loads(device_entry(own)) == {"id": "cola1", "prepare": ["/usr/bin/reset", "--hard"]}
    assert json.loads(device_entry(none_here)) == {"id": "cola2", "prepare": []}
    assert not own.bare and not none_here.bare and Device("cola3", probe=("/bin/p",)).bare  # probe stays local
    assert len({set_digest([d]) for d in (own, none_here, Device("cola1"))}) == 3  # a change of prepare is a change
    delta = DeviceDelta(1, 3, 2, (own,), (), set_digest([own]))
    assert decode(encode(delta)) == delta


def _prepare_entry(prepare: object) -> bytes:
    return _snapshot(devices=[{"id": "cola1", "prepare": prepare}])


@pytest.mark.parametrize(
    ("data", "fragment"),
    [
        pytest.param(_prepare_entry("/bin/reset"), "not a list", id="prepare-a-string"),
        pytest.param(_prepare_entry(["/bin/reset", 3]), "list of strings", id="prepare-arg-not-a-string"),
        pytest.param(_prepare_entry(["/bin/r"] + ["a"] * 64), "at most 64", id="prepare-too-many-args"),
        pytest.param(_prepare_entry(["/bin/r"] * 10**5), "at most 64", id="prepare-huge"),
        pytest.param(_prepare_entry(["reset"]), "absolute path", id="prepare-relative"),
        pytest.param(_prepare_entry(["/bin/r", "a\x00b"]), "NUL", id="prepare-nul"),
        pytest.param(_prepare_entry(["/bin/r", "x" * 4097]), "longer than 4096", id="prepare-arg-too-long"),
        pytest.param(_prepare_entry(["/bin/r", "\udcff"]), "UTF-8", id="prepare-surrogate"),
        pytest.param(
            _snapshot(devices=[{"id": "c", "health": UNHEALTHY, "problem": "p", "prepare": []}]),
            "carry nothing else",
            id="prepare-on-malformed",
        ),
    ],
)
def test_decode_validates_the_prepare(data: bytes, fragment: str) -> None:
    with pytest.raises(MessageError, match=fragment):
        decode(data)
