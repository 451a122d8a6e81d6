"""Every name colad derives from a resource name or a device ID, each by one function.

A resource name becomes a CDI kind, a CDI spec file, NFD label keys and the default DRA driver name;
a device ID a CDI device name and a container variable. Some of these replace characters ('/' -> '-')
or drop a part (the domain under an NFD label prefix), so two names can meet: config.collisions (config.load, every
role and every reload) walks config.MAPPINGS, which applies these functions, and refuses such a
configuration. Pure: no I/O, no logging.
"""

from __future__ import annotations

import re

from colad.core.device_rules import CDI_CLASS, CDI_VENDOR, cdi_name
from colad.core.names import DNS1123_LABEL_MAX_LENGTH, is_dns1123_label

TYPE_CHECKING = False  # typing is not loaded at run time: docs/DEVELOPING.md, "Import cost"
if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import Final


# NFD's local source (source/local/local.go) puts this prefix on a feature name without one.
NFD_DEFAULT_PREFIX: Final = "feature.node.kubernetes.io"
NFD_LABEL_SUFFIXES: Final = ("present", "devices", "healthy")
CDI_MARKER_PREFIX: Final = "COLA_DEVICE_"
CDI_SPEC_PREFIX: Final = "colad-"
CDI_SPEC_SUFFIX: Final = ".json"
_UNESCAPED = re.compile(r"[^A-Za-z0-9]")
_NOT_IN_LABEL = re.compile(r"[^a-z0-9-]")


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
    Not one-to-one ('/' and '-' both become '-'): config.collisions refuses two resources that meet here."""
    return CDI_SPEC_PREFIX + resource_name.replace("/", "-") + CDI_SPEC_SUFFIX


def cdi_device_name(resource_name: str, device_id: str) -> str:
    """The fully qualified CDI name of an advertised ID, as Allocate answers it: the ID itself after '=',
    never rewritten, so two IDs never share a name (an ID that is no CDI name gets none:
    device_rules.cdi_device_name_problem)."""
    return cdi_name(cdi_kind(resource_name), device_id)


def cdi_marker_name(device_id: str) -> str:
    """COLA_DEVICE_<id>, the ID escaped injectively: every byte outside A-Z a-z 0-9 as _XX ('_' too)."""
    return CDI_MARKER_PREFIX + _UNESCAPED.sub(lambda m: "".join(f"_{b:02X}" for b in m.group().encode()), device_id)


def dra_device_name(device_id: str, hash_length: int = 8) -> str:
    """The DRA device name of an ID (a DNS label): the ID itself when it is one, else its lower-cased form
    with every other character as '-', cut, and `hash_length` hex digits of the ID's sha256. One-to-one
    but for a clash of hash prefixes, which slices.device_names resolves with a longer hash."""
    if is_dns1123_label(device_id):
        return device_id
    from hashlib import sha256  # only for IDs that are not DNS labels

    digest = sha256(device_id.encode("utf-8", "surrogateescape")).hexdigest()[:hash_length]
    stem = _NOT_IN_LABEL.sub("-", device_id.lower())[: DNS1123_LABEL_MAX_LENGTH - hash_length - 1].strip("-")
    return f"{stem}-{digest}" if stem else f"d{digest}"


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


def dra_driver_name(resource_name: str) -> str:
    """The DRA driver name a resource name gives when `dra_driver` is unset: myway5.com/cola -> cola.myway5.com
    (the name under its domain, as upstream drivers are named). Not one-to-one (a.b/c and b/c.a meet), but
    a daemon derives one driver only, from its first resource."""
    domain, _, name = resource_name.partition("/")
    return f"{name}.{domain}"


# The names derived from a device ID (each one-to-one over the IDs devices.id_problem accepts and their
# replica IDs; tests/unit/core/test_namemap.py proves it). IDs come from files at run time, so they are
# checked by construction, not at load.
DEVICE_ID_MAPPINGS: tuple[Callable[..., str], ...] = (cdi_device_name, cdi_marker_name, dra_device_name)
