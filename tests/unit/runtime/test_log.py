"""Unit tests for colad.log: value quoting, EventLogger lines and the role-tagged formatter.

Records go to a handler writing into an io.StringIO on a private, non-propagating
logger, so nothing here touches stdout or the root logger (except the one setup() test,
which restores it).
"""

from __future__ import annotations

import io
import logging
import re
import sys
from collections.abc import Iterator

import pytest

from colad.runtime import log

pytestmark = pytest.mark.unit

# --- quote ---------------------------------------------------------------------------------

BARE = [
    pytest.param("cola", id="word"),
    pytest.param("Cola-1_2.3", id="word-punctuation"),
    pytest.param("/var/lib/kubelet/device-plugins/kubelet.sock", id="path"),
    pytest.param("myway5.com/cola", id="resource-name"),
    pytest.param("0.0.0.0:9647", id="address"),
    pytest.param("a,b,c", id="comma-list"),
    pytest.param("user@host+1", id="at-plus"),
    pytest.param(42, id="int"),
    pytest.param(-1.5, id="float"),
    pytest.param(None, id="none"),
    pytest.param(True, id="bool"),
]


@pytest.mark.parametrize("value", BARE)
def test_quote_leaves_safe_values_bare(value: object) -> None:
    assert log.quote(value) == str(value)


QUOTED = [
    # (value, rendered)
    pytest.param("", '""', id="empty"),
    pytest.param("two words", '"two words"', id="space"),
    pytest.param('say "hi"', '"say \\"hi\\""', id="double-quotes"),
    pytest.param("it's", '"it\'s"', id="single-quote"),
    pytest.param("a=b", '"a=b"', id="equals"),
    pytest.param("line1\nline2", '"line1\\nline2"', id="newline"),
    pytest.param("cr\r", '"cr\\r"', id="carriage-return"),
    pytest.param("tab\there", '"tab\\there"', id="tab"),
    pytest.param("bell\x01", '"bell\\x01"', id="control-char"),
    pytest.param("del\x7f", '"del\\x7f"', id="delete"),
    pytest.param("nul\x00", '"nul\\x00"', id="nul"),
    pytest.param("back\\slash", '"back\\\\slash"', id="backslash"),
    pytest.param('\\"', '"\\\\\\""', id="backslash-quote"),
    pytest.param("caf\u00e9", '"caf\\xe9"', id="latin1"),
    pytest.param("\u2603", '"\\u2603"', id="snowman"),
    pytest.param("\u2028", '"\\u2028"', id="line-separator"),
    pytest.param("\udcff", '"\\udcff"', id="surrogate-escaped-byte"),
    pytest.param("100%", '"100%"', id="percent"),
    pytest.param(("a", 1), "\"('a', 1)\"", id="tuple"),
]


@pytest.mark.parametrize("value, rendered", QUOTED)
def test_quote_quotes_and_escapes(value: object, rendered: str) -> None:
    assert log.quote(value) == rendered


@pytest.mark.parametrize("value", [p.values[0] for p in QUOTED] + [chr(c) for c in range(0x20)])
def test_quoted_values_are_one_printable_ascii_token(value: object) -> None:
    text = log.quote(value)
    assert text.isascii() and text.isprintable()
    assert text.startswith('"') and text.endswith('"') and len(text) >= 2
    # Inside, every double quote is escaped: the value cannot end the field early.
    inner = text[1:-1]
    assert re.fullmatch(r'(?:[^"\\]|\\.)*', inner), inner


def test_format_fields_keeps_order() -> None:
    assert log.format_fields({"b": 1, "a": "x y", "c": ""}) == 'b=1 a="x y" c=""'
    assert log.format_fields({}) == ""


# --- EventLogger and the formatter ---------------------------------------------------------


class Capture:
    """A private logger whose records are formatted into a StringIO."""

    def __init__(self, role: str = "plugin", level: int = logging.DEBUG) -> None:
        self.stream = io.StringIO()
        self.handler = logging.StreamHandler(self.stream)
        self.handler.setFormatter(log._Formatter(role))
        self.logger = logging.getLogger(f"colad-test-log.{role}.{id(self)}")
        self.logger.handlers = [self.handler]
        self.logger.propagate = False
        self.logger.setLevel(level)
        self.events = log.EventLogger(self.logger)

    def lines(self) -> list[str]:
        return self.stream.getvalue().splitlines()

    def body(self) -> str:
        """The one line logged, without the ts/level/proc head."""
        (line,) = self.lines()
        return line.split(" ", 3)[3]

    def close(self) -> None:
        self.logger.handlers = []


@pytest.fixture
def capture() -> Iterator[Capture]:
    cap = Capture()
    yield cap
    cap.close()


EVENTS = [
    # (message, fields, line body)
    pytest.param("started", {}, "msg=started", id="bare-message"),
    pytest.param("register to kubelet successfully", {}, 'msg="register to kubelet successfully"', id="spaces"),
    pytest.param(
        "registered",
        {"resource": "myway5.com/cola", "endpoint": "colad-1.sock"},
        "msg=registered resource=myway5.com/cola endpoint=colad-1.sock",
        id="fields",
    ),
    pytest.param("x", {"reason": "kubelet restarted"}, 'msg=x reason="kubelet restarted"', id="quoted-field"),
    pytest.param("x", {"count": 3, "ok": False}, "msg=x count=3 ok=False", id="non-string-fields"),
    pytest.param("x", {"name": "a\nb"}, 'msg=x name="a\\nb"', id="newline-in-field"),
    pytest.param("two\nlines", {}, 'msg="two\\nlines"', id="newline-in-message"),
    pytest.param("x", {"id": "\udcff"}, 'msg=x id="\\udcff"', id="surrogate-field"),
]


