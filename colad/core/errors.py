"""colad's error hierarchy: small on purpose.

Roles catch `ColadError` subclasses where a fault is expected and recoverable;
anything else is caught once at a role's main loop, logged and counted.
"""


class ColadError(Exception):
    """Base of every error colad raises on purpose."""


class ConfigError(ColadError):
    """The configuration is invalid; the message names the key and its source."""


class MessageError(ColadError):
    """A queue message could not be decoded or is not valid."""


class QueueError(ColadError):
    """The local queue failed: peer refused, connection lost, oversized frame."""


class RequestError(ColadError):
    """A gRPC request colad will not serve; the message names the field (`field[i]: why`).

    rpc.py answers it with `status`, a gRPC status code name (INVALID_ARGUMENT unless the kubelet
    contract documents another), and one log line unless the handler already wrote one (`logged`).
    """

    def __init__(self, message: str, *, status: str = "INVALID_ARGUMENT", logged: bool = False) -> None:
        super().__init__(message)
        self.status = status
        self.logged = logged


class AllocationError(RequestError):
    """An Allocate request names devices that cannot be handed out."""

    def __init__(self, message: str, *, not_found: bool = False) -> None:
        super().__init__(message, status="NOT_FOUND" if not_found else "INVALID_ARGUMENT")
        self.not_found = not_found


class CallError(ColadError):
    """A gRPC call colad made (to the kubelet) failed; `code` is the status code name."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(f"{code}: {message}")
        self.code = code


class InstanceError(ColadError):
    """Another live colad instance already owns a socket we need."""
