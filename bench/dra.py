"""The DRA phase of `make bench`: colad in DRA mode beside colad in device-plugin mode, in one run.

Starts this checkout's `colad supervise` twice: in device-plugin mode with its fake kubelet, and in DRA
mode with the fake plugin watcher, a fake API server holding its claims and slices, and the kubelet's
DRA client (tests/fakes). Alternating call by call and change by change: NodePrepareResources then
NodeUnprepareResources of one claim and of 16 at once beside Allocate of one and 16 callers, a claim
read by colad's own client, a device file change reaching the slices beside reaching the kubelet; then
start -> slices published beside start -> full list at 10 and 10,000 devices, and total PSS. Fills
results["dra"]; `yardsticks` names what bench/budgets.py holds each figure to; `table` prints them.
"""

from __future__ import annotations

import argparse
import itertools
import shutil
import statistics
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs

from bench import measure
from bench.floor import Yardstick
from bench.measure import at, ms, summary
from bench.subjects import Colad, Subject, settle
from colad.core.dra_registration import plugin_socket_path
from colad.core.namemap import dra_driver_name
from colad.core.names import DEFAULT_RESOURCE_NAME, DRA_MODE
from colad.kube.access import Credentials, from_kubeconfig
from colad.kube.client import KubeClient
from tests.fakes.apiserver import FakeApiServer, Pki
from tests.fakes.dra_kubelet import Claim, FakeDraKubelet, Outcome
from tests.fakes.pluginwatcher import FakePluginWatcher

DP, DRA = "colad", "colad-dra"  # the two subjects' names, and their keys in results["dra"]
# Every device file's name here is a DNS label ("cola-00", "change-0000", "0"): its published device name
# is the name itself (colad/core/slices.py device_names), so the pool is compared with the file names.
NODE = "node-1"
DRIVER = dra_driver_name(DEFAULT_RESOURCE_NAME)
NAMESPACE = "default"
TOKEN = "bench-token"
REFUSED = "RESOURCE_EXHAUSTED"  # a call past the DRA server's workers: made again at once, counted
PUBLISHED_TIMEOUT = 150.0
Progress = Callable[[str], None]


class DraFailure(RuntimeError):
    """colad in DRA mode answered a call wrongly: the phase stops, what it measured is kept."""


def dp_node(base: Path, args: argparse.Namespace, name: str) -> Subject:
    """colad in device-plugin mode with its fake kubelet, under base/name."""
    return Subject(Colad(args.python, args.colad_env, name=DP), base / name)