@pytest.mark.parametrize("message, fields, body", EVENTS)
def test_event_line(message: str, fields: dict[str, object], body: str, capture: Capture) -> None:
    capture.events.info(message, **fields)
    assert capture.body() == body


@pytest.mark.parametrize(
    "method, level",
    [
        pytest.param("debug", "debug", id="debug"),
        pytest.param("info", "info", id="info"),
        pytest.param("warning", "warning", id="warning"),
        pytest.param("error", "error", id="error"),
    ],
)
def test_formatter_head(method: str, level: str, capture: Capture) -> None:
    getattr(capture.events, method)("hello", k="v")
    (line,) = capture.lines()
    assert re.fullmatch(
        rf"ts=\d{{4}}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{{3}}Z level={level} proc=plugin msg=hello k=v", line
    ), line


def test_formatter_timestamp_is_utc_with_milliseconds() -> None:
    record = logging.LogRecord("n", logging.WARNING, __file__, 1, "msg=x", None, None)
    record.created, record.msecs = 86400.0 + 3661.0, 7.9
    line = log._Formatter("discovery").format(record)
    assert line == "ts=1970-01-02T01:01:01.007Z level=warning proc=discovery msg=x"


@pytest.mark.parametrize("role", ["plugin", "discovery", "kubelet-watch", "supervise"])
def test_formatter_names_the_role(role: str) -> None:
    cap = Capture(role)
    try:
        cap.events.info("x")
        assert f" proc={role} msg=x" in cap.lines()[0]
    finally:
        cap.close()


def test_disabled_level_formats_nothing() -> None:
    cap = Capture(level=logging.INFO)
    calls = []

    class Expensive:
        def __str__(self) -> str:
            calls.append(1)
            return "expensive"

    try:
        cap.events.debug("hidden", value=Expensive())
        assert cap.lines() == []
        assert calls == []
        cap.events.info("shown", value=Expensive())
        assert cap.body() == "msg=shown value=expensive"
        assert calls == [1]
    finally:
        cap.close()


def test_exception_stays_on_one_line(capture: Capture) -> None:
    try:
        raise ValueError('boom\nsecond "line"')
    except ValueError:
        capture.events.exception("scan failed", path="/etc/colas")
    (line,) = capture.lines()
    assert ' level=error proc=plugin msg="scan failed" path=/etc/colas traceback="Traceback' in line
    assert "test_exception_stays_on_one_line" in line
    assert line.endswith('ValueError: boom\\nsecond \\"line\\""')


def test_only_exception_attaches_a_traceback(capture: Capture) -> None:
    try:
        raise KeyError("k")
    except KeyError:
        capture.events.error("recovered", attempt=2)
        capture.events.warning("recovered")
    assert capture.lines()[0].endswith(" msg=recovered attempt=2")
    assert capture.lines()[1].endswith(" msg=recovered")
    assert "traceback" not in capture.stream.getvalue()


def test_records_point_at_the_caller() -> None:
    # stacklevel: the record names the code that logged, not colad/runtime/log.py.
    records: list[logging.LogRecord] = []
    cap = Capture()
    cap.handler.emit = records.append  # type: ignore[method-assign]
    try:
        cap.events.info("x")
        cap.events.exception("y")
    finally:
        cap.close()
    assert [r.funcName for r in records] == ["test_records_point_at_the_caller"] * 2
    assert all(r.pathname == __file__ for r in records)


def test_is_enabled_for_follows_the_logger() -> None:
    cap = Capture(level=logging.WARNING)
    try:
        assert not cap.events.isEnabledFor(logging.INFO)
        assert cap.events.isEnabledFor(logging.WARNING)
        assert cap.events.isEnabledFor(logging.ERROR)
    finally:
        cap.close()


def test_get_returns_an_event_logger_for_the_module() -> None:
    events = log.get("colad.test_log_module")
    assert isinstance(events, log.EventLogger)
    assert events.logger is logging.getLogger("colad.test_log_module")


PERCENT = [
    # '%' must reach the line as is: the line is passed as an argument, never as a format.
    pytest.param("disk 100% full", {}, 'msg="disk 100% full"', id="percent-in-message"),
    pytest.param("x", {"path": "/a%b"}, 'msg=x path="/a%b"', id="percent-in-field"),
    pytest.param("%s %d", {}, 'msg="%s %d"', id="format-codes-in-message"),
    pytest.param("x", {"v": "%(name)s"}, 'msg=x v="%(name)s"', id="mapping-code-in-field"),
    pytest.param("%%", {}, 'msg="%%"', id="double-percent"),
]


@pytest.mark.parametrize("message, fields, body", PERCENT)
def test_percent_is_logged_as_is(message: str, fields: dict[str, object], body: str, capture: Capture) -> None:
    capture.events.info(message, **fields)
    assert capture.body() == body


# --- setup ---------------------------------------------------------------------------------


@pytest.fixture
def restore_root_logger() -> Iterator[logging.Logger]:
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    yield root
    root.handlers = handlers
    root.setLevel(level)


def test_setup_replaces_root_handlers(restore_root_logger: logging.Logger, monkeypatch: pytest.MonkeyPatch) -> None:
    out = io.StringIO()
    monkeypatch.setattr(sys, "stdout", out)
    root = restore_root_logger
    root.addHandler(logging.NullHandler())
    log.setup("discovery", "debug")
    assert len(root.handlers) == 1
    assert root.level == logging.DEBUG
    (handler,) = root.handlers
    record = logging.LogRecord("colad.x", logging.DEBUG, __file__, 1, "msg=x", None, None)
    handler.handle(record)
    assert re.fullmatch(r"ts=\S+ level=debug proc=discovery msg=x\n", out.getvalue()), out.getvalue()
