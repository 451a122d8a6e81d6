"""A device directory's files as discovery reads them: the listing and the per-file read cache.

Reads: the directory's entries (d_type, no stat per file) and each device file, again only
when its inode, size or times changed and never while its timestamps are racily clean
(git's rule); the owner and mode of each file (from the fd it reads), for trust.py's rule
(pathtrust.py judges the directories). Writes nothing; devicefile.py parses the content.
Neighbour: colad/discovery/main.py.
"""

from __future__ import annotations

import os
import stat
import struct
import time
from collections.abc import Callable
from dataclasses import dataclass

from colad.core import trust
from colad.core.constants import HEALTHY, MAX_DEVICE_FILE_BYTES, UNHEALTHY
from colad.core.devices import Device, clip_reason
from colad.discovery import devicefile
from colad.queue import device_wire

# Timestamps of a file written within one tick of our read may not change at the next write:
# ext2/ext3 and FAT keep seconds (FAT's mtime: 2 s), and before Linux 6.13 every filesystem stamps
# files from the coarse clock (one jiffy, up to 10 ms) whatever its resolution. Like git's "racily
# clean" index entries, a file whose mtime or ctime is not older than the read by this window is
# read again at every scan, and once more when the window has passed (a follow-up rescan).
RACY_WINDOW_NS = 2_000_000_000
# A file's (ino, size, mtime_ns, ctime_ns) kept as one 32-byte bytes object, 65 bytes a device: a
# tuple would hold three large ints besides, 184 bytes a device. Times may be negative.
_KEY = struct.Struct("=Qqqq")
# An empty file's content is its size: its key is this one shared value, and it is never racy (a write
# that leaves it empty changes nothing). No 65-byte key a file, and no follow-up re-read of a burst.
EMPTY_KEY = b""


def pack_key(key: tuple[int, int, int, int]) -> bytes | tuple[int, int, int, int]:
    """The key as 32 bytes; the tuple itself when a value does not fit (a time past 2262, say)."""
    try:
        return _KEY.pack(*key)
    except struct.error:
        return key


def list_regular_files(path: str) -> tuple[list[str], bool]:
    """Names of the regular files directly in `path` (symlinks, dirs, FIFOs and sockets are not devices).

    Returns ([], False) when `path` is missing or not a directory; any other
    failure to list it (ELOOP, EACCES, EIO...) raises the OSError.
    """
    names: list[str] = []
    try:
        with os.scandir(path) as entries:
            for entry in entries:
                try:
                    # d_type from getdents: no stat() per file (lstat only where d_type is unknown).
                    if entry.is_file(follow_symlinks=False):
                        names.append(entry.name)
                except FileNotFoundError:
                    continue  # removed while we listed: the next event rescans
                except OSError:
                    names.append(entry.name)  # cannot tell: read_device makes it Unhealthy with the reason
    except (FileNotFoundError, NotADirectoryError):
        return [], False
    return names, True


def is_regular_file(path: str) -> bool:
    """Would list_regular_files() list `path`'s name? (An entry it cannot tell about counts.)"""
    try:
        return stat.S_ISREG(os.lstat(path).st_mode)
    except (FileNotFoundError, NotADirectoryError):
        return False
    except OSError:
        return True


def racy(mtime_ns: int, ctime_ns: int, read_ns: int, window_ns: int = RACY_WINDOW_NS) -> bool:
    """May a write after a read at `read_ns` leave these timestamps unchanged (git's racily clean)?"""
    return max(mtime_ns, ctime_ns) >= read_ns - window_ns


@dataclass(frozen=True, slots=True)  # one per device file: slots save 40 of its 112 bytes
class Cached:
    key: bytes | tuple[int, int, int, int] | None  # pack_key((ino, size, mtime_ns, ctime_ns)), EMPTY_KEY; None: again
    device: Device
    size: int  # device_wire.device_wire_size(device)
    settles_ns: int | None = None  # racy until this wall-clock time: read again at every scan until then

    @property
    def trusted(self) -> bool:
        """May the next scan skip this file unless an event names it?"""
        return self.key is not None and self.settles_ns is None

    @staticmethod
    def of(key: tuple[int, int, int, int] | None, device: Device, read_ns: int, size: int | None = None) -> Cached:
        """`size`: the device's wire size when the caller knows it (else measured)."""
        settles = None
        if key is not None and racy(key[2], key[3], read_ns):
            settles = max(key[2], key[3]) + RACY_WINDOW_NS + 1
        packed = None if key is None else pack_key(key)
        return Cached(packed, device, device_wire.device_wire_size(device) if size is None else size, settles)


