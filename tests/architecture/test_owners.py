"""One owner per name and per rule: no module-level name is defined in two colad modules, and each
rule string (a character set, a metadata key, the CDI name format) is written in one module.

A rule written twice drifts: the second copy is the one nobody updates. The scan reads every
module's source (lazy and TYPE_CHECKING imports included, since it never imports them).
"""

from __future__ import annotations

import ast
import functools
from collections.abc import Callable, Mapping
from pathlib import Path

from tests.architecture.graph import write_tree

COLAD = Path(__file__).resolve().parents[2] / "colad"

# Names every module may define for itself, and why.
ALLOWED = {
    "LOG": "each module's own logger, log.get(__name__): log lines name the module that wrote them",
    "main": "the entry point of each command module: cli.COMMANDS runs <module>.main",
    "TYPE_CHECKING": "a module-local False that keeps typing unimported at run time (it costs each process memory)",
}
# Names defined in more than one module that still mean one thing: each entry says why. A name
# leaves this table when it has one owner (test_every_shared_word_is_still_shared keeps it honest).
SHARED_WORDS = {
    "diff": "what changed from `old` to `new`: of two device sets (devices), of two in-use views (inuse)",
    "plan": "what to do, decided before any of it is done: the prepare commands of a PreStartContainer (prestart), "
    "the resource changes of a reload (reload_plan)",
    # The pure rule and its shell: pathtrust.<name>(path) stats the path and applies trust.<name> to what it found.
    "directory_problem": "trust's rule over stat results, pathtrust's shell that stats the path",
    "host_path_problem": "trust's rule over stat results, pathtrust's shell that stats the path",
    "program_problem": "trust's rule over stat results, pathtrust's shell that stats the path",
}


def definitions(source: str) -> set[str]:
    """The module-level names `source` defines: functions, classes and assigned names, not imports.

    A private function or class is the module's own helper and is left out; a private constant is
    still a rule (a pattern, a limit) and counts. Dunder names are Python's module protocol.
    """
    found: set[str] = set()
    for node in ast.parse(source).body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            if not node.name.startswith("_"):
                found.add(node.name)
        elif isinstance(node, ast.Assign):
            found |= {t.id for t in node.targets if isinstance(t, ast.Name)}
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            found.add(node.target.id)
    return {n for n in found if not (n.startswith("__") and n.endswith("__"))}


def sources(root: Path) -> dict[str, str]:
    """Module name -> source of every module under `root`, generated protobuf code left out."""
    return {
        ".".join(path.relative_to(root.parent).with_suffix("").parts): path.read_text()
        for path in sorted(root.rglob("*.py"))
        if "_pb2" not in path.name
    }


def shared_names(modules: Mapping[str, str]) -> dict[str, set[str]]:
    """Every name defined in more than one of `modules`, with the modules defining it."""
    owners: dict[str, set[str]] = {}
    for module, source in modules.items():
        for name in definitions(source):
            owners.setdefault(name, set()).add(module)
    return {name: where for name, where in owners.items() if len(where) > 1}


def _strings(tree: ast.AST) -> set[str]:
    return {n.value for n in ast.walk(tree) if isinstance(n, ast.Constant) and isinstance(n.value, str)}


