"""One SIP call's state, shared by the bridge's parts, and the small helpers they all use.

:class:`SipCall` is what the transactions, dialogs, timers and call-leg modules read and
write for a call (its dialog identifiers, route set, media, gateway stream and lifetime);
each of those modules owns the behaviour, none of them the state. :class:`ReferOutcome` is
public (re-exported by :mod:`voxgate.bridges.sip`).
"""

from __future__ import annotations

import asyncio
import secrets
from collections.abc import Awaitable
from dataclasses import dataclass, field
from typing import Any, Literal, TypeVar

from voxgate.bridges.sip._media import RtpSession
from voxgate.bridges.sip._message import SipMessage, add_tag
from voxgate.bridges.sip._sdp import MediaChoice
from voxgate.bridges.sip._session_timer import SessionTimer
from voxgate.v1 import voxgate_pb2 as pb
from voxgate_client import BotLink
from voxgate_client import Call as GatewayCall
from voxgate_client._common.aio import cancel_and_wait

__all__ = [
    "ALLOW",
    "SUPPORTED",
    "USER_AGENT",
    "CallState",
    "Ended",
    "Refer",
    "ReferOutcome",
    "SipCall",
    "allows",
    "short",
    "until_ended",
]

T = TypeVar("T")

#: The methods we answer (Allow of OPTIONS, 405s and our 2xx to INVITE).
ALLOW = "INVITE, ACK, CANCEL, BYE, OPTIONS, INFO, UPDATE, NOTIFY"
#: Option tags we support (RFC 4028 session timers).
SUPPORTED = "timer"
USER_AGENT = "voxgate-sip/0.1"

CallState = Literal["setup", "ringing", "answered", "confirmed", "ended"]


@dataclass(frozen=True, slots=True)
class ReferOutcome:
    """How a blind transfer (REFER, RFC 3515) ended.

    Attributes:
        ok: the transfer target answered (the NOTIFY's sipfrag said 2xx); the bridge then ends
            the call with BYE.
        status: the SIP status that decided it: the sipfrag's (200, 486, ...), the REFER's
            own final response when the caller refused it (e.g. 405, 603), 408 when nothing
            came back in time, 481 when the call was not up, 400 for a bad target URI.
        reason: a short reason phrase (bounded, printable).
    """

    ok: bool
    status: int
    reason: str


@dataclass(eq=False, slots=True)
class Refer:
    """The one REFER of a call in progress: its implicit subscription's final NOTIFY."""

    done: asyncio.Future[ReferOutcome]
    cseq: int


class Ended(Exception):
    """The call ended (CANCEL, BYE, shutdown) or timed out while a setup step was waiting."""


@dataclass(eq=False, slots=True)
class SipCall:
    """One call: its dialog (RFC 3261 12), media, gateway stream and lifetime."""

    call_id: str
    invite: SipMessage
    invite_key: str
    source: tuple[str, int]
    reply_to: tuple[str, int]
    local_tag: str
    remote_tag: str | None
    choice: MediaChoice
    remote_target: str = ""  # the validated Contact URI: request-URI of our in-dialog requests
    # RFC 3261 12.1.1: the INVITE's Record-Route, in order; our requests carry it as Route.
    route_set: list[str] = field(default_factory=list)
    refer: Refer | None = None
    session_timer: SessionTimer | None = None
    peer_allows_update: bool = False
    sdp_origin: str = ""  # the caller's last offer's o= (unchanged: the media did not change)
    rtp_since: float = 0.0  # loop time the RTP inactivity clock counts from (ACK, new media)
    timers: dict[str, asyncio.TimerHandle] = field(default_factory=dict)
    local_ip: str = ""
    # Our SIP port (the bridge's bound address when the INVITE came): Contact and Via.
    local_port: int = 0
    state: CallState = "setup"
    media: RtpSession | None = None
    gw: GatewayCall | None = None  # the gateway Converse call (voxgate_client)
    link: BotLink | None = None  # its only reader: relays to the bot, tees to the call leg
    out_q: asyncio.Queue[pb.ConverseRequest | None] = field(
        default_factory=lambda: asyncio.Queue(maxsize=500)
    )
    ended: asyncio.Event = field(default_factory=asyncio.Event)
    confirmed: asyncio.Event = field(default_factory=asyncio.Event)  # set by the ACK
    end_reason: str = ""
    send_bye: bool = False
    local_cseq: int = field(default_factory=lambda: secrets.randbelow(10_000) + 1)
    session_id: int = field(default_factory=lambda: secrets.randbelow(2**31))
    sdp_version: int = 1
    dropped_audio: int = 0
    # The reply cut short by the call's end is logged once (each queued speak reports its own
    # PlaybackInterrupted as the gateway call closes).
    logged_unplayed: bool = False
    tasks: list[asyncio.Task[None]] = field(default_factory=list)

    def end(self, reason: str, *, bye: bool) -> None:
        """Ask the call's supervisor to tear down (first reason wins)."""
        if not self.ended.is_set():
            self.end_reason = reason
            self.send_bye = bye
            self.ended.set()

    @property
    def to_header(self) -> str:
        """The INVITE's To with our tag: the From of our requests, the To of our responses."""
        return add_tag(self.invite.get("To") or "", self.local_tag)

    @property
    def contact(self) -> str:
        """Our Contact header value for this call (the address the caller reaches us at)."""
        return f"<sip:voxgate@{self.local_ip}:{self.local_port}>"


async def until_ended(call: SipCall, aw: Awaitable[T], timeout_s: float | None) -> T:
    """Await ``aw`` unless the call ends (or the timeout passes) first.

    Raises:
        Ended: the call ended or the timeout passed; ``aw`` is cancelled and awaited.
    """
    task: asyncio.Future[T] = asyncio.ensure_future(aw)
    ender = asyncio.ensure_future(call.ended.wait())
    try:
        waiters: set[asyncio.Future[Any]] = {task, ender}
        done, _ = await asyncio.wait(
            waiters, timeout=timeout_s, return_when=asyncio.FIRST_COMPLETED
        )
    finally:
        ender.cancel()
    if task in done:
        return task.result()
    await cancel_and_wait(task)
    raise Ended(call.end_reason or "timed out")


def allows(req: SipMessage, method: str) -> bool:
    """The request's Allow header lists ``method``."""
    return method in (m.strip().upper() for m in (req.get("Allow") or "").split(","))


def short(text: str, limit: int = 80) -> str:
    """A caller-supplied string for a log line: repr'd (no control characters) and bounded."""
    return repr(text[:limit]) + ("…" if len(text) > limit else "")
