"""Hostile protobuf messages made from a message's descriptor: every field, many shapes, raw wire bytes.

`cases(descriptor)` yields (label, bytes): a valid baseline with one field (found by walking the
descriptor, nested messages included) replaced by one shape — empty, very long, digits only, Unicode
(RTL, NUL, control characters, invalid UTF-8 such as an encoded surrogate), repeated and duplicated
entries, huge repeated counts, negative and out-of-range numbers, a wrong wire type — plus an unknown
field. The bytes are written by hand, so shapes the Python API refuses (invalid UTF-8) are sent too.
A field added to a .proto is covered without a change here. `mutate(descriptor, data)` turns fuzzer
bytes into one such message (the atheris targets).
"""

from __future__ import annotations

from collections.abc import Iterator

from google.protobuf.descriptor import Descriptor, FieldDescriptor

VALID_ID = "cocacola"
STRINGS: dict[str, bytes] = {
    "valid": VALID_ID.encode(),
    "replica": b"cocacola::0",
    "empty": b"",
    "long-64": b"a" * 64,
    "long-5000": b"a" * 5000,
    "digits-5000": b"1" * 5000,
    "digits-mixed": b"cola" + b"9" * 4400 + b"x",
    "replica-digits": b"cocacola::" + b"0" * 4400,
    "replica-huge": b"cocacola::99999",
    "arabic-digits": "cola٣٣".encode(),
    "rtl": "\u202ecola".encode(),
    "nul": b"co\x00la",
    "control": b"\x01\x1f\x7f\n",
    "emoji": "\U0001f964".encode(),
    "surrogate-utf8": b"\xed\xa0\x80",  # not UTF-8: decoders must refuse it, never crash
    "latin1": b"caf\xe9",
    "comma": b"a,b",
    "separator-only": b"::",
    "dot": b".hidden",
    "space": b" cola",
}
NUMBERS = {"zero": 0, "one": 1, "negative": -1, "int32-min": -(2**31), "int32-max": 2**31 - 1, "huge": 2**63 - 1}
REPEATS = {"none": 0, "duplicated": 3, "many": 10_000}


def _varint(value: int) -> bytes:
    value &= (1 << 64) - 1  # negative numbers are ten bytes on the wire, as protobuf writes them
    out = bytearray()
    while True:
        byte = value & 0x7F
        value >>= 7
        if value:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def _key(number: int, wire_type: int) -> bytes:
    return _varint(number << 3 | wire_type)


def _delimited(number: int, payload: bytes) -> bytes:
    return _key(number, 2) + _varint(len(payload)) + payload


def _scalar(field: FieldDescriptor, value: object) -> bytes:
    if field.type == FieldDescriptor.TYPE_STRING or field.type == FieldDescriptor.TYPE_BYTES:
        assert isinstance(value, bytes)
        return _delimited(field.number, value)
    if field.type == FieldDescriptor.TYPE_MESSAGE:
        assert isinstance(value, bytes)
        return _delimited(field.number, value)
    assert isinstance(value, int)
    return _key(field.number, 0) + _varint(value)  # int32, int64, bool, enums: varints


def _is_repeated(field: FieldDescriptor) -> bool:
    repeated = getattr(field, "is_repeated", None)  # protobuf 5.29+; `label` is gone from 7
    if repeated is None:
        return bool(field.label == FieldDescriptor.LABEL_REPEATED)  # bookworm's 3.21
    return bool(repeated)


Plain = dict[str, bytes]  # a string field's plain value by field name (VALID_ID for the others)


def baseline_value(field: FieldDescriptor, plain: Plain) -> object:
    if field.type == FieldDescriptor.TYPE_MESSAGE:
        return baseline(field.message_type, plain=plain)
    if field.type in (FieldDescriptor.TYPE_STRING, FieldDescriptor.TYPE_BYTES):
        return plain.get(field.name, VALID_ID.encode())
    return 1


def baseline(message: Descriptor, replace: dict[str, bytes] | None = None, plain: Plain | None = None) -> bytes:
    """A message with every field set once to a plain value; `replace` gives some fields' encodings instead."""
    replace, plain = replace or {}, plain or {}
    out = bytearray()
    for field in message.fields:
        out += replace[field.name] if field.name in replace else _scalar(field, baseline_value(field, plain))
    return bytes(out)


def _shapes(field: FieldDescriptor, plain: Plain) -> Iterator[tuple[str, bytes]]:
    """Encodings of `field` alone: each shape of its type, and for a repeated field each count."""
    if field.type == FieldDescriptor.TYPE_MESSAGE:
        values: dict[str, object] = {"empty": b""}
    elif field.type in (FieldDescriptor.TYPE_STRING, FieldDescriptor.TYPE_BYTES):
        values = dict(STRINGS)
    else:
        values = dict(NUMBERS)
    for name, value in values.items():
        yield name, _scalar(field, value)
    yield "wrong-wire-type", _key(field.number, 5) + b"\x00\x00\x00\x00"  # a fixed32 where none is declared
    if _is_repeated(field):
        one = _scalar(field, baseline_value(field, plain))
        for name, count in REPEATS.items():
            yield f"x{name}", one * count
        if field.type in (FieldDescriptor.TYPE_STRING, FieldDescriptor.TYPE_BYTES):
            yield "valid-then-bad", one + _scalar(field, STRINGS["digits-5000"])


def cases(message: Descriptor, prefix: str = "", plain: Plain | None = None) -> Iterator[tuple[str, bytes]]:
    """(label, wire bytes) of `message`: its baseline, each field of any depth in each shape, an unknown field.

    `plain` names the value of some string fields in the baseline (an answer's resource_name, say).
    """
    plain = plain or {}
    if not prefix:
        yield "baseline", baseline(message, plain=plain)
        yield "empty-message", b""
        yield "unknown-field", baseline(message, plain=plain) + _delimited(99, b"\xff\xfe")
    for field in message.fields:
        path = f"{prefix}{field.name}"
        for shape, encoded in _shapes(field, plain):
            yield f"{path}={shape}", baseline(message, {field.name: encoded}, plain)
        if field.type == FieldDescriptor.TYPE_MESSAGE:
            for label, inner in cases(field.message_type, f"{path}.", plain):
                yield label, baseline(message, {field.name: _delimited(field.number, inner)}, plain)


def mutate(message: Descriptor, data: bytes) -> bytes:
    """Fuzzer bytes as one hostile message: its first bytes pick fields and shapes, the rest is a string."""
    if not data:
        return b""
    out = bytearray()
    position = 0
    while position + 2 <= len(data) and position < 64:
        fields = message.fields
        if not fields:
            break
        field = fields[data[position] % len(fields)]
        choice = data[position + 1]
        position += 2
        if field.type == FieldDescriptor.TYPE_MESSAGE:
            inner = mutate(field.message_type, data[position : position + 16])
            out += _delimited(field.number, inner) * (1 + choice % 3)
        elif field.type in (FieldDescriptor.TYPE_STRING, FieldDescriptor.TYPE_BYTES):
            shapes = list(STRINGS.values())
            raw = shapes[choice % (len(shapes) + 1)] if choice % (len(shapes) + 1) < len(shapes) else data[position:]
            out += _scalar(field, raw) * (1 + (choice >> 6))
        else:
            numbers = list(NUMBERS.values())
            out += _scalar(
                field, numbers[choice % len(numbers)] if choice < 200 else int.from_bytes(data[:8], "little")
            )
    return bytes(out)
