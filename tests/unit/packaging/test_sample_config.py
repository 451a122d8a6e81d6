"""conf/colad.toml lists every key, commented, with its default."""

from __future__ import annotations

import dataclasses
import re
import tomllib
from pathlib import Path

import pytest

from colad.config.config import UNSETTABLE, Config, load

pytestmark = pytest.mark.unit
SAMPLE = Path(__file__).resolve().parents[3] / "conf" / "colad.toml"


def test_sample_lists_every_key_with_its_default() -> None:
    text = SAMPLE.read_text()
    assert not [line for line in text.splitlines() if re.match(r"^[a-z_]+\s*=", line)], "every key stays commented"
    uncommented = "\n".join(m.group(1) for m in re.finditer(r"^#([a-z_]+\s*=.*)$", text, flags=re.M))
    values = tomllib.loads(uncommented)
    keys = {f.name for f in dataclasses.fields(Config)} - set(UNSETTABLE)
    assert set(values) == keys
    defaults = Config()
    for key, value in values.items():
        value = tuple(value) if isinstance(value, list) else value  # a command: a TOML list, a tuple in Config
        assert value == getattr(defaults, key), key


def test_sample_resources_example_loads(tmp_path: Path) -> None:
    block = [m.group(1) for m in re.finditer(r"^#   ?(.*)$", SAMPLE.read_text(), flags=re.M)]
    path = tmp_path / "c.toml"
    path.write_text("\n".join(block) + "\n")
    cfg = load({"config": str(path)}, env={})
    assert [r.name for r in cfg.resources] == ["myway5.com/cola", "myway5.com/pepsi"]
    assert cfg.resources[1].replicas == 4 and cfg.resources[1].replica_policy == "pack"
