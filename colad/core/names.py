"""The Kubernetes name rules colad applies, and the default resource name, each written once.

The kubelet refuses a Register whose resource name is not an extended-resource name, and
the API server an annotation key that is not a qualified name, a driver or a node name out of
its rules: config.py, messages.py and kubelet_sim.py check the first, devices.py the second. Device and replica IDs are
devices.py's; allocation.py applies the replica policy and CDI mode names defined here. Pure: no I/O.
"""

from __future__ import annotations

import re

TYPE_CHECKING = False  # typing is not loaded at run time: docs/DEVELOPING.md, "Import cost"
if TYPE_CHECKING:
    from typing import Final

DEFAULT_RESOURCE_NAME: Final = "myway5.com/cola"
# The config's words for allocation.py's choices. Here, not in allocation.py, so that loading a
# config (every role does) never imports the allocation core and the device model with it.
# How GetPreferredAllocation places replicas: "spread" over devices (the default), or "pack" onto few.
REPLICA_POLICIES: Final = ("spread", "pack")
DEFAULT_REPLICA_POLICY: Final = REPLICA_POLICIES[0]
# Allocate's CDI answer (the config key `cdi`): "both" = the classic answer plus a CDI name per
# device, "only" = CDI names in place of what the spec carries, "off" = no CDI names of colad's.
CDI_MODES: Final = ("both", "only", "off")
# The config's `mode`: the kubelet API colad serves its devices through (device plugin v1beta1, or DRA).
MODES: Final = ("device-plugin", "dra")
DEFAULT_MODE: Final = MODES[0]
DRA_MODE: Final = MODES[1]

# k8s.io/apimachinery pkg/util/validation/validation.go: IsDNS1123Subdomain (DNS1123SubdomainMaxLength)
# and the name part of IsQualifiedName (qualifiedNameMaxLength).
DNS1123_SUBDOMAIN_MAX_LENGTH: Final = 253
QUALIFIED_NAME_MAX_LENGTH: Final = 63
# k8s.io/kubernetes pkg/apis/storage/validation ValidateCSIDriverName, which ResourceSlice spec.driver is
# validated with (pkg/apis/resource/validation validateDriverName); k8s.io/api resource/v1 DriverNameMaxLength.
DRIVER_NAME_MAX_LENGTH: Final = 63
_DNS1123_SUBDOMAIN = re.compile(r"[a-z0-9](?:[-a-z0-9]*[a-z0-9])?(?:\.[a-z0-9](?:[-a-z0-9]*[a-z0-9])?)*\Z")
# IsDNS1123Label (DNS1123LabelMaxLength): what a DRA device name must be (resource validation.go).
DNS1123_LABEL_MAX_LENGTH: Final = 63
_DNS1123_LABEL = re.compile(r"[a-z0-9](?:[-a-z0-9]*[a-z0-9])?\Z")
_QUALIFIED_NAME = re.compile(r"(?:[A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]\Z")


def is_dns1123_subdomain(value: str) -> bool:
    """Lower-case DNS labels joined by '.', 1 to 253 characters."""
    return len(value) <= DNS1123_SUBDOMAIN_MAX_LENGTH and _DNS1123_SUBDOMAIN.match(value) is not None


def is_dns1123_label(value: str) -> bool:
    """Lower-case letters, digits and '-', 1 to 63 characters, starting and ending alphanumeric."""
    return len(value) <= DNS1123_LABEL_MAX_LENGTH and _DNS1123_LABEL.match(value) is not None


def is_qualified_name(value: str) -> bool:
    """The name part of a qualified name: 1 to 63 of [A-Za-z0-9._-], starting and ending alphanumeric."""
    return len(value) <= QUALIFIED_NAME_MAX_LENGTH and _QUALIFIED_NAME.match(value) is not None


def resource_name_problem(name: str) -> str | None:
    """Why the kubelet would refuse this resource name at Register, or None.

    pkg/apis/core/v1/helper IsExtendedResourceName: a domain prefix outside kubernetes.io/,
    and "requests." + name a qualified name.
    """
    if "/" not in name:
        return "must have a domain prefix, e.g. example.com/cola"
    if "kubernetes.io/" in name:
        return "must not use the kubernetes.io/ prefix"
    if name.startswith("requests."):
        return "must not start with requests."
    prefix, _, short = ("requests." + name).rpartition("/")
    if "/" in prefix or not is_dns1123_subdomain(prefix):
        return "prefix must be a lowercase DNS subdomain"
    if not is_qualified_name(short):
        return "name must be at most 63 characters of [A-Za-z0-9._-], starting and ending alphanumeric"
    return None


def driver_name_problem(name: str) -> str | None:
    """Why the API server would refuse `name` as a ResourceSlice's driver, or None.

    Upstream lower-cases before its DNS check; resource/v1 types.go asks for lower case, and colad
    keeps to it: the name is also a directory and a socket name on the node.
    """
    if len(name) > DRIVER_NAME_MAX_LENGTH:
        return f"must be at most {DRIVER_NAME_MAX_LENGTH} characters"
    if not is_dns1123_subdomain(name):
        return "must be a lowercase DNS subdomain, e.g. cola.example.com"
    return None


def node_name_problem(name: str) -> str | None:
    """Why `name` cannot be a Node's name (pkg/apis/core/validation ValidateNodeName: a DNS subdomain), or None."""
    return None if is_dns1123_subdomain(name) else "must be a lowercase DNS subdomain (a Kubernetes node name)"
