"""Unit tests for colad.config: defaults, precedence, validation, and the environment round trip.

Every test passes `env` explicitly (never os.environ) and either names a config
file or points the default path at a file that does not exist, so /etc is never read.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
from pathlib import Path
from typing import Any

import pytest

from colad.config import config
from colad.config.config import Config, load
from colad.core.errors import ColadError, ConfigError
from colad.core.names import resource_name_problem

pytestmark = pytest.mark.unit

SETTABLE = [f.name for f in dataclasses.fields(Config) if f.name not in config.UNSETTABLE]


@pytest.fixture
def no_default_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Point the default config path at a file that does not exist."""
    absent = tmp_path / "etc" / "colad.toml"
    monkeypatch.setattr(config, "DEFAULT_CONFIG_PATH", str(absent))
    return absent


def _toml_value(value: object) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    return json.dumps(value)  # a TOML basic string for the plain values used here


def write_toml(path: Path, values: dict[str, object], extra: str = "") -> Path:
    path.write_text("".join(f"{k} = {_toml_value(v)}\n" for k, v in values.items()) + extra)
    return path


def load_error(flags: dict[str, Any] | None = None, env: dict[str, str] | None = None) -> str:
    with pytest.raises(ConfigError) as caught:
        load(flags, {} if env is None else env)
    return str(caught.value)


# --- defaults and derived values -----------------------------------------------------------


def test_defaults(no_default_file: Path) -> None:
    cfg = load({}, {})
    assert cfg == Config()
    assert cfg.resource_name == "myway5.com/cola"
    assert cfg.device_dir == "/etc/colas"
    assert cfg.kubelet_dir == "/var/lib/kubelet/device-plugins"
    assert cfg.run_dir == "/run/colad"
    assert cfg.metrics_address == "0.0.0.0:9647"
    assert cfg.log_level == "INFO"
    assert cfg.rescan_interval == 30.0
    assert cfg.register_timeout == 15.0
    assert cfg.supervisord_template == ""
    assert cfg.config_file == ""


def test_defaults_with_no_arguments_at_all(no_default_file: Path) -> None:
    assert load(None, {}) == Config()


def test_every_default_is_valid() -> None:
    for name in SETTABLE:
        problem = config._CHECKS.get(name, lambda _v: None)(getattr(Config(), name))
        assert problem is None, name


def test_register_timeout_default_outlasts_kubelet_dial() -> None:
    from colad.core.constants import KUBELET_DIAL_TIMEOUT_S

    assert Config().register_timeout > KUBELET_DIAL_TIMEOUT_S


DERIVED = [
    pytest.param("kubelet_socket", {}, "/var/lib/kubelet/device-plugins/kubelet.sock", id="kubelet-socket-default"),
    pytest.param("kubelet_socket", {"kubelet_dir": "/k"}, "/k/kubelet.sock", id="kubelet-socket"),
    pytest.param("queue_socket", {}, "/run/colad/queue.sock", id="queue-socket-default"),
    pytest.param("queue_socket", {"run_dir": "/r"}, "/r/queue.sock", id="queue-socket"),
    pytest.param("supervisor_socket", {"run_dir": "/r"}, "/r/supervisor.sock", id="supervisor-socket"),
    pytest.param("plugin_state_file", {"run_dir": "/r/"}, "/r/state/plugin.json", id="plugin-state-trailing-slash"),
]


@pytest.mark.parametrize("attribute, changes, expected", DERIVED)
def test_derived_paths(attribute: str, changes: dict[str, str], expected: str) -> None:
    assert getattr(Config(**changes), attribute) == expected  # type: ignore[arg-type]


def test_config_is_frozen() -> None:
    cfg = Config()
    with pytest.raises(dataclasses.FrozenInstanceError):
        cfg.log_level = "DEBUG"  # type: ignore[misc]


# --- precedence: defaults < file < environment < flags ------------------------------------

