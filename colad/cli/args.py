"""Extra command-line flags of the operator subcommands (the roles take only config flags).

`<command>_flags(parser)` adds the flags of `colad <command>`; cli.main looks it up by that name.
Kept apart from the subcommand modules so `colad --help` imports nothing heavy.
"""

from __future__ import annotations

import argparse
import os

from colad.core.constants import GRPC_UNSAFE_PATH_CHARS, SUN_PATH_MAX_BYTES


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds") from None
    if not value > 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"{text!r} must be a positive number of seconds")
    return value


def _socket_path(text: str) -> str:
    try:
        size = len(os.path.abspath(text).encode("utf-8"))
    except UnicodeEncodeError:
        raise argparse.ArgumentTypeError(f"{text!r} is not valid UTF-8") from None
    if not text.isprintable() or set(text) & set(GRPC_UNSAFE_PATH_CHARS):
        raise argparse.ArgumentTypeError(f"{text!r}: no control characters or any of {GRPC_UNSAFE_PATH_CHARS!r}")
    if size > SUN_PATH_MAX_BYTES:
        raise argparse.ArgumentTypeError(f"{text!r} is {size} bytes, over the {SUN_PATH_MAX_BYTES} of a socket path")
    return text


def status_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", action="store_true", help="print JSON instead of a table")


def kubelet_sim_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--allocate",
        type=int,
        default=1,
        metavar="N",
        help="after the first device list, Allocate N healthy devices (0: none)",
    )
    parser.add_argument(
        "--once", action="store_true", help="exit 0 after the first Allocate answer (or first list if --allocate 0)"
    )
    parser.add_argument(
        "--timeout", type=float, default=0.0, help="with --once: exit 1 if nothing happened within this many seconds"
    )
    parser.add_argument(
        "--json", action="store_true", help="print one JSON object per event on stdout (log lines go to stderr)"
    )


def check_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of a table")
    parser.add_argument(
        "--socket",
        metavar="PATH",
        default=None,
        type=_socket_path,
        help="check this plugin socket only (default: every colad-*.sock in the kubelet directory)",
    )
    parser.add_argument(
        "--timeout",
        type=_seconds,
        default=5.0,
        metavar="SECONDS",
        help="deadline of each call to the plugin (default 5)",
    )
