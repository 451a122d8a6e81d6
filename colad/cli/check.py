"""`colad check`: dial the live plugin socket(s) the way the kubelet does, for debugging a node.

Device-plugin mode: every colad-*.sock in the kubelet directory (or one --socket) over the device
plugin API: options, the first ListAndWatch message, one Allocate per device, one
GetPreferredAllocation; the resource name from the plugin's state file. DRA mode: GetInfo on the
registration socket (as the kubelet's plugin watcher asks it), an empty NodePrepareResources on the
endpoint it names (as upstream's example liveness probe calls it), and the API server's list of this
node's slices of the driver. Writes a table (or JSON) to stdout, one reason line to stderr.
Exit codes: 0 all answered (and allocated); 1 something answered wrong; 3 nothing to dial.
"""

from __future__ import annotations

import json
import os
import sys
from dataclasses import asdict, dataclass, field
from typing import Any

import grpc

from colad.api import deviceplugin_pb2 as pb
from colad.api import deviceplugin_pb2_grpc as pb_grpc
from colad.api import pluginregistration_pb2 as regpb
from colad.api import pluginregistration_pb2_grpc as regpb_grpc
from colad.config.config import Config
from colad.core import constants
from colad.core.devices import base_id
from colad.core.dra_registration import DRA_PLUGIN_TYPE, DRA_SERVICES
from colad.kube.client import field_selector
from colad.kube.errors import KubeError
from colad.outputs import statefile
from colad.outputs.statefile import PluginState, StateFileError
from colad.runtime import kubeletdir

# Sent on every call, so the plugin can keep check calls out of its allocation metrics.
CHECK_METADATA = ((constants.CHECK_METADATA_KEY, "1"),)
EXIT_OK, EXIT_WRONG, EXIT_NOTHING = 0, 1, 3


def _dra_services() -> dict[str, tuple[Any, Any]]:
    """Each DRA service name GetInfo may list, and the stub and messages that speak it (loaded in DRA mode)."""
    from colad.api import dra_v1_pb2, dra_v1_pb2_grpc, dra_v1beta1_pb2, dra_v1beta1_pb2_grpc

    return {
        DRA_SERVICES[0]: (dra_v1_pb2_grpc.DRAPluginStub, dra_v1_pb2),
        DRA_SERVICES[1]: (dra_v1beta1_pb2_grpc.DRAPluginStub, dra_v1beta1_pb2),
    }


@dataclass
class AllocateResult:
    """The answer to one Allocate of a single device, as `colad check` shows it."""

    ok: bool
    error: str = ""
    code: str = ""  # the gRPC status code name when the call failed
    envs: dict[str, str] = field(default_factory=dict)
    mounts: list[dict[str, Any]] = field(default_factory=list)
    devices: list[dict[str, Any]] = field(default_factory=list)
    annotations: dict[str, str] = field(default_factory=dict)
    cdi_devices: list[str] = field(default_factory=list)


@dataclass
class DeviceReport:
    """One device of the first ListAndWatch message, and what Allocate made of it."""

    id: str
    health: str
    numa_nodes: list[int]
    allocate: AllocateResult | None = None
    why: str = ""  # an Unhealthy device's reason, per the plugin's state file (its first 50 only)


@dataclass
class SocketReport:
    """Everything `colad check` learnt from one plugin socket; `problems` empty when all was right."""

    socket: str
    resource: str = "unknown"
    dead: bool = False  # nothing listens: the file is missing or refuses connections
    options: dict[str, bool] | None = None
    devices: list[DeviceReport] | None = None  # None: ListAndWatch gave no list
    preferred: list[str] | None = None  # None: not asked (or it failed, see problems)
    problems: list[str] = field(default_factory=list)

    @property
    def error(self) -> str:
        return "; ".join(self.problems)


# ---- pure core: resource name, judgement, formatting ----


def resource_for(state: PluginState | None, endpoint: str) -> str:
    """The resource served on `endpoint` per the plugin's state file, else "unknown"."""
    served = state.by_endpoint(endpoint) if state is not None else None
    return served.name if served is not None and served.name else "unknown"


def add_reasons(report: SocketReport, state: PluginState | None, endpoint: str) -> None:
    """Give each Unhealthy device the reason the state file lists for it (replicas: their device's)."""
    served = state.by_endpoint(endpoint) if state is not None else None
    if served is None or not report.devices:
        return
    whys = {d.device_id: f"malformed device file: {d.reason}" if d.malformed else d.reason for d in served.sick.listed}
    for device in report.devices:
        if device.health != constants.HEALTHY:
            device.why = whys.get(base_id(device.id), "")


