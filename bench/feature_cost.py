"""What colad's optional work costs per change: colad with each of it turned off by config, in one run.

Subjects, interleaved round by round (bench/split_floor.py's round): the baseline, colad as shipped,
colad with `log_level = "WARNING"` (no INFO line per change, so nothing for supervisord to relay),
colad with `cdi = "off"` (no CDI spec rewritten when a device comes or goes), and colad with both.
What is left with both off is the price of the rest (the delta protocol, the state file, health,
metrics), to set beside the split's floor. Run from the checkout: python -m bench.feature_cost
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
from pathlib import Path

from bench import installed, split_floor
from bench.subjects import Baseline, Colad, PluginUnderTest

VARIANTS = {
    "colad": {},
    "no-info-log": {"COLAD_LOG_LEVEL": "WARNING"},
    "no-cdi": {"COLAD_CDI": "off"},
    "neither": {"COLAD_LOG_LEVEL": "WARNING", "COLAD_CDI": "off"},
}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--changes", type=int, default=300)
    args = parser.parse_args(argv)
    venv = Path(tempfile.mkdtemp(prefix="colad-features-venv-"))
    python, how = installed.prepare(sys.executable, venv)  # as make bench runs them
    print(f"subjects run on {sys.executable}, {how}", file=sys.stderr)
    rounds = []
    try:
        for r in range(args.rounds):
            plugins: list[PluginUnderTest] = [Baseline(python), *(Colad(python, VARIANTS[n], name=n) for n in VARIANTS)]
            if r % 2:
                plugins.reverse()
            rounds.append(split_floor.one_round(plugins, args.changes))
            print(f"round {r + 1}: {rounds[-1]}", file=sys.stderr, flush=True)
    finally:
        shutil.rmtree(venv, ignore_errors=True)
    print(split_floor.report(rounds, ["baseline", *VARIANTS]))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
