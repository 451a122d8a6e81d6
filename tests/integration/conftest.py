"""Integration fixtures: real QueueServers collecting into an Inbox, and role loops in threads."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from colad.queue.server import QueueServer
from tests.integration.support import Inbox, Role, RoleRunner, Serve


@pytest.fixture
def serve() -> Iterator[Serve]:
    """serve(path, **QueueServer kwargs) -> (started server, its inbox); all stopped at teardown."""
    servers: list[QueueServer] = []

    def start(path: Path | str, **kwargs: object) -> tuple[QueueServer, Inbox]:
        inbox = Inbox()
        server = QueueServer(str(path), inbox.on_message, on_reject=inbox.on_reject, **kwargs)  # type: ignore[arg-type]
        server.start()
        servers.append(server)
        return server, inbox

    yield start
    # Newest first: stopping an already stopped server again must not unlink a newer one's socket.
    for server in reversed(servers):
        server.stop()


@pytest.fixture
def runners() -> Iterator[Callable[[Role], RoleRunner]]:
    """runners(role) -> a RoleRunner (not started); every one is stopped and closed at teardown."""
    made: list[RoleRunner] = []

    def make(role: Role) -> RoleRunner:
        runner = RoleRunner(role)
        made.append(runner)
        return runner

    yield make
    errors = []
    for runner in made:
        try:
            runner.close()
        except AssertionError as exc:
            errors.append(exc)
    assert not errors, errors
