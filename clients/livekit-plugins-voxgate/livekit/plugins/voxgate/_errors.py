"""voxgate's gRPC statuses as LiveKit's API error types, which decide LiveKit's retries.

LiveKit retries an ``APIError`` whose ``retryable`` is true (``APIConnectOptions.max_retry``
times) and gives up at once otherwise. gRPC says whose fault a failure is; the mapping keeps
that: the caller's mistakes (INVALID_ARGUMENT, UNAUTHENTICATED, ...) are never retried, a
server at capacity (RESOURCE_EXHAUSTED) and transport failures (UNAVAILABLE) are.
"""

from __future__ import annotations

import grpc
from livekit.agents import APIConnectionError, APIError, APIStatusError, APITimeoutError

from voxgate_client import VoxgateError

__all__ = ["api_error"]

#: gRPC code -> the HTTP status LiveKit's APIStatusError speaks (it derives `retryable` from
#: it: 4xx are final except 408, 429 and 499).
_HTTP = {
    grpc.StatusCode.CANCELLED: 499,
    grpc.StatusCode.INVALID_ARGUMENT: 400,
    grpc.StatusCode.FAILED_PRECONDITION: 400,
    grpc.StatusCode.OUT_OF_RANGE: 400,
    grpc.StatusCode.NOT_FOUND: 404,
    grpc.StatusCode.ALREADY_EXISTS: 409,
    grpc.StatusCode.PERMISSION_DENIED: 403,
    grpc.StatusCode.UNAUTHENTICATED: 401,
    grpc.StatusCode.RESOURCE_EXHAUSTED: 429,
    grpc.StatusCode.ABORTED: 409,
    grpc.StatusCode.UNIMPLEMENTED: 501,
    grpc.StatusCode.INTERNAL: 500,
    grpc.StatusCode.DATA_LOSS: 500,
    grpc.StatusCode.UNKNOWN: 500,
}


def api_error(exc: VoxgateError, rpc: str) -> APIError:
    """The LiveKit error for a failed voxgate RPC (raise it ``from exc``).

    LiveKit's connection errors name their cause themselves: ``str()`` of an
    ``APIConnectionError`` (and ``APITimeoutError``) appends "(caused by <the exception it
    was raised from>)", so their message only says which RPC failed and the status is said
    once, by the cause ("voxgate: StreamingRecognize failed (caused by VoxgateError:
    UNAVAILABLE: ...)"). ``APIStatusError`` names no cause, so its message carries the status
    and its body only the exhausted quota, if any (``str()`` shows both).
    """
    if exc.code in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED):
        message = f"voxgate: {rpc} failed"
        if exc.code == grpc.StatusCode.UNAVAILABLE:
            return APIConnectionError(message)
        return APITimeoutError(message)
    status = _HTTP.get(exc.code, 500)
    # A method or feature the server lacks (e.g. Synthesize on a server without a voice)
    # will not appear on a retry; every other 5xx might.
    retryable = False if exc.code == grpc.StatusCode.UNIMPLEMENTED else None
    return APIStatusError(
        f"voxgate: {rpc}: {exc.code.name}: {exc.message}",
        status_code=status,
        # str() shows the body after the message: only what the message lacks goes there.
        body={"quota": exc.quota} if exc.quota else None,
        retryable=retryable,
    )
