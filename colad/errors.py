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


class AllocationError(ColadError):
    """An Allocate request names devices that cannot be handed out."""

    def __init__(self, message: str, *, not_found: bool = False) -> None:
        super().__init__(message)
        self.not_found = not_found


class InstanceError(ColadError):
    """Another live colad instance already owns a socket we need."""
