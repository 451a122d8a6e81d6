"""The back-off helper: doubling from the first delay, capped, jitter only ever shortening a delay."""

from __future__ import annotations

import pytest

from colad.core.backoff import Backoff

pytestmark = pytest.mark.unit


@pytest.mark.parametrize(
    ("failures", "expected"),
    [(0, 0.0), (-1, 0.0), (1, 0.5), (2, 1.0), (3, 2.0), (6, 16.0), (7, 30.0), (1000, 30.0)],
    ids=["none", "negative", "first", "doubled", "twice-doubled", "below-cap", "capped", "far-past-cap"],
)
def test_delays_double_from_the_first_up_to_the_cap(failures: int, expected: float) -> None:
    assert Backoff(0.5, 30.0).delay(failures) == expected


@pytest.mark.parametrize("draw", [0.0, 0.25, 0.999, 1.0, -3.0, 7.0])
def test_jitter_shortens_a_delay_by_at_most_its_fraction(draw: float) -> None:
    delay = Backoff(1.0, 8.0, jitter=0.5).delay(4, draw)
    assert 4.0 <= delay <= 8.0


def test_no_jitter_ignores_the_draw() -> None:
    assert Backoff(1.0, 8.0).delay(2, 0.9) == 2.0


@pytest.mark.parametrize(
    ("first", "cap", "jitter"),
    [(0.0, 1.0, 0.0), (2.0, 1.0, 0.0), (1.0, 2.0, 1.0), (1.0, 2.0, -0.1)],
    ids=["zero-first", "first-past-cap", "whole-jitter", "negative-jitter"],
)
def test_a_backoff_that_cannot_work_is_refused(first: float, cap: float, jitter: float) -> None:
    with pytest.raises(ValueError, match="back-off"):
        Backoff(first, cap, jitter)