class DraNode:
    """colad in DRA mode on one node: its Subject (root, device files, a kubelet that must see no device
    plugin), its own fake API server and plugin watcher, and the kubelet's DRA client once registered."""

    def __init__(self, base: Path, args: argparse.Namespace, name: str, pki: Pki) -> None:
        root = base / name
        root.mkdir(parents=True)
        self.api = FakeApiServer(pki, tokens={TOKEN}).start()
        self.api.add_node(NODE)
        kubeconfig = self.api.write_kubeconfig(root / "kubeconfig", TOKEN)
        self.plugins_dir = root / "plugins"
        env = {
            "COLAD_MODE": DRA_MODE,
            "COLAD_NODE_NAME": NODE,
            "COLAD_KUBECONFIG": str(kubeconfig),
            "COLAD_PLUGINS_REGISTRY_DIR": str(root / "registry"),
            "COLAD_PLUGINS_DIR": str(self.plugins_dir),
        }
        self.subject = Subject(Colad(args.python, {**args.colad_env, **env}, name=DRA), root)
        self.watcher = FakePluginWatcher(root / "registry")
        self.reader = KubeClient(Credentials(from_kubeconfig(str(kubeconfig))), timeout=10.0)
        self.kubelet: FakeDraKubelet | None = None
        self.calls_at_start: dict[str, int] = {}
        self._claims = itertools.count()

    def start(self, names: set[str]) -> float:
        """Start over the files `names` (already there): seconds until the API server holds them all;
        `calls_at_start` counts the API calls made until then, by call_name."""
        self.watcher.start()
        self.subject.kubelet.start()  # a node's kubelet is there; colad in DRA mode must not register with it
        started = time.monotonic()
        self.subject.plugin.start(self.subject.root)
        published = self.api.wait_published(NODE, DRIVER, names, PUBLISHED_TIMEOUT)
        with self.api.lock:
            made = [call_name(method, path) for method, path, _ in self.api.requests]
        self.calls_at_start = {call: made.count(call) for call in sorted(set(made))}
        self.subject.plugin.wait_ready()
        return published - started

    def serve(self) -> FakeDraKubelet:
        """The kubelet's DRA client, once the plugin watcher has a connected endpoint."""
        if self.kubelet is None:
            self.watcher.wait_usable(DRIVER, timeout=60.0)
            self.kubelet = FakeDraKubelet(plugin_socket_path(str(self.plugins_dir), DRIVER))
        return self.kubelet

    def claim(self, device: str) -> Claim:
        """A new claim the scheduler allocated to `device`, held by the API server."""
        name = f"claim-{next(self._claims):05d}"
        stored = self.api.add_allocated_claim(NAMESPACE, name, DRIVER, NODE, [device])
        return Claim(NAMESPACE, name, stored["metadata"]["uid"])

    def slices(self) -> int:
        return len(self.api.node_slices(NODE, DRIVER))

    def violations(self) -> list[str]:
        found = [f"plugin watcher: {v}" for v in self.watcher.violations()]
        found += [f"DRA kubelet: {v}" for v in (self.kubelet.violations if self.kubelet else [])]
        if self.subject.kubelet.registrations:
            found.append(f"colad in DRA mode registered a device plugin: {self.subject.kubelet.registrations}")
        return found

    def close(self) -> list[str]:
        """Stop everything; the contract violations seen."""
        found = self.violations()
        if self.kubelet is not None:
            self.kubelet.close()
        try:
            self.subject.close()
        finally:
            self.watcher.stop()
            self.api.stop()
        return found


def dp_start(subject: Subject, names: set[str]) -> float:
    """Start over the files `names` (already there): seconds until the kubelet's list holds them all."""
    subject.kubelet.start()
    since = len(subject.kubelet.updates)
    started = time.monotonic()
    subject.plugin.start(subject.root)
    full = subject.full_list_after(since, names, timeout=PUBLISHED_TIMEOUT)
    subject.plugin.wait_ready()
    return full.at - started


def _answered(outcome: Outcome, claim: Claim, what: str) -> bool:
    """True once the call answered the claim without error; False when refused for want of a worker."""
    if outcome.failed.startswith(REFUSED):
        return False
    if outcome.failed or outcome.errors or claim.uid not in outcome.devices:
        raise DraFailure(f"{what} of {claim.name}: failed={outcome.failed!r} errors={outcome.errors}")
    return True


def prepare_unprepare(kubelet: FakeDraKubelet, claim: Claim) -> tuple[float, float, int]:
    """Prepare the claim, then unprepare it: the seconds of each (from the first attempt), and the refusals."""
    refused = 0
    started = time.perf_counter()
    while not _answered(kubelet.prepare([claim]), claim, "NodePrepareResources"):
        refused += 1
    prepared = time.perf_counter()
    while not _answered(kubelet.unprepare([claim]), claim, "NodeUnprepareResources"):
        refused += 1
    return prepared - started, time.perf_counter() - prepared, refused


def read_claim(node: DraNode, claim: Claim) -> float:
    """Seconds for colad's own client to read the claim from the fake API server: one API-server call."""
    started = time.perf_counter()
    node.reader.get_claim(claim.namespace, claim.name)
    return time.perf_counter() - started


def order(i: int, pair: Sequence[Any]) -> Sequence[Any]:
    return pair if i % 2 == 0 else list(reversed(pair))


