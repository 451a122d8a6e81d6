"""The `colad` command: one subcommand per process role, plus operator tools.

Parses flags, loads the Config once (a bad value exits 2 with one line), and
hands over to the role's `main`. Roles are imported lazily so that discovery
and the watcher never import gRPC.
"""

from __future__ import annotations

import importlib
import sys

from colad import __version__
from colad.config import config
from colad.core.errors import ConfigError
from colad.core.roles import ROLE_NAMES, ROLES

TYPE_CHECKING = False  # typing is not loaded at run time: docs/DEVELOPING.md, "Import cost"
if TYPE_CHECKING:
    import argparse

# Every subcommand: name -> (module whose main() it runs, one-line help); the roles first.
COMMANDS = {
    **{role.name: (role.module, role.summary) for role in ROLES},
    "supervise": ("colad.supervise.main", "run all three roles under supervisord in the foreground"),
    "reload": ("colad.cli.reload", "check the config file, then have the running colad apply it"),
    "status": ("colad.cli.status", "show each process, the registration and the device count"),
    "kubelet-sim": ("colad.cli.kubelet_sim", "a kubelet stand-in: accept a registration, list devices, allocate"),
    "check": ("colad.cli.check", "dial the plugin socket(s) like the kubelet: list, then Allocate each device"),
}

# The module a command runs in DRA mode, where it is not the one COMMANDS names.
DRA_COMMANDS = {"check": "colad.cli.check_dra"}

# The long-running commands, which take config flags only: run by their name alone, they parse nothing.
BARE_COMMANDS = ROLE_NAMES | {"supervise"}

CONFIG_FLAGS = {
    "config": "path of the TOML config file (env COLAD_CONFIG; default /etc/colad/colad.toml)",
    "resource_name": "extended resource name (env COLAD_RESOURCE_NAME)",
    "device_dir": "directory whose regular files are the devices (env COLAD_DEVICE_DIR)",
    "kubelet_dir": "kubelet device-plugins directory (env COLAD_KUBELET_DIR)",
    "run_dir": "root-only directory for the queue and supervisord sockets (env COLAD_RUN_DIR)",
    "metrics_address": "host:port of the metrics endpoint (env COLAD_METRICS_ADDRESS)",
    "log_level": "DEBUG, INFO, WARNING or ERROR (env COLAD_LOG_LEVEL)",
    "mode": "device-plugin (the default) or dra: the kubelet API the devices are served through (env COLAD_MODE)",
}


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The parser; with a known `command`, of that subcommand only.

    Every role's start parses its command line: building all nine subparsers costs ~6 ms of
    CPU per process, while four processes share two CPUs during a cold start.
    """
    import argparse

    common = argparse.ArgumentParser(add_help=False)
    for name, text in CONFIG_FLAGS.items():
        common.add_argument("--" + name.replace("_", "-"), dest=name, default=None, help=text)
    parser = argparse.ArgumentParser(prog="colad", description="Kubernetes device plugin for files in a directory.")
    parser.add_argument("--version", action="version", version=f"colad {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name, (_module, text) in COMMANDS.items():
        if command in COMMANDS and name != command:
            continue
        child = sub.add_parser(name, parents=[common], help=text, description=text)
        extra = getattr(importlib.import_module("colad.cli.args"), name.replace("-", "_") + "_flags", None)
        if extra is not None:
            extra(child)
    return parser


def main(argv: list[str] | None = None) -> int:
    words = sys.argv[1:] if argv is None else argv
    # Only --version and --help come before the command, so its name is the first non-option word.
    command = next((word for word in words if not word.startswith("-")), None)
    args: argparse.Namespace | None = None
    # How supervisord starts a role, and systemd and the image start `colad supervise`: the name alone,
    # nothing to parse (argparse is ~0.25 MiB per role, and ~10 ms of CPU before supervisord's exec).
    if words == [command] and command in BARE_COMMANDS:
        flags: dict[str, str | None] = dict.fromkeys(CONFIG_FLAGS)
    else:
        args = build_parser(command).parse_args(words)
        command, flags = args.command, {name: getattr(args, name) for name in CONFIG_FLAGS}
    try:
        cfg = config.load(flags)
    except ConfigError as exc:
        print(f"colad: {exc}", file=sys.stderr)
        return 2
    assert command is not None
    name = DRA_COMMANDS.get(command, COMMANDS[command][0]) if cfg.dra_mode else COMMANDS[command][0]
    module = importlib.import_module(name)
    return int(module.main(args, cfg))


if __name__ == "__main__":
    sys.exit(main())
