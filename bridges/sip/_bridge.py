"""The SIP bridge: a UDP SIP UAS (RFC 3261 subset) with one gateway ``Converse`` stream per call.

Per call: RTP audio in → jitter buffer → ``audio`` requests; gateway ``audio`` → 20 ms RTP;
``transcript``/``dtmf`` events → the bot → ``speak``; ``interrupted`` → queued RTP dropped.
Either side hanging up ends the other: BYE → ``hangup``; stream end or error → BYE.

Transactions (RFC 3261 17.2) are matched by the top Via branch and method; a retransmitted
request is answered from the cached response. INVITE final responses are retransmitted
(T1 doubling to T2) until the ACK; a 2xx never ACKed within 64*T1 ends the call with BYE.

Lifetime and media security (each ends the call with BYE, closes the gateway stream and
releases the RTP port):

* no RTP is sent before the ACK that carries our To-tag (only who received the 200 knows it,
  so a spoofed INVITE whose SDP names a victim cannot make us stream there);
* RTP inactivity: nothing accepted from the caller for ``rtp_timeout_s`` (counted from the
  ACK; suspended while the media is inactive) ends the call;
* RFC 4028 session timers when the INVITE asks for them (or supports them): the caller
  refreshes and we end the call when it stops, or we refresh (UPDATE when allowed, else
  re-INVITE) and end it when a refresh fails;
* ``max_call_s`` after the answer;
* the RTP source and SSRC latch once (see :class:`~voxgate.bridges.sip._rtp.RtpLatch`); only a
  re-INVITE/UPDATE with new media re-opens it;
* Contact and request-URIs are validated before anything is copied from them (the BYE's
  request-URI is the caller's validated Contact).
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import logging
import secrets
import socket
from collections import Counter, deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, TypeVar

import grpc
from pydantic import BaseModel, ConfigDict, Field, SecretStr, model_validator

from voxgate.bridges.sip._media import SILENCE, RtpSession, bind_rtp_socket
from voxgate.bridges.sip._message import (
    DTMF_INFO_TYPES,
    DtmfInfoError,
    SipMessage,
    SipParseError,
    UriError,
    add_tag,
    contact_uri,
    header_tag,
    header_uri,
    make_response,
    new_branch,
    new_tag,
    next_hop,
    option_tags,
    parse_dtmf_info,
    parse_sip_uri,
    parse_sipfrag,
    record_route,
    reply_address,
)
from voxgate.bridges.sip._rtp import DtmfEvent
from voxgate.bridges.sip._sdp import MediaChoice, SdpError, build_answer, negotiate, parse_sdp
from voxgate.bridges.sip._session_timer import (
    SessionIntervalTooSmall,
    SessionTimer,
    SessionTimerError,
    negotiate_session_timer,
)
from voxgate.v1 import voxgate_pb2 as pb
from voxgate_client import (
    AudioOut,
    BotHandler,
    BotLink,
    BotPolicy,
    CallConfig,
    CallEndedError,
    CallInfo,
    EchoHandlingName,
    EncodingName,
    ErrorEvent,
    PlaybackInterrupted,
    ServerEvent,
    Transcript,
    TransferResult,
    TurnDetectionName,
    TurnOptions,
    VoxgateClient,
    VoxgateError,
    tls_credentials,
)
from voxgate_client import Call as GatewayCall

__all__ = ["BridgeConfig", "ReferOutcome", "SipBridge"]

log = logging.getLogger("voxgate.sip")

T = TypeVar("T")
_ALLOW = "INVITE, ACK, CANCEL, BYE, OPTIONS, INFO, UPDATE, NOTIFY"
_SUPPORTED = "timer"
#: While the media is on hold, a silent frame goes to the gateway this often (its idle timeout).
_HOLD_KEEPALIVE_S = 10.0
#: Longest Call-ID accepted on an INVITE (it is logged and copied into every request of the call).
_MAX_CALL_ID = 256
_USER_AGENT = "voxgate-sip/0.1"
_ENCODINGS = {"PCMU": pb.MULAW, "PCMA": pb.ALAW}

CallState = Literal["setup", "ringing", "answered", "confirmed", "ended"]


class BridgeConfig(BaseModel):
    """Static settings of one bridge process."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    listen_host: str = Field(
        default="0.0.0.0", description="Address for SIP (UDP) and RTP sockets."
    )
    listen_port: int = Field(default=5060, ge=0, le=65535, description="SIP UDP port; 0 picks one.")
    gateway: str = Field(default="127.0.0.1:50051", description="Gateway gRPC target host:port.")
    gateway_tls: bool = Field(
        default=False, description="TLS to the gateway (system roots unless gateway_tls_ca)."
    )
    gateway_tls_ca: Path | None = Field(
        default=None, description="PEM CA the gateway's certificate chains to (implies TLS)."
    )
    gateway_tls_cert: Path | None = Field(
        default=None, description="PEM client certificate, for a gateway with mutual TLS."
    )
    gateway_tls_key: Path | None = Field(default=None, description="Its private key.")
    gateway_token: SecretStr | None = Field(
        default=None, description="Bearer token sent on every gateway RPC (never logged)."
    )
    advertise_host: str | None = Field(
        default=None,
        description="Address written in Contact and SDP; default: the listen address, "
        "or the local address that routes to the caller when listening on 0.0.0.0.",
    )
    rtp_port_min: int = Field(default=10000, ge=1024, le=65535, description="Lowest RTP port.")
    rtp_port_max: int = Field(default=20000, ge=1024, le=65535, description="Highest RTP port.")
    max_calls: int = Field(
        default=100, ge=1, description="Concurrent calls; more get 486 Busy Here."
    )
    ring_ms: int = Field(
        default=0, ge=0, le=60_000, description="Send 180 Ringing and wait this long."
    )
    jitter_ms: int = Field(default=60, ge=20, le=200, description="Receive jitter buffer delay.")
    symmetric_rtp: bool = Field(
        default=True, description="Send RTP to where the caller's RTP comes from."
    )
    language: str = Field(
        default="", description="Caller language hint for the gateway ('' = detect)."
    )
    voice: str = Field(default="", description="Gateway voice ('' = the gateway's default).")
    echo_handling: EchoHandlingName | Literal[""] = Field(
        default="",
        description="How the gateway keeps this trunk's echo of the bot from barging in: "
        "'gate' (one delay and gain: four-wire and digital lines), 'gate_aec3' (the gate, "
        "with WebRTC's echo canceller filling its echo blocks: a soft caller over a loud flat "
        "echo is heard sooner), 'aec3' (WebRTC's echo canceller alone: trunks that echo "
        "through an analogue hybrid); '' = the gateway's default.",
    )
    turns: TurnDetectionName | Literal[""] = Field(
        default="",
        description="End-of-turn detection on each call: 'off', 'silence' (every utterance is "
        "a turn) or 'smart' (silence, the words so far and the gateway's audio model, if it has "
        "one); with it on, the bot answers each EndOfTurn rather than each final; '' = the "
        "gateway's default (session.turns.mode).",
    )
    turn_eagerness: float = Field(
        default=0.0,
        ge=0.0,
        le=1.0,
        description="'smart' turns: how readily a turn ends, higher sooner (0 = the gateway's).",
    )
    t1_ms: int = Field(default=500, ge=10, le=10_000, description="RFC 3261 T1 (RTT estimate).")
    t2_ms: int = Field(default=4000, ge=10, le=60_000, description="RFC 3261 T2 (retransmit cap).")
    gateway_timeout_s: float = Field(
        default=5.0, gt=0, description="Wait for the gateway's `started`."
    )
    retry_after_s: int = Field(default=5, ge=0, description="Retry-After on 486/503.")
    grace_s: float = Field(
        default=3.0, ge=0, description="Shutdown: wait this long for BYE answers."
    )
    log_content: bool = Field(
        default=False,
        description="Log what callers say, what the bot replies and the keys pressed (a "
        "debugging aid: transcripts and digits are personal data, so they are never logged "
        "otherwise).",
    )
    rtp_timeout_s: float = Field(
        default=30.0,
        gt=0,
        le=3600,
        description="End a call (BYE) when no RTP has come from the caller for this long, "
        "counted from the ACK (suspended while the media is on hold, a=inactive).",
    )
    max_call_s: float = Field(
        default=3600.0,
        gt=0,
        le=172_800,
        description="End any call (BYE) this long after it was answered.",
    )
    session_expires_s: int = Field(
        default=1800,
        ge=0,
        le=86_400,
        description="RFC 4028 session interval: the most we accept, and what we ask of a "
        "caller that supports timers but asked none (0: only honour the caller's).",
    )
    min_se_s: int = Field(
        default=90,
        ge=1,
        le=86_400,
        description="Shortest session interval accepted; shorter gets 422 (RFC 4028 says "
        "at least 90 on a network; lower values are for tests).",
    )
    latch_probation: int = Field(
        default=4,
        ge=1,
        le=50,
        description="RTP packets in a row (one SSRC, consecutive sequence numbers) that a "
        "source other than the SDP or signalling address needs before the call latches to it.",
    )

    @model_validator(mode="after")
    def _ports(self) -> BridgeConfig:
        if self.rtp_port_min > self.rtp_port_max:
            raise ValueError(
                f"rtp_port_min={self.rtp_port_min} > rtp_port_max={self.rtp_port_max}; swap them"
            )
        if 0 < self.session_expires_s < self.min_se_s:
            raise ValueError(
                f"session_expires_s={self.session_expires_s} < min_se_s={self.min_se_s}"
            )
        if self.turn_eagerness and self.turns in ("off", "silence"):
            raise ValueError(
                f"turn_eagerness={self.turn_eagerness:g} applies to turns='smart', not "
                f"turns={self.turns!r}"
            )
        return self


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
class _Refer:
    """The one REFER of a call in progress: its implicit subscription's final NOTIFY."""

    done: asyncio.Future[ReferOutcome]
    cseq: int


