"""A strict fake Kubernetes API server: real HTTPS, bearer tokens, the resource.k8s.io/v1 calls a DRA driver makes.

Written from the upstream contract (kubernetes/api resource/v1 types.go, kubernetes/kubernetes
pkg/apis/resource/validation, the apiserver's REST conventions), since no kube-apiserver binary is to be
had here. ResourceSlices: create (generateName), get, update (409 on a stale resourceVersion, 422 on a
changed driver, pool or node), delete (preconditions), deletecollection and list with field selectors,
watch (chunked JSON events: the current state first when no resourceVersion is given, else the changes after
it; bookmarks; 410 once compacted). ResourceClaims and
Nodes: get. What upstream validation refuses is 422 with a Status body; a request without a valid
token or client certificate is 401. It can go down and come back on the same port, hang, and wipe a
node's slices as the kubelet does at its start. Every request is recorded, and who it came from.
"""

from __future__ import annotations

import itertools
import json
import random
import re
import socket
import ssl
import subprocess
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

SLICES = "/apis/resource.k8s.io/v1/resourceslices"
_CLAIM = re.compile(r"/apis/resource\.k8s\.io/v1/namespaces/([^/]+)/resourceclaims/([^/]+)\Z")
_NODE = re.compile(r"/api/v1/nodes/([^/]+)\Z")

# resource/v1 types.go and pkg/apis/resource/validation/validation.go.
MAX_DEVICES = 128
MAX_DEVICES_ADVANCED = 64  # with taints, counters or list attributes
MAX_ATTRIBUTES_AND_CAPACITIES = 32
MAX_ATTRIBUTE_VALUE = 64
MAX_DOMAIN = 63
MAX_ID = 32
MAX_POOL_NAME = 253
_LABEL = re.compile(r"[a-z0-9](?:[-a-z0-9]*[a-z0-9])?\Z")
_SUBDOMAIN = re.compile(r"[a-z0-9](?:[-a-z0-9]*[a-z0-9])?(?:\.[a-z0-9](?:[-a-z0-9]*[a-z0-9])?)*\Z")
_C_IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")
_SEMVER = re.compile(
    r"(0|[1-9]\d*)\.(0|[1-9]\d*)\.(0|[1-9]\d*)(?:-[0-9A-Za-z-]+(?:\.[0-9A-Za-z-]+)*)?(?:\+[0-9A-Za-z-]+(?:\.[0-9A-Za-z-]+)*)?\Z"
)
_VALUE_KINDS = ("int", "bool", "string", "version")
_LIST_KINDS = ("ints", "bools", "strings", "versions")
_NODE_SELECTION = ("nodeName", "nodeSelector", "allNodes", "perDeviceNodeSelection")
# apiserver storage/names: SimpleNameGenerator (63 - 5 characters of base, then 5 of these).
_NAME_ALPHABET = "bcdfghjklmnpqrstvwxz2456789"


def is_label(value: object) -> bool:
    return isinstance(value, str) and len(value) <= 63 and _LABEL.match(value) is not None


def is_subdomain(value: object) -> bool:
    return isinstance(value, str) and len(value) <= 253 and _SUBDOMAIN.match(value) is not None


def _qualified_name_problem(key: str) -> str | None:
    domain, slash, ident = key.rpartition("/")
    if slash and (not domain or len(domain) > MAX_DOMAIN or not is_subdomain(domain)):
        return "the domain must be a DNS subdomain of at most 63 characters"
    if len(ident) > MAX_ID or not _C_IDENTIFIER.match(ident):
        return "the name must be a C identifier of at most 32 characters"
    return None


