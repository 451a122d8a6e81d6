"""`colad check` in DRA mode: dial the driver the way the kubelet does, and list this node's slices.

Reads the Config (driver, node, sockets, kubeconfig). Three steps, each reported with its own error:
GetInfo on the registration socket (as the kubelet's plugin watcher asks it), an empty
NodePrepareResources on the endpoint GetInfo names (as upstream's example liveness probe calls it),
and the API server's list of this node's slices of the driver. Writes a table (or JSON) to stdout,
one reason line to stderr; the exit codes are check.py's (0 all answered, 1 something wrong, 3 nothing
to dial). cli/main.py runs this module for `colad check` in DRA mode.
"""

from __future__ import annotations

import json
import sys
from dataclasses import asdict, dataclass, field
from typing import Any

import grpc

from colad.api import dra_v1_pb2, dra_v1_pb2_grpc, dra_v1beta1_pb2, dra_v1beta1_pb2_grpc
from colad.api import pluginregistration_pb2 as regpb
from colad.api import pluginregistration_pb2_grpc as regpb_grpc
from colad.cli.check import CHECK_METADATA, EXIT_NOTHING, EXIT_OK, EXIT_WRONG, rpc_error
from colad.config.config import Config
from colad.core.dra_registration import DRA_PLUGIN_TYPE, DRA_SERVICES
from colad.kube.client import field_selector
from colad.kube.errors import KubeError
from colad.plugin.dra_host import kube_client
from colad.runtime import kubeletdir

# Each DRA service name GetInfo may list, and the stub and messages that speak it.
_SERVICES: dict[str, tuple[Any, Any]] = {
    DRA_SERVICES[0]: (dra_v1_pb2_grpc.DRAPluginStub, dra_v1_pb2),
    DRA_SERVICES[1]: (dra_v1beta1_pb2_grpc.DRAPluginStub, dra_v1beta1_pb2),
}


@dataclass
class RegistrationReport:
    """What GetInfo on the registration socket answered."""

    socket: str
    dead: bool = False  # nothing listens there
    type: str = ""
    name: str = ""
    endpoint: str = ""
    supported_versions: list[str] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)


@dataclass
class ServiceReport:
    """What an empty NodePrepareResources on the DRA socket answered."""

    socket: str
    dead: bool = False
    service: str = ""  # the DRA service called, as GetInfo named it
    answered: bool = False
    problems: list[str] = field(default_factory=list)


@dataclass
class SliceRow:
    name: str
    pool: str
    generation: int
    devices: int


@dataclass
class SlicesReport:
    """This node's slices of the driver, as the API server lists them."""

    selector: str
    listed: bool = False
    slices: list[SliceRow] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)

    @property
    def devices(self) -> int:
        return sum(s.devices for s in self.slices)


@dataclass
class DraReport:
    driver: str
    node: str
    registration: RegistrationReport
    service: ServiceReport
    slices: SlicesReport

    def problems(self) -> list[str]:
        steps = (("registration", self.registration), ("service", self.service), ("slices", self.slices))
        return [f"{step}: {p}" for step, part in steps for p in part.problems]


# ---- pure core: what an answer means, the verdict, formatting ----


def info_problems(report: RegistrationReport, driver: str, endpoint: str) -> list[str]:
    """What the kubelet's plugin watcher would refuse in a GetInfo answer, or colad would not have sent."""
    problems = []
    if report.type != DRA_PLUGIN_TYPE:
        problems.append(f"GetInfo type {report.type!r}, not {DRA_PLUGIN_TYPE!r}: the kubelet ignores it")
    if report.name != driver:
        problems.append(f"GetInfo name {report.name!r}, not the configured driver {driver!r}")
    if not report.endpoint:
        problems.append("GetInfo names no endpoint: the kubelet would dial the registration socket itself")
    elif report.endpoint != endpoint:
        problems.append(f"GetInfo endpoint {report.endpoint!r}, not the configured {endpoint!r}")
    if chosen_service(report.supported_versions) is None:
        problems.append(f"GetInfo supported_versions {report.supported_versions} name none of {list(DRA_SERVICES)}")
    return problems


def chosen_service(supported: list[str]) -> str | None:
    """The DRA service the kubelet would call: the first entry it knows."""
    return next((s for s in supported if s in DRA_SERVICES), None)


def read_slices(items: list[dict[str, Any]]) -> list[SliceRow]:
    rows = []
    for item in items:
        spec = item.get("spec") or {}
        pool = spec.get("pool") or {}
        rows.append(
            SliceRow(
                name=str((item.get("metadata") or {}).get("name") or ""),
                pool=str(pool.get("name") or ""),
                generation=int(pool.get("generation") or 0),
                devices=len(spec.get("devices") or []),
            )
        )
    return sorted(rows, key=lambda r: (r.pool, r.name))


def judge_dra(report: DraReport) -> tuple[int, str]:
    """(exit code, one-line reason)."""
    if report.registration.dead and report.service.dead:
        return EXIT_NOTHING, f"{report.registration.socket}: {report.registration.problems[0]} (is colad running?)"
    problems = report.problems()
    if problems:
        more = f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""
        return EXIT_WRONG, problems[0] + more
    slices = report.slices
    return EXIT_OK, (
        f"driver {report.driver} answered GetInfo and NodePrepareResources; "
        f"{len(slices.slices)} slice(s) of node {report.node}, {slices.devices} device(s)"
    )


