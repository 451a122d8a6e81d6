"""The API-server client's errors: what a caller can tell apart and act on.

KubeconfigError is refused configuration (a missing file, an unsupported auth method); Unreachable is
no answer within the call's time (connection refused, TLS failure, a timeout); ApiError is an answer
with an error status, with Conflict, NotFound and Expired the ones a caller handles by name.
"""

from __future__ import annotations

from colad.core.errors import ColadError


class KubeError(ColadError):
    """Base of the API-server client's errors."""


class KubeconfigError(KubeError):
    """The kubeconfig or the in-cluster files cannot be used; the message names the file and the field."""


class Unreachable(KubeError):
    """No answer from the API server within the call's time, or no TLS session with it."""


class ApiError(KubeError):
    """The API server answered with an error: its HTTP status, the Status reason and message."""

    def __init__(self, status: int, reason: str, message: str) -> None:
        super().__init__(f"{status} {reason}: {message}")
        self.status = status
        self.reason = reason
        self.message = message


class Conflict(ApiError):
    """409: the object changed since it was read (a stale resourceVersion), or it already exists."""


class NotFound(ApiError):
    """404: no such object."""


class Expired(ApiError):
    """410: the resourceVersion a list or watch started from is too old; list again."""


UNREACHABLE = "unreachable"  # the code counted for a call that got no answer


def error_code(exc: KubeError) -> str:
    """What a failed call is counted as (colad_dra_api_errors_total's `code`): the HTTP status, or unreachable."""
    return str(exc.status) if isinstance(exc, ApiError) else UNREACHABLE