# key -> (value in the file, in the environment, as a flag, expected values in that order)
PRECEDENCE: dict[str, tuple[object, str, object, tuple[object, object, object]]] = {
    "resource_name": (
        "file.example/cola",
        "env.example/cola",
        "flag.example/cola",
        ("file.example/cola", "env.example/cola", "flag.example/cola"),
    ),
    "device_dir": ("/file/colas", "/env/colas", "/flag/colas", ("/file/colas", "/env/colas", "/flag/colas")),
    "kubelet_dir": ("/file/k", "/env/k", "/flag/k", ("/file/k", "/env/k", "/flag/k")),
    "run_dir": ("/file/run", "/env/run", "/flag/run", ("/file/run", "/env/run", "/flag/run")),
    "metrics_address": (
        "127.0.0.1:1001",
        "127.0.0.1:1002",
        "[::1]:1003",
        ("127.0.0.1:1001", "127.0.0.1:1002", "[::1]:1003"),
    ),
    "log_level": ("debug", "Warning", "error", ("DEBUG", "WARNING", "ERROR")),
    "rescan_interval": (1.5, "2.5", 3.5, (1.5, 2.5, 3.5)),
    "register_timeout": (11, "12", "13.5", (11.0, 12.0, 13.5)),
    "supervisord_template": ("/file/tpl", "/env/tpl", "/flag/tpl", ("/file/tpl", "/env/tpl", "/flag/tpl")),
    "metrics_per_device": (False, "yes", "off", (False, True, False)),
    "replicas": (2, "3", "4", (2, 3, 4)),
    "replica_policy": ("pack", "spread", "pack", ("pack", "spread", "pack")),
    "pod_resources_socket": ("/file/pr.sock", "", "/flag/pr.sock", ("/file/pr.sock", "", "/flag/pr.sock")),
    "pod_resources_interval": (1, "2", 3.5, (1.0, 2.0, 3.5)),
    # outputs, probes and prepares (tests/unit/config/test_checks.py checks their values)
    "cdi": ("only", "off", "both", ("only", "off", "both")),
    "cdi_spec_dir": ("/file/cdi", "/env/cdi", "/flag/cdi", ("/file/cdi", "/env/cdi", "/flag/cdi")),
    "host_path_check": (False, "yes", "off", (False, True, False)),
    "probe_max_in_flight": (2, "3", 5, (2, 3, 5)),
    "probe": (["/file/p", "a b"], "/env/p 'a b'", ("/flag/p",), (("/file/p", "a b"), ("/env/p", "a b"), ("/flag/p",))),
    "probe_timeout": (1, "2", 3.5, (1.0, 2.0, 3.5)),
    "probe_interval": (10, "20", 30.5, (10.0, 20.0, 30.5)),
    "prepare": (["/file/r"], "/env/r --x", ["/flag/r"], (("/file/r",), ("/env/r", "--x"), ("/flag/r",))),
    "prepare_timeout": (1, "2", 3.5, (1.0, 2.0, 3.5)),
    "nfd_features_file": ("/file/f", "/env/f", "/flag/f", ("/file/f", "/env/f", "/flag/f")),
    "nfd_label_prefix": (
        "file.example",
        "env.example",
        "flag.example",
        ("file.example", "env.example", "flag.example"),
    ),
    "nfd_expiry": (60, "120", 180.5, (60.0, 120.0, 180.5)),
    "trusted_owners": (["nobody", "1001"], "1002 root", ["0"], (("1001", "65534"), ("0", "1002"), ("0",))),
    # DRA mode's keys (tests/unit/config/test_dra_keys.py checks their values and defaults)
    "mode": ("dra", "device-plugin", "dra", ("dra", "device-plugin", "dra")),
    "node_name": ("file-node", "env-node", "flag.node", ("file-node", "env-node", "flag.node")),
    "kubeconfig": ("/file/kc", "/env/kc", "/flag/kc", ("/file/kc", "/env/kc", "/flag/kc")),
    "dra_driver": ("file.example", "env.example", "flag.example", ("file.example", "env.example", "flag.example")),
    "plugins_registry_dir": ("/file/reg", "/env/reg", "/flag/reg", ("/file/reg", "/env/reg", "/flag/reg")),
    "plugins_dir": ("/file/pl", "/env/pl", "/flag/pl", ("/file/pl", "/env/pl", "/flag/pl")),
}


def test_precedence_table_covers_every_key() -> None:
    assert sorted(PRECEDENCE) == sorted(SETTABLE)


@pytest.mark.parametrize("key", SETTABLE)
def test_precedence(key: str, tmp_path: Path) -> None:
    file_value, env_value, flag_value, (from_file, from_env, from_flag) = PRECEDENCE[key]
    path = str(write_toml(tmp_path / "colad.toml", {key: file_value}))
    var = "COLAD_" + key.upper()
    only_file = load({"config": path}, {})
    env_over_file = load({"config": path}, {var: env_value})
    flag_over_all = load({"config": path, key: flag_value}, {var: env_value})
    flag_over_file = load({"config": path, key: flag_value}, {})
    assert getattr(only_file, key) == from_file
    assert getattr(env_over_file, key) == from_env
    assert getattr(flag_over_all, key) == from_flag
    assert getattr(flag_over_file, key) == from_flag
    # Nothing else moved off its default.
    for other in SETTABLE:
        if other != key:
            assert getattr(flag_over_all, other) == getattr(Config(), other)


