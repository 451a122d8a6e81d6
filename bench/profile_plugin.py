"""Where the plugin process spends its CPU, phase by phase, in this checkout.

Each phase runs `colad.plugin.main.Plugin` in a fresh process of its own: device snapshots posted as
the queue thread posts them, kubelet.sock changes reported as kubelet-watch reports them, and the
fake kubelet (tests/fakes) in a further process, so the process CPU measured is the plugin's.
Phases: `changes` (one-device changes), `restarts` (kubelet restarts), `start` (10,000 devices).
`--profile` adds py-spy's top frames. It drives the plugin's classes, so it measures this checkout only:
bench/compare_trees.py and bench/profile_allocate.py compare checkouts, as processes.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from bench import phases

HERE = Path(__file__).resolve()
REPO = HERE.parent.parent
RESOURCE = "myway5.com/cola"
PHASES = ("changes", "restarts", "start")


# ---- the fake kubelet, in a process of its own: commands on stdin, what it received on stdout ----
def kubelet_main(plugin_dir: str) -> None:
    from tests.fakes.kubelet import FakeKubelet

    kubelet = FakeKubelet(plugin_dir)
    out_lock = threading.Lock()

    def say(line: str) -> None:
        with out_lock:
            sys.stdout.write(line + "\n")
            sys.stdout.flush()

    def report() -> None:
        seen_reg = seen_upd = 0
        while True:
            with kubelet._cond:
                kubelet._cond.wait(1.0)
                regs, upds = kubelet._registrations[seen_reg:], kubelet._updates[seen_upd:]
            seen_reg, seen_upd = seen_reg + len(regs), seen_upd + len(upds)
            for r in regs:
                if r.ok:
                    say(f"reg {r.answered_at} {r.endpoint}")
            for u in upds:
                say(f"upd {u.at} {u.endpoint} {len(u.devices)}")

    threading.Thread(target=report, daemon=True).start()
    for command in sys.stdin:
        match command.split():
            case ["start"]:
                kubelet.start()
                say(f"started {time.monotonic()}")
            case ["restart"]:  # timed from the new kubelet's start, as bench/measure.py reregister() is
                kubelet.stop()
                started = time.monotonic()
                kubelet.start()
                say(f"started {started}")
            case ["quit"]:
                kubelet.stop()
                return


class Kubelet:
    """The child's handle on the kubelet process: what it received, waited for by condition."""

    def __init__(self, plugin_dir: str) -> None:
        env = {**os.environ, "PYTHONPATH": str(REPO)}
        self.proc = subprocess.Popen(
            [sys.executable, str(HERE), "--kubelet", plugin_dir],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            env=env,
            cwd=REPO,
        )
        self.cond = threading.Condition()
        self.lines: list[list[str]] = []
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            with self.cond:
                self.lines.append(line.split())
                self.cond.notify_all()

    def send(self, command: str) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(command + "\n")
        self.proc.stdin.flush()

    def wait(self, since: int, kind: str, count: int | None = None, timeout: float = 60.0) -> tuple[int, list[str]]:
        """The first line of `kind` after index `since` (an update: holding `count` devices)."""
        deadline = time.monotonic() + timeout
        with self.cond:
            while True:
                for i in range(since, len(self.lines)):
                    line = self.lines[i]
                    if line[0] == kind and (count is None or int(line[3]) == count):
                        return i + 1, line
                since = len(self.lines)
                if not self.cond.wait(max(0.0, deadline - time.monotonic())):
                    raise TimeoutError(f"kubelet: no {kind} {count}")

    def quit(self) -> None:
        self.send("quit")
        self.proc.wait(20)


