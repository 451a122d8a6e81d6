"""pathtrust.lookup resolves a path as the kernel does, and names every directory on the way.

Seeded random trees of directories and symbolic links (absolute, relative, with '..', chains,
loops, links to files): for every path into them, lookup() ends where os.path.realpath and
os.stat end (or fails where os.stat fails), every directory it names is a real directory,
and the directory that holds each link it passed through is among them.
"""

from __future__ import annotations

import os
import random
import stat
from pathlib import Path

import pytest

from colad.runtime.pathtrust import lookup

pytestmark = pytest.mark.integration
NAMES = ["a", "b", "c", "d"]


def build(root: Path, rng: random.Random) -> list[str]:
    """A random tree under `root`; returns the relative paths made, directories and links alike."""
    made = [""]
    for _ in range(rng.randint(4, 14)):
        parent = rng.choice([m for m in made if (root / m).is_dir() and not (root / m).is_symlink()] or [""])
        path = root / parent / rng.choice(NAMES)
        if os.path.lexists(path):
            continue
        kind = rng.random()
        if kind < 0.45:
            path.mkdir()
        elif kind < 0.55:
            path.write_text("")
        else:
            target = rng.choice(made) or "."
            if rng.random() < 0.5:
                link = str(root / target)  # absolute
            else:
                link = os.path.relpath(root / target, path.parent)  # relative, often with '..'
            if rng.random() < 0.3:
                link = os.path.join(link, rng.choice(NAMES + [".."]))  # through, or dangling
            path.symlink_to(link)
        made.append(str(path.relative_to(root)))
    return made


@pytest.mark.parametrize("seed", range(40))
def test_lookup_ends_where_the_kernel_does_and_names_every_directory_on_the_way(short_tmp: Path, seed: int) -> None:
    rng = random.Random(seed)
    root = short_tmp / "t"
    root.mkdir()
    made = build(root, rng)
    for rel in made + ["/".join(filter(None, (m, n))) for m in made for n in NAMES + [".."]]:
        path = str(root / rel) if rel else str(root)
        try:
            st = os.stat(path)
        except OSError as exc:
            with pytest.raises(OSError) as caught:
                lookup(path)
            assert caught.value.errno == exc.errno, (path, exc, caught.value)
            continue
        dirs, (named, mode, uid) = lookup(path)
        assert named == os.path.realpath(path), path
        assert (mode, uid) == (st.st_mode, st.st_uid), path
        on_the_way = [d for d, _, _ in dirs]
        assert on_the_way[0] == "/" and len(set(on_the_way)) == len(on_the_way)
        for d in on_the_way:
            assert stat.S_ISDIR(os.lstat(d).st_mode) and os.path.realpath(d) == d, (path, d)
        for prefix in [os.path.join(str(root), *rel.split("/")[: i + 1]) for i in range(len(rel.split("/")))]:
            if os.path.islink(prefix):  # the directory holding a link it went through
                assert os.path.realpath(os.path.dirname(prefix)) in on_the_way, (path, prefix)
