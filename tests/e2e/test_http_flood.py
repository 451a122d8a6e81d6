"""The metrics port flooded while the plugin runs at a task limit or a file limit, the kubelet restarting.

Real supervisord (ColadService and its guard), the strict fake kubelet, a loopback flood of idle
half-sent requests and rapid connections (tests/flood.py). The limits are confined to the plugin:
a child pids cgroup, or prlimit on its pid; both are undone afterwards.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from colad.metrics import httpserver
from tests.fakes.kubelet import FakeKubelet
from tests.flood import flooding
from tests.helpers import http_get, metrics_address, wait_until
from tests.limits import cpu_seconds, open_fds, pids_group, set_nofile, soft_nofile, threads_of
from tests.service import ColadService

pytestmark = pytest.mark.e2e

DEVICES = {"cola-a", "cola-b", "cola-c"}
PROBE_TIMEOUT = 5.0  # the DaemonSet's probes: timeoutSeconds 5
BACK_WITHIN = 10.0  # registration back and every device Healthy after a kubelet restart


@pytest.fixture
def service(short_tmp: Path, kubelet: FakeKubelet) -> Iterator[ColadService]:
    colad = ColadService(short_tmp)
    colad.add(*sorted(DEVICES))
    colad.start()
    yield colad
    rc = colad.stop()
    assert rc == 0, f"supervisord exited with {rc}\n" + colad.log()[-4000:]


class Watch:
    """Polls /healthz and Allocate in the background; keeps the worst answer time and every failure."""

    def __init__(self, url: str, kubelet: FakeKubelet) -> None:
        self.url, self.kubelet = url, kubelet
        self.failures: list[str] = []
        self.slowest = {"healthz": 0.0, "allocate": 0.0}
        self.answers = {"healthz": 0, "allocate": 0}
        self.restarting = threading.Event()  # Allocate is not asked while the kubelet is away
        self.calling = threading.Lock()  # held over each Allocate: the restart waits for the one in flight
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _timed(self, name: str, call: Callable[[], object]) -> None:
        started = time.monotonic()
        try:
            call()
        except Exception as exc:
            self.failures.append(f"{name}: {exc!r}")
            return
        self.slowest[name] = max(self.slowest[name], time.monotonic() - started)
        self.answers[name] += 1

    def _healthz(self) -> None:
        code, body = http_get(self.url)
        if code != 200 and not self.restarting.is_set():
            raise AssertionError(f"/healthz {code} {body.strip()}")

    def _run(self) -> None:
        while not self._stop.wait(0.2):
            self._timed("healthz", self._healthz)
            with self.calling:
                if not self.restarting.is_set():
                    self._timed("allocate", lambda: self.kubelet.allocate(["cola-a"], timeout=PROBE_TIMEOUT))

    def __enter__(self) -> Watch:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(10)

    def check(self) -> None:
        assert self.failures == [], self.failures[:5]
        assert self.answers["healthz"] >= 10 and self.answers["allocate"] >= 5, self.answers
        assert max(self.slowest.values()) < PROBE_TIMEOUT, self.slowest


def restart_kubelet_and_wait(kubelet: FakeKubelet, watch: Watch) -> float:
    """Restart the kubelet; the seconds until Register and a ListAndWatch with every device Healthy."""
    registered = len(kubelet.successful_registrations())
    watch.restarting.set()
    with watch.calling:  # the fake kubelet's restart cancels its own calls in flight
        kubelet.restart()
    started = time.monotonic()
    kubelet.wait_registered(registered + 1, timeout=BACK_WITHIN)
    kubelet.wait_devices(DEVICES, timeout=BACK_WITHIN)
    took = time.monotonic() - started
    watch.restarting.clear()
    return took


def refused(url: str, reason: str) -> float:
    _, text = http_get(url.replace("/healthz", "/metrics"))
    needle = f'colad_http_connections_refused_total{{reason="{reason}"}} '
    line = next(ln for ln in text.splitlines() if ln.startswith(needle))
    return float(line.rsplit(" ", 1)[1])


def test_a_flood_at_a_task_limit_starts_no_thread_and_a_kubelet_restart_registers_again(
    service: ColadService, kubelet: FakeKubelet
) -> None:
    kubelet.wait_registered(timeout=20)
    kubelet.wait_devices(DEVICES, timeout=20)
    address = metrics_address(service.run_dir)
    url = f"http://{address}/healthz"
    wait_until(lambda: http_get(url)[0] == 200, 20, "/healthz 200", logs=[service.log_path])
    plugin = service.pids()["plugin"]
    threads = threads_of(plugin)
    assert threads < 40, f"the plugin runs {threads} threads before any flood"
    with pids_group("colad-flood", [plugin], 64) as group:
        with flooding(address, idle_rate=40, rapid_rate=200) as flood, Watch(url, kubelet) as watch:
            wait_until(lambda: flood.counts.idle_opened >= 100, 20, "100 idle half-sent requests held")
            took = restart_kubelet_and_wait(kubelet, watch)
            time.sleep(3)  # the flood goes on over the new registration
            most = threads_of(plugin)
        assert group.refused() == 0, "the plugin hit pids.max"
    watch.check()
    assert took < BACK_WITHIN
    assert most <= threads + 8, f"{threads} threads before the flood, {most} during it"
    assert refused(url, "evicted") + refused(url, "timeout") > 0
    kubelet.allocate(["cola-b"])
    print(
        f"flood: {flood.counts.idle_opened} idle, {flood.counts.rapid} rapid; threads {threads}->{most};"
        f" back in {took:.2f} s; slowest {watch.slowest}"
    )


def test_a_flood_at_a_file_limit_does_not_spin_and_a_kubelet_restart_registers_again(
    service: ColadService, kubelet: FakeKubelet
) -> None:
    kubelet.wait_registered(timeout=20)
    kubelet.wait_devices(DEVICES, timeout=20)
    address = metrics_address(service.run_dir)
    url = f"http://{address}/healthz"
    wait_until(lambda: http_get(url)[0] == 200, 20, "/healthz 200", logs=[service.log_path])
    plugin = service.pids()["plugin"]
    before = soft_nofile(plugin)
    base = open_fds(plugin)
    try:
        with flooding(address, idle_rate=40, rapid_rate=200) as flood:
            wait_until(lambda: flood.counts.idle_opened >= 20, 20, "the flood under way")
            # Below what it holds: accept fails until some close. The loop must wait, not spin.
            set_nofile(plugin, open_fds(plugin) - 4)
            service.wait_log("metrics accept failed; pausing", timeout=20)  # the scrape itself may find no fd
            spent = cpu_seconds(plugin)
            time.sleep(3.0)
            spent = cpu_seconds(plugin) - spent
            # Room for the HTTP server's whole cap and lanes, less than it would take without its reserve.
            set_nofile(plugin, base + httpserver.FD_RESERVE + 16)
            with Watch(url, kubelet) as watch:
                wait_until(
                    lambda: watch.answers["healthz"] >= 5 or watch.failures[-2:] == ["stop"],
                    20,
                    "/healthz answering in the flood",
                    logs=[service.log_path],
                )
                took = restart_kubelet_and_wait(kubelet, watch)
                time.sleep(3)
            most = open_fds(plugin)
    finally:
        set_nofile(plugin, before)
    assert spent < 1.0, f"the plugin used {spent:.2f} s of CPU in 3 s with no descriptor free"
    watch.check()
    assert took < BACK_WITHIN
    assert most <= base + httpserver.FD_RESERVE + 16
    assert refused(url, "evicted") + refused(url, "fd_reserve") >= 1
    assert refused(url, "accept_failed") >= 1
    print(
        f"flood: {flood.counts.idle_opened} idle, {flood.counts.rapid} rapid; cpu {spent:.2f} s in 3 s;"
        f" fds {base}->{most}; back in {took:.2f} s; slowest {watch.slowest}"
    )
