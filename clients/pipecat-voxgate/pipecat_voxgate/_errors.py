"""voxgate's gRPC statuses as Pipecat's error categories, which decide what Pipecat does next.

Pipecat marks a processor unusable when an error's category is permanent (the request is
malformed, the credentials are refused: retrying cannot help) and its pipeline worker then
applies its ``ProcessorUnusablePolicy``; any other category leaves the service running, and
the STT service reconnects. gRPC already says whose fault a failure is; the table keeps that.
"""

from __future__ import annotations

import grpc
from pipecat.utils.errors import ErrorCategory

from voxgate_client import VoxgateError

__all__ = ["error_category"]

_CATEGORY = {
    grpc.StatusCode.INVALID_ARGUMENT: ErrorCategory.INVALID_REQUEST,
    grpc.StatusCode.FAILED_PRECONDITION: ErrorCategory.INVALID_REQUEST,
    grpc.StatusCode.OUT_OF_RANGE: ErrorCategory.INVALID_REQUEST,
    grpc.StatusCode.NOT_FOUND: ErrorCategory.INVALID_REQUEST,
    # A method or feature the server lacks (Synthesize without a voice) will not appear later.
    grpc.StatusCode.UNIMPLEMENTED: ErrorCategory.INVALID_REQUEST,
    grpc.StatusCode.UNAUTHENTICATED: ErrorCategory.AUTHENTICATION,
    grpc.StatusCode.PERMISSION_DENIED: ErrorCategory.AUTHORIZATION,
    grpc.StatusCode.RESOURCE_EXHAUSTED: ErrorCategory.RATE_LIMIT,
    grpc.StatusCode.UNAVAILABLE: ErrorCategory.CONNECTIVITY,
    grpc.StatusCode.DEADLINE_EXCEEDED: ErrorCategory.CONNECTIVITY,
    grpc.StatusCode.CANCELLED: ErrorCategory.CONNECTIVITY,
    grpc.StatusCode.INTERNAL: ErrorCategory.SERVER,
    grpc.StatusCode.UNKNOWN: ErrorCategory.SERVER,
    grpc.StatusCode.DATA_LOSS: ErrorCategory.SERVER,
    grpc.StatusCode.ABORTED: ErrorCategory.SERVER,
}


def error_category(exception: BaseException) -> ErrorCategory | None:
    """The category of a failed voxgate RPC; None for other exceptions (Pipecat's default)."""
    if isinstance(exception, VoxgateError):
        return _CATEGORY.get(exception.code, ErrorCategory.UNKNOWN)
    return None