def device_problems(device: DeviceReport) -> list[str]:
    result = device.allocate
    if result is None:
        return []
    if device.health == constants.HEALTHY and not result.ok:
        return [f"Allocate of healthy device {device.id!r} failed: {result.code} {result.error}".rstrip()]
    if device.health != constants.HEALTHY and result.ok:
        return [f"Allocate of {device.health} device {device.id!r} succeeded; it must be refused"]
    return []


def judge(reports: list[SocketReport], where: str) -> tuple[int, str]:
    """(exit code, one-line reason) for the reports of every socket found in `where`."""
    if not reports:
        return EXIT_NOTHING, f"no colad socket in {where} (is colad running?)"
    if all(r.dead for r in reports):
        first = reports[0]
        return EXIT_NOTHING, f"{first.socket}: {first.error} (is colad running?)"
    # A live socket's faults first: a dead one beside it is most likely a stale file.
    wrong = [f"{r.socket}: {r.error}" for r in sorted(reports, key=lambda r: r.dead) if r.problems]
    if wrong:
        return EXIT_WRONG, wrong[0] + (f" (and {len(wrong) - 1} more socket(s))" if len(wrong) > 1 else "")
    devices = sum(len(r.devices or []) for r in reports)
    healthy = sum(1 for r in reports for d in r.devices or [] if d.health == constants.HEALTHY)
    if devices == 0:
        return EXIT_OK, f"{len(reports)} socket(s) answered; no devices advertised"
    return EXIT_OK, (
        f"{len(reports)} socket(s) answered; {devices} device(s), {healthy} healthy, each healthy one allocated"
    )


def reports_json(reports: list[SocketReport], code: int, reason: str) -> dict[str, Any]:
    sockets = []
    for r in reports:
        body = asdict(r)
        body["error"] = r.error
        sockets.append(body)
    return {"ok": code == EXIT_OK, "reason": reason, "sockets": sockets}


def _allocate_text(device: DeviceReport) -> str:
    result = device.allocate
    if result is None:
        return "-"
    if not result.ok:
        expected = " (as expected)" if device.health != constants.HEALTHY else ""
        return f"refused{expected}: {result.code} {result.error}".rstrip()
    envs = " ".join(f"{k}={v}" for k, v in sorted(result.envs.items())) or "no envs"
    return f"ok {envs} mounts={len(result.mounts)} device_nodes={len(result.devices)} cdi={len(result.cdi_devices)}"


def render_reports(reports: list[SocketReport], reason: str) -> str:
    lines: list[str] = []
    for r in reports:
        lines += [f"socket:    {r.socket}", f"resource:  {r.resource}"]
        if r.dead:
            lines += [f"problem:   {r.error}", ""]
            continue
        if r.options is not None:
            lines.append("options:   " + " ".join(f"{k}={'yes' if v else 'no'}" for k, v in sorted(r.options.items())))
        if r.devices is not None:
            healthy = sum(d.health == constants.HEALTHY for d in r.devices)
            lines.append(f"devices:   {len(r.devices)} ({healthy} healthy)")
            width = max([len("DEVICE")] + [len(d.id) for d in r.devices]) + 2
            if r.devices:
                lines.append(f"  {'DEVICE':<{width}}{'HEALTH':<11}{'NUMA':<6}ALLOCATE")
            for d in r.devices:
                numa = ",".join(str(n) for n in d.numa_nodes) or "-"
                lines.append(f"  {d.id:<{width}}{d.health:<11}{numa:<6}{_allocate_text(d)}")
                if d.why:  # escaped: a probe's output may hold terminal escapes
                    lines.append(
                        f"  {'':<{width}}why: " + "".join(c if c.isprintable() else repr(c)[1:-1] for c in d.why)
                    )
        if r.preferred is not None:
            lines.append(f"preferred: size 1 -> {','.join(r.preferred) or '(none)'}")
        lines += [f"problem:   {p}" for p in r.problems] + [""]
    lines.append(reason)
    return "\n".join(lines)


# ---- the shell: find sockets, dial, call ----


