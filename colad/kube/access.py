"""How to reach the API server: a kubeconfig's current context, or a pod's service account.

from_kubeconfig() and in_cluster() read where the server is and which credentials to present;
Credentials turns them into a TLS context and a bearer token, reading the files again whenever they
change on disk (a rotated service-account token, a renewed client certificate, a rewritten kubeconfig)
or the server refuses them. Reads files only;
the caller passes every path and the in-cluster host and port (only colad/config reads the environment).
"""

from __future__ import annotations

import base64
import json
import os
import ssl
import threading
import time
from dataclasses import dataclass

from colad.kube.errors import KubeconfigError

TYPE_CHECKING = False  # typing is not loaded at run time: docs/DEVELOPING.md, "Import cost"
if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import Any

SERVICE_ACCOUNT_DIR = "/var/run/secrets/kubernetes.io/serviceaccount"
# A credential file is small; a bigger one is refused rather than read into every call.
MAX_CREDENTIAL_FILE = 1 << 20
# A token file is read again at least this often even when its stat is unchanged (client-go's
# cachingTokenSource: transport/token_source.go reads the file again once its token is a minute old).
REREAD_SECONDS = 60.0


@dataclass(frozen=True)
class Access:
    """The server's URL and the credentials to present: each a file path or the data itself."""

    server: str  # https://host[:port]
    ca_file: str = ""
    ca_data: bytes = b""
    insecure: bool = False  # no server verification: only when the caller asked for it
    tls_server_name: str = ""
    cert_file: str = ""
    cert_data: bytes = b""
    key_file: str = ""
    key_data: bytes = b""
    token: str = ""
    token_file: str = ""


def _read(path: str, what: str) -> bytes:
    try:
        with open(path, "rb") as f:
            data = f.read(MAX_CREDENTIAL_FILE + 1)
    except OSError as exc:
        raise KubeconfigError(f"{what} {path}: {exc.strerror or exc}") from None
    if len(data) > MAX_CREDENTIAL_FILE:
        raise KubeconfigError(f"{what} {path}: larger than {MAX_CREDENTIAL_FILE} bytes")
    return data


def _parse(text: bytes, path: str) -> dict[str, Any]:
    """A kubeconfig: JSON (a YAML subset, read without YAML), else YAML."""
    try:
        doc = json.loads(text)
    except ValueError:
        try:
            import yaml  # only for a kubeconfig that is not JSON: the in-cluster path never loads it
        except ImportError:
            raise KubeconfigError(f"kubeconfig {path}: is YAML, and PyYAML is not installed") from None
        try:
            doc = yaml.safe_load(text)
        except yaml.YAMLError as exc:
            raise KubeconfigError(f"kubeconfig {path}: not YAML: {str(exc).splitlines()[0]}") from None
    if not isinstance(doc, dict):
        raise KubeconfigError(f"kubeconfig {path}: not a mapping")
    return doc


def _named(doc: dict[str, Any], section: str, name: str, key: str, path: str) -> dict[str, Any]:
    for entry in doc.get(section) or []:
        if isinstance(entry, dict) and entry.get("name") == name and isinstance(entry.get(key), dict):
            found: dict[str, Any] = entry[key]
            return found
    raise KubeconfigError(f"kubeconfig {path}: no {key} named {name!r} in {section}")


def _data(entry: dict[str, Any], key: str, path: str) -> bytes:
    value = entry.get(key)
    if not value:
        return b""
    try:
        return base64.b64decode(str(value), validate=True)
    except ValueError:
        raise KubeconfigError(f"kubeconfig {path}: {key} is not base64") from None


def from_kubeconfig(path: str, *, context: str = "", allow_insecure: bool = False) -> Access:
    """The current context of the kubeconfig at `path` (or `context`), its cluster and user.

    Relative file names are relative to the kubeconfig's directory, as kubectl reads them.
    insecure-skip-tls-verify is refused unless `allow_insecure`; exec and auth-provider plugins are
    refused (they run commands or speak to identity providers, which a node daemon does not).
    """
    doc = _parse(_read(path, "kubeconfig"), path)
    name = context or doc.get("current-context") or ""
    if not name:
        raise KubeconfigError(f"kubeconfig {path}: no current-context")
    ctx = _named(doc, "contexts", str(name), "context", path)
    cluster = _named(doc, "clusters", str(ctx.get("cluster") or ""), "cluster", path)
    user = _named(doc, "users", str(ctx.get("user") or ""), "user", path) if ctx.get("user") else {}
    base = os.path.dirname(os.path.abspath(path))

    def file(entry: dict[str, Any], key: str) -> str:
        value = entry.get(key)
        return os.path.join(base, str(value)) if value else ""

    server = str(cluster.get("server") or "")
    if not server.startswith("https://"):
        raise KubeconfigError(f"kubeconfig {path}: cluster server {server!r} is not an https:// URL")
    insecure = cluster.get("insecure-skip-tls-verify") is True
    if insecure and not allow_insecure:
        raise KubeconfigError(f"kubeconfig {path}: insecure-skip-tls-verify is refused unless allowed explicitly")
    for unsupported in ("exec", "auth-provider", "username", "password"):
        if user.get(unsupported):
            raise KubeconfigError(f"kubeconfig {path}: user {unsupported} is not supported")
    access = Access(
        server=server.rstrip("/"),
        ca_file=file(cluster, "certificate-authority"),
        ca_data=_data(cluster, "certificate-authority-data", path),
        insecure=insecure,
        tls_server_name=str(cluster.get("tls-server-name") or ""),
        cert_file=file(user, "client-certificate"),
        cert_data=_data(user, "client-certificate-data", path),
        key_file=file(user, "client-key"),
        key_data=_data(user, "client-key-data", path),
        token=str(user.get("token") or ""),
        token_file=file(user, "tokenFile"),
    )
    if bool(access.cert_file or access.cert_data) != bool(access.key_file or access.key_data):
        raise KubeconfigError(f"kubeconfig {path}: a client certificate needs its key, and a key its certificate")
    return access


