"""Host-path watches against a host that changes while discovery adds them (real inotify).

The property test in tests/integration/discovery/test_health.py met these races about one run in three: a
change between discovery's check of the host paths and its watch being in place. Here the
change is made at exactly that moment (inside the host-path Inotify's add()), so each race
is met on every run. Discovery is stepped in the test's own thread; its periodic rescan is
an hour away, so only inotify can tell it.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from colad.core.constants import HEALTHY, UNHEALTHY
from colad.discovery.main import Discovery
from colad.queue.messages import DeviceSnapshot
from colad.watchers.inotify import Inotify
from tests.helpers import wait_until
from tests.integration.support import Inbox, Serve, begin, make_config

pytestmark = pytest.mark.integration

RESOURCE = "example.com/cola"


class RacingInotify(Inotify):
    """The host-path Inotify, with `race` run once just before the watch on `at` is added."""

    def __init__(self, count: Callable[[str], None]) -> None:
        super().__init__(count)
        self.at = ""
        self.race: Callable[[], None] | None = None
        self.adds: list[str] = []

    def add(self, path: str, mask: int) -> int | None:
        self.adds.append(path)
        if path == self.at and self.race is not None:
            race, self.race = self.race, None
            race()
        return super().add(path, mask)


@pytest.fixture
def discovery(short_tmp: Path) -> Iterator[Discovery]:
    os.mkdir(short_tmp / "devices")
    os.mkdir(short_tmp / "run", 0o700)
    role = Discovery(make_config(short_tmp, resource_name=RESOURCE, cdi="off"))
    role.health.host_inotify.close()
    role.health.host_inotify = RacingInotify(role.stats.count)
    yield role
    role.close()


def health(inbox: Inbox) -> dict[str, str]:
    snap = inbox.latest(DeviceSnapshot)
    return {} if snap is None else {d.device_id: d.health for d in snap.devices}


def settle(role: Discovery, inbox: Inbox, want: dict[str, str], what: str) -> None:
    """Step the role until the plugin side has `want` (each step waits for inotify at most 50 ms)."""

    def reached() -> bool:
        role.step(min(role.timeout(), 0.05))
        return health(inbox) == want

    wait_until(reached, 10, f"{what}: {want}")


def quiet(role: Discovery) -> None:
    """Step until no device file is racy any more: a follow-up re-read would look at the host
    paths again whatever inotify said (2 s after a write), and hide a missed event."""

    def settled() -> bool:
        role.step(min(role.timeout(), 0.05))
        return all(not rw.racy and rw.follow_up is None for rw in role.watches.values())

    wait_until(settled, 10, "the device files trusted")


def mount(path: Path) -> str:
    return f'[[mounts]]\nhost_path = "{path}"\ncontainer_path = "/m"\n'


def test_a_directory_moved_and_made_again_while_its_watch_gets_a_new_mask(
    short_tmp: Path, serve: Serve, discovery: Discovery
) -> None:
    """host/a's watch is widened (host/a/c went, so host/a is now a path's nearest parent) just
    as host/a is renamed away and made again: the rename's only news is host/a's own move
    event on the old watch, which must not be dropped with it, or the watch on host/a/b stays
    on the old inode and x made in the new host/a/b is never seen."""
    host = short_tmp / "host"
    (host / "a" / "b").mkdir(parents=True)
    (host / "a" / "c").mkdir()
    (host / "a" / "b" / "x").write_text("")
    (short_tmp / "devices" / "dev-b").write_text(mount(host / "a" / "b" / "x"))
    (short_tmp / "devices" / "dev-c").write_text(mount(host / "a" / "c" / "z"))
    _, inbox = serve(discovery.cfg.queue_socket)
    begin(discovery)
    settle(discovery, inbox, {"dev-b": HEALTHY, "dev-c": UNHEALTHY}, "the start")
    quiet(discovery)
    inotify = discovery.health.host_inotify
    assert isinstance(inotify, RacingInotify)

    def move_and_remake() -> None:
        os.rename(host / "a", short_tmp / "moved")
        (host / "a" / "b").mkdir(parents=True)

    inotify.at, inotify.race = str(host / "a"), move_and_remake
    (host / "a" / "c").rmdir()
    settle(discovery, inbox, {"dev-b": UNHEALTHY, "dev-c": UNHEALTHY}, "x moved away with host/a")
    assert inotify.race is None, f"the race was not met: watches added {inotify.adds}"
    (host / "a" / "b" / "x").write_text("")
    settle(discovery, inbox, {"dev-b": HEALTHY, "dev-c": UNHEALTHY}, "x made in the new host/a/b")
    (host / "a" / "c").mkdir()
    (host / "a" / "c" / "z").write_text("")
    settle(discovery, inbox, {"dev-b": HEALTHY, "dev-c": HEALTHY}, "z made in a new host/a/c")


def test_a_directory_gone_before_its_watch_is_added(short_tmp: Path, serve: Serve, discovery: Discovery) -> None:
    """host/a/b is renamed away and made again (so the check wants the new one watched, and
    host/a keeps watching only its own move) and removed before that watch is added: the
    failed add must send discovery back to the check, or nothing watches host/a's names and
    b and x made later are never seen."""
    host = short_tmp / "host"
    (host / "a" / "b").mkdir(parents=True)
    (short_tmp / "devices" / "dev-0").write_text(mount(host / "a" / "b" / "x"))
    _, inbox = serve(discovery.cfg.queue_socket)
    begin(discovery)
    settle(discovery, inbox, {"dev-0": UNHEALTHY}, "the start")
    quiet(discovery)
    inotify = discovery.health.host_inotify
    assert isinstance(inotify, RacingInotify)
    inotify.at, inotify.race = str(host / "a" / "b"), (host / "a" / "b").rmdir
    os.rename(host / "a" / "b", short_tmp / "moved")
    (host / "a" / "b").mkdir()
    wait_until(lambda: discovery.step(0.05) or inotify.race is None, 10, "the watch on the new host/a/b tried")
    for _ in range(5):  # whatever discovery does next, on its own
        discovery.step(min(discovery.timeout(), 0.05))
    (host / "a" / "b").mkdir()
    (host / "a" / "b" / "x").write_text("")
    settle(discovery, inbox, {"dev-0": HEALTHY}, "x made in host/a/b")


def test_a_path_under_a_regular_file_is_watched_in_the_directory_above(
    short_tmp: Path, serve: Serve, discovery: Discovery
) -> None:
    """host/file/x cannot exist while host/file is a regular file: the watch goes on host (a
    watch on the file fails, and looking again would fail the same, every turn, at once)."""
    host = short_tmp / "host"
    host.mkdir()
    (host / "file").write_text("")
    (short_tmp / "devices" / "dev-0").write_text(mount(host / "file" / "x"))
    _, inbox = serve(discovery.cfg.queue_socket)
    begin(discovery)
    settle(discovery, inbox, {"dev-0": UNHEALTHY}, "the start")
    quiet(discovery)
    inotify = discovery.health.host_inotify
    assert isinstance(inotify, RacingInotify)
    assert str(host / "file") not in inotify.adds, inotify.adds
    adds = len(inotify.adds)
    for _ in range(5):
        assert discovery.timeout() > 1.0  # nothing left to look at again
        discovery.step(0.05)
    assert len(inotify.adds) == adds, inotify.adds[adds:]
    (host / "file").unlink()
    (host / "file").mkdir()
    (host / "file" / "x").write_text("")
    settle(discovery, inbox, {"dev-0": HEALTHY}, "x made once host/file is a directory")
