"""PreStartContainer runs the resource's prepare command, under the real supervisord.

With `prepare` set, colad registers with pre_start_required and GetDevicePluginOptions agrees (the
fake kubelet checks both); the kubelet's pre_start_container() runs the command with the device
IDs; a failure or a hang past prepare_timeout answers FAILED_PRECONDITION naming the device and
the command's reason, well inside the kubelet's 30 s, and is counted. A device file's own
prepare crosses the queue and runs instead, for that device; it is ignored on a resource without one.
"""

from __future__ import annotations

import json
import shlex
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from tests.e2e.test_hostile_plugin import sample
from tests.fakes.kubelet import FakeKubelet
from tests.helpers import wait_until
from tests.service import ColadService

pytestmark = pytest.mark.e2e
BASE = {"cocacola", "peisicola"}
# Records its arguments and COLA_DEVICES; fails with a reason for a device that has a .fail file,
# hangs (with a child that outlives it) for one that has a .hang file.
SCRIPT = """
out="$1"
shift
echo "$* devices=$COLA_DEVICES resource=$COLA_RESOURCE_NAME" >> "$out/calls"
for id in "$@"; do
  if [ -e "$out/$id.hang" ]; then sleep 60 & echo "resetting $id"; sleep 60; fi
  if [ -e "$out/$id.fail" ]; then echo "firmware missing for $id"; exit 3; fi
done
"""


def _service(short_tmp: Path, *, resource_prepare: bool = True) -> tuple[ColadService, Path, Path]:
    out = short_tmp / "prep"
    out.mkdir()
    script = short_tmp / "prepare.sh"
    script.write_text(SCRIPT)
    command = shlex.join(["/bin/sh", str(script), str(out)])
    env = {"COLAD_PREPARE": command, "COLAD_PREPARE_TIMEOUT": "1.5"} if resource_prepare else {}
    colad = ColadService(short_tmp, extra_env=env)
    colad.add(*BASE)
    return colad, out, script


@pytest.fixture
def prepared(short_tmp: Path, kubelet: FakeKubelet) -> Iterator[tuple[ColadService, Path]]:
    colad, out, _ = _service(short_tmp)
    colad.start()
    yield colad, out
    rc = colad.stop()
    assert rc == 0, f"supervisord exited with {rc}\n" + colad.log()[-4000:]


def metric(colad: ColadService, result: str) -> float | None:
    return sample(colad, f'colad_pre_start_requests_total{{resource="myway5.com/cola",result="{result}"}}')


def test_prepare_runs_with_the_device_ids(prepared: tuple[ColadService, Path], kubelet: FakeKubelet) -> None:
    colad, out = prepared
    kubelet.wait_devices(BASE, timeout=30)
    registration = kubelet.wait_registered(timeout=30)
    assert registration.options == (True, True) and kubelet.options() == (True, True)
    kubelet.pre_start_container(["peisicola", "cocacola"])
    calls = (out / "calls").read_text()
    assert calls == "peisicola cocacola devices=peisicola,cocacola resource=myway5.com/cola\n"
    assert metric(colad, "success") == 1.0
    colad.wait_log("msg=prepared resource=myway5.com/cola devices=peisicola,cocacola commands=1")


def test_prepare_failure_names_the_device_and_the_reason(
    prepared: tuple[ColadService, Path], kubelet: FakeKubelet
) -> None:
    colad, out = prepared
    kubelet.wait_devices(BASE, timeout=30)
    (out / "peisicola.fail").touch()
    with pytest.raises(grpc.RpcError) as info:
        kubelet.pre_start_container(["cocacola", "peisicola"])
    assert info.value.code() == grpc.StatusCode.FAILED_PRECONDITION  # type: ignore[attr-defined]
    details = info.value.details()  # type: ignore[attr-defined]
    assert details == "prepare command /bin/sh failed for device cocacola,peisicola: firmware missing for peisicola"
    assert metric(colad, "failed") == 1.0 and metric(colad, "success") == 0.0
    (out / "peisicola.fail").unlink()
    kubelet.pre_start_container(["peisicola"])  # fixed: the next container starts
    assert metric(colad, "success") == 1.0


def test_prepare_hang_is_killed_within_its_timeout(prepared: tuple[ColadService, Path], kubelet: FakeKubelet) -> None:
    colad, out = prepared
    kubelet.wait_devices(BASE, timeout=30)
    (out / "cocacola.hang").touch()
    started = time.monotonic()
    with pytest.raises(grpc.RpcError) as info:
        kubelet.pre_start_container(["cocacola"], timeout=30)
    took = time.monotonic() - started
    assert info.value.code() == grpc.StatusCode.FAILED_PRECONDITION  # type: ignore[attr-defined]
    assert info.value.details().endswith("timed out after 1.5s: resetting cocacola")  # type: ignore[attr-defined]
    assert 1.4 < took < 10, took
    assert metric(colad, "timeout") == 1.0
    # Allocate and the list are not held up meanwhile, and a call for an unknown device is refused.
    assert kubelet.allocate(["cocacola"])["envs"]["COLA_DEVICES"] == "cocacola"
    with pytest.raises(grpc.RpcError) as unknown:
        kubelet.pre_start_container(["nope"])
    assert unknown.value.code() == grpc.StatusCode.NOT_FOUND  # type: ignore[attr-defined]
    assert metric(colad, "not_found") == 1.0


def test_without_prepare_nothing_is_required(colad: ColadService, kubelet: FakeKubelet) -> None:
    kubelet.wait_devices(BASE, timeout=30)
    assert kubelet.wait_registered(timeout=30).options == (False, True) and kubelet.options() == (False, True)