def in_cluster(host: str, port: str, service_account_dir: str = SERVICE_ACCOUNT_DIR) -> Access:
    """A pod's own access: KUBERNETES_SERVICE_HOST and _PORT (passed in), its token and the cluster CA."""
    if not host or not port:
        raise KubeconfigError("in-cluster: KUBERNETES_SERVICE_HOST and KUBERNETES_SERVICE_PORT are not set")
    host_part = f"[{host}]" if ":" in host else host
    token_file = os.path.join(service_account_dir, "token")
    ca_file = os.path.join(service_account_dir, "ca.crt")
    for needed in (token_file, ca_file):
        if not os.path.isfile(needed):
            raise KubeconfigError(f"in-cluster: {needed} is missing")
    return Access(server=f"https://{host_part}:{port}", ca_file=ca_file, token_file=token_file)


def _stamp(path: str) -> tuple[int, int, int, int]:
    """What changes when a file is replaced or rewritten (a symlink swap as the kubelet does it too)."""
    try:
        st = os.stat(path)
    except OSError:
        return (0, 0, 0, 0)
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)


def _load_pem_chain(context: ssl.SSLContext, cert: bytes, key: bytes) -> None:
    """load_cert_chain from memory: the ssl module reads only paths, so hand it memory-backed files."""
    fds = []
    try:
        paths = []
        for label, data in (("cert", cert), ("key", key)):
            fd = os.memfd_create(f"colad-kube-{label}", os.MFD_CLOEXEC)
            fds.append(fd)
            os.write(fd, data)
            paths.append(f"/proc/self/fd/{fd}")
        context.load_cert_chain(paths[0], paths[1])
    finally:
        for fd in fds:
            os.close(fd)


class Credentials:
    """An Access made usable: the TLS context and the token, read again when their files change.

    Built from a kubeconfig (`kubeconfig` names it), the kubeconfig itself is read again when it is
    rewritten or replaced, so a new server, CA, certificate or token in it is used from the next call.
    A stat of each file per call notices a change; the token file is read again at least every
    REREAD_SECONDS whatever its stat says, and every file after the server answered 401 (`refresh`),
    as client-go's cachingTokenSource and tokenSourceTransport do. Safe to use from several threads.
    """

    def __init__(
        self,
        access: Access,
        *,
        kubeconfig: str = "",
        context: str = "",
        allow_insecure: bool = False,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._kubeconfig, self._context, self._allow_insecure = kubeconfig, context, allow_insecure
        self._clock = clock
        self._lock = threading.Lock()
        self._kubeconfig_stamp: tuple[int, int, int, int] | None = None  # read again on the first call
        self._use(access)

    def _use(self, access: Access) -> None:
        self._access = access
        self._files = tuple(f for f in (access.ca_file, access.cert_file, access.key_file) if f)
        self._tls_stamp: tuple[tuple[int, int, int, int], ...] | None = None
        self._context_built: ssl.SSLContext | None = None
        self._token_stamp: tuple[int, int, int, int] | None = None
        self._token_read_at = 0.0
        self._token = access.token

    @property
    def access(self) -> Access:
        """The access in use: the kubeconfig's current content when built from one."""
        with self._lock:
            return self._current()

    def _current(self) -> Access:
        if self._kubeconfig:
            stamp = _stamp(self._kubeconfig)
            if stamp != self._kubeconfig_stamp:
                # A kubeconfig that cannot be used now (half written in place) raises for this call, and
                # is read again on the next, as its stamp is kept only once it is read.
                access = from_kubeconfig(self._kubeconfig, context=self._context, allow_insecure=self._allow_insecure)
                self._kubeconfig_stamp = stamp
                if access != self._access:
                    self._use(access)
        return self._access

    def refresh(self) -> None:
        """Read every file again on the next call: the server refused the credentials (401)."""
        with self._lock:
            self._kubeconfig_stamp = None
            self._tls_stamp = None
            self._token_stamp = None

    def ssl_context(self) -> ssl.SSLContext:
        with self._lock:
            self._current()
            stamp = tuple(_stamp(f) for f in self._files)
            if self._context_built is None or stamp != self._tls_stamp:
                self._context_built = self._build()
                self._tls_stamp = stamp
            return self._context_built

    def _build(self) -> ssl.SSLContext:
        a = self._access
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
        if a.insecure:
            context.check_hostname = False
            context.verify_mode = ssl.CERT_NONE
        try:
            if a.ca_file or a.ca_data:
                context.load_verify_locations(
                    cadata=(_read(a.ca_file, "certificate-authority") if a.ca_file else a.ca_data).decode("ascii")
                )
            elif not a.insecure:
                context.load_default_certs()
            if a.cert_file or a.cert_data:
                cert = _read(a.cert_file, "client-certificate") if a.cert_file else a.cert_data
                key = _read(a.key_file, "client-key") if a.key_file else a.key_data
                _load_pem_chain(context, cert, key)
        except (ssl.SSLError, ValueError) as exc:
            raise KubeconfigError(f"TLS credentials: {exc}") from None
        return context

    def token(self) -> str:
        """The bearer token: the file's current content (stripped) when the access names a file."""
        with self._lock:
            path = self._current().token_file
            if path:
                stamp = _stamp(path)
                now = self._clock()
                if stamp != self._token_stamp or now - self._token_read_at >= REREAD_SECONDS:
                    self._token = _read(path, "token file").decode("utf-8", "replace").strip()
                    self._token_stamp = stamp
                    self._token_read_at = now
            return self._token
