"""The roles table is the one list of roles: supervisord's template, the CLI and the queue agree with it."""

from __future__ import annotations

import importlib
import re
from pathlib import Path

import pytest

from colad.cli import main
from colad.core import roles
from colad.health import rule

pytestmark = pytest.mark.unit
TEMPLATE = Path(__file__).resolve().parents[3] / "conf" / "supervisord.conf"


def test_the_supervisord_template_runs_each_role_once_in_the_health_check_order() -> None:
    text = TEMPLATE.read_text()
    programs = tuple(re.findall(r"^\[program:([^\]]+)\]", text, re.MULTILINE))
    assert programs == rule.PROGRAMS
    assert set(programs) == roles.ROLE_NAMES
    group = re.search(r"^programs=(.*)$", text, re.MULTILINE)
    assert group is not None and tuple(group.group(1).split(",")) == programs


def test_each_role_is_a_command_that_runs_its_module() -> None:
    assert list(main.COMMANDS)[: len(roles.ROLES)] == [r.name for r in roles.ROLES]
    for role in roles.ROLES:
        assert main.COMMANDS[role.name] == (role.module, role.summary)
        assert callable(importlib.import_module(role.module).main)


def test_the_queue_peers_are_the_roles_other_than_the_plugin() -> None:
    assert roles.QUEUE_PEERS == ("discovery", "kubelet-watch")
    assert roles.PLUGIN.name not in roles.QUEUE_PEERS
