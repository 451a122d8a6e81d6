"""Hostile device files and the pure rules discovery's limits rest on.

Parsing has a budget: every adversarial class and thousands of random files
parse in bounded time to a Device or an Unhealthy one with a reason. Snapshot
sizes are exact, not estimated. The racily-clean rule of the stat cache.
"""

from __future__ import annotations

import random
import time
import tomllib

import pytest

from colad.core.constants import HEALTHY, MAX_DEVICE_FILE_BYTES, UNHEALTHY
from colad.core.devices import Device, DeviceNode, DeviceSet, Mount
from colad.discovery import devicefile
from colad.discovery.devicedir import RACY_WINDOW_NS, racy
from colad.discovery.devicefile import MAX_KEY_PARTS, deep_key, parse
from colad.queue import device_wire, messages
from colad.queue.snapshots import TOO_LARGE, fit_the_queue

pytestmark = pytest.mark.unit

# Generous: the worst class takes ~0.1 s on a loaded 2-CPU machine; before the pre-scan, 20 s.
BUDGET_S = 1.0
N = MAX_DEVICE_FILE_BYTES


def _fill(unit: str, head: str = "", tail: str = "", sep: str = "") -> str:
    count = (N - len(head) - len(tail)) // (len(unit) + len(sep))
    return head + sep.join([unit] * count) + tail


