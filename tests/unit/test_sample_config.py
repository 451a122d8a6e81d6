"""conf/colad.toml lists every key, commented, with its default."""

from __future__ import annotations

import dataclasses
import re
import tomllib
from pathlib import Path

import pytest

from colad.config import Config

pytestmark = pytest.mark.unit
SAMPLE = Path(__file__).resolve().parents[2] / "conf" / "colad.toml"


def test_sample_lists_every_key_with_its_default() -> None:
    text = SAMPLE.read_text()
    assert not [line for line in text.splitlines() if re.match(r"^[a-z_]+\s*=", line)], "every key stays commented"
    uncommented = "\n".join(m.group(1) for m in re.finditer(r"^#([a-z_]+\s*=.*)$", text, flags=re.M))
    values = tomllib.loads(uncommented)
    keys = {f.name for f in dataclasses.fields(Config)} - {"config_file"}
    assert set(values) == keys
    defaults = Config()
    for key, value in values.items():
        assert value == getattr(defaults, key), key
