"""The inotify events colad reads: pyinotify's WatchManager adds and removes the watches, we read.

Names stay bytes until here and become str as os.fsdecode() makes them (surrogateescape),
exactly as os.listdir() spells them; a read never raises on a name. Split from colad/watchers/loop.py,
which builds the directory watches and the roles' loop on it.
"""

from __future__ import annotations

import errno
import logging
import os
import struct
import sys
import time
from collections import namedtuple
from collections.abc import Callable

import pyinotify

from colad.core import constants
from colad.runtime import log

LOG = log.get(__name__)
# pyinotify logs a failed add_watch on its own stderr handler, without the path's owner or the
# limit: colad's one line (WatcherLoop) says it instead.
logging.getLogger("pyinotify").disabled = True

# The per-uid kernel budgets every root process on the node shares, by the errno that says so.
INSTANCES, WATCHES = "max_user_instances", "max_user_watches"
# inotify_init: EMFILE is the per-uid instance limit (ENFILE, ENOMEM: the system's own); add_watch: ENOSPC.
_INIT_LIMIT_ERRNOS = ("EMFILE", "ENFILE", "ENOMEM")
# While a limit is in the way, a new instance or a refused watch is tried again this often (seconds).
RETRY_S = constants.DEGRADED_POLL_S

TYPE_CHECKING = False  # mypy sees the NamedTuple, Python the namedtuple: docs/DEVELOPING.md, "Import cost"
if TYPE_CHECKING:
    from typing import NamedTuple

    class _Fields(NamedTuple):
        wd: int
        path: str
        name: str
        mask: int
else:
    _Fields = namedtuple("_Fields", "wd path name mask")


class InotifyEvent(_Fields):  # a tuple: built for every event of every wake-up, cheaper than a dataclass
    __slots__ = ()

    @property
    def overflow(self) -> bool:
        return bool(self.mask & pyinotify.IN_Q_OVERFLOW)


# struct inotify_event (<sys/inotify.h>): wd, mask, cookie, len, then `len` bytes of NUL-padded name.
_EVENT = struct.Struct("iIII")
_LONGEST = _EVENT.size + 256  # NAME_MAX and its NUL, padded
_READ_SIZE = 65536  # one read() takes all that is queued (hundreds of events) without asking FIONREAD first
_FS_ENCODING, _FS_ERRORS = sys.getfilesystemencoding(), sys.getfilesystemencodeerrors()  # os.fsdecode's