# Each adversarial class at the file size limit. tomllib alone took (3.11, this machine):
# dotted-key 21 s, dotted-key-spaced/quoted 5 s, header/array-header/inline dotted keys 2 s each.
ADVERSARIAL = {
    "dotted-key": _fill("a", tail=" = 1\n", sep="."),
    "dotted-key-spaced": _fill("a", tail=" = 1\n", sep=" . "),
    "dotted-key-quoted": _fill('"a"', tail=" = 1\n", sep="."),
    "dotted-key-literal": _fill("'a'", tail=" = 1\n", sep="."),
    "header-dotted": _fill("a", head="[", tail="]\n", sep="."),
    "array-header-dotted": _fill("a", head="[[", tail="]]\n", sep="."),
    "inline-dotted": _fill("a", head="x = {", tail=" = 1}\n", sep="."),
    "many-8-part-keys": "".join(f"a.a.a.a.a.a.a.k{i} = 1\n" for i in range(N // 22)),
    "many-8-part-headers": "".join(f"[a.a.a.a.a.a.a.k{i}]\n" for i in range(N // 22)),
    "many-keys": "".join(f"k{i} = 1\n" for i in range(N // 10)),
    "many-tables": "".join(f"[t{i}]\n" for i in range(N // 10)),
    "many-array-tables": _fill("[[device_nodes]]\n"),
    "long-array": _fill("1", head="x = [", tail="]\n", sep=","),
    "long-float-array": _fill("1.5", head="x = [", tail="]\n", sep=","),
    "nested-arrays": "x = " + "[" * (N // 2 - 4) + "]" * (N // 2 - 4),
    "nested-inline-tables": "x = " + "{a=" * (N // 4) + "1" + "}" * (N // 4),
    "huge-string": 'x = "' + "a" * (N - 10) + '"\n',
    "huge-escapes": 'x = "' + "\\u00e9" * ((N - 10) // 6) + '"\n',
    "huge-multiline": 'x = """' + "a.\\\n" * ((N - 20) // 4) + '"""\n',
    "unterminated-escapes": '"' + '\\"' * (N // 2 - 1),
    "bare-word": "a" * N,
    "dots": "." * N,
    "quotes": '"' * N,
    "apostrophes": "'" * N,
    "quote-pairs-dots": '"a"."' * (N // 5),
    "comments": _fill("#aaaaaaaa\n"),
    "non-utf8": "x = 1\n" * 100 + "\udcff",  # encoded below with surrogateescape: one bad byte
    "near-limit-valid": "[envs]\n" + "".join(f'K{i} = "{"v" * 400}"\n' for i in range(120)),
    "over-limit": "#" * (N + 1),
}


def _bytes(text: str) -> bytes:
    return text.encode("utf-8", "surrogateescape")


def _timed_parse(data: bytes) -> tuple[Device, float]:
    started = time.perf_counter()
    device = parse("dev", data)
    return device, time.perf_counter() - started


@pytest.mark.parametrize("text", list(ADVERSARIAL.values()), ids=list(ADVERSARIAL))
def test_adversarial_file_parses_within_budget_to_a_reason(text: str) -> None:
    device, took = _timed_parse(_bytes(text))
    assert took < BUDGET_S, f"parse took {took:.2f} s"
    assert device.device_id == "dev"
    if device.health == UNHEALTHY:
        assert device.problem and "\n" not in device.problem  # a clear one-line reason
    else:
        assert device.problem == ""


def test_deep_keys_are_refused_with_the_line() -> None:
    device = parse("dev", b'health = "Healthy"\n' + b".".join([b"a"] * 9) + b" = 1\n")
    assert device.health == UNHEALTHY
    assert device.problem == f"a key at line 2 has more than {MAX_KEY_PARTS} dotted parts (the format nests 2 deep)"


VALID = [
    'envs.FOO = "a.b.c.d.e.f.g.h.i.j"',
    'annotations."example.com/a.b.c.d.e.f.g.h.i" = "x"',
    "[envs]\nFOO = 'a.b.c.d.e.f.g.h.i.j.k'",
    '[[device_nodes]]\nhost_path = "/dev/a.b.c.d.e.f.g.h.i.j"  # a.b.c.d.e.f.g.h.i.j.k.l',
    'cdi_devices = ["vendor.com/class=a.b.c.d.e.f.g.h.i"]',
    'mounts = [{host_path = "/a.b.c.d.e.f.g.h.i.j", read_only = false}]',
    'envs.FOO = """\na.b.c.d.e.f.g.h.i.j\n"""',
    'envs.FOO = """"quoted"""" # a.b.c.d.e.f.g.h.i.j',
    "envs.FOO = '''a.b.c.d.e.f.g.h.i.j''''",
    'envs . FOO = "x\\"a.b.c.d.e.f.g.h.i.j"',
    "numa_nodes = [0, 1]\nversion = 1",
]


@pytest.mark.parametrize("text", VALID, ids=range(len(VALID)))
def test_dots_in_strings_and_comments_are_not_keys(text: str) -> None:
    assert deep_key(text) is None
    assert parse("dev", text.encode()).problem == ""


def test_deep_key_agrees_with_tomllib_on_the_key_tuple() -> None:
    """Wherever tomllib reads a key of n parts, the scan sees a chain of at least n (never fewer)."""
    for parts in range(1, 12):
        for sep in (".", " . ", "\t.\t"):
            for part in ("a", '"a.b"', "'a.b'", '"a\\"b"'):
                text = f"x = 'q.q.q.q.q.q.q.q.q.q'\n{sep.join([part] * parts)} = 1\n"
                depth = len(_deepest(tomllib.loads(text)))
                assert (deep_key(text) is not None) == (depth > MAX_KEY_PARTS), text


def _deepest(table: object) -> tuple[str, ...]:
    best: tuple[str, ...] = ()
    if isinstance(table, dict):
        for key, value in table.items():
            path = (key, *_deepest(value))
            best = max(best, path, key=len)
    return best


# --- random files: the property, over a fixed list of seeds ---------------------------------

PIECES = [
    "version = 1\n",
    'health = "Healthy"\n',
    'health = "Unhealthy"\n',
    "numa_nodes = [0, 1]\n",
    "[envs]\n",
    'A = "é"\n',
    "[annotations]\n",
    '"example.com/x" = "y"\n',
    "[[device_nodes]]\n",
    'host_path = "/dev/x"\n',
    "[[mounts]]\n",
    "read_only = true\n",
    "a.",
    "a",
    ".",
    " = ",
    "1",
    '"',
    "'",
    '"""',
    "'''",
    "[",
    "]",
    "{",
    "}",
    ",",
    "\n",
    "#",
    "\\",
    "\\u00e9",
    "é",
    "\x00",
    "\x7f",
    "\t",
    "1.5",
    "1979-05-27T07:32:00Z",
    "inf",
    "true",
]


def _random_file(rng: random.Random) -> bytes:
    kind = rng.random()
    if kind < 0.1:
        return rng.randbytes(rng.randint(0, 2048))
    out = [rng.choice(PIECES) for _ in range(rng.randint(0, 200))]
    if kind < 0.3:  # a long chain of one piece, the shape that made tomllib quadratic
        out.insert(rng.randrange(len(out) + 1), rng.choice(PIECES) * rng.randint(100, 4000))
    return "".join(out).encode("utf-8", "surrogateescape")[: MAX_DEVICE_FILE_BYTES + 1]


@pytest.mark.parametrize("seed", range(8))
def test_random_files_parse_within_budget_and_never_raise(seed: int) -> None:
    rng = random.Random(seed)
    worst = 0.0
    for _ in range(300):
        data = _random_file(rng)
        device, took = _timed_parse(data)
        worst = max(worst, took)
        assert isinstance(device, Device)
        assert (device.health == UNHEALTHY and device.problem) or device.problem == ""
        assert parse("dev", data) == device  # the result depends on the data alone
    assert worst < BUDGET_S, f"slowest random parse {worst:.2f} s"


# --- exact sizes -----------------------------------------------------------------


def _device(rng: random.Random, i: int) -> Device:
    text = "".join(
        rng.choice(["a", "é", '"', "\\", "\u2603", "\x01", "/", "\U0001f600"]) for _ in range(rng.randint(1, 40))
    )
    if rng.random() < 0.3:
        return Device(f"d{i}", rng.choice([HEALTHY, UNHEALTHY]))
    if rng.random() < 0.2:
        return Device(f"d{i}", UNHEALTHY, problem=text)
    return Device(
        f"d{i}",
        numa_nodes=(0, 3),
        device_nodes=(DeviceNode("/dev/x", "/dev/" + text.replace("\\", "b")),),
        mounts=(Mount("/m", "/n", False),),
        envs=(("K", text),),
        annotations=(("example.com/a", text),),
        cdi_devices=("vendor.com/class=x",),
    )


@pytest.mark.parametrize("seed", range(5))
def test_snapshot_size_is_exact(seed: int) -> None:
    rng = random.Random(seed)
    for _ in range(50):
        found = DeviceSet.of(_device(rng, i) for i in range(rng.randint(0, 30)))
        snapshot = messages.DeviceSnapshot(rng.randint(0, 2**62), rng.randint(0, 2**62), found, rng.random() < 0.5)
        sizes = [device_wire.device_wire_size(d) for d in found]
        assert (
            messages.snapshot_size(snapshot)
            == messages.snapshot_size(snapshot, sizes)
            == len(messages.encode(snapshot))
        )


def test_non_ascii_content_is_measured_not_estimated() -> None:
    """60 KiB of 'é' per device is 360 KiB of JSON; forty of them exceed the 12 MiB frame."""
    heavy = Device(
        "heavy", envs=(("K", "é" * 4000),) * 1, annotations=tuple((f"example.com/k{i}", "é" * 4000) for i in range(15))
    )
    found = DeviceSet.of(
        [Device(f"cola{i:02d}", **{f: getattr(heavy, f) for f in ("envs", "annotations")}) for i in range(40)]
        + [Device("plain")]
    )
    snapshot = messages.DeviceSnapshot(1, 1, found)
    assert messages.snapshot_size(snapshot) > messages.MAX_MESSAGE_BYTES
    fitted = fit_the_queue(snapshot, {})
    encoded = messages.encode(messages.DeviceSnapshot(1, 2**63 - 1, fitted.devices))  # never raises
    assert len(encoded) == fitted.size <= messages.MAX_MESSAGE_BYTES
    assert fitted.devices.ids == found.ids and fitted.dropped == ()
    assert fitted.devices.get("plain") == Device("plain")
    for device_id in fitted.demoted:
        assert fitted.devices.get(device_id) == Device(device_id, UNHEALTHY, problem=TOO_LARGE)
    assert fit_the_queue(snapshot, {}) == fitted  # deterministic


def test_when_even_bare_entries_do_not_fit_the_last_ids_are_left_out() -> None:
    found = DeviceSet.of(Device(f"d{i:05d}") for i in range(400))
    snapshot = messages.DeviceSnapshot(1, 1, found)
    fitted = fit_the_queue(snapshot, {}, limit=4000)
    assert fitted.dropped and fitted.demoted == ()
    assert set(fitted.devices.ids) | set(fitted.dropped) == set(found.ids)
    assert max(fitted.devices.ids) < min(fitted.dropped)
    size = messages.snapshot_size(messages.DeviceSnapshot(1, 2**63 - 1, fitted.devices))
    assert size == fitted.size <= 4000


# --- the racily-clean rule ---------------------------------------------------------

S = 1_000_000_000
RACY_CASES = [
    ("written-in-the-read-tick", 100 * S, 100 * S, 100 * S, True),
    ("ctime-in-the-window", 90 * S, 100 * S - RACY_WINDOW_NS, 100 * S, True),
    ("mtime-in-the-future", 200 * S, 1, 100 * S, True),
    ("just-older-than-the-window", 100 * S - RACY_WINDOW_NS - 1, 1, 100 * S, False),
    ("long-ago", 1, 1, 100 * S, False),
]


@pytest.mark.parametrize(
    ("mtime", "ctime", "read", "expected"), [c[1:] for c in RACY_CASES], ids=[c[0] for c in RACY_CASES]
)
def test_racily_clean_rule(mtime: int, ctime: int, read: int, expected: bool) -> None:
    assert racy(mtime, ctime, read) is expected


def test_a_racy_entry_is_not_trusted_and_settles_after_the_window() -> None:
    from colad.discovery.devicedir import Cached

    fresh = Cached.of((1, 4, 100 * S, 100 * S), Device("a"), read_ns=100 * S + 5)
    assert not fresh.trusted and fresh.settles_ns == 100 * S + RACY_WINDOW_NS + 1
    old = Cached.of((1, 4, 90 * S, 90 * S), Device("a"), read_ns=100 * S)
    assert old.trusted and old.settles_ns is None
    assert devicefile.parse("a", b"") == Device("a")
