"""A used-up kernel inotify limit degrades colad to polling; it never exits, says so once, and recovers.

colad runs under the real supervisord in a user namespace whose own inotify limits are lowered
(tests/userns.py; the machine's, shared by every root process, stay as they are). For each limit:
no role exits and no traceback (the guard), one counted WARNING per watcher role, /healthz,
/readyz, `colad status` and /metrics say degraded, a removed device leaves the kubelet's list
within the poll interval (the safety rescan is 30 s), and once the limit is lifted the roles
watch again (one INFO each) and a change is an inotify event again.
"""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from colad.core.constants import DEGRADED_POLL_S
from tests.fakes.kubelet import FakeKubelet
from tests.helpers import http_get, metrics_address, wait_until
from tests.service import ColadService
from tests.userns import InotifyLimits

pytestmark = pytest.mark.e2e
BASE = {"cocacola", "peisicola"}
ROLES = ("discovery", "kubelet-watch")
SLACK = 1.5  # a turn of the role, the queue, the plugin's publish and the kubelet's stream
LIMIT_NAMES = {"instances": "max_user_instances", "watches": "max_user_watches"}


@pytest.fixture(params=["instances", "watches"])
def limited(request: pytest.FixtureRequest, short_tmp: Path) -> Iterator[tuple[ColadService, InotifyLimits, str]]:
    which = request.param
    limits = InotifyLimits(short_tmp, **{which: 0})  # used up from the start: nothing more for this tree
    colad = ColadService(short_tmp, python=limits.python, extra_env={"COLAD_RESCAN_INTERVAL": "30"})
    colad.add(*BASE)
    colad.start()
    yield colad, limits, which
    rc = colad.stop()
    assert rc == 0, f"supervisord exited with {rc}\n" + colad.log()[-4000:]


def status(colad: ColadService) -> tuple[int, str]:
    done = subprocess.run(
        [sys.executable, "-m", "colad", "status"], env=colad.env, capture_output=True, text=True, timeout=30
    )
    return done.returncode, done.stdout


def role_lines(colad: ColadService, needle: str, role: str) -> list[str]:
    return [line for line in colad.log_lines(needle) if f"role={role}" in line]


def test_a_used_up_inotify_limit_degrades_to_polling_then_recovers(
    limited: tuple[ColadService, InotifyLimits, str], kubelet: FakeKubelet
) -> None:
    colad, limits, which = limited
    name = LIMIT_NAMES[which]
    kubelet.wait_devices(BASE, timeout=30)
    for role in ROLES:
        wait_until(lambda r=role: role_lines(colad, "inotify limit reached", r), 10, f"{role}'s warning")
    base = f"http://{metrics_address(colad.run_dir)}"
    said = f"polls every {DEGRADED_POLL_S:g}s (inotify limit fs.inotify.{name} reached)"
    code, body = wait_until(
        lambda: (r := http_get(base + "/healthz"))[1].count(said) == 2 and r, 10, "/healthz", logs=[colad.log_path]
    )
    assert code == 200 and body.startswith("ok: ") and "degraded: discovery " + said in body, body
    code, body = wait_until(lambda: (r := http_get(base + "/readyz"))[0] == 200 and r, 10, "/readyz 200")
    assert "degraded: discovery " + said in body, body
    rc, out = status(colad)
    assert rc == 0 and f"degraded: discovery {said}" in out and f"degraded: kubelet-watch {said}" in out, out
    _, metrics = http_get(base + "/metrics")
    assert f'colad_inotify_degraded{{limit="{name}",role="discovery"}} 1.0' in metrics
    assert 'colad_inotify_limit_reached_total{role="discovery"} 1.0' in metrics

    # A removed device leaves the kubelet's list within the poll interval, not the 30 s rescan.
    started = time.monotonic()
    colad.remove("peisicola")
    kubelet.wait_devices({"cocacola"}, timeout=DEGRADED_POLL_S + SLACK)
    removed_s = time.monotonic() - started
    colad.add("fanta")
    kubelet.wait_devices({"cocacola", "fanta"}, timeout=DEGRADED_POLL_S + SLACK)
    # A kubelet restart is noticed by the polling kubelet-watch as well.
    kubelet.restart()
    kubelet.wait_devices({"cocacola", "fanta"}, timeout=15)

    limits.lift()
    for role in ROLES:
        wait_until(lambda r=role: role_lines(colad, "inotify available again", r), 10, f"{role} watching again")
    wait_until(lambda: "degraded" not in http_get(base + "/healthz")[1], 10, "/healthz without degraded")
    assert "degraded:" not in status(colad)[1]
    for role in ROLES:  # said once each, for all the turns it polled
        assert len(role_lines(colad, "inotify limit reached", role)) == 1
        assert len(role_lines(colad, "inotify available again", role)) == 1
    assert "pyinotify" not in colad.log()  # pyinotify's own error lines are silenced
    _, metrics = http_get(base + "/metrics")
    assert f'colad_inotify_degraded{{limit="{name}",role="discovery"}} 0.0' in metrics
    colad.add("sprite")
    kubelet.wait_devices({"cocacola", "fanta", "sprite"}, timeout=5)
    print(f"limit={name} removed_device_left_in_s={removed_s:.2f}")


@pytest.fixture
def unlimited(short_tmp: Path) -> Iterator[tuple[ColadService, InotifyLimits]]:
    limits = InotifyLimits(short_tmp)
    colad = ColadService(short_tmp, python=limits.python, extra_env={"COLAD_RESCAN_INTERVAL": "30"})
    colad.add(*BASE)
    colad.start()
    yield colad, limits
    rc = colad.stop()
    assert rc == 0, f"supervisord exited with {rc}\n" + colad.log()[-4000:]


def test_the_watch_limit_used_up_while_running_degrades_discovery_until_lifted(
    unlimited: tuple[ColadService, InotifyLimits], kubelet: FakeKubelet
) -> None:
    colad, limits = unlimited
    kubelet.wait_devices(BASE, timeout=30)
    # kubelet-watch starts last (niced): its first look follows its watches, which the limit must find held.
    wait_until(
        lambda: colad.log_lines('proc=kubelet-watch msg="kubelet socket present"'), 10, "kubelet-watch's first look"
    )
    limits.set(watches=0)  # the watches held stay; a new one is refused
    try:
        # The device directory replaced: its new inode needs a new watch, which the limit refuses.
        colad.device_dir.rename(colad.device_dir.with_name("colas.old"))
        colad.device_dir.mkdir()
        colad.add("fanta")
        kubelet.wait_devices({"fanta"}, timeout=DEGRADED_POLL_S + SLACK)
        wait_until(lambda: role_lines(colad, "inotify limit reached", "discovery"), 10, "discovery's warning")
        colad.remove("fanta")
        kubelet.wait_devices(set(), timeout=DEGRADED_POLL_S + SLACK)  # by polling: no watch on the directory
    finally:
        limits.lift()
    wait_until(lambda: role_lines(colad, "inotify available again", "discovery"), 10, "discovery watching again")
    colad.add("sprite")
    kubelet.wait_devices({"sprite"}, timeout=5)
    assert len(role_lines(colad, "inotify limit reached", "discovery")) == 1
    assert not role_lines(colad, "inotify limit reached", "kubelet-watch")  # its watches were all held