def _splits_cdi_name(tree: ast.AST) -> bool:
    """A string split at '=' into a kind (or resource) and a device: the CDI name format read back."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Call):
            call = node.value
            at_equals = [a for a in call.args if isinstance(a, ast.Constant) and a.value == "="]
            if isinstance(call.func, ast.Attribute) and call.func.attr in ("partition", "split") and at_equals:
                parts = " ".join(ast.unparse(t) for t in node.targets)
                if any(word in parts for word in ("kind", "resource", "qualifier")) and "device" in parts:
                    return True
    return False


def _builds_cdi_name(tree: ast.AST) -> bool:
    """An f-string "{kind or resource}={device}": the CDI name format written."""
    for node in ast.walk(tree):
        if isinstance(node, ast.JoinedStr) and len(node.values) == 3:
            left, middle, right = node.values
            if isinstance(middle, ast.Constant) and middle.value == "=":
                left_text, right_text = ast.unparse(left), ast.unparse(right)
                if any(w in left_text for w in ("kind", "resource", "qualifier")) and "device" in right_text:
                    return True
    return False


# Each rule and how to recognise a module that writes it.
RULES: dict[str, Callable[[ast.AST], bool]] = {
    "the characters gRPC reads specially in unix:<path>": lambda tree: "%?#," in _strings(tree),
    "the metadata key of `colad check`'s calls": lambda tree: "x-colad-check" in _strings(tree),
    "the CDI device name format <kind>=<device>": lambda tree: _splits_cdi_name(tree) or _builds_cdi_name(tree),
}


def rule_writers(modules: Mapping[str, str]) -> dict[str, set[str]]:
    """Rule -> the modules that write it."""
    trees = {module: ast.parse(source) for module, source in modules.items()}
    return {rule: {m for m, tree in trees.items() if matches(tree)} for rule, matches in RULES.items()}


# --- the real tree ---------------------------------------------------------------------------------


@functools.cache
def _colad() -> dict[str, str]:
    return sources(COLAD)


def test_no_name_is_defined_in_two_modules() -> None:
    shared = shared_names(_colad())
    unexplained = {n: sorted(where) for n, where in shared.items() if n not in ALLOWED and n not in SHARED_WORDS}
    assert unexplained == {}, "give each rule one module, or each meaning its own name"


def test_every_shared_word_is_still_shared() -> None:
    shared = shared_names(_colad())
    assert sorted(n for n in SHARED_WORDS if n not in shared) == [], "one owner now: drop it from SHARED_WORDS"


def test_each_rule_is_written_in_one_module() -> None:
    assert {rule: len(where) for rule, where in rule_writers(_colad()).items()} == dict.fromkeys(RULES, 1)


# --- the checks catch what they are for ------------------------------------------------------------


def _tree(tmp_path: Path, files: Mapping[str, str]) -> Path:
    return write_tree(tmp_path / "colad", files)


def test_a_constant_defined_in_two_modules_is_reported(tmp_path: Path) -> None:
    root = _tree(
        tmp_path,
        {
            "allocation.py": 'CDI_MODES = ("both", "only", "off")\nLOG = None\n',
            "config_checks.py": 'CDI_MODES = ("both", "only", "off")\nLOG = None\n',
            "names.py": "def show(value): return repr(value)\nclass Role: pass\n_PATTERN = 1\n",
            "messages.py": "def show(value): return repr(value)[:60]\nclass Role: pass\n_PATTERN = 2\n",
            "devices.py": "def _helper(): pass\n",
            "probes.py": "def _helper(): pass\nfrom colad.names import show\n",
        },
    )
    shared = shared_names(sources(root))
    assert shared == {
        "CDI_MODES": {"colad.allocation", "colad.config_checks"},
        "LOG": {"colad.allocation", "colad.config_checks"},
        "show": {"colad.names", "colad.messages"},
        "Role": {"colad.names", "colad.messages"},
        "_PATTERN": {"colad.names", "colad.messages"},
    }  # a private helper is the module's own; an import defines nothing


def test_a_rule_string_written_in_two_modules_is_reported(tmp_path: Path) -> None:
    root = _tree(
        tmp_path,
        {
            "cli_args.py": '_GRPC_UNSAFE = "%?#,"\n',
            "config_checks.py": 'UNSAFE = "%?#,"\n',
            "check.py": 'CHECK_METADATA = (("x-colad-check", "1"),)\n',
            "service.py": 'KEY = "x-colad-check"\n',
            "namemap.py": 'def cdi_device_name(resource_name, device_id):\n    return f"{resource_name}={device_id}"\n',
            "device_health.py": 'def split(key):\n    resource, _, device_id = key.partition("=")\n',
            "nfd.py": 'def parse(line):\n    key, sep, value = line.partition("=")\n    env = f"{key}={value}"\n',
        },
    )
    assert rule_writers(sources(root)) == {
        "the characters gRPC reads specially in unix:<path>": {"colad.cli_args", "colad.config_checks"},
        "the metadata key of `colad check`'s calls": {"colad.check", "colad.service"},
        "the CDI device name format <kind>=<device>": {"colad.namemap", "colad.device_health"},
    }
