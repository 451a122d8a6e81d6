"""External commands (probes, prepare commands): the one owner of their processes in a role.

start() runs argv without a shell, in a session of its own, stdin closed, output on a pipe, with
a marker in its environment (COLAD_COMMAND) that whatever it starts inherits. Child.kill() ends
the command with everything it started: its process tree, its process group, and each process
the role adopted (the role is a child subreaper) carrying its marker. sweep() reaps adopted
processes that exited and kills those no running command owns; stopping() ends every command
at the role's stop. Neighbours: probes.py (discovery's probes), prestart.py (the plugin's prepares).
"""

from __future__ import annotations

import contextlib
import ctypes
import itertools
import os
import select
import signal
import threading
import time
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass

from colad.runtime import log

TYPE_CHECKING = False
if TYPE_CHECKING:  # imported where a command starts: a role that runs none never loads it
    import subprocess

LOG = log.get(__name__)
MARKER_ENV = "COLAD_COMMAND"
PR_SET_CHILD_SUBREAPER = 36  # <linux/prctl.h>
PROC = "/proc"
KILL_ROUNDS = 10  # passes over the tree while new processes turn up (one that forks as it dies)
EXEC_RETRIES = 5  # reads of an empty environment, 1 ms apart, before it counts as one without a marker
STOP_WAIT = 1.0  # at the role's stop, how long killed processes may take to be reaped
DEATH_WAIT = 0.5  # how long killed processes may take to exit before the next look (longer: in D state)

_LOCK = threading.RLock()  # spawn + register vs. sweep: a child forked and not yet registered looks adopted
_LIVE: dict[int, Child] = {}  # pid -> started and not yet reaped
_SEQ = itertools.count(1)
_STATE = {"subreaper": False, "stopping": False, "sigchld": False}
_UNREAPED: dict[int, float] = {}  # killed processes that are or will be adopted -> when to stop waiting
UNREAPED_FOR = 10.0  # a killed process neither gone nor reaped by then (in D state, its pid reused) is let go


