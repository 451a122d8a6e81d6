"""Device IDs that differ only in characters a rewriting scheme would fold together keep a CDI name each.

Real device files in a directory, discovery over real inotify, its spec file read back from disk: the
CDI device name is the ID itself (namemap.cdi_device_name), so `gpu-a`, `gpu_a`, `gpu.a` and `GPU-a`
are four entries with their own edits; an ID that is no CDI name (`gpu-a-`) is left out with one
warning and one count, and the others are untouched by it.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from colad.config.config import Config
from colad.core import namemap
from colad.discovery.main import Discovery
from colad.queue.messages import DeviceSnapshot
from colad.queue.server import QueueServer
from tests.helpers import wait_until
from tests.integration.support import Inbox, RoleRunner, begin, make_config

pytestmark = pytest.mark.integration

RESOURCE = "example.com/gpu"
NAMED = ["gpu-a", "gpu_a", "gpu.a", "GPU-a", "gpu-a.0"]
UNNAMED = ["gpu-a-", "gpu_a_", "gpu.a."]
WARNING = "device left out of the CDI spec: Allocate gives it the classic answer"


@pytest.fixture
def served(short_tmp: Path) -> Iterator[tuple[Config, Inbox]]:
    os.mkdir(short_tmp / "devices")
    os.mkdir(short_tmp / "run", 0o700)
    cfg = make_config(short_tmp, resource_name=RESOURCE)
    inbox = Inbox()
    server = QueueServer(cfg.queue_socket, inbox.on_message)
    server.start()
    yield cfg, inbox
    server.stop()


def latest_ids(inbox: Inbox) -> set[str]:
    snapshot = inbox.latest(DeviceSnapshot)
    return set() if snapshot is None else {d.device_id for d in snapshot.devices}


def spec_entries(cfg: Config) -> dict[str, dict[str, object]]:
    try:
        document = json.loads(Path(cfg.cdi_spec_dir, namemap.cdi_spec_file(RESOURCE)).read_bytes())
    except (FileNotFoundError, ValueError):
        return {}
    return {d["name"]: d["containerEdits"] for d in document["devices"]}


def warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING and WARNING in r.getMessage()]


def test_ids_that_differ_in_one_character_keep_their_own_cdi_names_and_the_unnamed_are_counted(
    served: tuple[Config, Inbox], runners: Callable[[Discovery], RoleRunner], caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)
    cfg, inbox = served
    d = Path(cfg.device_dir)
    for device_id in NAMED + UNNAMED:
        (d / device_id).write_text(f'[envs]\nWHO = "{device_id}"\n')
    discovery = Discovery(cfg)
    runner = runners(discovery)
    begin(discovery)
    runner.start()
    wait_until(lambda: latest_ids(inbox) == set(NAMED + UNNAMED), 10, "every device advertised")
    wait_until(lambda: set(spec_entries(cfg)) == set(NAMED), 10, "the spec")
    entries = spec_entries(cfg)
    for device_id in NAMED:  # each its own edits and its own marker: nothing merged, nothing renamed
        marker = f"{namemap.cdi_marker_name(device_id)}={device_id}"
        assert entries[device_id]["env"] == [marker, f"WHO={device_id}"], device_id
    lines = warnings(caplog)
    assert len(lines) == len(UNNAMED) and all(any(f"device={u}" in line for line in lines) for u in UNNAMED)
    assert discovery.stats.counters.get("input.no_cdi_name") == len(UNNAMED)

    # A new device that is no CDI name costs one more line and count; the spec and its entries stay.
    (d / "gpu-b-").write_text("")
    (d / "gpu-b").write_text('[envs]\nWHO = "gpu-b"\n')
    wait_until(lambda: set(spec_entries(cfg)) == {*NAMED, "gpu-b"}, 10, "gpu-b in the spec")
    wait_until(lambda: "gpu-b-" in latest_ids(inbox), 10, "gpu-b- advertised")
    assert {k: v for k, v in spec_entries(cfg).items() if k != "gpu-b"} == entries
    wait_until(lambda: len(warnings(caplog)) == len(UNNAMED) + 1, 10, "one more warning")
    assert discovery.stats.counters.get("input.no_cdi_name") == len(UNNAMED) + 1

    # A content change of an unnamed device is no new line: it was said once.
    (d / "gpu-a-").write_text('[envs]\nWHO = "changed"\n')
    wait_until(
        lambda: any(dict(x.envs).get("WHO") == "changed" for x in inbox.latest(DeviceSnapshot).devices),  # type: ignore[union-attr]
        10,
        "the change",
    )
    assert len(warnings(caplog)) == len(UNNAMED) + 1
