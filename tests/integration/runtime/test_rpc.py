"""Every gRPC method colad serves or calls passes one boundary: a status and one line, never UNKNOWN or a traceback.

The real plugin server (service.build_server) on a real Unix socket: each request message of the
DevicePlugin service, every field of it in many shapes (tests/fuzz/wire.py, derived from the
descriptors), is answered OK or with a documented code; a handler that raises is INTERNAL with one
ERROR line and colad_rpc_errors_total; no method is served around the boundary. The PodResources
client meets hostile answers from a raw server: the in-use view stays up or degrades, never a traceback.
"""

from __future__ import annotations

import logging
import random
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from colad.api import deviceplugin_pb2 as pb
from colad.api import podresources_pb2 as prpb
from colad.config.config import Config
from colad.core.constants import UNHEALTHY
from colad.core.devices import Device, DeviceSet
from colad.deviceplugin.broadcast import DeviceBroadcast
from colad.deviceplugin.service import DEVICE_PLUGIN_SERVICE, DevicePluginServicer, StreamEvents, build_server
from colad.metrics.registry import Metrics
from colad.outputs.statefile import PluginState
from colad.plugin.podresources import LIST, InUseWatcher
from colad.runtime import rpc
from tests.fuzz import wire
from tests.helpers import wait_until

pytestmark = pytest.mark.integration
COLA = "myway5.com/cola"
DEVICES = DeviceSet.of([Device("cocacola"), Device("cocacola::0"), Device("peisicola"), Device("fanta", UNHEALTHY)])
# What a request colad cannot serve may be answered with: the kubelet contract's codes, never UNKNOWN/INTERNAL.
DOCUMENTED = {
    grpc.StatusCode.OK,
    grpc.StatusCode.INVALID_ARGUMENT,
    grpc.StatusCode.NOT_FOUND,
    grpc.StatusCode.FAILED_PRECONDITION,  # PreStartContainer: a prepare command failed
    grpc.StatusCode.RESOURCE_EXHAUSTED,  # ListAndWatch: too many streams
}
METHODS = [m.name for m in DEVICE_PLUGIN_SERVICE.methods]


class Served:
    """The plugin's servicer for DEVICES behind build_server on `path`; `raw(method, bytes)` calls it."""

    def __init__(self, path: Path, servicer: DevicePluginServicer | None = None) -> None:
        self.metrics = Metrics(snapshot=lambda: PluginState(pid=1))
        broadcast = DeviceBroadcast()
        broadcast.update(DEVICES)
        events = StreamEvents(lambda _g: None, lambda _g: None, lambda _g, _n: None)
        self.servicer = servicer or DevicePluginServicer(
            broadcast, 1, events, self.metrics, COLA, prepare=lambda: (("true",), 5.0)
        )
        self.servicer.metrics = self.metrics
        self.server = build_server(self.servicer, str(path))
        self.server.start()
        self.channel = grpc.insecure_channel(f"unix:{path}")

    def raw(self, method: str, data: bytes) -> grpc.StatusCode:
        """Send `data` as the request of `method`; the status it ended with (a stream: after its first list)."""
        name = f"/{DEVICE_PLUGIN_SERVICE.full_name}/{method}"
        if DEVICE_PLUGIN_SERVICE.methods_by_name[method].server_streaming:
            stream = self.channel.unary_stream(name, request_serializer=None, response_deserializer=None)
            call = stream(data, timeout=10)
            try:
                next(call)
            except grpc.RpcError as exc:
                return exc.code()  # type: ignore[attr-defined,no-any-return]
            call.cancel()
            return grpc.StatusCode.OK
        unary = self.channel.unary_unary(name, request_serializer=None, response_deserializer=None)
        try:
            unary(data, timeout=10)
        except grpc.RpcError as exc:
            return exc.code()  # type: ignore[attr-defined,no-any-return]
        return grpc.StatusCode.OK

    def errors(self, code: str) -> float:
        return sum(
            self.metrics.registry.get_sample_value(
                "colad_rpc_errors_total", {"method": f"{DEVICE_PLUGIN_SERVICE.full_name}/{m}", "code": code}
            )
            or 0.0
            for m in METHODS
        )

    def close(self) -> None:
        self.channel.close()
        self.server.stop(grace=None).wait(5)


@pytest.fixture
def served(short_tmp: Path) -> Iterator[Served]:
    s = Served(short_tmp / "p.sock")
    yield s
    s.close()


def no_traceback(caplog: pytest.LogCaptureFixture) -> None:
    for record in caplog.records:
        assert not record.exc_info, record.getMessage()
        assert "Traceback" not in record.getMessage(), record.getMessage()


