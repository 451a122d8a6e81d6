"""The checks behind config.load(): why one configuration value would fail in a running colad.

Each `*_problem` takes a converted value and returns the end of a problem text (config.py
prefixes the key, its source and the value) or None. They cover what the OS, gRPC,
supervisord and the kubelet would refuse: paths and socket lengths, metrics addresses,
a TOML file that would parse for seconds, directories that alias one another. No logging.
The checks that read a whole Config are config.py's.
"""

from __future__ import annotations

import ipaddress
import os
import re
import stat
from collections.abc import Callable, Sequence

from colad.core import constants
from colad.core.device_rules import command_problem, show
from colad.core.names import REPLICA_POLICIES
from colad.runtime import dirpath

LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR")
# The kubelet gives PreStartContainer 30 s (k8s.io/kubelet pkg/apis/deviceplugin/v1beta1/constants.go
# KubeletPreStartContainerRPCTimeoutInSecs); colad's own deadline must end first, so the kubelet
# gets colad's answer (naming the device and the reason) rather than its own DeadlineExceeded.
PRE_START_DEADLINE = 30.0
PRE_START_MARGIN = 2.0  # killing the command's process group and answering take this at most
MAX_PROBES_IN_FLIGHT = 64
SHOWN_CHARS = 80  # a config value or key in a problem text is cut to this


def show_key(key: str) -> str:
    """A key or variable name for a problem text: as it is when short and printable, else its repr."""
    return key if key.isprintable() and len(key) <= SHOWN_CHARS else show(key, SHOWN_CHARS)


def show_path(path: str) -> str:
    """A file path for a problem text: as it is when printable, else its repr."""
    return path if path.isprintable() else repr(path)


def printable_text_problem(value: str) -> str | None:
    """Why a path or name cannot pass through the OS, inotify, gRPC and the logs as text, or None."""
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        return "is not valid UTF-8 (a byte that is not UTF-8 came in through the environment or a flag)"
    if "\x00" in value:
        return "contains a NUL byte"
    if not value.isprintable():
        return "contains a control or invisible character"
    return None


def absolute_path_problem(value: str) -> str | None:
    return printable_text_problem(value) or (None if os.path.isabs(value) else "must be an absolute path")


# run_dir is written into supervisord.conf: supervisord expands %(name)s in its values, strips
# surrounding blanks and ends a value at " ;" or " #".
_SUPERVISORD_UNSAFE = "%"
_STAMP = "0" * constants.PLUGIN_SOCKET_STAMP_DIGITS
_PID = "0" * constants.PID_MAX_DIGITS
# The sockets colad binds or dials in each directory: (name as shown, longest name).
_DIR_SOCKETS: dict[str, tuple[tuple[str, str], ...]] = {
    "kubelet_dir": (
        (
            f"{constants.PLUGIN_SOCKET_PREFIX}<unix ms>{constants.PLUGIN_SOCKET_SUFFIX}",
            f"{constants.PLUGIN_SOCKET_PREFIX}{_STAMP}{constants.PLUGIN_SOCKET_SUFFIX}",
        ),
        (constants.KUBELET_SOCKET_NAME, constants.KUBELET_SOCKET_NAME),
    ),
    "run_dir": (
        (f"{constants.QUEUE_SOCKET_NAME}.<pid>.tmp", f"{constants.QUEUE_SOCKET_NAME}.{_PID}.tmp"),  # queue/server.py
        (f"{constants.SUPERVISOR_SOCKET_NAME}.<pid>", f"{constants.SUPERVISOR_SOCKET_NAME}.{_PID}"),  # supervisor's
        (constants.STATUS_SOCKET_NAME, constants.STATUS_SOCKET_NAME),  # status_socket.py
    ),
}


def _socket_length_problem(path: str, shown: str) -> str | None:
    size = len(os.fsencode(path))
    if size <= constants.SUN_PATH_MAX_BYTES:
        return None
    limit = constants.SUN_PATH_MAX_BYTES
    return f"gives the socket path {shown} of {size} bytes, over the {limit} a Unix socket allows"


# Directories of sockets that gRPC binds or dials; the others' sockets are colad's own or supervisord's.
GRPC_SOCKET_DIRS = ("kubelet_dir", "plugins_registry_dir", "plugins_dir")


def socket_dir_problem(key: str) -> Callable[[str], str | None]:
    """A check of a directory in which colad binds or dials sockets: those of _DIR_SOCKETS[key] are checked
    for length here; a DRA socket's name holds the driver name, so config.py checks those paths."""

    def check(value: str) -> str | None:
        if problem := absolute_path_problem(value):
            return problem
        grpc = key in GRPC_SOCKET_DIRS
        if bad := "".join(sorted(set(value) & set(constants.GRPC_UNSAFE_PATH_CHARS if grpc else _SUPERVISORD_UNSAFE))):
            why = "gRPC reads unix:<path> as a URI" if grpc else "supervisord.conf cannot carry it"
            return f"must not contain {bad!r} ({why})"
        if key == "run_dir" and any(c.isspace() for c in value):
            return "must not contain blanks (supervisord.conf cannot carry them)"
        for shown, name in _DIR_SOCKETS.get(key, ()):
            if problem := _socket_length_problem(os.path.join(value, name), os.path.join("<dir>", shown)):
                return problem
        return None

    return check


