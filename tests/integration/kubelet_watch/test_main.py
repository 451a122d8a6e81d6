"""The kubelet watcher with real inotify on a temp kubelet directory, publishing to a real QueueServer.

No gRPC: a bound-and-closed AF_UNIX socket stands for kubelet.sock and for plugin
sockets, since the watcher only looks at names and inode identities. The role runs
in a thread through `RoleRunner`, or is stepped by hand where a test must know that
every queued inotify event has been read (the checkpoint churn).
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from colad.config.config import Config
from colad.kubelet_watch.main import KubeletWatch
from colad.queue.messages import KubeletState
from colad.runtime.kubeletdir import plugin_sockets, socket_identity
from colad.watchers.loop import poll
from tests.helpers import wait_until
from tests.integration.support import Inbox, RoleRunner, Serve, begin, bind_socket, make_config

pytestmark = pytest.mark.integration

CHECKPOINT = "kubelet_internal_checkpoint"


class CountingWatch(KubeletWatch):
    """KubeletWatch that remembers why it looked, in order, and the state behind each seq it sent.

    A KubeletState carries only its envelope, so `sent` is how a test learns what a message meant.
    """

    def __init__(self, cfg: Config, **kwargs: object) -> None:
        super().__init__(cfg, **kwargs)  # type: ignore[arg-type]
        self.reasons: list[str] = []
        self.sent: dict[int, tuple[str, tuple[str, ...]] | None] = {}

    def look(self, reason: str) -> None:
        before = self.seq
        super().look(reason)
        if self.seq != before:
            self.sent[self.seq] = self.last
        self.reasons.append(reason)


@pytest.fixture
def cfg(short_tmp: Path) -> Config:
    config = make_config(short_tmp)
    os.mkdir(config.run_dir, 0o700)
    return config


def identity(path: Path) -> str:
    """What the watcher should report for the socket at `path`, computed independently."""
    st = os.stat(path)
    return f"{st.st_dev}:{st.st_ino}:{st.st_ctime_ns}"


def started(
    cfg: Config, serve: Serve, runners: Callable[[KubeletWatch], RoleRunner], *, run: bool = True
) -> tuple[CountingWatch, RoleRunner, Inbox]:
    _, inbox = serve(cfg.queue_socket)
    watcher = CountingWatch(cfg)
    runner = runners(watcher)
    begin(watcher)
    if run:
        runner.start()
    return watcher, runner, inbox


def wait_for_state(
    watcher: CountingWatch,
    inbox: Inbox,
    kubelet_socket: str,
    sockets: tuple[str, ...] = (),
    timeout: float = 5,
    *,
    step: Callable[[], None] | None = None,
) -> None:
    """Wait until the plugin side's latest KubeletState was sent for exactly this state.

    With `step`, drive the role by hand meanwhile.
    """
    want = (kubelet_socket, sockets)

    def exact() -> bool:
        if step is not None:
            step()
        state = inbox.latest(KubeletState)
        got = None if state is None else watcher.sent.get(state.seq)
        if got != want:
            raise AssertionError(f"latest KubeletState was sent for (kubelet_socket, plugin_sockets) = {got}")
        return True

    wait_until(exact, timeout, f"the state {want}")


def drain(watcher: KubeletWatch) -> None:
    """Step by hand until the inotify queue is empty (every event so far has been read)."""
    while watcher.inotify.fileno() in poll([watcher.inotify.fileno()], 0):
        watcher.step(0)


# ---------------------------------------------------------------- kubelet.sock


def test_kubelet_socket_appears_and_each_restart_changes_its_identity(
    cfg: Config, serve: Serve, runners: Callable[[KubeletWatch], RoleRunner]
) -> None:
    kubelet_dir = Path(cfg.kubelet_dir)
    kubelet_dir.mkdir()
    sock = kubelet_dir / "kubelet.sock"
    watcher, _, inbox = started(cfg, serve, runners)
    wait_for_state(watcher, inbox, "")

    bind_socket(sock)
    first = identity(sock)
    wait_for_state(watcher, inbox, first)

    os.unlink(sock)  # a kubelet restart seen in two steps: gone, then back
    wait_for_state(watcher, inbox, "")
    bind_socket(sock)
    second = identity(sock)
    wait_for_state(watcher, inbox, second)

    os.unlink(sock)  # and in one breath, as fast as a restarting kubelet can be
    bind_socket(sock)
    third = identity(sock)
    wait_for_state(watcher, inbox, third)

    assert len({first, second, third}) == 3
    states = inbox.of(KubeletState)
    assert {s.epoch for s in states} == {watcher.epoch}
    seqs = [s.seq for s in states]
    assert seqs == sorted(set(seqs)), f"seq not strictly increasing: {seqs}"


@pytest.mark.parametrize(
    "make",
    [
        pytest.param(lambda p: p.write_text("not a socket"), id="regular-file"),
        pytest.param(lambda p: p.mkdir(), id="directory"),
        pytest.param(lambda p: os.symlink(p.parent / "nowhere", p), id="dangling-symlink"),
    ],
)
def test_kubelet_sock_that_is_not_a_socket_has_no_identity(short_tmp: Path, make: Callable[[Path], None]) -> None:
    path = short_tmp / "kubelet.sock"
    assert socket_identity(str(path)) == ""
    make(path)
    assert socket_identity(str(path)) == ""


def test_socket_identity_of_a_socket_is_dev_ino_ctime(short_tmp: Path) -> None:
    path = short_tmp / "kubelet.sock"
    bind_socket(path)
    assert socket_identity(str(path)) == identity(path)


# ---------------------------------------------------------------- plugin sockets


def _add(*names: str) -> Callable[[Path], None]:
    def act(d: Path) -> None:
        for name in names:
            bind_socket(d / name)

    return act


def _remove_colad_0(d: Path) -> None:
    os.unlink(d / "colad-0.sock")


def _rename_colad_0(d: Path) -> None:
    os.rename(d / "colad-0.sock", d / "colad-9.sock")


def _rename_in(d: Path) -> None:
    bind_socket(d.parent / "colad-5.sock")
    os.rename(d.parent / "colad-5.sock", d / "colad-5.sock")


def _kubelet_restart(d: Path) -> None:
    # pkg/kubelet/cm/devicemanager/manager.go removeContents(): every socket goes, then kubelet.sock anew.
    for name in os.listdir(d):
        os.unlink(d / name)
    bind_socket(d / "kubelet.sock")


@pytest.mark.parametrize(
    "change, expected",
    [
        pytest.param(_add("colad-1.sock"), ("colad-0.sock", "colad-1.sock"), id="one-appears"),
        pytest.param(
            _add("colad-2.sock", "colad-1.sock"),
            ("colad-0.sock", "colad-1.sock", "colad-2.sock"),
            id="two-appear-sorted",
        ),
        pytest.param(_remove_colad_0, (), id="one-disappears"),
        pytest.param(_rename_colad_0, ("colad-9.sock",), id="renamed"),
        pytest.param(_rename_in, ("colad-0.sock", "colad-5.sock"), id="renamed-in"),
        pytest.param(_add("other-plugin.sock"), ("colad-0.sock",), id="other-plugin-ignored"),
        pytest.param(_add("colad-1.sock.tmp"), ("colad-0.sock",), id="wrong-suffix-ignored"),
        pytest.param(_add("xcolad-1.sock"), ("colad-0.sock",), id="wrong-prefix-ignored"),
        pytest.param(_kubelet_restart, (), id="kubelet-restart-clears-them"),
    ],
)
def test_plugin_sockets(
    cfg: Config,
    serve: Serve,
    runners: Callable[[KubeletWatch], RoleRunner],
    change: Callable[[Path], None],
    expected: tuple[str, ...],
) -> None:
    kubelet_dir = Path(cfg.kubelet_dir)
    kubelet_dir.mkdir()
    bind_socket(kubelet_dir / "kubelet.sock")
    bind_socket(kubelet_dir / "colad-0.sock")
    watcher, _, inbox = started(cfg, serve, runners)
    wait_for_state(watcher, inbox, identity(kubelet_dir / "kubelet.sock"), ("colad-0.sock",))

    change(kubelet_dir)
    bind_socket(kubelet_dir / "colad-zz.sock")  # events are ordered: once this shows, the change has been seen
    final = tuple(sorted((*expected, "colad-zz.sock")))
    wait_for_state(watcher, inbox, identity(kubelet_dir / "kubelet.sock"), final)
    assert plugin_sockets(str(kubelet_dir)) == final
    for state in inbox.of(KubeletState):
        sent = watcher.sent[state.seq]
        assert sent is not None and all(n.startswith("colad-") and n.endswith(".sock") for n in sent[1]), sent


# ---------------------------------------------------------------- checkpoint churn


def test_checkpoint_churn_publishes_nothing(
    cfg: Config, serve: Serve, runners: Callable[[KubeletWatch], RoleRunner]
) -> None:
    kubelet_dir = Path(cfg.kubelet_dir)
    kubelet_dir.mkdir()
    bind_socket(kubelet_dir / "kubelet.sock")
    watcher, _, inbox = started(cfg, serve, runners, run=False)
    wait_for_state(watcher, inbox, identity(kubelet_dir / "kubelet.sock"))
    drain(watcher)
    before = len(inbox.of(KubeletState))

    # pkg/kubelet/checkpointmanager: write a dot-prefixed temp file, then rename it over the checkpoint.
    for i in range(50):
        tmp = kubelet_dir / f".{CHECKPOINT}.tmp"
        with open(tmp, "w") as handle:
            handle.write(f'{{"Data":"{i}"}}')
            handle.flush()
            os.fsync(handle.fileno())
        os.rename(tmp, kubelet_dir / CHECKPOINT)
    drain(watcher)

    assert watcher.reasons == ["start"], "checkpoint churn made the watcher look again"
    assert len(inbox.of(KubeletState)) == before

    bind_socket(kubelet_dir / "colad-1.sock")  # a real change still goes through

    def stepped_until_seen() -> bool:
        watcher.step(0.05)
        state = inbox.latest(KubeletState)
        sent = None if state is None else watcher.sent.get(state.seq)
        return sent is not None and sent[1] == ("colad-1.sock",)

    wait_until(stepped_until_seen, 5, "the colad-1.sock change after the churn")
    assert len(inbox.of(KubeletState)) == before + 1


# ---------------------------------------------------------------- the kubelet directory itself


def test_kubelet_directory_missing_created_removed_recreated(
    cfg: Config, serve: Serve, runners: Callable[[KubeletWatch], RoleRunner]
) -> None:
    kubelet_dir = Path(cfg.kubelet_dir)
    sock = kubelet_dir / "kubelet.sock"
    root = kubelet_dir.parent
    watcher, _, inbox = started(cfg, serve, runners)
    wait_for_state(watcher, inbox, "")

    def steps() -> Iterator[tuple[str, Callable[[], str], tuple[str, ...]]]:
        kubelet_dir.mkdir()
        bind_socket(sock)
        bind_socket(kubelet_dir / "colad-1.sock")
        yield "created with kubelet.sock inside", lambda: identity(sock), ("colad-1.sock",)

        shutil.rmtree(kubelet_dir)
        yield "removed", lambda: "", ()

        kubelet_dir.mkdir()
        yield "recreated empty", lambda: "", ()

        bind_socket(sock)
        yield "kubelet.sock in the recreated directory", lambda: identity(sock), ()

        other = root / "other-kubelet"
        other.mkdir()
        bind_socket(other / "kubelet.sock")
        bind_socket(other / "colad-7.sock")
        shutil.rmtree(kubelet_dir)
        os.symlink(other, kubelet_dir)
        yield "replaced by a symlink to another directory", lambda: identity(sock), ("colad-7.sock",)

        bind_socket(other / "colad-8.sock")
        yield "a socket added in the symlink's target", lambda: identity(sock), ("colad-7.sock", "colad-8.sock")

        os.unlink(kubelet_dir)
        shutil.rmtree(other)
        fresh = root / "fresh"
        fresh.mkdir()
        bind_socket(fresh / "kubelet.sock")
        os.rename(fresh, kubelet_dir)
        yield "a prepared directory renamed into place", lambda: identity(sock), ()

    for stage, expected_identity, sockets in steps():
        try:
            wait_for_state(watcher, inbox, expected_identity(), sockets)
        except AssertionError as exc:
            raise AssertionError(f"after stage {stage!r}: {exc}") from None
    assert watcher.reasons[0] == "start"


def test_kubelet_directory_removed_and_recreated_between_two_steps(
    cfg: Config, serve: Serve, runners: Callable[[KubeletWatch], RoleRunner]
) -> None:
    # ext4 readily hands the freed inode number to the new directory: same (dev, ino), a dead watch.
    kubelet_dir = Path(cfg.kubelet_dir)
    kubelet_dir.mkdir()
    bind_socket(kubelet_dir / "kubelet.sock")
    watcher, _, inbox = started(cfg, serve, runners, run=False)
    wait_for_state(watcher, inbox, identity(kubelet_dir / "kubelet.sock"))

    shutil.rmtree(kubelet_dir)
    kubelet_dir.mkdir()
    drain(watcher)
    bind_socket(kubelet_dir / "kubelet.sock")  # is the new directory itself watched?
    wait_for_state(watcher, inbox, identity(kubelet_dir / "kubelet.sock"), step=lambda: watcher.step(0.05))


# ---------------------------------------------------------------- the plugin end of the queue


def test_restarted_plugin_gets_the_current_state(
    cfg: Config, serve: Serve, runners: Callable[[KubeletWatch], RoleRunner]
) -> None:
    kubelet_dir = Path(cfg.kubelet_dir)
    kubelet_dir.mkdir()
    bind_socket(kubelet_dir / "kubelet.sock")
    server, _ = serve(cfg.queue_socket)
    watcher = CountingWatch(cfg)
    runner = runners(watcher)
    begin(watcher)
    runner.start()

    server.stop()
    wait_until(lambda: watcher.client.sock is None, 5, "the watcher to notice the plugin went away")
    bind_socket(kubelet_dir / "colad-3.sock")
    wait_until(lambda: watcher.last and watcher.last[1] == ("colad-3.sock",), 5, "the change while away")

    _, inbox = serve(cfg.queue_socket)
    wait_for_state(watcher, inbox, identity(kubelet_dir / "kubelet.sock"), ("colad-3.sock",), timeout=3)


# ---------------------------------------------------------------- DRA mode


def test_in_dra_mode_the_registration_socket_removed_or_made_anew_is_news(
    short_tmp: Path, serve: Serve, runners: Callable[[KubeletWatch], RoleRunner]
) -> None:
    cfg = make_config(short_tmp, mode="dra", plugins_registry_dir=str(short_tmp / "registry"))
    os.mkdir(cfg.run_dir, 0o700)
    Path(cfg.kubelet_dir).mkdir()
    Path(cfg.plugins_registry_dir).mkdir()
    registration = Path(cfg.dra_registration_socket)
    bind_socket(registration)
    _, inbox = serve(cfg.queue_socket)
    watcher = KubeletWatch(cfg)
    runner = runners(watcher)
    begin(watcher)
    runner.start()
    wait_until(lambda: len(inbox.of(KubeletState)) == 1, 5, "the first KubeletState")
    assert watcher.registration == identity(registration)
    registration.unlink()
    wait_until(lambda: len(inbox.of(KubeletState)) == 2, 5, "a KubeletState for the removal")
    assert watcher.registration == ""
    bind_socket(registration)
    wait_until(lambda: len(inbox.of(KubeletState)) == 3, 5, "a KubeletState for the new socket")
    assert watcher.registration == identity(registration)