def one_at_a_time(dp: Subject, dra: DraNode, devices: Sequence[str], count: int, got: dict[str, Any]) -> None:
    """`count` rounds of one Allocate, one claim prepared and unprepared, one claim read; the order turns."""
    kubelet = dra.serve()
    seconds: dict[str, list[float]] = {"allocate": [], "prepare": [], "unprepare": [], "read": []}
    refused = 0
    cpu = measure.cpu([dp, dra.subject])
    for i in range(count):
        device = devices[i % len(devices)]
        claim = dra.claim(device)
        for step in order(i, ("allocate", "prepare", "read")):
            if step == "allocate":
                seconds["allocate"] += measure.allocate_sequential([dp], [device], 1)[DP]
            elif step == "prepare":
                prepared, unprepared, refusals = prepare_unprepare(kubelet, claim)
                seconds["prepare"].append(prepared)
                seconds["unprepare"].append(unprepared)
                refused += refusals
            else:
                seconds["read"].append(read_claim(dra, claim))
    spent = measure.cpu_per_operation(cpu, measure.cpu([dp, dra.subject]), count)
    got[DP]["allocate_sequential"] = summary(seconds["allocate"])
    got[DP].setdefault("cpu_ms", {})["allocate_sequential"] = spent[DP]
    got[DRA]["prepare_sequential"] = {**summary(seconds["prepare"]), "refused": refused}
    got[DRA]["unprepare_sequential"] = summary(seconds["unprepare"])
    got[DRA].setdefault("cpu_ms", {})["prepare_unprepare_sequential"] = spent[DRA]
    got["api"]["claim_read_sequential"] = summary(seconds["read"])


def at_once(
    dp: Subject, dra: DraNode, devices: Sequence[str], count: int, callers: int, got: dict[str, Any], rounds: int = 4
) -> None:
    """`count` calls each from `callers` threads, in `rounds` rounds: Allocate, prepare + unprepare, claim
    reads, the order turning each round. Claim k holds device k modulo the devices: no two claims in
    flight share one, as the scheduler never allocates a device twice."""
    kubelet = dra.serve()
    per_round = count // rounds
    seconds: dict[str, list[float]] = {"allocate": [], "prepare": [], "unprepare": [], "read": []}
    refused = {"allocate": 0, "prepare": 0}
    lock = threading.Lock()

    def prepares(claims: list[Claim]) -> Callable[[int], None]:
        def work(ticket: int) -> None:
            prepared, unprepared, refusals = prepare_unprepare(kubelet, claims[ticket])
            with lock:
                seconds["prepare"].append(prepared)
                seconds["unprepare"].append(unprepared)
                refused["prepare"] += refusals

        return work

    def reads(claims: list[Claim]) -> Callable[[int], None]:
        def work(ticket: int) -> None:
            took = read_claim(dra, claims[ticket])
            with lock:
                seconds["read"].append(took)

        return work

    cpu: dict[str, float] = {DP: 0.0, DRA: 0.0}
    for r in range(rounds):
        claims = [dra.claim(devices[k % len(devices)]) for k in range(per_round)]
        for step in order(r, ("allocate", "prepare", "read")):
            if step == "allocate":
                before = measure.cpu([dp])
                answered, refusals = measure.allocate_concurrent([dp], devices, per_round, callers, rounds=1)[DP]
                cpu[DP] += measure.cpu_per_operation(before, measure.cpu([dp]), 1)[DP]["total"]
                seconds["allocate"] += answered
                refused["allocate"] += refusals
            elif step == "prepare":
                before = measure.cpu([dra.subject])
                measure.together(callers, per_round, prepares(claims))
                cpu[DRA] += measure.cpu_per_operation(before, measure.cpu([dra.subject]), 1)[DRA]["total"]
            else:
                measure.together(callers, per_round, reads(claims))
    calls = per_round * rounds
    got[DP]["allocate_concurrent"] = {**summary(seconds["allocate"]), "refused": refused["allocate"]}
    got[DP].setdefault("cpu_ms", {})["allocate_concurrent"] = {"total": round(cpu[DP] / calls, 3)}
    got[DRA]["prepare_concurrent"] = {**summary(seconds["prepare"]), "refused": refused["prepare"]}
    got[DRA]["unprepare_concurrent"] = summary(seconds["unprepare"])
    got[DRA].setdefault("cpu_ms", {})["prepare_unprepare_concurrent"] = {"total": round(cpu[DRA] / calls, 3)}
    got["api"]["claim_read_concurrent"] = summary(seconds["read"])