def socket_file_problem(value: str) -> str | None:
    if problem := absolute_path_problem(value):
        return problem
    if bad := "".join(sorted(set(value) & set(constants.GRPC_UNSAFE_PATH_CHARS))):
        return f"must not contain {bad!r} (gRPC reads unix:<path> as a URI)"
    if value.endswith("/"):
        return "must name a socket, not a directory"
    return _socket_length_problem(value, "")


_HOST_LABEL = re.compile(r"[A-Za-z0-9]([-A-Za-z0-9]{0,61}[A-Za-z0-9])?\Z")
# An interface name (IFNAMSIZ 16 with the NUL) as an IPv6 scope, e.g. [fe80::1%eth0].
_SCOPE = re.compile(r"[A-Za-z0-9_.:-]{1,15}\Z")


def _host_problem(host: str) -> str | None:
    """Why the metrics server could not even try to bind `host`, or None (an unknown name is retried)."""
    if host.startswith("[") and host.endswith("]"):
        address, _, scope = host[1:-1].partition("%")
        try:
            ipaddress.IPv6Address(address)
        except ValueError:
            return "host in brackets must be an IPv6 address, e.g. [::1]:9647"
        return None if not scope or _SCOPE.match(scope) else "IPv6 scope must be an interface name"
    if re.fullmatch(r"[0-9.]+", host):
        try:
            ipaddress.IPv4Address(host)
        except ValueError:
            return "host is not an IPv4 address"
        return None
    name = host[:-1] if host.endswith(".") else host
    # socket.getaddrinfo encodes a name with the idna codec, which raises (not OSError) on a
    # label over 63 characters or an empty one.
    if len(name) > 253 or not all(_HOST_LABEL.match(label) for label in name.split(".")):
        return "host must be an IP address or a DNS name of letters, digits and '-'"
    return None


def address_problem(value: str) -> str | None:
    """Why `value` is not a host:port the metrics server can bind, or None."""
    host, sep, port = value.rpartition(":")
    bracketed = host.startswith("[") and host.endswith("]")
    if ("[" in host or "]" in host or ":" in host) and not bracketed:
        return "IPv6 hosts go in brackets, e.g. [::1]:9647"
    if not sep or not host:
        return "must be host:port"
    if not re.fullmatch(r"[0-9]{1,5}", port) or not 0 <= int(port) <= 65535:
        return "port must be a number from 0 to 65535"
    return printable_text_problem(value) or _host_problem(host)


def level_problem(value: str) -> str | None:
    return None if value.upper() in LOG_LEVELS else "must be one of " + ", ".join(LOG_LEVELS)


def positive_problem(value: float) -> str | None:
    return None if 0 < value < 86400 else "must be a number of seconds greater than 0 and less than a day"


def printable_command_problem(value: tuple[str, ...]) -> str | None:
    """Why `value` cannot be a probe or prepare command, or None (device_rules.command_problem, plus text rules)."""
    for i, arg in enumerate(value):
        if problem := printable_text_problem(arg):
            return f"argument {i} {problem}"
    return command_problem(value)


MAX_TRUSTED_OWNERS = 64
MAX_UID = 2**32 - 2  # (uid_t)-1 is no user: chown's "leave unchanged"


def _owner_uid(owner: str) -> int | None:
    """The uid `owner` (a user name, or a uid in decimal) names on this host, or None."""
    if owner.isascii() and owner.isdigit():
        uid = int(owner)
        return uid if uid <= MAX_UID else None
    import pwd  # noqa: PLC0415 - only for a config that names a user

    try:
        return pwd.getpwnam(owner).pw_uid
    except (KeyError, ValueError, UnicodeEncodeError):  # ValueError: an embedded NUL
        return None


def owners_problem(value: tuple[str, ...]) -> str | None:
    """Why `value` is not a list of users (names known on this host, or uids), or None."""
    if len(value) > MAX_TRUSTED_OWNERS:
        return f"has more than {MAX_TRUSTED_OWNERS} entries"
    for owner in value:
        if _owner_uid(owner) is None:
            return f"names {show(owner, SHOWN_CHARS)}, which is neither a user of this host nor a uid 0..{MAX_UID}"
    return None


def owner_uids(value: tuple[str, ...]) -> tuple[str, ...]:
    """`value` (checked by owners_problem) as the uids it names, in decimal, sorted, each once."""
    return tuple(str(uid) for uid in sorted({_owner_uid(owner) or 0 for owner in value}))


