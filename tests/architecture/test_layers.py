"""The package layers of colad, read from source (graph.py): every import counts, lazy ones too.

A package imports only packages of lower layers (and itself); packages of one layer never import
each other, so no process package loads another's code. The top-level `colad` (its version) and
the generated `colad.api` stubs are below everything.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.architecture.graph import scan, write_tree

pytestmark = pytest.mark.unit
COLAD = Path(__file__).resolve().parents[2] / "colad"

# Lowest first. Each row: the packages of one layer.
LAYERS: tuple[tuple[str, ...], ...] = (
    ("api",),  # generated gRPC stubs
    ("core",),  # pure: the device model and its rules
    ("runtime",),  # a process's own I/O: logging, atomic files, paths, the kubelet directory
    ("outputs",),  # files colad writes for others: CDI specs, NFD features, the state file, socket records
    ("config",),  # the typed configuration, loaded once
    ("queue",),  # the local queue's protocol, client and server
    ("kube",),  # the API server: kubeconfig and service-account access, the REST client
    ("watchers",),  # inotify and the loop discovery and kubelet-watch share
    ("jobs",),  # external commands: probes and prepare commands, and their processes
    ("metrics",),  # the metrics registry, its collectors and the HTTP endpoint
    ("health",),  # the health rule and supervisord's view of the roles
    ("deviceplugin",),  # the device plugin v1beta1 API: servicer, ListAndWatch, RPC boundary
    ("dra",),  # the DRA kubelet API: registration with the plugin watcher (through deviceplugin's RPC boundary)
    ("discovery", "plugin", "kubelet_watch", "supervise"),  # one package per process
    ("cli",),  # the `colad` command and the operator tools
)
# Modules directly in colad/ and what they may import.
TOP_LEVEL = {
    "colad": (),
    "colad.__main__": ("core", "cli"),  # `python -m colad`: the roles table, then the CLI
    "colad.watchdog": ("supervise",),  # the watchdog's entry point an installed supervisord.conf names
}


def package_of(module: str, packages: set[str]) -> str | None:
    """The sub-package of colad that `module` belongs to; None for a module directly in colad/."""
    parts = module.split(".")
    return parts[1] if len(parts) > 2 or (len(parts) == 2 and parts[1] in packages) else None


def violations(root: Path, layers: tuple[tuple[str, ...], ...], top: dict[str, tuple[str, ...]]) -> list[str]:
    """Every import of the package at `root` that the layer table and `top` do not allow."""
    graph = scan(root)
    rank = {package: i for i, row in enumerate(layers) for package in row}
    packages = {p.name for p in root.iterdir() if (p / "__init__.py").exists()}
    found = []
    for module, targets in sorted(graph.edges().items()):
        source = package_of(module, packages)
        for target in sorted(targets):
            into = package_of(target, packages)
            if target == "colad" or (into is not None and into == source):
                continue
            if source is None:
                if module not in top:
                    found.append(f"{module}: a module directly in colad/ that no table allows")
                elif into not in top[module]:
                    found.append(f"{module} imports {target}")
            elif into is None or source not in rank or into not in rank:
                found.append(f"{module} imports {target}: a package the layer table does not name")
            elif rank[into] >= rank[source]:
                found.append(f"{module} imports {target}: {into} is not below {source}")
    return found


def test_every_package_is_in_the_layer_table() -> None:
    packages = {p.name for p in COLAD.iterdir() if (p / "__init__.py").exists()}
    assert packages == {package for row in LAYERS for package in row}


def test_packages_import_only_lower_layers() -> None:
    assert violations(COLAD, LAYERS, TOP_LEVEL) == []


def test_package_init_files_are_empty() -> None:
    """Importing a package runs nothing and loads nothing: each process pays only for what it imports."""
    nonempty = [str(p.relative_to(COLAD)) for p in COLAD.rglob("__init__.py") if p.read_text().strip()]
    assert nonempty == ["__init__.py"]  # colad's own: the version


def _tree(root: Path, files: dict[str, str]) -> Path:
    return write_tree(root / "colad", files)


@pytest.mark.parametrize(
    ("files", "expected"),
    [
        (  # a lower layer reaching up, lazily
            {"core/__init__.py": "", "core/a.py": "def f():\n    from colad.cli import b\n", "cli/__init__.py": ""},
            "colad.core.a imports colad.cli: cli is not below core",
        ),
        (  # one process package importing another
            {"plugin/__init__.py": "", "plugin/a.py": "from colad.discovery import b\n", "discovery/__init__.py": ""},
            "colad.plugin.a imports colad.discovery: discovery is not below plugin",
        ),
        (  # a new module directly in colad/
            {"stray.py": "from colad.core import a\n", "core/__init__.py": "", "core/a.py": ""},
            "colad.stray: a module directly in colad/ that no table allows",
        ),
    ],
    ids=["upward-lazy", "process-to-process", "stray-top-level"],
)
def test_a_seeded_violation_is_reported(tmp_path: Path, files: dict[str, str], expected: str) -> None:
    root = _tree(tmp_path, {"__init__.py": "", **files})
    assert expected in violations(root, LAYERS, TOP_LEVEL)
