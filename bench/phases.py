"""Phases measured round by round, each run in a fresh process, for profile_plugin and profile_discovery.

`repeat` runs every phase once per round; `table` prints each figure's median and [min..max];
`profiles` runs every phase once more under py-spy and prints the inclusive samples per frame
(`top_frames`, which profile_allocate reads too).
"""

from __future__ import annotations

import collections
import os
import statistics
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

Figures = dict[str, list[dict[str, float]]]  # phase -> one dict of figures per round


def repeat(phases: list[str], rounds: int, run: Callable[[str], dict[str, float]]) -> Figures:
    figures: Figures = collections.defaultdict(list)
    for r in range(rounds):
        for phase in phases:
            figures[phase].append(run(phase))
            print(f"round {r + 1} {phase}: {figures[phase][-1]}", file=sys.stderr, flush=True)
    return figures


def measure(phases: list[str], rounds: int, profile: str, run: Callable[[str, str | None], dict[str, float]]) -> None:
    """The whole measurement: `rounds` of every phase, the table, then (with a `profile` prefix) py-spy's frames.

    `run(phase, raw)` measures one phase and returns its figures; with `raw`, under py-spy writing to that file.
    """
    figures = repeat(phases, rounds, lambda phase: run(phase, None))
    table(phases, figures, rounds)
    if profile:
        profiles(phases, profile, run)


def table(phases: list[str], figures: Figures, rounds: int) -> None:
    for phase in phases:
        print(f"\n== {phase} (median of {rounds}, [min..max])")
        for key in (figures[phase] or [{}])[0]:
            values = [f[key] for f in figures[phase]]
            print(f"  {key:18} {statistics.median(values):8.2f} [{min(values):.2f}..{max(values):.2f}]")


def profiles(phases: list[str], prefix: str, run: Callable[[str, str], object]) -> None:
    """One run per phase with py-spy writing raw stacks to a file, then its top frames."""
    for phase in phases:
        raw = os.path.join(tempfile.gettempdir(), f"{prefix}-{phase}.txt")
        run(phase, raw)
        if os.path.exists(raw):
            print(f"\n== py-spy {phase}: inclusive samples per frame ({raw})")
            for n, frame in top_frames(raw):
                print(f"  {n:6d} {frame}")


def top_frames(raw: str, limit: int = 30) -> list[tuple[int, str]]:
    """Inclusive samples per frame (each frame counted once per stack) from py-spy's raw output."""
    counts: collections.Counter[str] = collections.Counter()
    total = 0
    for line in Path(raw).read_text().splitlines():
        stack, _, n = line.rpartition(" ")
        total += int(n)
        for frame in {f.split(" (")[0] + " " + f.split("/")[-1].rstrip(")") for f in stack.split(";")[1:]}:
            counts[frame] += int(n)
    return [(total, "total samples")] + [(n, f) for f, n in counts.most_common(limit)]