def prepare_timeout_problem(value: float) -> str | None:
    limit = PRE_START_DEADLINE - PRE_START_MARGIN
    if 0 < value <= limit:
        return None
    wait = f"the kubelet waits {PRE_START_DEADLINE:g} s"
    return f"must be a number of seconds greater than 0 and at most {limit:g} ({wait})"


def in_flight_problem(value: int) -> str | None:
    return None if 1 <= value <= MAX_PROBES_IN_FLIGHT else f"must be a whole number from 1 to {MAX_PROBES_IN_FLIGHT}"


def spec_dir_problem(value: str) -> str | None:
    if problem := absolute_path_problem(value):
        return problem
    return "must not be '/'" if os.path.normpath(value) == "/" else None


def label_prefix_problem(value: str) -> str | None:
    """Why `value` cannot prefix colad's NFD labels ("" = NFD's feature.node.kubernetes.io), or None."""
    if value == "":
        return None
    from colad.outputs.nfd import label_problem  # only for a set prefix: loading a config imports no device model

    return label_problem("example.com/x", value)


def expiry_problem(value: float) -> str | None:
    return None if 60 <= value < 86400 else "must be a number of seconds from 60 to less than 86400 (a day)"


def policy_problem(value: str) -> str | None:
    return None if value in REPLICA_POLICIES else "must be one of " + ", ".join(REPLICA_POLICIES)


def bare_dots(text: str) -> int:
    """Dots outside TOML strings and comments (the parts of dotted keys, and floats); linear time."""
    dots = i = 0
    special = re.compile(r"[.#\"']")
    while (match := special.search(text, i)) is not None:
        char, i = match.group(), match.start()
        if char == ".":
            dots, i = dots + 1, i + 1
            continue
        if char == "#":
            end = text.find("\n", i)
        else:
            quote = char * 3 if text.startswith(char * 3, i) else char
            end = _string_end(text, i + len(quote), quote)
        if end < 0:  # runs to the end of the file (tomllib refuses it if unterminated)
            break
        i = end
    return dots


def _string_end(text: str, start: int, quote: str) -> int:
    """The index after the string closed by `quote` from `start`; -1 if it never closes."""
    i = start
    while True:
        end = text.find(quote, i)
        if end < 0:
            return -1
        if quote[0] == '"':  # basic strings: an odd run of backslashes escapes the quote
            run = len(text[i:end]) - len(text[i:end].rstrip("\\"))
            if run % 2:
                i = end + 1
                continue
        if len(quote) == 1 and "\n" in text[start:end]:
            return text.index("\n", start)  # a one-line string cannot span lines: invalid, stop there
        return end + len(quote)


# A directory as the problem texts name it: (key, where its value came from, the path as given).
Named = tuple[str, str, str]


def _place(path: str) -> tuple[str, tuple[int, int] | None]:
    """A directory's resolved path (symlinks, '.', '..', '//' and a trailing '/' gone) and, if it
    exists, its (st_dev, st_ino): two spellings, a symlink or a bind mount of one directory match."""
    real = dirpath.resolve(path)  # the rule discovery watches and lists by
    try:
        st = os.stat(real)
    except (OSError, ValueError):  # absent, unreadable; ValueError: a NUL (refused elsewhere)
        return real, None
    return real, (st.st_dev, st.st_ino) if stat.S_ISDIR(st.st_mode) else None


def alias_problems(dirs: Sequence[Named], own: Sequence[Named]) -> list[str]:
    """Device directories (`dirs`) that alias or nest in one another, or that are one of `own`.

    One physical device in two resources could be allocated twice; in a nested directory,
    in-place edits would go unseen (discovery watches each directory, not its subdirectories).
    `own` are colad's own directories (run_dir, kubelet_dir), whose files are not devices.
    """
    places = [_place(path) for _, _, path in dirs]
    own_places = [(key, source, _place(path)) for key, source, path in own]
    problems: list[str] = []
    for j, ((key, source, path), (real, ident)) in enumerate(zip(dirs, places, strict=True)):
        for (other_key, _, other_path), (other_real, other_ident) in zip(dirs[:j], places[:j], strict=True):
            common = os.path.commonpath([real, other_real])
            if real == other_real or (ident is not None and ident == other_ident):
                how = "is used by more than one resource: it is the same directory as"
            elif common == other_real:
                how = "is inside the directory of"
            elif common == real:
                how = "contains the directory of"
            else:
                continue
            problems.append(
                f"{key} ({source}): {show(path, SHOWN_CHARS)} {how} {other_key} {show(other_path, SHOWN_CHARS)}"
            )
        for own_key, own_source, (own_real, own_ident) in own_places:
            if real == own_real or (ident is not None and ident == own_ident):
                problems.append(
                    f"{key} ({source}): {show(path, SHOWN_CHARS)} is also the {own_key} ({own_source}),"
                    " whose files are colad's own, not devices"
                )
    return problems