class _Ended(Exception):
    """The call ended (CANCEL, BYE, shutdown) or timed out while a setup step was waiting."""


class _Retransmit:
    """Resend a message at T1, 2*T1, ... capped at T2 until stopped or ``deadline_s`` passes."""

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        send: Callable[[], None],
        *,
        t1_s: float,
        t2_s: float,
        deadline_s: float,
        on_timeout: Callable[[], None] | None = None,
        on_resend: Callable[[], None] | None = None,
    ) -> None:
        self._loop = loop
        self._send = send
        self._interval = t1_s
        self._t2 = t2_s
        self._deadline = loop.time() + deadline_s
        self._on_timeout = on_timeout
        self._on_resend = on_resend
        self._handle: asyncio.TimerHandle | None = loop.call_later(t1_s, self._fire)

    def _fire(self) -> None:
        # A millisecond of slack: the last timer is set to the deadline itself, and float
        # rounding must not turn it into a burst of resends just before it.
        if self._loop.time() >= self._deadline - 0.001:
            self._handle = None
            if self._on_timeout is not None:
                self._on_timeout()
            return
        self._send()
        if self._on_resend is not None:
            self._on_resend()
        self._interval = min(2 * self._interval, self._t2)
        delay = min(self._interval, max(0.0, self._deadline - self._loop.time()))
        self._handle = self._loop.call_later(delay, self._fire)

    def cancel(self) -> None:
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None


@dataclass(slots=True)
class _ServerTx:
    """A server transaction: the last response sent, for answering retransmissions."""

    last: bytes | None
    dest: tuple[str, int]
    call: _Call | None = None


@dataclass(eq=False, slots=True)
class _Call:
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
    refer: _Refer | None = None
    session_timer: SessionTimer | None = None
    peer_allows_update: bool = False
    sdp_origin: str = ""  # the caller's last offer's o= (unchanged: the media did not change)
    rtp_since: float = 0.0  # loop time the RTP inactivity clock counts from (ACK, new media)
    timers: dict[str, asyncio.TimerHandle] = field(default_factory=dict)
    local_ip: str = ""
    state: CallState = "setup"
    media: RtpSession | None = None
    gw: GatewayCall | None = None  # the gateway Converse call (voxgate_client)
    link: BotLink | None = None  # its only reader: relays to the bot, tees to _on_gateway
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
        return add_tag(self.invite.get("To") or "", self.local_tag)


class _SipProtocol(asyncio.DatagramProtocol):
    def __init__(self, bridge: SipBridge) -> None:
        self._bridge = bridge

    def datagram_received(self, data: bytes, addr: tuple[str | int, ...]) -> None:
        self._bridge.datagram_received(data, (str(addr[0]), int(addr[1])))

    def error_received(self, exc: Exception) -> None:
        log.debug("SIP socket error: %s", exc)


