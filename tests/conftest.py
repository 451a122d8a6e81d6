"""Shared fixtures: short temporary roots (Unix socket paths must stay under 108 bytes), and the guard.

The guard (tests/service.py) runs after every test and at the end of the session: a colad
role that restarted without the test declaring it, or a traceback in a colad log, fails it.
"""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.service import guard_report


@pytest.fixture
def short_tmp() -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(prefix="colad-", dir="/tmp"))
    path.chmod(0o755)
    yield path
    shutil.rmtree(path, ignore_errors=True)


def _fail_on_guard_problems() -> None:
    problems = guard_report()
    if problems:
        pytest.fail("colad guard:\n" + "\n".join(problems), pytrace=False)


@pytest.fixture(autouse=True)
def colad_guard() -> Iterator[None]:
    """Set up before, so torn down after, every fixture that starts or stops a ColadService."""
    yield
    _fail_on_guard_problems()


@pytest.fixture(autouse=True, scope="session")
def colad_guard_session() -> Iterator[None]:
    """What a module- or session-scoped service logged while it was being stopped."""
    yield
    _fail_on_guard_problems()
