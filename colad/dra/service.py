"""The DRA kubelet plugin service: NodePrepareResources and NodeUnprepareResources, v1 and v1beta1.

Prepare reads each claim from the API server (colad/kube/client.py), maps its allocation to this node's
devices (colad/core/claims.py, through the names colad/core/slices.py publishes), writes one CDI spec per
claim (colad/outputs/cdi.py, with Allocate's content from colad/core/allocation.py), runs the resource's
prepare command (colad/jobs/prestart.py) and checkpoints the claim in the state directory. Unprepare needs
only the checkpoint and the claim's uid. A claim's failure is its `error`; no call outlives call_timeout.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent import futures
from typing import Any

import grpc

from colad.api import dra_v1_pb2, dra_v1beta1_pb2
from colad.config.config import Resource
from colad.core import allocation, claims, trust
from colad.core.claims import ClaimDevice, ClaimError, ClaimRef, PreparedClaim, PreparedDevice
from colad.core.devices import DeviceSet, clip_reason
from colad.core.errors import AllocationError, ColadError
from colad.core.slices import pool_names
from colad.jobs import prestart
from colad.kube.client import KubeClient
from colad.kube.errors import KubeError, NotFound, Unreachable, error_code
from colad.metrics.registry import Metrics
from colad.outputs import cdi
from colad.runtime import files, log, rpc

LOG = log.get(__name__)
V1_SERVICE = dra_v1_pb2.DESCRIPTOR.services_by_name["DRAPlugin"]
V1BETA1_SERVICE = dra_v1beta1_pb2.DESCRIPTOR.services_by_name["DRAPlugin"]
# The kubelet gives each call 45 s (pkg/kubelet/cm/dra/plugin/dra_plugin.go defaultClientCallTimeout); an
# answer within 20 s leaves it room even when its call waited for a connection.
CALL_TIMEOUT = 20.0
# Claims of one call are read from the API server at once, as many as this; the rest of the work is
# serialized (one lock: the checkpoint and the CDI directory are shared), as the Go helper does.
READERS = 8


class DraPluginService:
    """Prepares and unprepares claims for the kubelet; add_to() serves it on a gRPC server."""

    def __init__(
        self,
        *,
        driver: str,
        node_name: str,
        client: KubeClient,
        resources: Sequence[Resource],
        devices: Callable[[], Mapping[str, DeviceSet]],
        cdi_spec_dir: str,
        state_dir: str,
        metrics: Metrics | None = None,
        call_timeout: float = CALL_TIMEOUT,
        clock: Callable[[], float] = time.monotonic,
        trusted: frozenset[int] = trust.ROOT_ONLY,
    ) -> None:
        for key, path in (("cdi_spec_dir", cdi_spec_dir), ("state_dir", state_dir)):
            if not os.path.isabs(path):
                raise ColadError(f"{key} {path!r}: the DRA driver needs an absolute directory")
        self.driver, self.node_name, self.client = driver, node_name, client
        self.resources = {r.name: r for r in resources}
        self.pools = pool_names(node_name, [r.name for r in resources])
        self.devices = devices
        self.cdi_spec_dir, self.state_dir = cdi_spec_dir, state_dir
        self.metrics = metrics if metrics is not None else Metrics()
        self.call_timeout, self.clock, self.trusted = call_timeout, clock, trusted
        self.checkpoint_path = os.path.join(state_dir, claims.CHECKPOINT_FILE)
        self._lock = threading.Lock()
        self._readers = futures.ThreadPoolExecutor(max_workers=READERS, thread_name_prefix="dra-claims")
        self._claims = self._load()

    # --- the gRPC side ----------------------------------------------------------------------------

    def add_to(self, server: grpc.Server) -> None:
        """Serve DRAPlugin v1 and v1beta1 (same messages but share_id) on `server`, through the RPC boundary."""
        for service, messages in ((V1_SERVICE, dra_v1_pb2), (V1BETA1_SERVICE, dra_v1beta1_pb2)):
            servicer = _Servicer(self, messages)
            server.add_generic_rpc_handlers(
                (rpc.handlers(service, servicer, messages, self.metrics.rpc_errors, fields={"driver": self.driver}),)
            )

    def prepared(self) -> int:
        return len(self._claims)

    def count(self, operation: str, failed: Sequence[bool], started: float) -> None:
        """One answered call of `operation` (prepare, unprepare): each claim's result and the call's time."""
        m = self.metrics
        prepare = operation == "prepare"
        claims_family = m.dra_prepares if prepare else m.dra_unprepares
        duration = m.dra_prepare_duration if prepare else m.dra_unprepare_duration
        for result, n in (("success", failed.count(False)), ("error", failed.count(True))):
            if n:
                claims_family.labels(self.driver, result).inc(n)
        duration.labels(self.driver).observe(max(0.0, self.clock() - started))

    def _read_claim(self, ref: ClaimRef) -> dict[str, Any]:
        try:
            return self.client.get_claim(ref.namespace, ref.name)
        except KubeError as exc:
            self.metrics.dra_api_errors.labels("get", error_code(exc)).inc()
            raise

    # --- prepare -----------------------------------------------------------------------------------

    def prepare(self, refs: Sequence[ClaimRef], budget: float | None = None) -> dict[str, PreparedClaim | str]:
        """Each claim's prepared devices, or its error, by uid; returns within the call's time."""
        deadline = self.clock() + min(self.call_timeout, budget if budget is not None else self.call_timeout)
        answers: dict[str, PreparedClaim | str] = {}
        reads: dict[str, futures.Future[dict[str, Any]]] = {}
        known = self._claims  # replaced whole under the lock, never changed in place: read without it
        for ref in refs:
            problem = claims.uid_problem(ref.uid)
            if problem is not None:
                answers[ref.uid] = problem
            elif ref.uid in known and os.path.exists(self._spec_path(ref.uid)):
                answers[ref.uid] = known[ref.uid]  # prepared before: the allocation of a uid never changes
            elif ref.uid not in reads:
                reads[ref.uid] = self._readers.submit(self._read_claim, ref)
        # The slow part first, outside the lock: a claim that is not read in time is that claim's error.
        futures.wait(reads.values(), timeout=max(0.0, deadline - self.clock()))
        fetched: dict[str, dict[str, Any]] = {}
        for ref in refs:
            read = reads.get(ref.uid)
            if read is None or ref.uid in answers:
                continue
            if not read.done():
                answers[ref.uid] = f"ResourceClaim {ref.namespace}/{ref.name}: no answer from the API server in time"
                continue
            try:
                fetched[ref.uid] = read.result()
            except NotFound:
                answers[ref.uid] = f"ResourceClaim {ref.namespace}/{ref.name} not found"
            except Unreachable as exc:
                answers[ref.uid] = f"ResourceClaim {ref.namespace}/{ref.name}: API server unreachable: {exc}"
            except KubeError as exc:
                answers[ref.uid] = f"ResourceClaim {ref.namespace}/{ref.name}: {exc}"
            except Exception as exc:  # one claim's colad bug is that claim's error, not the call's
                LOG.error("claim not read: a colad bug", uid=ref.uid, error=rpc.failure(exc))
                answers[ref.uid] = f"internal error in colad ({type(exc).__name__}); see its log"
        if fetched:
            if not self._lock.acquire(timeout=max(0.0, deadline - self.clock())):
                for uid in fetched:
                    answers[uid] = "another prepare or unprepare held the driver past the call's time"
            else:
                try:
                    answers.update(self._prepare_locked(refs, fetched, deadline))
                finally:
                    self._lock.release()
        for ref in refs:
            answer = answers.get(ref.uid, "not prepared")
            if isinstance(answer, str):
                answers[ref.uid] = answer = clip_reason(answer)
                LOG.warning("claim not prepared", claim=f"{ref.namespace}/{ref.name}", uid=ref.uid, reason=answer)
        return answers

    def _prepare_locked(
        self, refs: Sequence[ClaimRef], fetched: Mapping[str, dict[str, Any]], deadline: float
    ) -> dict[str, PreparedClaim | str]:
        answers: dict[str, PreparedClaim | str] = {}
        sets = self.devices()
        table = dict(self._claims)
        written: list[str] = []
        for ref in refs:
            claim = fetched.get(ref.uid)
            if claim is None or ref.uid in answers:
                continue
            if self.clock() >= deadline:
                answers[ref.uid] = "not prepared within the call's time: the claims before it took it"
                continue
            try:
                found = claims.claim_devices(claim, ref, self.driver, self.pools, sets)
                spec, prepared = self._spec(ref, found, sets)
                self._run_prepare(found, sets, deadline)
                path = self._spec_path(ref.uid)
                files.replace(path, spec, 0o644, 0o755)
            except (ClaimError, AllocationError) as exc:
                answers[ref.uid] = str(exc)
                continue
            except OSError as exc:
                answers[ref.uid] = f"CDI spec not written: {exc.strerror or exc}"
                continue
            except Exception as exc:  # one claim's colad bug is that claim's error, not the call's
                LOG.error("claim not prepared: a colad bug", uid=ref.uid, error=rpc.failure(exc))
                answers[ref.uid] = f"internal error in colad ({type(exc).__name__}); see its log"
                continue
            written.append(ref.uid)
            table[ref.uid] = answers[ref.uid] = prepared
        if written:
            try:
                self._save(table)
            except OSError as exc:
                for uid in written:
                    self._remove_spec(uid)
                    answers[uid] = f"checkpoint not written: {exc.strerror or exc}"
                return answers
            self._claims = table
            for uid in written:
                c = table[uid]
                LOG.info(
                    "claim prepared",
                    claim=f"{c.ref.namespace}/{c.ref.name}",
                    uid=uid,
                    devices=",".join(d.device_id for d in c.devices),
                )
        return answers

    def _spec(
        self, ref: ClaimRef, found: Sequence[ClaimDevice], sets: Mapping[str, DeviceSet]
    ) -> tuple[bytes, PreparedClaim]:
        """The claim's CDI spec and its answer. Devices of one request and resource get what Allocate
        gives one container for them; an AllocationError (an Unhealthy device, a path two devices
        want differently) is the claim's error."""
        groups: dict[tuple[tuple[str, ...], str], list[ClaimDevice]] = {}
        for d in found:
            groups.setdefault((d.request_names, d.resource), []).append(d)
        entries = []
        prepared = []
        for (_requests, resource), members in groups.items():
            answer = allocation.allocate(sets[resource], [d.device_id for d in members], resource_name=resource)
            for d in members:
                device = sets[resource].get(d.device_id)
                assert device is not None  # claim_devices() found it in this set
                entries.append((claims.claim_cdi_device(ref.uid, d.device), device, answer.envs))
                cdi_id = claims.claim_cdi_id(self.driver, ref.uid, d.device)
                prepared.append(PreparedDevice(resource, d.device_id, d.pool, d.device, d.request_names, (cdi_id,)))
        spec = cdi.encode_claim_spec(claims.claim_cdi_kind(self.driver), entries)
        return spec, PreparedClaim(ref, tuple(prepared))

    def _run_prepare(self, found: Sequence[ClaimDevice], sets: Mapping[str, DeviceSet], deadline: float) -> None:
        """The resources' prepare commands, as PreStartContainer runs them, within the call's time."""
        by_resource: dict[str, list[str]] = {}
        for d in found:
            by_resource.setdefault(d.resource, []).append(d.device_id)
        for resource, ids in by_resource.items():
            config = self.resources[resource]
            try:
                steps = prestart.plan(resource, config.prepare, sets[resource], ids)
            except prestart.UnknownDevice as exc:
                raise ClaimError(f"device {exc} is not published by this node now") from None
            for step in steps:
                budget = min(config.prepare_timeout, deadline - self.clock() - prestart.ANSWER_MARGIN)
                result = prestart.run(step, max(0.0, budget), self.trusted)
                if result.leftovers:
                    LOG.warning(
                        "prepare left processes running; killed",
                        resource=resource,
                        command=step.argv[0],
                        killed=result.leftovers,
                    )
                if not result.ok:
                    if result.refused:
                        self.metrics.input_rejected["untrusted_program"] += 1
                    devices = ",".join(step.device_ids)
                    raise ClaimError(f"prepare command {step.argv[0]} failed for device {devices}: {result.reason}")

    # --- unprepare ---------------------------------------------------------------------------------

    def unprepare(self, refs: Sequence[ClaimRef], budget: float | None = None) -> dict[str, str]:
        """Each claim's error by uid ("" = unprepared); a claim not prepared is unprepared already."""
        deadline = self.clock() + min(self.call_timeout, budget if budget is not None else self.call_timeout)
        answers: dict[str, str] = {}
        valid = []
        for ref in refs:
            problem = claims.uid_problem(ref.uid)
            if problem is not None:
                answers[ref.uid] = problem
            else:
                valid.append(ref)
        if not valid:
            return answers
        if not self._lock.acquire(timeout=max(0.0, deadline - self.clock())):
            answers.update({r.uid: "another prepare or unprepare held the driver past the call's time" for r in valid})
            return answers
        try:
            table = dict(self._claims)
            removed = []
            for ref in valid:
                try:
                    self._remove_spec(ref.uid)  # by its name: a spec written just before a crash goes too
                except OSError as exc:
                    answers[ref.uid] = f"CDI spec not removed: {exc.strerror or exc}"
                    continue
                answers[ref.uid] = ""
                if table.pop(ref.uid, None) is not None:
                    removed.append(ref)
            if removed:
                try:
                    self._save(table)
                except OSError as exc:
                    for ref in removed:
                        answers[ref.uid] = f"checkpoint not written: {exc.strerror or exc}"
                    return answers
                self._claims = table
            for ref in removed:
                LOG.info("claim unprepared", claim=f"{ref.namespace}/{ref.name}", uid=ref.uid)
        finally:
            self._lock.release()
        return answers

    # --- files -------------------------------------------------------------------------------------

    def _spec_path(self, uid: str) -> str:
        return os.path.join(self.cdi_spec_dir, claims.claim_spec_file(self.driver, uid))

    def _remove_spec(self, uid: str) -> None:
        try:
            os.unlink(self._spec_path(uid))
        except FileNotFoundError:
            pass

    def _save(self, table: Mapping[str, PreparedClaim]) -> None:
        data = claims.encode_checkpoint(self.driver, table.values())
        files.replace(self.checkpoint_path, data, 0o600, 0o700)

    def _load(self) -> dict[str, PreparedClaim]:
        try:
            with open(self.checkpoint_path, "rb") as f:
                data = f.read()
        except FileNotFoundError:
            return {}
        except OSError as exc:
            LOG.error("DRA checkpoint unreadable; starting without it", path=self.checkpoint_path, error=str(exc))
            return {}
        try:
            loaded = claims.decode_checkpoint(data, self.driver)
        except claims.CheckpointError as exc:
            LOG.error("DRA checkpoint refused; starting without it", path=self.checkpoint_path, error=str(exc))
            return {}
        LOG.info("DRA checkpoint read", path=self.checkpoint_path, claims=len(loaded))
        return loaded

    def close(self) -> None:
        """Stop the reader threads (reads in flight end by the client's own timeout)."""
        self._readers.shutdown(wait=False, cancel_futures=True)


