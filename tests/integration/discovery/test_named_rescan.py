"""Discovery's rescan of the names inotify gave ends where a full listing ends, and lists nothing.

Random sequences of real file operations (create, write content, make Unhealthy, malformed,
delete, rename, invalid names, a subdirectory, a symlink) on a real directory with real
inotify: after each, the set discovery holds, its IDs, unhealthy count, exact snapshot size,
digest and logged problems equal those of a fresh full scan, and no inotify step listed the directory.
"""

from __future__ import annotations

import os
import random
from collections.abc import Callable
from pathlib import Path

import pytest

from colad.config.config import Config
from colad.core.constants import UNHEALTHY
from colad.discovery.main import Discovery
from colad.discovery.scan import ResourceWatch
from colad.queue import device_wire, messages
from colad.queue.snapshots import fit_the_queue
from colad.watchers.inotify import Inotify
from tests.helpers import wait_until
from tests.integration.support import discovery_config

pytestmark = pytest.mark.integration

CONTENTS = [
    "",
    'health = "Unhealthy"\n',
    "numa_nodes = [0, 1]\n",
    "numa_nodes = [1]\n",
    "this is = not toml [\n",
]


@pytest.fixture
def cfg(short_tmp: Path) -> Config:
    return discovery_config(short_tmp)


def _reference(cfg: Config, inotify: Inotify) -> tuple[object, dict[str, str]]:
    """What a fresh full scan finds (the watch is never added: scan() only lists and reads)."""
    scanned = ResourceWatch(inotify, cfg.resources[0]).scan(None)
    return scanned.devices, scanned.problems


def _operation(rng: random.Random, root: Path) -> Callable[[], None]:
    names = sorted(p.name for p in root.iterdir() if p.is_file() and not p.is_symlink())
    pick = rng.random()
    name = rng.choice([f"dev{rng.randint(0, 30)}", ".hidden", "bad name", "dev" + "x" * 70, "dev-1~"])
    if pick < 0.4 or not names:
        return lambda: (root / name).write_text(rng.choice(CONTENTS))
    victim = rng.choice(names)
    if pick < 0.6:
        return lambda: (root / victim).unlink()
    if pick < 0.75:
        return lambda: os.rename(root / victim, root / name)
    if pick < 0.85:
        return lambda: (root / victim).write_text(rng.choice(CONTENTS))
    if pick < 0.92:
        target = root / f"sub{rng.randint(0, 3)}"
        return lambda: target.mkdir(exist_ok=True)
    link = root / f"link{rng.randint(0, 3)}"
    return lambda: None if link.is_symlink() else link.symlink_to(root / victim)


@pytest.mark.parametrize("seed", range(6))
def test_named_rescans_end_where_a_full_listing_ends(cfg: Config, seed: int) -> None:
    rng = random.Random(seed)
    root = Path(cfg.device_dir)
    for i in range(20):
        (root / f"dev{i}").write_text(rng.choice(CONTENTS))
    discovery, inotify = Discovery(cfg), Inotify()
    listings = 0
    try:
        rw = discovery.watches[cfg.resources[0].name]
        rw.dir.ensure()
        discovery.rescan("start")
        full_scan = rw.scan

        def counted(dirty: set[str] | None, **kwargs: object) -> object:
            nonlocal listings
            listings += 1
            return full_scan(dirty, **kwargs)  # type: ignore[arg-type]

        rw.scan = counted  # type: ignore[method-assign]
        for _ in range(25):
            _operation(rng, root)()
            expected, problems = _reference(cfg, inotify)

            def caught_up(expected: object = expected, problems: dict[str, str] = problems) -> bool:
                discovery.step(0.05)
                return rw.current == expected and rw.warned == problems

            wait_until(caught_up, 10, f"discovery to hold what a full scan finds: {expected} {problems}")
            current = rw.current
            assert current is not None
            assert rw.ids == current.ids
            assert rw.unhealthy == current.count(UNHEALTHY)
            unsized = messages.DeviceSnapshot(discovery.epoch, 0, current, True, rw.resource.name)
            assert rw.size == fit_the_queue(unsized, {}).size
            assert rw.digest is None or rw.digest == device_wire.set_digest(current)
        assert discovery.stats.counters.get("rescans.inotify", 0) >= 10
        assert listings == 0, "an inotify event that named its files listed the whole directory"
    finally:
        discovery.close()
        inotify.close()
