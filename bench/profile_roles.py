"""What the two small roles cost, for this checkout and others (A/B, interleaved round by round).

Each round starts `python -m colad discovery` and `colad kubelet-watch` from each tree (its own
directory, PYTHONPATH and interpreter: installed.tree_python) against a queue socket that takes and
drops every frame, and reports: PSS once the role has published (smaps_rollup; discovery over 10 and
10,000 empty device files), the start to the role's first log line, and kubelet-watch's CPU per
kubelet checkpoint rewrite (a dot-prefixed temporary file, fsync, rename over
kubelet_internal_checkpoint, as the kubelet does after each update).
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from bench import installed

REPO = Path(__file__).resolve().parent.parent
CHECKPOINTS = 300


def sink(path: str) -> threading.Event:
    """A queue socket that accepts every connection and drops what it reads; set once a frame came."""
    got = threading.Event()
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(path)
    server.listen(8)

    def drain(conn: socket.socket) -> None:
        with conn:
            while conn.recv(1 << 16):
                got.set()

    def accept() -> None:
        while True:
            try:
                conn, _ = server.accept()
            except OSError:
                return
            threading.Thread(target=drain, args=(conn,), daemon=True).start()

    threading.Thread(target=accept, daemon=True).start()
    return got


def pss_kib(pid: int) -> int:
    with open(f"/proc/{pid}/smaps_rollup") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("Pss:"))


def cpu_ms(pid: int) -> float:
    with open(f"/proc/{pid}/schedstat") as f:
        return int(f.read().split()[0]) / 1e6


def start(tree: Path, role: str, root: Path) -> tuple[subprocess.Popen[bytes], float]:
    (root / "colad.toml").write_text("# comments only, as the shipped sample\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith("COLAD_")}
    env.update(
        PYTHONPATH=str(tree),
        COLAD_CONFIG=str(root / "colad.toml"),
        COLAD_DEVICE_DIR=str(root / "colas"),
        COLAD_KUBELET_DIR=str(root / "kubelet"),
        COLAD_RUN_DIR=str(root / "run"),
        COLAD_CDI_SPEC_DIR=str(root / "cdi"),
    )
    started = time.monotonic()
    python = installed.tree_python(tree)
    proc = subprocess.Popen(
        [python, "-m", "colad", role], cwd=tree, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT
    )
    assert proc.stdout is not None
    proc.stdout.readline()
    first_line = (time.monotonic() - started) * 1000
    threading.Thread(target=proc.stdout.read, daemon=True).start()  # never let the pipe fill
    return proc, first_line


def checkpoint(kubelet_dir: Path, n: int) -> None:
    fd, tmp = tempfile.mkstemp(prefix=".", dir=kubelet_dir)
    with os.fdopen(fd, "w") as handle:
        json.dump({"Data": {"PodDeviceEntries": [], "RegisteredDevices": {"r": [str(n)]}}, "Checksum": 0}, handle)
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(tmp, kubelet_dir / "kubelet_internal_checkpoint")


def settle(pid: int, quiet_s: float = 0.5, limit_s: float = 60.0) -> None:
    """Until the process used no CPU for `quiet_s`."""
    end, last = time.monotonic() + limit_s, -1.0
    while time.monotonic() < end:
        now = cpu_ms(pid)
        if now == last:
            return
        last = now
        time.sleep(quiet_s)


def one(tree: Path, devices: int) -> dict[str, float]:
    with tempfile.TemporaryDirectory(prefix="colad-roles-", dir="/tmp") as tmp:
        root = Path(tmp)
        for d in ("colas", "kubelet", "run", "cdi"):
            (root / d).mkdir(mode=0o700)
        for i in range(devices):
            (root / "colas" / str(i)).write_bytes(b"")
        got = sink(str(root / "run" / "queue.sock"))
        out: dict[str, float] = {}
        proc, out["discovery first line ms"] = start(tree, "discovery", root)
        got.wait(60)
        settle(proc.pid)
        out[f"discovery PSS KiB at {devices}"] = pss_kib(proc.pid)
        proc.terminate()
        proc.wait()
        if devices <= 10:
            proc, out["kubelet-watch first line ms"] = start(tree, "kubelet-watch", root)
            settle(proc.pid)
            out["kubelet-watch PSS KiB"] = pss_kib(proc.pid)
            before = cpu_ms(proc.pid)
            for n in range(CHECKPOINTS):
                checkpoint(root / "kubelet", n)
                time.sleep(0.002)
            settle(proc.pid, 0.3)
            out["kubelet-watch CPU per checkpoint ms"] = (cpu_ms(proc.pid) - before) / CHECKPOINTS
            proc.terminate()
            proc.wait()
        return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--old", action="append", default=[], help="NAME=TREE, another checkout to compare with")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    trees = {"new": REPO, **{k: Path(v) for k, v in (o.split("=", 1) for o in args.old)}}
    results: dict[str, dict[str, list[float]]] = {name: {} for name in trees}
    for r in range(args.rounds):
        order = list(trees) if r % 2 == 0 else list(reversed(trees))
        for devices in (10, 10_000):
            for name in order:
                for key, value in one(trees[name], devices).items():
                    results[name].setdefault(key, []).append(value)
        print(f"round {r + 1} done", file=sys.stderr)
    for key in results["new"]:
        cells = []
        for name in trees:
            values = results[name][key]
            cells.append(f"{name} {statistics.median(values):9.2f} [{min(values):.2f}..{max(values):.2f}]")
        ratio = "".join(
            f"   {n}/new {statistics.median(results[n][key]) / statistics.median(results['new'][key]):.2f}"
            for n in trees
            if n != "new"
        )
        print(f"{key:38} " + "   ".join(cells) + ratio)
    return 0


if __name__ == "__main__":
    sys.exit(main())