# ---- discovery's sending end, in a process of its own (`start --queue`): its encoding is not the plugin's CPU ----
def sender_main(queue_socket: str, count: int) -> None:
    from colad.core.devices import Device, DeviceSet
    from colad.queue.client import QueueClient
    from colad.queue.messages import DeviceSnapshot

    snapshot = DeviceSnapshot(1, 1, DeviceSet.of(Device(f"cola-{i:05d}") for i in range(count)), True, RESOURCE)
    print("ready", flush=True)
    sys.stdin.readline()
    client = QueueClient(queue_socket)
    client.publish(snapshot)
    while not client.sent:
        time.sleep(0.002)
        client.flush()
    print("sent", flush=True)
    sys.stdin.readline()


# ---- one phase, in a process of its own ----
class Spy:
    """py-spy recording this process while a phase is measured (raw collapsed stacks)."""

    def __init__(self, out: str | None) -> None:
        self.out, self.proc = out, None
        if out and (spy := shutil.which("py-spy") or shutil.which(str(Path(sys.executable).parent / "py-spy"))):
            args = [spy, "record", "--pid", str(os.getpid()), "--format", "raw", "-o", out, "--rate", "250"] + (
                ["--idle"] if os.environ.get("PP_IDLE") else []
            )
            self.proc = subprocess.Popen([*args, "--nonblocking"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            time.sleep(1.0)  # attached

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.send_signal(signal.SIGINT)
            self.proc.wait(30)


def child_main(phase: str, root: str, out: str, spy_out: str | None, via_queue: bool = False) -> None:
    from colad.config.config import Config
    from colad.core.devices import Device, DeviceSet
    from colad.plugin.main import Plugin
    from colad.queue.framing import Peer
    from colad.queue.messages import DeviceSnapshot, KubeletState
    from colad.runtime import log

    log.setup("plugin", "INFO")
    cfg = Config(
        device_dir=f"{root}/colas",
        kubelet_dir=f"{root}/kubelet",
        run_dir=f"{root}/run",
        cdi_spec_dir=f"{root}/cdi",
        metrics_address="127.0.0.1:0",
        pod_resources_socket="",
        rescan_interval=3600.0,
        cdi="off",
        host_path_check=False,
    )
    peer = Peer(os.getpid(), 0, 0)
    kubelet = Kubelet(cfg.kubelet_dir)
    kubelet.send("start")
    at, _ = kubelet.wait(0, "started")
    count = 10_000 if phase == "start" else int(os.environ.get("PROFILE_PLUGIN_DEVICES", "10"))
    held = {f"cola-{i:05d}": Device(f"cola-{i:05d}") for i in range(count)}
    seq = 0

    def send() -> float:
        nonlocal seq
        seq += 1
        devices = DeviceSet.of(held[k] for k in sorted(held))  # unchanged devices stay the same objects
        sent = time.monotonic()
        plugin.on_message(DeviceSnapshot(1, seq, devices, True, RESOURCE), peer)
        return sent

    results: dict[str, Any] = {}
    sender = None
    if via_queue:
        args = [sys.executable, str(HERE), "--sender", cfg.queue_socket, str(len(held))]
        sender = subprocess.Popen(args, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        assert sender.stdin is not None and sender.stdout is not None
        sender.stdout.readline()
    spy = Spy(spy_out) if phase == "start" else None
    cpu0 = time.process_time()
    started = time.monotonic()
    plugin = Plugin(cfg)
    thread = threading.Thread(target=plugin.run, name="life-cycle")
    thread.start()
    if sender is not None:
        sender.stdin.write("go\n")  # type: ignore[union-attr]
        sender.stdin.flush()  # type: ignore[union-attr]
    else:
        send()
    at, reg = kubelet.wait(at, "reg")
    at, upd = kubelet.wait(at, "upd", len(held))
    if phase == "start":
        results = {
            "cpu_ms": (time.process_time() - cpu0) * 1000,
            "registered_ms": (float(reg[1]) - started) * 1000,
            "full_list_ms": (float(upd[1]) - started) * 1000,
        }
    time.sleep(1.0)  # the start's follow-up work is not the phase's
    if spy is not None:
        spy.stop()
    spy = Spy(spy_out) if phase != "start" else None
    cpu0, latencies, full = time.process_time(), [], []
    if phase == "changes":
        for i in range(200):
            time.sleep(0.025)
            name = f"more-{i // 2:04d}"
            if i % 2 == 0:
                held[name] = Device(name)
            else:
                del held[name]
            sent = send()
            at, upd = kubelet.wait(at, "upd", len(held))
            latencies.append(float(upd[1]) - sent)
        ops = 200
    elif phase == "restarts":
        for n in range(20):
            kubelet.send("restart")
            at, line = kubelet.wait(at, "started")
            plugin.on_message(KubeletState(1, n + 1), peer)
            at, reg = kubelet.wait(at, "reg")
            at, upd = kubelet.wait(at, "upd", len(held))
            latencies.append(float(reg[1]) - float(line[1]))
            full.append(float(upd[1]) - float(line[1]))
        ops = 20
    if phase != "start":
        results = {"cpu_ms": (time.process_time() - cpu0) * 1000 / ops, **_pcts("latency", latencies)}
        if full:
            results.update(_pcts("full_list", full))
    if spy is not None:
        spy.stop()
    if sender is not None:
        sender.communicate("done\n", timeout=20)
    plugin.stop()
    thread.join(20)
    kubelet.quit()
    Path(out).write_text(json.dumps(results))


def _pcts(name: str, seconds: list[float]) -> dict[str, float]:
    ordered = sorted(seconds)
    pick = lambda p: ordered[min(len(ordered) - 1, round(p / 100 * (len(ordered) - 1)))] * 1000  # noqa: E731
    return {f"{name}_p50_ms": pick(50), f"{name}_p99_ms": pick(99)}


# ---- the driver: rounds of every phase; medians and spreads ----
def run_child(phase: str, spy_out: str | None, via_queue: bool = False) -> dict[str, float]:
    with tempfile.TemporaryDirectory(prefix="pp-") as root:  # short: Unix socket paths
        out = os.path.join(root, "result.json")
        env = {k: v for k, v in os.environ.items() if not k.startswith("COLAD_")}
        env["PYTHONPATH"] = str(REPO)
        args = [sys.executable, str(HERE), "--child", phase, root, out] + (["--spy", spy_out] if spy_out else [])
        args += ["--queue"] if via_queue else []
        with open(os.path.join(root, "child.log"), "wb") as log_file:
            done = subprocess.run(args, env=env, cwd=REPO, stdout=log_file, stderr=subprocess.STDOUT, timeout=600)
        if done.returncode != 0 or not os.path.exists(out):
            tail = Path(root, "child.log").read_text(errors="replace")[-3000:]
            raise RuntimeError(f"{phase}: exit {done.returncode}\n{tail}")
        figures: dict[str, float] = json.loads(Path(out).read_text())
        return figures


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--phases", default=",".join(PHASES))
    parser.add_argument("--profile", action="store_true", help="one more round under py-spy")
    parser.add_argument("--child", nargs=3, metavar=("PHASE", "ROOT", "OUT"), help=argparse.SUPPRESS)
    parser.add_argument("--spy", help=argparse.SUPPRESS)
    parser.add_argument("--queue", action="store_true", help="start: the snapshot through the real queue socket")
    parser.add_argument("--devices", type=int, default=10, help="devices held in `changes` and `restarts`")
    parser.add_argument("--kubelet", help=argparse.SUPPRESS)
    parser.add_argument("--sender", nargs=2, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.kubelet:
        kubelet_main(args.kubelet)
        return 0
    if args.sender:
        sender_main(args.sender[0], int(args.sender[1]))
        return 0
    if args.child:
        phase, root, out = args.child
        child_main(phase, root, out, args.spy, args.queue)
        return 0
    os.environ["PROFILE_PLUGIN_DEVICES"] = str(args.devices)  # the children inherit it
    run = lambda phase, raw: run_child(phase, raw, args.queue)  # noqa: E731
    phases.measure(args.phases.split(","), args.rounds, "profile-plugin" if args.profile else "", run)
    return 0


if __name__ == "__main__":
    sys.exit(main())
