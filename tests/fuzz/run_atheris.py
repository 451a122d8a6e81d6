"""Run one fuzz target under atheris: `python -m tests.fuzz.run_atheris TARGET [libFuzzer flags...]`.

Crashing inputs are written to tests/fuzz/regressions/<TARGET>/ (keep them: they
become regression tests). Needs `pip install atheris` (`make soak` does it).
"""

from __future__ import annotations

import shutil
import sys
import tempfile
from pathlib import Path

import atheris

with atheris.instrument_imports():
    from tests.fuzz import targets


def main() -> None:
    name = sys.argv[1]
    target = targets.TARGETS[name]
    kept = Path(__file__).resolve().parent / "regressions" / name
    # Start from the kept inputs, but let libFuzzer grow a scratch copy, not the repository.
    corpus = Path(tempfile.mkdtemp(prefix=f"colad-fuzz-{name}-"))
    for path in kept.iterdir():
        shutil.copy(path, corpus / path.name)
    args = [sys.argv[0], *sys.argv[2:], f"-artifact_prefix={kept}/crash-", str(corpus)]
    atheris.Setup(args, target)
    atheris.Fuzz()


if __name__ == "__main__":
    main()
