"""A configured directory is watched, listed, alias-checked and reported where the kernel resolves it.

Real directories and symlinks under a temp root, real inotify: for each shape of path the
watch, the listing, the alias check at load and the plugin's state file all name the one
directory `open()` reaches through the configured path; a file created through that path
is an event on the watch; a link re-pointed on the way is followed at the next look.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from colad.config.checks import alias_problems
from colad.config.config import Resource, load
from colad.discovery.scan import ResourceWatch
from colad.runtime import dirpath
from colad.watchers import loop
from colad.watchers.inotify import Inotify
from tests.helpers import wait_until

pytestmark = pytest.mark.integration

RESOURCE = "example.com/dev"


def layout(root: Path) -> None:
    """root/b/{dev,dev2}: directories; root/a/link -> root/b/dev, root/a/link2 -> root/b/dev2,
    root/a/chain -> link2 (relative, a link to a link); root/a/dev2: a decoy where a lexical
    normalisation of a/link/../dev2 lands; root/loop -> loop; root/dangling -> root/nowhere."""
    for d in ("b/dev", "b/dev2", "a/dev2"):
        (root / d).mkdir(parents=True)
    os.symlink(root / "b" / "dev", root / "a" / "link")
    os.symlink(root / "b" / "dev2", root / "a" / "link2")
    os.symlink("link2", root / "a" / "chain")
    os.symlink("loop", root / "loop")
    os.symlink(root / "nowhere", root / "dangling")


# (id, configured path, the directory the kernel reaches), both relative to the root.
SHAPES = [
    ("symlink-then-dotdot", "a/link/../dev2", "b/dev2"),
    ("symlink-then-dotdot-twice", "a/link/../../b/dev2", "b/dev2"),
    ("double-slashes", "b//dev2", "b/dev2"),
    ("leading-double-slash", "/b/dev2", "b/dev2"),
    ("trailing-slash", "b/dev2/", "b/dev2"),
    ("dot-and-dotdot-pieces", "b/./dev/../dev2", "b/dev2"),
    ("symlink-trailing-slash", "a/link2/", "b/dev2"),
    ("symlink-to-symlink", "a/chain", "b/dev2"),
    ("ends-in-dotdot", "a/link/..", "b"),
    ("ends-in-dot", "a/link2/.", "b/dev2"),
]


@pytest.fixture
def root(short_tmp: Path) -> Path:
    layout(short_tmp)
    return short_tmp


@pytest.fixture
def inotify() -> Iterator[Inotify]:
    made = Inotify()
    yield made
    made.close()


def configured(root: Path, spelled: str) -> str:
    return f"{root}/{spelled}"  # "//" and trailing "/" kept as written


def event_on(inotify: Inotify, wd: int | None, name: str) -> bool:
    """Does an event on watch `wd` name `name` within a few seconds?"""
    seen: set[str] = set()

    def arrived() -> bool:
        loop.poll([inotify.fileno()], 0.1)
        seen.update(e.name for e in inotify.read() if e.wd == wd)
        return name in seen

    return bool(wait_until(arrived, 5, f"an event naming {name!r} on watch {wd}"))


@pytest.mark.parametrize(("spelled", "target"), [s[1:] for s in SHAPES], ids=[s[0] for s in SHAPES])
def test_watch_list_alias_and_state_agree_with_the_kernel(
    root: Path, inotify: Inotify, spelled: str, target: str
) -> None:
    path, real = configured(root, spelled), str(root / target)
    with open(os.path.join(path, "before"), "w"):  # through the configured path: where the kernel goes
        pass
    rw = ResourceWatch(inotify, Resource(RESOURCE, path))
    assert rw.dir.ensure()
    assert rw.dir.path == real  # the watch target
    assert os.path.samestat(os.stat(path), os.stat(rw.dir.path))
    scanned = rw.scan(None)
    assert scanned.present and list(scanned.devices.ids) == ["before"]  # the list target
    with open(os.path.join(path, "after"), "w"):
        pass
    assert event_on(inotify, rw.dir.wd, "after")  # the watch is on the directory written to
    # The alias check at load: the configured spelling and the kernel's are one directory.
    problems = alias_problems([("a.device_dir", "file", path), ("b.device_dir", "file", real)], [])
    assert len(problems) == 1 and "same directory" in problems[0], problems
    assert dirpath.resolve(path) == real  # what the plugin writes as the state file's device_dir


def test_a_symlink_loop_is_unusable_for_the_watch_and_the_list_alike(root: Path, inotify: Inotify) -> None:
    rw = ResourceWatch(inotify, Resource(RESOURCE, str(root / "loop")))
    rw.dir.ensure()
    assert not rw.dir.present and rw.dir.wd is None
    assert rw.dir.path == dirpath.resolve(str(root / "loop"))
    scanned = rw.scan(None)
    assert scanned.unusable is not None and "ELOOP" in scanned.unusable


def test_a_dangling_link_is_followed_once_its_target_is_made(root: Path, inotify: Inotify) -> None:
    rw = ResourceWatch(inotify, Resource(RESOURCE, str(root / "dangling")))
    rw.dir.ensure()
    assert not rw.dir.present and not rw.scan(None).present
    (root / "nowhere").mkdir()
    (root / "nowhere" / "dev0").write_text("")
    inotify.generation += 1  # the recheck timer (loop.RECHECK_INTERVAL) of the role's loop
    assert rw.dir.ensure()
    assert rw.dir.present and rw.dir.path == str(root / "nowhere")
    assert list(rw.scan(None).devices.ids) == ["dev0"]


def test_a_link_repointed_on_the_way_moves_the_watch_and_the_list(root: Path, inotify: Inotify) -> None:
    (root / "c" / "dev2").mkdir(parents=True)
    (root / "c" / "dev2" / "elsewhere").write_text("")
    (root / "c" / "dev").mkdir()
    rw = ResourceWatch(inotify, Resource(RESOURCE, str(root / "a" / "link" / ".." / "dev2")))
    rw.dir.ensure()
    assert rw.dir.path == str(root / "b" / "dev2")
    tmp = root / "a" / "link.new"
    os.symlink(root / "c" / "dev", tmp)
    os.rename(tmp, root / "a" / "link")  # atomically re-pointed: a/link/.. is now c
    inotify.generation += 1  # the recheck timer
    assert rw.dir.ensure()
    assert rw.dir.path == str(root / "c" / "dev2")
    assert list(rw.scan(None).devices.ids) == ["elsewhere"]
    (root / "c" / "dev2" / "new").write_text("")
    assert event_on(inotify, rw.dir.wd, "new")


def test_a_repointed_last_link_is_an_event_on_its_name(root: Path, inotify: Inotify) -> None:
    dw = loop.DirWatch(inotify, str(root / "a" / "link2"), loop.DIR_CHANGE_EVENTS)
    dw.ensure()
    tmp = root / "a" / "link2.new"
    os.symlink(root / "b" / "dev", tmp)
    os.rename(tmp, root / "a" / "link2")
    loop.poll([inotify.fileno()], 2.0)
    for event in inotify.read():
        dw.note(event)
    assert dw.ensure()  # no timer needed: the parent's watch saw the name change
    assert dw.path == str(root / "b" / "dev")


def test_a_relative_config_path_is_made_absolute_without_undoing_a_links_dotdot(
    root: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (root / "b" / "colad.toml").write_text('log_level = "DEBUG"\n')  # where the kernel goes
    (root / "a" / "colad.toml").write_text('log_level = "ERROR"\n')  # the decoy of a lexical normalisation
    monkeypatch.chdir(root)
    cfg = load({"config": "a/link/../colad.toml"}, {})
    assert cfg.log_level == "DEBUG"
    with open(cfg.config_file) as handle:  # what the roles, in another working directory, read on reload
        assert handle.read() == 'log_level = "DEBUG"\n'
