"""The interpreter both plugins run on in the bench: this checkout's code as an installed package runs.

A .deb (dh_python3) or a wheel install ships byte-compiled modules and no import hook; a development
venv (`pip install -e`) has neither: every process compiles colad's sources on each start
(PYTHONDONTWRITEBYTECODE) and imports setuptools' editable finder (pathlib, urllib, ipaddress: ~10 ms
and ~2 MiB in each of colad's six interpreters). So the bench byte-compiles the checkout and, for an
editable venv, runs a bare venv that sees the same site-packages without the finder's .pth file.
"""

from __future__ import annotations

import compileall
import glob
import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
COMPILED = ("colad", "bench")  # what the subjects import from the checkout


def _site_packages(python: str) -> list[str]:
    code = "import json, site; print(json.dumps(site.getsitepackages()))"
    return list(json.loads(subprocess.run([python, "-c", code], capture_output=True, text=True, check=True).stdout))


def editable_hooks(python: str) -> list[str]:
    """The editable-install .pth files in `python`'s site-packages (none on an installed colad)."""
    return sorted(p for d in _site_packages(python) for p in glob.glob(os.path.join(d, "__editable__*.pth")))


def tree_python(tree: Path) -> str:
    """The interpreter a checkout runs on: its own `make setup` venv, or this one if it has none."""
    own = tree / ".venv" / "bin" / "python"
    return str(own) if own.exists() else sys.executable


def byte_compile(python: str, tree: Path = REPO) -> None:
    """Compile the checkout's colad/ and bench/ for `python` (its own cache tag), as an install does."""
    if python == sys.executable:
        for name in COMPILED:
            compileall.compile_dir(tree / name, quiet=1)
        return
    command = [python, "-m", "compileall", "-q", *(str(tree / n) for n in COMPILED)]
    subprocess.run(command, check=True, capture_output=True)


def prepare(python: str, base: Path, tree: Path = REPO) -> tuple[str, str]:
    """(interpreter to run the subjects on, how it was made) for `python` and the checkout `tree`,
    in the bench's temp dir `base`."""
    byte_compile(python, tree)
    hooks = editable_hooks(python)
    if not hooks:
        return python, "byte-compiled"
    venv = base / "venv"
    subprocess.run([python, "-m", "venv", "--without-pip", str(venv)], check=True, capture_output=True)
    bare = str(venv / "bin" / "python")
    # A .pth line adds a directory to sys.path without running the .pth files in it: the same
    # packages, minus the editable finder. The checkout itself comes in on PYTHONPATH (ColadService).
    (Path(_site_packages(bare)[0]) / "colad-bench.pth").write_text("\n".join(_site_packages(python)) + "\n")
    return bare, f"byte-compiled, without the editable install's import hook ({len(hooks)} .pth skipped)"