def slice_update(node: DraNode, names: set[str], name: str, create: bool) -> float:
    """Seconds from one create or unlink in the device directory to the pool listing the new set."""
    wanted = names | {name} if create else names - {name}
    started = time.monotonic()
    if create:
        node.subject.create(name)
    else:
        node.subject.unlink(name)
    published = node.api.wait_published(NODE, DRIVER, wanted, 30.0)
    names.clear()
    names.update(wanted)
    return published - started


def changes(dp: Subject, dra: DraNode, names: set[str], count: int, gap: float, got: dict[str, Any]) -> None:
    """`count` changes each, create and unlink by turns, alternating between the modes change by change;
    each after both are quiet (measure.quiet) and `gap` more."""
    seconds: dict[str, list[float]] = {DP: [], DRA: []}
    held = set(names)
    calls = len(dra.api.requests)
    for i in range(count):
        name, create = f"change-{i // 2:04d}", i % 2 == 0
        for mode in order(i, (DP, DRA)):
            measure.quiet([dp, dra.subject], gap)
            if mode == DP:
                seconds[DP].append(measure.change(dp, name, create))
            else:
                seconds[DRA].append(slice_update(dra, held, name, create))
    measure.quiet([dp, dra.subject], gap)
    got[DP]["propagation"] = summary(seconds[DP])
    got[DRA]["slice_update"] = summary(seconds[DRA])
    made = [call_name(method, path) for method, path, _ in dra.api.requests[calls:]]
    got[DRA]["api_calls_per_change"] = {call: round(made.count(call) / count, 2) for call in sorted(set(made))}


def call_name(method: str, path: str) -> str:
    """ "LIST slices" or "WATCH slices" for a GET of the collection, "PUT a slice" for one by name, else the
    method and path: a watch held open is one request, a list is a read the writes might have spared."""
    resource, _, query = path.partition("?")
    parent, _, last = resource.rpartition("/")
    if last == "resourceslices":
        if method != "GET":
            return f"{method} slices"
        watch = parse_qs(query).get("watch", [""])[0] in ("1", "true")  # the API server's strconv.ParseBool
        return "WATCH slices" if watch else "LIST slices"
    if parent.endswith("/resourceslices"):
        return f"{method} a slice"
    return f"{method} {parent}/{last}"


class Running:
    """The nodes of the phase that still run; close() ends each once, keeping the violations it saw."""

    def __init__(self, got: dict[str, Any]) -> None:
        self.got = got
        self.nodes: list[Subject | DraNode] = []

    def add(self, node: Subject | DraNode) -> None:
        self.nodes.append(node)

    def close(self, node: Subject | DraNode) -> None:
        self.nodes.remove(node)
        if isinstance(node, DraNode):
            self.got["violations"] += node.close()
        else:
            node.close()

    def close_all(self) -> None:
        while self.nodes:
            self.close(self.nodes[-1])


def starts(
    base: Path, args: argparse.Namespace, pki: Pki, names: set[str], running: Running, progress: Progress
) -> tuple[Subject, DraNode]:
    """`args.dra_starts` starts of each mode over `names`, alternated, each from a fresh root (a boot);
    the last of each keeps running."""
    got = running.got
    runs: dict[str, list[float]] = {DP: [], DRA: []}
    dp: Subject | None = None
    dra: DraNode | None = None
    for i in range(args.dra_starts):
        for mode in order(i, (DP, DRA)):
            progress(f"DRA phase: {mode} start {i + 1} of {args.dra_starts} over {len(names)} devices")
            if mode == DP:
                if dp is not None:
                    running.close(dp)
                dp = dp_node(base, args, f"dp-start-{i}")
                running.add(dp)
                dp.create(*names)
                runs[DP].append(dp_start(dp, names))
            else:
                if dra is not None:
                    running.close(dra)
                dra = DraNode(base, args, f"dra-start-{i}", pki)
                running.add(dra)
                dra.subject.create(*names)
                runs[DRA].append(dra.start(names))
                got[DRA]["slices"] = dra.slices()
                got[DRA]["api_calls_at_start"] = dra.calls_at_start
    for mode in (DP, DRA):
        got[mode]["start"] = {"runs_ms": [ms(s) for s in runs[mode]], "median_ms": ms(statistics.median(runs[mode]))}
    assert dp is not None and dra is not None
    return dp, dra


