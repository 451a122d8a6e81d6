"""The typed events other threads post to the plugin's life-cycle thread, and nothing else.

gRPC threads post stream and Register-call events, the queue thread what it received or
refused, the signal thread reload and stop requests. Plugin.handle dispatches on these
types with one `match`; none of them carries anything mutable but a call's handle.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from colad.queue import messages
from colad.queue.framing import Peer


class Call(Protocol):
    """A Register call in flight (service.RegisterCall, or a test's)."""

    def add_done_callback(self, callback: Callable[[], None]) -> None: ...
    def error(self) -> str | None: ...
    def may_still_complete(self) -> bool: ...
    def cancel(self) -> None: ...
    def close(self) -> None: ...


# Posted by gRPC threads to the life-cycle thread.
@dataclass(frozen=True)
class StreamChanged:
    resource: str
    generation: int
    opened: bool


@dataclass(frozen=True)
class EmptyListSent:
    resource: str
    generation: int


@dataclass(frozen=True)
class ListSent:
    """A ListAndWatch stream of server `generation` handed the kubelet list `version`."""

    resource: str
    generation: int
    version: int


@dataclass(frozen=True)
class ThreadDied:
    """A thread of the plugin ended with an exception (threading.excepthook): `grpc_server` if it served gRPC."""

    name: str
    error: str
    grpc_server: bool


@dataclass(frozen=True)
class CallDone:
    resource: str
    call: int
    handle: Call


# Posted by the DRA host's threads (registration, slice publisher).
@dataclass(frozen=True)
class DraChanged:
    """The DRA registration or this node's slices may have changed: publish the snapshot anew."""


# Posted by the queue thread and the signal thread.
@dataclass(frozen=True)
class Received:
    message: messages.Message
    peer: Peer
    at: float


@dataclass(frozen=True)
class QueueRejected:
    reason: str


@dataclass(frozen=True)
class ReloadRequested:
    pass


@dataclass(frozen=True)
class StopRequested:
    code: int = 0  # the plugin's exit code: non-zero when it cannot go on and supervisord must start it again
    reason: str = ""


@dataclass(frozen=True)
class ObserversLoaded:
    """The metrics registry, the HTTP server's and the in-use watcher's modules are loaded (off the start's path)."""

    error: str = ""  # why they could not be, logged


LifecycleEvent = (
    Received
    | QueueRejected
    | ReloadRequested
    | StopRequested
    | StreamChanged
    | ListSent
    | EmptyListSent
    | CallDone
    | ObserversLoaded
    | ThreadDied
    | DraChanged
)
