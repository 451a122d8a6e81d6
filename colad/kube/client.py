"""A small client of the Kubernetes API server over the standard library: the calls a node-local DRA driver makes.

ResourceSlices (resource.k8s.io/v1: create, get, update, delete, list and watch with field selectors),
a ResourceClaim by namespace and name, a Node by name. JSON over HTTPS with http.client: each call
has its own connection and a deadline, so no call outlives `timeout`, and an outage is Unreachable.
Objects are plain dicts; colad/core/slices.py owns a slice's shape. Errors: colad/kube/errors.py.
"""

from __future__ import annotations

import http.client
import json
import socket
import ssl
import time
from dataclasses import dataclass
from urllib.parse import quote, urlencode, urlsplit

from colad.kube.errors import ApiError, Conflict, Expired, NotFound, Unreachable

TYPE_CHECKING = False  # typing is not loaded at run time: docs/DEVELOPING.md, "Import cost"
if TYPE_CHECKING:
    from collections.abc import Callable, Iterator
    from typing import Any

    from colad.kube.access import Credentials

SLICES = "/apis/resource.k8s.io/v1/resourceslices"
# An answer bigger than this is refused: a list of this node's slices is far smaller (at 10,000 devices,
# about 80 slices of a few tens of kB).
MAX_BODY = 64 << 20
MAX_EVENT_LINE = 16 << 20
_ERRORS: dict[int, type[ApiError]] = {404: NotFound, 409: Conflict, 410: Expired}


def field_selector(*, node_name: str | None = None, driver: str | None = None) -> str:
    """The field selector of this node's (and this driver's) slices; None leaves a field out."""
    parts = []
    if node_name is not None:
        parts.append(f"spec.nodeName={node_name}")
    if driver is not None:
        parts.append(f"spec.driver={driver}")
    return ",".join(parts)


def _error(status: int, body: bytes) -> ApiError:
    """The typed error of a failed answer, from its Status body when it has one."""
    reason, message = http.client.responses.get(status, "Error"), body[:512].decode("utf-8", "replace")
    try:
        doc = json.loads(body)
        if isinstance(doc, dict) and doc.get("kind") == "Status":
            reason = str(doc.get("reason") or reason)
            message = str(doc.get("message") or "")
    except ValueError:
        pass
    return _ERRORS.get(status, ApiError)(status, reason, message)


@dataclass(frozen=True)
class WatchEvent:
    """One watch event: ADDED, MODIFIED, DELETED or BOOKMARK, and the object (a bookmark carries only
    metadata.resourceVersion)."""

    type: str
    object: dict[str, Any]

    @property
    def resource_version(self) -> str:
        return str((self.object.get("metadata") or {}).get("resourceVersion") or "")


class Watch:
    """An open watch: iterate for events; close() from any thread ends it. Ends when the server ends it
    (its timeoutSeconds) or stays silent past the idle time (Unreachable)."""

    def __init__(self, connection: http.client.HTTPSConnection, response: http.client.HTTPResponse) -> None:
        self._connection = connection
        self._response = response
        self._closed = False
        self._reading = False

    def __iter__(self) -> Iterator[WatchEvent]:
        self._reading = True
        try:
            while not self._closed:
                try:
                    line = self._response.readline(MAX_EVENT_LINE)
                except (OSError, http.client.HTTPException) as exc:
                    if self._closed:
                        return
                    raise Unreachable(f"watch: {exc or type(exc).__name__}") from None
                if not line:
                    return
                if not line.strip():
                    continue
                try:
                    event = json.loads(line)
                    kind, obj = event["type"], event["object"]
                except (ValueError, KeyError, TypeError):
                    raise Unreachable("watch: an event that is not JSON") from None
                if kind == "ERROR":
                    raise _error(int(obj.get("code") or 500), json.dumps(obj).encode())
                yield WatchEvent(str(kind), obj)
        finally:
            self._closed = True
            self._connection.close()  # here, in the reading thread: http.client is not thread-safe

    def close(self) -> None:
        """End the watch: the reading thread sees the end of its stream and closes the connection."""
        self._closed = True
        sock = self._connection.sock
        if sock is not None:
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        if not self._reading:
            self._connection.close()