@pytest.mark.parametrize("key", SETTABLE)
def test_env_over_default(key: str, no_default_file: Path) -> None:
    _, env_value, _, (_, from_env, _) = PRECEDENCE[key]
    assert getattr(load({}, {"COLAD_" + key.upper(): env_value}), key) == from_env


def test_none_flag_does_not_override(no_default_file: Path) -> None:
    cfg = load({"log_level": None, "device_dir": None}, {"COLAD_LOG_LEVEL": "DEBUG"})
    assert cfg.log_level == "DEBUG"
    assert cfg.device_dir == "/etc/colas"


def test_unrelated_environment_is_ignored(no_default_file: Path) -> None:
    assert load({}, {"PATH": "/bin", "HOME": "relative", "LOG_LEVEL": "loud"}) == Config()


def test_overridden_invalid_value_is_not_reported(tmp_path: Path) -> None:
    # Only the value that wins is validated: a bad file value hidden by a good
    # environment value, or a bad environment value hidden by a flag, is moot.
    path = str(write_toml(tmp_path / "c.toml", {"log_level": "loud"}))
    assert load({"config": path}, {"COLAD_LOG_LEVEL": "debug"}).log_level == "DEBUG"
    assert load({"config": path, "log_level": "error"}, {"COLAD_LOG_LEVEL": "loud"}).log_level == "ERROR"


def test_flags_are_not_mutated(tmp_path: Path) -> None:
    path = str(write_toml(tmp_path / "c.toml", {}))
    flags = {"config": path, "log_level": "debug"}
    load(flags, {})
    assert flags == {"config": path, "log_level": "debug"}


# --- which file --------------------------------------------------------------------------


def test_config_flag_names_the_file(tmp_path: Path) -> None:
    path = write_toml(tmp_path / "c.toml", {"log_level": "DEBUG"})
    cfg = load({"config": str(path)}, {})
    assert cfg.log_level == "DEBUG"
    assert cfg.config_file == str(path)


def test_config_flag_may_be_a_path_object(tmp_path: Path) -> None:
    path = write_toml(tmp_path / "c.toml", {"log_level": "DEBUG"})
    assert load({"config": path}, {}).config_file == str(path)


def test_colad_config_names_the_file(tmp_path: Path) -> None:
    path = write_toml(tmp_path / "c.toml", {"log_level": "ERROR"})
    cfg = load({}, {"COLAD_CONFIG": str(path)})
    assert cfg.log_level == "ERROR"
    assert cfg.config_file == str(path)


def test_config_flag_beats_colad_config(tmp_path: Path) -> None:
    from_env = write_toml(tmp_path / "env.toml", {"log_level": "ERROR"})
    from_flag = write_toml(tmp_path / "flag.toml", {"log_level": "DEBUG"})
    cfg = load({"config": str(from_flag)}, {"COLAD_CONFIG": str(from_env)})
    assert cfg.log_level == "DEBUG"
    assert cfg.config_file == str(from_flag)


