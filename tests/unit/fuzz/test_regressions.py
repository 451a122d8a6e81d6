"""Every input kept in tests/fuzz/regressions/ (hand-picked seeds and crashes atheris found) still passes."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.fuzz.targets import TARGETS

pytestmark = pytest.mark.unit
CORPUS = Path(__file__).resolve().parents[2] / "fuzz" / "regressions"
CASES = sorted((target, path) for target in TARGETS for path in (CORPUS / target).iterdir() if path.is_file())


def test_corpus_is_not_empty() -> None:
    assert {target for target, _ in CASES} == set(TARGETS)


@pytest.mark.parametrize(("target", "path"), CASES, ids=[f"{t}/{p.name}" for t, p in CASES])
def test_regression_input(target: str, path: Path) -> None:
    TARGETS[target](path.read_bytes())
