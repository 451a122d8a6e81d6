"""packaging/kubernetes/dra/deviceclass.yaml: the DeviceClass of colad's DRA driver (KEP-5004).

Checked against the upstream resource.k8s.io/v1 DeviceClass fields (k8s.io/api resource/v1 types.go:
DeviceClassSpec has selectors, config and extendedResourceName; a selector is one CEL expression) and
against what colad publishes: the class must name the driver colad derives from the resource name,
and its expression must hold for a device of a ResourceSlice colad would write. The CEL is read by a
pattern of the two comparisons it is made of; there is no CEL evaluator here.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

from colad.config.config import Config
from colad.core.constants import HEALTHY
from colad.core.devices import Device, DeviceSet
from colad.core.names import DEFAULT_RESOURCE_NAME, is_dns1123_subdomain
from colad.core.slices import API_VERSION, RESOURCE_ATTRIBUTE, plan, pool, slice_object

pytestmark = pytest.mark.unit
CLASS = Path(__file__).resolve().parents[3] / "packaging" / "kubernetes" / "dra" / "deviceclass.yaml"
SPEC_FIELDS = {"selectors", "config", "extendedResourceName"}
DRIVER_IS = re.compile(r'device\.driver == "([^"]+)"')
ATTRIBUTE_IS = re.compile(r'device\.attributes\["([^"]+)"\]\.(\w+) == "([^"]+)"')


@pytest.fixture(scope="module")
def device_class() -> dict[str, Any]:
    yaml = pytest.importorskip("yaml", reason="yaml is not installed (the .deb build's python3)")
    docs = list(yaml.safe_load_all(CLASS.read_text(encoding="utf-8")))
    assert len(docs) == 1 and isinstance(docs[0], dict)
    found: dict[str, Any] = docs[0]
    return found


def published_device(driver: str) -> tuple[str, dict[str, Any]]:
    """The driver and the first device of the slice colad would create for the default resource."""
    devices = DeviceSet.of([Device("cola0", HEALTHY)])
    todo = plan(driver, "node-1", [pool("node-1", DEFAULT_RESOURCE_NAME, devices)], [])
    spec = slice_object(todo.create[0], driver, "node-1", "")["spec"]
    return spec["driver"], spec["devices"][0]


def test_the_class_is_a_v1_device_class_with_upstream_fields_only(device_class: dict[str, Any]) -> None:
    assert (device_class["apiVersion"], device_class["kind"]) == (API_VERSION, "DeviceClass")
    assert set(device_class) == {"apiVersion", "kind", "metadata", "spec"}
    assert is_dns1123_subdomain(device_class["metadata"]["name"])
    assert set(device_class["spec"]) <= SPEC_FIELDS
    assert all(set(s) == {"cel"} and set(s["cel"]) == {"expression"} for s in device_class["spec"]["selectors"])


def test_the_class_serves_the_extended_resource_colad_advertises(device_class: dict[str, Any]) -> None:
    assert device_class["spec"]["extendedResourceName"] == DEFAULT_RESOURCE_NAME == Config().resources[0].name


def test_the_selector_holds_for_a_device_colad_publishes(device_class: dict[str, Any]) -> None:
    driver = Config().dra_driver_name
    expression = " ".join(s["cel"]["expression"] for s in device_class["spec"]["selectors"])
    assert DRIVER_IS.findall(expression) == [driver]
    published_driver, device = published_device(driver)
    assert published_driver == driver
    comparisons = ATTRIBUTE_IS.findall(expression)
    assert comparisons, expression
    for domain, name, value in comparisons:
        assert domain == driver, "an attribute without a domain is in the driver's"
        assert name == RESOURCE_ATTRIBUTE and device["attributes"][name] == {"string": value}


def test_the_selector_check_fails_for_another_driver(device_class: dict[str, Any]) -> None:
    expression = " ".join(s["cel"]["expression"] for s in device_class["spec"]["selectors"])
    assert DRIVER_IS.findall(expression) != [Config(dra_driver="other.example.com").dra_driver_name]
