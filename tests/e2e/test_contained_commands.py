"""Probes and prepare commands that leave processes behind, under the real supervisord.

The probe (every 0.3 s on two devices) and the prepare command each start daemons that escape
their process group: a double fork into a new session, one with its environment cleared, a
daemon with children of its own. Nothing they start outlives them (sampled while the probes
run, after each PreStartContainer whether it succeeds or times out), no zombie piles up in
discovery, and when colad stops while a probe and a prepare hang with grandchildren, nothing
they started remains. Each process is found in /proc by a `sleep` argument unique to the test.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from tests.e2e.test_hostile_plugin import sample
from tests.fakes.kubelet import FakeKubelet
from tests.helpers import wait_until
from tests.integration.jobs.test_commands import survivors, token, zombies_of
from tests.service import ColadService

pytestmark = pytest.mark.e2e
DEVICES = {"cocacola": "Healthy", "peisicola": "Healthy"}
ESCAPES = """
(setsid sleep {tok} &)
(env -i /usr/bin/setsid /bin/sleep {tok} &)
(setsid sh -c 'sleep {tok} & sleep {tok} & wait' &)
"""
DAEMONS = 5  # processes holding the token that ESCAPES starts: a sleep, a sleep, and a shell with two sleeps
PROBE = "#!/bin/sh\n" + ESCAPES + '[ -e "{dir}/probe.hang" ] && {{ echo checking; exec sleep {tok}; }}\nexit 0\n'
PREPARE = "#!/bin/sh\n" + ESCAPES + '[ -e "{dir}/prepare.hang" ] && {{ echo resetting; exec sleep {tok}; }}\nexit 0\n'


class Service:
    def __init__(self, short_tmp: Path, prepare_timeout: float) -> None:
        self.dir = short_tmp
        self.probe_tok, self.prepare_tok = token(), token()
        probe, prepare = short_tmp / "probe.sh", short_tmp / "prepare.sh"
        probe.write_text(PROBE.format(tok=self.probe_tok, dir=short_tmp))
        prepare.write_text(PREPARE.format(tok=self.prepare_tok, dir=short_tmp))
        probe.chmod(0o755)
        prepare.chmod(0o755)
        env = {
            "COLAD_PROBE": str(probe),
            "COLAD_PROBE_INTERVAL": "0.3",
            "COLAD_PROBE_TIMEOUT": "20",
            "COLAD_PREPARE": str(prepare),
            "COLAD_PREPARE_TIMEOUT": str(prepare_timeout),
        }
        self.colad = ColadService(short_tmp, extra_env=env)
        self.colad.add(*DEVICES)

    def gone(self, tok: str, timeout: float = 5.0) -> float:
        began = time.monotonic()
        wait_until(lambda: not survivors(tok), timeout, f"no process left holding {tok}: {survivors(tok)}")
        return time.monotonic() - began


@pytest.fixture
def service(short_tmp: Path, kubelet: FakeKubelet) -> Iterator[Service]:
    svc = Service(short_tmp, prepare_timeout=1.5)
    svc.colad.start()
    yield svc
    rc = svc.colad.stop()
    assert rc == 0, f"supervisord exited with {rc}\n" + svc.colad.log()[-4000:]
    svc.gone(svc.probe_tok)
    svc.gone(svc.prepare_tok)


def test_escaping_daemons_of_probes_and_prepares_never_outlive_them(service: Service, kubelet: FakeKubelet) -> None:
    colad = service.colad
    kubelet.wait_devices(DEVICES, timeout=30)
    discovery = colad.pids()["discovery"]
    peak_alive = peak_zombies = samples = 0
    end = time.monotonic() + 10.0  # ~30 probe runs per device
    while time.monotonic() < end:
        peak_alive = max(peak_alive, len(survivors(service.probe_tok)))
        peak_zombies = max(peak_zombies, zombies_of(discovery))
        samples += 1
        time.sleep(0.05)
    print(f"over 10 s of probes: {samples} samples, peak live daemons {peak_alive}, peak zombies {peak_zombies}")
    # Two probes in flight at most, each with its daemons until it ends (killed at its exit).
    assert peak_alive <= 2 * DAEMONS, peak_alive
    assert peak_zombies <= 8, peak_zombies
    kubelet.wait_devices(DEVICES, timeout=10)  # every probe run was healthy: none was killed early
    # A fault of the probe: one line per command, every process counted.
    assert len(colad.log_lines('msg="probe left processes running; killed"')) == 1
    leftovers = 'colad_input_rejected_total{reason="command_leftovers",role="discovery"}'
    wait_until(lambda: (sample(colad, leftovers) or 0) >= 20, 10, "the probes' leftovers counted")

    kubelet.pre_start_container(["cocacola"])
    print(f"after a prepare that succeeded: gone in {service.gone(service.prepare_tok):.3f}s")
    colad.wait_log('msg="prepare left processes running; killed" resource=myway5.com/cola')
    (service.dir / "prepare.hang").touch()
    with pytest.raises(grpc.RpcError) as info:
        kubelet.pre_start_container(["peisicola"])
    assert info.value.code() == grpc.StatusCode.FAILED_PRECONDITION  # type: ignore[attr-defined]
    assert info.value.details().endswith("timed out after 1.5s: resetting")  # type: ignore[attr-defined]
    print(f"after a prepare that timed out: gone in {service.gone(service.prepare_tok):.3f}s")
    assert zombies_of(colad.pids()["plugin"]) == 0


def test_stopping_colad_kills_running_commands_and_what_they_started(short_tmp: Path, kubelet: FakeKubelet) -> None:
    svc = Service(short_tmp, prepare_timeout=20)
    colad = svc.colad
    colad.start()
    try:
        kubelet.wait_devices(DEVICES, timeout=30)
        (short_tmp / "probe.hang").touch()
        (short_tmp / "prepare.hang").touch()
        errors: list[grpc.RpcError] = []

        def prepare() -> None:
            try:
                kubelet.pre_start_container(["cocacola"], timeout=30)
            except grpc.RpcError as exc:
                errors.append(exc)

        caller = threading.Thread(target=prepare)
        caller.start()
        # The hung prepare and a hung probe, each with its four daemons and their children.
        wait_until(lambda: len(survivors(svc.prepare_tok)) >= 6, 20, "the prepare and its daemons running")
        wait_until(lambda: len(survivors(svc.probe_tok)) >= 6, 20, "a hung probe and its daemons running")
    finally:
        rc = colad.stop()
    assert rc == 0, f"supervisord exited with {rc}\n" + colad.log()[-4000:]
    caller.join(30)
    assert not caller.is_alive() and len(errors) == 1  # the kubelet got an answer, not a hang
    error = errors[0]
    assert error.code() == grpc.StatusCode.FAILED_PRECONDITION, error  # type: ignore[attr-defined]
    assert error.details().endswith("killed by SIGKILL: resetting"), error  # type: ignore[attr-defined]
    took = max(svc.gone(svc.probe_tok, 3.0), svc.gone(svc.prepare_tok, 3.0))
    print(f"after colad stopped, the commands' processes were gone within {took:.3f}s")
