"""Domain errors of a call. Each maps to exactly one gRPC status in the servicer's table.

Messages name the offending field and the limit, because the person reading them is debugging a
voice bot at 3 a.m. and has only the status line.
"""

from __future__ import annotations

import enum

__all__ = ["CallError", "ErrorKind"]


class ErrorKind(enum.Enum):
    """What went wrong, independent of transport (the servicer maps it to a gRPC code)."""

    INVALID_ARGUMENT = "invalid_argument"
    RESOURCE_EXHAUSTED = "resource_exhausted"
    FAILED_PRECONDITION = "failed_precondition"
    UNIMPLEMENTED = "unimplemented"
    UNAVAILABLE = "unavailable"
    INTERNAL = "internal"
    NOT_FOUND = "not_found"


class CallError(Exception):
    """Ends one call (never the server) with a precise status and message.

    Attributes:
        kind: the status class.
        message: a sentence naming the field and the limit.
        quota: for RESOURCE_EXHAUSTED, the name of the exhausted quota (QuotaFailure detail).
    """

    def __init__(self, kind: ErrorKind, message: str, *, quota: str = "") -> None:
        super().__init__(message)
        self.kind = kind
        self.message = message
        self.quota = quota

    @classmethod
    def invalid(cls, message: str) -> CallError:
        """INVALID_ARGUMENT shorthand."""
        return cls(ErrorKind.INVALID_ARGUMENT, message)

    @classmethod
    def exhausted(cls, message: str, quota: str) -> CallError:
        """RESOURCE_EXHAUSTED shorthand, with the quota's name for the QuotaFailure detail."""
        return cls(ErrorKind.RESOURCE_EXHAUSTED, message, quota=quota)