def slice_problems(obj: Any) -> list[str]:
    """What upstream validation says of a ResourceSlice, one `field: why` per problem."""
    problems: list[str] = []
    if not isinstance(obj, dict):
        return ["body: must be an object"]
    if obj.get("apiVersion") != "resource.k8s.io/v1" or obj.get("kind") != "ResourceSlice":
        problems.append("apiVersion, kind: must be resource.k8s.io/v1 ResourceSlice")
    metadata = obj.get("metadata") or {}
    name = metadata.get("name")
    if name is not None and not is_subdomain(name):
        problems.append("metadata.name: must be a DNS subdomain")
    if name is None and not metadata.get("generateName"):
        problems.append("metadata.name: Required value: name or generateName is required")
    spec = obj.get("spec")
    if not isinstance(spec, dict):
        return [*problems, "spec: Required value"]
    driver = spec.get("driver")
    if not driver:
        problems.append("spec.driver: Required value")
    elif not is_subdomain(driver) or len(driver) > 63:
        problems.append("spec.driver: must be a DNS subdomain of at most 63 characters")
    pool = spec.get("pool")
    if not isinstance(pool, dict) or not pool.get("name"):
        problems.append("spec.pool.name: Required value")
    else:
        pool_name = pool["name"]
        if len(pool_name) > MAX_POOL_NAME or not all(is_subdomain(p) for p in str(pool_name).split("/")):
            problems.append("spec.pool.name: must be DNS subdomains separated by '/', at most 253 characters")
        if not isinstance(pool.get("generation", 0), int) or pool.get("generation", 0) < 0:
            problems.append("spec.pool.generation: must be greater than or equal to 0")
        count = pool.get("resourceSliceCount", 0)
        if not isinstance(count, int) or count <= 0:
            problems.append("spec.pool.resourceSliceCount: must be greater than zero")
    chosen = [k for k in _NODE_SELECTION if k in spec and spec[k] is not None]
    if len(chosen) != 1:
        problems.append(f"spec: exactly one of {', '.join(_NODE_SELECTION)} is required")
    if (
        "nodeName" in spec
        and spec["nodeName"] is not None
        and (spec["nodeName"] == "" or not is_subdomain(spec["nodeName"]))
    ):
        problems.append("spec.nodeName: must be either unset or set to a non-empty DNS subdomain")
    if spec.get("allNodes") is False:
        problems.append("spec.allNodes: must be either unset or set to true")
    devices = spec.get("devices") or []
    if spec.get("devices") and spec.get("sharedCounters"):
        problems.append("spec: devices and sharedCounters are mutually exclusive")
    if not isinstance(devices, list):
        return [*problems, "spec.devices: must be a list"]
    advanced = any(
        isinstance(d, dict)
        and (
            d.get("taints")
            or d.get("consumesCounters")
            or any(isinstance(v, dict) and set(v) & set(_LIST_KINDS) for v in (d.get("attributes") or {}).values())
        )
        for d in devices
    )
    limit = MAX_DEVICES_ADVANCED if advanced else MAX_DEVICES
    if len(devices) > limit:
        problems.append(f"spec.devices: Too many: {len(devices)}: must have at most {limit} items")
    seen: set[str] = set()
    for i, device in enumerate(devices):
        where = f"spec.devices[{i}]"
        if not isinstance(device, dict):
            problems.append(f"{where}: must be an object")
            continue
        device_name = device.get("name")
        if not device_name:
            problems.append(f"{where}.name: Required value")
        elif not is_label(device_name):
            problems.append(f"{where}.name: must be a DNS label")
        elif device_name in seen:
            problems.append(f"{where}.name: Duplicate value: {device_name!r}")
        else:
            seen.add(device_name)
        attributes = device.get("attributes") or {}
        capacity = device.get("capacity") or {}
        if len(attributes) + len(capacity) > MAX_ATTRIBUTES_AND_CAPACITIES:
            problems.append(f"{where}: at most {MAX_ATTRIBUTES_AND_CAPACITIES} attributes and capacities")
        for key in {**attributes, **capacity}:
            problem = _qualified_name_problem(key)
            if problem is not None:
                problems.append(f"{where}.attributes[{key}]: {problem}")
        for key, value in attributes.items():
            kinds = [k for k in (*_VALUE_KINDS, *_LIST_KINDS) if isinstance(value, dict) and k in value]
            if len(kinds) != 1:
                problems.append(f"{where}.attributes[{key}]: exactly one value must be specified")
                continue
            item = value[kinds[0]]
            if kinds[0] in ("string", "version") and (not isinstance(item, str) or len(item) > MAX_ATTRIBUTE_VALUE):
                problems.append(
                    f"{where}.attributes[{key}]: Too long: may not be more than {MAX_ATTRIBUTE_VALUE} bytes"
                )
            elif kinds[0] == "version" and not _SEMVER.match(item):
                problems.append(f"{where}.attributes[{key}].version: must be a semantic version")
            elif kinds[0] == "int" and (not isinstance(item, int) or isinstance(item, bool)):
                problems.append(f"{where}.attributes[{key}].int: must be an integer")
            elif kinds[0] == "bool" and not isinstance(item, bool):
                problems.append(f"{where}.attributes[{key}].bool: must be a boolean")
    return problems


