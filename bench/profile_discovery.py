"""Where the discovery process spends its CPU, phase by phase, in this checkout.

Each phase runs Discovery(cfg).run() in a process of its own against a real QueueServer in a
driver process: /proc/<pid>/schedstat is discovery's CPU alone. Phases: `changes10`, `changes10000`
(200 one-device changes: add, make Unhealthy, remove) and `start10000` (spawn -> first snapshot).
`--profile` adds py-spy's top frames per phase. It drives discovery's classes, so it measures this
checkout only: bench/profile_roles.py compares checkouts, as processes.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve()
REPO = HERE.parent.parent
PHASES = ("changes10", "changes10000", "start10000")
CHANGES = 200


def config(root: str, nfd: bool) -> Any:
    """The bench's settings (CDI spec on, host-path check on), every path under `root`."""
    from colad.config.config import Config

    return Config(
        device_dir=f"{root}/colas",
        kubelet_dir=f"{root}/kubelet",
        run_dir=f"{root}/run",
        cdi_spec_dir=f"{root}/cdi",
        rescan_interval=3600.0,
        nfd_features_file=f"{root}/features.d/colad" if nfd else "",
    )


def role_main(root: str, nfd: bool) -> None:
    """The discovery role as supervisord runs it, minus supervisord."""
    from colad.discovery.main import Discovery
    from colad.runtime import log

    log.setup("discovery", "INFO")
    Discovery(config(root, nfd)).run()


def cpu_ns(pid: int) -> int:
    with open(f"/proc/{pid}/schedstat") as f:
        return int(f.read().split()[0])


def spy_args(out: str) -> list[str] | None:
    spy = shutil.which("py-spy") or shutil.which(str(Path(sys.executable).parent / "py-spy"))
    return [spy, "record", "--format", "raw", "-o", out, "--rate", "250", "--nonblocking"] if spy else None


class Receiver:
    """The plugin's end of the queue: the exact snapshot the deltas build, and when it came."""

    def __init__(self, path: str) -> None:
        from colad.queue.server import QueueServer

        self.cond = threading.Condition()
        self.latest: Any = None
        self.server = QueueServer(path, self.on_message)
        self.server.start()

    def on_message(self, message: Any, peer: object) -> None:
        from colad.queue.messages import DeviceSnapshot

        if isinstance(message, DeviceSnapshot):
            with self.cond:
                self.latest = message
                self.cond.notify_all()

    def wait(self, ok: Any, timeout: float = 120.0) -> float:
        deadline = time.monotonic() + timeout
        with self.cond:
            while self.latest is None or not ok(self.latest.devices):
                left = deadline - time.monotonic()
                if left <= 0:
                    raise TimeoutError("no such snapshot")
                self.cond.wait(left)
        return time.perf_counter()


