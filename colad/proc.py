"""Process-level set-up shared by the three roles: dying with supervisord, a root-only umask.

If supervisord is killed (even with SIGKILL) its children would live on, and
the next supervisord would start a second set that finds the sockets taken.
PR_SET_PDEATHSIG makes the kernel send each role SIGTERM when its parent dies.
"""

from __future__ import annotations

import ctypes
import os
import signal

from colad import log

LOG = log.get(__name__)
PR_SET_PDEATHSIG = 1  # <linux/prctl.h>


def die_with_parent(sig: int = signal.SIGTERM) -> None:
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        result = libc.prctl(PR_SET_PDEATHSIG, int(sig), 0, 0, 0)
    except (OSError, AttributeError) as exc:
        LOG.warning("cannot ask to die with the parent", error=exc)
        return
    if result != 0:
        LOG.warning("cannot ask to die with the parent", errno=ctypes.get_errno())
    elif os.getppid() == 1:
        os.kill(os.getpid(), sig)  # the parent was already gone before prctl took effect


def setup_role() -> None:
    """Call first in every role's main(): files and sockets we create are root-only."""
    os.umask(0o077)
    die_with_parent()
