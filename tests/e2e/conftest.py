"""e2e fixtures: a strict fake kubelet and colad under the real supervisord, in a short temp root."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests import image
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


@pytest.fixture(scope="session")
def base_image() -> str:
    """The base image in local storage: imported from a debootstrapped root when missing, never a skip.

    Checked when a test asks, not at collection: on a fresh machine test_image.py may import it first,
    and a skip decided before that would leave CDI untested exactly where nothing was cached.
    """
    return image.ensure_base()