class Inotify:
    """pyinotify's WatchManager adds and removes the watches; the events are read and parsed here.

    pyinotify 0.9.6's Notifier decodes each name strictly (PLATFORM-NOTES section 9):
    one non-UTF-8 name raised out of read_events and cost the other events of that
    read. Names stay bytes until here and become str with os.fsdecode
    (surrogateescape), exactly as os.listdir() spells them.
    """

    def __init__(
        self, count: Callable[[str], None] | None = None, *, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.count = count or (lambda name: None)
        self.clock = clock
        self._refused: set[str] = set()
        self.generation = 0  # moved on: every DirWatch on this inotify stat()s its directory at its next ensure()
        self.wm: pyinotify.WatchManager | None = None
        self.fd: int | None = None  # None: no instance (the instance limit); every add() is refused
        self.limit: str | None = None  # the kernel limit in the way now: INSTANCES, WATCHES or None
        self.error = ""  # what the kernel said when the limit was met
        self.short: set[str] = set()  # paths whose watch the watch limit refused, not added since
        self._retry_at = 0.0
        self._open()

    def _open(self) -> None:
        """A new inotify instance, or INSTANCES as the limit in the way (tried again after RETRY_S)."""
        self._retry_at = self.clock() + RETRY_S
        try:
            wm = pyinotify.WatchManager()
        except OSError as exc:  # pyinotify puts the errno's name in the text only
            text = str(exc)
            self.limit, self.error = INSTANCES, next((e for e in _INIT_LIMIT_ERRNOS if e in text), text)
            return
        self.wm, self.fd = wm, int(wm.get_fd())
        os.set_blocking(self.fd, False)  # read() must never wait: poll() said it is readable
        os.set_inheritable(self.fd, False)
        self.generation += 1  # every DirWatch adds its watches to the new instance
        self._update()

    def _update(self) -> None:
        if self.fd is None:
            return
        self.limit = WATCHES if self.short else None
        if self.limit is None:
            self.error = ""

    def retry(self) -> None:
        """Try a new instance again when the instance limit was in the way and RETRY_S has passed."""
        if self.fd is None and self.clock() >= self._retry_at:
            self._open()

    def fileno(self) -> int | None:
        return self.fd

    def add(self, path: str, mask: int) -> int | None:
        if self.wm is None:
            return None
        try:
            result = self.wm.add_watch(path, mask, quiet=True)
        except ValueError as exc:  # UnicodeEncodeError: pyinotify encodes the path strictly
            if path not in self._refused:  # ensure() retries every turn: say it once
                self._refused.add(path)
                self.count("input.bad_watch_path")
                LOG.warning("cannot watch a path that is not valid text", path=path, error=exc)
            return None
        wd = result.get(path, -1)
        if wd >= 0:
            self.short.discard(path)
            self._update()
            return wd
        # The errno of the failed inotify_add_watch, which pyinotify keeps only in its wrapper.
        code = self.wm._inotify_wrapper.get_errno()  # noqa: SLF001
        if code == errno.ENOSPC:
            self.short.add(path)
            self.limit, self.error = WATCHES, "ENOSPC"
        return None

    def forget(self, path: str) -> None:
        """`path` is no longer wanted: a watch the limit refused on it no longer counts."""
        self.short.discard(path)
        self._update()

    def remove(self, wd: int) -> None:
        if self.wm is not None and self.wm.get_watch(wd) is not None:
            self.wm.rm_watch(wd, quiet=True)

    def read(self) -> list[InotifyEvent]:
        """Every complete event the kernel has queued; never raises on a name."""
        events: list[InotifyEvent] = []
        if self.wm is None or self.fd is None:
            return events
        get_watch, unpack, size = self.wm.get_watch, _EVENT.unpack_from, _EVENT.size
        more = True
        while more:
            try:
                data = os.read(self.fd, _READ_SIZE)
            except BlockingIOError:
                break
            more, offset = len(data) > _READ_SIZE - _LONGEST, 0  # no room was left for one more: read again
            while offset + size <= len(data):
                wd, mask, _cookie, length = unpack(data, offset)
                raw = data[offset + size : offset + size + length].rstrip(b"\0")  # a name holds no NUL
                offset += size + length
                if mask & pyinotify.IN_Q_OVERFLOW:
                    self.generation += 1  # what the lost events said about the directories is unknown
                    events.append(InotifyEvent(-1, "", "", mask))
                    continue
                watch = get_watch(wd)
                if watch is None:
                    continue  # a watch we removed: its IN_IGNORED and late events (pyinotify dropped them too)
                if mask & pyinotify.IN_IGNORED:
                    self.wm.del_watch(wd)  # the kernel dropped the watch (the directory went)
                try:
                    name = raw.decode(_FS_ENCODING)  # os.fsdecode(), as os.listdir() spells names...
                except UnicodeDecodeError:  # ...with lone surrogates for bytes that are not text
                    name = raw.decode(_FS_ENCODING, _FS_ERRORS)
                    self.count("input.undecodable_name")  # delivered all the same; the role decides
                events.append(InotifyEvent(wd, watch.path, name, mask))
        return events

    def close(self) -> None:
        """Let go of the instance and its watches; a second close() does nothing (the fd may be another's by then)."""
        if self.wm is not None:
            self.wm.close()
            self.wm, self.fd = None, None