def at_scale(base: Path, args: argparse.Namespace, pki: Pki, count: int, running: Running, progress: Progress) -> None:
    """Each mode alone over `count` files: start -> full list or slices published, and PSS 2 s later."""
    got = running.got
    stage = base / "dra-stage"
    stage.mkdir()
    for i in range(count):
        (stage / str(i)).write_bytes(b"")
    names = {str(i) for i in range(count)}
    for mode in (DP, DRA):
        progress(f"DRA phase: {mode} alone over {count:,} devices")
        figures: dict[str, Any] = {"devices": count}
        got[mode].setdefault("scale", {})[str(count)] = figures
        dra = DraNode(base, args, f"dra-{count}", pki) if mode == DRA else None
        subject = dra.subject if dra else dp_node(base, args, f"dp-{count}")
        node: Subject | DraNode = dra or subject
        running.add(node)
        subject.device_dir.rmdir()
        stage.rename(subject.device_dir)
        try:
            started = dra.start(names) if dra else dp_start(subject, names)
            figures["start_ms"] = ms(started)
            if dra:
                figures["slices"] = dra.slices()
                figures["api_calls_at_start"] = dra.calls_at_start
            settle(2.0)
            figures["memory"] = measure.memory(subject)
        finally:
            running.close(node)
            subject.device_dir.rename(stage)
    shutil.rmtree(stage, ignore_errors=True)


def phase(base: Path, args: argparse.Namespace, results: dict[str, Any], progress: Progress) -> None:
    """Fill results["dra"]; a failure stops the phase and is recorded there, with what was measured."""
    devices = [f"cola-{i:02d}" for i in range(max(args.devices, args.callers))]
    names = set(devices[: args.devices])
    got: dict[str, Any] = {
        "devices": args.devices,
        "devices_for_claims": len(devices),
        DP: {},
        DRA: {},
        "api": {},
        "violations": [],
    }
    results["dra"] = got
    root = base / "dra"
    root.mkdir()
    (root / "pki").mkdir()
    pki = Pki(root / "pki")
    running = Running(got)
    try:
        dp, dra = starts(root, args, pki, names, running, progress)
        extra = sorted(set(devices) - names)
        if extra:  # one device per claim in flight: the 16 claims at once hold 16 devices
            dp.create(*extra)
            dra.subject.create(*extra)
            dp.full_list_after(0, set(devices))
            dra.api.wait_published(NODE, DRIVER, set(devices), 30.0)
        progress(f"DRA phase: {args.prepares} claims prepared and unprepared, one at a time, beside Allocate")
        one_at_a_time(dp, dra, devices, args.prepares, got)
        progress(f"DRA phase: {args.prepares} claims from {args.callers} callers, beside Allocate")
        at_once(dp, dra, devices, args.prepares, args.callers, got)
        progress(f"DRA phase: {args.changes} device file changes each")
        changes(dp, dra, set(devices), args.changes, args.gap, got)
        settle(2.0)
        got[DP]["memory"] = measure.memory(dp)
        got[DRA]["memory"] = measure.memory(dra.subject)
    except Exception as exc:  # the report prints what was measured, and this
        got["error"] = f"{type(exc).__name__}: {exc}"[:600]
        progress(f"DRA phase stopped: {got['error']}")
    finally:
        running.close_all()
    got["scale_count"] = args.dra_scale
    if args.dra_scale and "error" not in got:
        try:
            at_scale(root, args, pki, args.dra_scale, running, progress)
        except Exception as exc:
            got["error"] = f"{type(exc).__name__}: {exc}"[:600]
            progress(f"DRA phase at {args.dra_scale:,} devices stopped: {got['error']}")
        finally:
            running.close_all()


# --- the yardsticks and the printed table --------------------------------------------------------