def preferred(ids: list[str], size: int = 1) -> bytes:
    container = pb.ContainerPreferredAllocationRequest(available_deviceIDs=ids, allocation_size=size)
    return pb.PreferredAllocationRequest(container_requests=[container]).SerializeToString()


def test_preferred_allocation_of_a_5000_digit_id_is_invalid_argument_naming_the_field(
    served: Served, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)
    stub = served.channel.unary_unary(
        f"/{DEVICE_PLUGIN_SERVICE.full_name}/GetPreferredAllocation",
        request_serializer=None,
        response_deserializer=None,
    )
    with pytest.raises(grpc.RpcError) as refused:
        stub(preferred(["1" * 5000, "cocacola"]), timeout=10)
    assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT  # type: ignore[attr-defined]
    assert refused.value.details().startswith("container_requests[0].available_deviceIDs[0]: not a device ID")  # type: ignore[attr-defined]
    lines = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(lines) == 1 and 'msg="request refused"' in lines[0] and "code=INVALID_ARGUMENT" in lines[0]
    assert served.errors("INVALID_ARGUMENT") == 1 and served.errors("INTERNAL") == 0
    no_traceback(caplog)
    answer = pb.PreferredAllocationResponse.FromString(stub(preferred(["peisicola", "cocacola"]), timeout=10))
    assert list(answer.container_responses[0].deviceIDs) == ["cocacola"]


class Raising(DevicePluginServicer):
    """Every method raises what no handler expects: the boundary must make each INTERNAL."""

    def __init__(self) -> None:
        metrics = Metrics(snapshot=lambda: PluginState(pid=1))
        super().__init__(
            DeviceBroadcast(), 1, StreamEvents(lambda _g: None, lambda _g: None, lambda _g, _n: None), metrics, COLA
        )

    def _boom(self, *_args: object) -> pb.Empty:
        raise ValueError("Exceeds the limit (4300 digits) for integer string conversion")

    GetDevicePluginOptions = Allocate = GetPreferredAllocation = PreStartContainer = _boom

    def ListAndWatch(self, request: pb.Empty, context: grpc.ServicerContext) -> Iterator[bytes]:  # noqa: N802
        raise KeyError("boom")
        yield b""  # a generator, as the real one


def test_every_method_of_the_service_is_served_through_the_boundary(
    short_tmp: Path, caplog: pytest.LogCaptureFixture
) -> None:
    served = Served(short_tmp / "r.sock", Raising())
    try:
        for method in METHODS:
            caplog.clear()
            assert served.raw(method, b"") == grpc.StatusCode.INTERNAL, method
            errors = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
            assert len(errors) == 1 and f"method=v1beta1.DevicePlugin/{method}" in errors[0], errors
            assert "a colad bug" in errors[0] and "at service" not in errors[0]
            no_traceback(caplog)
        assert served.errors("INTERNAL") == len(METHODS)
    finally:
        served.close()
    handler = rpc.handlers(DEVICE_PLUGIN_SERVICE, Raising(), pb, Metrics().rpc_errors)
    for method in DEVICE_PLUGIN_SERVICE.methods:
        details = type(
            "D", (), {"method": f"/{DEVICE_PLUGIN_SERVICE.full_name}/{method.name}", "invocation_metadata": ()}
        )()
        found = handler.service(details)  # type: ignore[arg-type]
        assert found is not None, method.name
        behavior = found.unary_stream if method.server_streaming else found.unary_unary
        assert getattr(behavior, rpc.WRAPPED) == f"{DEVICE_PLUGIN_SERVICE.full_name}/{method.name}"


def server_problems(name: str, text: str) -> list[str]:
    """How the module `name` serves gRPC around the boundary: a generated add_*Servicer_to_server, a status
    set outside rpc.py, a server built with handlers given neither at its build nor later (a service's
    add_to), or handlers added later that rpc.handlers did not make."""
    found = []
    if "Servicer_to_server(" in text:
        found.append(f"{name}: a generated add_*Servicer_to_server")
    if name != "rpc.py" and (".abort(" in text or "set_code(" in text):
        found.append(f"{name}: a status set outside rpc.py")
    for call in text.split("grpc.server(")[1:]:
        built = call.split("\n\n")[0]
        if "handlers=[" not in built and ".add_to(" not in built:
            found.append(f"{name}: a server without rpc.handlers")
    for call in text.split(".add_generic_rpc_handlers(")[1:]:
        if "rpc.handlers(" not in call.split("\n\n")[0]:
            found.append(f"{name}: handlers added that rpc.handlers did not make")
    return found


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ("server = grpc.server(pool)\nserver.start()\n", "a server without rpc.handlers"),
        ("server.add_generic_rpc_handlers((generic,))\n", "handlers added that rpc.handlers did not make"),
        ("pb_grpc.add_DevicePluginServicer_to_server(s, server)\n", "a generated add_*Servicer_to_server"),
        ("context.abort(grpc.StatusCode.NOT_FOUND, 'x')\n", "a status set outside rpc.py"),
    ],
)
def test_the_boundary_rule_reports_a_seeded_violation(text: str, problem: str) -> None:
    assert server_problems("seed.py", text) == [f"seed.py: {problem}"]


