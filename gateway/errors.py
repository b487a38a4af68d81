"""Domain errors of a call. Each maps to exactly one gRPC status in the servicer's table.

Messages name the offending field and the limit, because the person reading them is debugging a
voice bot at 3 a.m. and has only the status line.
"""

from __future__ import annotations

import enum

__all__ = ["ECHO_MAX_CHARS", "CallError", "ErrorKind", "echo"]

#: Client-supplied values quoted in messages and logs are cut to this many characters.
ECHO_MAX_CHARS = 64


class ErrorKind(enum.Enum):
    """What went wrong, independent of transport (the servicer maps it to a gRPC code)."""

    INVALID_ARGUMENT = "invalid_argument"
    RESOURCE_EXHAUSTED = "resource_exhausted"
    FAILED_PRECONDITION = "failed_precondition"
    UNIMPLEMENTED = "unimplemented"
    UNAVAILABLE = "unavailable"
    INTERNAL = "internal"
    NOT_FOUND = "not_found"
    DEADLINE_EXCEEDED = "deadline_exceeded"


class CallError(Exception):
    """Ends one call (never the server) with a precise status and message.

    Attributes:
        kind: the status class.
        message: a sentence naming the field and the limit.
        quota: for RESOURCE_EXHAUSTED, the name of the exhausted quota (QuotaFailure detail).
        retry_after_ms: when to try again (0 = no hint); sent as ``grpc-retry-pushback-ms``
            trailing metadata, which gRPC's client retry policy honours, and a ``RetryInfo``.
    """

    def __init__(
        self, kind: ErrorKind, message: str, *, quota: str = "", retry_after_ms: int = 0
    ) -> None:
        super().__init__(message)
        self.kind = kind
        self.message = message
        self.quota = quota
        self.retry_after_ms = retry_after_ms

    @classmethod
    def invalid(cls, message: str) -> CallError:
        """INVALID_ARGUMENT shorthand."""
        return cls(ErrorKind.INVALID_ARGUMENT, message)

    @classmethod
    def exhausted(cls, message: str, quota: str) -> CallError:
        """RESOURCE_EXHAUSTED shorthand, with the quota's name for the QuotaFailure detail."""
        return cls(ErrorKind.RESOURCE_EXHAUSTED, message, quota=quota)


def echo(value: object, limit: int = ECHO_MAX_CHARS) -> str:
    """Quote a client-supplied value in a message or log line, cut to ``limit`` characters.

    Error statuses travel in trailers, which gRPC caps (a 300,000-character DTMF digit echoed
    whole made the client see "metadata size exceeds hard limit" instead of the real error),
    and log lines must stay lines. ``repr`` keeps control characters visible.
    """
    text = str(value)
    if len(text) <= limit:
        return repr(text)
    return repr(text[:limit]) + f"… ({len(text)} characters)"
