"""House rule: comments and docstrings state contracts, and the paths they name exist.

The scan reads every comment (tokenize) and every module, class and function docstring (ast) under
colad/, tests/ and bench/, and reports:
- history narration (HISTORY below): a change's number, its rounds, stops or the session that led
  to it, told instead of the contract the code keeps now;
- a profiler session (PROFILER_SESSION) named under a top-level directory whose code runs no such
  profiler: bench/ drives one, colad/ and tests/ do not;
- a repository path (REPO_PATH, or a bare module file name) that does not exist, and a path outside
  the repository (OUTSIDE: a home directory, the machine's work area);
- a dotted name of colad, bench or tests (`colad.queue.client.QueueClient`) that names no module, or no
  name at the top of one (test_docs.dotted_problem, the rule the docs follow too); a file in which
  `colad` is a variable (the e2e fixture) is read as code, not as module names;
- a `fmt: skip` or `fmt: off` comment beyond ALLOWED_FMT_SKIPS: ruff format lays the code out.
An upstream reference keeps its repository (`kubernetes/kubernetes#125579`), so it is no number of ours.
"""

from __future__ import annotations

import ast
import io
import re
import tokenize
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.architecture.test_docs import DOTTED, dotted_problem

pytestmark = pytest.mark.unit
ROOT = Path(__file__).resolve().parents[2]
SCANNED = ("colad", "tests", "bench")
GENERATED = re.compile(r"_pb2(_grpc)?\.pyi?$")

ORDINAL = r"(?:first|second|third|fourth|fifth|sixth|seventh|eighth|ninth|tenth|\d+(?:st|nd|rd|th))"
HISTORY = {
    "issue number": re.compile(r"(?<![\w/.-])#\d+\b|\b(?:issue|PR) \d+\b", re.I),
    "finding": re.compile(r"\bfindings?\b", re.I),
    "round or stop": re.compile(rf"\b{ORDINAL} (?:round|stop)s?\b|\b(?:round|stop) \d+\b", re.I),
    "hunt": re.compile(r"\bhunt(?:s|ed|ing)?\b", re.I),
    "narration": re.compile(r"(?<!\bis )(?<!\bare )(?<!\bbe )(?<!\bbeen )\bused to\b|\bbefore this change\b", re.I),
}
PROFILERS = {"py-spy": "py-spy", "cProfile": "cprofile", "strace": "strace", "perf": "perf"}
PROFILER_SESSION = re.compile(r"\b(py-spy|cProfile|strace|perf)\b(?!-)")
TOP_FILES = ("Makefile", "README.md", "pyproject.toml", "setup.cfg")
TOP_DIRS = ("colad", "tests", "bench", "docs", "conf", "packaging", "systemd", "scripts", "man", ".ci")
REPO_PATH = re.compile(
    rf"(?<![\w./-])((?:{'|'.join(re.escape(d) for d in TOP_DIRS)})/[\w./-]*\w"
    rf"|(?:{'|'.join(re.escape(f) for f in TOP_FILES)})\b)"
)
BARE_MODULE = re.compile(r"(?<![\w./-])([a-z_]\w*\.py)\b")
OUTSIDE = re.compile(r"(?<![\w.])(?:/work/|/home/|/root/|/Users/|/mnt/|~/)\S*")
FMT_SKIP = re.compile(r"\bfmt:\s*(?:skip|off)\b")
# Paths a comment may name before the file exists: the section the TYPE_CHECKING comments point at.
# (path, count): places whose layout carries meaning that ruff format would lose. None today.
ALLOWED_FMT_SKIPS: dict[str, int] = {}


DEFINITIONS = (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)


def statements(nodes: list[ast.stmt]) -> Iterator[ast.stmt]:
    """Every statement of `nodes` and of the blocks nested in them (expressions are not entered)."""
    for node in nodes:
        yield node
        for block in ("body", "orelse", "finalbody", "handlers", "cases"):
            for inner in getattr(node, block, None) or ():
                yield from statements(inner.body if isinstance(inner, ast.excepthandler | ast.match_case) else [inner])