def _refs(request: Any) -> list[ClaimRef]:
    return [ClaimRef(c.namespace, c.name, c.uid) for c in request.claims]


class _Servicer:
    """DRAPlugin of one API version: protobuf in, the service's answers out."""

    def __init__(self, service: DraPluginService, messages: Any) -> None:
        self.service, self.pb = service, messages

    def NodePrepareResources(self, request: Any, context: grpc.ServicerContext) -> Any:  # noqa: N802
        started, remaining = self.service.clock(), context.time_remaining()
        answers = self.service.prepare(_refs(request), None if remaining is None else remaining - 1.0)
        self.service.count("prepare", [isinstance(a, str) for a in answers.values()], started)
        response = self.pb.NodePrepareResourcesResponse()
        for uid, answer in answers.items():
            entry = response.claims[uid]
            if isinstance(answer, str):
                entry.error = answer
                continue
            for d in answer.devices:
                entry.devices.add(
                    request_names=list(d.request_names),
                    pool_name=d.pool,
                    device_name=d.device,
                    cdi_device_ids=list(d.cdi_device_ids),
                )
        return response

    def NodeUnprepareResources(self, request: Any, context: grpc.ServicerContext) -> Any:  # noqa: N802
        started, remaining = self.service.clock(), context.time_remaining()
        answers = self.service.unprepare(_refs(request), None if remaining is None else remaining - 1.0)
        self.service.count("unprepare", [bool(e) for e in answers.values()], started)
        response = self.pb.NodeUnprepareResourcesResponse()
        for uid, error in answers.items():
            response.claims[uid].error = error
        return response
