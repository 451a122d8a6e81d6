"""A burst of files ends in the exact list with a bounded number of publishes.

Real files, real inotify, a real queue server; discovery's loop is stepped by hand against a clock
the test moves, so the count of publishes is exact: a writer makes 20 files per 1 ms turn, and each
publish costs the plugin and the kubelet the whole list. A removal of more known names than
discovery.RELIST_NAMES lists the directory once; fewer are looked at one by one.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from colad.config.config import Config
from colad.discovery import scan
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


def _bound(turns: int) -> int:
    """Publishes a burst of `turns` turns may take: the first two at once, the holds doubling to their
    maximum, then one per maximum hold, and the last one after the burst."""
    longest = scan.hold_max(0)  # the sets of these bursts are all small
    doublings = 0
    while scan.HOLD_BASE_S * 2**doublings < longest:
        doublings += 1
    return 2 + doublings + int(turns * TURN_S / longest) + 1


def _run(discovery: CountingDiscovery, clock: Clock, paths: list[Path], make: bool) -> None:
    """The writer makes (or removes) `paths`, PER_TURN each turn; then the loop runs until nothing waits."""
    for at in range(0, len(paths), PER_TURN):
        for path in paths[at : at + PER_TURN]:
            if make:
                path.write_bytes(b"")
            else:
                path.unlink()
        discovery.step(0)
        clock.now += TURN_S
    rw = next(iter(discovery.watches.values()))
    while rw.pending or rw.pending_whole:
        clock.now = max(clock.now + TURN_S, rw.hold_until)  # no more events: this ends the streak
        discovery.step(0)


@pytest.mark.parametrize("count", [RELIST_NAMES // 2, RELIST_NAMES * 3])  # both under hold_max()'s floor
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
        assert 2 <= made <= _bound(turns), f"{made} publishes for {count} files in {turns} turns"
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
        assert 1 <= gone <= _bound(turns), f"{gone} publishes for removing {count} files"
        # Over the threshold a flush of that many known names lists the directory instead.
        assert (discovery.listings > listed) == (count > RELIST_NAMES * 2)
        wait_until(lambda: shown([]), 20, "the plugin side to hold no file")
    finally:
        discovery.close()


def test_a_lone_change_after_a_burst_waits_for_no_hold(cfg: Config, serve: Serve) -> None:
    """The hold follows a stream of changes: once it has passed, the next change is published at once."""
    serve(cfg.queue_socket)
    clock = Clock()
    discovery = CountingDiscovery(cfg, clock=clock)
    try:
        begin(discovery)
        paths = [Path(cfg.device_dir) / f"burst-{i:05d}" for i in range(400)]
        _run(discovery, clock, paths, make=True)
        rw = next(iter(discovery.watches.values()))
        clock.now = rw.hold_until + 1.0  # a quiet second
        before = discovery.publishes
        (Path(cfg.device_dir) / "lone").write_bytes(b"")
        discovery.step(0)
        assert discovery.publishes == before + 1 and rw.current is not None and "lone" in rw.current.ids
        assert rw.hold_until == clock.now  # the next change waits for nothing either
        assert rw.window_until - clock.now == pytest.approx(scan.HOLD_BASE_S)  # but starts a streak
        clock.now += scan.HOLD_BASE_S / 2
        (Path(cfg.device_dir) / "second").write_bytes(b"")
        discovery.step(0)
        assert discovery.publishes == before + 2, "the second change of a streak waits for nothing"
        assert rw.hold_until - clock.now == pytest.approx(2 * scan.HOLD_BASE_S), "the third one waits"
    finally:
        discovery.close()
