"""The degraded mode of a watcher role, as its Stats carry it, in /healthz and /readyz. Pure."""

from __future__ import annotations

import pytest

from colad import constants
from colad.plugin_health import Published, degraded, readiness, verdict
from colad.statefile import PluginState, ResourceState


@pytest.mark.parametrize(
    ("counters", "said"),
    [
        pytest.param((), "", id="no-counters"),
        pytest.param(((constants.INOTIFY_DEGRADED + "max_user_watches", 0),), "", id="left"),
        pytest.param(((constants.INOTIFY_LIMIT_REACHED, 3),), "", id="only-the-count"),
        pytest.param(
            ((constants.INOTIFY_DEGRADED + "max_user_instances", 1),),
            "discovery polls every 1s (inotify limit fs.inotify.max_user_instances reached)",
            id="instances",
        ),
    ],
)
def test_degraded_reads_the_roles_stats(counters: tuple[tuple[str, int], ...], said: str) -> None:
    assert degraded("discovery", counters) == said


def test_degraded_is_healthy_and_ready_and_says_so() -> None:
    resource = ResourceState(
        name="example.com/dev", registered=True, streams=1, have_devices=True, list_sent=True, kubelet="k", devices=2
    )
    text = "discovery polls every 1s (inotify limit fs.inotify.max_user_watches reached)"
    state = PluginState(pid=1, resources=(resource,), kubelet="k", degraded=(text,))
    published = Published(state, discovery_heard=0.0, rescan_interval=30.0)
    ok, reason = verdict(published, [], now=1.0)
    assert ok and reason.endswith("; degraded: " + text), reason
    ready, why = readiness(published, now=1.0)
    assert ready and why.endswith("; degraded: " + text), why
