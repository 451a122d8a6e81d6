"""Every name colad derives from a resource name or a device ID, each by one function, and the one
check that no two configured names derive the same thing.

A resource name becomes a CDI kind, a CDI spec file and NFD label keys; a device ID a CDI device
name and a container variable. Some of these replace characters ('/' -> '-') or drop a part (the
domain under an NFD label prefix), so two names can meet: `collisions` (config.load, every role
and every reload) walks MAPPINGS and refuses such a configuration; the same check compares every
path colad writes (OUTPUTS and the spec files), resolved through colad.dirpath, and keeps them out
of device directories. No logging.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass

from colad import dirpath
from colad.device_rules import CDI_CLASS, CDI_VENDOR, cdi_name
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
    return cdi_name(cdi_kind(resource_name), device_id)


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
    return (os.path.join(cfg.cdi_spec_dir, cdi_spec_file(resource_name)),)


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


@dataclass(frozen=True)
class Output:
    """A file, socket or directory colad writes at a path it takes from the config, not from a name.

    `path` reads the one definition of that path (a Config property, or a key itself); `keys` are
    the config keys it reads (not checked when one was refused). A directory may be shared with
    another directory (files and sockets never); no directory may be a device directory and no file
    an entry of one (discovery would list it as a device).
    """

    who: str  # in words, the key first: "run_dir (the queue socket)"
    path: Callable[[Config], str]
    keys: tuple[str, ...]
    directory: bool = False
    applies: Callable[[Config], bool] = lambda cfg: True


# Every path colad writes that does not derive from a resource name (those are MAPPINGS' "path" space).
# tests/unit/test_namemap.py fails when a Config path property or a join onto one of these
# directories is not here.
OUTPUTS: tuple[Output, ...] = (
    Output("nfd_features_file", lambda cfg: cfg.nfd_features_file, ("nfd_features_file",)),
    Output("run_dir", lambda cfg: cfg.run_dir, ("run_dir",), directory=True),
    Output("run_dir (the state directory)", lambda cfg: os.path.dirname(cfg.plugin_state_file), ("run_dir",), True),
    Output("run_dir (the queue socket)", lambda cfg: cfg.queue_socket, ("run_dir",)),
    Output("run_dir (supervisord's socket)", lambda cfg: cfg.supervisor_socket, ("run_dir",)),
    Output("run_dir (supervisord's config)", lambda cfg: cfg.supervisor_conf_file, ("run_dir",)),
    Output("run_dir (supervisord's pid file)", lambda cfg: cfg.supervisor_pid_file, ("run_dir",)),
    Output("run_dir (the plugin state file)", lambda cfg: cfg.plugin_state_file, ("run_dir",)),
    Output("run_dir (the status socket)", lambda cfg: cfg.status_socket, ("run_dir",)),
    Output("run_dir (the in-use state file)", lambda cfg: cfg.inuse_state_file, ("run_dir",)),
    Output("run_dir (the plugin socket record)", lambda cfg: cfg.socket_record_file, ("run_dir",)),
    Output("kubelet_dir (the plugin sockets)", lambda cfg: cfg.kubelet_dir, ("kubelet_dir",), directory=True),
    Output("cdi_spec_dir", lambda cfg: cfg.cdi_spec_dir, ("cdi", "cdi_spec_dir"), True, _cdi_on),
)
# The names derived from a device ID (each one-to-one over the IDs devices.id_problem accepts and their
# replica IDs; tests/unit/test_namemap.py proves it). IDs come from files at run time, so they are
# checked by construction, not at load.
DEVICE_ID_MAPPINGS: tuple[Callable[..., str], ...] = (cdi_device_name, cdi_marker_name)


def _where(path: str, directory: bool) -> str:
    """Where `path` leads now (dirpath's rule): a directory resolved whole, a file by its parent."""
    if directory:
        return dirpath.resolve(path)
    head, name = dirpath.entry(path)
    return os.path.join(head, name)


def collisions(cfg: Config, refused: Collection[str] = ()) -> list[str]:
    """Problem texts for every two owners (configured resources, colad's own outputs) that one mapping,
    or two of one space, would send to the same value; for every derived value that cannot be used;
    and for every output of colad that discovery would list as a device. Paths are compared where
    they lead now (colad.dirpath), a CDI spec file's case-folded too.
    `refused`: config keys whose value was refused (entries that read them are left out)."""
    owners: dict[tuple[str, str], tuple[str, str]] = {}  # (space, value compared) -> (who, value), in words
    problems: list[str] = []
    # Paths: (who, where it leads, as configured, directory?, a CDI spec file?)
    paths: list[tuple[str, str, str, bool, bool]] = []
    for out in OUTPUTS:
        if not set(out.keys) & set(refused) and out.applies(cfg) and (path := out.path(cfg)):
            paths.append((out.who, _where(path, out.directory), path, out.directory, False))
    for mapping in MAPPINGS:
        if set(mapping.keys) & set(refused) or not mapping.applies(cfg):
            continue
        for resource in cfg.resources:
            who = f"resource {resource.name!r}"
            for value in mapping.derive(cfg, resource.name):
                if mapping.problem is not None and (why := mapping.problem(value)) is not None:
                    problems.append(f"{who}: its {mapping.thing} {value!r} {why}")
                    continue
                if mapping.space == "path":
                    paths.append((who, _where(value, False), value, False, True))
                    continue
                held, seen = owners.setdefault((mapping.space, value), (who, value))
                if held != who:
                    problems.append(f"{held} and {who} both map to the {mapping.thing} {value!r}")
                    break  # one line per pair and mapping
    problems.extend(_path_clashes(paths))
    if not {"device_dir", "resources", "resource_name"} & set(refused):
        problems.extend(_in_device_dirs(cfg, paths))
    return problems


# Paths are compared where they lead now (_where), and a CDI spec file also case-folded: a spec directory may fold
# case (ext4 casefold, vfat, a container runtime's on another file system): "a.com/GPU" and "a.com/gpu"
# would be one spec file there.
def _path_clashes(paths: list[tuple[str, str, str, bool, bool]]) -> list[str]:
    """Every pair of paths that lead to one file (two directories may be one), one line per pair."""
    problems: list[str] = []
    exact: dict[str, list[int]] = {}
    folded: dict[str, list[int]] = {}
    told: set[tuple[str, str]] = set()
    for i, (who, real, _path, directory, spec) in enumerate(paths):
        same = exact.setdefault(real, [])
        near = folded.setdefault(real.casefold(), [])
        for j in dict.fromkeys(same + [j for j in near if spec or paths[j][4]]):
            held, seen, _, held_dir, _ = paths[j]
            if held == who or (directory and held_dir) or (held, who) in told:
                continue
            told.add((held, who))
            thing = "CDI spec file" if spec else "path"
            folds = "" if seen == real else f" ({seen!r} where case is folded)"
            problems.append(f"{held} and {who} both map to the {thing} {real!r}{folds}")
        same.append(i)
        near.append(i)
    return problems


def _in_device_dirs(cfg: Config, paths: list[tuple[str, str, str, bool, bool]]) -> list[str]:
    """colad's outputs that discovery would list as devices: a directory of colad's that is a device
    directory, or a file colad writes directly in one (discovery lists the regular files of a device
    directory, not its subdirectories). One line per resource and output."""
    problems: list[str] = []
    for resource in cfg.resources:
        device_dir = dirpath.resolve(resource.device_dir)
        found = [(who, real) for who, real, _, directory, _ in paths if directory and real == device_dir]
        if not found:  # else the files in that directory are found with it
            found = [
                (who, real)
                for who, real, _, directory, spec in paths
                if not (directory or spec) and device_dir in (real, os.path.dirname(real))
            ]
        for who, real in found:
            if who in ("run_dir", "kubelet_dir (the plugin sockets)"):
                continue  # config_checks.alias_problems refuses these already
            problems.append(
                f"{who} {real!r} is in the device directory {device_dir!r} of resource {resource.name!r},"
                " where colad's own files would be listed as devices"
            )
    return problems