def test_no_grpc_server_in_colad_is_built_around_the_boundary() -> None:
    """Servers are built from rpc.handlers only, and only rpc.py turns an error into a status.

    A handler's own context.abort() would be taken by the boundary for a bug (INTERNAL); the generated
    add_*Servicer_to_server would serve its methods with no boundary at all.
    """
    package = Path(rpc.__file__).parents[1]  # the colad package
    for source in sorted(p for p in package.rglob("*.py") if p.parent.name != "api"):
        assert server_problems(source.name, source.read_text()) == []
    assert "rpc.handlers(" in (package / "deviceplugin" / "service.py").read_text()
    assert "rpc.handlers(" in (package / "cli" / "kubelet_sim.py").read_text()


def request_messages() -> list[tuple[str, str, bytes]]:
    return [
        (method.name, label, data)
        for method in DEVICE_PLUGIN_SERVICE.methods
        for label, data in wire.cases(method.input_type)
    ]


CASES = request_messages()


def test_every_field_of_every_request_in_every_shape_gets_a_documented_code(
    served: Served, caplog: pytest.LogCaptureFixture
) -> None:
    """All of wire.cases over the socket: one test, so the whole table costs one server (seconds)."""
    caplog.set_level(logging.INFO)
    seen: dict[str, set[grpc.StatusCode]] = {}
    for method, label, data in CASES:
        code = served.raw(method, data)
        assert code in DOCUMENTED, f"{method} {label}: {code}"
        seen.setdefault(method, set()).add(code)
    rng = random.Random(7)
    for _ in range(300):
        method = rng.choice(METHODS)
        data = wire.mutate(
            DEVICE_PLUGIN_SERVICE.methods_by_name[method].input_type, rng.randbytes(rng.randrange(1, 80))
        )
        assert (code := served.raw(method, data)) in DOCUMENTED, f"{method} {data!r}: {code}"
    assert served.errors("INTERNAL") == 0
    no_traceback(caplog)
    # The table reaches both sides of each request method: served, and refused naming a field.
    for method in ("Allocate", "GetPreferredAllocation", "PreStartContainer"):
        assert {grpc.StatusCode.OK, grpc.StatusCode.INVALID_ARGUMENT} <= seen[method], (method, seen[method])
    refusals = [r.getMessage() for r in caplog.records if "refused" in r.getMessage()]
    assert any("available_deviceIDs" in line for line in refusals)
    assert any("must_include_deviceIDs" in line for line in refusals)


@pytest.mark.parametrize(
    ("ids", "size", "code"),
    [
        (["cocacola", "cocacola"], 1, grpc.StatusCode.OK),  # duplicates: one answer
        (["nosuch"], 1, grpc.StatusCode.OK),  # unknown but well formed: advisory, best effort
        (["cocacola::1000"], 1, grpc.StatusCode.INVALID_ARGUMENT),  # no replica index that high
        (["cocacola::01"], 1, grpc.StatusCode.INVALID_ARGUMENT),
        (["cola\u202e"], 1, grpc.StatusCode.INVALID_ARGUMENT),
        (["cocacola"], -1, grpc.StatusCode.OK),  # advisory: best effort (an empty answer)
        (["cocacola"], 2**31 - 1, grpc.StatusCode.OK),
    ],
    ids=[
        "duplicated",
        "unknown",
        "replica-index-too-high",
        "replica-leading-zero",
        "rtl",
        "negative-size",
        "huge-size",
    ],
)
def test_preferred_allocation_table(served: Served, ids: list[str], size: int, code: grpc.StatusCode) -> None:
    assert served.raw("GetPreferredAllocation", preferred(ids, size)) == code


# ---- the PodResources client --------------------------------------------------------------------------------


