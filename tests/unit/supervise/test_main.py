"""Rendering the supervisord template that ships in conf/."""

from __future__ import annotations

import configparser
import sys
from pathlib import Path

import pytest

from colad.config.config import Config
from colad.core.errors import ConfigError
from colad.supervise import main

pytestmark = pytest.mark.unit
TEMPLATE = (Path(__file__).resolve().parents[3] / "conf" / "supervisord.conf").read_text()


def parse(text: str) -> configparser.RawConfigParser:
    parser = configparser.RawConfigParser(inline_comment_prefixes=(";",))
    parser.read_string(text)
    return parser


@pytest.mark.parametrize("journal", [False, True], ids=["terminal", "journal"])
def test_template_renders_three_supervised_programs(journal: bool) -> None:
    cfg = Config(run_dir="/run/colad-test")
    conf = parse(main.render_conf(cfg, TEMPLATE, journal=journal))
    programs = [s.removeprefix("program:") for s in conf.sections() if s.startswith("program:")]
    assert programs == ["plugin", "discovery", "kubelet-watch"]
    for name in programs:
        section = conf[f"program:{name}"]
        # Signals stay blocked from exec to colad's own handling .
        assert section["command"] == f"/usr/bin/env --block-signal=HUP,INT,TERM {sys.executable} -m colad {name}"
        assert section["autorestart"] == "true"
        assert section["stopasgroup"] == section["killasgroup"] == "true"
        assert section["redirect_stderr"] == "true"
        if journal:  # /dev/stdout cannot be opened on journald's socket
            assert (section["stdout_logfile"], section["stdout_syslog"]) == ("NONE", "true")
        else:
            assert section["stdout_logfile"] == "/dev/stdout"
    # The watchdog runs inside supervisord: no listener process, supervisord's factory, the configured level.
    assert [s for s in conf.sections() if s.startswith("eventlistener:")] == []
    assert conf["rpcinterface:colad"]["supervisor.rpcinterface_factory"] == main.WATCHDOG_FACTORY
    assert conf["rpcinterface:colad"]["log_level"] == cfg.log_level
    assert main.has_watchdog(main.render_conf(cfg, TEMPLATE, journal=journal))
    assert conf["unix_http_server"]["file"] == "/run/colad-test/supervisor.sock"
    assert conf["unix_http_server"]["chmod"] == "0700"
    assert conf["supervisord"]["nodaemon"] == "true"
    assert conf["supervisord"]["logfile"] == "/dev/null"
    rendered = main.render_conf(cfg, TEMPLATE, journal=True)
    assert not [line for line in rendered.splitlines() if "/dev/stdout" in line and not line.startswith(";")]


def test_a_template_from_before_the_in_process_watchdog_still_renders_and_is_told_apart() -> None:
    # A locally edited template (a conffile the upgrade kept) with the old listener and its ${listener_log}.
    old = "[supervisord]\n[eventlistener:watchdog]\ncommand=${python} -m colad watchdog\n${listener_log}\n"
    rendered = main.render_conf(Config(), old, journal=False)
    assert "stderr_logfile=/dev/stdout" in rendered
    assert not main.has_watchdog(rendered)
    assert not main.has_watchdog("[rpcinterface:colad]\nsupervisor.rpcinterface_factory = other:factory\n")
    assert not main.has_watchdog("not [ an ini file")


def test_a_source_checkout_finds_the_template_in_its_conf(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setattr(sys, "prefix", str(tmp_path))  # an interpreter with no installed colad data
    assert main.template_path(Config()) == Path(__file__).resolve().parents[3] / "conf" / "supervisord.conf"


def test_a_bad_placeholder_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match="supervisord_template"):
        main.render_conf(Config(), "[supervisord]\nfile=${nope}\n", journal=False)


def test_journal_detection_compares_stdout_with_journal_stream(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("JOURNAL_STREAM", raising=False)
    assert main.stdout_is_journal() is False
    monkeypatch.setenv("JOURNAL_STREAM", "1:2")
    assert main.stdout_is_journal() is False


def test_the_waker_finds_the_pid_file_and_control_socket_of_the_shipped_template() -> None:
    rendered = main.render_conf(Config(run_dir="/run/colad-test"), TEMPLATE, journal=False)
    assert main.wake_paths(rendered) == ("/run/colad-test/supervisord.pid", "/run/colad-test/supervisor.sock")


@pytest.mark.parametrize(
    "text",
    [
        "[supervisord]\npidfile=/run/x.pid\n",  # no control socket
        "[unix_http_server]\nfile=/run/x.sock\n",  # no pid file
        "[supervisord]\npidfile=%(here)s/x.pid\n[unix_http_server]\nfile=/run/x.sock\n",  # supervisord expands it
        "[supervisord]\npidfile=x.pid\n[unix_http_server]\nfile=/run/x.sock\n",  # relative to supervisord's cwd
        "[supervisord\nbroken",
    ],
    ids=["no-socket", "no-pidfile", "expansion", "relative", "unparsable"],
)
def test_the_waker_is_skipped_for_a_template_it_cannot_read_literally(text: str) -> None:
    assert main.wake_paths(text) is None
