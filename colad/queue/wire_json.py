"""The JSON form of the local queue's bodies: a message's envelope (messages.py) and a device's
entry in it (device_wire.py) are written by this one function."""

from __future__ import annotations

import json


def dumps(body: object) -> bytes:
    """The wire's JSON form of `body`: compact and ASCII."""
    # ASCII on the wire (tests/unit/queue/test_messages.py): any str encodes, a surrogate-escaped name too,
    # at the price of 6 bytes per non-ASCII character, which messages.snapshot_size() counts exactly.
    return json.dumps(body, separators=(",", ":"), ensure_ascii=True).encode("ascii")