class RawKubelet:
    """A PodResources server answering List with whatever bytes the test sets (the fake is too well behaved)."""

    def __init__(self, path: Path) -> None:
        from concurrent import futures

        self.answer = b""
        self.allocatable: bytes | None = None  # None: UNIMPLEMENTED, as a kubelet before 1.23
        self.fail: grpc.StatusCode | None = None

        def list_(request: bytes, context: grpc.ServicerContext) -> bytes:
            if self.fail is not None:
                context.abort(self.fail, "injected")
            return self.answer

        def allocatable(request: bytes, context: grpc.ServicerContext) -> bytes:
            if self.allocatable is None:
                context.abort(grpc.StatusCode.UNIMPLEMENTED, "unknown method")
            return self.allocatable

        handler = grpc.method_handlers_generic_handler(
            "v1.PodResourcesLister",
            {
                "List": grpc.unary_unary_rpc_method_handler(list_),
                "GetAllocatableResources": grpc.unary_unary_rpc_method_handler(allocatable),
            },
        )
        self.server = grpc.server(futures.ThreadPoolExecutor(max_workers=2), handlers=[handler])
        self.server.add_insecure_port(f"unix:{path}")
        self.server.start()


def test_hostile_pod_resources_answers_are_counted_never_a_traceback(
    short_tmp: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)
    path = short_tmp / "pr.sock"
    kubelet = RawKubelet(path)
    cfg = Config(run_dir=str(short_tmp / "run"), pod_resources_socket=str(path), pod_resources_interval=3600.0)
    (short_tmp / "run").mkdir(mode=0o700)
    metrics = Metrics(snapshot=lambda: PluginState(pid=1))
    watcher = InUseWatcher(cfg, metrics, lambda: {COLA})

    def count(code: str) -> float:
        return metrics.registry.get_sample_value("colad_rpc_errors_total", {"method": LIST, "code": code}) or 0.0

    good = prpb.ContainerDevices(resource_name=COLA, device_ids=["cocacola"])
    kubelet.answer = good_answer = prpb.ListPodResourcesResponse(
        pod_resources=[
            prpb.PodResources(name="p", namespace="ns", containers=[prpb.ContainerResources(name="c", devices=[good])])
        ]
    ).SerializeToString()
    try:
        watcher.poll()
        assert watcher.available and watcher.in_use.holders == ((COLA, "cocacola", "ns", "p", "c"),)
        # Every field of the answer colad reads, in every shape, with the resource colad serves.
        names = {"resource_name": COLA.encode(), "namespace": b"ns", "name": b"p"}
        for label, data in wire.cases(prpb.ListPodResourcesResponse.DESCRIPTOR, plain=names):
            kubelet.answer = data
            watcher.poll()  # never raises
            held = {row[1] for row in watcher.in_use.holders}
            assert held <= {"cocacola", wire.VALID_ID}, (label, held)
        assert count("INTERNAL") >= 1  # the encoded surrogate: not decodable, counted, view down
        assert count("INVALID_ANSWER") >= 1
        # GetAllocatableResources, asked once per connection: every field of its answer too.
        kubelet.answer = good_answer
        allocatable = prpb.AllocatableResourcesResponse.DESCRIPTOR
        for label, data in wire.cases(allocatable, plain={"resource_name": COLA.encode()}):
            kubelet.allocatable = data
            watcher.stop()  # closes the connection: the next poll dials afresh and asks again
            watcher.poll()
            assert watcher.available, label
        kubelet.fail = grpc.StatusCode.INTERNAL
        watcher.poll()
        assert watcher.available is False and "INTERNAL: injected" in watcher.reason
    finally:
        watcher.stop()
        kubelet.server.stop(grace=None).wait(5)
    no_traceback(caplog)
    warnings = [r.getMessage() for r in caplog.records if "entries colad cannot use" in r.getMessage()]
    assert 1 <= len(warnings) < count("INVALID_ANSWER")  # told when they appear, not per answer


def test_an_unexpected_error_in_the_poll_thread_is_one_line_and_a_count(
    short_tmp: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = short_tmp / "pr.sock"
    kubelet = RawKubelet(path)
    cfg = Config(run_dir=str(short_tmp / "run"), pod_resources_socket=str(path), pod_resources_interval=0.05)
    (short_tmp / "run").mkdir(mode=0o700)
    metrics = Metrics(snapshot=lambda: PluginState(pid=1))

    def served() -> set[str]:
        raise RuntimeError("resources unreadable")

    watcher = InUseWatcher(cfg, metrics, served)
    internal = {"method": LIST, "code": "INTERNAL"}
    watcher.start()
    try:
        wait_until(
            lambda: (metrics.registry.get_sample_value("colad_rpc_errors_total", internal) or 0) >= 2,
            10,
            "two failed polls counted (the thread goes on)",
        )
    finally:
        watcher.stop()
        kubelet.server.stop(grace=None).wait(5)
    lines = [r.getMessage() for r in caplog.records if "in-use poll failed" in r.getMessage()]
    assert len(lines) == 1 and "RuntimeError: resources unreadable at test_rpc.py:" in lines[0]  # once
    no_traceback(caplog)
