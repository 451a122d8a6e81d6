"""`colad status` while supervisord still reports STARTING, under the real supervisord.

The roles get a long startsecs (a copy of the shipped template), so the window is wide enough to
look at: before colad could register, status exits 4 ("waiting", not degraded); once registered
it exits 0 although every role is still STARTING, and says so on a `starting:` line; after
startsecs, the same 0 without it. A role that really fails is still a problem (exit 1).
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from colad.health.rule import PROGRAMS
from tests.fakes.kubelet import FakeKubelet
from tests.helpers import wait_until
from tests.service import ColadService

pytestmark = pytest.mark.e2e
TEMPLATE = Path(__file__).resolve().parents[2] / "conf" / "supervisord.conf"
STARTSECS = 15
ROLE_BLOCK = "startsecs=1\nstartretries=10\nstopsignal=TERM\nstopwaitsecs=10\n"


def status(colad: ColadService) -> tuple[int, str]:
    done = subprocess.run(
        [sys.executable, "-m", "colad", "status"], env=colad.env, capture_output=True, text=True, timeout=30
    )
    return done.returncode, done.stdout


@pytest.fixture
def slow_start(short_tmp: Path) -> Iterator[tuple[ColadService, FakeKubelet]]:
    text = TEMPLATE.read_text()
    assert text.count(ROLE_BLOCK) == len(PROGRAMS), "the template's role blocks changed: update ROLE_BLOCK"
    template = short_tmp / "supervisord.conf"
    template.write_text(text.replace(ROLE_BLOCK, ROLE_BLOCK.replace("startsecs=1", f"startsecs={STARTSECS}")))
    kubelet = FakeKubelet(short_tmp / "kubelet")  # not started yet: colad cannot register
    colad = ColadService(short_tmp, extra_env={"COLAD_SUPERVISORD_TEMPLATE": str(template)})
    colad.add("cocacola")
    colad.wait_running = lambda *args, **kwargs: {}  # type: ignore[method-assign] # STARTING is the point
    colad.start()
    yield colad, kubelet
    rc = colad.stop()
    kubelet.stop()
    assert rc == 0, f"supervisord exited with {rc}\n" + colad.log()[-4000:]
    assert kubelet.violations == []


def test_status_while_starting(slow_start: tuple[ColadService, FakeKubelet]) -> None:
    colad, kubelet = slow_start
    wait_until(
        lambda: (
            {s for s, _ in colad.states().values()} == {"STARTING"}
            and all(colad.states()[p][0] == "STARTING" for p in PROGRAMS)
        ),
        20,
        "every role STARTING",
        logs=[colad.log_path],
    )
    # No kubelet yet: the plugin retries Register. Not degraded, not ready: 4.
    rc, out = wait_until(
        lambda: (r := status(colad))[0] == 4 and "waiting: myway5.com/cola" in r[1] and r,
        20,
        "status 4 while starting",
        logs=[colad.log_path],
    )
    assert "problem:" not in out, out
    assert "starting:   discovery, kubelet-watch, plugin (within supervisord's startsecs; not a problem)" in out, out
    kubelet.start()
    kubelet.wait_devices({"cocacola"}, timeout=30)
    # Registered while every role is still STARTING: 0, and the window is named.
    rc, out = wait_until(lambda: (r := status(colad))[0] == 0 and r, 20, "status 0 once registered")
    states = colad.states()
    assert all(states[p][0] == "STARTING" for p in PROGRAMS), (states, "startsecs passed before the check")
    assert "registered: yes" in out and "starting:   " in out and "problem:" not in out and "waiting:" not in out
    # Past startsecs: RUNNING, the same answer without the note.
    wait_until(lambda: all(colad.states()[p][0] == "RUNNING" for p in PROGRAMS), STARTSECS + 20, "roles RUNNING")
    rc, out = status(colad)
    assert rc == 0 and "starting:" not in out, out
    # A role that is really down is still degraded.
    colad.expect_restart("kubelet-watch")
    colad.rpc().supervisor.stopProcess("colad:kubelet-watch")
    rc, out = status(colad)
    assert rc == 1 and "problem: kubelet-watch is STOPPED" in out, out
    colad.rpc().supervisor.startProcess("colad:kubelet-watch", False)  # no wait: it is STARTING for startsecs
    rc, out = wait_until(lambda: (r := status(colad))[0] == 0 and r, 20, "status 0 with kubelet-watch STARTING")
    assert "starting:   kubelet-watch" in out, out
