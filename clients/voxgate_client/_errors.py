"""Typed errors of the client: a server status becomes :class:`VoxgateError`."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import grpc
from google.rpc import error_details_pb2, status_pb2

__all__ = ["CallEndedError", "VoxgateError", "status_code_from_number"]

_CODE_BY_NUMBER: dict[int, Any] = {code.value[0]: code for code in grpc.StatusCode}

#: The standard rich-error trailer (google.rpc.Status, serialized).
STATUS_DETAILS_KEY = "grpc-status-details-bin"


def status_code_from_number(number: int) -> grpc.StatusCode:
    """The ``grpc.StatusCode`` for a google.rpc.Code number (UNKNOWN for numbers grpc lacks)."""
    return _CODE_BY_NUMBER.get(number, grpc.StatusCode.UNKNOWN)


class VoxgateError(Exception):
    """The server (or the transport) ended an RPC with a non-OK status.

    Attributes:
        code: the ``grpc.StatusCode``.
        message: the server's sentence; it names the field and the limit.
        quota: for RESOURCE_EXHAUSTED, the exhausted quota's name from the ``QuotaFailure``
            detail (e.g. ``"max_realtime_factor"``), so a client can back off on the right
            knob without parsing the message; None when the server sent no such detail.
    """

    def __init__(self, code: grpc.StatusCode, message: str, quota: str | None = None) -> None:
        super().__init__(f"{code.name}: {message}" + (f" (quota {quota})" if quota else ""))
        self.code = code
        self.message = message
        self.quota = quota

    @classmethod
    def from_rpc_error(cls, exc: grpc.aio.AioRpcError) -> VoxgateError:
        """Build from a grpc error, reading the QuotaFailure detail from its trailers."""
        return cls(exc.code(), exc.details() or "", quota_from_trailers(exc.trailing_metadata()))


def quota_from_trailers(trailers: Iterable[tuple[str, Any]] | None) -> str | None:
    """The first QuotaFailure violation's subject in ``grpc-status-details-bin``, if any.

    Parsed here with google.rpc directly rather than ``grpc_status`` so the client needs no
    package beyond what the gateway itself installs.
    """
    for key, value in trailers or ():
        if key != STATUS_DETAILS_KEY or not isinstance(value, bytes | bytearray):
            continue
        try:
            status = status_pb2.Status.FromString(bytes(value))
        except Exception:  # a malformed trailer must not hide the status itself
            return None
        for detail in status.details:
            quota = error_details_pb2.QuotaFailure()
            if detail.Unpack(quota) and quota.violations:
                return str(quota.violations[0].subject)
    return None


class CallEndedError(Exception):
    """A send on a call that already ended cleanly (hangup, half-close or ``aclose``)."""