def find_sockets(kubelet_dir: str) -> list[str]:
    """Every colad plugin socket in the kubelet directory; raises OSError when it cannot be listed.

    Not kubeletdir.plugin_sockets: that one reads an unreadable directory as empty,
    and an operator without root must hear "permission denied", not "colad is not running".
    """
    try:
        names = kubeletdir.plugin_socket_names(kubelet_dir)
    except FileNotFoundError:
        return []
    return [os.path.join(kubelet_dir, n) for n in names]


def _rpc_error(exc: grpc.RpcError) -> tuple[str, str]:
    code = exc.code() if isinstance(exc, grpc.Call) else None
    details = exc.details() if isinstance(exc, grpc.Call) else str(exc)
    return (code.name if code else "UNKNOWN"), (details or "")


def _allocate_result(response: pb.AllocateResponse) -> AllocateResult:
    if len(response.container_responses) != 1:
        return AllocateResult(False, f"{len(response.container_responses)} container responses for 1 request")
    r = response.container_responses[0]
    return AllocateResult(
        ok=True,
        envs=dict(r.envs),
        mounts=[
            {"container_path": m.container_path, "host_path": m.host_path, "read_only": m.read_only} for m in r.mounts
        ],
        devices=[
            {"container_path": d.container_path, "host_path": d.host_path, "permissions": d.permissions}
            for d in r.devices
        ],
        annotations=dict(r.annotations),
        cdi_devices=[c.name for c in r.cdi_devices],
    )


class SocketCheck:
    """The kubelet's calls against one plugin socket, each with its own deadline."""

    def __init__(self, path: str, timeout: float) -> None:
        self.path = path
        self.timeout = timeout
        self.report = SocketReport(socket=path)

    def run(self) -> SocketReport:
        dialled = kubeletdir.dial(self.path, self.timeout)  # one plain connect() before any gRPC
        if not dialled.live:
            self.report.dead = dialled.dead
            self.report.problems.append(dialled.reason or "no answer")
            return self.report
        channel = grpc.insecure_channel(
            "unix:" + self.path,
            options=[
                ("grpc.max_receive_message_length", constants.KUBELET_MAX_RECV_MESSAGE_BYTES),
            ],
        )
        try:
            stub = pb_grpc.DevicePluginStub(channel)
            self.options(stub)
            self.list(stub)
            self.allocate_each(stub)
            self.preferred(stub)
        finally:
            channel.close()
        return self.report

    def options(self, stub: Any) -> None:
        try:
            answer = stub.GetDevicePluginOptions(pb.Empty(), timeout=self.timeout, metadata=CHECK_METADATA)
        except grpc.RpcError as exc:
            self.fail("GetDevicePluginOptions", exc)
            return
        self.report.options = {
            "pre_start_required": answer.pre_start_required,
            "get_preferred_allocation_available": answer.get_preferred_allocation_available,
        }

    def list(self, stub: Any) -> None:
        call = stub.ListAndWatch(pb.Empty(), timeout=self.timeout, metadata=CHECK_METADATA)
        try:
            first = next(call)
        except StopIteration:
            self.report.problems.append("ListAndWatch ended without sending a device list")
            return
        except grpc.RpcError as exc:
            code, _ = _rpc_error(exc)
            if code == "DEADLINE_EXCEEDED":
                self.report.problems.append(f"ListAndWatch sent nothing within {self.timeout:g} s")
            else:
                self.fail("ListAndWatch", exc)
            return
        finally:
            call.cancel()  # only the first message: the full list as it is now
        self.report.devices = [DeviceReport(d.ID, d.health, [n.ID for n in d.topology.nodes]) for d in first.devices]

    def allocate_each(self, stub: Any) -> None:
        timed_out = False
        for device in self.report.devices or []:
            if timed_out:
                device.allocate = AllocateResult(False, "skipped: an earlier Allocate ran out of time", "SKIPPED")
                continue
            request = pb.AllocateRequest(container_requests=[pb.ContainerAllocateRequest(devices_ids=[device.id])])
            try:
                answer = stub.Allocate(request, timeout=self.timeout, metadata=CHECK_METADATA)
            except grpc.RpcError as exc:
                code, details = _rpc_error(exc)
                device.allocate = AllocateResult(False, details, code)
                timed_out = code == "DEADLINE_EXCEEDED"
            else:
                device.allocate = _allocate_result(answer)
            self.report.problems += device_problems(device)

    def preferred(self, stub: Any) -> None:
        healthy = [d.id for d in self.report.devices or [] if d.health == constants.HEALTHY]
        if not healthy or not (self.report.options or {}).get("get_preferred_allocation_available"):
            return
        request = pb.PreferredAllocationRequest(
            container_requests=[pb.ContainerPreferredAllocationRequest(available_deviceIDs=healthy, allocation_size=1)]
        )
        try:
            answer = stub.GetPreferredAllocation(request, timeout=self.timeout, metadata=CHECK_METADATA)
        except grpc.RpcError as exc:
            self.fail("GetPreferredAllocation", exc)
            return
        if len(answer.container_responses) != 1:
            self.report.problems.append(
                f"GetPreferredAllocation: {len(answer.container_responses)} container responses for 1 request"
            )
            return
        chosen = list(answer.container_responses[0].deviceIDs)
        self.report.preferred = chosen
        if len(chosen) != 1 or chosen[0] not in healthy:
            self.report.problems.append(f"GetPreferredAllocation of size 1 from the healthy devices chose {chosen}")

    def fail(self, method: str, exc: grpc.RpcError) -> None:
        code, details = _rpc_error(exc)
        self.report.problems.append(f"{method} failed: {code} {details}".rstrip())


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