def become_subreaper(on: bool = True) -> bool:
    """Make this process the reaper of its descendants' orphans (PR_SET_CHILD_SUBREAPER); False if refused.

    Then a process a command started that outlives its parent (`setsid cmd &`, a double fork) is
    re-parented to this role, not to init, where sweep() and Child.kill() find it."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        ok = libc.prctl(PR_SET_CHILD_SUBREAPER, int(on), 0, 0, 0) == 0
    except (OSError, AttributeError):
        ok = False
    if on and not ok:
        LOG.warning("not a child subreaper: what a command leaves behind is found by its marker alone")
    _STATE["subreaper"] = on and ok
    return ok


def is_subreaper() -> bool:
    return _STATE["subreaper"]


@dataclass(eq=False)
class Child:
    """A started command; its owner reads `popen.stdout`, then kill() and poll()/wait() it."""

    popen: subprocess.Popen[bytes]
    marker: str
    killed: bool = False  # kill() ran: processes carrying its marker are no longer protected

    @property
    def pid(self) -> int:
        return self.popen.pid

    def exited(self) -> bool:
        """Whether the command exited, without reaping it (WNOWAIT): its pid still names its group."""
        if self.popen.returncode is not None:
            return True
        try:
            return os.waitid(os.P_PID, self.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None
        except ChildProcessError:
            return True

    def kill(self) -> int:
        """SIGKILL the command (if it still runs) and everything it started; how many processes it had left
        (everything killed but the command itself: a fault of the command, counted by its owner)."""
        with _LOCK:
            self.killed = True
            return _kill_tree(self)

    def poll(self) -> int | None:
        returncode = self.popen.poll()
        if returncode is not None:
            _forget(self)
        return returncode

    def wait(self, timeout: float | None = None) -> int:
        returncode = self.popen.wait(timeout)  # raises TimeoutExpired: still registered
        _forget(self)
        return returncode


def start(argv: Sequence[str], env: Mapping[str, str], cwd: str = "/") -> Child:
    """Start `argv` (no shell) in a session of its own; raises OSError or ValueError as Popen does."""
    import subprocess  # noqa: PLC0415 - see TYPE_CHECKING above

    with _LOCK:
        if _STATE["stopping"]:
            raise OSError(0, "colad is stopping")
        marker = f"{os.getpid()}.{next(_SEQ)}"
        popen = subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            close_fds=True,
            start_new_session=True,  # its own process group and session
            env={**env, MARKER_ENV: marker},
            cwd=cwd,
        )
        child = _LIVE[popen.pid] = Child(popen, marker)
    return child


def sweep(everything: bool = False) -> int:
    """Reap adopted processes that exited, kill those no running command owns; how many remain to reap.

    Adopted: children of this process it did not start (a subreaper's orphans). A role that is no
    subreaper has none (init adopts them): only `everything` (its stop) then looks, over all of
    /proc, for processes carrying the marker of one of its commands."""
    with _LOCK:
        _STATE["sigchld"] = False
        if not _STATE["subreaper"] and not everything:
            return 0
        return _sweep(_Table())


def _sweep(table: _Table) -> int:
    owners = {c.marker for c in _LIVE.values() if not c.killed}
    acted = False
    for pid in _adopted(table):
        stat = _stat(pid)
        if stat is None or (stat[2] not in "ZX" and _marker(pid) in owners):
            continue
        acted = True
        if stat[2] in "ZX":
            _reap(pid)
            continue
        frozen: dict[int, int | None] = {}
        _freeze_tree(table, pid, frozen)
        _kill_frozen(frozen)
        _await(frozen)
    now = time.monotonic()
    for pid, until in list(_UNREAPED.items()):
        if now > until or _stat(pid) is None:  # gone: reaped by its own parent, or by this sweep
            del _UNREAPED[pid]
    # A process adopted while the table was read (its parent died meanwhile) is seen by the next
    # look: after a sweep that reaped or killed, another one follows until one finds nothing to do.
    _STATE["sigchld"] = _STATE["sigchld"] or acted
    return len(_UNREAPED)


def _await(pids: Iterable[int]) -> None:
    """Remember killed processes: as this role's children (adopted, or once their parent is gone)
    they are reaped by the next sweeps, which the caller makes soon while pending()."""
    if _STATE["subreaper"]:
        until = time.monotonic() + UNREAPED_FOR
        _UNREAPED.update(dict.fromkeys(pids, until))


def pending() -> bool:
    """Whether the caller should sweep() soon: a killed process waits to be reaped, or a SIGCHLD came."""
    return bool(_UNREAPED) or _STATE["sigchld"]


def child_exited(_signum: int = 0, _frame: object = None) -> None:
    """SIGCHLD: an adopted process may have exited; reaped at the next sweep(), which pending() asks for.

    A process adopted between two looks at /proc would otherwise stay a zombie until the next
    command ends."""
    _STATE["sigchld"] = True


def settle(timeout: float, everything: bool = False) -> int:
    """sweep() until nothing killed waits to be reaped, for at most `timeout` seconds; how many still wait.

    A SIGKILLed process exits once it is scheduled: on a loaded node some milliseconds later."""
    deadline = time.monotonic() + timeout
    if everything or pending():
        sweep(everything)
    while pending() and time.monotonic() < deadline:
        time.sleep(0.01)
        sweep(everything)
    return len(_UNREAPED)


@contextlib.contextmanager
def stopping(timeout: float = STOP_WAIT) -> Iterator[int]:
    """The role stops: within the block no command starts; first every running one is killed with
    what it started, and what was adopted is killed and reaped (for at most `timeout` seconds).

    Yields how many commands were running."""
    with _LOCK:
        _STATE["stopping"] = True
        children = list(_LIVE.values())
    try:
        signalled = sum(child.kill() for child in children)
        settle(timeout, everything=True)
        if children or _UNREAPED:
            LOG.info("commands stopped", commands=len(children), left=signalled, unreaped=len(_UNREAPED))
        yield len(children)
    finally:
        _STATE["stopping"] = False


def running() -> int:
    """Commands started and not yet reaped."""
    return len(_LIVE)


# --- internals ---------------------------------------------------------------------------------


def _forget(child: Child) -> None:
    with _LOCK:
        if _LIVE.get(child.pid) is child:
            del _LIVE[child.pid]


class _Table:
    """One look at who is whose child: /proc/<pid>/task/*/children where the kernel has it
    (CONFIG_PROC_CHILDREN), else one pass over every /proc/<pid>/stat."""

    def __init__(self) -> None:
        self._kids: dict[int, list[int]] | None = None
        if not CHILDREN_FILES:
            self._kids = {}
            for pid in _pids():
                stat = _stat(pid)
                if stat is not None:
                    self._kids.setdefault(stat[0], []).append(pid)

    def children(self, pid: int) -> list[int]:
        if self._kids is not None:
            return self._kids.get(pid, [])
        kids: list[int] = []
        try:
            tids = os.listdir(f"{PROC}/{pid}/task")
        except OSError:
            return kids
        for tid in tids:
            try:
                with open(f"{PROC}/{pid}/task/{tid}/children", "rb") as handle:
                    kids.extend(int(k) for k in handle.read().split())
            except (OSError, ValueError):
                continue
        return kids


def _children_files() -> bool:
    return os.path.exists(f"{PROC}/self/task/{os.getpid()}/children")


CHILDREN_FILES = _children_files()


def _pids() -> Iterable[int]:
    try:
        names = os.listdir(PROC)
    except OSError:
        return ()
    return (int(n) for n in names if n.isdigit())


def _stat(pid: int) -> tuple[int, int, str] | None:
    """(ppid, pgid, state) of `pid`, None when it is gone."""
    try:
        with open(f"{PROC}/{pid}/stat", "rb") as handle:
            data = handle.read()
        fields = data[data.rindex(b")") + 2 :].split()
        return int(fields[1]), int(fields[2]), fields[0].decode("ascii", "replace")
    except (OSError, ValueError, IndexError):
        return None


def _marker(pid: int) -> str | None:
    """The COLAD_COMMAND value in `pid`'s environment. A process in execve() shows an empty one for
    a moment (the kernel sets the new environment after the new memory): read again then."""
    prefix = MARKER_ENV.encode() + b"="
    for attempt in range(EXEC_RETRIES + 1):
        try:
            with open(f"{PROC}/{pid}/environ", "rb") as handle:
                environ = handle.read()
        except OSError:
            return None
        if environ:
            break
        stat = _stat(pid)
        if attempt == EXEC_RETRIES or stat is None or stat[2] in "ZX" or stat[0] in (0, 2):  # 2: kthreadd's
            return None
        time.sleep(0.001)
    for entry in environ.split(b"\0"):
        if entry.startswith(prefix):
            return entry[len(prefix) :].decode("ascii", "replace")
    return None


def _adopted(table: _Table, marker: str | None = None, group: int = 0) -> list[int]:
    """This role's children it did not start (a subreaper's orphans), else the processes anywhere
    carrying one of its markers; only those carrying `marker` when it is given, or in process group
    `group` (a command's group, while the command is unreaped).

    The group finds a process killed with the group while it dies: its environment is gone, and
    the processes it started are adopted only once it has exited, so the kill waits for it."""
    me = os.getpid()
    if _STATE["subreaper"]:
        found = [p for p in table.children(me) if p not in _LIVE]
        if marker is None:
            return found
        return [p for p in found if (group and _in_group(p, group)) or _marker(p) == marker]
    mine = f"{me}."
    return [
        p
        for p in _pids()
        if p != me and (m := _marker(p)) is not None and (m == marker if marker else m.startswith(mine))
    ]


def _in_group(pid: int, group: int) -> bool:
    stat = _stat(pid)
    return stat is not None and stat[1] == group


def _kill_tree(child: Child) -> int:
    """Pass over the command's tree, its group and its adopted processes until a pass finds no new
    process and none that ended while it looked, then sweep(): one look at /proc when the command
    left nothing behind.

    A process that ended between the look and its stop had its children adopted by this role in
    between, unseen by that look (a subshell that forked `setsid daemon` and exited): the next pass
    sees them."""
    signalled: set[int] = set()
    ended: set[int] = {child.pid} if child.exited() else set()
    for _ in range(KILL_ROUNDS):
        before = (len(signalled), len(ended))
        table = _Table()
        frozen: dict[int, int | None] = {}
        unreaped = child.popen.returncode is None  # its pid and group id are still its own
        if unreaped:
            _freeze_tree(table, child.pid, frozen, ended)
        for pid in _adopted(table, child.marker, child.pid if unreaped else 0):
            _freeze_tree(table, pid, frozen, ended)
        if unreaped:
            try:
                os.killpg(child.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        _kill_frozen(frozen)
        _await(p for p in frozen if p != child.pid)  # the command itself is its owner's to reap
        signalled.update(frozen)
        if (len(signalled), len(ended)) == before:
            break
    if _STATE["subreaper"]:  # the last look found nothing new: it serves the sweep as well
        _sweep(table)
    return len(signalled - {child.pid})


def _freeze_tree(table: _Table, root: int, frozen: dict[int, int | None], ended: set[int] | None = None) -> None:
    """SIGSTOP `root` and its descendants, parents first, each held by a pidfd in `frozen`; those
    that had exited (or were gone) when their turn came are added to `ended`.

    Stopped, a process neither forks nor exits, so its children keep it as their parent while
    the tree is walked; _kill_frozen() then ends them all."""
    todo = [(root, 0)]
    while todo:
        pid, parent = todo.pop()
        if pid in frozen:
            continue
        fd = _stop(pid, parent)
        if fd is False:
            if ended is not None and ((stat := _stat(pid)) is None or stat[2] in "ZX"):
                ended.add(pid)
            continue
        frozen[pid] = fd
        todo.extend((kid, pid) for kid in table.children(pid))


def _stop(pid: int, parent: int) -> int | None | bool:
    """SIGSTOP `pid` if it still runs and, unless `parent` is 0, is still `parent`'s child: its pidfd
    (None where there is none), False when it is not to be touched.

    Through the pidfd the check and the signals name the same process even if `pid` exited and
    was reused in between."""
    try:
        fd: int | None = os.pidfd_open(pid)
    except (AttributeError, OSError):
        fd = None
    stat = _stat(pid)
    try:
        # Its parent may have died since the table was read: then it is this subreaper's child.
        adopted = _STATE["subreaper"] and stat is not None and stat[0] == os.getpid()
        if stat is None or stat[2] in "ZX" or (parent and stat[0] != parent and not adopted):
            raise ProcessLookupError
        _send(pid, fd, signal.SIGSTOP)
        return fd
    except (ProcessLookupError, PermissionError):
        if fd is not None:
            os.close(fd)
        return False


def _send(pid: int, fd: int | None, sig: int) -> None:
    if fd is not None:
        signal.pidfd_send_signal(fd, sig)
    else:
        os.kill(pid, sig)


def _kill_frozen(frozen: dict[int, int | None]) -> None:
    """SIGKILL every process of `frozen`, then wait (at most DEATH_WAIT) until each has exited.

    A process forked just before its parent was stopped is in no table yet; once that parent has
    exited it is this subreaper's child, so the next look finds it."""
    for pid, fd in frozen.items():
        try:
            _send(pid, fd, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
    deadline = time.monotonic() + DEATH_WAIT
    waiting = dict(frozen)
    while waiting and (left := deadline - time.monotonic()) > 0:
        fds = [fd for fd in waiting.values() if fd is not None]
        if fds:  # a pidfd is readable once its process exited
            ready = set(select.select(fds, [], [], min(left, 0.05))[0])
        else:
            time.sleep(min(left, 0.005))
            ready = set()
        for pid, fd in list(waiting.items()):
            if fd in ready if fd is not None else (stat := _stat(pid)) is None or stat[2] in "ZX":
                del waiting[pid]
    for fd in frozen.values():
        if fd is not None:
            os.close(fd)


def _reap(pid: int) -> None:
    try:
        os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:
        pass
    _UNREAPED.pop(pid, None)
