"""The unit and integration tests mirror colad/, checked on the real tree and on seeded violations.

- No test file sits directly in tests/unit or tests/integration: each is in the folder of what it tests.
- Every folder there names a colad package (tests/<layer>/<package>/ for colad/<package>/), or is one
  of OTHER_FOLDERS, each with its reason; one level only, and each folder is a package (`__init__.py`).
- In a package's folder, test_<module>.py holds the tests of colad/<package>/<module>.py; any other
  name is a behaviour's. A file named after a module of another package only (test_cdi.py under core/)
  is misplaced: its tests belong in that package's folder.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.architecture.graph import write_tree

pytestmark = pytest.mark.unit
ROOT = Path(__file__).resolve().parents[2]
LAYERS = ("unit", "integration")

# Folders that name no colad package, each for what it holds instead.
OTHER_FOLDERS = {
    "packaging": "what ships beside the code: manifests, dashboard, alert rules, sample config, systemd unit",
    "footprint": "what each role imports on its way to work: a property of all roles, measured per role",
    "fakes": "the fakes' own tests (kubelet, plugin watcher, API server): test doubles, not colad",
    "fuzz": "the fuzzers' kept regressions, replayed: the targets span the queue, device files and gRPC",
    "bench": "the benchmark suite's own pure parts (its budgets and verdicts): bench/ is not colad",
}


def _modules_by_package(root: Path) -> dict[str, set[str]]:
    colad = root / "colad"
    return {
        package.name: {m.stem for m in package.glob("*.py") if m.stem != "__init__"}
        for package in sorted(colad.iterdir())
        if (package / "__init__.py").is_file()
    }


def layout_problems(root: Path, other: dict[str, str] = OTHER_FOLDERS) -> list[str]:
    """One line per test file or folder under tests/unit and tests/integration that does not mirror colad/."""
    modules = _modules_by_package(root)
    found = []
    for layer in LAYERS:
        base = root / "tests" / layer
        for path in sorted(base.rglob("*")):
            rel = path.relative_to(root)
            if "__pycache__" in path.parts:
                continue
            depth = len(path.relative_to(base).parts)
            if path.is_dir():
                if depth > 1:
                    found.append(f"{rel}: a folder inside a package's folder (tests mirror one level)")
                    continue
                if path.name not in modules and path.name not in other:
                    found.append(f"{rel}: names no colad package")
                if not (path / "__init__.py").is_file():
                    found.append(f"{rel}: no __init__.py")
            elif path.name.startswith("test_") and path.suffix == ".py":
                if depth == 1:
                    found.append(f"{rel}: directly in tests/{layer}; it belongs in its package's folder")
                if depth != 2:
                    continue  # a nested folder is reported once, above
                folder, name = path.parent.name, path.stem.removeprefix("test_")
                owners = sorted(p for p, names in modules.items() if name in names)
                if owners and folder not in owners:
                    homes = " or ".join(f"tests/{layer}/{p}/" for p in owners)
                    found.append(f"{rel}: named after colad/{owners[0]}/{name}.py; it belongs in {homes}")
    return found


# --- the real tree --------------------------------------------------------------------------------


def test_unit_and_integration_tests_mirror_the_colad_packages() -> None:
    assert layout_problems(ROOT) == []


def test_every_other_folder_is_still_used() -> None:
    used = {p.name for layer in LAYERS for p in (ROOT / "tests" / layer).iterdir() if p.is_dir()}
    assert set(OTHER_FOLDERS) <= used, set(OTHER_FOLDERS) - used


# --- seeded violations ----------------------------------------------------------------------------


def test_a_test_out_of_its_package_folder_is_reported(tmp_path: Path) -> None:
    root = write_tree(
        tmp_path,
        {
            "colad/__init__.py": "",
            "colad/core/__init__.py": "",
            "colad/core/devices.py": "",
            "colad/outputs/__init__.py": "",
            "colad/outputs/cdi.py": "",
            "colad/discovery/__init__.py": "",
            "colad/discovery/main.py": "",
            "colad/plugin/__init__.py": "",
            "colad/plugin/main.py": "",
            "tests/unit/__init__.py": "",
            "tests/unit/test_flat.py": "",
            "tests/unit/conftest.py": "",
            "tests/unit/core/__init__.py": "",
            "tests/unit/core/test_devices.py": "",  # the module's tests
            "tests/unit/core/test_burst.py": "",  # a behaviour
            "tests/unit/core/test_cdi.py": "",  # colad/outputs/cdi.py's name, in core/
            "tests/unit/core/helpers.py": "",
            "tests/unit/gadgets/__init__.py": "",
            "tests/unit/gadgets/test_gadget.py": "",
            "tests/unit/packaging/__init__.py": "",
            "tests/unit/packaging/test_grafana.py": "",
            "tests/integration/__init__.py": "",
            "tests/integration/support.py": "",
            "tests/integration/outputs/test_cdi.py": "",  # no __init__.py
            "tests/integration/outputs/deep/__init__.py": "",
            "tests/integration/outputs/deep/test_cdi.py": "",
            "tests/integration/discovery/__init__.py": "",
            "tests/integration/discovery/test_main.py": "",
            "tests/integration/packaging/__init__.py": "",
            "tests/integration/packaging/test_main.py": "",  # a module name of two packages, in neither
        },
    )
    assert layout_problems(root, other={"packaging": "a reason"}) == [
        "tests/unit/core/test_cdi.py: named after colad/outputs/cdi.py; it belongs in tests/unit/outputs/",
        "tests/unit/gadgets: names no colad package",
        "tests/unit/test_flat.py: directly in tests/unit; it belongs in its package's folder",
        "tests/integration/outputs: no __init__.py",
        "tests/integration/outputs/deep: a folder inside a package's folder (tests mirror one level)",
        "tests/integration/packaging/test_main.py: named after colad/discovery/main.py;"
        " it belongs in tests/integration/discovery/ or tests/integration/plugin/",
    ]
    assert layout_problems(root, other={}) == [
        "tests/unit/core/test_cdi.py: named after colad/outputs/cdi.py; it belongs in tests/unit/outputs/",
        "tests/unit/gadgets: names no colad package",
        "tests/unit/packaging: names no colad package",
        "tests/unit/test_flat.py: directly in tests/unit; it belongs in its package's folder",
        "tests/integration/outputs: no __init__.py",
        "tests/integration/outputs/deep: a folder inside a package's folder (tests mirror one level)",
        "tests/integration/packaging: names no colad package",
        "tests/integration/packaging/test_main.py: named after colad/discovery/main.py;"
        " it belongs in tests/integration/discovery/ or tests/integration/plugin/",
    ]
