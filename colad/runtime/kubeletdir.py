"""Facts about the kubelet's device-plugins directory, for the roles and the tools alike.

Which names are colad's plugin sockets (colad-<unix ms>.sock), how a socket is
identified across a kubelet restart (dev:ino:ctime), and the one liveness probe
(a plain connect()) that the queue, `colad supervise` and `colad check` use
before they remove, reuse or dial a socket path. No pyinotify, no gRPC here.
"""

from __future__ import annotations

import enum
import errno
import os
import socket
import stat
from collections.abc import Collection
from dataclasses import dataclass

from colad.core import constants


def socket_identity(path: str) -> str:
    """ "dev:ino:ctime_ns" of the socket at `path`, or "" when there is none."""
    try:
        st = os.stat(path)
    except (OSError, ValueError):  # ValueError: an embedded NUL
        return ""
    if not stat.S_ISSOCK(st.st_mode):
        return ""
    return f"{st.st_dev}:{st.st_ino}:{st.st_ctime_ns}"


def is_plugin_socket_name(name: str) -> bool:
    return name.startswith(constants.PLUGIN_SOCKET_PREFIX) and name.endswith(constants.PLUGIN_SOCKET_SUFFIX)


def endpoint_name(stamp_ms: int) -> str:
    """The socket name for a server started at `stamp_ms` (Unix milliseconds)."""
    return f"{constants.PLUGIN_SOCKET_PREFIX}{stamp_ms}{constants.PLUGIN_SOCKET_SUFFIX}"


def fresh_socket_path(kubelet_dir: str, now: float, taken: Collection[str] = ()) -> str:
    """The path of an unused plugin socket: the kubelet keys endpoints by path, so never reuse one.

    Named after `now` (wall seconds) in milliseconds, counted up past any name that
    exists on disk or is in `taken` (the paths this plugin serves on).
    """
    stamp = int(now * 1000)
    while True:
        path = os.path.join(kubelet_dir, endpoint_name(stamp))
        if not os.path.lexists(path) and path not in taken:
            return path
        stamp += 1


def plugin_socket_names(kubelet_dir: str) -> list[str]:
    """Every entry named like colad's sockets, whatever it is, sorted; raises OSError if unlistable."""
    return sorted(n for n in os.listdir(kubelet_dir) if is_plugin_socket_name(n))


def plugin_sockets(kubelet_dir: str) -> tuple[str, ...]:
    """Names of the sockets (only sockets: a file or directory of that name is not ours) named like colad's."""
    try:
        names = plugin_socket_names(kubelet_dir)
    except OSError:
        return ()
    return tuple(n for n in names if is_socket(os.path.join(kubelet_dir, n)))


def is_socket(path: str) -> bool:
    """Is `path` itself (never what a symlink points to) a socket?"""
    try:
        return stat.S_ISSOCK(os.lstat(path).st_mode)
    except OSError:
        return False


class Dial(enum.Enum):
    """What one connect() says of a socket path."""

    LIVE = "live"  # something accepted the connection
    DEAD = "dead"  # nothing listens: the file is missing or refuses connections
    UNSURE = "unsure"  # a timeout, a full backlog (EAGAIN), EACCES...: somebody may well be there


# A connect() that fails with these found no listener behind the path: a stale or vanished socket.
DEAD_ERRNOS = {errno.ENOENT: "no such file", errno.ECONNREFUSED: "connection refused"}


@dataclass(frozen=True)
class SocketProbe:
    """The answer of `dial` and, unless LIVE, the reason in words."""

    answer: Dial
    reason: str = ""

    @property
    def live(self) -> bool:
        return self.answer is Dial.LIVE

    @property
    def dead(self) -> bool:
        return self.answer is Dial.DEAD


def dial(path: str, timeout: float = 1.0) -> SocketProbe:
    """One plain AF_UNIX connect() to `path`, closed at once; never raises."""
    try:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    except OSError as exc:
        return SocketProbe(Dial.UNSURE, exc.strerror or str(exc))
    with sock:
        sock.settimeout(timeout)
        try:
            sock.connect(path)
        except OSError as exc:
            if exc.errno in DEAD_ERRNOS:
                return SocketProbe(Dial.DEAD, DEAD_ERRNOS[exc.errno])
            return SocketProbe(Dial.UNSURE, exc.strerror or str(exc))
        except (ValueError, TypeError) as exc:  # an embedded NUL: no socket can be there
            return SocketProbe(Dial.DEAD, str(exc))
    return SocketProbe(Dial.LIVE)
