"""The shell of trust.py for paths: the owner and mode of everything the kernel passes on a lookup.

Reads (lstat, readlink) each directory a name is looked up in on the way to a path, following
symbolic links as the kernel does, and the object the path names; trust.py judges them. Used
for device directories (colad/discovery/scan.py) and for the programs a probe or prepare runs
(probes.py, prestart.py). Writes nothing, logs nothing.
"""

from __future__ import annotations

import errno
import os
import stat

from colad.core import trust

# The kernel follows at most 40 symbolic links in one path lookup (fs/namei.c MAXSYMLINKS).
MAX_SYMLINKS = 40
Owned = tuple[str, int, int]  # (path, st_mode, st_uid)
Entry = tuple[str, int, int]  # (path, st_uid, st_mode of the directory holding it)


def lookup(path: str, entries: list[Entry] | None = None) -> tuple[list[Owned], Owned]:
    """(every directory a name is looked up in on the way to `path`, from / down; what `path` names).

    Whoever can write one of those directories can change what `path` names. Symbolic links
    are followed, the last one too, as exec() and opendir() do, so the directory holding each
    link counts. Relative components are taken from /. Raises OSError (FileNotFoundError: a
    part is missing, NotADirectoryError: a part on the way is no directory, ELOOP). `entries`,
    if given, gets each name reached (every link, directory and the object named) with its owner
    and the mode of the directory it was looked up in: whoever owns an entry of a sticky
    directory can rename or remove it.
    """
    root = os.lstat("/")
    seen: dict[str, tuple[int, int]] = {"/": (root.st_mode, root.st_uid)}  # every real path reached
    looked_in: dict[str, None] = {}  # in order, once each
    current, parts, links = "/", [p for p in path.split("/") if p], 0
    while parts:
        name = parts.pop(0)
        if not stat.S_ISDIR(seen[current][0]):  # "file/x", "file/." and "file/.." alike
            raise NotADirectoryError(errno.ENOTDIR, os.strerror(errno.ENOTDIR), current)
        if name == ".":
            continue
        if name == "..":  # physical: `current` never holds a symbolic link, and its parent was reached
            current = os.path.dirname(current)
            continue
        looked_in[current] = None
        candidate = os.path.join(current, name)
        st = os.lstat(candidate)
        if entries is not None:
            entries.append((candidate, st.st_uid, seen[current][0]))
        if stat.S_ISLNK(st.st_mode):
            links += 1
            if links > MAX_SYMLINKS:
                raise OSError(errno.ELOOP, os.strerror(errno.ELOOP), path)
            target = os.readlink(candidate)
            parts[:0] = [p for p in target.split("/") if p]
            if target.startswith("/"):
                current = "/"
            continue
        seen[candidate] = (st.st_mode, st.st_uid)
        current = candidate
    return [(d, *seen[d]) for d in looked_in], (current, *seen[current])


def directory_chain(path: str) -> list[Owned]:
    """lookup(path) as one list, the directory `path` names last; NotADirectoryError if it names none."""
    dirs, named = lookup(path)
    if not stat.S_ISDIR(named[1]):
        raise NotADirectoryError(errno.ENOTDIR, os.strerror(errno.ENOTDIR), named[0])
    return [d for d in dirs if d[0] != named[0]] + [named]  # a link to "." passes through it: judged as itself


def directory_problem(path: str, trusted: frozenset[int] = trust.ROOT_ONLY) -> str | None:
    """Why the device directory `path`, or a directory on the way to it, is not trusted, or None.

    None too when it cannot be looked at (missing, not a directory, ELOOP, EACCES): listing it
    says why.
    """
    try:
        chain = directory_chain(path)
    except OSError:
        return None
    return trust.chain_problem(chain, trusted)


def program_problem(path: str, trusted: frozenset[int] = trust.ROOT_ONLY) -> str | None:
    """Why the program `path` (a probe's or prepare's argv[0]) is not trusted, or None.

    None too when it cannot be looked at: running it says why (ENOENT, EACCES).
    """
    try:
        dirs, program = lookup(path)
    except OSError:
        return None
    return trust.program_problem(dirs, program, trusted)


def host_path_problem(path: str, trusted: frozenset[int] = trust.ROOT_ONLY) -> str | None:
    """Why the host path `path` (a device node or mount a device file names) is not trusted, or None.

    None too when it cannot be looked at (missing, ELOOP, EACCES): hostpaths.py says why.
    What it names is not judged (mounting /etc is the operator's choice); the way to it is.
    """
    entries: list[Entry] = []
    try:
        dirs, _named = lookup(path, entries)
    except OSError:
        return None
    return trust.host_path_problem(dirs, entries, trusted)