def read(source: str) -> tuple[list[tuple[int, str, str]], str]:
    """(line, "comment" or "docstring", text) for every comment and docstring of `source`, and what
    the code itself says: its other string literals and the names it imports, lower-cased."""
    tree = ast.parse(source)
    found: list[tuple[int, str, str]] = []
    said: list[str] = []
    for node in [tree, *statements(tree.body)]:
        if isinstance(node, DEFINITIONS) and node.body and isinstance(node.body[0], ast.Expr):
            value = node.body[0].value
            if isinstance(value, ast.Constant) and isinstance(value.value, str):
                found.append((value.lineno, "docstring", value.value))
        elif isinstance(node, ast.Import | ast.ImportFrom):
            said.extend([alias.name for alias in node.names] + [getattr(node, "module", None) or ""])
    docstring_lines = {line for line, _, _ in found}
    for token in tokenize.generate_tokens(io.StringIO(source).readline):
        if token.type == tokenize.COMMENT:
            found.append((token.start[0], "comment", token.string))
        elif token.type == tokenize.STRING and token.start[0] not in docstring_lines:
            said.append(token.string)
    return found, "\n".join(said).lower()


def binds(tree: ast.Module, name: str) -> bool:
    """Whether `name` is a parameter or an assigned variable somewhere in `tree`."""
    for node in ast.walk(tree):
        if isinstance(node, ast.arg) and node.arg == name:
            return True
        if isinstance(node, ast.Name) and node.id == name and isinstance(node.ctx, ast.Store):
            return True
    return False


def python_files(root: Path) -> Iterator[Path]:
    for top in SCANNED:
        for path in sorted((root / top).rglob("*.py")):
            if not GENERATED.search(path.name) and ".venv" not in path.parts:
                yield path


def module_names(root: Path) -> set[str]:
    return {p.name for top in TOP_DIRS for p in (root / top).rglob("*.py")}


def problems(root: Path) -> list[str]:
    """Every violation of the rule under `root`, as "path:line: what: text"."""
    found = []
    modules = module_names(root)
    skips: dict[str, int] = {}
    sources = {path: path.read_text(encoding="utf-8") for path in python_files(root)}
    read_files = {path: read(source) for path, source in sources.items()}
    variable = {path for path, source in sources.items() if binds(ast.parse(source), "colad")}
    runs: dict[str, str] = {}
    for path, (_, said) in read_files.items():
        top = path.relative_to(root).parts[0]
        runs[top] = runs.get(top, "") + said
    for path, (texts, _) in read_files.items():
        rel = path.relative_to(root).as_posix()
        for line, kind, text in texts:
            where = f"{rel}:{line}"
            for what, pattern in HISTORY.items():
                if match := pattern.search(text):
                    found.append(f"{where}: {what} in a {kind}: {match.group(0)!r}")
            for match in PROFILER_SESSION.finditer(text):
                if PROFILERS[match.group(1)] not in runs[path.relative_to(root).parts[0]]:
                    found.append(f"{where}: profiler session in a {kind}: {match.group(0)!r}")
            for match in OUTSIDE.finditer(text):
                found.append(f"{where}: path outside the repository: {match.group(0)!r}")
            for match in REPO_PATH.finditer(text):
                named = match.group(1).rstrip(".")
                if not (root / named).exists():
                    found.append(f"{where}: no such path: {named!r}")
            for match in BARE_MODULE.finditer(text):
                if match.group(1) not in modules:
                    found.append(f"{where}: no such module: {match.group(1)!r}")
            for match in DOTTED.finditer(text):
                if path in variable and match.group(1).startswith("colad."):
                    continue
                if problem := dotted_problem(root, match.group(1)):
                    found.append(f"{where}: {problem}")
            if kind == "comment" and FMT_SKIP.search(text):
                skips[rel] = skips.get(rel, 0) + 1
    for rel, count in sorted(skips.items()):
        if count > ALLOWED_FMT_SKIPS.get(rel, 0):
            found.append(f"{rel}: {count} fmt: skip/off markers, {ALLOWED_FMT_SKIPS.get(rel, 0)} allowed")
    return found


def test_the_tree_has_no_history_narration_no_dead_paths_and_no_unlisted_fmt_skips() -> None:
    assert problems(ROOT) == []


def seeded(tmp_path: Path, source: str, name: str = "colad/seed.py") -> list[str]:
    for top in SCANNED:
        (tmp_path / top).mkdir(exist_ok=True)
    (tmp_path / name).write_text(source, encoding="utf-8")
    return problems(tmp_path)


