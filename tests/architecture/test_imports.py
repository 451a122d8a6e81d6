"""Import rules of colad, read from source (graph.py): every import counts, lazy and TYPE_CHECKING ones too.

- No import cycle among colad's modules.
- The pure core imports only itself and pure parts of the standard library: no I/O, threads,
  clock or logging, so its rules can be tested and reused without a process around them.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.architecture.graph import Graph, find_cycle, imports_outside, scan, strongly_connected, write_tree

pytestmark = pytest.mark.unit
COLAD = Path(__file__).resolve().parents[2] / "colad"

# The pure core is the package colad.core, every module of it: the device model and the
# device-file rules, names, limits and roles, allocation and registration rules, the in-use view,
# file-owner trust.
PURE_CORE = tuple(sorted(f"colad.core.{p.stem}" for p in (COLAD / "core").glob("*.py") if p.name != "__init__.py"))
# Standard-library modules without I/O, threads, clock or logging. posixpath is here for its
# string functions (normpath); its file-system ones (exists, realpath) would not be pure.
PURE_STDLIB = (
    "__future__",
    "bisect",
    "collections",
    "dataclasses",
    "enum",
    "functools",
    "hashlib",
    "heapq",
    "ipaddress",
    "itertools",
    "json",
    "math",
    "operator",
    "posixpath",
    "re",
    "stat",
    "string",
    "typing",
)


def cycle_problems(graph: Graph) -> list[str]:
    """One line per group of modules that import each other: the group and one cycle path in it."""
    problems = []
    for group in sorted(strongly_connected(graph.edges()), key=sorted):
        path = find_cycle({m: graph.internal(m) & group for m in group})
        assert path is not None
        steps = " -> ".join(f"{a} (line {graph.line_of(a, b)})" for a, b in zip(path, path[1:], strict=False))
        problems.append(f"{steps} -> {path[-1]}")
    return problems


def purity_problems(graph: Graph, pure: tuple[str, ...], allowed: tuple[str, ...] = PURE_STDLIB) -> list[str]:
    missing = [f"{m} is declared pure but does not exist" for m in pure if m not in graph.imports]
    return missing or imports_outside(graph, pure, allowed)


def unresolved_problems(graph: Graph, root: str) -> list[str]:
    """Imports of `root`'s own modules that name no module of it (a module moved or renamed)."""
    return [
        f"{module}:{imp.line} imports {imp.target}, which does not exist"
        for module in sorted(graph.imports)
        for imp in graph.imports[module]
        if imp.target.startswith(f"{root}.") and imp.target not in graph.imports
    ]


def test_every_import_of_a_colad_module_names_one_that_exists() -> None:
    """A lazy import of a moved module fails only when its code path runs: found here at once."""
    assert unresolved_problems(scan(COLAD), "colad") == []


def test_colad_has_no_import_cycle() -> None:
    assert cycle_problems(scan(COLAD)) == []


def test_the_pure_core_imports_only_itself_and_pure_standard_library() -> None:
    assert purity_problems(scan(COLAD), PURE_CORE) == []


# --- each rule fails on a seeded violation -------------------------------------------------------


def package(root: Path, files: dict[str, str]) -> Path:
    """A package `pkg` under `root` with these modules (name -> source)."""
    modules = {"__init__": "", **files}
    return write_tree(root / "pkg", {name.replace(".", "/") + ".py": source for name, source in modules.items()})


def test_a_cycle_through_lazy_and_type_checking_imports_is_reported_with_its_path(tmp_path: Path) -> None:
    pkg = package(
        tmp_path,
        {
            "a": "from pkg import b\n",
            "b": "import importlib\n\n\ndef f():\n    return importlib.import_module('pkg.c').thing\n",
            "c": "TYPE_CHECKING = False\nif TYPE_CHECKING:\n    from pkg.a import Model\nthing = 1\n",
            "d": "import pkg.a\n",  # imports into the cycle, not part of it
            "e": "def g():\n    from pkg.f import x\n    return x\n",
            "f": "from pkg import e\n\nx = 1\n",
        },
    )
    assert cycle_problems(scan(pkg)) == [
        "pkg.a (line 1) -> pkg.b (line 5) -> pkg.c (line 3) -> pkg.a",
        "pkg.e (line 2) -> pkg.f (line 1) -> pkg.e",
    ]


def test_an_import_of_a_module_that_is_gone_is_reported(tmp_path: Path) -> None:
    pkg = package(
        tmp_path,
        {
            "a": "def f():\n    import pkg.moved  # noqa\n",
            "b": "from pkg.gone import x\nfrom pkg import a\n",
            "c": "import importlib\nimportlib.import_module('pkg.old')\n",
        },
    )
    assert unresolved_problems(scan(pkg), "pkg") == [
        "pkg.a:2 imports pkg.moved, which does not exist",
        "pkg.b:1 imports pkg.gone, which does not exist",
        "pkg.c:2 imports pkg.old, which does not exist",
    ]


def test_relative_imports_and_sub_packages_are_resolved(tmp_path: Path) -> None:
    pkg = package(
        tmp_path,
        {
            "core.__init__": "",
            "core.model": "from . import rules\n",
            "core.rules": "from ..shell import run\n",
            "shell": "from pkg.core.model import Model\nfrom pkg import VERSION\n",
        },
    )
    graph = scan(pkg)
    assert graph.internal("pkg.core.model") == {"pkg.core.rules"}
    assert graph.internal("pkg.core.rules") == {"pkg.shell"}
    assert graph.internal("pkg.shell") == {"pkg.core.model", "pkg"}
    assert cycle_problems(graph) == [
        "pkg.core.model (line 1) -> pkg.core.rules (line 1) -> pkg.shell (line 1) -> pkg.core.model"
    ]


def test_a_pure_module_importing_os_lazily_or_a_shell_module_is_reported(tmp_path: Path) -> None:
    pkg = package(
        tmp_path,
        {
            "model": "import re\nfrom dataclasses import dataclass\nfrom pkg import rules\n",
            "rules": "def size(path):\n    import os\n\n    return os.stat(path).st_size\n",
            "naming": "from collections.abc import Callable\nfrom pkg.shell import log\n",
            "shell": "import logging\nlog = logging.getLogger()\n",
        },
    )
    graph = scan(pkg)
    assert purity_problems(graph, ("pkg.model", "pkg.rules", "pkg.naming")) == [
        "pkg.naming:2 imports pkg.shell",
        "pkg.rules:2 imports os",
    ]
    assert purity_problems(graph, ("pkg.model", "pkg.gone")) == ["pkg.gone is declared pure but does not exist"]
