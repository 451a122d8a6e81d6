"""Capped exponential back-off: how long a shell waits before its next try after failures in a row.

Pure: the shell counts its failures, draws the jitter and sleeps; this module only says how long.
Used by the API-server shells (colad/dra/publisher.py), whose retries of a whole fleet of nodes
meet at one API server after an outage, hence the jitter.
"""

from __future__ import annotations

from dataclasses import dataclass

TYPE_CHECKING = False  # typing is not loaded at run time: docs/DEVELOPING.md, "Import cost"
if TYPE_CHECKING:
    from typing import Final

_MAX_DOUBLINGS: Final = 62  # 2**62 times any first delay is past any cap; the exponent stays bounded


@dataclass(frozen=True)
class Backoff:
    """Delays of `first` seconds doubling up to `cap`, each cut by up to `jitter` (a fraction) at random."""

    first: float
    cap: float
    jitter: float = 0.0

    def __post_init__(self) -> None:
        if not (0 < self.first <= self.cap) or not (0 <= self.jitter < 1):
            raise ValueError(f"back-off needs 0 < first <= cap and 0 <= jitter < 1: {self}")

    def delay(self, failures: int, draw: float = 0.0) -> float:
        """Seconds to wait after `failures` failures in a row (0 after none); `draw` is a random number
        in [0, 1) the caller drew, so that the delay lies in ((1 - jitter) * d, d] for the doubling d."""
        if failures <= 0:
            return 0.0
        doubled = min(self.first * float(1 << min(failures - 1, _MAX_DOUBLINGS)), self.cap)
        return doubled * (1.0 - self.jitter * min(max(draw, 0.0), 1.0))
