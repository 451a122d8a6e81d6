"""Kernel inotify limits confined to one process tree, for tests: a user namespace of its own.

fs.inotify.max_user_instances and max_user_watches are per uid and shared by every root process
on the machine (other tests too): they are never lowered. Instead the tree (supervisord and its
roles) starts in a user namespace whose own /proc/sys/user/max_inotify_instances and
max_inotify_watches the kernel enforces on top of the machine's, and `set()` lowers or lifts them
from outside through nsenter. `InotifyLimits.python` is an interpreter path for ColadService.
"""

from __future__ import annotations

import shlex
import subprocess
import sys
from pathlib import Path

UNLIMITED = 2**31 - 1  # a new user namespace's own default: only the machine's limit applies
_FILES = {"instances": "/proc/sys/user/max_inotify_instances", "watches": "/proc/sys/user/max_inotify_watches"}


class InotifyLimits:
    def __init__(self, root: Path, *, instances: int = UNLIMITED, watches: int = UNLIMITED, python: str = "") -> None:
        self.pid_file = root / "userns.pid"
        self.python = str(root / "python-in-userns")
        real = shlex.quote(python or sys.executable)
        inner = (
            f"echo {instances} > {_FILES['instances']} && echo {watches} > {_FILES['watches']} || exit 97\n"
            f"echo $$ > {shlex.quote(str(self.pid_file))}\n"
            'exec "$0" "$@"'
        )
        script = f'#!/bin/sh\nexec unshare --user --map-root-user -- /bin/sh -c {shlex.quote(inner)} {real} "$@"\n'
        Path(self.python).write_text(script)
        Path(self.python).chmod(0o755)

    @property
    def pid(self) -> int:
        """The namespace's first process (`colad supervise`, exec'd into supervisord)."""
        return int(self.pid_file.read_text())

    def set(self, *, instances: int | None = None, watches: int | None = None) -> None:
        """Write the namespace's own limits (None: leave as is). Existing instances and watches stay."""
        writes = [
            f"echo {v} > {_FILES[k]}" for k, v in (("instances", instances), ("watches", watches)) if v is not None
        ]
        subprocess.run(
            ["nsenter", "--user", "--target", str(self.pid), "/bin/sh", "-c", " && ".join(writes)],
            check=True,
            timeout=10,
        )

    def lift(self) -> None:
        self.set(instances=UNLIMITED, watches=UNLIMITED)

    def read(self) -> dict[str, int]:
        done = subprocess.run(
            ["nsenter", "--user", "--target", str(self.pid), "cat", _FILES["instances"], _FILES["watches"]],
            check=True,
            capture_output=True,
            text=True,
            timeout=10,
        )
        instances, watches = done.stdout.split()
        return {"instances": int(instances), "watches": int(watches)}
