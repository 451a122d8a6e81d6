"""Logging: one line per event, key=value fields, each line naming its process role.

Every module gets an `EventLogger` from `get(__name__)` and logs
`LOG.info("register to kubelet successfully", resource=..., endpoint=...)`.
Fields are formatted only when the level is enabled. Output goes to stdout,
which supervisord forwards to the terminal or to the journal.
"""

from __future__ import annotations

import logging
import re
import sys
import time

_SAFE = re.compile(r"[A-Za-z0-9\-_./:,@+]+")


def quote(value: object) -> str:
    """Render one value for a key=value line: bare when safe, else double-quoted."""
    text = value if type(value) is str else str(value)
    if _SAFE.fullmatch(text):
        return text
    escaped = text.encode("unicode_escape").decode("ascii").replace('"', '\\"')
    return f'"{escaped}"'


def format_fields(fields: dict[str, object]) -> str:
    return " ".join(f"{key}={quote(value)}" for key, value in fields.items())


def event_line(msg: str, fields: dict[str, object]) -> str:
    """The text of one event: `msg="what happened" key=value ...`."""
    return f"msg={quote(msg)} {format_fields(fields)}" if fields else f"msg={quote(msg)}"


class EventLogger:
    """`LOG.info("what happened", key=value, ...)` -> `msg="what happened" key=value`.

    Fields are formatted only when the level is enabled.
    """

    def __init__(self, logger: logging.Logger) -> None:
        self.logger = logger

    def _emit(self, level: int, msg: str, fields: dict[str, object], exc_info: bool = False) -> None:
        if not self.logger.isEnabledFor(level):
            return
        self.logger.log(level, "%s", event_line(msg, fields), exc_info=exc_info, stacklevel=3)

    def formatted(self, level: int, line: str) -> None:
        """A line event_line() made earlier (a hot path keeps it: the servicer's Allocate answers)."""
        if self.logger.isEnabledFor(level):
            self.logger.log(level, "%s", line, stacklevel=2)

    def debug(self, msg: str, **fields: object) -> None:
        self._emit(logging.DEBUG, msg, fields)

    def info(self, msg: str, **fields: object) -> None:
        self._emit(logging.INFO, msg, fields)

    def warning(self, msg: str, **fields: object) -> None:
        self._emit(logging.WARNING, msg, fields)

    def error(self, msg: str, **fields: object) -> None:
        self._emit(logging.ERROR, msg, fields)

    def exception(self, msg: str, **fields: object) -> None:
        """An ERROR line carrying the current exception's traceback (folded into one line)."""
        self._emit(logging.ERROR, msg, fields, exc_info=True)

    def isEnabledFor(self, level: int) -> bool:  # noqa: N802 - mirrors logging.Logger
        return self.logger.isEnabledFor(level)


def get(name: str) -> EventLogger:
    return EventLogger(logging.getLogger(name))


class _Formatter(logging.Formatter):
    def __init__(self, role: str) -> None:
        super().__init__()
        self.role = role

    def format(self, record: logging.LogRecord) -> str:
        stamp = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
        head = f"ts={stamp}.{int(record.msecs):03d}Z level={record.levelname.lower()} proc={self.role}"
        line = f"{head} {record.getMessage()}"
        if record.exc_info:
            # Keep one line per event: the traceback is folded into a field.
            trace = self.formatException(record.exc_info)
            line += " traceback=" + quote(trace)
        return line


class _UndecodableRequest(logging.Filter):
    """grpc logs a request it cannot deserialize with a traceback (grpc/_common.py `_transform`).

    That input comes from a peer, and the call already fails with a status: one WARNING line
    naming the error, not an ERROR with a traceback an operator would take for a colad bug.
    """

    def filter(self, record: logging.LogRecord) -> bool:
        if record.exc_info and str(record.msg).startswith("Exception deserializing"):
            error = record.exc_info[1]
            record.levelno, record.levelname = logging.WARNING, "WARNING"
            record.msg = "%s"
            record.args = (f"msg={quote('gRPC request not decodable; the call fails')} reason={quote(repr(error))}",)
            record.exc_info, record.exc_text = None, None
        return True


def setup(role: str, level: str = "INFO") -> None:
    """Send every log line to stdout, tagged with the process role."""
    grpc_common = logging.getLogger("grpc._common")
    if not any(isinstance(f, _UndecodableRequest) for f in grpc_common.filters):
        grpc_common.addFilter(_UndecodableRequest())
    handler = logging.StreamHandler(sys.stdout)
    handler.setFormatter(_Formatter(role))
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(level.upper())


def set_level(level: str) -> None:
    """Change the level of every logger at once (a reload)."""
    logging.getLogger().setLevel(level.upper())
