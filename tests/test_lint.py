"""Lint and types are tests: ruff over code and tests, mypy (strict on the pure core)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit
ROOT = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent


def run(command: list[str]) -> None:
    result = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr


def test_ruff() -> None:
    run([str(BIN / "ruff"), "check", *[p for p in ("colad", "tests", "bench") if (ROOT / p).exists()]])


def test_ruff_format() -> None:
    # One layout, applied by `ruff format colad tests bench`: a diff is a lint failure, not a review topic.
    run([str(BIN / "ruff"), "format", "--check", *[p for p in ("colad", "tests", "bench") if (ROOT / p).exists()]])


def test_mypy() -> None:
    run([str(BIN / "mypy")])