def child_main(phase: str, root: str, out: str, spy_out: str | None, nfd: bool) -> None:
    kind, count = phase.rstrip("0123456789"), int(phase[len(phase.rstrip("0123456789")) :])
    cfg = config(root, nfd)
    colas = Path(cfg.device_dir)
    colas.mkdir(parents=True)
    os.mkdir(cfg.run_dir, 0o700)
    for i in range(count):
        (colas / f"dev{i:05d}").write_bytes(b"")
    receiver = Receiver(os.path.join(cfg.run_dir, "queue.sock"))
    args = [sys.executable, str(HERE), "--role", root] + (["--nfd"] if nfd else [])
    spy = spy_args(spy_out) if spy_out else None
    figures: dict[str, float] = {}
    spec = Path(cfg.cdi_spec_dir, "colad-myway5.com-cola.json")
    t0 = time.perf_counter()
    if kind == "start" and spy:
        proc = subprocess.Popen([*spy, "--", *args])
    else:
        proc = subprocess.Popen(args)
    try:
        t1 = receiver.wait(lambda d: len(d) == count)
        if kind == "start" and not spy:
            figures["first_snapshot_ms"] = (t1 - t0) * 1e3
            figures["cpu_to_snapshot_ms"] = cpu_ns(proc.pid) / 1e6
        while not spec.exists():
            time.sleep(0.001)
        if kind == "start" and not spy:
            figures["spec_written_ms"] = (time.perf_counter() - t0) * 1e3
        time.sleep(0.3)  # the turn's writes done
        if kind == "changes":
            attached = None
            if spy:
                attached = subprocess.Popen([*spy, "--pid", str(proc.pid)])
                time.sleep(1.0)
            before = cpu_ns(proc.pid)
            latencies = []
            for i in range(CHANGES):
                name, step = f"new{i // 3:04d}", i % 3
                path = colas / name
                start = time.perf_counter()
                if step == 0:
                    path.write_bytes(b"")
                    done = receiver.wait(lambda d, n=name: n in d.by_id)  # type: ignore[misc]
                elif step == 1:
                    path.write_text('health = "Unhealthy"\n')
                    done = receiver.wait(lambda d, n=name: n in d.by_id and not d.by_id[n].healthy)  # type: ignore[misc]
                else:
                    path.unlink()
                    done = receiver.wait(lambda d, n=name: n not in d.by_id)  # type: ignore[misc]
                latencies.append((done - start) * 1e3)
                time.sleep(0.02)  # one change at a time
            time.sleep(0.1)  # the last turn's writes
            figures["cpu_per_change_ms"] = (cpu_ns(proc.pid) - before) / 1e6 / CHANGES
            figures["latency_p50_ms"] = statistics.median(latencies)
            figures["latency_p99_ms"] = sorted(latencies)[int(len(latencies) * 0.99) - 1]
            if attached is not None:
                attached.send_signal(signal.SIGINT)
                attached.wait(60)
    finally:
        if kind == "start" and spy:
            time.sleep(0.5)
            proc.send_signal(signal.SIGINT)  # py-spy writes its file and ends its child
            proc.wait(60)
        else:
            proc.kill()
            proc.wait()
        receiver.server.stop()
    Path(out).write_text(json.dumps(figures))


def run_child(phase: str, spy_out: str | None, nfd: bool) -> dict[str, float]:
    root = tempfile.mkdtemp(prefix="pd-", dir="/tmp")  # short: the queue socket's path
    try:
        out = os.path.join(root, "figures.json")
        env = {**os.environ, "PYTHONPATH": str(REPO)}
        args = [sys.executable, str(HERE), "--child", phase, root, out] + (["--spy", spy_out] if spy_out else [])
        args += ["--nfd"] if nfd else []
        with open(os.path.join(root, "child.log"), "wb") as log_file:
            done = subprocess.run(args, env=env, cwd=REPO, stdout=log_file, stderr=subprocess.STDOUT, timeout=900)
        if done.returncode != 0 or not os.path.exists(out):
            tail = Path(root, "child.log").read_text(errors="replace")[-3000:]
            raise RuntimeError(f"{phase}: exit {done.returncode}\n{tail}")
        figures: dict[str, float] = json.loads(Path(out).read_text())
        return figures
    finally:
        shutil.rmtree(root, ignore_errors=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--phases", default=",".join(PHASES))
    parser.add_argument("--profile", action="store_true", help="one more round under py-spy")
    parser.add_argument("--nfd", action="store_true", help="also write the NFD feature file")
    parser.add_argument("--child", nargs=3, metavar=("PHASE", "ROOT", "OUT"), help=argparse.SUPPRESS)
    parser.add_argument("--spy", help=argparse.SUPPRESS)
    parser.add_argument("--role", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.role:
        role_main(args.role, args.nfd)
        return 0
    if args.child:
        phase, root, out = args.child
        child_main(phase, root, out, args.spy, args.nfd)
        return 0
    from bench import phases  # here, not at the top: the measured role process runs this file and imports nothing more

    run = lambda phase, raw: run_child(phase, raw, args.nfd)  # noqa: E731
    phases.measure(args.phases.split(","), args.rounds, "profile-discovery" if args.profile else "", run)
    return 0


if __name__ == "__main__":
    sys.exit(main())
