"""`colad check`: dial the live plugin socket(s) the way the kubelet does, for debugging a node.

Reads every colad-*.sock in the kubelet directory (or one --socket) over the device plugin API:
options, the first ListAndWatch message, one Allocate per device, one GetPreferredAllocation;
the resource name from the plugin's state file. Writes a table (or JSON) to stdout, one reason
line to stderr. Exit codes: 0 all answered and allocated; 1 something answered wrong; 3 nothing to dial.
In DRA mode `colad check` runs check_dra.py instead (cli/main.py, DRA_COMMANDS).
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
from colad.config.config import Config
from colad.core import constants
from colad.core.devices import base_id
from colad.outputs import statefile
from colad.outputs.statefile import PluginState, StateFileError
from colad.runtime import kubeletdir

# Sent on every call, so the plugin can keep check calls out of its allocation metrics.
CHECK_METADATA = ((constants.CHECK_METADATA_KEY, "1"),)
EXIT_OK, EXIT_WRONG, EXIT_NOTHING = 0, 1, 3


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


def rpc_error(exc: grpc.RpcError) -> tuple[str, str]:
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
            code, _ = rpc_error(exc)
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
                code, details = rpc_error(exc)
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
        code, details = rpc_error(exc)
        self.report.problems.append(f"{method} failed: {code} {details}".rstrip())


def read_state(path: str) -> PluginState | None:
    try:
        return statefile.read(path)
    except StateFileError:
        return None


def main(args: Any = None, cfg: Config | None = None) -> int:
    assert cfg is not None
    timeout = float(getattr(args, "timeout", 5.0))
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