# ---- DRA mode, pure: what an answer means, the verdict, formatting ----


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


def dra_report_json(report: DraReport, code: int, reason: str) -> dict[str, Any]:
    body = asdict(report)
    body["slices"]["devices"] = report.slices.devices
    return {"ok": code == EXIT_OK, "reason": reason, "mode": "dra", **body}


def render_dra(report: DraReport, reason: str) -> str:
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


# ---- DRA mode, the shell: dial, call, list ----


def _rpc_problem(method: str, exc: grpc.RpcError) -> str:
    code, details = _rpc_error(exc)
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
    stub_type, messages = _dra_services()[service]
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
        from colad.plugin.dra_host import kube_client  # DRA mode only: the API server's client

        items, _ = kube_client(cfg).list_slices(selector)
    except KubeError as exc:
        report.problems.append(f"list failed: {exc}")
        return report
    report.listed = True
    report.slices = read_slices(items)
    if not report.slices:
        report.problems.append("the API server holds no slice of this node and driver: none published")
    return report


def run_dra(cfg: Config, timeout: float) -> DraReport:
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


def read_state(path: str) -> PluginState | None:
    try:
        return statefile.read(path)
    except StateFileError:
        return None


def main(args: Any = None, cfg: Config | None = None) -> int:
    assert cfg is not None
    timeout = float(getattr(args, "timeout", 5.0))
    if cfg.dra_mode:
        if getattr(args, "socket", None):
            print(
                "colad check: --socket names a device plugin socket; DRA mode dials its configured sockets",
                file=sys.stderr,
            )
            return EXIT_WRONG
        return main_dra(args, cfg, timeout)
    single = getattr(args, "socket", None)
    where = single or cfg.kubelet_dir
    try:
        paths = [os.path.abspath(single)] if single else find_sockets(cfg.kubelet_dir)
    except OSError as exc:
        print(f"colad check: cannot list {cfg.kubelet_dir}: {exc.strerror or exc}", file=sys.stderr)
        return EXIT_WRONG
    state = read_state(cfg.plugin_state_file)
    reports = []
    for path in paths:
        report = SocketCheck(path, timeout).run()
        report.resource = resource_for(state, os.path.basename(path))
        add_reasons(report, state, os.path.basename(path))
        reports.append(report)
    code, reason = judge(reports, where)
    if getattr(args, "json", False):
        print(json.dumps(reports_json(reports, code, reason), indent=2, sort_keys=True))
    elif reports:
        print(render_reports(reports, reason))
    sys.stdout.flush()
    if code != EXIT_OK:
        print(f"colad check: {reason}", file=sys.stderr)
    return code


def main_dra(args: Any, cfg: Config, timeout: float) -> int:
    report = run_dra(cfg, timeout)
    code, reason = judge_dra(report)
    if getattr(args, "json", False):
        print(json.dumps(dra_report_json(report, code, reason), indent=2, sort_keys=True))
    else:
        print(render_dra(report, reason))
    sys.stdout.flush()
    if code != EXIT_OK:
        print(f"colad check: {reason}", file=sys.stderr)
    return code
