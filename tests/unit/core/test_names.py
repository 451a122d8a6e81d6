"""names.py's resource-name rule agrees with the fake kubelet's own copy on every input class.

tests/fakes/kubelet.py keeps the kubelet's rule written apart from colad's on purpose; this
fuzzes names near every edge of it (lengths 63/253, dots, dashes, case, '/', the forbidden
prefixes, non-ASCII) and requires one verdict from both. Seeded, so a failure reproduces.
"""

from __future__ import annotations

import random

import pytest

from colad.config import config
from colad.core import names
from colad.core.namemap import dra_driver_name
from tests.fakes.kubelet import is_extended_resource_name
from tests.fakes.pluginwatcher import is_driver_name

pytestmark = pytest.mark.unit

_PIECES = ["a", "z", "0", "9", "A", "-", ".", "_", "/", "é", " ", "requests.", "kubernetes.io/", "k8s.io"]


def _fuzzed(rng: random.Random) -> str:
    shape = rng.randrange(4)
    if shape == 0:  # anything from the pieces
        return "".join(rng.choice(_PIECES) for _ in range(rng.randrange(12)))
    label = "".join(rng.choice("abz09-") for _ in range(rng.randrange(1, 8)))
    domain = ".".join([label] * rng.randrange(1, 4))
    if shape == 1:  # a domain near the 253 limit ("requests." counts)
        domain = (domain + ".") * (rng.randrange(200, 260) // (len(domain) + 1)) + "io"
    short = "".join(rng.choice("aZ09-_.") for _ in range(rng.randrange(0, 70)))
    if shape == 2 and short:  # a name near the 63 limit
        short = "x" + short[1:]
    return f"{domain}/{short}"


@pytest.mark.parametrize(
    "name",
    [
        pytest.param(names.DEFAULT_RESOURCE_NAME, id="default"),
        pytest.param("a" * 244 + "/x", id="prefix-253-with-requests."),
        pytest.param("a" * 245 + "/x", id="prefix-254-with-requests."),
        pytest.param("example.com/" + "x" * 63, id="name-63"),
        pytest.param("example.com/" + "x" * 64, id="name-64"),
        pytest.param("example.com/-x", id="name-starts-with-dash"),
        pytest.param("Example.com/x", id="upper-case-domain"),
        pytest.param("example.com/a/b", id="two-slashes"),
        pytest.param("requests.example.com/x", id="requests-prefix"),
        pytest.param("x.kubernetes.io/x", id="kubernetes-io"),
        pytest.param("/x", id="empty-domain"),
        pytest.param("example.com/", id="empty-name"),
        pytest.param("exampl\u00e9.com/x", id="non-ascii"),
    ],
)
def test_the_rule_at_its_edges_agrees_with_the_kubelet(name: str) -> None:
    assert (names.resource_name_problem(name) is None) is is_extended_resource_name(name)


def test_fuzzed_names_get_the_kubelets_verdict() -> None:
    rng = random.Random(13)
    verdicts = {True: 0, False: 0}
    for _ in range(20_000):
        name = _fuzzed(rng)
        accepted = is_extended_resource_name(name)
        assert (names.resource_name_problem(name) is None) is accepted, name
        verdicts[accepted] += 1
    assert min(verdicts.values()) > 1000  # both sides of the rule were reached


def test_config_uses_the_one_rule() -> None:
    assert config.resource_name_problem is names.resource_name_problem
    assert config.Config().resource_name == names.DEFAULT_RESOURCE_NAME


@pytest.mark.parametrize(
    "name",
    [
        pytest.param("cola.myway5.com", id="derived-default"),
        pytest.param("d" * 63, id="63"),
        pytest.param("d" * 64, id="64"),
        pytest.param("Cola.example.com", id="upper-case"),
        pytest.param("cola_x.example.com", id="underscore"),
        pytest.param("-cola.example.com", id="leading-dash"),
        pytest.param("cola..example.com", id="empty-label"),
        pytest.param("myway5.com/cola", id="a-resource-name"),
        pytest.param("", id="empty"),
    ],
)
def test_the_driver_name_rule_agrees_with_the_fake_kubelets(name: str) -> None:
    assert (names.driver_name_problem(name) is None) is is_driver_name(name)


def test_every_driver_name_derived_from_a_fuzzed_resource_name_gets_the_fake_kubelets_verdict() -> None:
    rng = random.Random(29)
    verdicts = {True: 0, False: 0}
    for _ in range(20_000):
        name = _fuzzed(rng)
        if names.resource_name_problem(name) is not None:
            continue
        driver = dra_driver_name(name)
        accepted = is_driver_name(driver)
        assert (names.driver_name_problem(driver) is None) is accepted, driver
        verdicts[accepted] += 1
    assert min(verdicts.values()) > 100  # both sides of the rule were reached
