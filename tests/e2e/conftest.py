"""e2e fixtures: a strict fake kubelet and colad under the real supervisord, in a short temp root."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.fakes.kubelet import FakeKubelet
from tests.service import ColadService


@pytest.fixture
def kubelet(short_tmp: Path) -> Iterator[FakeKubelet]:
    fake = FakeKubelet(short_tmp / "kubelet")
    fake.start()
    yield fake
    fake.stop()
    assert fake.violations == [], "the fake kubelet saw contract violations"


@pytest.fixture
def colad(short_tmp: Path, kubelet: FakeKubelet) -> Iterator[ColadService]:
    service = ColadService(short_tmp)
    service.add("cocacola", "peisicola")
    service.start()
    yield service
    rc = service.stop()
    assert rc == 0, f"supervisord exited with {rc}\n" + service.log()[-4000:]