# A bare entry is its ID and health, unescaped (device_wire.device_entry): its size is the ID's plus this.
_BARE_HEALTHY_SIZE = device_wire.device_wire_size(Device("", HEALTHY))


def empty_file_device(device_id: str) -> Cached:
    """What an empty file is: a bare healthy device, its size by arithmetic (no parse, no encoding)."""
    device = devicefile.parse(device_id, b"")
    size = _BARE_HEALTHY_SIZE + len(device_id) if device_id.isascii() else device_wire.device_wire_size(device)
    return Cached(EMPTY_KEY, device, size)


def read_device(
    device_id: str,
    path: str,
    known: Cached | None,
    *,
    now_ns: Callable[[], int] = time.time_ns,
    trusted: frozenset[int] = trust.ROOT_ONLY,
) -> Cached | None:
    """The device in file `path`, re-read only when its identity, size or times changed; None if gone.

    A key read within RACY_WINDOW_NS of its file's last change is not trusted:
    the file is read again. An empty file is a bare healthy device (no open, never racy).
    A file trust.file_problem refuses (owned by a uid not in `trusted`, or writable by group
    or others) is an Unhealthy device with the reason and nothing else: its content is not
    read. The rule is applied to the lstat, and again to the fstat of the fd the content
    comes from. Anything unreadable is an Unhealthy device with the reason, never an exception.
    """
    read_ns = now_ns()  # before the stat: an earlier read time only makes more entries racy
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return None
    except OSError as exc:
        return Cached.of(None, Device(device_id, UNHEALTHY, problem=f"cannot stat: {exc.strerror}"), read_ns)
    if not stat.S_ISREG(st.st_mode):
        return None
    key = (st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)
    # A chown or chmod changes the ctime, so the key: an unchanged key keeps its verdict.
    untrusted = trust.file_problem(path, st.st_mode, st.st_uid, trusted)
    if untrusted is not None:
        return _refused(device_id, key, untrusted, known, read_ns)
    if st.st_size == 0:  # its content is its size: nothing else to compare, never racy
        return known if known is not None and known.key == EMPTY_KEY else _kept(empty_file_device(device_id), known)
    if known is not None and known.key == pack_key(key) and known.settles_ns is None:
        return known
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
        try:
            opened = os.fstat(fd)
            if not stat.S_ISREG(opened.st_mode):
                return None
            untrusted = trust.file_problem(path, opened.st_mode, opened.st_uid, trusted)
            if untrusted is not None:  # changed hands between the lstat and the open
                return _refused(device_id, key, untrusted, known, read_ns)
            data = os.read(fd, MAX_DEVICE_FILE_BYTES + 1)
        finally:
            os.close(fd)
    except FileNotFoundError:
        return None
    except OSError as exc:
        return Cached.of(key, Device(device_id, UNHEALTHY, problem=f"cannot read: {exc.strerror}"), read_ns)
    return _kept(Cached.of(key, devicefile.parse(device_id, data), read_ns), known)


def _refused(
    device_id: str, key: tuple[int, int, int, int], untrusted: str, known: Cached | None, read_ns: int
) -> Cached:
    """An untrusted file's device: Unhealthy, its `problem` the reason, carrying nothing of the file."""
    if known is not None and known.key == pack_key(key) and known.settles_ns is None:
        return known
    device = Device(device_id, UNHEALTHY, problem=clip_reason(untrusted))  # a path may be long: one bounded line
    return _kept(Cached.of(key, device, read_ns), known)


def _kept(read: Cached, known: Cached | None) -> Cached:
    """`read`, holding `known`'s Device when the file still says the same: a racy entry is read again
    2 s after a burst, and a new but equal Device would be held beside the one the published set
    holds (150 bytes a device, and what is kept on it: its CDI entry, its list entry)."""
    if known is not None and read.device is not known.device and read.device == known.device:
        return Cached(read.key, known.device, known.size, read.settles_ns)
    return read
