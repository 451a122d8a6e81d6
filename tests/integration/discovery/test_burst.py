"""A burst of files ends in the exact list, one publish per turn of discovery's loop at most.

Real files, real inotify, a real queue server; discovery's loop is stepped by hand against a clock
the test moves, so the count of publishes is exact: a writer makes 20 files per 1 ms turn. What
came while a turn ran goes in the next turn's one publish; no change waits for a timer. A removal
of more known names than discovery.RELIST_NAMES lists the directory once; fewer are looked at one
by one.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from colad.config.config import Config
from colad.discovery.main import RELIST_NAMES, Discovery
from colad.queue.messages import DeviceSnapshot
from tests.helpers import wait_until
from tests.integration.support import Serve, begin, discovery_config

pytestmark = pytest.mark.integration

PER_TURN = 20  # files the writer makes (or removes) per turn of the loop
TURN_S = 0.001


class Clock:
    """The monotonic clock discovery reads, moved by the test."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class CountingDiscovery(Discovery):
    """Discovery that counts its publishes and its directory listings."""

    def __init__(self, cfg: Config, **kwargs: Any) -> None:
        super().__init__(cfg, **kwargs)
        self.publishes = 0
        self.listings = 0

    def _publish(self, *args: Any, **kwargs: Any) -> None:
        self.publishes += 1
        super()._publish(*args, **kwargs)

    def _rescan_one(self, rw: Any, reason: str, dirty: set[str] | None, whole: bool = True) -> None:
        if not (dirty is not None and not whole and rw.whole):
            self.listings += 1
        super()._rescan_one(rw, reason, dirty, whole)


@pytest.fixture
def cfg(short_tmp: Path) -> Config:
    return discovery_config(short_tmp)


def _run(discovery: CountingDiscovery, clock: Clock, paths: list[Path], make: bool, per_turn: int = PER_TURN) -> None:
    """The writer makes (or removes) `paths`, `per_turn` each turn; every turn takes all that came."""
    rw = next(iter(discovery.watches.values()))
    for at in range(0, len(paths), per_turn):
        for path in paths[at : at + per_turn]:
            if make:
                path.write_bytes(b"")
            else:
                path.unlink()
        discovery.step(0)
        assert not rw.due, "a change was left for a later turn"
        clock.now += TURN_S


@pytest.mark.parametrize("count", [RELIST_NAMES // 2, RELIST_NAMES * 3])
def test_a_burst_ends_in_the_exact_list_with_few_publishes(cfg: Config, serve: Serve, count: int) -> None:
    _, inbox = serve(cfg.queue_socket)
    clock = Clock()
    discovery = CountingDiscovery(cfg, clock=clock)
    try:
        begin(discovery)
        names = [f"burst-{i:05d}" for i in range(count)]
        paths = [Path(cfg.device_dir) / n for n in names]
        turns = -(-count // PER_TURN)
        started, listed = discovery.publishes, discovery.listings
        _run(discovery, clock, paths, make=True)
        rw = next(iter(discovery.watches.values()))
        assert rw.current is not None and list(rw.current.ids) == names
        made = discovery.publishes - started
        assert 2 <= made <= turns, f"{made} publishes for {count} files in {turns} turns"
        assert discovery.listings == listed, "new names are read one by one, never by listing the directory"

        def shown(expected: list[str]) -> bool:
            discovery.client.flush()
            last = inbox.latest(DeviceSnapshot)
            return last is not None and list(last.devices.ids) == expected

        wait_until(lambda: shown(names), 20, "the plugin side to hold every file")

        started, listed = discovery.publishes, discovery.listings
        _run(discovery, clock, paths, make=False)
        assert rw.current is not None and list(rw.current.ids) == []
        gone = discovery.publishes - started
        assert 1 <= gone <= turns, f"{gone} publishes for removing {count} files"
        assert discovery.listings == listed, "a turn's 20 removals are looked at one by one"
        wait_until(lambda: shown([]), 20, "the plugin side to hold no file")
    finally:
        discovery.close()


@pytest.mark.parametrize("count", [RELIST_NAMES // 2, RELIST_NAMES * 3])
def test_what_came_during_a_turn_goes_in_one_publish(cfg: Config, serve: Serve, count: int) -> None:
    """However many files came while the loop was busy, the next turn publishes them once."""
    _, inbox = serve(cfg.queue_socket)
    discovery = CountingDiscovery(cfg, clock=Clock())
    try:
        begin(discovery)
        names = [f"burst-{i:05d}" for i in range(count)]
        before = discovery.publishes
        _run(discovery, Clock(), [Path(cfg.device_dir) / n for n in names], make=True, per_turn=count)
        assert discovery.publishes == before + 1
        rw = next(iter(discovery.watches.values()))
        assert rw.current is not None and list(rw.current.ids) == names

        def shown(expected: list[str]) -> bool:
            discovery.client.flush()
            last = inbox.latest(DeviceSnapshot)
            return last is not None and list(last.devices.ids) == expected

        wait_until(lambda: shown(names), 20, "the plugin side to hold every file")

        before, listed = discovery.publishes, discovery.listings
        _run(discovery, Clock(), [Path(cfg.device_dir) / n for n in names], make=False, per_turn=count)
        assert discovery.publishes == before + 1 and rw.current is not None and list(rw.current.ids) == []
        # Over the threshold a turn's removal of that many known names lists the directory instead.
        assert (discovery.listings > listed) == (count > RELIST_NAMES * 2)
        wait_until(lambda: shown([]), 20, "the plugin side to hold no file")
    finally:
        discovery.close()


def test_changes_after_a_burst_go_at_once_one_after_another(cfg: Config, serve: Serve) -> None:
    """No timer holds a change back: each change after a burst is published in the turn that reads
    it, at the same instant of the clock as the publish before it."""
    serve(cfg.queue_socket)
    clock = Clock()
    discovery = CountingDiscovery(cfg, clock=clock)
    try:
        begin(discovery)
        paths = [Path(cfg.device_dir) / f"burst-{i:05d}" for i in range(400)]
        _run(discovery, clock, paths, make=True)
        rw = next(iter(discovery.watches.values()))
        for n in range(6):
            before = discovery.publishes
            (Path(cfg.device_dir) / f"next-{n}").write_bytes(b"")
            discovery.step(0)
            assert discovery.publishes == before + 1, f"change {n + 1} after the burst waited"
            assert rw.current is not None and f"next-{n}" in rw.current.ids
            assert not rw.due, "a turn left a change waiting"
    finally:
        discovery.close()
