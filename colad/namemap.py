"""Every name colad derives from a resource name or a device ID, each by one function, and the one
check that no two configured names derive the same thing.

A resource name becomes a CDI kind, a CDI spec file and NFD label keys; a device ID a CDI device
name and a container variable. Some of these replace characters ('/' -> '-') or drop a part (the
domain under an NFD label prefix), so two names can meet: `collisions` (config.load, every role
and every reload) walks MAPPINGS and refuses such a configuration. Pure: no I/O, no logging.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass

from colad.device_rules import CDI_CLASS, CDI_VENDOR
from colad.files import MAX_NAME_BYTES, NAME_MAX_BYTES

TYPE_CHECKING = False  # typing costs a process ~0.5 MiB; no annotation is evaluated at run time
if TYPE_CHECKING:
    from collections.abc import Callable, Collection
    from typing import Final

    from colad.config import Config

# NFD's local source (source/local/local.go) puts this prefix on a feature name without one.
NFD_DEFAULT_PREFIX: Final = "feature.node.kubernetes.io"
NFD_LABEL_SUFFIXES: Final = ("present", "devices", "healthy")
CDI_MARKER_PREFIX: Final = "COLA_DEVICE_"
CDI_SPEC_PREFIX: Final = "colad-"
CDI_SPEC_SUFFIX: Final = ".json"
_UNESCAPED = re.compile(r"[^A-Za-z0-9]")


def cdi_kind_problem(resource_name: str) -> str | None:
    """Why `resource_name` cannot be a CDI kind vendor/class, or None."""
    vendor, sep, cls = resource_name.partition("/")
    if not sep:
        return f"{resource_name!r} has no '/' (a CDI kind is vendor/class)"
    if not CDI_VENDOR.match(vendor):
        return f"CDI vendor {vendor!r} must start with a letter and hold only A-Z a-z 0-9 _ - ."
    if not CDI_CLASS.match(cls):
        # A '.' needs CDI 0.6.0 (cdi.required_version), whose specs podman 4.3 ignores: no spec rather than one in vain.
        return f"CDI class {cls!r} must start with a letter and hold only A-Z a-z 0-9 _ -"
    return None


def cdi_kind(resource_name: str) -> str:
    """The CDI kind of a resource's spec: the resource name itself (one-to-one)."""
    return resource_name


def cdi_spec_file(resource_name: str) -> str:
    """The spec's file name: colad-<vendor>-<class>.json (upstream GenerateSpecName, prefixed by its writer).
    Not one-to-one ('/' and '-' both become '-'): `collisions` refuses two resources that meet here."""
    return CDI_SPEC_PREFIX + resource_name.replace("/", "-") + CDI_SPEC_SUFFIX


def cdi_device_name(resource_name: str, device_id: str) -> str:
    """The fully qualified CDI name of an advertised ID, as Allocate answers it: the ID itself after '=',
    never rewritten, so two IDs never share a name (an ID that is no CDI name gets none: cdi.name_problem)."""
    return f"{cdi_kind(resource_name)}={device_id}"


def cdi_marker_name(device_id: str) -> str:
    """COLA_DEVICE_<id>, the ID escaped injectively: every byte outside A-Z a-z 0-9 as _XX ('_' too)."""
    return CDI_MARKER_PREFIX + _UNESCAPED.sub(lambda m: "".join(f"_{b:02X}" for b in m.group().encode()), device_id)


def nfd_label_base(resource_name: str, prefix: str = "") -> str:
    """`myway5.com/cola` -> `myway5.com-cola` (NFD adds its own prefix), or `<prefix>/cola`.
    Not one-to-one: '/' becomes '-', and a prefix drops the domain (`a.com/x` and `b.com/x` meet)."""
    domain, _, name = resource_name.partition("/")
    return f"{prefix}/{name}" if prefix else f"{domain}-{name}"


def nfd_label_keys(resource_name: str, prefix: str = "") -> tuple[str, ...]:
    """The node label keys NFD makes of a resource's feature lines."""
    base = nfd_label_base(resource_name, prefix)
    full = base if prefix else f"{NFD_DEFAULT_PREFIX}/{base}"
    return tuple(f"{full}.{suffix}" for suffix in NFD_LABEL_SUFFIXES)