class KubeClient:
    """Calls to one API server with one set of credentials, each bounded by `timeout` seconds."""

    def __init__(
        self,
        credentials: Credentials,
        *,
        timeout: float = 10.0,
        user_agent: str = "colad",
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.credentials = credentials
        self.timeout = timeout
        self._user_agent = user_agent
        self._clock = clock

    # --- the transport -------------------------------------------------------------------------

    def _connect(self, deadline: float) -> _Connection:
        """A connection to the server the credentials name now (a rewritten kubeconfig may move it)."""
        context = self.credentials.ssl_context()
        access = self.credentials.access
        url = urlsplit(access.server)
        host = url.hostname or ""
        connection = _Connection(
            host, url.port or 443, access.tls_server_name or host, deadline, self._clock, context=context
        )
        connection.prefix = url.path.rstrip("/")
        return connection

    def _refused(self, status: int) -> None:
        """A 401: the credentials were rotated under us or revoked; the next call reads them again."""
        if status == 401:
            self.credentials.refresh()

    def _send(self, connection: _Connection, method: str, path: str, body: object) -> http.client.HTTPResponse:
        headers = {"Accept": "application/json", "User-Agent": self._user_agent}
        token = self.credentials.token()
        if token:
            headers["Authorization"] = f"Bearer {token}"
        data = None
        if body is not None:
            data = json.dumps(body, separators=(",", ":")).encode()
            headers["Content-Type"] = "application/json"
        connection.request(method, connection.prefix + path, body=data, headers=headers)
        return connection.getresponse()

    def request(self, method: str, path: str, *, query: dict[str, str] | None = None, body: object = None) -> Any:
        """One call: the decoded JSON answer, ApiError for an error status, Unreachable past the deadline."""
        if query:
            path = f"{path}?{urlencode(query)}"
        deadline = self._clock() + self.timeout
        connection = self._connect(deadline)
        try:
            response = self._send(connection, method, path, body)
            chunks = []
            size = 0
            while True:
                remaining = deadline - self._clock()
                if remaining <= 0:
                    raise TimeoutError("timed out")
                if connection.sock is not None:
                    connection.sock.settimeout(remaining)
                chunk = response.read1(1 << 16)
                if not chunk:
                    break
                size += len(chunk)
                if size > MAX_BODY:
                    raise Unreachable(f"{method} {path}: an answer larger than {MAX_BODY} bytes")
                chunks.append(chunk)
        except ssl.SSLCertVerificationError as exc:
            raise Unreachable(f"{method} {path}: TLS verification failed: {exc.verify_message}") from None
        except (OSError, http.client.HTTPException) as exc:
            raise Unreachable(f"{method} {path}: {exc or type(exc).__name__}") from None
        finally:
            connection.close()
        data = b"".join(chunks)
        if response.status >= 300:
            self._refused(response.status)
            raise _error(response.status, data)
        try:
            return json.loads(data) if data else {}
        except ValueError:
            raise Unreachable(f"{method} {path}: an answer that is not JSON") from None

    # --- ResourceSlices ------------------------------------------------------------------------

    def create_slice(self, obj: dict[str, Any]) -> dict[str, Any]:
        created: dict[str, Any] = self.request("POST", SLICES, body=obj)
        return created

    def get_slice(self, name: str) -> dict[str, Any]:
        found: dict[str, Any] = self.request("GET", f"{SLICES}/{quote(name, safe='')}")
        return found

    def update_slice(self, obj: dict[str, Any]) -> dict[str, Any]:
        """A whole-object update; Conflict when metadata.resourceVersion is not the stored one."""
        name = quote(str(obj["metadata"]["name"]), safe="")
        updated: dict[str, Any] = self.request("PUT", f"{SLICES}/{name}", body=obj)
        return updated

    def delete_slice(self, name: str, *, uid: str = "", resource_version: str = "") -> None:
        """Delete one slice, only if it is still the one read (uid, resourceVersion) when given."""
        preconditions = {k: v for k, v in (("uid", uid), ("resourceVersion", resource_version)) if v}
        body = {"kind": "DeleteOptions", "apiVersion": "v1", "preconditions": preconditions} if preconditions else None
        self.request("DELETE", f"{SLICES}/{quote(name, safe='')}", body=body)

    def list_slices(self, selector: str = "") -> tuple[list[dict[str, Any]], str]:
        """The slices matching the field selector, and the list's resourceVersion to watch from."""
        answer = self.request("GET", SLICES, query={"fieldSelector": selector} if selector else None)
        return list(answer.get("items") or []), str((answer.get("metadata") or {}).get("resourceVersion") or "")

    def watch_slices(self, selector: str, resource_version: str, *, timeout_seconds: int = 300) -> Watch:
        """Events after `resource_version` for the slices matching the selector, with bookmarks.

        The server ends the watch after `timeout_seconds`; a silence of that long plus `timeout`
        (no event, no bookmark) is Unreachable. Expired when `resource_version` is too old.
        """
        query = {
            "watch": "1",
            "resourceVersion": resource_version,
            "allowWatchBookmarks": "true",
            "timeoutSeconds": str(timeout_seconds),
        }
        if selector:
            query["fieldSelector"] = selector
        path = f"{SLICES}?{urlencode(query)}"
        connection = self._connect(self._clock() + self.timeout)
        try:
            response = self._send(connection, "GET", path, None)
            if response.status >= 300:
                self._refused(response.status)
                raise _error(response.status, response.read(MAX_BODY))
        except ssl.SSLCertVerificationError as exc:
            connection.close()
            raise Unreachable(f"watch: TLS verification failed: {exc.verify_message}") from None
        except (OSError, http.client.HTTPException) as exc:
            connection.close()
            raise Unreachable(f"watch: {exc or type(exc).__name__}") from None
        except ApiError:
            connection.close()
            raise
        if connection.sock is not None:
            connection.sock.settimeout(timeout_seconds + self.timeout)
        return Watch(connection, response)

    # --- what a driver reads ------------------------------------------------------------------

    def get_claim(self, namespace: str, name: str) -> dict[str, Any]:
        path = f"/apis/resource.k8s.io/v1/namespaces/{quote(namespace, safe='')}/resourceclaims/{quote(name, safe='')}"
        claim: dict[str, Any] = self.request("GET", path)
        return claim

    def get_node(self, name: str) -> dict[str, Any]:
        node: dict[str, Any] = self.request("GET", f"/api/v1/nodes/{quote(name, safe='')}")
        return node


class _Connection(http.client.HTTPSConnection):
    """An HTTPS connection whose connect, TLS handshake and request all end by one deadline, and whose
    certificate is checked for `server_name` (the kubeconfig's tls-server-name, else the host)."""

    def __init__(
        self, host: str, port: int, server_name: str, deadline: float, clock: Callable[[], float], **kwargs: Any
    ) -> None:
        super().__init__(host, port, timeout=max(deadline - clock(), 0.001), **kwargs)
        self.prefix = ""  # the server URL's path, before every request's
        self._server_name = server_name
        self._deadline = deadline
        self._clock_of = clock

    def connect(self) -> None:
        http.client.HTTPConnection.connect(self)
        remaining = self._deadline - self._clock_of()
        if remaining <= 0:
            raise TimeoutError("timed out")
        self.sock.settimeout(remaining)
        self.sock = self._context.wrap_socket(self.sock, server_hostname=self._server_name)  # type: ignore[attr-defined]
