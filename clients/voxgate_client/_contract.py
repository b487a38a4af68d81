"""The bot contract's types: what a bot sees of a call, whichever way the call arrived.

Kept apart from :mod:`._bot` (which serves bots and links bridges to them) because the direct
:class:`~voxgate_client.Call` satisfies :class:`VoiceCall` too and imports these.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Protocol

import grpc

from ._config import BargeInName
from ._errors import VoxgateError, status_code_from_number
from ._events import ServerEvent, SessionStarted
from ._proto import voxgate_pb2 as pb

__all__ = [
    "MAX_HEADERS",
    "MAX_HEADER_CHARS",
    "BotHandler",
    "CallInfo",
    "TransferError",
    "TransferResult",
    "VoiceCall",
    "not_supported",
]

#: Longest header name or value the bot gets in CallInfo, and how many headers at most.
MAX_HEADER_CHARS = 256
MAX_HEADERS = 32


# -- what a bot sees ------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class CallInfo:
    """Who is calling whom, over what (``BotEvent.call``, the first message of a bot call).

    Attributes:
        call_id: the call's id at its origin: SIP Call-ID, the provider's call sid, or the
            Converse ``call_id``.
        from_uri: the caller (SIP From URI, or the provider's caller number).
        to_uri: the called party.
        channel: ``"sip"``, ``"media_stream"`` or ``"converse"``.
        headers: selected headers of the origin (SIP headers, a media stream's custom
            parameters); bounded by the bridge, never authentication material.
        transfer_supported: whether :meth:`VoiceCall.transfer` can succeed on this call.
    """

    call_id: str = ""
    from_uri: str = ""
    to_uri: str = ""
    channel: str = "converse"
    headers: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))
    transfer_supported: bool = False

    def to_proto(self) -> pb.CallInfo:
        """The wire message, with headers bounded (a bridge copies them from callers)."""
        headers = {
            k[:MAX_HEADER_CHARS]: v[:MAX_HEADER_CHARS]
            for k, v in list(self.headers.items())[:MAX_HEADERS]
        }
        return pb.CallInfo(
            call_id=self.call_id,
            from_uri=self.from_uri,
            to_uri=self.to_uri,
            channel=self.channel,
            headers=headers,
            transfer_supported=self.transfer_supported,
        )

    @classmethod
    def from_proto(cls, msg: pb.CallInfo) -> CallInfo:
        """From the wire message."""
        return cls(
            msg.call_id,
            msg.from_uri,
            msg.to_uri,
            msg.channel,
            MappingProxyType(dict(msg.headers)),
            msg.transfer_supported,
        )


@dataclass(frozen=True, slots=True)
class TransferResult:
    """The outcome of a transfer (SIP REFER).

    Attributes:
        code: OK when the peer accepted it (the call then leaves the bot); UNIMPLEMENTED when
            the channel cannot transfer; INVALID_ARGUMENT for a bad target; FAILED_PRECONDITION,
            UNAVAILABLE or DEADLINE_EXCEEDED when the peer refused or did not answer.
        sip_status: the SIP status that decided it (REFER's final response or NOTIFY's
            sipfrag), 0 when there was none.
    """

    transfer_id: str
    code: grpc.StatusCode
    message: str = ""
    sip_status: int = 0

    @property
    def ok(self) -> bool:
        """Whether the call was handed over."""
        return bool(self.code == grpc.StatusCode.OK)

    def to_proto(self) -> pb.TransferResult:
        """The wire message."""
        return pb.TransferResult(
            transfer_id=self.transfer_id,
            code=self.code.value[0],
            message=self.message,
            sip_status=self.sip_status,
        )

    @classmethod
    def from_proto(cls, msg: pb.TransferResult) -> TransferResult:
        """From the wire message."""
        return cls(msg.transfer_id, status_code_from_number(msg.code), msg.message, msg.sip_status)


class TransferError(VoxgateError):
    """A transfer that did not happen; ``result`` says why (``code`` is its code)."""

    def __init__(self, result: TransferResult) -> None:
        super().__init__(result.code, result.message)
        self.result = result


def not_supported(channel: str, transfer_id: str = "") -> TransferResult:
    return TransferResult(
        transfer_id,
        grpc.StatusCode.UNIMPLEMENTED,
        f"transfer is not supported on a {channel or 'converse'} call",
    )


class VoiceCall(Protocol):
    """What a bot handler gets: :class:`Call` (direct) and :class:`ServedCall` both are one.

    Iteration yields :class:`SessionStarted` first, then the call's events until it ends.
    """

    session: SessionStarted | None

    @property
    def info(self) -> CallInfo:
        """Who is calling whom, over what."""
        ...

    def __aiter__(self) -> AsyncIterator[ServerEvent]:
        """The call's events."""
        ...

    async def __anext__(self) -> ServerEvent:
        """The next event."""
        ...

    async def speak(
        self,
        text: str,
        speak_id: str | None = None,
        voice: str | None = None,
        rate: float | None = None,
        *,
        speaker_id: int = 0,
        uninterruptible: bool = False,
        barge_in: BargeInName | None = None,
        barge_in_min_words: int = 0,
    ) -> str:
        """Queue a reply; its speak_id."""
        ...

    async def clear(self) -> None:
        """Drop queued and playing replies."""
        ...

    async def mark(self, name: str) -> None:
        """Ask for MarkReached once everything queued before it has played."""
        ...

    async def flush(self) -> None:
        """Finish the caller's current utterance now."""
        ...

    async def hangup(self) -> None:
        """End the call."""
        ...

    async def transfer(self, target_uri: str) -> TransferResult:
        """Hand the call to ``target_uri``; raises :class:`TransferError` when it fails."""
        ...


#: A bot: one coroutine per call.
BotHandler = Callable[[VoiceCall], Awaitable[None]]
