"""House rules for tests and the names colad hands them, checked on the real tree and on seeded violations.

- Tests reach no `_private` name of colad (imported, or read off an imported colad module), except
  the seams in PRIVATE_SEAMS, each with its reason.
- Tests import a name from the colad module that defines it, not from one that imports it.
- No colad module imports a name it does not use (a re-export kept for tests or tools is a shim).
- Test files and test functions are named by behaviour, never by issue or round.
- The markers are true: a tests/unit file is marked `unit` and starts no process, opens no socket,
  starts no thread and never sleeps; a tests/integration file is marked `integration`.
Each checker takes a root holding `colad/` and `tests/` and returns one line per violation.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.architecture.graph import write_tree

pytestmark = pytest.mark.unit
ROOT = Path(__file__).resolve().parents[2]

# Private names a test still reaches, each for a reason no public API serves.
PRIVATE_SEAMS = {
    "colad.queue.snapshots._STATS": (
        "the memo key: a test asserts a delta carried the counts over instead of recounting"
    ),
    "colad.metrics.httpserver._Reading": (
        "a connection being read: choose_victim's tests build the connections it chooses from"
    ),
    "colad.config.config._CHECKS": "the per-key checks: a test asserts every default passes its own key's check",
    "colad.runtime.log._Formatter": (
        "the one line format; log.setup() installs it on stdout, which a test cannot capture"
    ),
    "colad.cli.status._from_file": "status' answer from the state file alone, tested without a live plugin socket",
    "colad.config.source._ONLY_COMMENTS": "the comments-only shortcut, checked against tomllib on random texts",
    "colad.queue.messages._body": "a message's JSON body: memory tests compare the streamed encoding with json's own",
    "colad.watchers.loop._identity": "the stat() of a watched path: the wake-up tests count the calls each wake costs",
}
# Modules whose unused imports other work removes; each entry names why it is still there.
REEXPORTS_ALLOWED = {
    "colad.watchdog.make_rpcinterface": (
        "the entry point an installed supervisord.conf (a conffile) names: see colad/watchdog.py"
    ),
    "colad.queue.device_wire.DeviceSet": (
        "messages' lazy import names it from device_wire (the messages/device_wire cycle)"
    ),
}
BY_HISTORY = re.compile(
    r"issue|round_?\d|(?:first|second|third|fourth|fifth|sixth|seventh|eighth|ninth|tenth|\d+(?:st|nd|rd|th))_round"
)
UNIT_FORBIDDEN_IMPORTS = {"subprocess", "socket", "threading", "multiprocessing", "socketserver", "grpc"}
UNIT_FORBIDDEN_CALLS = {("time", "sleep"), ("os", "fork"), ("os", "system"), ("os", "popen")}


def _modules(root: Path, package: str) -> Iterator[tuple[str, Path]]:
    base = root / package
    for path in sorted(base.rglob("*.py")):
        if "api" in path.relative_to(base).parts[:-1]:
            continue  # generated protobuf stubs
        parts = path.relative_to(root).with_suffix("").parts
        yield ".".join(parts[:-1] if parts[-1] == "__init__" else parts), path


def _defined(path: Path) -> set[str]:
    """Names a module defines at its top level (functions, classes, assignments, in if/try blocks too)."""
    names: set[str] = set()
    for node in _top(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names |= {n.id for t in targets for n in ast.walk(t) if isinstance(n, ast.Name)}
    return names


def _top(tree: ast.Module) -> list[ast.stmt]:
    """Top-level statements, those inside top-level if/try blocks included."""
    out: list[ast.stmt] = []
    for node in tree.body:
        out.append(node)
        if isinstance(node, (ast.If, ast.Try)):
            out += [n for n in ast.walk(node) if isinstance(n, ast.stmt)]
    return out


def _colad_modules(root: Path) -> dict[str, Path]:
    return dict(_modules(root, "colad"))


def _imports_of_colad(tree: ast.Module, modules: dict[str, Path]) -> Iterator[tuple[int, str, str]]:
    """(line, module, name) of every `from colad.<module> import name` and every `m.name` read off a colad module m."""
    aliases: dict[str, str] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module in modules:
            for alias in node.names:
                if f"{node.module}.{alias.name}" in modules:
                    aliases[alias.asname or alias.name] = f"{node.module}.{alias.name}"
                else:
                    yield node.lineno, node.module, alias.name
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.asname and alias.name in modules:
                    aliases[alias.asname] = alias.name
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in aliases:
            if f"{aliases[node.value.id]}.{node.attr}" not in modules:
                yield node.lineno, aliases[node.value.id], node.attr


def _test_files(root: Path) -> Iterator[tuple[Path, ast.Module]]:
    for path in sorted((root / "tests").rglob("*.py")):
        yield path, ast.parse(path.read_text(encoding="utf-8"))


def private_reaches(root: Path, seams: dict[str, str] = PRIVATE_SEAMS) -> list[str]:
    modules = _colad_modules(root)
    found = []
    for path, tree in _test_files(root):
        for line, module, name in _imports_of_colad(tree, modules):
            if name.startswith("_") and not name.startswith("__") and f"{module}.{name}" not in seams:
                found.append(f"{path.relative_to(root)}:{line}: {module}.{name} is private")
    return found


def foreign_imports(root: Path) -> list[str]:
    modules = _colad_modules(root)
    defined = {name: _defined(path) for name, path in modules.items()}
    found = []
    for path, tree in _test_files(root):
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module in modules:
                for alias in node.names:
                    if f"{node.module}.{alias.name}" not in modules and alias.name not in defined[node.module]:
                        found.append(
                            f"{path.relative_to(root)}:{node.lineno}: {alias.name} is not defined in {node.module}"
                        )
    return found


def _used_names(tree: ast.Module) -> set[str]:
    """Names a module reads (in code and annotations), `__all__` left out: listing a name there is no use."""
    skip: set[int] = set()
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "__all__" for t in node.targets):
            skip |= {id(n) for n in ast.walk(node)}
    used = set()
    for node in ast.walk(tree):
        if id(node) in skip:
            continue
        if isinstance(node, ast.Name):
            used.add(node.id)
        elif isinstance(node, ast.Attribute):
            base = node
            while isinstance(base, ast.Attribute):
                base = base.value  # type: ignore[assignment]
            if isinstance(base, ast.Name):
                used.add(base.id)
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            try:  # a string annotation ("Config") names what it uses
                expr = ast.parse(node.value, mode="eval")
            except SyntaxError:
                continue
            used |= {n.id for n in ast.walk(expr) if isinstance(n, ast.Name)}
    return used


def unused_imports(root: Path, allowed: dict[str, str] = REEXPORTS_ALLOWED) -> list[str]:
    """Module-level imports of colad modules that the module never uses: re-exports."""
    found = []
    for module, path in _modules(root, "colad"):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        used = _used_names(tree)
        for node in _top(tree):
            if isinstance(node, ast.ImportFrom) and node.module != "__future__":
                bound = [(a.asname or a.name, a.name) for a in node.names]
            elif isinstance(node, ast.Import):
                bound = [(a.asname or a.name.split(".")[0], a.name) for a in node.names]
            else:
                continue
            for name, imported in bound:
                if name not in used and f"{module}.{name}" not in allowed:
                    rel = path.relative_to(root)
                    found.append(f"{rel}:{node.lineno}: {imported} is imported and never used (a re-export)")
    return found


def history_names(root: Path) -> list[str]:
    found = []
    for path, tree in _test_files(root):
        if BY_HISTORY.search(path.stem):
            found.append(f"{path.relative_to(root)}: the file is named by history, not behaviour")
        for node in ast.walk(tree):
            if isinstance(node, ast.FunctionDef) and node.name.startswith("test") and BY_HISTORY.search(node.name):
                found.append(f"{path.relative_to(root)}:{node.lineno}: {node.name} is named by history")
    return found


def _marker(tree: ast.Module) -> str | None:
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "pytestmark" for t in node.targets):
            value = node.value
            if isinstance(value, ast.Attribute):
                return value.attr
    return None


def untrue_markers(root: Path) -> list[str]:
    found = []
    for path, tree in _test_files(root):
        layer = path.relative_to(root / "tests").parts[0]
        if layer not in ("unit", "integration") or not path.name.startswith("test_"):
            continue
        rel = path.relative_to(root)
        if _marker(tree) != layer:
            found.append(f"{rel}: not marked {layer}")
        if layer != "unit":
            continue
        for node in ast.walk(tree):
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                names = [a.name for a in node.names] if isinstance(node, ast.Import) else [node.module or ""]
                for name in names:
                    if name.split(".")[0] in UNIT_FORBIDDEN_IMPORTS:
                        found.append(f"{rel}:{node.lineno}: a unit test imports {name}")
            elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
                owner = node.func.value
                if isinstance(owner, ast.Name) and (owner.id, node.func.attr) in UNIT_FORBIDDEN_CALLS:
                    found.append(f"{rel}:{node.lineno}: a unit test calls {owner.id}.{node.func.attr}")
    return found


# --- the real tree --------------------------------------------------------------------------------


def test_tests_reach_no_private_name_but_the_documented_seams() -> None:
    assert private_reaches(ROOT) == []


def test_every_documented_seam_is_still_used() -> None:
    used = set()
    modules = _colad_modules(ROOT)
    for _, tree in _test_files(ROOT):
        used |= {f"{m}.{n}" for _, m, n in _imports_of_colad(tree, modules)}
    assert set(PRIVATE_SEAMS) <= used, set(PRIVATE_SEAMS) - used


def test_tests_import_names_from_their_defining_module() -> None:
    assert foreign_imports(ROOT) == []


def test_no_colad_module_re_exports_a_name_it_does_not_use() -> None:
    assert unused_imports(ROOT) == []


def test_tests_are_named_by_behaviour() -> None:
    assert history_names(ROOT) == []


def test_unit_tests_are_pure_and_every_layer_is_marked() -> None:
    assert untrue_markers(ROOT) == []


# --- seeded violations ----------------------------------------------------------------------------


def _tree(tmp_path: Path, files: dict[str, str]) -> Path:
    return write_tree(tmp_path, files)


COLAD = {
    "colad/__init__.py": "",
    "colad/rules.py": "import os\n\nLIMIT = 3\n_KEY = 'k'\n\n\ndef check(x):\n    return os.sep + x\n",
    "colad/shell.py": "from colad.rules import LIMIT\n\n\ndef run():\n    return LIMIT\n",
}


def test_a_private_import_and_a_private_read_are_reported(tmp_path: Path) -> None:
    root = _tree(
        tmp_path,
        COLAD
        | {
            "tests/unit/test_rules.py": "from colad.rules import _KEY\n",
            "tests/unit/test_rules_too.py": "from colad import rules\n\nKEY = rules._KEY\n",
        },
    )
    assert private_reaches(root, seams={}) == [
        "tests/unit/test_rules.py:1: colad.rules._KEY is private",
        "tests/unit/test_rules_too.py:3: colad.rules._KEY is private",
    ]
    assert private_reaches(root, seams={"colad.rules._KEY": "a reason"}) == []


def test_a_name_imported_through_another_module_is_reported(tmp_path: Path) -> None:
    root = _tree(tmp_path, COLAD | {"tests/unit/test_shell.py": "from colad.shell import LIMIT, run\n"})
    assert foreign_imports(root) == ["tests/unit/test_shell.py:1: LIMIT is not defined in colad.shell"]


def test_a_re_export_is_reported(tmp_path: Path) -> None:
    shim = "from colad.rules import LIMIT, check  # kept for the tests\n\n\ndef run():\n    return LIMIT\n"
    root = _tree(tmp_path, COLAD | {"colad/shell.py": shim})
    assert unused_imports(root, allowed={}) == ["colad/shell.py:1: check is imported and never used (a re-export)"]
    listed = 'from colad.rules import check\n\n__all__ = ["check"]\n'
    root = _tree(tmp_path, COLAD | {"colad/shell.py": listed})
    assert unused_imports(root, allowed={}) == ["colad/shell.py:1: check is imported and never used (a re-export)"]
    annotated = 'from colad.rules import check\n\n\ndef run(f: "check") -> None:\n    pass\n'
    root = _tree(tmp_path, COLAD | {"colad/shell.py": annotated})
    assert unused_imports(root, allowed={}) == []


def test_a_test_named_by_history_is_reported(tmp_path: Path) -> None:
    root = _tree(
        tmp_path,
        {
            "tests/unit/test_issue15_config.py": "def test_keys():\n    pass\n",
            "tests/unit/test_config.py": "def test_round3_keys():\n    pass\n\n\n"
            "def test_a_round_trip():\n    pass\n\n\n"
            "def test_after_the_fifth_round():\n    pass\n",
        },
    )
    assert history_names(root) == [
        "tests/unit/test_config.py:1: test_round3_keys is named by history",
        "tests/unit/test_config.py:9: test_after_the_fifth_round is named by history",
        "tests/unit/test_issue15_config.py: the file is named by history, not behaviour",
    ]


def test_an_impure_or_unmarked_test_is_reported(tmp_path: Path) -> None:
    marked = "import pytest\n\npytestmark = pytest.mark.unit\n"
    root = _tree(
        tmp_path,
        {
            "tests/unit/test_pure.py": marked + "\n\ndef test_x():\n    assert 1\n",
            "tests/unit/test_spawns.py": "import subprocess\n\n" + marked,
            "tests/unit/test_waits.py": marked + "import time\n\n\ndef test_x():\n    time.sleep(1)\n",
            "tests/unit/test_unmarked.py": "def test_x():\n    assert 1\n",
            "tests/integration/test_wrong.py": marked,
        },
    )
    assert untrue_markers(root) == [
        "tests/integration/test_wrong.py: not marked integration",
        "tests/unit/test_spawns.py:1: a unit test imports subprocess",
        "tests/unit/test_unmarked.py: not marked unit",
        "tests/unit/test_waits.py:8: a unit test calls time.sleep",
    ]
