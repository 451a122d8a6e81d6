"""The one boundary every gRPC call colad serves or makes goes through: an error is a status and one line.

Server side, `handlers()` builds a service's method handlers from its protobuf descriptor, each one
wrapped: a request that does not decode, or a `RequestError` a handler raises (its message names the
field), is answered with that status (INVALID_ARGUMENT unless the error says otherwise); anything else
with INTERNAL. Client side, `Client` makes the calls colad sends the kubelet: an answer, or a `CallError`.
Either way one log line without a traceback (`failure()`), and colad_rpc_errors_total{method,code}.
Nothing here knows a service: service.py and podresources.py name theirs.
"""

from __future__ import annotations

import os
import traceback
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import grpc
from google.protobuf.descriptor import MethodDescriptor, ServiceDescriptor

from colad.core.devices import clip_reason
from colad.core.errors import CallError, RequestError
from colad.runtime import log

LOG = log.get(__name__)
# Metrics.rpc_errors: colad_rpc_errors_total{method,code}, e.g. ("v1beta1.DevicePlugin/Allocate", "NOT_FOUND").
Errors = Any
WRAPPED = "_colad_boundary"  # set on every behavior handlers() made: the test that no method bypasses it reads it


class Undecodable:
    """What a tolerant deserializer hands on for bytes that are not the message: the call fails, not grpc."""

    __slots__ = ("error",)

    def __init__(self, error: Exception) -> None:
        self.error = error


def decoder(message: Any) -> Callable[[bytes], Any]:
    """message.FromString, but bytes it refuses become Undecodable (grpc would log a traceback)."""
    parse = message.FromString

    def decode(data: bytes) -> Any:
        try:
            return parse(data)
        except Exception as exc:  # DecodeError and whatever else a parser raises on a peer's bytes
            return Undecodable(exc)

    return decode


def method_name(service: ServiceDescriptor, method: MethodDescriptor) -> str:
    return f"{service.full_name}/{method.name}"


def failure(exc: BaseException) -> str:
    """An unexpected exception as one field: its type, its first line, and where it was raised."""
    frames = traceback.extract_tb(exc.__traceback__)
    where = f" at {os.path.basename(frames[-1].filename)}:{frames[-1].lineno}" if frames else ""
    return clip_reason(f"{type(exc).__name__}: {exc}{where}")


def handlers(
    service: ServiceDescriptor,
    servicer: object,
    messages: Any,
    errors: Errors,
    *,
    raw: Iterable[str] = (),
    fields: dict[str, object] | None = None,
) -> grpc.GenericRpcHandler:
    """Every method of `service`, served by the servicer's method of that name through the boundary.

    `messages` is the generated _pb2 module holding the request and response classes; a method in
    `raw` yields its responses as serialized bytes already. `fields` go on each log line (the resource).
    """
    extra = dict(fields or {})
    served: dict[str, grpc.RpcMethodHandler] = {}
    for method in service.methods:
        if method.client_streaming:
            raise TypeError(f"{method.full_name}: client streams are not served")  # the kubelet API has none
        name = method_name(service, method)
        errors.labels(name, "INTERNAL")  # at zero from the start: an alert on a colad bug sees the series
        behavior = getattr(servicer, method.name)
        request = getattr(messages, method.input_type.name)
        response = getattr(messages, method.output_type.name)
        serialize = None if method.name in raw else response.SerializeToString
        if method.server_streaming:
            wrapped = _stream(name, behavior, errors, extra)
            served[method.name] = grpc.unary_stream_rpc_method_handler(
                wrapped, request_deserializer=decoder(request), response_serializer=serialize
            )
        else:
            wrapped = _unary(name, behavior, bytes if serialize is None else response, errors, extra)
            served[method.name] = grpc.unary_unary_rpc_method_handler(
                wrapped, request_deserializer=decoder(request), response_serializer=serialize
            )
        setattr(wrapped, WRAPPED, name)
    return grpc.method_handlers_generic_handler(service.full_name, served)


