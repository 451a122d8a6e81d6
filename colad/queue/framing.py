"""Frames and peers of the local queue: a 4-byte big-endian length, then one encoded message.

Both ends of the queue (colad/queue/server.py's server, colad/queue/client.py) frame with `frame` and
check the other end's uid with `peer_of` (SO_PEERCRED) before trusting a byte.
"""

from __future__ import annotations

import socket
import struct
from dataclasses import dataclass

from colad.queue import messages

HEADER = struct.Struct("!I")
_CRED = struct.Struct("3i")  # struct ucred: pid, uid, gid


@dataclass(frozen=True)
class Peer:
    pid: int
    uid: int
    gid: int


def peer_of(sock: socket.socket) -> Peer:
    raw = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _CRED.size)
    return Peer(*_CRED.unpack(raw))


def frame(message: messages.Message) -> bytes:
    payload = messages.encode(message)
    return HEADER.pack(len(payload)) + payload
