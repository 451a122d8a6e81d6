"""Unit tests for colad.outputs.nfd: the feature file's contents, as NFD's local source reads them, and its writer."""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

from colad.core.constants import UNHEALTHY
from colad.core.devices import Device, DeviceSet, replicate
from colad.outputs import nfd
from tests.oracles import nfd_labels

pytestmark = pytest.mark.unit
RESOURCE = "myway5.com/cola"
LABEL_KEY = re.compile(r"(?:[a-z0-9](?:[-a-z0-9.]*[a-z0-9])?/)?[A-Za-z0-9](?:[-A-Za-z0-9_.]*[A-Za-z0-9])?\Z")
LABEL_VALUE = re.compile(r"(?:[A-Za-z0-9](?:[-A-Za-z0-9_.]*[A-Za-z0-9])?)?\Z")

SET = DeviceSet.of([Device("cocacola"), Device("peisicola"), Device("broken", UNHEALTHY)])


def test_contents() -> None:
    data = nfd.render_features([(RESOURCE, SET)])
    assert data.decode() == (
        "# Written by colad: presence and healthy counts of its resources. Do not edit.\n"
        "myway5.com-cola.present=true\n"
        "myway5.com-cola.devices=3\n"
        "myway5.com-cola.healthy=2\n"
    )
    assert nfd_labels(data) == {
        "myway5.com-cola.present": "true",
        "myway5.com-cola.devices": "3",
        "myway5.com-cola.healthy": "2",
    }


def test_replicas_count_physical_devices_and_one_unhealthy_replica_makes_its_device_unhealthy() -> None:
    replicas = replicate(SET, 4)
    assert nfd.Counts.of(replicas) == nfd.Counts(3, 2)
    some = DeviceSet.of([*replicate(DeviceSet.of([Device("a")]), 2), Device("b::0", UNHEALTHY), Device("b::1")])
    assert nfd.Counts.of(some) == nfd.Counts(2, 1)


def test_empty_resource_is_present_false_and_several_resources_are_sorted() -> None:
    labels = nfd_labels(nfd.render_features([("z.example.com/x", DeviceSet()), (RESOURCE, SET)], prefix=""))
    assert labels["z.example.com-x.present"] == "false" and labels["z.example.com-x.healthy"] == "0"
    assert list(labels)[:3] == ["myway5.com-cola.present", "myway5.com-cola.devices", "myway5.com-cola.healthy"]


def test_prefix_and_expiry() -> None:
    data = nfd.render_features([(RESOURCE, SET)], prefix="myway5.com", expires="2030-01-01T00:00:00Z")
    assert b"# +expiry-time=2030-01-01T00:00:00Z\n" in data
    assert nfd_labels(data)["myway5.com/cola.healthy"] == "2"


@pytest.mark.parametrize(
    ("resource", "prefix", "bad"),
    [
        (RESOURCE, "", False),
        (RESOURCE, "Bad_Prefix", True),
        ("example.com/" + "a" * 50, "", True),  # example.com-aaa....healthy is over 63
        ("example.com/" + "a" * 50, "example.com", False),
        ("example.com/" + "a" * 56, "example.com", True),
    ],
)
def test_label_problem(resource: str, prefix: str, bad: bool) -> None:
    assert (nfd.label_problem(resource, prefix) is not None) is bad
    labels = nfd_labels(nfd.render_features([(resource, SET)], prefix))
    assert (labels == {}) is bad
    for key, value in labels.items():
        assert LABEL_KEY.match(key) and len(key.rpartition("/")[2]) <= 63 and LABEL_VALUE.match(value), key


def test_many_resources_fit_nfds_file_limit() -> None:
    resources = [(f"example{i}.com/res{i}", SET) for i in range(300)]
    assert len(nfd.render_features(resources)) < nfd.MAX_FEATURE_FILE_BYTES


def test_writer_is_atomic_idempotent_and_hidden_while_writing(tmp_path: Path) -> None:
    path = tmp_path / "features.d" / "colad"
    writer = nfd.FeatureFileWriter(str(path))
    data = nfd.render_features([(RESOURCE, SET)])
    assert writer.write(data) is True and path.read_bytes() == data
    inode = path.stat().st_ino
    assert writer.write(data) is False and path.stat().st_ino == inode
    assert writer.write(nfd.render_features([(RESOURCE, DeviceSet())])) is True and path.stat().st_ino != inode
    assert os.listdir(path.parent) == ["colad"]  # no temporary left behind (they would be dotfiles)
    assert writer.remove() is True and not path.exists() and writer.remove() is False
