"""Old against new checkouts, interleaved round by round, for the profile_* scripts and their py-spy frames.

`interleave` runs every phase for every tree, alternating the order per round, so drift on a
shared machine falls on both; `table` prints each figure's median and [min..max] per tree and
new's ratio to each other tree; `profiles` runs one more round per tree under py-spy and prints
the inclusive samples per frame (`top_frames`).
"""

from __future__ import annotations

import collections
import os
import statistics
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

Figures = dict[tuple[str, str], list[dict[str, float]]]  # (tree, phase) -> one dict of figures per round


def interleave(
    trees: dict[str, Path], phases: list[str], rounds: int, run: Callable[[Path, str], dict[str, float]]
) -> Figures:
    figures: Figures = collections.defaultdict(list)
    for r in range(rounds):
        order = list(trees) if r % 2 == 0 else list(reversed(trees))
        for phase in phases:
            for name in order:
                figures[(name, phase)].append(run(trees[name], phase))
                print(f"round {r + 1} {phase} {name}: {figures[(name, phase)][-1]}", file=sys.stderr, flush=True)
    return figures


def compare(
    trees: dict[str, Path],
    phases: list[str],
    rounds: int,
    profile: str,
    run: Callable[[Path, str, str | None], dict[str, float]],
) -> None:
    """The whole comparison: `rounds` interleaved, the table, then (with a `profile` prefix) py-spy's frames.

    `run(tree, phase, raw)` measures one phase of one tree and returns its figures; with `raw`, under py-spy.
    """
    figures = interleave(trees, phases, rounds, lambda tree, phase: run(tree, phase, None))
    table(trees, phases, figures, rounds)
    if profile:
        profiles(trees, phases, profile, run)


def table(trees: dict[str, Path], phases: list[str], figures: Figures, rounds: int) -> None:
    for phase in phases:
        print(f"\n== {phase} (median of {rounds}, [min..max])")
        for key in (figures[("new", phase)] or [{}])[0]:
            row, medians = [], {}
            for name in trees:
                values = [f[key] for f in figures[(name, phase)]]
                medians[name] = statistics.median(values)
                row.append(f"{name} {medians[name]:8.2f} [{min(values):.2f}..{max(values):.2f}]")
            row += [f"new/{n} {medians['new'] / m:.2f}" for n, m in medians.items() if n != "new" and m]
            print(f"  {key:18} " + "   ".join(row))


def profiles(trees: dict[str, Path], phases: list[str], prefix: str, run: Callable[[Path, str, str], object]) -> None:
    """One run per tree and phase with py-spy writing raw stacks to a file, then its top frames."""
    for phase in phases:
        for name, tree in trees.items():
            raw = os.path.join(tempfile.gettempdir(), f"{prefix}-{name}-{phase}.txt")
            run(tree, phase, raw)
            if os.path.exists(raw):
                print(f"\n== py-spy {phase} {name}: inclusive samples per frame ({raw})")
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
