"""Reading colad's configuration input: the TOML file, bounded, and each raw value as its key's type.

`read_file` refuses what would block or stall every role at start and on reload (a FIFO,
a huge file, a key of thousands of dots); `convert` coerces a file, environment or flag
value to the type of the Config field it sets. Problems are appended or raised, never logged.
"""

from __future__ import annotations

import dataclasses
import os
import re
import shlex
import stat

from colad.config.checks import bare_dots, printable_text_problem, show_path
from colad.core import trust

TYPE_CHECKING = False  # typing is not loaded at run time: docs/DEVELOPING.md, "Import cost"
if TYPE_CHECKING:
    from typing import Any

# A config file is small (the sample with every key is 4 KB); anything bigger is refused unread.
MAX_CONFIG_FILE_BYTES = 256 * 1024
# tomllib is quadratic in the parts of one dotted key (a 60 KB `a.a.a… = 1` parses for 20 s, and
# every role parses at start and on reload). colad's keys have no dots: a file with more dots
# outside strings and comments than this is refused before it is parsed.
MAX_BARE_DOTS = 64

# Blank lines and comments only, as tomllib reads them after its CRLF -> LF (a comment holds no
# control character but tab): such a file is {} without importing tomllib, which with typing costs
# every role ~1 MiB and ~10 ms (the shipped sample config is all comments).
_ONLY_COMMENTS = re.compile(r"(?:[ \t]*(?:#[^\x00-\x08\n-\x1f\x7f]*)?\n)*[ \t]*(?:#[^\x00-\x08\n-\x1f\x7f]*)?")

_TRUE = ("true", "yes", "on", "1")
_FALSE = ("false", "no", "off", "0")


def convert(field: dataclasses.Field[Any], raw: object) -> object:
    """Coerce a file/env/flag value to the field's type, or raise ValueError."""
    kind: type = type(field.default)
    if kind is bool:
        if isinstance(raw, bool):
            return raw
        text = str(raw).strip().lower() if isinstance(raw, str) else None
        if text in _TRUE:
            return True
        if text in _FALSE:
            return False
        raise ValueError("must be true or false")
    if kind is float:
        if isinstance(raw, bool):
            raise ValueError("must be a number")
        return float(raw)  # type: ignore[arg-type]
    if kind is int:
        if isinstance(raw, bool) or isinstance(raw, float):
            raise ValueError("must be a whole number")
        return int(str(raw).strip()) if isinstance(raw, str) else int(raw)  # type: ignore[call-overload]
    if kind is tuple:  # a command: a list of strings in the file, a shell-quoted line in the environment
        if isinstance(raw, str):
            return tuple(shlex.split(raw))
        if isinstance(raw, list | tuple) and all(isinstance(a, str) for a in raw):
            return tuple(raw)
        raise ValueError("must be a list of strings (the command and its arguments)")
    if not isinstance(raw, str):
        raise ValueError("must be a string")
    return raw


def read_file(path: str, explicit: bool, problems: list[str]) -> tuple[dict[str, Any], str]:
    """The parsed file and its path ("" when the default file is absent); problems appended."""
    where = show_path(path)
    if problem := printable_text_problem(path):
        problems.append(f"config file {where}: path {problem}")
        return {}, path
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)  # a FIFO must not block us
    except FileNotFoundError:
        if explicit:
            problems.append(f"config file {where}: not found")
        return {}, ""
    except OSError as exc:
        problems.append(f"config file {where}: {exc.strerror or exc}")
        return {}, path
    try:
        with os.fdopen(fd, "rb") as handle:
            found = os.fstat(handle.fileno())
            if not stat.S_ISREG(found.st_mode):
                problems.append(f"config file {where}: not a regular file")
                return {}, path
            if untrusted := trust.config_file_problem(found.st_mode, found.st_uid, os.geteuid()):
                problems.append(f"config file {where}: {untrusted}")
                return {}, path
            raw = handle.read(MAX_CONFIG_FILE_BYTES + 1)
        if len(raw) > MAX_CONFIG_FILE_BYTES:
            problems.append(f"config file {where}: larger than {MAX_CONFIG_FILE_BYTES // 1024} KiB")
            return {}, path
        text = raw.decode("utf-8")
        if bare_dots(text) > MAX_BARE_DOTS:
            problems.append(f"config file {where}: more than {MAX_BARE_DOTS} dotted key parts (colad's keys have none)")
            return {}, path
        return parse_toml(text), path
    except (OSError, ValueError, RecursionError, MemoryError) as exc:  # ValueError: UTF-8, TOML, huge ints
        problems.append(f"config file {where}: {exc}")
        return {}, path


def parse_toml(text: str) -> dict[str, Any]:
    """tomllib.loads(text), without tomllib for a text of comments and blank lines only."""
    if _ONLY_COMMENTS.fullmatch(text.replace("\r\n", "\n")):
        return {}
    import tomllib  # noqa: PLC0415 - see _ONLY_COMMENTS

    return tomllib.loads(text)