def report_json(report: DraReport, code: int, reason: str) -> dict[str, Any]:
    body = asdict(report)
    body["slices"]["devices"] = report.slices.devices
    return {"ok": code == EXIT_OK, "reason": reason, "mode": "dra", **body}


def render(report: DraReport, reason: str) -> str:
    reg, svc, sl = report.registration, report.service, report.slices
    lines = [f"driver:       {report.driver} (node {report.node})", f"registration: {reg.socket}"]
    if reg.type or reg.name:
        versions = ",".join(reg.supported_versions) or "-"
        lines.append(f"  GetInfo:    {reg.type} {reg.name} endpoint {reg.endpoint or '-'} versions {versions}")
    lines += [f"  problem:    {p}" for p in reg.problems]
    lines.append(f"service:      {svc.socket}")
    if svc.answered:
        lines.append(f"  NodePrepareResources (no claims): answered ({svc.service})")
    lines += [f"  problem:    {p}" for p in svc.problems]
    lines.append(f"slices:       {sl.selector}")
    if sl.listed:
        lines.append(f"  {len(sl.slices)} slice(s), {sl.devices} device(s)")
        if sl.slices:
            width = max(len("SLICE"), *(len(s.name) for s in sl.slices)) + 2
            pool_width = max(len("POOL"), *(len(s.pool) for s in sl.slices)) + 2
            lines.append(f"  {'SLICE':<{width}}{'POOL':<{pool_width}}{'GENERATION':<12}DEVICES")
            for s in sl.slices:
                lines.append(f"  {s.name:<{width}}{s.pool:<{pool_width}}{s.generation:<12}{s.devices}")
    lines += [f"  problem:    {p}" for p in sl.problems]
    lines += ["", reason]
    return "\n".join(lines)


# ---- the shell: dial, call, list ----


def _rpc_problem(method: str, exc: grpc.RpcError) -> str:
    code, details = rpc_error(exc)
    return f"{method} failed: {code} {details}".rstrip()


def check_registration(path: str, timeout: float) -> RegistrationReport:
    report = RegistrationReport(socket=path)
    dialled = kubeletdir.dial(path, timeout)  # one plain connect() before any gRPC
    if not dialled.live:
        report.dead = dialled.dead
        report.problems.append(dialled.reason or "no answer")
        return report
    with grpc.insecure_channel("unix:" + path) as channel:
        try:
            info = regpb_grpc.RegistrationStub(channel).GetInfo(
                regpb.InfoRequest(), timeout=timeout, metadata=CHECK_METADATA
            )
        except grpc.RpcError as exc:
            report.problems.append(_rpc_problem("GetInfo", exc))
            return report
    report.type, report.name, report.endpoint = info.type, info.name, info.endpoint
    report.supported_versions = list(info.supported_versions)
    return report


def check_service(path: str, service: str, timeout: float) -> ServiceReport:
    report = ServiceReport(socket=path, service=service)
    dialled = kubeletdir.dial(path, timeout)
    if not dialled.live:
        report.dead = dialled.dead
        report.problems.append(dialled.reason or "no answer")
        return report
    stub_type, messages = _SERVICES[service]
    with grpc.insecure_channel("unix:" + path) as channel:
        try:
            answer = stub_type(channel).NodePrepareResources(
                messages.NodePrepareResourcesRequest(), timeout=timeout, metadata=CHECK_METADATA
            )
        except grpc.RpcError as exc:
            report.problems.append(_rpc_problem("NodePrepareResources with no claims", exc))
            return report
    report.answered = True
    if len(answer.claims):
        report.problems.append(f"NodePrepareResources with no claims answered {len(answer.claims)} claim(s)")
    return report


def check_slices(cfg: Config) -> SlicesReport:
    selector = field_selector(node_name=cfg.resolved_node_name, driver=cfg.dra_driver_name)
    report = SlicesReport(selector=selector)
    try:
        items, _ = kube_client(cfg).list_slices(selector)
    except KubeError as exc:
        report.problems.append(f"list failed: {exc}")
        return report
    report.listed = True
    report.slices = read_slices(items)
    if not report.slices:
        report.problems.append("the API server holds no slice of this node and driver: none published")
    return report


def check_all(cfg: Config, timeout: float) -> DraReport:
    registration = check_registration(cfg.dra_registration_socket, timeout)
    if not registration.problems:
        registration.problems += info_problems(registration, cfg.dra_driver_name, cfg.dra_plugin_socket)
    # The kubelet dials the endpoint GetInfo names (the socket path when it names none); colad's own
    # when GetInfo did not answer, so that the service is checked whatever the registration's state.
    endpoint = registration.endpoint or cfg.dra_plugin_socket
    service = chosen_service(registration.supported_versions) or DRA_SERVICES[0]
    return DraReport(
        cfg.dra_driver_name,
        cfg.resolved_node_name,
        registration,
        check_service(endpoint, service, timeout),
        check_slices(cfg),
    )


def main(args: Any = None, cfg: Config | None = None) -> int:
    assert cfg is not None
    if getattr(args, "socket", None):
        print(
            "colad check: --socket names a device plugin socket; DRA mode dials its configured sockets", file=sys.stderr
        )
        return EXIT_WRONG
    report = check_all(cfg, float(getattr(args, "timeout", 5.0)))
    code, reason = judge_dra(report)
    if getattr(args, "json", False):
        print(json.dumps(report_json(report, code, reason), indent=2, sort_keys=True))
    else:
        print(render(report, reason))
    sys.stdout.flush()
    if code != EXIT_OK:
        print(f"colad check: {reason}", file=sys.stderr)
    return code
