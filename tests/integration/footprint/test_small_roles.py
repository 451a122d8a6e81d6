"""What the two small roles load on their way to work: near a bare interpreter.

A fresh interpreter imports what `colad <role>` imports and loads the config as main() does,
with the shipped kind of config file (comments only), then lists sys.modules. tomllib (and the
typing it imports) comes in only for a file with content; the queue server never.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.integration.footprint.test_role_footprint import loaded

pytestmark = pytest.mark.integration
REPO = Path(__file__).resolve().parents[3]
ROLES = {"discovery": "colad.discovery.main", "kubelet-watch": "colad.kubelet_watch.main"}
NEVER = ("typing", "colad.queue.server", "colad.outputs.statefile", "colad.outputs.socketpath", "_hashlib")


@pytest.mark.parametrize("role", sorted(ROLES))
def test_a_small_role_with_a_commented_config_loads_neither_tomllib_nor_typing(role: str, tmp_path: Path) -> None:
    modules = loaded(ROLES[role], tmp_path, "# every key commented, as the sample\n# log_level = 'INFO'\n")
    assert ROLES[role] in modules
    assert sorted(m for m in NEVER + ("tomllib",) if m in modules) == []


def test_a_config_with_content_is_parsed_by_tomllib(tmp_path: Path) -> None:
    modules = loaded(ROLES["kubelet-watch"], tmp_path, 'log_level = "DEBUG"\n')
    assert "tomllib" in modules
    assert sorted(m for m in NEVER if m in modules and m != "typing") == []


@pytest.mark.parametrize(
    "words",
    [
        ["kubelet-watch"],
        ["kubelet-watch", "--log-level", "bogus"],
        ["supervise"],
        ["supervise", "--log-level", "bogus"],
    ],
)
def test_a_role_started_by_its_name_alone_skips_argparse(words: list[str], tmp_path: Path) -> None:
    """supervisord starts a role, systemd `colad supervise`, by its bare name: no flag to parse, so no
    argparse; any flag still parses."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("COLAD_")}
    env.update(COLAD_CONFIG=str(tmp_path / "none.toml"), COLAD_LOG_LEVEL="bogus")  # refused at load: exit 2
    out = subprocess.run(
        [sys.executable, "-X", "importtime", "-m", "colad", *words], cwd=REPO, env=env, capture_output=True, text=True
    )
    assert out.returncode == 2, out.stderr
    assert "log_level" in out.stderr.splitlines()[-1]
    imported = {line.rsplit("|", 1)[-1].strip() for line in out.stderr.splitlines() if line.startswith("import time:")}
    assert ("argparse" in imported) == (len(words) > 1)
