"""Shared fixtures: short temporary roots (Unix socket paths must stay under 108 bytes), and the guard.

The guard (tests/service.py) runs after every test and at the end of the session: a colad
role that restarted without the test declaring it, or a traceback in a colad log, fails it.
"""

from __future__ import annotations

import os
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


@pytest.fixture(autouse=True)
def process_umask() -> Iterator[None]:
    """Every test starts with the umask the run started with: a role's or supervise's main() run in-process
    sets the root-only umask of a daemon (0o077), which would change the modes later tests create."""
    umask = os.umask(0o022)
    os.umask(umask)
    yield
    os.umask(umask)


# The machine's own CDI spec directories: a test that wrote colad's spec there would change what every
# container runtime on this machine resolves (and race other runs). Tests point cdi_spec_dir elsewhere.
MACHINE_CDI_DIRS = (Path("/etc/cdi"), Path("/run/cdi"))


def _colad_specs() -> set[str]:
    return {str(p) for d in MACHINE_CDI_DIRS if d.is_dir() for p in d.iterdir() if p.name.startswith("colad-")}


@pytest.fixture(autouse=True)
def machine_cdi_dirs_untouched() -> Iterator[None]:
    before = _colad_specs()
    yield
    after = _colad_specs()
    if after != before:
        pytest.fail(
            f"a test changed colad's specs in the machine's CDI directories: {sorted(after ^ before)}", pytrace=False
        )


@pytest.fixture(autouse=True, scope="session")
def colad_guard_session() -> Iterator[None]:
    """What a module- or session-scoped service logged while it was being stopped."""
    yield
    _fail_on_guard_problems()
