"""A rescan that fails is tried again after UNUSABLE_RETRY_S, by stat()ing every file, without spinning.

Real files, real inotify, a real queue server; the loop is stepped by hand against a clock the
test moves. The failure is injected in the O(change) rescan, the loop boundary catches it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from colad.config.config import Config
from colad.discovery.main import UNUSABLE_RETRY_S, Discovery
from tests.integration.support import Serve, begin, discovery_config

pytestmark = pytest.mark.integration


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class FailingOnce(Discovery):
    """Discovery whose next O(change) rescan raises once."""

    def __init__(self, cfg: Config, **kwargs: Any) -> None:
        super().__init__(cfg, **kwargs)
        self.fail = False

    def _rescan_named(self, *args: Any, **kwargs: Any) -> None:
        if self.fail:
            self.fail = False
            raise OSError("injected")
        super()._rescan_named(*args, **kwargs)


def test_a_failed_rescan_is_retried_in_full_after_the_retry_delay(short_tmp: Path, serve: Serve) -> None:
    cfg = discovery_config(short_tmp)
    serve(cfg.queue_socket)
    clock = Clock()
    discovery = FailingOnce(cfg, clock=clock)
    try:
        begin(discovery)
        rw = next(iter(discovery.watches.values()))
        discovery.fail = True
        (Path(cfg.device_dir) / "cola1").write_bytes(b"")
        discovery.step(0)
        assert rw.current is not None and "cola1" not in rw.current.ids
        assert discovery.stats.counters.get("input.rescan_failed") == 1
        assert discovery.timeout() == pytest.approx(UNUSABLE_RETRY_S), "the loop waits for the retry, no spin"
        clock.now += UNUSABLE_RETRY_S
        discovery.step(0)
        assert "cola1" in rw.current.ids, "the retry stat()ed every file"
        assert not rw.retry_whole
    finally:
        discovery.close()
