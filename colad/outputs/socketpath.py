"""Socket paths colad binds: claimed only when stale and its own, and the record of those it made.

Used for the queue socket in the run directory and the plugin sockets in the
kubelet directory. A path is removed only when it is a socket of our uid that
no process answers on (kubeletdir.dial) and, in the kubelet directory, one
colad recorded creating (`SocketRecord`, state/sockets.json); anything else stays.
"""

from __future__ import annotations

import json
import os
import stat
from collections.abc import Callable

from colad.core.errors import InstanceError
from colad.outputs import statefile
from colad.runtime import kubeletdir, log

LOG = log.get(__name__)


class ForeignPathError(InstanceError):
    """The path holds something colad cannot tell is its own (not a socket, another uid's, not recorded)."""


def kind_of(mode: int) -> str:
    """What an lstat() mode is, in words, for a log line."""
    for test, name in (
        (stat.S_ISSOCK, "socket"),
        (stat.S_ISLNK, "symlink"),
        (stat.S_ISDIR, "directory"),
        (stat.S_ISREG, "regular file"),
        (stat.S_ISFIFO, "FIFO"),
    ):
        if test(mode):
            return name
    return "device node"


def claim_socket_path(path: str, *, owns: Callable[[os.stat_result], bool] | None = None) -> None:
    """Make `path` free for bind(): remove a stale socket of ours, refuse a live one, touch nothing else.

    lstat() first, never following a symlink: only a socket of our uid (and, with
    `owns`, one colad recorded creating) that refuses connections is removed.
    Anything else raises ForeignPathError and stays; a live socket raises InstanceError.
    """
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return
    if not stat.S_ISSOCK(st.st_mode):
        raise ForeignPathError(f"{path} is a {kind_of(st.st_mode)}, not a socket colad made; left alone")
    if st.st_uid != os.geteuid():
        raise ForeignPathError(f"{path} is a socket of uid {st.st_uid}, not ours; left alone")
    if owns is not None and not owns(st):
        raise ForeignPathError(f"{path} is a socket colad has no record of creating; left alone")
    probe = kubeletdir.dial(path, 1.0)
    if probe.dead:
        # Nobody listens (or it just went away): a stale socket left by a dead process.
        _unlink_if_same(path, st)
        return
    if not probe.live:
        # EAGAIN (a full backlog), a timeout, EACCES...: somebody may well be there.
        raise InstanceError(f"{path} may be in use by a live process ({probe.reason}); is another colad running?")
    raise InstanceError(f"{path} is in use by a live process; is another colad running?")


def _unlink_if_same(path: str, seen: os.stat_result) -> None:
    """Remove `path` only if it is still the very socket we looked at (it may have been replaced since)."""
    try:
        now = os.lstat(path)
    except FileNotFoundError:
        return
    if stat.S_ISSOCK(now.st_mode) and (now.st_dev, now.st_ino) == (seen.st_dev, seen.st_ino):
        os.unlink(path)


class SocketRecord:
    """The plugin sockets colad created, by path with (dev, inode), kept in the run directory.

    Only a socket recorded here may be removed from the kubelet directory: a
    name that merely looks like ours may belong to someone else. Never raises.
    """

    def __init__(self, path: str) -> None:
        self.path = path
        self.entries: dict[str, tuple[int, int]] = {}
        try:
            with open(path, encoding="utf-8") as handle:
                raw = json.load(handle)
            for item in raw.get("sockets", []):
                name, dev, ino = item
                if isinstance(name, str) and isinstance(dev, int) and isinstance(ino, int):
                    self.entries[name] = (dev, ino)
        except FileNotFoundError:
            pass
        except (OSError, ValueError, TypeError, AttributeError) as exc:
            LOG.warning("socket record unreadable; starting a new one", path=path, error=exc)

    def owns(self, path: str, st: os.stat_result) -> bool:
        return stat.S_ISSOCK(st.st_mode) and self.entries.get(path) == (st.st_dev, st.st_ino)

    def intact(self, path: str) -> bool:
        """Is our socket still at `path` (not removed, not replaced by something else)?"""
        try:
            return self.owns(path, os.lstat(path))
        except OSError:
            return False

    def add(self, path: str) -> None:
        try:
            st = os.lstat(path)
        except OSError as exc:
            LOG.warning("socket not recorded", path=path, error=exc)
            return
        self.entries[path] = (st.st_dev, st.st_ino)
        self._save()

    def remove(self, path: str) -> None:
        """Unlink `path` if it is still our socket, and forget it; anything else there stays."""
        try:
            if self.intact(path):
                os.unlink(path)
        except OSError as exc:
            LOG.warning("old socket not removed", path=path, error=exc)
        if self.entries.pop(path, None) is not None:
            self._save()

    def prune(self) -> None:
        """Forget sockets that are gone (the kubelet removes every socket when it restarts)."""
        gone = [p for p in self.entries if not self.intact(p)]
        for path in gone:
            del self.entries[path]
        if gone:
            self._save()

    def _save(self) -> None:
        statefile.write_json(self.path, {"sockets": [[p, d, i] for p, (d, i) in sorted(self.entries.items())]})