def _selector(query: dict[str, list[str]]) -> dict[str, str]:
    """A field selector of `a=b` terms ('==' too); anything else is refused as the server refuses it."""
    terms: dict[str, str] = {}
    for raw in query.get("fieldSelector", [""])[0].split(","):
        if not raw:
            continue
        key, sep, value = raw.replace("==", "=").partition("=")
        if not sep or key not in ("spec.nodeName", "spec.driver", "spec.pool.name", "metadata.name"):
            raise _Refused(400, "BadRequest", f'"{raw}" is not a known field selector')
        terms[key] = value
    return terms


def _matches(obj: dict[str, Any], terms: dict[str, str]) -> bool:
    spec = obj.get("spec") or {}
    values = {
        "spec.nodeName": spec.get("nodeName") or "",
        "spec.driver": spec.get("driver") or "",
        "spec.pool.name": (spec.get("pool") or {}).get("name") or "",
        "metadata.name": obj["metadata"]["name"],
    }
    return all(values[k] == v for k, v in terms.items())


MAX_ALLOCATION_RESULTS = 32  # resource/v1 types.go AllocationResultsMaxSize


def claim_problems(claim: Any) -> list[str]:
    """What API-server validation refuses in a ResourceClaim's metadata and status.allocation."""
    metadata = claim.get("metadata") or {}
    problems = [
        f"metadata.{k} is not a DNS subdomain" for k in ("namespace", "name") if not is_subdomain(metadata.get(k))
    ]
    allocation = (claim.get("status") or {}).get("allocation")
    if allocation is None:
        return problems
    results = (allocation.get("devices") or {}).get("results") or []
    if len(results) > MAX_ALLOCATION_RESULTS:
        problems.append(f"status.allocation.devices.results: more than {MAX_ALLOCATION_RESULTS}")
    for i, result in enumerate(results):
        for key in ("request", "driver", "pool", "device"):
            if not isinstance(result.get(key), str) or not result[key]:
                problems.append(f"status.allocation.devices.results[{i}].{key}: required")
    return problems


class _Refused(Exception):
    def __init__(self, code: int, reason: str, message: str) -> None:
        super().__init__(message)
        self.code, self.reason, self.message = code, reason, message


def status_body(code: int, reason: str, message: str) -> dict[str, Any]:
    return {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": message,
        "reason": reason,
        "code": code,
    }


