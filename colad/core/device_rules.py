"""The rules a device file's strings follow: text, paths, env names, annotation keys, commands, CDI names.

Each `*_problem` returns why a value would be refused downstream (by the kubelet, the container
runtime or a CDI parser) or None; devices.device_problem applies them field by field, and
colad.config.checks reuses the command rule. The CDI device name is built and split here only. `show`
and `one_line` put any value into a problem text (config, queue messages, probes too). Pure: no
I/O, no logging.
"""

from __future__ import annotations

import posixpath
import re

from colad.core.constants import MAX_DEVICE_STRING_BYTES, RESERVED_ENV_PREFIX
from colad.core.names import is_dns1123_subdomain, is_qualified_name

_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")
_CONTROL = re.compile(r"[\x00-\x1f\x7f]+")
# CDI's names, the one definition (cdi.py's spec kinds and device names, device files' cdi_devices):
# "vendor/class=name", split at the first '/' and the first '=' (container-device-interface
# pkg/parser/parser.go: ParseQualifiedName, ValidateVendorName, ValidateClassName,
# ValidateDeviceName). Vendor and class start with a letter and end with a letter or digit; the
# vendor holds A-Z a-z 0-9 _ - . between, the class A-Z a-z 0-9 _ - (a '.' in the class only from
# CDI 0.6.0 on, in specs of cdiVersion 0.6.0, which podman 4.3 ignores: every release takes the
# name without). A device name starts and ends with a letter or digit, A-Z a-z 0-9 _ - . : between.
CDI_VENDOR = re.compile(r"[A-Za-z](?:[A-Za-z0-9_.-]*[A-Za-z0-9])?\Z")
CDI_CLASS = re.compile(r"[A-Za-z](?:[A-Za-z0-9_-]*[A-Za-z0-9])?\Z")
CDI_DEVICE_NAME = re.compile(r"[A-Za-z0-9](?:[A-Za-z0-9_.:-]*[A-Za-z0-9])?\Z")


def cdi_name(kind: str, device: str) -> str:
    """The fully qualified CDI device name of `device` in `kind` (vendor/class): kind=device."""
    return f"{kind}={device}"


def split_cdi_name(name: str) -> tuple[str, str]:
    """(kind, device) of a CDI device name, split at the first '=' (the inverse of cdi_name)."""
    kind, _, device = name.partition("=")
    return kind, device


def one_line(text: str) -> str:
    """`text` for a reason or problem text: every run of control characters a blank, stripped."""
    return _CONTROL.sub(" ", text).strip()


def show(value: object, limit: int = 60) -> str:
    """A value for a problem text: repr (so no line break or invisible byte gets through), cut to `limit`."""
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def device_string_problem(value: str) -> str | None:
    """Why `value` cannot be a string sent to the kubelet (strict UTF-8, bounded, no NUL)."""
    try:
        size = len(value.encode("utf-8"))
    except UnicodeEncodeError:
        return "is not valid UTF-8"
    if size > MAX_DEVICE_STRING_BYTES:
        return f"is longer than {MAX_DEVICE_STRING_BYTES} bytes"
    if "\x00" in value:
        return "contains a NUL character"
    return None


def normalised_path_problem(path: str) -> str | None:
    """Why `path` is not an absolute, normalised path other than "/", or None."""
    problem = device_string_problem(path)
    if problem is not None:
        return problem
    if not path.startswith("/"):
        return f"{show(path)} is not an absolute path"
    if ".." in path.split("/"):
        return f"{show(path)} has a '..' component"
    if path == "/":
        return "'/' is not allowed"
    if path.startswith("//") or posixpath.normpath(path) != path:
        return f"{show(path)} is not normalised (no '.', '//' or trailing '/')"
    return None


def env_name_problem(name: str) -> str | None:
    """Why `name` cannot be a container environment variable a device file sets, or None."""
    if not _ENV_NAME.match(name) or len(name) > MAX_DEVICE_STRING_BYTES:
        return f"{show(name)} is not a valid environment variable name ([A-Za-z_][A-Za-z0-9_]*)"
    if name.startswith(RESERVED_ENV_PREFIX):
        return f"{show(name)} is reserved: colad sets the {RESERVED_ENV_PREFIX}* variables"
    return None


def annotation_key_problem(key: str) -> str | None:
    """Why `key` is not a Kubernetes qualified name ([dns-subdomain '/'] name), or None."""
    parts = key.split("/")
    name = parts[-1]
    if len(parts) > 2:
        return f"{show(key)} has more than one '/'"
    if len(parts) == 2 and not is_dns1123_subdomain(parts[0]):
        return f"{show(key)}: the prefix must be a lower-case DNS subdomain of at most 253 characters"
    if not is_qualified_name(name):
        return (
            f"{show(key)}: the name must be 1-63 characters of A-Z a-z 0-9 - _ ., "
            "starting and ending with a letter or digit"
        )
    return None


MAX_COMMAND_ARGS = 64
MAX_COMMAND_ARG_BYTES = 4096


def command_problem(command: tuple[str, ...]) -> str | None:
    """Why `command` cannot be a probe or prepare argv (run without a shell), or None; () means none."""
    if not command:
        return None
    if len(command) > MAX_COMMAND_ARGS:
        return f"has more than {MAX_COMMAND_ARGS} arguments"
    for i, arg in enumerate(command):
        if "\x00" in arg:
            return f"argument {i} contains a NUL character"
        try:
            size = len(arg.encode("utf-8"))
        except UnicodeEncodeError:
            return f"argument {i} is not valid UTF-8"
        if size > MAX_COMMAND_ARG_BYTES:
            return f"argument {i} is longer than {MAX_COMMAND_ARG_BYTES} bytes"
    if not command[0].startswith("/"):
        return "must start with the command's absolute path (it runs without a shell and without PATH lookup)"
    return None


def cdi_device_name_problem(device_id: str) -> str | None:
    """Why an advertised ID cannot be a CDI device name (IDs may end in . _ -, CDI names not)."""
    if CDI_DEVICE_NAME.match(device_id):
        return None
    return "not a CDI device name: it must end with a letter or digit"


def cdi_name_problem(name: str) -> str | None:
    """Why `name` is not a fully qualified CDI device name vendor/class=name, or None."""
    kind, device = split_cdi_name(name)
    vendor, _, cls = kind.partition("/")
    usable = CDI_VENDOR.match(vendor) and CDI_CLASS.match(cls) and CDI_DEVICE_NAME.match(device)
    if len(name) > MAX_DEVICE_STRING_BYTES or not usable:
        return f"{show(name)} is not a fully qualified CDI name vendor.com/class=name"
    return None