PREPARE = "NodePrepareResources, 1 claim"
PREPARE_AT_ONCE = "NodePrepareResources, 16 claims at once"
SLICE_UPDATE = "file change -> slice updated"
START = "start -> slices published"
START_AT_SCALE = "start -> slices published at scale"
PSS = "PSS"
PSS_AT_SCALE = "PSS at scale"


def api_calls_at_start(got: dict[str, Any], slices_path: str) -> tuple[str, float | None]:
    """The API-server calls on a start's path (the list, the Node, one create per slice), each at a
    claim read's p50: what any driver that writes its slices one by one pays. None where not measured."""
    slices, p50 = at(got, slices_path), at(got, "api.claim_read_sequential.p50_ms")
    if slices is None or p50 is None:
        return "API calls at a claim read's p50", None
    calls = int(slices) + 2
    return f"{calls} API calls at a claim read's p50 {p50:g} ms", round(calls * p50, 2)


def yardsticks(results: dict[str, Any]) -> dict[str, Yardstick | None]:
    """Each DRA figure's yardstick: colad's device-plugin figures of the same phase, plus the API-server
    calls the DRA path makes and the device-plugin path does not; None where a part was not measured."""
    got = results.get("dra", {})
    n = got.get("scale_count") or 0

    def part(label: str, path: str) -> tuple[str, float | None]:
        return label, at(got, path)

    parts: dict[str, list[tuple[str, float | None]]] = {
        PREPARE: [
            part("colad's Allocate p99", f"{DP}.allocate_sequential.p99_ms"),
            part("a claim read p99", "api.claim_read_sequential.p99_ms"),
        ],
        PREPARE_AT_ONCE: [
            part("colad's Allocate p99, 16 callers", f"{DP}.allocate_concurrent.p99_ms"),
            part("a claim read p99, 16 readers", "api.claim_read_concurrent.p99_ms"),
        ],
        SLICE_UPDATE: [
            part("colad's change -> kubelet p99", f"{DP}.propagation.p99_ms"),
            part("a claim read p99", "api.claim_read_sequential.p99_ms"),
        ],
        START: [
            part("colad's start -> full list", f"{DP}.start.median_ms"),
            api_calls_at_start(got, f"{DRA}.slices"),
        ],
        START_AT_SCALE: [
            part(f"colad's start -> full list at {n:,}", f"{DP}.scale.{n}.start_ms"),
            api_calls_at_start(got, f"{DRA}.scale.{n}.slices"),
        ],
        PSS: [part("colad in device-plugin mode", f"{DP}.memory.total.pss_mib")],
        PSS_AT_SCALE: [part(f"colad in device-plugin mode at {n:,}", f"{DP}.scale.{n}.memory.total.pss_mib")],
    }
    found: dict[str, Yardstick | None] = {}
    for name, values in parts.items():
        measured = tuple((label, round(v, 2)) for label, v in values if v is not None)
        unit = " MiB" if name in (PSS, PSS_AT_SCALE) else " ms"
        found[name] = Yardstick(measured, unit) if len(measured) == len(values) else None
    return found


