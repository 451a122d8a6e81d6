"""House rule: the docs name only what exists, and the two pages a newcomer reads first stay short.

Every Markdown page of the repository (README.md, docs/, packaging/, tests/schemas/; hidden and
virtualenv directories left out) is scanned, prose and code blocks alike, for:
- a repository path (under one of TOP_DIRS) that does not exist; a glob (a path with `*`) must
  match a file, and a test named as `path::name` must be defined in that file;
- a bare module file name (`status_socket.py`) that names no file of the repository;
- a dotted module of colad, bench or tests (`colad.cli.main`, `colad.health.rule.assess`) that names
  no module, or no name defined at the top of it.
A page longer than LINE_LIMITS allows is reported too. A placeholder (`<date>.json`) ends
a path where the placeholder starts; WRITTEN lists the paths a make target creates.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit
ROOT = Path(__file__).resolve().parents[2]

TOP_DIRS = ("colad", "tests", "bench", "conf", "packaging", "systemd", "docs", ".ci", "scripts", "man")
# Paths a doc may name that a clean checkout does not hold, each with what creates it.
WRITTEN = {"bench/results": "`make bench` writes its results there (gitignored)"}
LINE_LIMITS = {"README.md": 250, "docs/PERFORMANCE.md": 300}
SKIPPED_DIRS = re.compile(r"^(?:\.(?!ci$).*|__pycache__|dist|build)$")  # .git, .venv*, .sandbox; not .ci

PATH = re.compile(rf"(?<![\w./-])((?:{'|'.join(re.escape(d) for d in TOP_DIRS)})/[\w./*-]*)(::\w+)?")
BARE_MODULE = re.compile(r"(?<![\w./*-])([A-Za-z_]\w*\.py)\b")
DOTTED = re.compile(r"(?<![\w./-])((?:colad|bench|tests)(?:\.\w+)+)(?![\w-])")
# `colad.toml`, `colad.service`, `colad.8`: file names, not modules.
FILE_SUFFIXES = frozenset(
    {"8", "conf", "deb", "json", "log", "md", "pid", "py", "service", "sock", "toml", "yaml", "yml"}
)


def kept(path: Path, root: Path) -> bool:
    parts = path.relative_to(root).parts[:-1]
    return not any(SKIPPED_DIRS.match(part) for part in parts)


def pages(root: Path) -> list[Path]:
    """Every Markdown page of the repository under `root`."""
    return [p for p in sorted(root.rglob("*.md")) if kept(p, root)]


def defines(path: Path, name: str) -> bool:
    """Whether `path` defines `name` at its top level or as a test function or method."""
    pattern = rf"^\s*(?:async\s+def|def|class)\s+{re.escape(name)}\b|^{re.escape(name)}\s*[:=]"
    return re.search(pattern, path.read_text(encoding="utf-8"), re.M) is not None


def module_file(root: Path, dotted: list[str]) -> Path | None:
    base = root.joinpath(*dotted)
    for candidate in (base.with_suffix(".py"), base / "__init__.py"):
        if candidate.is_file():
            return candidate
    return None


def dotted_problem(root: Path, name: str) -> str | None:
    """Why `name` (`colad.<package>.<module>`, possibly ending in one attribute) names nothing, or None."""
    parts = name.split(".")
    if parts[-1] in FILE_SUFFIXES:
        return None
    if module_file(root, parts) is not None:
        return None
    module = module_file(root, parts[:-1]) if len(parts) > 1 else None
    if module is None or (module.name == "__init__.py" and not defines(module, parts[-1])):
        return f"no such module: {name!r}"
    if not defines(module, parts[-1]):
        return f"{'.'.join(parts[:-1])} defines no {parts[-1]!r}"
    return None


def path_problem(root: Path, named: str, test: str | None) -> str | None:
    """Why the repository path `named` (and the test `test` in it, if given) does not exist, or None."""
    named = named.rstrip(".")
    if named.rstrip("/") in WRITTEN:
        return None
    if "*" in named:
        return None if any(root.glob(named.rstrip("/"))) else f"no file matches: {named!r}"
    path = root / named
    if not path.exists():
        return f"no such path: {named!r}"
    if test is not None and not (path.is_file() and defines(path, test)):
        return f"{named} defines no {test!r}"
    return None


def problems_of(page: Path, root: Path, modules: set[str]) -> Iterator[str]:
    rel = page.relative_to(root).as_posix()
    lines = page.read_text(encoding="utf-8").splitlines()
    if rel in LINE_LIMITS and len(lines) > LINE_LIMITS[rel]:
        yield f"{rel}: {len(lines)} lines, at most {LINE_LIMITS[rel]}"
    for number, line in enumerate(lines, 1):
        where = f"{rel}:{number}"
        for match in PATH.finditer(line):
            test = match.group(2)[2:] if match.group(2) else None
            if found := path_problem(root, match.group(1), test):
                yield f"{where}: {found}"
        for match in BARE_MODULE.finditer(line):
            if match.group(1) not in modules:
                yield f"{where}: no such module file: {match.group(1)!r}"
        for match in DOTTED.finditer(line):
            if found := dotted_problem(root, match.group(1)):
                yield f"{where}: {found}"


def problems(root: Path) -> list[str]:
    """Every dead name and every page over its limit under `root`, as "page:line: what"."""
    modules = {p.name for p in root.rglob("*.py") if kept(p, root)}
    return [found for page in pages(root) for found in problems_of(page, root, modules)]


def test_the_docs_name_only_what_exists_and_stay_within_their_length() -> None:
    assert problems(ROOT) == []


def test_the_scan_reads_every_page_a_reader_is_sent_to() -> None:
    read = {p.relative_to(ROOT).as_posix() for p in pages(ROOT)}
    docs = {f"docs/{p.name}" for p in (ROOT / "docs").glob("*.md")}
    assert "docs/DEVELOPING.md" in docs
    assert {"README.md", "packaging/kubernetes/README.md", *docs} <= read


# --- seeded violations ----------------------------------------------------------------------------

TREE = {
    "colad/__init__.py": "",
    "colad/plugin/__init__.py": "",
    "colad/plugin/main.py": "def main(args=None, cfg=None):\n    return 0\n\n\nLIMIT = 3\n",
    "tests/unit/test_rules.py": "def test_a_rule():\n    pass\n",
    "docs/OTHER.md": "",
}


def seeded(tmp_path: Path, text: str, page: str = "docs/PAGE.md") -> list[str]:
    for name, content in (TREE | {page: text}).items():
        path = tmp_path / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(content, encoding="utf-8")
    return problems(tmp_path)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("The plugin is `colad/plugin.py`.\n", "docs/PAGE.md:1: no such path: 'colad/plugin.py'"),
        ("See tests/unit/test_gone.py.\n", "docs/PAGE.md:1: no such path: 'tests/unit/test_gone.py'"),
        ("All in `colad/api/*_pb2.py`.\n", "docs/PAGE.md:1: no file matches: 'colad/api/*_pb2.py'"),
        (
            "`tests/unit/test_rules.py::test_gone` checks it.\n",
            "docs/PAGE.md:1: tests/unit/test_rules.py defines no 'test_gone'",
        ),
        ("The rule is in `plugin_health.py`.\n", "docs/PAGE.md:1: no such module file: 'plugin_health.py'"),
        ("```sh\npython -c 'import colad.cli_args'\n```\n", "docs/PAGE.md:2: no such module: 'colad.cli_args'"),
        ("`colad.plugin.main.LIMITS` caps it.\n", "docs/PAGE.md:1: colad.plugin.main defines no 'LIMITS'"),
    ],
    ids=[
        "old-module-path",
        "dead-test-path",
        "empty-glob",
        "dead-test-name",
        "dead-bare-module",
        "dead-dotted-module",
        "dead-dotted-name",
    ],
)
def test_a_dead_name_is_reported(tmp_path: Path, text: str, expected: str) -> None:
    assert seeded(tmp_path, text) == [expected]


def test_a_dead_path_in_a_packaging_page_is_reported(tmp_path: Path) -> None:
    found = seeded(tmp_path, "Apply `packaging/kubernetes/gone.yaml`.\n", "packaging/kubernetes/README.md")
    assert found == ["packaging/kubernetes/README.md:1: no such path: 'packaging/kubernetes/gone.yaml'"]


@pytest.mark.parametrize(("page", "limit"), sorted(LINE_LIMITS.items()))
def test_a_page_over_its_limit_is_reported_and_one_at_it_passes(tmp_path: Path, page: str, limit: int) -> None:
    assert seeded(tmp_path, "a line\n" * limit, page) == []
    assert seeded(tmp_path, "a line\n" * (limit + 1), page) == [f"{page}: {limit + 1} lines, at most {limit}"]


def test_existing_names_placeholders_and_file_names_pass(tmp_path: Path) -> None:
    text = (
        "`colad <role>` runs `colad/plugin/main.py` `main()` (`colad.plugin.main.main`, `colad.plugin`).\n"
        "`tests/unit/test_rules.py::test_a_rule`, `tests/unit/*.py`, main.py, [other](docs/OTHER.md), docs/.\n"
        "`make bench` writes bench/results/<date>.json; `colad.toml`, `colad.service` and `colad.8` are files.\n"
        "/etc/colad/colad.toml and /var/lib/kubelet/device-plugins/ are the host's; so is colad-<ms>.sock.\n"
    )
    assert seeded(tmp_path, text) == []
