"""CDI's name rules, defined once (device_rules) and used by the spec writer and the device files.

A table and a property over random strings: device_rules.cdi_name_problem, cdi.kind_problem and
device_rules.cdi_device_name_problem agree with `upstream()`, container-device-interface pkg/parser/parser.go restated
as loops (ParseQualifiedName: split at the first '=' and '/', then ValidateVendorName,
ValidateClassName, ValidateDeviceName), as both its releases before 0.6.0 and the current one
accept (the older class takes no '.').
"""

from __future__ import annotations

import random
import string

import pytest

from colad.core import device_rules, namemap
from colad.core.allocation import allocate
from colad.core.devices import Device, DeviceSet
from tests.oracles import cdi_spec

pytestmark = pytest.mark.unit
ALNUM = set(string.ascii_letters + string.digits)


def _vendor_or_class(name: str, between: str = "_-.") -> bool:
    if not name or name[0] not in string.ascii_letters:
        return False
    if any(c not in ALNUM and c not in between for c in name[1:-1]):
        return False
    return name[-1] in ALNUM


def _device_name(name: str) -> bool:
    if not name or name[0] not in ALNUM:
        return False
    if len(name) == 1:
        return True
    if any(c not in ALNUM and c not in "_-.:" for c in name[1:-1]):
        return False
    return name[-1] in ALNUM


def upstream(name: str) -> bool:
    """ParseQualifiedName(name) succeeds in every release (before 0.6.0, ValidateClassName took no '.')."""
    if not name or name[0] == "/":
        return False
    qualifier, sep, device = name.partition("=")
    vendor, slash, cls = qualifier.partition("/")
    if not (sep and slash and vendor and cls and device):
        return False
    return _vendor_or_class(vendor) and _vendor_or_class(cls, "_-") and _device_name(device)


TABLE = [
    ("nvidia.com/gpu=0", True),
    ("nvidia.com/gpu=all", True),
    ("vendor.com/class=name", True),
    ("a/b=c", True),
    ("V_1-x.y/C-2_z=N:1.2_3-4", True),
    ("example.com/gpu.v2=0", False),  # a '.' in the class: only from CDI 0.6.0 on
    ("example.com/gpu_v2-x=0", True),
    ("myway5.com/cola=cola0::1", True),  # a replica ID
    ("myway5.com/cola=0", True),
    ("1vendor.com/gpu=0", False),  # the vendor starts with a letter
    ("vendor.com/1gpu=0", False),  # and so does the class
    ("vendor.com-/gpu=0", False),  # and each ends with a letter or digit
    ("vendor.com/gpu_=0", False),
    ("vendor.com/gpu=0-", False),  # the device name ends with a letter or digit
    ("vendor.com/gpu=-0", False),  # and starts with one
    ("vendor.com/gpu=a=b", False),  # split at the first '='
    ("vendor.com/gp/u=0", False),  # and the first '/'
    ("vendor.com/gpu=", False),
    ("vendor.com=gpu", False),
    ("/gpu=0", False),
    ("gpu=0", False),
    ("vendor.com/gpu", False),
    ("vendor.com/gpu=a b", False),
    ("vendor.com/gpu=é", False),  # ASCII only
    ("", False),
]


@pytest.mark.parametrize("name, valid", TABLE)
def test_the_table(name: str, valid: bool) -> None:
    assert upstream(name) is valid  # the table is upstream's
    assert (device_rules.cdi_name_problem(name) is None) is valid
    kind, sep, device = name.partition("=")
    if sep:  # the writer's halves of the same rule
        writer = namemap.cdi_kind_problem(kind) is None and device_rules.cdi_device_name_problem(device) is None
        assert writer is valid


def test_random_names_agree_with_upstream() -> None:
    rng = random.Random(15)
    alphabet = "aZ09._-:/=é "
    for _ in range(20_000):
        name = "".join(rng.choice(alphabet) for _ in range(rng.randint(0, 9)))
        assert (device_rules.cdi_name_problem(name) is None) is upstream(name), name
        kind, sep, device = name.partition("=")
        if sep:
            writer = namemap.cdi_kind_problem(kind) is None and device_rules.cdi_device_name_problem(device) is None
            assert writer is upstream(name), name


def test_a_dotted_class_gets_no_spec_and_no_cdi_names() -> None:
    devices = DeviceSet.of([Device("0")])
    assert cdi_spec("example.com/gpu.v2", devices) is None  # a 0.6.0 spec podman 4.3 would ignore
    assert allocate(devices, ["0"], resource_name="example.com/gpu.v2", cdi_mode="only").cdi_devices == ()