@dataclass
class Pki:
    """A throwaway CA and the certificates it signed, made by the openssl command in a test directory."""

    directory: Path
    ca: Path = field(init=False)
    server_cert: Path = field(init=False)
    server_key: Path = field(init=False)

    def __post_init__(self) -> None:
        d = self.directory
        self.ca = d / "ca.crt"
        key_options = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes", "-days", "2"]
        _openssl("req", "-x509", *key_options, "-keyout", d / "ca.key", "-out", self.ca, "-subj", "/CN=fake-ca")
        self.server_cert, self.server_key = self.issue("localhost", "subjectAltName=IP:127.0.0.1,DNS:localhost")

    def issue(self, cn: str, extension: str = "") -> tuple[Path, Path]:
        """A certificate for `cn` (and an extension line), signed by the CA: (cert, key)."""
        d = self.directory
        cert, key = d / f"{cn}.crt", d / f"{cn}.key"
        args: list[object] = ["req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]
        args += ["-keyout", key, "-out", cert, "-subj", f"/CN={cn}", "-days", "2"]
        args += ["-CA", self.ca, "-CAkey", d / "ca.key", "-addext", "basicConstraints=critical,CA:FALSE"]
        if extension:
            args += ["-addext", extension]
        _openssl(*args)
        return cert, key


def _openssl(*args: object) -> None:
    subprocess.run(["openssl", *map(str, args)], check=True, capture_output=True, timeout=60)


class FakeApiServer:
    """The fake API server: start(), stop() (down, state kept) and start() again on the same port."""

    def __init__(self, pki: Pki, *, tokens: set[str] | None = None, history: int = 1000) -> None:
        self.pki = pki
        self.tokens = set(tokens or {"test-token"})
        self.lock = threading.Condition()
        self.slices: dict[str, dict[str, Any]] = {}
        self.claims: dict[tuple[str, str], dict[str, Any]] = {}
        self.nodes: dict[str, dict[str, Any]] = {}
        self.requests: list[tuple[str, str, int]] = []  # method, path with query, status
        # Who each authenticated request came from, as the apiserver's union authenticator decides it:
        # a client certificate first ("x509:<CN>"), then a bearer token ("token:<token>").
        self.identities: list[str] = []
        self.events: list[tuple[int, int, str, dict[str, Any]]] = []  # sequence, resourceVersion, type, slice
        self._seq = itertools.count(1)
        self.history = history
        self.compacted = 0  # resourceVersions at or below this are gone (410 on watch)
        self._rv = itertools.count(1)
        self.resource_version = 0
        self.hang = threading.Event()  # set: every request waits, answering nothing, until cleared
        self.hanging = 0  # requests waiting for hang to be cleared now (guarded by lock)
        self.port = 0
        self._httpd: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None
        self._open: set[socket.socket] = set()
        self._random = random.Random(0)

    @property
    def url(self) -> str:
        return f"https://127.0.0.1:{self.port}"

    # --- life cycle ------------------------------------------------------------------------------

    def start(self) -> FakeApiServer:
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(self.pki.server_cert, self.pki.server_key)
        context.load_verify_locations(self.pki.ca)
        context.verify_mode = ssl.CERT_OPTIONAL  # a client certificate signed by the CA authenticates too
        server = self

        class Httpd(ThreadingHTTPServer):
            daemon_threads = True
            allow_reuse_address = True
            # Go listens with the system's somaxconn (net/sock_linux.go maxListenerBacklog), not
            # socketserver's 5: past 5 connections at once a SYN is dropped and retried a second later.
            request_queue_size = socket.SOMAXCONN

            def handle_error(self, request: Any, client_address: Any) -> None:
                pass  # a client that hung up or failed the handshake: nothing for the test to see

            def get_request(self) -> tuple[socket.socket, Any]:
                sock, address = self.socket.accept()
                with server.lock:
                    server._open.add(sock)
                return context.wrap_socket(sock, server_side=True, do_handshake_on_connect=False), address

        self._httpd = Httpd(("127.0.0.1", self.port), _Handler)
        self._httpd.fake = self  # type: ignore[attr-defined]
        self.port = self._httpd.server_address[1]
        self._thread = threading.Thread(target=self._httpd.serve_forever, name="fake-apiserver", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        """Down: the listening socket closed and every open connection cut; the objects are kept."""
        httpd, self._httpd = self._httpd, None
        if httpd is None:
            return
        httpd.shutdown()
        httpd.server_close()
        with self.lock:
            for sock in self._open:
                try:
                    sock.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
            self._open.clear()
            self.lock.notify_all()
        if self._thread is not None:
            self._thread.join(5)

    @property
    def up(self) -> bool:
        return self._httpd is not None

    # --- state -----------------------------------------------------------------------------------

    def _next_rv(self) -> str:
        self.resource_version = next(self._rv)
        return str(self.resource_version)

    def _record(self, kind: str, obj: dict[str, Any]) -> None:
        rv = int(obj["metadata"]["resourceVersion"])
        self.events.append((next(self._seq), rv, kind, json.loads(json.dumps(obj))))
        if len(self.events) > self.history:
            dropped = self.events[: len(self.events) - self.history]
            self.compacted = dropped[-1][1]
            del self.events[: len(dropped)]
        self.lock.notify_all()

    def compact(self) -> None:
        """Forget the watch history: a watch from any resourceVersion before now gets 410 Expired."""
        with self.lock:
            self.compacted = self.resource_version
            self.events.clear()

    def bookmark(self) -> None:
        """Send every watch that asked for bookmarks a BOOKMARK at the current resourceVersion."""
        with self.lock:
            self.events.append((next(self._seq), self.resource_version, "BOOKMARK", {}))
            self.lock.notify_all()

    def wipe_node(self, node_name: str, driver: str | None = None) -> int:
        """Delete the node's slices (of one driver, or all) as the kubelet does: the number deleted."""
        terms = {"spec.nodeName": node_name, **({"spec.driver": driver} if driver is not None else {})}
        with self.lock:
            return self._delete_matching(terms)

    def _delete_matching(self, terms: dict[str, str]) -> int:
        gone = [name for name, obj in self.slices.items() if _matches(obj, terms)]
        for name in gone:
            obj = self.slices.pop(name)
            obj["metadata"]["resourceVersion"] = self._next_rv()
            self._record("DELETED", obj)
        return len(gone)

    def add_node(self, name: str, uid: str = "") -> dict[str, Any]:
        with self.lock:
            node: dict[str, Any] = {
                "apiVersion": "v1",
                "kind": "Node",
                "metadata": {"name": name, "uid": uid or f"node-uid-{name}"},
            }
            node["metadata"]["resourceVersion"] = self._next_rv()
            self.nodes[name] = node
            return node

    def add_claim(self, claim: dict[str, Any]) -> dict[str, Any]:
        """Store a ResourceClaim; ValueError for what validation would refuse (resource/v1 types.go:
        at most 32 allocation results, each naming a request, driver, pool and device)."""
        problems = claim_problems(claim)
        if problems:
            raise ValueError("; ".join(problems))
        with self.lock:
            metadata = claim.setdefault("metadata", {})
            metadata.setdefault("uid", f"claim-uid-{metadata['name']}")
            metadata["resourceVersion"] = self._next_rv()
            claim.setdefault("apiVersion", "resource.k8s.io/v1")
            claim.setdefault("kind", "ResourceClaim")
            self.claims[(metadata["namespace"], metadata["name"])] = claim
            return claim

    def delete_claim(self, namespace: str, name: str) -> None:
        with self.lock:
            del self.claims[(namespace, name)]

    def add_allocated_claim(
        self, namespace: str, name: str, driver: str, pool: str, devices: list[str], request: str = "cola"
    ) -> dict[str, Any]:
        """A ResourceClaim the scheduler allocated to `devices` of `pool`, one result each, stored by add_claim()."""
        results = [{"request": request, "driver": driver, "pool": pool, "device": d} for d in devices]
        return self.add_claim(
            {
                "metadata": {"namespace": namespace, "name": name},
                "status": {"allocation": {"devices": {"results": results}}},
            }
        )

    def write_kubeconfig(self, path: Path, token: str) -> Path:
        """A kubeconfig naming this server's URL, its CA and a bearer `token`, written to `path`."""
        config = {
            "apiVersion": "v1",
            "kind": "Config",
            "current-context": "fake",
            "contexts": [{"name": "fake", "context": {"cluster": "fake", "user": "driver"}}],
            "clusters": [{"name": "fake", "cluster": {"server": self.url, "certificate-authority": str(self.pki.ca)}}],
            "users": [{"name": "driver", "user": {"token": token}}],
        }
        path.write_text(json.dumps(config))
        return path

    def node_slices(self, node_name: str, driver: str | None = None) -> list[dict[str, Any]]:
        terms = {"spec.nodeName": node_name, **({"spec.driver": driver} if driver is not None else {})}
        with self.lock:
            return [json.loads(json.dumps(o)) for o in self.slices.values() if _matches(o, terms)]

    def _published(self, terms: dict[str, str], expected: int | None = None) -> frozenset[str] | None:
        """Under the lock: the device names of the current generation of a pool, once all its slices are
        in; None while it is being written. With `expected`, None too unless it lists that many devices
        (checked before any name is collected: cheap on every change at 10,000 devices)."""
        held = [o["spec"] for o in self.slices.values() if _matches(o, terms)]
        if not held:
            return None
        generation = max(s["pool"].get("generation", 0) for s in held)
        current = [s for s in held if s["pool"].get("generation", 0) == generation]
        if any(s["pool"]["resourceSliceCount"] != len(current) for s in current):
            return None
        if expected is not None and sum(len(s.get("devices") or ()) for s in current) != expected:
            return None
        return frozenset(d["name"] for s in current for d in s.get("devices") or ())

    def published(self, node_name: str, driver: str) -> frozenset[str] | None:
        """The device names of the node's pool of `driver` (one pool), when its slices are complete; else None."""
        with self.lock:
            return self._published({"spec.nodeName": node_name, "spec.driver": driver})

    def wait_published(self, node_name: str, driver: str, names: set[str], timeout: float) -> float:
        """The monotonic time at which the node's pool of `driver` first listed exactly `names`, looked at
        on every change; TimeoutError after `timeout` seconds."""
        terms = {"spec.nodeName": node_name, "spec.driver": driver}
        deadline = time.monotonic() + timeout
        with self.lock:
            while self._published(terms, len(names)) != names:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    got = self._published(terms)
                    raise TimeoutError(
                        f"the pool of {driver} on {node_name} never listed the {len(names)} devices expected; "
                        f"now {'being written' if got is None else f'{len(got)} devices'}"
                    )
                self.lock.wait(remaining)
            return time.monotonic()

    # --- the REST calls --------------------------------------------------------------------------

    def create_slice(self, obj: Any) -> dict[str, Any]:
        problems = slice_problems(obj)
        if problems:
            raise _Refused(422, "Invalid", "ResourceSlice is invalid: " + "; ".join(problems))
        metadata = obj["metadata"]
        if "name" not in metadata:
            base = metadata["generateName"][:58]
            while True:
                name = base + "".join(self._random.choice(_NAME_ALPHABET) for _ in range(5))
                if name not in self.slices:
                    break
            if not is_subdomain(name):
                raise _Refused(422, "Invalid", f"metadata.name: {name!r} must be a DNS subdomain")
            metadata["name"] = name
        if metadata["name"] in self.slices:
            raise _Refused(409, "AlreadyExists", f'resourceslices "{metadata["name"]}" already exists')
        if metadata.get("resourceVersion"):
            raise _Refused(422, "Invalid", "metadata.resourceVersion: must be unset on create")
        metadata.update(
            uid=f"uid-{next(self._rv)}-{metadata['name']}", generation=1, creationTimestamp="2026-01-01T00:00:00Z"
        )
        metadata["resourceVersion"] = self._next_rv()
        self.slices[metadata["name"]] = obj
        self._record("ADDED", obj)
        return obj

    def update_slice(self, name: str, obj: Any) -> dict[str, Any]:
        held = self.slices.get(name)
        if held is None:
            raise _Refused(404, "NotFound", f'resourceslices.resource.k8s.io "{name}" not found')
        problems = slice_problems(obj)
        metadata = obj.get("metadata") or {} if isinstance(obj, dict) else {}
        if metadata.get("name") != name:
            problems.append("metadata.name: must match the name in the URL")
        if not metadata.get("resourceVersion"):
            problems.append("metadata.resourceVersion: Invalid value: 0: must be specified for an update")
        if not problems:
            old, new = held["spec"], obj["spec"]
            for key, label in (("driver", "spec.driver"), ("nodeName", "spec.nodeName")):
                if old.get(key) != new.get(key):
                    problems.append(f"{label}: field is immutable")
            if old["pool"]["name"] != new["pool"]["name"]:
                problems.append("spec.pool.name: field is immutable")
        if problems:
            raise _Refused(422, "Invalid", "ResourceSlice is invalid: " + "; ".join(problems))
        if metadata["resourceVersion"] != held["metadata"]["resourceVersion"]:
            raise _Refused(
                409,
                "Conflict",
                f'Operation cannot be fulfilled on resourceslices.resource.k8s.io "{name}": the object has been '
                "modified; please apply your changes to the latest version and try again",
            )
        kept = {k: held["metadata"][k] for k in ("uid", "creationTimestamp", "generation")}
        metadata.update(kept)
        if obj["spec"] != held["spec"]:
            metadata["generation"] = held["metadata"]["generation"] + 1
        metadata["resourceVersion"] = self._next_rv()
        self.slices[name] = obj
        self._record("MODIFIED", obj)
        return obj

    def delete_slice(self, name: str, options: Any) -> dict[str, Any]:
        held = self.slices.get(name)
        if held is None:
            raise _Refused(404, "NotFound", f'resourceslices.resource.k8s.io "{name}" not found')
        pre = (options or {}).get("preconditions") or {} if isinstance(options, dict) else {}
        for key in ("uid", "resourceVersion"):
            if pre.get(key) and pre[key] != held["metadata"][key]:
                message = (
                    f"Precondition failed: {key} in precondition: {pre[key]}, in object meta: {held['metadata'][key]}"
                )
                raise _Refused(409, "Conflict", message)
        del self.slices[name]
        held["metadata"]["resourceVersion"] = self._next_rv()
        self._record("DELETED", held)
        return held


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: Any
    # The API server is Go: net.TCPConn has TCP_NODELAY on by default (SetNoDelay: "The default is true").
    # With Nagle on, the body written after the headers waits for the client's delayed ACK, ~40 ms a call.
    disable_nagle_algorithm = True

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - the base class's name
        pass

    @property
    def fake(self) -> FakeApiServer:
        fake: FakeApiServer = self.server.fake
        return fake

    def _send(self, code: int, body: dict[str, Any]) -> None:
        data = json.dumps(body).encode()
        with self.fake.lock:  # before the answer: a client holding its answer finds its request recorded
            self.fake.requests.append((self.command, self.path, code))
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _authenticated(self) -> bool:
        """A client certificate (verified against the CA by the TLS layer), else a bearer token the fake
        holds now: a token taken out of `tokens` (rotated, revoked) is 401 from the next request on."""
        peer = self.connection.getpeercert()
        header = self.headers.get("Authorization", "")
        if peer:
            subject = dict(item[0] for item in peer.get("subject", ()))
            identity = f"x509:{subject.get('commonName', '')}"
        elif header.startswith("Bearer ") and header[len("Bearer ") :] in self.fake.tokens:
            identity = f"token:{header[len('Bearer ') :]}"
        else:
            return False
        with self.fake.lock:
            self.fake.identities.append(identity)
        return True

    def _body(self) -> Any:
        length = int(self.headers.get("Content-Length") or 0)
        if not length:
            return None
        try:
            return json.loads(self.rfile.read(length))
        except ValueError:
            raise _Refused(400, "BadRequest", "the body is not JSON") from None

    def _serve(self) -> None:
        if self.fake.hang.is_set():
            with self.fake.lock:
                self.fake.hanging += 1
                self.fake.lock.notify_all()
            try:
                while self.fake.hang.is_set() and self.fake.up:
                    threading.Event().wait(0.02)  # hanging: answer nothing until cleared or down
            finally:
                with self.fake.lock:
                    self.fake.hanging -= 1
        if not self.fake.up:
            self.close_connection = True
            return
        url = urlsplit(self.path)
        query = parse_qs(url.query)
        try:
            if not self._authenticated():
                raise _Refused(401, "Unauthorized", "Unauthorized")
            body = self._body()
            if query.get("watch", [""])[0] in ("1", "true") and self.command == "GET" and url.path == SLICES:
                self._watch(query)
                return
            with self.fake.lock:
                code, answer = self._route(url.path, query, body)
            self._send(code, answer)
        except _Refused as refused:
            self._send(refused.code, status_body(refused.code, refused.reason, refused.message))

    def _route(self, path: str, query: dict[str, list[str]], body: Any) -> tuple[int, dict[str, Any]]:
        fake, method = self.fake, self.command
        if path == SLICES:
            if method == "POST":
                return 201, fake.create_slice(body)
            if method == "GET":
                terms = _selector(query)
                items = [o for _, o in sorted(fake.slices.items()) if _matches(o, terms)]
                return 200, {
                    "apiVersion": "resource.k8s.io/v1",
                    "kind": "ResourceSliceList",
                    "metadata": {"resourceVersion": str(fake.resource_version)},
                    "items": items,
                }
            if method == "DELETE":
                fake._delete_matching(_selector(query))
                return 200, status_body(200, "", "") | {"status": "Success"}
        elif path.startswith(SLICES + "/"):
            name = path[len(SLICES) + 1 :]
            if method == "GET":
                if name not in fake.slices:
                    raise _Refused(404, "NotFound", f'resourceslices.resource.k8s.io "{name}" not found')
                return 200, fake.slices[name]
            if method == "PUT":
                return 200, fake.update_slice(name, body)
            if method == "DELETE":
                return 200, fake.delete_slice(name, body)
        elif match := _CLAIM.match(path):
            if method == "GET":
                claim = fake.claims.get((match.group(1), match.group(2)))
                if claim is None:
                    raise _Refused(404, "NotFound", f'resourceclaims.resource.k8s.io "{match.group(2)}" not found')
                return 200, claim
        elif match := _NODE.match(path):
            if method == "GET":
                node = fake.nodes.get(match.group(1))
                if node is None:
                    raise _Refused(404, "NotFound", f'nodes "{match.group(1)}" not found')
                return 200, node
        else:
            raise _Refused(404, "NotFound", "the server could not find the requested resource")
        raise _Refused(405, "MethodNotAllowed", f"{method} is not supported on {path}")

    def _watch(self, query: dict[str, list[str]]) -> None:
        fake = self.fake
        terms = _selector(query)
        bookmarks = query.get("allowWatchBookmarks", [""])[0] == "true"
        timeout = float(query.get("timeoutSeconds", ["1800"])[0])
        start = query.get("resourceVersion", [""])[0]
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        with fake.lock:
            fake.requests.append((self.command, self.path, 200))
            # "" and "0" start at the current state, sent first as synthetic ADDED events (the API
            # conventions' "Get State and Start at Most Recent / Any"); a version starts after it.
            initial = (
                [] if start not in ("", "0") else [o for _, o in sorted(fake.slices.items()) if _matches(o, terms)]
            )
            initial = json.loads(json.dumps(initial))
            since = int(start) if start.isdigit() and start != "0" else fake.resource_version
            expired = since < fake.compacted
            # The first event to send: the first after `since`; bookmarks only from now on.
            position = next((e[0] for e in fake.events if e[1] > since), None)
            if position is None:
                position = next(fake._seq)
        if expired:
            self._chunk({"type": "ERROR", "object": status_body(410, "Expired", f"too old resource version: {since}")})
            self._chunk(None)
            return
        for obj in initial:
            self._chunk({"type": "ADDED", "object": obj})
        deadline = threading.Event()
        timer = threading.Timer(timeout, deadline.set)
        timer.daemon = True
        timer.start()
        try:
            while not deadline.is_set() and fake.up:
                with fake.lock:
                    pending = [e for e in fake.events if e[0] >= position]
                    if not pending:
                        fake.lock.wait(0.1)
                        continue
                position = pending[-1][0] + 1
                for _, rv, kind, obj in pending:
                    if kind == "BOOKMARK":
                        if bookmarks:
                            marker = {"kind": "ResourceSlice", "apiVersion": "resource.k8s.io/v1"}
                            self._chunk({"type": kind, "object": marker | {"metadata": {"resourceVersion": str(rv)}}})
                    elif _matches(obj, terms):
                        self._chunk({"type": kind, "object": obj})
            if fake.up:
                self._chunk(None)
        except OSError:
            pass
        finally:
            timer.cancel()
            self.close_connection = True

    def _chunk(self, event: dict[str, Any] | None) -> None:
        data = b"" if event is None else json.dumps(event).encode() + b"\n"
        self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
        self.wfile.flush()

    do_GET = do_POST = do_PUT = do_DELETE = do_PATCH = _serve