@dataclass(frozen=True)
class Mapping:
    """One way colad derives names of one kind (`space`) from a resource name, when `applies` to a config.

    `functions` are the functions of this module it applies; `derive` gives what the resource becomes
    (empty: nothing, e.g. a name that is no CDI kind); `problem` why one derived value cannot be used,
    or None. `keys` are the config keys it reads: a mapping is not checked when one of them was
    refused (its default would stand in).
    """

    thing: str  # what the values are, in words: "CDI spec file"
    space: str  # values in one space must not meet, whichever mapping made them
    functions: tuple[Callable[..., object], ...]
    derive: Callable[[Config, str], tuple[str, ...]]
    applies: Callable[[Config], bool]
    keys: tuple[str, ...] = ()
    problem: Callable[[str], str | None] | None = None


def _spec_path(cfg: Config, resource_name: str) -> tuple[str, ...]:
    if cdi_kind_problem(resource_name) is not None:
        return ()  # no kind, no spec
    return (os.path.join(os.path.normpath(cfg.cdi_spec_dir), cdi_spec_file(resource_name)),)


def _spec_name_problem(path: str) -> str | None:
    size = len(os.fsencode(os.path.basename(path)))
    if size <= MAX_NAME_BYTES:
        return None
    return f"is a file name of {size} bytes, over the {MAX_NAME_BYTES} colad can write (NAME_MAX {NAME_MAX_BYTES})"


def _cdi_on(cfg: Config) -> bool:
    return cfg.cdi != "off" and bool(cfg.cdi_spec_dir)


MAPPINGS: tuple[Mapping, ...] = (
    Mapping(
        "CDI kind",
        "cdi kind",
        (cdi_kind, cdi_kind_problem),
        lambda cfg, name: () if cdi_kind_problem(name) else (cdi_kind(name),),
        _cdi_on,
        ("cdi",),
    ),
    Mapping(
        "CDI spec file",
        "path",
        (cdi_spec_file,),
        _spec_path,
        _cdi_on,
        ("cdi", "cdi_spec_dir"),
        _spec_name_problem,
    ),
    Mapping(
        "NFD label",
        "nfd label",
        (nfd_label_base, nfd_label_keys),
        lambda cfg, name: nfd_label_keys(name, cfg.nfd_label_prefix),
        lambda cfg: bool(cfg.nfd_features_file),
        ("nfd_features_file", "nfd_label_prefix"),
    ),
)
# The files colad writes whose path a config key names outright: a derived path must not be one of them.
FIXED_PATHS: tuple[tuple[str, Callable[[Config], str]], ...] = (
    ("nfd_features_file", lambda cfg: cfg.nfd_features_file),
    ("the plugin state file", lambda cfg: cfg.plugin_state_file),
    ("the queue socket", lambda cfg: cfg.queue_socket),
    ("supervisord's socket", lambda cfg: cfg.supervisor_socket),
)
# How values of a space are compared. A spec directory may fold case (ext4 casefold, vfat, a
# container runtime's on another file system): "a.com/GPU" and "a.com/gpu" would be one spec file there.
_SAME: dict[str, Callable[[str], str]] = {"path": str.casefold}
# The names derived from a device ID (each one-to-one over the IDs devices.id_problem accepts and their
# replica IDs; tests/unit/test_namemap.py proves it). IDs come from files at run time, so they are
# checked by construction, not at load.
DEVICE_ID_MAPPINGS: tuple[Callable[..., str], ...] = (cdi_device_name, cdi_marker_name)


def collisions(cfg: Config, refused: Collection[str] = ()) -> list[str]:
    """Problem texts for every two owners (configured resources, or a fixed file) that one mapping, or
    two of one space, would send to the same value, and for every derived value that cannot be used.
    `refused`: config keys whose value was refused (mappings that read them are left out)."""
    owners: dict[tuple[str, str], tuple[str, str]] = {}  # (space, value compared) -> (who, value), in words
    problems: list[str] = []
    if "nfd_features_file" not in refused and "run_dir" not in refused:
        for who, path_of in FIXED_PATHS:
            if path := path_of(cfg):
                path = os.path.normpath(path)
                owners.setdefault(("path", _SAME["path"](path)), (who, path))
    for mapping in MAPPINGS:
        if set(mapping.keys) & set(refused) or not mapping.applies(cfg):
            continue
        for resource in cfg.resources:
            who = f"resource {resource.name!r}"
            for value in mapping.derive(cfg, resource.name):
                if mapping.problem is not None and (why := mapping.problem(value)) is not None:
                    problems.append(f"{who}: its {mapping.thing} {value!r} {why}")
                    continue
                held, seen = owners.setdefault((mapping.space, _SAME.get(mapping.space, str)(value)), (who, value))
                if held != who:
                    folded = "" if seen == value else f" ({seen!r} where case is folded)"
                    problems.append(f"{held} and {who} both map to the {mapping.thing} {value!r}{folded}")
                    break  # one line per pair and mapping
    return problems
