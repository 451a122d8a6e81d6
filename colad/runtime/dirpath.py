"""The one rule for where a configured directory path leads: the kernel's resolution, at the time of use.

A path such as /a/link/../dev names, for the kernel, the `dev` beside link's target; a lexical
normalisation (os.path.normpath) names /a/dev instead, another directory. Every user of a
configured directory (its watch, its listing and reads, the alias checks at load, the state
file) resolves it here, and again whenever a watch or the recheck timer says a link may have moved.
"""

from __future__ import annotations

import os


def resolve(path: str) -> str:
    """The absolute path `path` leads to now, as the kernel resolves it (symlinks followed, then '..').

    What cannot be resolved (a dangling link, a loop) stays as spelled from there on: such a
    path is no directory, so it is absent (dangling) or unusable (ELOOP) wherever it is used.
    """
    if "\x00" in path:  # refused at load; never an exception here
        return os.path.normpath(path)
    for _attempt in range(3):
        try:
            return os.path.realpath(path)
        except OSError:  # a link replaced between its lstat and its readlink (EINVAL): resolve again
            continue
    return path  # replaced on every attempt: as spelled, like a loop, until the next use resolves it


def entry(path: str) -> tuple[str, str]:
    """(The resolved directory holding the last name of `path`, that name): a watch there sees the
    name re-pointed, replaced or removed. A path ending in '.' or '..' has no such name: the
    resolved directory's own parent and name stand in for it."""
    head, name = os.path.split(path.rstrip("/") or "/")
    if name in ("", ".", ".."):
        real = resolve(path)
        return os.path.dirname(real), os.path.basename(real)
    return resolve(head or "."), name


def absolute(path: str) -> str:
    """`path` made absolute for another working directory, leading to what it leads to here: the
    working directory joined in front, nothing normalised (os.path.abspath would undo a link's '..'),
    no link resolved (a file re-pointed later, as a ConfigMap's ..data is, is followed at each use)."""
    return path if os.path.isabs(path) else os.path.join(os.getcwd(), path)
