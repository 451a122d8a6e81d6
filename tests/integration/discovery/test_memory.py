"""What discovery holds per device once a burst has settled: one Device object, no copies.

A real directory, real inotify, the role's own loop: files written just before the start are racy
and read again when the window passes. After that follow-up, the set published, the advertised
map and the read cache hold the same Device objects (an equal copy beside each is 150 bytes and
what is kept on it), the emptied racy map is a fresh dict, and the held set carries no index.
The C heap is trimmed after a turn that read many names, never on a one-file change's path. An
empty file's content is its size: it is never racy, and its cache entry has no key of its own.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import pytest

from colad.config.config import Config
from colad.core import namemap
from colad.core.constants import UNHEALTHY
from colad.discovery import devicedir, main
from colad.discovery.main import TRIM_AFTER_NAMES, Discovery
from colad.outputs import cdi
from tests.integration.support import discovery_config

pytestmark = pytest.mark.integration
COUNT = 300


@pytest.fixture
def cfg(short_tmp: Path) -> Config:
    return discovery_config(short_tmp)


def _settled(cfg: Config) -> Discovery:
    """The role's start, then its loop until no follow-up is due (the racy entries read again)."""
    discovery = Discovery(cfg)
    discovery.run_dir.ensure()
    for rw in discovery.watches.values():
        rw.dir.ensure()
    discovery.rescan("start")
    discovery.outputs.write_turn(discovery.watches)
    discovery._trim_heap()
    deadline = time.monotonic() + 60
    while any(rw.follow_up is not None for rw in discovery.watches.values()):
        assert time.monotonic() < deadline, "the racy entries never settled"
        discovery.step(min(discovery.timeout(), 0.2))
    return discovery


def test_a_settled_burst_holds_one_device_object_per_device(cfg: Config) -> None:
    root = Path(cfg.device_dir)
    for i in range(COUNT):  # an empty file is never racy; one with content is read again after the window
        (root / f"dev{i:04d}").write_text("" if i % 2 else 'health = "Healthy"\n')
    (root / "env0").write_text('[envs]\nA = "b"\n')
    (root / "sick0").write_text('health = "Unhealthy"\n')
    (root / "bad0").write_text("not = toml = [\n")
    # Unhealthy by the health overlay (its host path is missing): a new object at every look.
    (root / "node0").write_text('[[device_nodes]]\nhost_path = "/dev/colad-no-such-node"\n')
    discovery = _settled(cfg)
    try:
        rw = next(iter(discovery.watches.values()))
        assert rw.current is not None and len(rw.current) == COUNT + 4
        assert "_by_id" not in vars(rw.current)  # no index kept on the held set (200 KiB at 10,000); get() makes one
        assert rw.current.get("node0").health == UNHEALTHY  # type: ignore[union-attr]
        for device in rw.current:
            assert rw.shown[device.device_id] is device
            raw = rw.cache[device.device_id].device
            assert raw is device or device.device_id == "node0", device.device_id
        assert rw.racy == {} and sys.getsizeof(rw.racy) == sys.getsizeof({})
        spec = Path(cfg.cdi_spec_dir, namemap.cdi_spec_file(rw.resource.name))
        assert spec.read_bytes() == cdi.encode_spec(rw.resource.name, rw.current)
    finally:
        discovery.close()


def test_the_heap_is_trimmed_after_a_large_turn_only(cfg: Config, monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[int] = []
    monkeypatch.setattr(main, "_malloc_trim", calls.append)
    root = Path(cfg.device_dir)
    for i in range(TRIM_AFTER_NAMES):
        (root / f"dev{i:04d}").write_text('health = "Healthy"\n')  # with content: racy, read again
    discovery = Discovery(cfg)
    try:
        discovery.run_dir.ensure()
        rw = next(iter(discovery.watches.values()))
        rw.dir.ensure()
        discovery.rescan("start")
        discovery._trim_heap()  # as run() does after the start
        assert calls == [0]
        deadline = time.monotonic() + 60
        while rw.follow_up is not None:  # the burst's racy follow-up reads every name again: one trim
            assert time.monotonic() < deadline, "the racy entries never settled"
            discovery.step(min(discovery.timeout(), 0.2))
        assert calls == [0, 0]
        (root / "one-more").write_text("")
        deadline = time.monotonic() + 60
        while rw.current is None or "one-more" not in rw.current.ids:
            assert time.monotonic() < deadline, "the change was never published"
            discovery.step(0.2)
        assert calls == [0, 0]  # one file: no trim on the change's path
    finally:
        discovery.close()


def test_empty_files_are_never_racy_and_share_one_key(cfg: Config) -> None:
    root = Path(cfg.device_dir)
    for i in range(50):
        (root / f"dev{i:02d}").write_text("")
    discovery = Discovery(cfg)
    try:
        discovery.run_dir.ensure()
        rw = next(iter(discovery.watches.values()))
        rw.dir.ensure()
        discovery.rescan("start")
        assert rw.follow_up is None and rw.racy == {}  # written just now, and still trusted
        assert all(c.key is devicedir.EMPTY_KEY and c.trusted for c in rw.cache.values())
        (root / "dev00").write_text("numa_nodes = [0]\n")  # content, then empty again: both seen
        discovery.rescan("inotify", [rw], {rw.resource.name: {"dev00"}}, ())
        assert rw.current is not None and rw.current.get("dev00").numa_nodes == (0,)  # type: ignore[union-attr]
        (root / "dev00").write_text("")
        discovery.rescan("inotify", [rw], {rw.resource.name: {"dev00"}}, ())
        assert rw.current.get("dev00").numa_nodes == ()  # type: ignore[union-attr]
    finally:
        discovery.close()