def _own_prepare(script: Path, out: Path) -> str:
    """A device file whose own prepare is SCRIPT writing to `out` (TOML strings, JSON-quoted)."""
    return "prepare = [" + ", ".join(json.dumps(a) for a in ("/bin/sh", str(script), str(out))) + "]\n"


def test_a_device_prepare_runs_instead_of_the_resource_one(short_tmp: Path, kubelet: FakeKubelet) -> None:
    colad, out, script = _service(short_tmp)
    own = short_tmp / "own"
    own.mkdir()
    (colad.device_dir / "peisicola").write_text(_own_prepare(script, own))
    (colad.device_dir / "sprite").write_text("prepare = []\n")  # none for this device
    colad.start()
    try:
        kubelet.wait_devices(BASE | {"sprite"}, timeout=30)
        assert kubelet.wait_registered(timeout=30).options == (True, True)
        kubelet.pre_start_container(["peisicola", "sprite", "cocacola"])
        assert (own / "calls").read_text() == "peisicola devices=peisicola resource=myway5.com/cola\n"
        assert (out / "calls").read_text() == "cocacola devices=cocacola resource=myway5.com/cola\n"
        colad.wait_log("msg=prepared resource=myway5.com/cola devices=peisicola,sprite,cocacola commands=2")
        # The file loses its own prepare: the change crosses the queue, the resource's runs for it.
        (colad.device_dir / "peisicola").write_text("")

        def resource_ran_it() -> bool:
            kubelet.pre_start_container(["peisicola"])
            return "peisicola devices=peisicola" in (out / "calls").read_text()

        wait_until(resource_ran_it, 30, "the resource's prepare for peisicola", interval=0.2)
    finally:
        rc = colad.stop()
    assert rc == 0, f"supervisord exited with {rc}\n" + colad.log()[-4000:]


def test_a_device_prepare_without_a_resource_prepare_requires_nothing(short_tmp: Path, kubelet: FakeKubelet) -> None:
    # pre_start_required follows the resource alone (fixed at Register): the device's prepare is
    # not run, and the kubelet is never asked for PreStartContainer (the fake fails a call).
    colad, out, script = _service(short_tmp, resource_prepare=False)
    (colad.device_dir / "peisicola").write_text(_own_prepare(script, out))
    colad.start()
    try:
        kubelet.wait_devices(BASE, timeout=30)
        assert kubelet.wait_registered(timeout=30).options == (False, True) and kubelet.options() == (False, True)
        assert not (out / "calls").exists()
        warned = colad.wait_log("device prepare ignored", timeout=30)
        assert len(warned) == 1 and "devices=1 first=peisicola" in warned[0], warned
        (colad.device_dir / "fanta").write_text("")  # another change: the same ignored set, no new line
        kubelet.wait_devices(BASE | {"fanta"}, timeout=30)
        assert len(colad.log_lines("device prepare ignored")) == 1
    finally:
        rc = colad.stop()
    assert rc == 0, f"supervisord exited with {rc}\n" + colad.log()[-4000:]


def test_a_burst_of_slow_prepares_leaves_allocate_a_worker(short_tmp: Path, kubelet: FakeKubelet) -> None:
    # 16 PreStartContainer calls whose prepare takes 3 s: at most MAX_PRE_STARTS are taken (4 run, the
    # others wait for a turn), the rest are RESOURCE_EXHAUSTED at once, and Allocate is answered meanwhile.
    from colad.deviceplugin.service import MAX_PRE_STARTS

    started = short_tmp / "started"
    command = shlex.join(["/bin/sh", "-c", f'echo "$1" >> {shlex.quote(str(started))}; sleep 3', "prepare"])
    colad = ColadService(short_tmp, extra_env={"COLAD_PREPARE": command, "COLAD_PREPARE_TIMEOUT": "10"})
    ids = [f"c{i:02}" for i in range(20)]
    colad.add(*ids)
    colad.start()
    try:
        kubelet.wait_devices(set(ids), timeout=30)
        codes: list[str] = []

        def pre_start(device_id: str) -> None:
            try:
                kubelet.pre_start_container([device_id], timeout=30)
                codes.append("OK")
            except grpc.RpcError as exc:
                codes.append(exc.code().name)

        callers = [threading.Thread(target=pre_start, args=(device_id,)) for device_id in ids[:16]]
        for caller in callers:
            caller.start()
        wait_until(lambda: started.exists() and len(started.read_text().split()) >= 4, 20, "four prepares running")
        # The calls beyond MAX_PRE_STARTS are answered at once; until then they hold gRPC's workers too.
        refused = 16 - MAX_PRE_STARTS
        wait_until(lambda: len(codes) >= refused or None, 10, "the calls beyond the limit refused")
        assert "OK" not in codes, codes  # every prepare taken is still running: Allocate meets them
        for _ in range(5):
            response = kubelet.allocate([ids[19]], timeout=5)
            assert response["envs"]["COLA_DEVICES"] == ids[19], response
        for caller in callers:
            caller.join(timeout=40)
        assert sorted(codes) == ["OK"] * MAX_PRE_STARTS + ["RESOURCE_EXHAUSTED"] * (16 - MAX_PRE_STARTS), codes
        assert (metric(colad, "busy") or 0) >= 1 and metric(colad, "success") == MAX_PRE_STARTS
    finally:
        rc = colad.stop()
    assert rc == 0, f"supervisord exited with {rc}\n" + colad.log()[-4000:]