def _unary(name: str, behavior: Callable[..., Any], answer: type, errors: Errors, extra: dict[str, object]) -> Any:
    def unary(request: Any, context: grpc.ServicerContext) -> Any:
        if type(request) is Undecodable:
            _refuse(context, name, _undecodable(request), errors, extra)
        try:
            result = behavior(request, context)
            if not isinstance(result, answer):
                raise TypeError(f"answered {type(result).__name__}, not {answer.__name__}")
            return result
        except RequestError as exc:
            _refuse(context, name, exc, errors, extra)
        except Exception as exc:  # the boundary: a colad bug is INTERNAL and one line, never UNKNOWN
            _fail(context, name, exc, errors, extra)

    return unary


def _stream(name: str, behavior: Callable[..., Any], errors: Errors, extra: dict[str, object]) -> Any:
    def stream(request: Any, context: grpc.ServicerContext) -> Iterator[Any]:
        if type(request) is Undecodable:
            _refuse(context, name, _undecodable(request), errors, extra)
        try:
            yield from behavior(request, context)
        except RequestError as exc:
            _refuse(context, name, exc, errors, extra)
        except Exception as exc:  # as in _unary; GeneratorExit (a cancelled stream) is not an Exception
            _fail(context, name, exc, errors, extra)

    return stream


def _undecodable(request: Undecodable) -> RequestError:
    return RequestError(f"request: not a valid message ({clip_reason(str(request.error))})")


def _refuse(
    context: grpc.ServicerContext, name: str, exc: RequestError, errors: Errors, extra: dict[str, object]
) -> None:
    errors.labels(name, exc.status).inc()
    reason = clip_reason(str(exc))
    if not exc.logged:
        LOG.warning("request refused", method=name, code=exc.status, reason=reason, **extra)
    context.abort(grpc.StatusCode.__members__.get(exc.status, grpc.StatusCode.INVALID_ARGUMENT), reason)


def _fail(context: grpc.ServicerContext, name: str, exc: Exception, errors: Errors, extra: dict[str, object]) -> None:
    errors.labels(name, "INTERNAL").inc()
    LOG.error("request failed: a colad bug", method=name, code="INTERNAL", error=failure(exc), **extra)
    context.abort(grpc.StatusCode.INTERNAL, f"internal error in colad ({type(exc).__name__}); see its log")


class Client:
    """The calls of one service colad makes, each an answer or a CallError (counted; the caller logs)."""

    def __init__(self, channel: grpc.Channel, service: ServiceDescriptor, messages: Any, errors: Errors) -> None:
        self.errors = errors
        self.names = {m.name: method_name(service, m) for m in service.methods}
        self._calls = {
            m.name: channel.unary_unary(
                f"/{service.full_name}/{m.name}",
                request_serializer=getattr(messages, m.input_type.name).SerializeToString,
                response_deserializer=decoder(getattr(messages, m.output_type.name)),
            )
            for m in service.methods
            if not m.client_streaming and not m.server_streaming
        }

    def call(self, method: str, request: Any, timeout: float) -> Any:
        name = self.names[method]
        try:
            answer = self._calls[method](request, timeout=timeout)
        except grpc.RpcError as exc:
            code = exc.code().name if isinstance(exc, grpc.Call) else "UNKNOWN"
            details = exc.details() if isinstance(exc, grpc.Call) else str(exc)
            self.errors.labels(name, code).inc()
            raise CallError(code, clip_reason(details or "")) from None
        except Exception as exc:  # the boundary: whatever grpc raised, it is a failed call
            self.errors.labels(name, "INTERNAL").inc()
            raise CallError("INTERNAL", failure(exc)) from None
        if type(answer) is Undecodable:
            self.errors.labels(name, "INTERNAL").inc()
            raise CallError("INTERNAL", f"answer not decodable: {clip_reason(str(answer.error))}")
        return answer
