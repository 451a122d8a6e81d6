"""The import graph of a package, read from source with ``ast``.

Every ``import`` and ``from ... import`` statement counts, wherever it sits:
module level, inside a function, under ``if TYPE_CHECKING:`` or in a ``try``.
A lazy import still ties two modules together; only where the cost is paid
differs.

``from pkg import name`` is an edge to ``pkg.name`` when ``pkg/name.py`` (or a
``pkg/name/`` package) exists, and an edge to ``pkg`` otherwise.  Relative
imports are resolved against the importing module.  ``importlib.import_module``
with a literal name counts too; one with a computed name (colad/cli/main.py's ROLES
table) is not seen.
"""

from __future__ import annotations

import ast
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path


@dataclass(frozen=True)
class Import:
    """One imported module name and the line of the statement that imports it."""

    target: str
    line: int


@dataclass
class Graph:
    """Modules of one package (dotted names) and what each imports."""

    imports: dict[str, list[Import]] = field(default_factory=dict)

    def internal(self, module: str) -> set[str]:
        """Modules of this package that ``module`` imports."""
        return {i.target for i in self.imports[module] if i.target in self.imports}

    def line_of(self, module: str, target: str) -> int:
        return min(i.line for i in self.imports[module] if i.target == target)

    def edges(self) -> dict[str, set[str]]:
        return {m: self.internal(m) for m in self.imports}


def module_name(path: Path, base: Path) -> str:
    parts = list(path.relative_to(base).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _resolve(module: str, is_package: bool, node: ast.ImportFrom) -> str:
    if not node.level:
        return node.module or ""
    parts = module.split(".")
    if not is_package:
        parts.pop()
    if node.level > 1:
        parts = parts[: len(parts) - (node.level - 1)]
    if node.module:
        parts.append(node.module)
    return ".".join(parts)


def imports_of(source: str, module: str, is_package: bool, known: set[str]) -> list[Import]:
    """Every module ``source`` imports; ``known`` names the modules that exist."""
    found: list[Import] = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found.extend(Import(alias.name, node.lineno) for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = _resolve(module, is_package, node)
            for alias in node.names:
                sub = f"{base}.{alias.name}"
                found.append(Import(sub if sub in known else base, node.lineno))
        elif (
            isinstance(node, ast.Call)
            and ast.unparse(node.func).endswith("import_module")
            and node.args
            and isinstance(node.args[0], ast.Constant)
            and isinstance(node.args[0].value, str)
        ):
            found.append(Import(node.args[0].value, node.lineno))
    return found


def scan(package_dir: Path) -> Graph:
    """The import graph of the package at ``package_dir``, every module and sub-package in it."""
    base = package_dir.parent
    files = {module_name(p, base): p for p in sorted(package_dir.rglob("*.py"))}
    known = set(files)
    graph = Graph()
    for name, path in files.items():
        graph.imports[name] = imports_of(path.read_text(encoding="utf-8"), name, path.name == "__init__.py", known)
    return graph


def imports_outside(graph: Graph, modules: Iterable[str], allowed: Iterable[str]) -> list[str]:
    """Every import of one of ``modules`` that is neither one of ``modules`` nor in ``allowed``
    (top-level names of outside modules), as "module:line imports target"."""
    inside, ok = set(modules), set(allowed)
    found: dict[str, None] = {}  # in order, once: "from x import a, b" is one import of x
    for module in sorted(inside):
        for imp in graph.imports[module]:
            if imp.target in inside:
                continue
            if imp.target in graph.imports or imp.target.split(".")[0] not in ok:
                found[f"{module}:{imp.line} imports {imp.target}"] = None
    return list(found)


def find_cycle(edges: dict[str, set[str]]) -> list[str] | None:
    """One import cycle as a path ``[a, b, ..., a]``, or None if the graph has none."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for nxt in sorted(edges.get(node, ())):
            if state.get(nxt) == 1:
                return path[path.index(nxt) :] + [nxt]
            if nxt not in state:
                found = visit(nxt)
                if found:
                    return found
        path.pop()
        state[node] = 2
        return None

    for start in sorted(edges):
        if start not in state:
            found = visit(start)
            if found:
                return found
    return None


def strongly_connected(edges: dict[str, set[str]]) -> list[set[str]]:
    """Groups of two or more modules that import each other, directly or not (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    groups: list[set[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in edges.get(node, ()):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            group: set[str] = set()
            while True:
                top = stack.pop()
                on_stack.discard(top)
                group.add(top)
                if top == node:
                    break
            if len(group) > 1:
                groups.append(group)

    for node in sorted(edges):
        if node not in index:
            visit(node)
    return groups


def write_tree(root: Path, files: Mapping[str, str]) -> Path:
    """Write `files` (path relative to `root` -> text) under `root`, for a seeded-violation test; `root`."""
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return root