@pytest.mark.parametrize(
    ("source", "what"),
    [
        ("x = 1  # sized for 10,000 devices (#14)\n", "issue number"),
        ('"""The config keys of issue 15."""\n', "issue number"),
        ("# --- finding 2: bad paths ---\nx = 1\n", "finding"),
        ('def f() -> None:\n    """Fixed after the eighth round."""\n', "round or stop"),
        ("# the ninth stop moved this\nx = 1\n", "round or stop"),
        ("# found in the leak hunt\nx = 1\n", "hunt"),
        ('class C:\n    """A name used to kill discovery."""\n', "narration"),
        ("# slower before this change\nx = 1\n", "narration"),
        ("x = 1  # one pass (cProfile: 4 % as lists)\n", "profiler session"),
        ("x = 1  # (strace -c and perf of the plugin)\n", "profiler session"),
        ("# see /work/notes/plan.md\nx = 1\n", "path outside the repository"),
        ('"""Copied from /home/me/colad."""\n', "path outside the repository"),
        ("# tests/unit/test_gone.py measures it\nx = 1\n", "no such path"),
        ("# as in docs/NOWHERE.md\nx = 1\n", "no such path"),
        ("# the rule of nowhere.py\nx = 1\n", "no such module"),
        ('"""Sent by colad.seed.gone, once."""\n', "defines no 'gone'"),
        ("# see colad.moved.seed\nx = 1\n", "no such module: 'colad.moved.seed'"),
        ("x = [\n    1, 2,\n]  # fmt: skip\n", "fmt: skip/off markers"),
        ("# fmt: off\nx = [\n    1, 2,\n]\n# fmt: on\n", "fmt: skip/off markers"),
    ],
    ids=[
        "hash-number",
        "issue-number-in-a-docstring",
        "finding",
        "ordinal-round",
        "ordinal-stop",
        "hunt",
        "used-to",
        "before-this-change",
        "cprofile-session",
        "strace-session",
        "work-path",
        "home-path",
        "dead-test-path",
        "dead-doc-path",
        "dead-bare-module",
        "dotted-name-missing",
        "dotted-module-missing",
        "fmt-skip",
        "fmt-off",
    ],
)
def test_a_seeded_violation_is_reported(tmp_path: Path, source: str, what: str) -> None:
    found = seeded(tmp_path, source)
    assert any(what in problem for problem in found), found


@pytest.mark.parametrize(
    "source",
    [
        "x = 1  # a full snapshot on every (re)connect round trip\n",
        "# upstream: kubernetes/kubernetes#125579 (superseded streams)\nx = 1\n",
        "# the lock is used to guard the table\nx = 1\n",
        '"""Interleaved round by round; stop() ends them."""\n',
        "# /var/lib/kubelet/device-plugins and /etc/colad/supervisord.conf are the host's\nx = 1\n",
        "# colad/seed.py and tests/ and Makefile exist; so does seed.py\nx = 1\n",
        'import subprocess\nsubprocess.run(["py-spy", "dump"])  # py-spy names the threads\n',
        '"""x is colad.seed.x; colad.seed is this module."""\nx = 1\n',
        "def f(colad):\n    return colad.kill()  # colad.kill: the fixture, not a module\n",
    ],
    ids=[
        "round-trip",
        "upstream-reference",
        "passive-used-to",
        "rounds-of-a-bench",
        "host-paths",
        "existing-paths",
        "a-profiler-the-code-runs",
        "an-existing-dotted-name",
        "colad-as-a-variable",
    ],
)
def test_contracts_and_existing_paths_pass(tmp_path: Path, source: str) -> None:
    (tmp_path / "Makefile").write_text("")
    assert seeded(tmp_path, source) == []


def test_an_allowed_fmt_skip_passes_and_one_more_fails(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(ALLOWED_FMT_SKIPS, "colad/seed.py", 1)
    assert seeded(tmp_path, "x = [\n    1, 2,\n]  # fmt: skip\n") == []
    found = seeded(tmp_path, "x = [1]  # fmt: skip\ny = [2]  # fmt: skip\n")
    assert found == ["colad/seed.py: 2 fmt: skip/off markers, 1 allowed"]
