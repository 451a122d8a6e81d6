"""The DRA keys: mode, node_name, kubeconfig, dra_driver, plugins_registry_dir, plugins_dir.

Defaults (node_name's from NODE_NAME, else the host name; dra_driver's from the first resource name),
bad values refused at load in one line naming the key, and what only DRA mode uses checked in DRA mode
only, so a device plugin never fails on it. Precedence (file < environment < flag) is
tests/unit/config/test_config.py's table, which covers every key.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from colad.cli.main import main
from colad.config.config import Config, load
from colad.core.errors import ConfigError

pytestmark = pytest.mark.unit


def config_env(tmp_path: Path, text: str = "", **env: str) -> dict[str, str]:
    path = tmp_path / "colad.toml"
    path.write_text(text)
    return {"COLAD_CONFIG": str(path), **env}


def refusal(env: dict[str, str], flags: dict[str, object] | None = None) -> str:
    with pytest.raises(ConfigError) as caught:
        load(flags or {}, env)
    line = str(caught.value)
    assert "\n" not in line
    return line


def test_the_defaults(tmp_path: Path) -> None:
    cfg = load({}, config_env(tmp_path))
    assert (cfg.mode, cfg.node_name, cfg.kubeconfig, cfg.dra_driver) == ("device-plugin", "", "", "")
    assert cfg.plugins_registry_dir == "/var/lib/kubelet/plugins_registry"
    assert cfg.plugins_dir == "/var/lib/kubelet/plugins"
    assert cfg.dra_driver_name == "cola.myway5.com"
    assert cfg.dra_registration_socket == "/var/lib/kubelet/plugins_registry/cola.myway5.com-reg.sock"
    assert cfg.dra_plugin_socket == "/var/lib/kubelet/plugins/cola.myway5.com/dra.sock"


def test_the_node_name_defaults_to_node_name_then_the_host_name(tmp_path: Path) -> None:
    assert load({}, config_env(tmp_path, NODE_NAME="worker-7")).resolved_node_name == "worker-7"
    assert load({}, config_env(tmp_path, NODE_NAME="")).resolved_node_name == os.uname().nodename.strip().lower()
    pinned = load({}, config_env(tmp_path, NODE_NAME="worker-7", COLAD_NODE_NAME="set"))
    assert (pinned.node_name, pinned.resolved_node_name) == ("set", "set")


def test_a_found_node_name_is_not_exported_to_children(tmp_path: Path) -> None:
    """A child finds it again in the environment it inherits; exported, it would pin a value no one set."""
    cfg = load({}, config_env(tmp_path, NODE_NAME="worker-7"))
    assert cfg == Config(config_file=cfg.config_file)
    assert "COLAD_NODE_NAME" not in cfg.environment(pinned_only=True)
    assert cfg.environment()["COLAD_NODE_NAME"] == ""


def test_the_in_cluster_api_server_is_read_from_the_pod_environment_and_never_exported(tmp_path: Path) -> None:
    env = config_env(tmp_path, KUBERNETES_SERVICE_HOST="10.96.0.1", KUBERNETES_SERVICE_PORT="443")
    cfg = load({}, env)
    assert (cfg.kube_service_host, cfg.kube_service_port) == ("10.96.0.1", "443")
    assert cfg == Config(config_file=cfg.config_file)
    assert not [k for k in cfg.environment() if "KUBE_SERVICE" in k]
    assert (load({}, config_env(tmp_path)).kube_service_host, load({}, config_env(tmp_path)).kube_service_port) == (
        "",
        "",
    )


def test_the_driver_name_derives_from_the_first_resource(tmp_path: Path) -> None:
    text = '[[resources]]\nname = "a.example/gpu"\ndevice_dir = "/srv/a"\n'
    text += '[[resources]]\nname = "b.example/fpga"\ndevice_dir = "/srv/b"\n'
    cfg = load({}, config_env(tmp_path, text))
    assert cfg.dra_driver_name == "gpu.a.example"
    assert load({}, config_env(tmp_path, text, COLAD_DRA_DRIVER="x.example")).dra_driver_name == "x.example"


def test_mode_is_a_flag_of_every_command(tmp_path: Path) -> None:
    from colad.cli.main import build_parser

    assert build_parser("plugin").parse_args(["plugin", "--mode", "dra"]).mode == "dra"
    assert load({"mode": "dra"}, config_env(tmp_path)).mode == "dra"


@pytest.mark.parametrize(
    ("key", "value", "why"),
    [
        pytest.param("mode", "both", "must be one of device-plugin, dra", id="mode-unknown"),
        pytest.param("mode", "DRA", "must be one of device-plugin, dra", id="mode-case"),
        pytest.param("node_name", "Worker_1", "must be a lowercase DNS subdomain", id="node-name-not-dns"),
        pytest.param("node_name", "n" * 254, "must be a lowercase DNS subdomain", id="node-name-too-long"),
        pytest.param("kubeconfig", "kube/config", "must be an absolute path", id="kubeconfig-relative"),
        pytest.param("kubeconfig", "/etc/kube\x07config", "control or invisible", id="kubeconfig-control"),
        pytest.param("dra_driver", "Cola.example.com", "must be a lowercase DNS subdomain", id="driver-upper"),
        pytest.param("dra_driver", "myway5.com/cola", "must be a lowercase DNS subdomain", id="driver-slash"),
        pytest.param("dra_driver", "d" * 64, "at most 63 characters", id="driver-too-long"),
        pytest.param("plugins_registry_dir", "plugins_registry", "must be an absolute path", id="registry-relative"),
        pytest.param("plugins_registry_dir", "/var/lib/k%2Fl", "gRPC reads unix:<path> as a URI", id="registry-uri"),
        pytest.param("plugins_dir", "/var/lib/k?l", "gRPC reads unix:<path> as a URI", id="plugins-dir-uri"),
    ],
)
@pytest.mark.parametrize("where", ["file", "environment", "flag"])
def test_a_bad_value_is_refused_in_any_mode(tmp_path: Path, key: str, value: str, why: str, where: str) -> None:
    if where == "file":
        line = refusal(config_env(tmp_path, f"{key} = {json.dumps(value)}\n"))
    elif where == "environment":
        line = refusal(config_env(tmp_path, **{"COLAD_" + key.upper(): value}))
    else:
        line = refusal(config_env(tmp_path), {key: value})
    assert f"invalid configuration: {key} (" in line and why in line, line


@pytest.mark.parametrize(
    ("text", "env", "why"),
    [
        pytest.param("", {"NODE_NAME": "Worker_1"}, "node_name (environment NODE_NAME): 'Worker_1'", id="node-name"),
        pytest.param(
            'node_name = ""\n',
            {"NODE_NAME": "Worker_1"},
            "(environment NODE_NAME): 'Worker_1'",
            id="node-name-set-empty",
        ),
        pytest.param(
            'resource_name = "a.example/Big_GPU"\n', {}, "DRA driver name 'Big_GPU.a.example'", id="derived-driver"
        ),
        pytest.param(
            'dra_driver = "' + "d" * 60 + '"\nplugins_registry_dir = "/' + "r" * 40 + '"\n',
            {},
            "plugins_registry_dir (file ",
            id="registration-socket-too-long",
        ),
        pytest.param(
            'dra_driver = "' + "d" * 60 + '"\nplugins_dir = "/' + "p" * 40 + '"\n',
            {},
            "over the 107 a Unix socket allows",
            id="plugin-socket-too-long",
        ),
    ],
)
def test_what_only_dra_uses_is_checked_in_dra_mode_only(
    tmp_path: Path, text: str, env: dict[str, str], why: str
) -> None:
    load({}, config_env(tmp_path, text, **env))  # a device plugin loads
    line = refusal(config_env(tmp_path, text + 'mode = "dra"\n', **env))
    assert why in line, line


def test_a_refusal_exits_2_with_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    empty = tmp_path / "colad.toml"
    empty.write_text("")
    assert main(["status", "--config", str(empty), "--mode", "both"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "mode (flag --mode): 'both' must be one of device-plugin, dra" in err, err
