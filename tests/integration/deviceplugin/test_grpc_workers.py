"""gRPC's worker pool at a task limit: a thread that cannot start leaves the call queued, never raises.

The pool runs in a child Python moved into a pids cgroup whose pids.max leaves room for one worker.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

from tests.limits import pids_group, threads_of

pytestmark = pytest.mark.integration

CHILD = textwrap.dedent(
    """
    import sys, threading
    from colad.deviceplugin.service import Workers

    sys.stdout.write("ready\\n"); sys.stdout.flush()
    sys.stdin.readline()  # moved into the group meanwhile
    release = threading.Event()
    pool = Workers(4, "grpc")
    calls = [pool.submit(release.wait, 10) for _ in range(3)]  # the 2nd and 3rd find no thread to start
    started = pool.start_failures
    release.set()
    done = [call.result(timeout=10) for call in calls]
    print(f"failures={started} threads={len(pool._threads)} done={done}")
    """
)


def test_calls_wait_for_a_worker_when_no_thread_can_start() -> None:
    child = subprocess.Popen(
        [sys.executable, "-c", CHILD], stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    try:
        assert child.stdout is not None and child.stdin is not None
        assert child.stdout.readline() == "ready\n"
        with pids_group("colad-workers", [child.pid], threads_of(child.pid) + 1):
            child.stdin.write("go\n")
            child.stdin.flush()
            out, err = child.communicate(timeout=30)
    finally:
        child.kill()
        child.wait()
    assert child.returncode == 0, err
    assert "Traceback" not in err
    assert out.strip() == "failures=2 threads=1 done=[True, True, True]", err
    assert "gRPC worker not started" in err
