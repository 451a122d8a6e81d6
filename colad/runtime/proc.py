"""Process-level behaviour shared by the roles: dying with supervisord, a root-only umask, reload, state files.

If supervisord is killed (even with SIGKILL) its children would live on, and
the next supervisord would start a second set that finds the sockets taken.
PR_SET_PDEATHSIG makes the kernel send each role SIGTERM when its parent dies.
Nothing here assumes who the parent is: in a container supervisord is PID 1.
"""

from __future__ import annotations

import ctypes
import os
import signal

from colad.runtime import log

LOG = log.get(__name__)
PR_SET_PDEATHSIG = 1  # <linux/prctl.h>


def die_with_parent(sig: int = signal.SIGTERM) -> None:
    # Compare with the parent recorded before prctl, never with PID 1: in a
    # container supervisord *is* PID 1, and on a host an orphan may be
    # adopted by a subreaper rather than init. A different parent afterwards
    # means it died before the death signal was armed.
    parent = os.getppid()
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        result = libc.prctl(PR_SET_PDEATHSIG, int(sig), 0, 0, 0)
    except (OSError, AttributeError) as exc:
        LOG.warning("cannot ask to die with the parent", error=exc)
        return
    if result != 0:
        LOG.warning("cannot ask to die with the parent", errno=ctypes.get_errno())
    elif os.getppid() != parent or (_spawned_by_supervisord() and not _is_supervisord(parent)):
        # The second case: supervisord died before even the first getppid() above, so `parent` is
        # already whoever adopted us (init, a subreaper). Found by the test suite: a plugin whose
        # supervisord was SIGKILLed during its start-up lived on as an orphan.
        LOG.warning("parent died during start-up", parent=parent)
        os.kill(os.getpid(), sig)


def _spawned_by_supervisord() -> bool:
    # supervisord sets this in every child's environment (supervisor/process.py, Subprocess._spawn).
    return os.environ.get("SUPERVISOR_ENABLED") == "1"


def _is_supervisord(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as handle:
            return b"supervisord" in handle.read()
    except OSError:
        return False


def setup_role() -> None:
    """Call first in every role's main(): files and sockets we create are root-only."""
    os.umask(0o077)
    die_with_parent()
