"""A change made as soon as the kubelet saw the previous one waits for nothing; a burst still coalesces.

Real files, real inotify, the real roles under supervisord and the strict fake kubelet. Each change's
figure is the fake kubelet's receipt stamp minus the moment before the file was written. The
yardstick is measured in the same run: the same change made after a quiet spell, when discovery,
the queue and the stream are all idle. A change that follows a delivered one must not take longer
than that by more than the run's noise: nothing of the previous change is in flight any more.
"""

from __future__ import annotations

import statistics
import time
from pathlib import Path

import pytest

from tests.fakes.kubelet import FakeKubelet
from tests.helpers import wait_until
from tests.service import ColadService

pytestmark = pytest.mark.e2e

BACK_TO_BACK = 50
LONE = 15
# Before each lone change: the previous one's own follow-up work (the kubelet's checkpoint, the
# plugin's state file, discovery's log line) is over by then. The spacing of the stimuli, not a wait.
QUIET_S = 0.1
NOISE = 2.0  # a back-to-back change may take this many times a lone one (p50)
BURST = 3000
# The bound on a burst's ListAndWatch messages: at most one per turn of discovery's loop (a turn
# publishes everything that came while the one before ran), and a turn (read the new files, send the
# delta, write the CDI spec and the log line) lasts as long as several file creations. Measured:
# about 7 files per message on a busy 2-CPU machine; one message per file would be 3,000.
FILES_PER_MESSAGE = 4


def _propagate(kubelet: FakeKubelet, device_dir: Path, name: str) -> float:
    """Create `name`; seconds until the fake kubelet received a list holding it."""
    since = len(kubelet.updates)
    started = time.monotonic()
    (device_dir / name).write_bytes(b"")
    update = wait_until(
        lambda: next((u for u in kubelet.updates[since:] if name in u.devices), None),
        10,
        f"{name} at the kubelet",
        interval=0.0005,
    )
    return update.at - started


def test_a_change_right_after_a_delivered_one_waits_for_nothing(kubelet: FakeKubelet, colad: ColadService) -> None:
    wait_until(lambda: kubelet.devices() == {"cocacola": "Healthy", "peisicola": "Healthy"}, 20, "the first list")
    lone = []
    for i in range(LONE):
        kubelet.wait_idle()
        time.sleep(QUIET_S)
        lone.append(_propagate(kubelet, colad.device_dir, f"lone-{i:02d}"))
    kubelet.wait_idle()
    back_to_back = [_propagate(kubelet, colad.device_dir, f"next-{i:02d}") for i in range(BACK_TO_BACK)]
    reference, median = statistics.median(lone), statistics.median(back_to_back)
    added = sorted(round((s - reference) * 1000, 2) for s in back_to_back)
    assert median <= NOISE * reference, (
        f"back to back p50 {median * 1000:.2f} ms against {reference * 1000:.2f} ms for a lone change: "
        f"added delay per change, ms: {added}"
    )


def test_a_burst_ends_in_the_exact_list_in_few_messages(kubelet: FakeKubelet, colad: ColadService) -> None:
    wait_until(lambda: kubelet.devices() == {"cocacola": "Healthy", "peisicola": "Healthy"}, 20, "the first list")
    kubelet.wait_idle()
    names = [f"burst-{i:05d}" for i in range(BURST)]
    expected = {"cocacola", "peisicola", *names}
    since = len(kubelet.updates)
    for name in names:
        (colad.device_dir / name).write_bytes(b"")
    full = wait_until(
        lambda: next((u for u in kubelet.updates[since:] if u.devices.keys() == expected), None),
        60,
        "the whole burst at the kubelet",
    )
    messages = sum(1 for u in kubelet.updates[since:] if u.at <= full.at)
    assert messages <= BURST // FILES_PER_MESSAGE, f"{messages} ListAndWatch messages for {BURST} files"
    wait_until(lambda: kubelet.devices() == dict.fromkeys(expected, "Healthy"), 20, "the kubelet to hold them all")
