"""/readyz means "registered, streamed, list exact", under the real supervisord.

Across a kubelet restart the fake kubelet sees: 200 while colad is registered with the current
kubelet and the list it holds is the current one; 503 once the kubelet is gone, and through
the restart, until colad has registered again and the list went out; then 200. A device change
is reflected in the body. /healthz keeps its meaning.
"""

from __future__ import annotations

import threading
import time

import pytest

from tests.fakes.kubelet import FakeKubelet
from tests.helpers import http_get, metrics_address, wait_until
from tests.service import ColadService

pytestmark = pytest.mark.e2e
BASE = {"cocacola", "peisicola"}


def test_readyz_across_a_kubelet_restart(colad: ColadService, kubelet: FakeKubelet) -> None:
    kubelet.wait_devices(BASE, timeout=30)
    address = metrics_address(colad.run_dir)
    readyz, healthz = f"http://{address}/readyz", f"http://{address}/healthz"
    code, body = wait_until(lambda: (r := http_get(readyz))[0] == 200 and r, 30, "/readyz 200", logs=[colad.log_path])
    assert body == "ready: myway5.com/cola, 2 devices\n"
    assert http_get(healthz)[0] == 200

    # Poll all the way through the restart: no 200 may be seen between the kubelet going away
    # and colad's list reaching the new one.
    seen: list[tuple[float, int, str]] = []
    stop = threading.Event()

    def poll() -> None:
        while not stop.is_set():
            status, text = http_get(readyz)
            seen.append((time.monotonic(), status, text))
            time.sleep(0.02)

    poller = threading.Thread(target=poll, daemon=True)
    poller.start()
    try:
        kubelet.stop()
        stopped = time.monotonic()
        wait_until(lambda: seen and seen[-1][1] == 503, 15, "/readyz 503 with the kubelet gone")
        time.sleep(1.0)  # colad's safety timer and back-off run meanwhile: it must stay 503
        kubelet.start()
        registered = kubelet.wait_registered(count=2, timeout=30)
        kubelet.wait_devices(BASE, timeout=30)
        got_list = time.monotonic()
        wait_until(lambda: seen and seen[-1][1] == 200, 30, "/readyz 200 again", logs=[colad.log_path])
    finally:
        stop.set()
        poller.join(5)
    assert registered.resource_name == "myway5.com/cola"
    after_stop = [(t, s, text) for t, s, text in seen if t > stopped + 0.5]
    first_ready = next(t for t, s, _ in after_stop if s == 200)
    assert first_ready >= got_list - 0.5, "ready before the new kubelet held the list"
    not_ready = {text for _, s, text in after_stop if s == 503}
    assert not_ready, "never 503 during the restart"
    assert all(t >= got_list - 0.5 for t, s, _ in after_stop if s == 200)
    # Every reason named a resource (no empty or generic 503).
    assert all("myway5.com/cola: " in text or "no resources" in text for text in not_ready), not_ready


def test_readyz_follows_the_device_list(colad: ColadService, kubelet: FakeKubelet) -> None:
    kubelet.wait_devices(BASE, timeout=30)
    readyz = f"http://{metrics_address(colad.run_dir)}/readyz"
    wait_until(lambda: http_get(readyz)[0] == 200, 30, "/readyz 200", logs=[colad.log_path])
    colad.add("pepsi")
    kubelet.wait_devices(BASE | {"pepsi"}, timeout=30)
    wait_until(lambda: http_get(readyz) == (200, "ready: myway5.com/cola, 3 devices\n"), 30, "/readyz with 3 devices")
    status, body = http_get(f"http://{metrics_address(colad.run_dir)}/nothing")
    assert status == 404 and "/readyz" in body
