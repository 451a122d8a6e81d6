"""Test helpers shared by every layer: waiting on conditions with deadlines."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import TypeVar

T = TypeVar("T")


class WaitTimeout(AssertionError):
    pass


def wait_until(
    predicate: Callable[[], T | None],
    timeout: float,
    describe: str,
    *,
    interval: float = 0.01,
    logs: Iterable[Path] = (),
) -> T:
    """Poll `predicate` until it returns a truthy value; return that value.

    On timeout, raise with the last value observed (or the last exception the
    predicate raised) and the tail of every log file named in `logs`.
    """
    deadline = time.monotonic() + timeout
    last: object = None
    while True:
        try:
            value = predicate()
            if value:
                return value
            last = value
        except Exception as exc:  # the predicate may race with the system under test
            last = exc
        if time.monotonic() >= deadline:
            break
        time.sleep(interval)
    text = f"timed out after {timeout:.1f}s waiting for {describe}; last observed: {last!r}"
    for path in logs:
        try:
            tail = Path(path).read_text(errors="replace").splitlines()[-60:]
        except OSError as exc:
            tail = [f"<unreadable: {exc}>"]
        text += f"\n--- {path} (last {len(tail)} lines) ---\n" + "\n".join(tail)
    raise WaitTimeout(text)


def http_get(url: str) -> tuple[int, str]:
    """Status and body of a GET, an HTTP error's too (the plugin's /healthz, /readyz, /metrics)."""
    import urllib.error
    import urllib.request

    try:
        with urllib.request.urlopen(url, timeout=5) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


def metrics_address(run_dir: Path, timeout: float = 20.0) -> str:
    """host:port of the plugin's metrics endpoint, from its state file, once it is up.

    The plugin starts /metrics, /healthz and /readyz after its first Register (fef334e): until then
    the state file says "", so a test that wants them waits for the address rather than reading it once.
    """
    import json

    def bound() -> str:
        state = json.loads((run_dir / "state" / "plugin.json").read_text())
        return str(state.get("metrics_address", ""))

    return wait_until(bound, timeout, "the plugin to report its metrics address")


def in_network_namespace(pid: int, make: Callable[[], T]) -> T:
    """`make()` called in the network namespace of process `pid`: the sockets it opens live there.

    A thread of its own enters the namespace (setns(2) moves only the calling thread), so the test's
    other threads stay in theirs. Needs root.
    """
    import ctypes
    import os
    import threading

    result: list[T] = []
    failure: list[BaseException] = []

    def enter() -> None:
        try:
            libc = ctypes.CDLL(None, use_errno=True)
            fd = os.open(f"/proc/{pid}/ns/net", os.O_RDONLY)
            try:
                if libc.setns(fd, 0x40000000) != 0:  # CLONE_NEWNET
                    raise OSError(ctypes.get_errno(), f"setns into the network namespace of {pid}")
            finally:
                os.close(fd)
            result.append(make())
        except BaseException as exc:  # re-raised in the caller
            failure.append(exc)

    thread = threading.Thread(target=enter, name=f"netns-{pid}")
    thread.start()
    thread.join()
    if failure:
        raise failure[0]
    return result[0]
