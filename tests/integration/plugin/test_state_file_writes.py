"""One device change costs the plugin one state-file write, holding both the new list and its send.

A change is received, then its ListAndWatch send is reported ms later: the shell waits for the send
(never longer than STATE_FILE_INTERVAL) and writes once, instead of once for each. The plugin's
clock is the test's: "within the interval" is a step of that clock, never a wall-clock wait.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from colad.plugin.main import STATE_FILE_INTERVAL
from colad.plugin.registrar import ResourceRegistrar
from tests.helpers import wait_until
from tests.integration.plugin.test_state_file import DEADLINE, Shell, running

pytestmark = pytest.mark.integration


@pytest.fixture
def quiet(short_tmp: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Shell]:
    """A shell registered with one device, its file up to date, quiet for an interval since."""
    with running(short_tmp, monkeypatch) as s:
        s.send("cola-0")
        wait_until(s.settled, DEADLINE, "registered, streamed, list sent")
        s.clock.now += STATE_FILE_INTERVAL
        wait_until(lambda: s.on_disk() == s.plugin.snapshot.state, DEADLINE, "the file up to date")
        s.clock.now += STATE_FILE_INTERVAL
        yield s


def test_a_lone_change_is_written_once_with_its_send(quiet: Shell) -> None:
    before = len(quiet.writes)
    quiet.send("cola-0", "cola-1")
    quiet.wait_held(["cola-0", "cola-1"])
    wait_until(lambda: len(quiet.writes) > before, DEADLINE, "the change written, the clock still")
    wait_until(quiet.settled, DEADLINE, "the send published")
    [written] = quiet.writes[before:]
    assert written.resources[0].devices == 2 and written.resources[0].list_sent, "the one write holds the send"
    assert quiet.on_disk() == quiet.plugin.snapshot.state
    quiet.clock.now += STATE_FILE_INTERVAL  # nothing left to write: no second write for the send
    quiet.send("cola-0", "cola-1")  # the same set: an event through the loop, nothing published
    wait_until(lambda: quiet.plugin.events.empty(), DEADLINE, "the loop idle")
    assert len(quiet.writes) - before == 1


def test_without_a_stream_a_change_is_written_at_once(quiet: Shell) -> None:
    quiet.kubelet.stop()  # the stream ends: nothing is on its way to wait for
    wait_until(lambda: not quiet.plugin.snapshot.state.resources[0].streams, DEADLINE, "the stream gone")
    quiet.clock.now += STATE_FILE_INTERVAL
    before = len(quiet.writes)
    quiet.send("cola-0", "cola-1", "cola-2")
    wait_until(lambda: len(quiet.writes) > before, DEADLINE, "written without a send to wait for")
    assert quiet.on_disk().resources[0].devices == 3


def test_a_send_never_reported_delays_the_write_one_interval_at_most(
    quiet: Shell, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A stream that never reports its send (a stalled kubelet): the change is on disk one interval later."""
    monkeypatch.setattr(ResourceRegistrar, "list_sent", lambda self, generation, version: None)
    before = len(quiet.writes)
    quiet.send("cola-0", "cola-1")
    quiet.wait_held(["cola-0", "cola-1"])
    assert len(quiet.writes) == before, "waiting for the send, the clock still"
    quiet.clock.now += STATE_FILE_INTERVAL
    wait_until(lambda: len(quiet.writes) > before, DEADLINE, "written once the interval passed")
    assert quiet.on_disk().resources[0].devices == 2 and not quiet.on_disk().resources[0].list_sent