def test_default_file_is_read_when_present(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    default = write_toml(tmp_path / "colad.toml", {"log_level": "WARNING"})
    monkeypatch.setattr(config, "DEFAULT_CONFIG_PATH", str(default))
    cfg = load({}, {})
    assert cfg.log_level == "WARNING"
    assert cfg.config_file == str(default)


def test_missing_default_file_is_not_an_error(no_default_file: Path) -> None:
    assert not no_default_file.exists()
    assert load({}, {}).config_file == ""


def test_empty_file_is_all_defaults(tmp_path: Path) -> None:
    path = write_toml(tmp_path / "c.toml", {})
    assert load({"config": str(path)}, {}) == Config(config_file=str(path))


@pytest.mark.parametrize(
    "how",
    [pytest.param("flag", id="flag"), pytest.param("env", id="colad-config")],
)
def test_explicit_missing_file_is_an_error(how: str, tmp_path: Path) -> None:
    missing = str(tmp_path / "missing.toml")
    message = load_error({"config": missing}) if how == "flag" else load_error({}, {"COLAD_CONFIG": missing})
    assert f"config file {missing}: not found" in message


def test_directory_as_config_file_is_an_error(tmp_path: Path) -> None:
    assert f"config file {tmp_path}" in load_error({"config": str(tmp_path)})


BAD_TOML = [
    pytest.param("log_level = \n", id="missing-value"),
    pytest.param("log_level = 'a'\nlog_level = 'b'\n", id="duplicate-key"),
    pytest.param("this is not toml\n", id="prose"),
    pytest.param('log_level = "unterminated\n', id="unterminated-string"),
]


@pytest.mark.parametrize("text", BAD_TOML)
def test_bad_toml_is_an_error(text: str, tmp_path: Path) -> None:
    path = tmp_path / "bad.toml"
    path.write_text(text)
    assert f"config file {path}:" in load_error({"config": str(path)})


def test_non_utf8_file_is_a_config_error(tmp_path: Path) -> None:
    path = tmp_path / "latin1.toml"
    path.write_bytes("log_level = 'caf\u00e9'\n".encode("latin-1"))
    assert f"config file {path}:" in load_error({"config": str(path)})


UNKNOWN_KEYS = [
    pytest.param("log-level = 'INFO'\n", "log-level", id="dashed-name"),
    pytest.param("loglevel = 'INFO'\n", "loglevel", id="typo"),
    pytest.param("config_file = '/x.toml'\n", "config_file", id="config-file-not-settable"),
    pytest.param("[colad]\nlog_level = 'INFO'\n", "colad", id="table"),
]


@pytest.mark.parametrize("text, key", UNKNOWN_KEYS)
def test_unknown_key_in_file(text: str, key: str, tmp_path: Path) -> None:
    path = tmp_path / "c.toml"
    path.write_text(text)
    assert f"{key} (file {path}): unknown key" in load_error({"config": str(path)})


# --- validation ---------------------------------------------------------------------------

VALID_RESOURCE_NAMES = [
    pytest.param("myway5.com/cola", id="default"),
    pytest.param("example.com/gpu", id="example"),
    pytest.param("a-b.c-d.example/x_y.z-1", id="punctuation"),
    pytest.param("example.com/Cola", id="upper-case-name"),
    pytest.param("example/cola", id="single-label-prefix"),
    pytest.param("example.com/" + "n" * 63, id="63-char-name"),
    pytest.param("p" * 244 + "/x", id="prefix-253-with-requests-dot"),
    pytest.param("1.2.3.4/x", id="numeric-prefix"),
    pytest.param("x.requests.com/y", id="requests-inside"),
]


@pytest.mark.parametrize("name", VALID_RESOURCE_NAMES)
def test_resource_name_valid(name: str) -> None:
    assert resource_name_problem(name) is None


INVALID_RESOURCE_NAMES = [
    # (name, fragment of the reason)
    pytest.param("cola", "domain prefix", id="no-prefix"),
    pytest.param("", "domain prefix", id="empty"),
    pytest.param("kubernetes.io/x", "kubernetes.io", id="kubernetes-io"),
    pytest.param("a.kubernetes.io/x", "kubernetes.io", id="sub-kubernetes-io"),
    pytest.param("notkubernetes.io/x", "kubernetes.io", id="contains-kubernetes-io"),
    pytest.param("requests.x/y", "requests.", id="requests-prefix"),
    pytest.param("Example.com/x", "prefix", id="upper-case-prefix"),
    pytest.param("example.com/" + "n" * 64, "63", id="64-char-name"),
    pytest.param("x.com/-bad", "name", id="name-leading-dash"),
    pytest.param("x.com/bad-", "name", id="name-trailing-dash"),
    pytest.param("x.com/", "name", id="empty-name"),
    pytest.param("x.com/co la", "name", id="space-in-name"),
    pytest.param("x.com/cola\n", "name", id="trailing-newline"),
    pytest.param("/cola", "prefix", id="empty-prefix"),
    pytest.param("a/b/c", "prefix", id="two-slashes"),
    pytest.param("-x.com/cola", "prefix", id="prefix-leading-dash"),
    pytest.param("x..com/cola", "prefix", id="empty-label"),
    pytest.param("x_y.com/cola", "prefix", id="underscore-in-prefix"),
    pytest.param("x.com./cola", "prefix", id="prefix-trailing-dot"),
    pytest.param("p" * 245 + "/x", "prefix", id="prefix-254-with-requests-dot"),
]


@pytest.mark.parametrize("name, reason", INVALID_RESOURCE_NAMES)
def test_resource_name_invalid(name: str, reason: str) -> None:
    problem = resource_name_problem(name)
    assert problem is not None
    assert reason in problem


# (key, bad value given as a flag, fragment of the reason)
INVALID_VALUES = [
    pytest.param("resource_name", "cola", "domain prefix", id="resource-name"),
    pytest.param("device_dir", "colas", "absolute", id="device-dir-relative"),
    pytest.param("device_dir", "./colas", "absolute", id="device-dir-dot-relative"),
    pytest.param("device_dir", "", "absolute", id="device-dir-empty"),
    pytest.param("kubelet_dir", "var/lib/kubelet", "absolute", id="kubelet-dir-relative"),
    pytest.param("run_dir", "run", "absolute", id="run-dir-relative"),
    pytest.param("supervisord_template", "tpl.conf", "absolute", id="template-relative"),
    pytest.param("metrics_address", "0.0.0.0", "host:port", id="address-without-port"),
    pytest.param("metrics_address", ":9647", "host:port", id="address-without-host"),
    pytest.param("metrics_address", ":9647", "host:port", id="address-no-host"),
    pytest.param("metrics_address", "::1:9647", "brackets", id="address-ipv6-unbracketed"),
    pytest.param("metrics_per_device", "maybe", "true or false", id="per-device-not-bool"),
    pytest.param("metrics_address", "0.0.0.0:", "port", id="address-empty-port"),
    pytest.param("metrics_address", "0.0.0.0:70000", "port", id="port-70000"),
    pytest.param("metrics_address", "0.0.0.0:65536", "port", id="port-65536"),
    pytest.param("metrics_address", "0.0.0.0:-1", "port", id="port-negative"),
    pytest.param("metrics_address", "0.0.0.0:http", "port", id="port-name"),
    pytest.param("log_level", "loud", "DEBUG, INFO, WARNING, ERROR", id="log-level-loud"),
    pytest.param("log_level", "warn", "one of", id="log-level-warn"),
    pytest.param("log_level", "CRITICAL", "one of", id="log-level-critical"),
    pytest.param("log_level", "", "one of", id="log-level-empty"),
    pytest.param("rescan_interval", "0", "greater than 0", id="rescan-0"),
    pytest.param("rescan_interval", 0, "greater than 0", id="rescan-int-0"),
    pytest.param("rescan_interval", "-1", "greater than 0", id="rescan-negative"),
    pytest.param("rescan_interval", "nan", "greater than 0", id="rescan-nan"),
    pytest.param("rescan_interval", "abc", "could not convert", id="rescan-abc"),
    pytest.param("rescan_interval", "", "could not convert", id="rescan-empty"),
    pytest.param("register_timeout", "0", "greater than 0", id="register-timeout-0"),
    pytest.param("register_timeout", "soon", "could not convert", id="register-timeout-word"),
]


@pytest.mark.parametrize("key, value, reason", INVALID_VALUES)
def test_invalid_flag_value(key: str, value: object, reason: str, no_default_file: Path) -> None:
    message = load_error({key: value})
    assert f"{key} (flag --{key.replace('_', '-')}): " in message
    assert reason in message


@pytest.mark.parametrize("key, value, reason", INVALID_VALUES)
def test_invalid_environment_value(key: str, value: object, reason: str, no_default_file: Path) -> None:
    var = "COLAD_" + key.upper()
    message = load_error({}, {var: str(value)})
    assert f"{key} (environment {var}): " in message
    assert reason in message


@pytest.mark.parametrize("key, value, reason", INVALID_VALUES)
def test_invalid_file_value(key: str, value: object, reason: str, tmp_path: Path) -> None:
    path = write_toml(tmp_path / "c.toml", {key: value})
    message = load_error({"config": str(path)})
    assert f"{key} (file {path}): " in message
    assert reason in message


VALID_VALUES = [
    pytest.param("metrics_address", "[::1]:9647", "[::1]:9647", id="address-ipv6"),
    pytest.param("metrics_address", "localhost:0", "localhost:0", id="port-0"),
    pytest.param("metrics_address", "h:65535", "h:65535", id="port-65535"),
    pytest.param("log_level", "debug", "DEBUG", id="log-level-lower"),
    pytest.param("log_level", "Info", "INFO", id="log-level-mixed"),
    pytest.param("log_level", "warning", "WARNING", id="log-level-warning"),
    pytest.param("rescan_interval", "0.25", 0.25, id="rescan-fraction"),
    pytest.param("rescan_interval", "1e3", 1000.0, id="rescan-exponent"),
    pytest.param("rescan_interval", 7, 7.0, id="rescan-int"),
    pytest.param("supervisord_template", "", "", id="template-empty"),
    pytest.param("device_dir", "/", "/", id="device-dir-root"),
]


@pytest.mark.parametrize("key, value, expected", VALID_VALUES)
def test_valid_flag_value(key: str, value: object, expected: object, no_default_file: Path) -> None:
    assert getattr(load({key: value}, {}), key) == expected


FILE_TYPE_ERRORS = [
    pytest.param("device_dir", 5, "must be a string", id="int-for-path"),
    pytest.param("log_level", True, "must be a string", id="bool-for-string"),
    pytest.param("rescan_interval", True, "must be a number", id="bool-for-number"),
]


@pytest.mark.parametrize("key, value, reason", FILE_TYPE_ERRORS)
def test_file_value_of_wrong_type(key: str, value: object, reason: str, tmp_path: Path) -> None:
    path = write_toml(tmp_path / "c.toml", {key: value})
    assert f"{key} (file {path}): {reason}" in load_error({"config": str(path)})


def test_file_list_for_string_is_an_error(tmp_path: Path) -> None:
    path = tmp_path / "c.toml"
    path.write_text("device_dir = ['/a', '/b']\n")
    assert f"device_dir (file {path}): must be a string" in load_error({"config": str(path)})


def test_value_is_quoted_in_the_message(no_default_file: Path) -> None:
    message = load_error({}, {"COLAD_LOG_LEVEL": "loud"})
    assert "log_level (environment COLAD_LOG_LEVEL): 'loud' must be one of DEBUG, INFO, WARNING, ERROR" in message


def test_all_problems_reported_at_once(tmp_path: Path) -> None:
    path = write_toml(tmp_path / "c.toml", {"rescan_interval": 0, "bogus": "x"})
    with pytest.raises(ConfigError) as caught:
        load(
            {"config": str(path), "device_dir": "relative", "metrics_address": "nowhere"},
            {"COLAD_LOG_LEVEL": "loud", "COLAD_RESOURCE_NAME": "kubernetes.io/cola"},
        )
    message = str(caught.value)
    assert message.startswith("invalid configuration: ")
    assert "\n" not in message
    expected = [
        f"bogus (file {path}): unknown key",
        f"rescan_interval (file {path}): 0.0 must be a number of seconds greater than 0",
        "log_level (environment COLAD_LOG_LEVEL): 'loud'",
        "resource_name (environment COLAD_RESOURCE_NAME): 'kubernetes.io/cola'",
        "device_dir (flag --device-dir): 'relative' must be an absolute path",
        "metrics_address (flag --metrics-address): 'nowhere' must be host:port",
    ]
    for fragment in expected:
        assert fragment in message
    assert message.count("; ") == len(expected) - 1


def test_missing_file_and_bad_values_reported_together(tmp_path: Path) -> None:
    missing = tmp_path / "missing.toml"
    message = load_error({"config": str(missing), "run_dir": "run"}, {"COLAD_REGISTER_TIMEOUT": "-3"})
    assert f"config file {missing}: not found" in message
    assert "run_dir (flag --run-dir)" in message
    assert "register_timeout (environment COLAD_REGISTER_TIMEOUT)" in message


def test_config_error_is_a_colad_error() -> None:
    assert issubclass(ConfigError, ColadError)


def test_odd_digit_port_is_a_config_error(no_default_file: Path) -> None:
    message = load_error({"metrics_address": "0.0.0.0:\u00b2"})
    assert "metrics_address (flag --metrics-address)" in message


# --- environment() round trip --------------------------------------------------------------


def test_environment_names_every_key() -> None:
    env = Config().environment()
    assert sorted(env) == sorted("COLAD_" + k.upper() for k in SETTABLE)
    assert env["COLAD_LOG_LEVEL"] == "INFO"
    assert env["COLAD_RESCAN_INTERVAL"] == "30.0"
    assert env["COLAD_SUPERVISORD_TEMPLATE"] == ""


def test_environment_names_the_config_file() -> None:
    env = Config(config_file="/etc/colad/other.toml").environment()
    assert env["COLAD_CONFIG"] == "/etc/colad/other.toml"
    assert "COLAD_CONFIG_FILE" not in env


def test_environment_round_trip_without_file(no_default_file: Path) -> None:
    cfg = load(
        {"device_dir": "/srv/colas", "rescan_interval": "0.1", "log_level": "debug"},
        {"COLAD_RESOURCE_NAME": "example.com/pop", "COLAD_REGISTER_TIMEOUT": "12.75"},
    )
    assert cfg.config_file == ""
    assert load(None, cfg.environment()) == cfg


def test_environment_round_trip_with_file(tmp_path: Path) -> None:
    path = write_toml(
        tmp_path / "c.toml",
        {
            "resource_name": "example.com/fizzy",
            "device_dir": "/srv/colas",
            "kubelet_dir": "/k",
            "run_dir": "/r",
            "metrics_address": "127.0.0.1:9999",
            "log_level": "warning",
            "rescan_interval": 2,
            "register_timeout": 1e-3,
            "supervisord_template": "/t/s.conf",
        },
    )
    cfg = load({"config": str(path), "run_dir": "/flag/run"}, {"COLAD_LOG_LEVEL": "error"})
    assert cfg.config_file == str(path)
    assert cfg.run_dir == "/flag/run"
    child = load(None, cfg.environment())
    assert child == cfg
    assert child.config_file == str(path)


def test_misspelled_colad_variable_is_reported(no_default_file: Path) -> None:
    message = load_error(env={"COLAD_DEVICES_DIR": "/srv/colas"})
    assert "environment COLAD_DEVICES_DIR: unknown variable" in message


def test_empty_colad_config_means_the_default_file(no_default_file: Path) -> None:
    assert load(env={"COLAD_CONFIG": ""}) == load(env={})


@pytest.mark.parametrize("value", ["inf", "nan", "1e9", "-1"])
def test_seconds_must_be_finite_and_sane(value: str, no_default_file: Path) -> None:
    assert "rescan_interval (environment COLAD_RESCAN_INTERVAL)" in load_error(env={"COLAD_RESCAN_INTERVAL": value})


def test_empty_metrics_address_turns_the_endpoint_off(no_default_file: Path) -> None:
    assert load(env={"COLAD_METRICS_ADDRESS": ""}).metrics_address == ""


# --- several resources, pinned keys, reload ---------------------------------------------------

RESOURCES = """
[[resources]]
name = "example.com/cola"
device_dir = "/srv/colas"

[[resources]]
name = "example.com/pepsi"
device_dir = "/srv/pepsis"
replicas = 4
replica_policy = "pack"
"""


def test_without_a_list_the_top_level_keys_are_the_one_resource() -> None:
    cfg = Config(resource_name="example.com/a", device_dir="/a", replicas=3, replica_policy="pack")
    assert cfg.resources == (config.Resource("example.com/a", "/a", 3, "pack"),)


def test_resources_list_from_the_file(tmp_path: Path) -> None:
    cfg = load({"config": str(write_toml(tmp_path / "c.toml", {}, RESOURCES))}, {})
    assert cfg.resources == (
        config.Resource("example.com/cola", "/srv/colas"),
        config.Resource("example.com/pepsi", "/srv/pepsis", 4, "pack"),
    )
    assert load(None, cfg.environment()) == cfg


@pytest.mark.parametrize(
    "tables, expected",
    [
        pytest.param('resources = "x"', "must be a non-empty list", id="not-a-list"),
        pytest.param("resources = []", "must be a non-empty list", id="empty"),
        pytest.param('[[resources]]\nname = "example.com/a"', "resources[0].device_dir", id="no-dir"),
        pytest.param('[[resources]]\ndevice_dir = "/a"', "resources[0].name", id="no-name"),
        pytest.param('[[resources]]\nname = "cola"\ndevice_dir = "/a"', "domain prefix", id="bad-name"),
        pytest.param('[[resources]]\nname = "example.com/a"\ndevice_dir = "a"', "absolute", id="relative-dir"),
        pytest.param(
            '[[resources]]\nname = "example.com/a"\ndevice_dir = "/a"\nreplicas = 0', "from 1 to", id="zero-replicas"
        ),
        pytest.param(
            '[[resources]]\nname = "example.com/a"\ndevice_dir = "/a"\nreplicas = true', "whole number", id="bool"
        ),
        pytest.param(
            '[[resources]]\nname = "example.com/a"\ndevice_dir = "/a"\nreplica_policy = "x"',
            "spread, pack",
            id="policy",
        ),
        pytest.param('[[resources]]\nname = "example.com/a"\ndevice_dir = "/a"\ncolour = 1', "unknown key", id="key"),
        pytest.param(
            '[[resources]]\nname = "example.com/a"\ndevice_dir = "/a"\n'
            '[[resources]]\nname = "example.com/a"\ndevice_dir = "/b"',
            "used by more than one",
            id="duplicate-name",
        ),
        pytest.param(
            '[[resources]]\nname = "example.com/a"\ndevice_dir = "/a"\n'
            '[[resources]]\nname = "example.com/b"\ndevice_dir = "/a"',
            "used by more than one",
            id="duplicate-dir",
        ),
    ],
)
def test_bad_resource_tables_are_refused(tmp_path: Path, tables: str, expected: str) -> None:
    path = tmp_path / "c.toml"
    path.write_text(tables + "\n")
    with pytest.raises(ConfigError, match=re.escape(expected)):
        load({"config": str(path)}, {})


@pytest.mark.parametrize("key", ["resource_name", "device_dir", "replicas", "replica_policy"])
def test_a_list_and_the_single_resource_keys_do_not_mix(tmp_path: Path, key: str) -> None:
    value = {"resource_name": "example.com/x", "device_dir": "/x", "replicas": 2, "replica_policy": "pack"}[key]
    path = write_toml(tmp_path / "c.toml", {key: value}, RESOURCES)
    with pytest.raises(ConfigError, match="cannot be used with a"):
        load({"config": str(path)}, {})


def test_pinned_keys_are_those_from_environment_and_flags(tmp_path: Path) -> None:
    path = write_toml(tmp_path / "c.toml", {"log_level": "debug", "rescan_interval": 2})
    cfg = load({"config": str(path), "run_dir": "/flag"}, {"COLAD_RESCAN_INTERVAL": "3"})
    assert cfg.pinned == ("rescan_interval", "run_dir")
    assert cfg.environment(pinned_only=True) == {
        "COLAD_RESCAN_INTERVAL": "3.0",
        "COLAD_RUN_DIR": "/flag",
        "COLAD_CONFIG": str(path),
    }


def test_a_child_given_only_pinned_keys_sees_later_file_changes(tmp_path: Path) -> None:
    path = write_toml(tmp_path / "c.toml", {"log_level": "debug"})
    env = load({"config": str(path), "run_dir": "/flag"}, {}).environment(pinned_only=True)
    write_toml(path, {"log_level": "error", "run_dir": "/file"})
    child = load(None, env)
    assert (child.log_level, child.run_dir) == ("ERROR", "/flag")


def test_reload_plan_defers_restart_only_keys() -> None:
    running = Config(run_dir="/r", log_level="INFO")
    new = Config(run_dir="/other", metrics_address="", log_level="DEBUG", replicas=2)
    applied, deferred = config.reload_plan(running, new)
    assert deferred == ("run_dir", "metrics_address")
    assert (applied.run_dir, applied.metrics_address) == ("/r", running.metrics_address)
    assert (applied.log_level, applied.replicas) == ("DEBUG", 2)
    assert config.reload_plan(running, running) == (running, ())


# --- the config file's own trust ---------------------------------------------------------------


@pytest.mark.skipif(os.geteuid() != 0, reason="chown needs root")
@pytest.mark.parametrize(
    ("uid", "mode", "why"),
    [
        pytest.param(65534, 0o644, "untrusted: owned by uid 65534, not root", id="other-owner"),
        pytest.param(0, 0o664, "untrusted: writable by group (mode 0664)", id="group-writable"),
        pytest.param(0, 0o646, "untrusted: writable by others (mode 0646)", id="others-writable"),
    ],
)
def test_a_config_file_someone_else_can_write_is_refused(tmp_path: Path, uid: int, mode: int, why: str) -> None:
    # It names the commands colad runs as root and the owners trusted_owners lets in: it cannot vouch
    # for its own writer, whatever trusted_owners says.
    path = write_toml(tmp_path / "colad.toml", {"trusted_owners": ["65534"], "probe": "/bin/true"})
    os.chown(path, uid, -1)
    path.chmod(mode)
    message = load_error({}, {"COLAD_CONFIG": str(path)})
    assert message == f"invalid configuration: config file {path}: {why}", message


def test_a_config_file_of_root_readable_by_all_loads(tmp_path: Path) -> None:
    path = write_toml(tmp_path / "colad.toml", {"log_level": "DEBUG"})
    path.chmod(0o644)
    assert load({}, {"COLAD_CONFIG": str(path)}).log_level == "DEBUG"