ROWS: tuple[tuple[str, str | None, str | None], ...] = (
    ("start -> full list | slices published, ms (median)", "start.median_ms", "start.median_ms"),
    ("one claim: Allocate | prepare p50, ms", "allocate_sequential.p50_ms", "prepare_sequential.p50_ms"),
    ("one claim: Allocate | prepare p99, ms", "allocate_sequential.p99_ms", "prepare_sequential.p99_ms"),
    ("one claim: Allocate | prepare max, ms", "allocate_sequential.max_ms", "prepare_sequential.max_ms"),
    ("one claim: unprepare p50, ms", None, "unprepare_sequential.p50_ms"),
    ("one claim: unprepare p99, ms", None, "unprepare_sequential.p99_ms"),
    ("16 at once: Allocate | prepare p50, ms", "allocate_concurrent.p50_ms", "prepare_concurrent.p50_ms"),
    ("16 at once: Allocate | prepare p99, ms", "allocate_concurrent.p99_ms", "prepare_concurrent.p99_ms"),
    ("16 at once: Allocate | prepare max, ms", "allocate_concurrent.max_ms", "prepare_concurrent.max_ms"),
    ("16 at once: refused, made again", "allocate_concurrent.refused", "prepare_concurrent.refused"),
    ("16 at once: unprepare p50, ms", None, "unprepare_concurrent.p50_ms"),
    ("16 at once: unprepare p99, ms", None, "unprepare_concurrent.p99_ms"),
    ("file change -> kubelet | slice p50, ms", "propagation.p50_ms", "slice_update.p50_ms"),
    ("file change -> kubelet | slice p99, ms", "propagation.p99_ms", "slice_update.p99_ms"),
    ("file change -> kubelet | slice max, ms", "propagation.max_ms", "slice_update.max_ms"),
    (
        "CPU per Allocate | prepare+unprepare, ms",
        "cpu_ms.allocate_sequential.total",
        "cpu_ms.prepare_unprepare_sequential.total",
    ),
    (
        "CPU per Allocate | prepare+unprepare, 16 at once, ms",
        "cpu_ms.allocate_concurrent.total",
        "cpu_ms.prepare_unprepare_concurrent.total",
    ),
    ("total RSS, MiB", "memory.total.rss_mib", "memory.total.rss_mib"),
    ("total PSS, MiB", "memory.total.pss_mib", "memory.total.pss_mib"),
)
SCALE_ROWS = (
    ("start -> full list | slices published, ms", "start_ms"),
    ("total PSS, MiB", "memory.total.pss_mib"),
    ("total RSS, MiB", "memory.total.rss_mib"),
)


def _cell(value: float | None, width: int) -> str:
    return f"{'-' if value is None else f'{value:g}':>{width}}"


def _line(label: str, device_plugin: float | None, dra: float | None) -> str:
    ratio = round(dra / device_plugin, 2) if device_plugin and dra is not None else None
    return f"{label:<52}{_cell(device_plugin, 13)}{_cell(dra, 11)}{_cell(ratio, 8)}"


def table(results: dict[str, Any]) -> str:
    """The DRA figures as `make bench` prints them: device-plugin mode | DRA mode, and their ratio."""
    got = results["dra"]
    dp, dra = got.get(DP, {}), got.get(DRA, {})
    title = f"DRA mode, {got['devices']} devices ({got['devices_for_claims']} once claims run)"
    lines = [f"{title:<52}{'device plugin':>13}{'DRA':>11}{'ratio':>8}"]
    for label, dp_path, dra_path in ROWS:
        lines.append(_line(label, at(dp, dp_path) if dp_path else None, at(dra, dra_path) if dra_path else None))
    n = got.get("scale_count")
    if n:
        lines.append(f"{n:,} devices, each mode alone ({at(dra, f'scale.{n}.slices') or '-'} slices)")
        for label, path in SCALE_ROWS:
            lines.append(_line("  " + label, at(dp, f"scale.{n}.{path}"), at(dra, f"scale.{n}.{path}")))
    for what, path in (("1 reader", "api.claim_read_sequential"), ("16 readers", "api.claim_read_concurrent")):
        reads = [(f"{what}: p50", at(got, f"{path}.p50_ms")), ("p99", at(got, f"{path}.p99_ms"))]
        lines.append("claim read by colad's client, ms, " + ", ".join(f"{k} {_cell(v, 0)}" for k, v in reads))
    runs = {mode: got.get(mode, {}).get("start", {}).get("runs_ms", []) for mode in (DP, DRA)}
    lines.append("start runs, ms: " + "; ".join(f"{mode} {' / '.join(map(str, r))}" for mode, r in runs.items()))
    calls = (
        ("per file change", dra.get("api_calls_per_change", {})),
        (f"at the start, {got['devices']} devices", dra.get("api_calls_at_start", {})),
        (f"at the start, {n or 0:,} devices", dra.get("scale", {}).get(str(n), {}).get("api_calls_at_start", {})),
    )
    for what, made in calls:
        if made:
            lines.append(f"API calls {what}, DRA: " + ", ".join(f"{k} {v:g}" for k, v in made.items()))
    if got.get("violations"):
        lines.append("contract violations: " + "; ".join(got["violations"]))
    if got.get("error"):
        lines.append(f"the DRA phase stopped: {got['error']}")
    return "\n".join(lines)
