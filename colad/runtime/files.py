"""Replacing a file atomically: readers see the old bytes or the new ones, never part of them.

One writer per file per process (a temporary name with the pid beside the file, O_NOFOLLOW),
mode set explicitly (colad runs under umask 077; CDI specs and NFD files are for other readers),
the directory made only when missing, no fsync: every file colad writes this way is rewritten
at start, and the state files and CDI specs live on tmpfs by default.
"""

from __future__ import annotations

import contextlib
import os

from colad.core.constants import PID_MAX_DIGITS

_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC | os.O_NOFOLLOW
NAME_MAX_BYTES = 255  # Linux NAME_MAX: the longest name of one directory entry


def temporary_name(name: str, pid: int | None = None) -> str:
    """The name `replace` writes beside `name` before the rename: hidden, with the pid, ending in .tmp."""
    return f".{name}.{os.getpid() if pid is None else pid}.tmp"


# The longest name `replace` can write: its temporary name must fit NAME_MAX too.
MAX_NAME_BYTES = NAME_MAX_BYTES - len(temporary_name("", int("9" * PID_MAX_DIGITS)))


def replace(path: str, data: bytes, mode: int, dir_mode: int) -> None:
    """Write `data` to `path` through a temporary file and a rename; OSError on failure, nothing left behind."""
    directory, name = os.path.split(path)
    tmp = os.path.join(directory, temporary_name(name))
    try:
        fd = os.open(tmp, _FLAGS, mode)
    except FileNotFoundError:
        os.makedirs(directory, mode=dir_mode, exist_ok=True)
        fd = os.open(tmp, _FLAGS, mode)
    try:
        try:
            os.fchmod(fd, mode)  # the umask narrowed os.open's mode
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view) :]
        finally:
            os.close(fd)
        os.rename(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
