"""The trust rule: which device files and directories colad, running as root, acts on.

A device file names commands colad runs as root (`probe`, `prepare`) and host paths it hands to
containers (`mounts`, `device_nodes`), so only what nobody but a trusted owner can write is
honoured, as sudoers, cron and sshd's StrictModes do. Pure: it takes each path's mode and owner
(devicedir.py and pathtrust.py gather them) and returns why it is not trusted, or None. The
same rule covers the programs a probe or prepare runs and the way to each host path.
"""

from __future__ import annotations

import stat

TYPE_CHECKING = False  # typing is not loaded at run time: docs/DEVELOPING.md, "Import cost"
if TYPE_CHECKING:
    from collections.abc import Iterable

ROOT_UID = 0
ROOT_ONLY = frozenset((ROOT_UID,))
# Every problem of this rule starts so: a device's `problem`, the directory's reason, the state file.
UNTRUSTED = "untrusted: "
_WRITABLE = stat.S_IWGRP | stat.S_IWOTH


def trusted_uids(owners: Iterable[int]) -> frozenset[int]:
    """root and `owners`: root can write everything, so it is always trusted."""
    return ROOT_ONLY.union(owners)


def _owner(uid: int, trusted: frozenset[int]) -> str | None:
    if uid in trusted:
        return None
    return f"owned by uid {uid}, which is neither root nor in trusted_owners"


def _writers(mode: int) -> str:
    who = [w for bit, w in ((stat.S_IWGRP, "group"), (stat.S_IWOTH, "others")) if mode & bit]
    return f"writable by {' and '.join(who)} (mode {stat.S_IMODE(mode):04o})"


def file_problem(path: str, mode: int, uid: int, trusted: frozenset[int]) -> str | None:
    """Why the device file `path` (its mode and owner) is not trusted, or None.

    Trusted: owned by a trusted uid and writable by neither its group nor others.
    """
    why = _owner(uid, trusted) or (_writers(mode) if mode & _WRITABLE else None)
    return None if why is None else f"{UNTRUSTED}{path} is {why}"


def config_file_problem(mode: int, uid: int, own_uid: int) -> str | None:
    """Why the config file (its mode and owner) is not trusted, or None.

    It names the commands colad runs and the owners `trusted_owners` lets in, so no config file can
    vouch for its own writer: it must be root's (or the user colad runs as) and writable by neither
    its group nor others, as sudoers must be.
    """
    if uid not in (ROOT_UID, own_uid):
        return f"{UNTRUSTED}owned by uid {uid}, not root"
    return f"{UNTRUSTED}{_writers(mode)}" if mode & _WRITABLE else None


def directory_problem(path: str, mode: int, uid: int, trusted: frozenset[int], *, device_dir: bool) -> str | None:
    """Why the directory `path` is not trusted, or None.

    Trusted: owned by a trusted uid and writable by neither its group nor others. An ancestor
    (not `device_dir`) that others can write is trusted when it is sticky (as /tmp): there only
    an entry's owner (or the directory's) can rename or remove it, and the next directory on the
    way is checked in its turn. The device directory itself never: whoever can write it can add
    a device file.
    """
    why = _owner(uid, trusted)
    if why is None and mode & _WRITABLE and (device_dir or not mode & stat.S_ISVTX):
        why = _writers(mode)
    if why is None:
        return None
    what = "device directory" if device_dir else "directory"
    return f"{UNTRUSTED}{what} {path} is {why}"


def chain_problem(chain: Iterable[tuple[str, int, int]], trusted: frozenset[int]) -> str | None:
    """Why the way to a device directory is not trusted, or None: the first problem from / down.

    `chain` is (path, mode, uid) of every directory a name is looked up in on the way, in
    order, the device directory last (pathtrust.directory_chain).
    """
    entries = list(chain)
    for i, (path, mode, uid) in enumerate(entries):
        why = directory_problem(path, mode, uid, trusted, device_dir=i == len(entries) - 1)
        if why is not None:
            return why
    return None


def program_problem(
    dirs: Iterable[tuple[str, int, int]], program: tuple[str, int, int], trusted: frozenset[int]
) -> str | None:
    """Why a program colad runs as root (a probe, a prepare command) is not trusted, or None.

    As sshd judges an AuthorizedKeysCommand: the file as a device file (file_problem), and
    every directory on the way to it as an ancestor (a sticky one may be writable by others).
    """
    for path, mode, uid in dirs:
        why = directory_problem(path, mode, uid, trusted, device_dir=False)
        if why is not None:
            return why
    path, mode, uid = program
    return file_problem(path, mode, uid, trusted)


def host_path_problem(
    dirs: Iterable[tuple[str, int, int]], entries: Iterable[tuple[str, int, int]], trusted: frozenset[int]
) -> str | None:
    """Why the way to a host path colad hands to containers is not trusted, or None.

    `dirs` are (path, mode, uid) of every directory a name is looked up in on the way, symbolic
    links followed (pathtrust.lookup), each judged as an ancestor: whoever can write one can make
    the path name something else. `entries` are (path, uid, mode of the directory holding it) of
    every name reached: in a directory others or the group can write (sticky, or it is refused
    above) an entry's owner can rename or remove it, so it must be trusted too. What the path
    names is not judged otherwise: its owner cannot redirect it.
    """
    for path, mode, uid in dirs:
        why = directory_problem(path, mode, uid, trusted, device_dir=False)
        if why is not None:
            return why
    for path, uid, holder_mode in entries:
        if holder_mode & _WRITABLE and uid not in trusted:
            return f"{UNTRUSTED}{path} is {_owner(uid, trusted)}, in a directory others can write"
    return None