class SipBridge:
    """SIP calls in, one gateway ``Converse`` stream per call.

    Args:
        config: bridge settings.
        bot: the bot every call is handed to (``voxgate_client.BotLink``): an in-process
            handler ``async def bot(call)`` (the built-in bots of :mod:`voxgate.bridges.bots`) or
            the ``host:port`` of a bot served with ``voxgate_client.serve_bot``.
        on_event: observer called with (SIP Call-ID, typed gateway event) for every gateway
            event of every call (logging, metrics, tests); must not block.
        bot_policy: what happens to a call whose bot is down, slow, crashes or sends garbage.
    """

    def __init__(
        self,
        config: BridgeConfig,
        bot: BotHandler | str,
        *,
        on_event: Callable[[str, ServerEvent], None] | None = None,
        bot_policy: BotPolicy | None = None,
    ) -> None:
        self.config = config
        self._bot = bot
        self._bot_policy = bot_policy or BotPolicy()
        self._on_event = on_event
        self._transport: Any = None  # asyncio.DatagramTransport (or a test fake with sendto)
        self._client: VoxgateClient | None = None
        self._accepting = True
        self.calls: dict[str, _Call] = {}
        self._server_tx: dict[str, _ServerTx] = {}
        self._await_ack: dict[tuple[str, int], _Retransmit] = {}
        self._client_tx: dict[str, asyncio.Future[int]] = {}
        self._acks: dict[str, tuple[bytes, tuple[str, int]]] = {}
        self._supervisors: set[asyncio.Task[None]] = set()
        self._byes: set[asyncio.Task[None]] = set()
        self._timers: set[asyncio.TimerHandle] = set()
        self.address: tuple[str, int] = (config.listen_host, config.listen_port)
        #: Event counters (``requests``, ``malformed``, ``retransmitted``, ``bye_sent``, ...).
        self.stats: Counter[str] = Counter()
        #: (Call-ID, reason) of the most recent ended calls, oldest first.
        self.ended: deque[tuple[str, str]] = deque(maxlen=1000)

    # -- lifecycle --------------------------------------------------------------------------------

    async def start(self) -> None:
        """Bind the SIP socket and open the gateway channel."""
        loop = asyncio.get_running_loop()
        transport, _ = await loop.create_datagram_endpoint(
            lambda: _SipProtocol(self),
            local_addr=(self.config.listen_host, self.config.listen_port),
        )
        self._transport = transport
        host, port = transport.get_extra_info("sockname")[:2]
        self.address = (str(host), int(port))
        cfg = self.config
        tls: bool | grpc.ChannelCredentials = cfg.gateway_tls
        if cfg.gateway_tls_ca is not None or cfg.gateway_tls_cert is not None:
            tls = tls_credentials(cfg.gateway_tls_ca, cfg.gateway_tls_cert, cfg.gateway_tls_key)
        token = cfg.gateway_token.get_secret_value() if cfg.gateway_token else None
        self._client = VoxgateClient(cfg.gateway, tls, token)
        await self._probe_gateway()
        log.info("SIP bridge on udp %s:%d → gateway %s", *self.address, self.config.gateway)

    async def _probe_gateway(self) -> None:
        """Say at start-up, not at the first call, when the gateway refuses us or has no voice.

        Each call's session says whether it has a voice (the link then drops the bot's speech,
        logged once); this only makes a misconfiguration visible early. Never fatal: the
        gateway may come up after the bridge.
        """
        assert self._client is not None
        try:
            voices = await asyncio.wait_for(self._client.list_voices(), 2.0)
        except (VoxgateError, TimeoutError) as exc:
            why = exc.code.name if isinstance(exc, VoxgateError) else "no answer in 2 s"
            log.warning("gateway %s: ListVoices failed (%s)", self.config.gateway, why)
            return
        if not voices:
            log.warning(
                "gateway %s has no voice: bot replies are logged, not spoken", self.config.gateway
            )

    async def aclose(self) -> None:
        """Graceful shutdown: refuse new calls, end every call with BYE, wait for the answers."""
        self._accepting = False
        for call in list(self.calls.values()):
            call.end("bridge shutting down", bye=True)
        if self._supervisors:
            await asyncio.wait(set(self._supervisors), timeout=self.config.grace_s + 2)
        if self._byes:
            await asyncio.wait(set(self._byes), timeout=self.config.grace_s)
        for task in [*self._supervisors, *self._byes]:
            task.cancel()
        for task in [*self._supervisors, *self._byes]:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        for r in self._await_ack.values():
            r.cancel()
        self._await_ack.clear()
        for h in self._timers:
            h.cancel()
        self._timers.clear()
        if self._transport is not None:
            self._transport.close()
            self._transport = None
        if self._client is not None:
            await self._client.aclose()
            self._client = None

    # -- datagrams --------------------------------------------------------------------------------

    def datagram_received(self, data: bytes, source: tuple[str, int]) -> None:
        """Handle one SIP datagram; never raises (a bad packet must not take calls down)."""
        try:
            self._datagram(data, source)
        except Exception:  # any bug on one packet is logged, never fatal to the bridge
            self.stats["internal_error"] += 1
            log.exception("SIP datagram from %s:%d dropped after an internal error", *source)

    def _datagram(self, data: bytes, source: tuple[str, int]) -> None:
        if not data.strip(b"\r\n \t\0"):
            return  # RFC 5626 keep-alive (CRLF) or empty
        try:
            msg = SipMessage.parse(data)
        except SipParseError as exc:
            self.stats["malformed"] += 1
            log.info("malformed SIP datagram from %s:%d dropped: %s", *source, exc)
            if exc.message is not None:
                self._reply_bare(exc.message, source, 400, f"Bad Request ({exc})"[:100])
            return
        if msg.is_request:
            self.stats["requests"] += 1
            self._on_request(msg, source)
        else:
            self._on_response(msg)

    def _send(self, data: bytes, dest: tuple[str, int]) -> None:
        if self._transport is not None:
            self._transport.sendto(data, dest)

    def _later(self, delay_s: float, fn: Callable[[], None]) -> None:
        loop = asyncio.get_running_loop()
        handle: asyncio.TimerHandle

        def run() -> None:
            self._timers.discard(handle)
            fn()

        handle = loop.call_later(delay_s, run)
        self._timers.add(handle)

    def _reply_bare(
        self, req: SipMessage, source: tuple[str, int], status: int, reason: str
    ) -> None:
        """A stateless reply (400 to a malformed request)."""
        try:
            resp = make_response(req, status, reason, source=source, to_tag=new_tag())
            self._send(resp.encode(), reply_address(req, source))
        except SipParseError:
            pass

    # -- requests ---------------------------------------------------------------------------------

    @staticmethod
    def _tx_key(msg: SipMessage, method: str) -> str:
        top = msg.vias()[0]
        branch = top.branch or ""
        if branch.startswith("z9hG4bK"):
            return f"{branch}|{top.host}:{top.port}|{method}"
        # RFC 2543 peers: no usable branch, so match on the dialog-identifying fields.
        num, _ = msg.cseq()
        return f"{msg.call_id}|{header_tag(msg.get('From') or '')}|{num}|{top.host}|{method}"

    def _respond(
        self,
        req: SipMessage,
        source: tuple[str, int],
        status: int,
        reason: str,
        *,
        to_tag: str | None = None,
        headers: list[tuple[str, str]] | None = None,
        body: bytes = b"",
    ) -> bytes:
        """Send a response and cache it in the request's server transaction."""
        resp = make_response(
            req,
            status,
            reason,
            source=source,
            to_tag=to_tag,
            headers=[("Server", _USER_AGENT), *(headers or [])],
            body=body,
        )
        data = resp.encode()
        dest = reply_address(req, source)
        key = self._tx_key(req, req.method or "")
        tx = self._server_tx.get(key)
        if tx is None:
            tx = _ServerTx(data, dest)
            self._server_tx[key] = tx
            # Keep the transaction for 64*T1 to absorb retransmissions (Timer J / H).
            self._later(64 * self.config.t1_ms / 1000, lambda: self._forget_tx(key))
        tx.last, tx.dest = data, dest
        self._send(data, dest)
        return data

    def _forget_tx(self, key: str) -> None:
        self._server_tx.pop(key, None)

    def _on_request(self, req: SipMessage, source: tuple[str, int]) -> None:
        method = req.method or ""
        if method == "ACK":
            self._on_ack(req)
            return
        key = self._tx_key(req, method)
        tx = self._server_tx.get(key)
        if tx is not None:  # a retransmission: answer from the cache
            self.stats["retransmission_in"] += 1
            if tx.last is not None:
                self._send(tx.last, tx.dest)
            return
        if method == "CANCEL":
            self._on_cancel(req, source)
            return
        require = req.get("Require")
        unsupported = [t.strip() for t in (require or "").split(",") if t.strip()]
        unsupported = [t for t in unsupported if t.lower() != "timer"]
        if unsupported:
            # Echo only well-formed short option tags, so the reply stays bounded.
            shown = ", ".join(t for t in option_tags(require) if t != "timer")
            self._respond(
                req,
                source,
                420,
                "Bad Extension",
                to_tag=new_tag(),
                headers=[("Unsupported", shown or "unknown")],
            )
            return
        to_tag = header_tag(req.get("To") or "")
        if method == "INVITE":
            if to_tag is None:
                self._on_invite(req, source, key)
            else:
                self._on_reinvite(req, source)
        elif method == "OPTIONS":
            self._respond(
                req,
                source,
                200,
                "OK",
                to_tag=to_tag or new_tag(),
                headers=[
                    ("Allow", _ALLOW),
                    ("Accept", "application/sdp"),
                    ("Supported", _SUPPORTED),
                ],
            )
        elif method in ("BYE", "INFO", "UPDATE", "NOTIFY"):
            call = self._dialog(req)
            if call is None:
                self._respond(req, source, 481, "Call/Transaction Does Not Exist")
            elif method == "BYE":
                self._respond(req, source, 200, "OK")
                call.end("caller hung up (BYE)", bye=False)
            elif method == "UPDATE":
                self._on_update(call, req, source)
            elif method == "NOTIFY":
                self._on_notify(call, req, source)
            else:
                self._on_info(call, req, source)
        else:
            self._respond(
                req,
                source,
                405,
                "Method Not Allowed",
                to_tag=to_tag or new_tag(),
                headers=[("Allow", _ALLOW)],
            )

    def _dialog(self, req: SipMessage) -> _Call | None:
        call = self.calls.get(req.call_id)
        if call is None or call.state == "ended":
            return None
        if header_tag(req.get("To") or "") != call.local_tag:
            return None
        if header_tag(req.get("From") or "") != call.remote_tag:
            return None
        return call

    def _on_ack(self, req: SipMessage) -> None:
        num, _ = req.cseq()
        call = self.calls.get(req.call_id)
        if call is not None and (
            header_tag(req.get("To") or "") != call.local_tag
            or header_tag(req.get("From") or "") != call.remote_tag
        ):
            # Only the one who received our response knows our To-tag: an ACK without it is
            # blind (e.g. after a spoofed INVITE) and must not confirm the call or stop the 200.
            self.stats["ack_bad_tag"] += 1
            log.info("ACK for %s with the wrong tags ignored", call.call_id)
            return
        retrans = self._await_ack.pop((req.call_id, num), None)
        if retrans is not None:
            retrans.cancel()
        if call is not None and call.state == "answered" and num == call.invite.cseq()[0]:
            call.state = "confirmed"
            call.confirmed.set()
            log.info("call %s confirmed (ACK)", call.call_id)
            if call.media is not None:
                call.media.arm()  # the first moment we may send RTP
            call.rtp_since = asyncio.get_running_loop().time()
            self._arm_rtp_check(call)

    def _on_cancel(self, req: SipMessage, source: tuple[str, int]) -> None:
        inv = self._server_tx.get(self._tx_key(req, "INVITE"))
        if inv is None:
            self._respond(req, source, 481, "Call/Transaction Does Not Exist")
            return
        call = inv.call
        self._respond(req, source, 200, "OK", to_tag=call.local_tag if call else None)
        if call is not None and call.state in ("setup", "ringing"):
            call.end("caller cancelled (CANCEL)", bye=False)

    def _on_invite(self, req: SipMessage, source: tuple[str, int], key: str) -> None:
        local_tag = new_tag()
        self._respond(req, source, 100, "Trying")
        self._server_tx[key].call = None
        if not self._accepting:
            self._final(
                req,
                source,
                503,
                "Service Unavailable",
                local_tag,
                [("Retry-After", str(self.config.retry_after_s))],
            )
            return
        if req.call_id in self.calls:
            self._final(req, source, 482, "Loop Detected", local_tag)
            return
        try:
            parse_sip_uri(req.uri or "")
        except UriError as exc:
            self.stats["bad_uri"] += 1
            if exc.unsupported_scheme:
                self._final(req, source, 416, "Unsupported URI Scheme", local_tag)
            else:
                self._final(req, source, 400, f"Bad Request-URI ({exc})", local_tag)
            return
        if len(req.call_id) > _MAX_CALL_ID:
            self._final(req, source, 400, "Bad Request (Call-ID too long)", local_tag)
            return
        try:
            target = contact_uri(req.get("Contact"))
        except UriError as exc:
            # The reason is one of a few fixed phrases: the Contact itself is never echoed.
            self.stats["bad_contact"] += 1
            log.info("INVITE from %s:%d: bad Contact (%s)", *source, exc)
            self._final(req, source, 400, f"Bad Contact ({exc})", local_tag)
            return
        try:
            routes = record_route(req)
        except UriError as exc:
            self.stats["bad_record_route"] += 1
            self._final(req, source, 400, f"Bad Record-Route ({exc})", local_tag)
            return
        try:
            timer = self._session_timer(req)
        except SessionIntervalTooSmall as exc:
            self._final(
                req,
                source,
                422,
                "Session Interval Too Small",
                local_tag,
                [("Min-SE", str(exc.min_se_s))],
            )
            return
        except SessionTimerError as exc:
            self._final(req, source, 400, f"Bad Request ({exc})", local_tag)
            return
        origin = ""
        try:
            sdp = parse_sdp(req.body) if req.body else None
            choice = negotiate(sdp) if sdp is not None else None
            origin = sdp.origin if sdp is not None else ""
        except SdpError as exc:
            log.info("INVITE %s: unreadable SDP (%s)", _short(req.call_id), exc)
            choice = None
        if choice is None:
            self._final(
                req,
                source,
                488,
                "Not Acceptable Here",
                local_tag,
                [("Warning", '305 voxgate "PCMU or PCMA at 8000 Hz required"')],
            )
            return
        if len(self.calls) >= self.config.max_calls:
            self._final(
                req,
                source,
                486,
                "Busy Here",
                local_tag,
                [("Retry-After", str(self.config.retry_after_s))],
            )
            return
        call = _Call(
            call_id=req.call_id,
            invite=req,
            invite_key=key,
            source=source,
            reply_to=reply_address(req, source),
            local_tag=local_tag,
            remote_tag=header_tag(req.get("From") or ""),
            choice=choice,
            remote_target=target.text,
            route_set=routes,
            session_timer=timer,
            peer_allows_update=_allows(req, "UPDATE"),
            sdp_origin=origin,
        )
        call.local_ip = self._local_ip(source[0])
        self._server_tx[key].call = call
        self.calls[call.call_id] = call
        self.stats["calls"] += 1
        task = asyncio.create_task(self._supervise(call), name=f"sip-call-{call.call_id}")
        self._supervisors.add(task)
        task.add_done_callback(self._supervisors.discard)
        log.info(
            "INVITE %s from %s (%s, contact %s%s%s)",
            call.call_id,
            _short(header_uri(req.get("From") or "")),
            choice.encoding,
            target.text,
            f", session timer {timer.interval_s} s by {timer.refresher}" if timer else "",
            f", {len(routes)} Record-Route" if routes else "",
        )

    def _session_timer(self, req: SipMessage) -> SessionTimer | None:
        tags = option_tags(req.get("Supported")) + option_tags(req.get("Require"))
        return negotiate_session_timer(
            req.get("Session-Expires"),
            req.get("Min-SE"),
            uac_supports="timer" in tags,
            default_s=self.config.session_expires_s,
            min_se_s=self.config.min_se_s,
        )

    def _final(  # noqa: PLR0917  # the response's (request, source, status, reason, tag)
        self,
        req: SipMessage,
        source: tuple[str, int],
        status: int,
        reason: str,
        local_tag: str,
        headers: list[tuple[str, str]] | None = None,
        *,
        body: bytes = b"",
        call: _Call | None = None,
    ) -> None:
        """A final response to an INVITE, retransmitted until its ACK (Timers G/H, 13.3.1.4)."""
        data = self._respond(
            req, source, status, reason, to_tag=local_tag, headers=headers, body=body
        )
        dest = reply_address(req, source)
        num, _ = req.cseq()
        ack_key = (req.call_id, num)
        old = self._await_ack.pop(ack_key, None)
        if old is not None:
            old.cancel()

        def timeout() -> None:
            self._await_ack.pop(ack_key, None)
            if call is not None and status < 300 and call.state == "answered":
                self.stats["ack_timeout"] += 1
                call.end("no ACK within 64*T1", bye=True)

        def resent() -> None:
            self.stats["retransmitted"] += 1

        self._await_ack[ack_key] = _Retransmit(
            asyncio.get_running_loop(),
            lambda: self._send(data, dest),
            t1_s=self.config.t1_ms / 1000,
            t2_s=self.config.t2_ms / 1000,
            deadline_s=64 * self.config.t1_ms / 1000,
            on_timeout=timeout,
            on_resend=resent,
        )

    def _on_reinvite(self, req: SipMessage, source: tuple[str, int]) -> None:
        call = self._dialog(req)
        if call is None or call.media is None:
            self._respond(req, source, 481, "Call/Transaction Does Not Exist")
            return
        refused = self._in_dialog_offer(call, req, "re-INVITE")
        if refused is not None:
            self._final(req, source, *refused[:2], call.local_tag, refused[2])
            return
        call.sdp_version += 1
        self._final(
            req,
            source,
            200,
            "OK",
            call.local_tag,
            self._answer_headers(call, req),
            body=self._sdp(call),
        )

    def _on_update(self, call: _Call, req: SipMessage, source: tuple[str, int]) -> None:
        """RFC 3311 UPDATE: a session refresh (RFC 4028) and/or a new offer, no ACK."""
        if call.media is None:
            self._respond(req, source, 481, "Call/Transaction Does Not Exist")
            return
        refused = self._in_dialog_offer(call, req, "UPDATE")
        if refused is not None:
            self._respond(req, source, refused[0], refused[1], headers=refused[2])
            return
        headers = [
            *_record_route_copy(req),
            ("Contact", f"<sip:voxgate@{call.local_ip}:{self.address[1]}>"),
            ("Supported", _SUPPORTED),
            *(call.session_timer.response_headers() if call.session_timer else []),
        ]
        body = b""
        if req.body:
            call.sdp_version += 1
            headers.append(("Content-Type", "application/sdp"))
            body = self._sdp(call)
        self._respond(req, source, 200, "OK", headers=headers, body=body)

    def _on_info(self, call: _Call, req: SipMessage, source: tuple[str, int]) -> None:
        """SIP INFO: a key press as ``application/dtmf-relay`` or ``application/dtmf``.

        It reaches the gateway exactly as an RFC 4733 key press does. An INFO with no body is
        a keep-alive some phones send (200); another body type gets 415 with the types we
        read; a body we cannot read gets 400, and the call goes on.
        """
        if not req.body.strip():
            self._respond(req, source, 200, "OK")
            return
        try:
            digit, duration_ms = parse_dtmf_info(req.get("Content-Type"), req.body)
        except DtmfInfoError as exc:
            self.stats["info_refused"] += 1
            if exc.status == 415:
                accept = [("Accept", ", ".join(DTMF_INFO_TYPES))]
                self._respond(req, source, 415, "Unsupported Media Type", headers=accept)
            else:
                self._respond(req, source, 400, f"Bad Request ({exc})")
            return
        self._respond(req, source, 200, "OK")
        self.stats["dtmf_info"] += 1
        if call.state in ("answered", "confirmed"):
            self._caller_dtmf(call, DtmfEvent(digit, duration_ms))

    def _on_notify(self, call: _Call, req: SipMessage, source: tuple[str, int]) -> None:
        """NOTIFY of a REFER's implicit subscription (RFC 3515 2.4.4): the transfer's progress.

        The sipfrag's status line says how the transferee's call to the target goes: 1xx is
        progress, 2xx success, anything else failure. A ``terminated`` subscription without a
        final status is a failure too.
        """
        event = (req.get("Event") or "").split(";", 1)[0].strip().lower()
        if event != "refer":
            self._respond(req, source, 489, "Bad Event", headers=[("Allow-Events", "refer")])
            return
        refer = call.refer
        if refer is None or refer.done.done():
            self._respond(req, source, 481, "Subscription Does Not Exist")
            return
        self._respond(req, source, 200, "OK")
        frag = parse_sipfrag(req.body)
        state = (req.get("Subscription-State") or "").split(";", 1)[0].strip().lower()
        if frag is not None:
            log.info("call %s: transfer NOTIFY %d %s", call.call_id, frag[0], frag[1])
        if frag is not None and frag[0] >= 200:
            refer.done.set_result(ReferOutcome(200 <= frag[0] < 300, frag[0], frag[1]))
        elif state == "terminated":
            reason = "subscription terminated without a final status"
            refer.done.set_result(ReferOutcome(False, 0, reason))

    def _in_dialog_offer(
        self, call: _Call, req: SipMessage, what: str
    ) -> tuple[int, str, list[tuple[str, str]]] | None:
        """Check, then apply, a re-INVITE or UPDATE: target refresh, session timer, new media.

        Returns the refusal (status, reason, headers) when any part is unacceptable; nothing
        is applied then. Accepted, it counts as a session refresh (RFC 4028 re-arms the timer).
        """
        target = None
        if req.get("Contact") is not None:
            try:
                target = contact_uri(req.get("Contact"))
            except UriError as exc:
                self.stats["bad_contact"] += 1
                return 400, f"Bad Contact ({exc})", []
        try:
            timer = self._session_timer(req)
        except SessionIntervalTooSmall as exc:
            return 422, "Session Interval Too Small", [("Min-SE", str(exc.min_se_s))]
        except SessionTimerError as exc:
            return 400, f"Bad Request ({exc})", []
        choice: MediaChoice | None = None
        origin = call.sdp_origin
        if req.body:
            try:
                sdp = parse_sdp(req.body)
                choice = negotiate(sdp, prefer=call.choice.encoding)
                origin = sdp.origin
            except SdpError:
                choice = None
            if choice is None:
                return 488, "Not Acceptable Here", []
        if target is not None:
            call.remote_target = target.text
        if req.get("Allow") is not None:
            call.peer_allows_update = _allows(req, "UPDATE")
        media = call.media
        assert media is not None
        if choice is not None and (origin != call.sdp_origin or not origin):
            # New media (a new o= version): the only way the RTP latch may move.
            call.choice, call.sdp_origin = choice, origin
            media.relearn(choice.remote)
            media.sending_enabled = choice.we_send
            if not choice.we_send:
                media.clear()
            call.rtp_since = asyncio.get_running_loop().time()
            if call.state == "confirmed":
                self._arm_rtp_check(call)
            log.info("%s %s: %s to %s:%d", what, call.call_id, choice.direction, *choice.remote)
        if timer is not None or call.session_timer is not None:
            self.stats["session_refreshed"] += 1
        call.session_timer = timer
        self._arm_session_timer(call)
        return None

    # -- responses (to our BYEs) ------------------------------------------------------------------

    def _on_response(self, resp: SipMessage) -> None:
        branch = resp.vias()[0].branch or ""
        ack = self._acks.get(branch)
        if ack is not None and resp.status is not None and 200 <= resp.status < 300:
            self._send(*ack)  # a 2xx to our re-INVITE retransmitted: our ACK was lost
            return
        fut = self._client_tx.get(branch)
        if fut is not None and resp.status is not None and resp.status >= 200 and not fut.done():
            fut.set_result(resp.status)

    def _in_dialog_request(
        self,
        call: _Call,
        method: str,
        headers: list[tuple[str, str]] | None = None,
        body: bytes = b"",
    ) -> tuple[SipMessage, str]:
        """A request inside the call's dialog (RFC 3261 12.2.1.1).

        Its Request-URI is the validated remote target and its Route headers the route set
        (loose routing; a strict-routing first hop gets the RFC 2543 rewrite, see
        :func:`~voxgate.bridges.sip._message.next_hop`).
        """
        branch = new_branch()
        ip, port = call.local_ip, self.address[1]
        hop = next_hop(call.route_set, call.remote_target)
        req = SipMessage(method=method, uri=hop.request_uri, body=body)
        req.add("Via", f"SIP/2.0/UDP {ip}:{port};branch={branch};rport")
        req.add("Max-Forwards", "70")
        for route in hop.routes:
            req.add("Route", route)
        req.add("From", call.to_header)
        req.add("To", call.invite.get("From") or "")
        req.add("Call-ID", call.call_id)
        req.add("CSeq", f"{call.local_cseq} {method}")
        call.local_cseq += 1
        req.add("User-Agent", _USER_AGENT)
        for k, v in headers or []:
            req.add(k, v)
        return req, branch

    async def _transact(self, call: _Call, req: SipMessage, branch: str) -> int:
        """Send a client request until its final response (408 after 64*T1); the status.

        A 2xx to our INVITE is ACKed, and the ACK resent to any retransmission of that 2xx.
        """
        data = req.encode()
        try:
            dest = await self._first_hop(call)
        except OSError as exc:  # RFC 3261 8.1.3.1: a transport failure counts as 503
            log.warning("call %s: %s not sent: %s", call.call_id, req.method, exc)
            return 503
        fut: asyncio.Future[int] = asyncio.get_running_loop().create_future()
        self._client_tx[branch] = fut
        self._send(data, dest)
        r = _Retransmit(
            asyncio.get_running_loop(),
            lambda: self._send(data, dest),
            t1_s=self.config.t1_ms / 1000,
            t2_s=self.config.t2_ms / 1000,
            deadline_s=64 * self.config.t1_ms / 1000,
            on_timeout=lambda: _resolve(fut, 408),
        )
        try:
            status = await fut
        finally:
            r.cancel()
            self._client_tx.pop(branch, None)
        if req.method == "INVITE" and 200 <= status < 300:
            ack = SipMessage(method="ACK", uri=req.uri)
            ack.add("Via", f"SIP/2.0/UDP {call.local_ip}:{self.address[1]};branch={new_branch()}")
            for name in ("Max-Forwards", "From", "To", "Call-ID"):
                ack.add(name, req.get(name) or "")
            for route in req.get_all("Route"):  # the ACK of a 2xx follows the route set too
                ack.add("Route", route)
            ack.add("CSeq", f"{req.cseq()[0]} ACK")
            ack_data = ack.encode()
            self._send(ack_data, dest)
            self._acks[branch] = (ack_data, dest)
            self._later(64 * self.config.t1_ms / 1000, lambda: self._forget_ack(branch))
        return status

    def _forget_ack(self, branch: str) -> None:
        self._acks.pop(branch, None)

    async def _first_hop(self, call: _Call) -> tuple[str, int]:
        """Where the call's in-dialog requests go.

        With a route set: its first entry's host and port (a proxy), resolved when it is a
        name. Without one: back where the INVITE came from, which is the caller's Contact host
        on a direct call and the only address that works when the caller is behind NAT.
        """
        hop = next_hop(call.route_set, call.remote_target)
        if not hop.via_route:
            return call.source
        with contextlib.suppress(ValueError):
            ipaddress.ip_address(hop.host)
            return hop.host, hop.port
        infos = await asyncio.get_running_loop().getaddrinfo(
            hop.host, hop.port, family=socket.AF_INET, type=socket.SOCK_DGRAM
        )
        if not infos:
            raise OSError(f"route host {_short(hop.host)} has no address")
        return str(infos[0][4][0]), int(infos[0][4][1])

    def _awaiting_ack(self, call: _Call) -> bool:
        return (call.call_id, call.invite.cseq()[0]) in self._await_ack

    def _send_bye(self, call: _Call) -> None:
        req, branch = self._in_dialog_request(call, "BYE")
        self.stats["bye_sent"] += 1

        async def run() -> None:
            status = await self._transact(call, req, branch)
            log.info("BYE %s answered %d", call.call_id, status)

        task = asyncio.create_task(run(), name=f"sip-bye-{call.call_id}")
        self._byes.add(task)
        task.add_done_callback(self._byes.discard)

    async def transfer(self, call_id: str, target: str, *, timeout_s: float = 30.0) -> ReferOutcome:
        """Blind-transfer a call (RFC 3515): REFER the caller to ``target`` and await NOTIFY.

        The caller's phone gets ``Refer-To: <target>`` and ``Referred-By`` (us); once it
        accepts (202) its NOTIFYs report its call to the target. A 2xx there ends this call
        with BYE (the caller now talks to the target). A refusal, a failed target, or no final
        NOTIFY within ``timeout_s`` returns ``ok=False`` and the call goes on as before.

        Args:
            call_id: the SIP Call-ID of a confirmed call of this bridge.
            target: a ``sip:``/``sips:`` URI (validated; it is copied into the REFER).
            timeout_s: how long to wait for the final NOTIFY after the 202.
        """
        call = self.calls.get(call_id)
        if call is not None and call.state == "answered":
            # The bot starts on our 200 OK, so it may ask before the caller's ACK is in; the
            # REFER waits for it (the 200's retransmissions end the call if it never comes).
            with contextlib.suppress(_Ended):
                await self._until_ended(call, call.confirmed.wait(), None)
        if call is None or call.state != "confirmed" or call.ended.is_set():
            self.stats["transfer_failed"] += 1
            return ReferOutcome(False, 481, "call is not up")
        try:
            uri = parse_sip_uri(target)
        except UriError as exc:
            self.stats["transfer_failed"] += 1
            return ReferOutcome(False, 400, f"bad transfer target ({exc})")
        if call.refer is not None:
            self.stats["transfer_failed"] += 1
            return ReferOutcome(False, 491, "a transfer is already in progress")
        me = f"<sip:voxgate@{call.local_ip}:{self.address[1]}>"
        headers = [("Refer-To", f"<{uri.text}>"), ("Referred-By", me), ("Contact", me)]
        req, branch = self._in_dialog_request(call, "REFER", headers)
        refer = _Refer(asyncio.get_running_loop().create_future(), req.cseq()[0])
        call.refer = refer  # before sending: a NOTIFY may overtake the 202 on UDP
        self.stats["refer_sent"] += 1
        log.info("call %s: REFER to %s", call.call_id, _short(uri.text))
        try:
            status = await self._until_ended(call, self._transact(call, req, branch), None)
            if not 200 <= status < 300:
                result = ReferOutcome(False, status, "REFER refused")
            else:
                try:
                    result = await self._until_ended(call, asyncio.shield(refer.done), timeout_s)
                except _Ended:
                    if call.ended.is_set():
                        raise
                    result = ReferOutcome(False, 408, "no final NOTIFY in time")
        except _Ended:
            result = ReferOutcome(False, 487, "the call ended during the transfer")
        finally:
            call.refer = None
            if not refer.done.done():
                refer.done.cancel()
        self.stats["transferred" if result.ok else "transfer_failed"] += 1
        log.info(
            "call %s: transfer %s (%d %s)",
            call.call_id,
            "succeeded" if result.ok else "failed",
            result.status,
            result.reason,
        )
        if result.ok:
            call.end(f"transferred ({result.status} {result.reason})", bye=True)
        return result

    # -- call lifetime ----------------------------------------------------------------------------

    def _timer(self, call: _Call, name: str, delay_s: float, fn: Callable[[], None]) -> None:
        """(Re)arm the call's named timer; teardown cancels them all."""
        old = call.timers.pop(name, None)
        if old is not None:
            old.cancel()
        if call.state != "ended":
            call.timers[name] = asyncio.get_running_loop().call_later(delay_s, fn)

    def _max_duration(self, call: _Call) -> None:
        self.stats["max_duration"] += 1
        call.end(f"maximum call duration ({self.config.max_call_s:g} s)", bye=True)

    @staticmethod
    def _on_hold(call: _Call) -> bool:
        return call.choice.direction == "inactive" or call.choice.remote[0] == "0.0.0.0"

    def _arm_rtp_check(self, call: _Call) -> None:
        """The next RTP check: a full timeout from now, or the keep-alive period on hold."""
        timeout = self.config.rtp_timeout_s
        delay = min(timeout, _HOLD_KEEPALIVE_S) if self._on_hold(call) else timeout
        self._timer(call, "rtp", delay, lambda: self._check_rtp(call))

    def _check_rtp(self, call: _Call) -> None:
        """The RTP inactivity timeout: end the call when nothing came back for too long.

        Only packets the latch accepted count (a stranger's packets must not keep a dead call
        alive). While the media is inactive (``a=inactive`` or the old ``c=0.0.0.0`` hold)
        nothing is expected, so the clock restarts instead.
        """
        if call.ended.is_set() or call.media is None:
            return
        timeout = self.config.rtp_timeout_s
        now = asyncio.get_running_loop().time()
        if self._on_hold(call):
            # On hold: nothing flows, yet the gateway ends a stream that sends no audio for its
            # idle timeout (the client would be gone). 20 ms of silence now and then says "still
            # here" without moving its audio clock much.
            call.rtp_since = now
            frame = bytes([SILENCE[call.choice.encoding]]) * 160
            self._put(call, pb.ConverseRequest(audio=pb.AudioChunk(data=frame)))
            delay = min(timeout, _HOLD_KEEPALIVE_S)
            self._timer(call, "rtp", delay, lambda: self._check_rtp(call))
            return
        idle = now - max(call.rtp_since, call.media.last_rx or 0.0)
        if idle >= timeout - 1e-3:
            self.stats["rtp_timeout"] += 1
            call.end(f"no RTP for {timeout:g} s", bye=True)
            return
        self._timer(call, "rtp", timeout - idle, lambda: self._check_rtp(call))

    def _arm_session_timer(self, call: _Call) -> None:
        st = call.session_timer
        if st is None:
            old = call.timers.pop("session", None)
            if old is not None:
                old.cancel()
        elif st.refresher == "uac":
            self._timer(call, "session", st.expire_after_s, lambda: self._session_expired(call))
        else:
            self._timer(call, "session", st.refresh_after_s, lambda: self._refresh_session(call))

    def _session_expired(self, call: _Call) -> None:
        self.stats["session_expired"] += 1
        call.end("session timer expired (no refresh)", bye=True)

    def _refresh_session(self, call: _Call) -> None:
        """We refresh the session (RFC 4028 7.4): UPDATE when the caller allows it.

        Otherwise a re-INVITE with our unchanged SDP. A refusal or no answer ends the call;
        491 (glare) retries.
        """
        st = call.session_timer
        if st is None or call.ended.is_set() or call.state != "confirmed":
            return
        headers = [("Session-Expires", st.header()), ("Supported", _SUPPORTED)]
        headers.append(("Contact", f"<sip:voxgate@{call.local_ip}:{self.address[1]}>"))
        body = b""
        if call.peer_allows_update:
            method = "UPDATE"
        else:
            method = "INVITE"
            headers += [("Allow", _ALLOW), ("Content-Type", "application/sdp")]
            body = self._sdp(call)  # the same version: the media does not change
        req, branch = self._in_dialog_request(call, method, headers, body)
        self.stats["session_refresh_sent"] += 1

        async def run() -> None:
            status = await self._transact(call, req, branch)
            if call.ended.is_set():
                return
            if 200 <= status < 300:
                self._arm_session_timer(call)
            elif status == 491:  # glare: try again shortly (RFC 3261 14.1)
                self._timer(call, "session", 1.0, lambda: self._refresh_session(call))
            else:
                self.stats["session_refresh_failed"] += 1
                call.end(f"session refresh ({method}) answered {status}", bye=True)

        task = asyncio.create_task(run(), name=f"sip-refresh-{call.call_id}")
        self._byes.add(task)
        task.add_done_callback(self._byes.discard)

    # -- one call ---------------------------------------------------------------------------------

    def _local_ip(self, peer_ip: str) -> str:
        if self.config.advertise_host:
            return self.config.advertise_host
        if self.address[0] not in ("0.0.0.0", ""):
            return self.address[0]
        try:
            with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
                s.connect((peer_ip, 9))  # no packet is sent: this only asks the routing table
                return str(s.getsockname()[0])
        except OSError:
            return "127.0.0.1"

    def _sdp(self, call: _Call) -> bytes:
        assert call.media is not None
        return build_answer(
            call.choice,
            call.local_ip,
            call.media.local_port,
            session_id=call.session_id,
            version=call.sdp_version,
        )

    def _answer_headers(self, call: _Call, req: SipMessage | None = None) -> list[tuple[str, str]]:
        """Headers of a 2xx to an INVITE: the initial one (``req`` None) or a re-INVITE.

        RFC 3261 12.1.1: the 2xx copies the request's Record-Route, in order, so that the
        caller's route set matches ours and its ACK, BYE and re-INVITEs pass the proxy too.
        """
        if req is None:
            rr = [("Record-Route", v) for v in call.route_set]
        else:
            rr = _record_route_copy(req)
        return [
            *rr,
            ("Contact", f"<sip:voxgate@{call.local_ip}:{self.address[1]}>"),
            ("Allow", _ALLOW),
            ("Supported", _SUPPORTED),
            *(call.session_timer.response_headers() if call.session_timer else []),
            ("Content-Type", "application/sdp"),
        ]

    async def _until_ended(self, call: _Call, aw: Awaitable[T], timeout_s: float | None) -> T:
        """Await ``aw`` unless the call ends (or the timeout passes) first."""
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
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await task
        raise _Ended(call.end_reason or "timed out")

    async def _supervise(self, call: _Call) -> None:
        """Set the call up, wait for either side to end it, then tear everything down."""
        try:
            if await self._setup(call):
                await call.ended.wait()
        except Exception:  # a bug in one call must not leak past it
            log.exception("call %s failed", call.call_id)
            call.end("internal error", bye=True)
        finally:
            await self._teardown(call)

    async def _setup(self, call: _Call) -> bool:
        req, src = call.invite, call.source
        try:
            sock = bind_rtp_socket(
                self.config.listen_host, self.config.rtp_port_min, self.config.rtp_port_max
            )
        except OSError as exc:
            log.error("call %s: %s", call.call_id, exc)
            self._final(
                req,
                src,
                503,
                "Service Unavailable",
                call.local_tag,
                [("Retry-After", str(self.config.retry_after_s))],
            )
            return False
        call.media = RtpSession(
            sock,
            encoding=call.choice.encoding,
            payload_type=call.choice.payload_type,
            dtmf_payload_type=call.choice.dtmf_payload_type,
            remote=call.choice.remote,
            on_audio=lambda frame: self._caller_audio(call, frame),
            on_dtmf=lambda ev: self._caller_dtmf(call, ev),
            jitter_ms=self.config.jitter_ms,
            symmetric=self.config.symmetric_rtp,
            # Behind NAT, RTP comes from the host the INVITE came from, not the SDP's c=.
            trusted_hosts=frozenset({src[0]}),
            latch_probation=self.config.latch_probation,
        )
        call.media.sending_enabled = call.choice.we_send
        try:
            await self._until_ended(call, self._open_gateway(call), self.config.gateway_timeout_s)
        except (_Ended, VoxgateError, OSError) as exc:
            if call.ended.is_set():
                self._final(req, src, 487, "Request Terminated", call.local_tag)
            else:
                log.warning(
                    "call %s: gateway %s did not start the call: %s",
                    call.call_id,
                    self.config.gateway,
                    _rpc_text(exc),
                )
                self._final(
                    req,
                    src,
                    503,
                    "Service Unavailable",
                    call.local_tag,
                    [("Retry-After", str(self.config.retry_after_s))],
                )
            return False
        if self.config.ring_ms:
            call.state = "ringing"
            self._respond(
                req,
                src,
                180,
                "Ringing",
                to_tag=call.local_tag,
                headers=[
                    *[("Record-Route", v) for v in call.route_set],  # an early dialog's route
                    ("Contact", f"<sip:voxgate@{call.local_ip}:{self.address[1]}>"),
                ],
            )
            with contextlib.suppress(_Ended):
                await self._until_ended(call, asyncio.sleep(self.config.ring_ms / 1000), None)
        if call.ended.is_set():
            self._final(req, src, 487, "Request Terminated", call.local_tag)
            return False
        await call.media.start()
        call.state = "answered"
        self._final(
            req,
            src,
            200,
            "OK",
            call.local_tag,
            self._answer_headers(call),
            body=self._sdp(call),
            call=call,
        )
        max_s = self.config.max_call_s
        self._timer(call, "max_call", max_s, lambda: self._max_duration(call))
        self._arm_session_timer(call)
        call.tasks += [
            asyncio.create_task(self._run_link(call), name="gw-link"),
            asyncio.create_task(self._gateway_writer(call), name="gw-write"),
        ]
        log.info(
            "call %s answered (RTP %d → %s:%d)",
            call.call_id,
            call.media.local_port,
            *call.choice.remote,
        )
        return True

    async def _open_gateway(self, call: _Call) -> None:
        """Start the call's Converse stream (voxgate_client: its status handling, its errors)."""
        if self._client is None:
            raise OSError("no gateway channel (bridge not started)")
        enc: EncodingName = "alaw" if call.choice.encoding == "PCMA" else "mulaw"
        call.gw = await self._client.converse(
            CallConfig(
                encoding=enc,
                sample_rate_hz=8000,
                language=self.config.language,
                voice=self.config.voice,
                call_id=call.call_id,
                echo_handling=self.config.echo_handling or None,
                turns=TurnOptions(
                    mode=self.config.turns or None, eagerness=self.config.turn_eagerness
                ),
            )
        )
        assert call.gw.session is not None
        self._observe(call, call.gw.session)

    def _bot_info(self, call: _Call) -> CallInfo:
        """What the bot learns of a SIP call: the dialog's parties and a few headers."""
        req = call.invite
        headers = {
            name: value[:256]
            for name in ("User-Agent", "Subject", "P-Asserted-Identity", "Diversion")
            if (value := req.get(name))
        }
        return CallInfo(
            call_id=call.call_id,
            from_uri=header_uri(req.get("From") or "")[:256],
            to_uri=header_uri(req.get("To") or "")[:256],
            channel="sip",
            headers=headers,
            transfer_supported=True,
        )

    async def _bot_transfer(self, call: _Call, target_uri: str) -> TransferResult:
        """The link's transfer hook: REFER (:meth:`transfer`) as a ``TransferResult``."""
        outcome = await self.transfer(call.call_id, target_uri)
        if outcome.ok:
            code = grpc.StatusCode.OK
        elif outcome.status == 400:
            code = grpc.StatusCode.INVALID_ARGUMENT
        elif outcome.status == 408:
            code = grpc.StatusCode.DEADLINE_EXCEEDED
        else:
            code = grpc.StatusCode.FAILED_PRECONDITION
        return TransferResult("", code, outcome.reason, outcome.status)

    async def _run_link(self, call: _Call) -> None:
        """Hand the call to the bot until the gateway stream ends; then end the SIP leg."""
        assert call.gw is not None
        call.link = BotLink(
            call.gw,
            self._bot,
            self._bot_info(call),
            on_event=lambda ev: self._on_gateway(call, ev),
            transfer=lambda uri: self._bot_transfer(call, uri),
            policy=self._bot_policy,
        )
        try:
            outcome = await call.link.run()
        except asyncio.CancelledError:
            await call.link.aclose()
            raise
        except Exception:  # a bug in the link must still end the call (the writer no longer does)
            log.exception("call %s: the bot link failed", call.call_id)
            call.end("internal error", bye=True)
            return
        reason = outcome.reason
        if reason == "gateway ended":
            reason = "gateway ended the call"
        elif reason.startswith("gateway error"):
            err = await call.gw.error()
            reason = f"gateway error: {err}" if err is not None else reason
        call.end(reason, bye=True)

    def _observe(self, call: _Call, event: ServerEvent) -> None:
        if self._on_event is not None:
            try:
                self._on_event(call.call_id, event)
            except Exception:  # an observer's bug must not end the call
                log.exception("on_event observer failed")

    async def _teardown(self, call: _Call) -> None:
        if call.send_bye and call.state == "answered" and self._awaiting_ack(call):
            # RFC 3261 15: no BYE before the ACK of our 2xx (a bot may hang up at once); the
            # 200 keeps being resent meanwhile, and its 64*T1 timeout bounds the wait.
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(call.confirmed.wait(), 64 * self.config.t1_ms / 1000)
        prev, call.state = call.state, "ended"
        for handle in call.timers.values():
            handle.cancel()
        call.timers.clear()
        if not call.ended.is_set():
            call.end("setup failed", bye=False)
        log.info("call %s ended: %s", call.call_id, call.end_reason)
        self.ended.append((call.call_id, call.end_reason))
        if call.send_bye and prev in ("answered", "confirmed"):
            self._send_bye(call)
        if prev == "answered":  # stop resending the 200 once we hang up
            r = self._await_ack.pop((call.call_id, call.invite.cseq()[0]), None)
            if r is not None:
                r.cancel()
        if call.gw is not None:
            # The writer sends the hangup after the queued audio; the gateway then flushes the
            # last utterance's events to the link (and the bot), bounded.
            with contextlib.suppress(asyncio.QueueFull):
                call.out_q.put_nowait(None)
            if call.tasks:
                await asyncio.wait(list(call.tasks), timeout=1.0)
            if call.link is not None:
                await call.link.aclose()
            await call.gw.aclose()
        for t in call.tasks:
            t.cancel()
        for t in call.tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await t
        if call.media is not None:
            st = call.media.stats
            log.info(
                "call %s RTP: sent=%d spurts=%d max_lateness_ms=%.1f "
                "max_interval_dev_ms=%.1f p99_interval_dev_ms=%.1f received=%d dtmf=%d "
                "dropped_foreign=%d",
                call.call_id,
                st.sent,
                st.talk_spurts,
                st.max_lateness_ms,
                st.max_interval_dev_ms,
                st.p99_interval_dev_ms(),
                st.received,
                st.dtmf,
                st.dropped_foreign,
            )
            self.stats["rtp_dropped_foreign"] += st.dropped_foreign
            await call.media.aclose()
        if self.calls.get(call.call_id) is call:
            del self.calls[call.call_id]

    # -- gateway stream ---------------------------------------------------------------------------

    def _put(self, call: _Call, req: pb.ConverseRequest) -> None:
        """Queue caller audio or a key for the gateway (the writer task sends them in order)."""
        if call.ended.is_set() or call.gw is None:
            return
        try:
            call.out_q.put_nowait(req)
        except asyncio.QueueFull:
            call.dropped_audio += 1
            if call.dropped_audio in (1, 100, 1000):
                log.warning(
                    "call %s: gateway is not keeping up; %d requests dropped",
                    call.call_id,
                    call.dropped_audio,
                )

    def _caller_audio(self, call: _Call, frame: bytes) -> None:
        if call.state in ("answered", "confirmed"):
            self._put(call, pb.ConverseRequest(audio=pb.AudioChunk(data=frame)))

    def _caller_dtmf(self, call: _Call, ev: DtmfEvent) -> None:
        if self.config.log_content:
            log.info("call %s: DTMF %s (%d ms)", call.call_id, ev.digit, ev.duration_ms)
        else:
            log.debug("call %s: DTMF key (%d ms)", call.call_id, ev.duration_ms)
        self._put(
            call, pb.ConverseRequest(dtmf=pb.Dtmf(digit=ev.digit, duration_ms=ev.duration_ms))
        )

    async def _gateway_writer(self, call: _Call) -> None:
        """Caller audio and keys to the gateway, in order; ``None`` (teardown) hangs up.

        The bot's controls go through the link; ``Call`` serialises both writers.
        """
        gw = call.gw
        assert gw is not None
        try:
            while True:
                req = await call.out_q.get()
                if req is None:
                    await gw.hangup()
                    return
                if req.WhichOneof("event") == "dtmf":
                    await gw.dtmf(req.dtmf.digit, req.dtmf.duration_ms)
                else:
                    await gw.send_audio(req.audio.data)
        except asyncio.CancelledError:
            raise
        except CallEndedError:
            # The gateway call was hung up on this side (the bot hung up or left, or the link
            # ended the call for a bot fault): the link's outcome is the call's end reason, not
            # this write's. The caller's audio is dropped until teardown, not queued up.
            while await call.out_q.get() is not None:
                pass
        except Exception as exc:  # a failed write ends the call; its status is the link's
            call.end(f"gateway write failed: {_rpc_text(exc)}", bye=True)

    def _on_gateway(self, call: _Call, event: ServerEvent) -> None:
        """The link's tee: what the SIP leg does with each gateway event (before the bot)."""
        self._observe(call, event)
        media = call.media
        if media is None:
            return
        if isinstance(event, AudioOut):
            media.queue_audio(event.data, last=event.is_last)
        elif isinstance(event, PlaybackInterrupted):
            dropped = media.queued_ms
            media.clear()
            if event.barge_in:
                log.info("call %s: barge-in, %d ms of queued reply dropped", call.call_id, dropped)
            elif call.ended.is_set():
                # The call is ending (a BYE, CANCEL, timeout...): the gateway reports every
                # reply it had not finished; that is one fact, and not a barge-in.
                if not call.logged_unplayed:
                    call.logged_unplayed = True
                    log.info(
                        "call %s: call ended during a reply, %d ms of queued reply not played",
                        call.call_id,
                        dropped,
                    )
            elif dropped:
                log.info(
                    "call %s: playback cleared, %d ms of queued reply dropped",
                    call.call_id,
                    dropped,
                )
        elif isinstance(event, Transcript) and event.is_final and self.config.log_content:
            log.info("call %s: caller said %r", call.call_id, event.text)
        elif isinstance(event, ErrorEvent):
            log.warning(
                "call %s: gateway error event %s %s (%s)",
                call.call_id,
                event.code.name,
                event.message,
                event.scope,
            )


def _record_route_copy(req: SipMessage) -> list[tuple[str, str]]:
    """Record-Route of an in-dialog request, for its 2xx (nothing when it does not validate).

    A proxy may record-route a re-INVITE too; its entries do not change the route set (12.2),
    but copying them back is what the proxy expects.
    """
    try:
        return [("Record-Route", v) for v in record_route(req)]
    except UriError:
        return []


def _allows(req: SipMessage, method: str) -> bool:
    """The request's Allow header lists ``method``."""
    return method in (m.strip().upper() for m in (req.get("Allow") or "").split(","))


def _short(text: str, limit: int = 80) -> str:
    """A caller-supplied string for a log line: repr'd (no control characters) and bounded."""
    return repr(text[:limit]) + ("…" if len(text) > limit else "")


def _resolve(fut: asyncio.Future[int], value: int) -> None:
    if not fut.done():
        fut.set_result(value)


def _rpc_text(exc: BaseException) -> str:
    if isinstance(exc, grpc.aio.AioRpcError):
        return f"{exc.code().name}: {exc.details()}"
    return str(exc) or type(exc).__name__
