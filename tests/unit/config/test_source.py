"""A config or device file of comments only is read without tomllib, exactly as tomllib reads it.

parse_toml's shortcut must agree with tomllib.loads on every text: the same table, or a refusal
(ValueError) for the same texts. Random texts over the characters that decide it (comment marks,
whitespace, line ends, control characters, a key) check the property, not a few cases.
"""

from __future__ import annotations

import random
import tomllib

import pytest

from colad.config import source
from colad.core.devices import Device
from colad.discovery import devicefile

pytestmark = pytest.mark.unit

ALPHABET = ["#", "#", " ", "\t", "\n", "\n", "\r", "\r\n", "a", "=", "1", "\x00", "\x1f", "\x7f", "\ufeff", "é", '"']


def outcome(parse: object, text: str) -> object:
    try:
        return parse(text)  # type: ignore[operator]
    except ValueError:
        return "refused"


def texts(seed: int, count: int) -> list[str]:
    rng = random.Random(seed)
    return ["".join(rng.choice(ALPHABET) for _ in range(rng.randint(0, 12))) for _ in range(count)]


@pytest.mark.parametrize("seed", range(4))
def test_parse_toml_agrees_with_tomllib_on_random_texts(seed: int) -> None:
    shortcut = 0
    for text in texts(seed, 5000):
        assert outcome(source.parse_toml, text) == outcome(tomllib.loads, text), repr(text)
        shortcut += bool(source._ONLY_COMMENTS.fullmatch(text.replace("\r\n", "\n")))
    assert shortcut > 100  # the shortcut is exercised, not only tomllib


@pytest.mark.parametrize(
    "text",
    ["", "\n", "# a\n", "  # a\r\n\t#b", "# é ünïcode\n", "# tab\there\n"],
)
def test_comment_only_texts_are_empty_tables(text: str) -> None:
    assert source._ONLY_COMMENTS.fullmatch(text.replace("\r\n", "\n"))
    assert source.parse_toml(text) == {} == tomllib.loads(text)


@pytest.mark.parametrize("text", ["# a\rb\n", "# nul \x00\n", "# del \x7f", "\ufeff# bom\n", "a = 1 # x\n"])
def test_what_is_not_only_comments_goes_to_tomllib(text: str) -> None:
    assert not source._ONLY_COMMENTS.fullmatch(text.replace("\r\n", "\n"))
    assert outcome(source.parse_toml, text) == outcome(tomllib.loads, text)


def test_a_device_file_of_comments_is_a_bare_device_and_a_bad_one_still_says_why() -> None:
    assert devicefile.parse("cola0", b"# nothing here\n\n") == Device("cola0")
    bad = devicefile.parse("cola0", b"# nul \x00\n")
    assert bad.problem.startswith("invalid TOML:") and not bad.healthy
