"""A wake of the plugin's loop with nothing due publishes nothing new: the skip loses no state.

Plugin.run publishes after a timer wake only when on_timer() stepped something (an endpoint's timer,
the safety check); a wake for the state file alone does not. On the test thread, as the life-cycle
thread would: whenever on_timer() says nothing was due, a full publish() must keep the very snapshot
held (nothing moved), and every due timer must say so. A clock of the test's; real files and sockets.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from colad.core.registration import INITIAL_DEVICES_WAIT
from colad.plugin.main import SAFETY_CHECK_INTERVAL, Plugin
from tests.integration.support import make_config

pytestmark = pytest.mark.integration


def test_on_timer_says_when_it_stepped_something_and_a_quiet_wake_changes_nothing(short_tmp: Path) -> None:
    now = [1000.0]
    plugin = Plugin(make_config(short_tmp, metrics_address="", pod_resources_socket=""), clock=lambda: now[0])
    try:
        plugin.next_safety_check = now[0] + SAFETY_CHECK_INTERVAL
        plugin.publish()
        held = plugin.snapshot
        for step in (0.0, 0.01, 0.5, 1.0):  # before the endpoint's initial wait and the safety check
            now[0] = 1000.0 + step
            assert plugin.on_timer() is False
            plugin.publish()
            assert plugin.snapshot is held
        now[0] = 1000.0 + INITIAL_DEVICES_WAIT + 0.001  # the endpoint gives up waiting for devices
        assert INITIAL_DEVICES_WAIT < SAFETY_CHECK_INTERVAL
        assert plugin.on_timer() is True
        plugin.publish()
        assert plugin.snapshot is not held  # its state moved: the publish that followed was needed
        now[0] = plugin.next_safety_check + 0.001
        assert plugin.on_timer() is True  # the safety check (it binds the queue socket)
        assert plugin.sockets.queue is not None
    finally:
        plugin.shutdown()
