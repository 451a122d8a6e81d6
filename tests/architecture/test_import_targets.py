"""House rule: every import of a colad module names a module that exists, lazy ones too.

An import inside a function runs only when its path runs: a module moved or renamed leaves it
pointing nowhere until then, and an `except Exception` around it turns the ImportError into a
feature that is quietly off (the plugin's metrics and health endpoints load that way).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.architecture.graph import Graph, scan

pytestmark = pytest.mark.unit
COLAD = Path(__file__).resolve().parents[2] / "colad"


def unresolved(graph: Graph, package: str) -> list[str]:
    """Every import of `package` or a module under it that names no module of the scanned tree."""
    return [
        f"{module}:{imp.line} imports {imp.target}"
        for module in sorted(graph.imports)
        for imp in graph.imports[module]
        if (imp.target == package or imp.target.startswith(package + ".")) and imp.target not in graph.imports
    ]


def test_every_import_of_a_colad_module_names_one_that_exists() -> None:
    assert unresolved(scan(COLAD), "colad") == []


def test_a_lazy_import_of_a_moved_module_is_reported(tmp_path: Path) -> None:
    files = {
        "__init__": "",
        "a": "def load():\n    try:\n        import pkg.gone\n    except Exception:\n        pass\n",
        "b": "from pkg import a\nfrom pkg.a import load\nimport os\n",
        "c": "from pkg.moved import thing\n",
    }
    for name, source in files.items():
        (tmp_path / "pkg").mkdir(exist_ok=True)
        (tmp_path / "pkg" / f"{name}.py").write_text(source)
    assert unresolved(scan(tmp_path / "pkg"), "pkg") == ["pkg.a:3 imports pkg.gone", "pkg.c:1 imports pkg.moved"]
