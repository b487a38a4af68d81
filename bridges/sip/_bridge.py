"""The SIP bridge: a UDP SIP UAS (RFC 3261 subset) with one gateway ``Converse`` stream per call.

:class:`SipBridge` reads each datagram, routes each request and wires the bridge's parts:

* :mod:`~voxgate.bridges.sip._transactions`: responses, their retransmission until the ACK,
  retransmitted requests answered from the cache, CANCEL, our own requests;
* :mod:`~voxgate.bridges.sip._dialogs`: requests inside a call (re-INVITE, UPDATE, INFO,
  NOTIFY; our BYE, REFER and session refreshes);
* :mod:`~voxgate.bridges.sip._timers`: per-call timers (maximum duration, RTP inactivity,
  session expiry);
* :mod:`~voxgate.bridges.sip._call_leg`: the media and the gateway side of each call (setup,
  the ``Converse`` call, the bot link, teardown).

The SIP transport and the gateway client are passed in (by default the bridge binds its UDP
socket and opens its gateway channel in :meth:`SipBridge.start`).

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
import logging
import socket
from collections import Counter, deque
from collections.abc import Callable
from typing import Protocol

import grpc

from voxgate.bridges.sip._call import ALLOW, SUPPORTED, ReferOutcome, SipCall, allows, short
from voxgate.bridges.sip._call_leg import CallLeg
from voxgate.bridges.sip._config import BridgeConfig
from voxgate.bridges.sip._dialogs import Dialogs
from voxgate.bridges.sip._message import (
    SipMessage,
    SipParseError,
    UriError,
    contact_uri,
    header_tag,
    header_uri,
    new_tag,
    option_tags,
    parse_sip_uri,
    record_route,
    reply_address,
)
from voxgate.bridges.sip._rtp import DtmfEvent
from voxgate.bridges.sip._sdp import SdpError, negotiate, parse_sdp
from voxgate.bridges.sip._session_timer import SessionIntervalTooSmall, SessionTimerError
from voxgate.bridges.sip._timers import CallTimers
from voxgate.bridges.sip._transactions import Transactions
from voxgate_client import (
    BotHandler,
    BotPolicy,
    ServerEvent,
    VoxgateClient,
    VoxgateError,
    tls_credentials,
)
from voxgate_client._common.aio import cancel_and_wait

__all__ = ["BridgeConfig", "ReferOutcome", "SipBridge", "SipTransport", "gateway_client"]

log = logging.getLogger("voxgate.sip")

#: Longest Call-ID accepted on an INVITE (it is logged and copied into every request of the call).
_MAX_CALL_ID = 256


class SipTransport(Protocol):
    """Where the bridge's SIP datagrams go: an ``asyncio.DatagramTransport``, or a test's fake."""

    def sendto(self, data: bytes, addr: tuple[str, int]) -> None:
        """Send one datagram to ``addr``."""

    def close(self) -> None:
        """Stop sending (the bridge's shutdown)."""


def gateway_client(config: BridgeConfig) -> VoxgateClient:
    """The gateway client a bridge opens when none is passed in: TLS and token from ``config``."""
    tls: bool | grpc.ChannelCredentials = config.gateway_tls
    if config.gateway_tls_ca is not None or config.gateway_tls_cert is not None:
        tls = tls_credentials(
            config.gateway_tls_ca, config.gateway_tls_cert, config.gateway_tls_key
        )
    token = config.gateway_token.get_secret_value() if config.gateway_token else None
    return VoxgateClient(config.gateway, tls, token)


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
        transport: where SIP datagrams are sent. None (the default): :meth:`start` binds a
            UDP socket on ``listen_host:listen_port``. Given, :meth:`start` binds nothing and
            whoever owns the transport feeds received datagrams to :meth:`datagram_received`.
            Either way :meth:`aclose` closes it.
        client: the gateway client every call's ``Converse`` opens on. None (the default):
            :meth:`start` opens one from the config (:func:`gateway_client`). Either way
            :meth:`aclose` closes it.
    """

    def __init__(
        self,
        config: BridgeConfig,
        bot: BotHandler | str,
        *,
        on_event: Callable[[str, ServerEvent], None] | None = None,
        bot_policy: BotPolicy | None = None,
        transport: SipTransport | None = None,
        client: VoxgateClient | None = None,
    ) -> None:
        self.config = config
        self._transport = transport
        self._bind = transport is None
        self._accepting = True
        self.calls: dict[str, SipCall] = {}
        self.address: tuple[str, int] = (config.listen_host, config.listen_port)
        #: Event counters (``requests``, ``malformed``, ``retransmitted``, ``bye_sent``, ...).
        self.stats: Counter[str] = Counter()
        #: (Call-ID, reason) of the most recent ended calls, oldest first.
        self.ended: deque[tuple[str, str]] = deque(maxlen=1000)
        self._tx = Transactions(config, self.stats, self._send)
        # The parts call back into parts built after them through the bridge's _refresh_due,
        # _hold_keepalive and _info_dtmf (each part is built once, with what it uses).
        self._timers = CallTimers(
            config, self.stats, refresh=self._refresh_due, keepalive=self._hold_keepalive
        )
        self._dialogs = Dialogs(
            config,
            self.stats,
            self._tx,
            self._timers,
            on_dtmf=self._info_dtmf,
        )
        self._leg = CallLeg(
            config,
            self.stats,
            tx=self._tx,
            dialogs=self._dialogs,
            timers=self._timers,
            client=client,
            bot=bot,
            bot_policy=bot_policy or BotPolicy(),
            on_event=on_event,
            transfer=self.transfer,
            calls=self.calls,
            ended=self.ended,
        )

    def _refresh_due(self, call: SipCall) -> None:
        self._dialogs.refresh_session(call)

    def _hold_keepalive(self, call: SipCall) -> None:
        self._leg.hold_keepalive(call)

    def _info_dtmf(self, call: SipCall, event: DtmfEvent) -> None:
        self._leg.caller_dtmf(call, event)

    # -- lifecycle --------------------------------------------------------------------------------

    async def start(self) -> None:
        """Bind the SIP socket and open the gateway channel (unless they were passed in)."""
        if self._bind:
            loop = asyncio.get_running_loop()
            transport, _ = await loop.create_datagram_endpoint(
                lambda: _SipProtocol(self),
                local_addr=(self.config.listen_host, self.config.listen_port),
            )
            self._transport = transport
            host, port = transport.get_extra_info("sockname")[:2]
            self.address = (str(host), int(port))
        if self._leg.client is None:
            self._leg.client = gateway_client(self.config)
        await self._probe_gateway()
        log.info("SIP bridge on udp %s:%d → gateway %s", *self.address, self.config.gateway)

    async def _probe_gateway(self) -> None:
        """Say at start-up, not at the first call, when the gateway refuses us or has no voice.

        Each call's session says whether it has a voice (the link then drops the bot's speech,
        logged once); this only makes a misconfiguration visible early. Never fatal: the
        gateway may come up after the bridge.
        """
        client = self._leg.client
        assert client is not None
        try:
            voices = await asyncio.wait_for(client.list_voices(), 2.0)
        except (VoxgateError, TimeoutError) as exc:
            why = exc.code.name if isinstance(exc, VoxgateError) else "no answer in 2 s"
            log.warning("gateway %s: ListVoices failed (%s)", self.config.gateway, why)
            return
        if not voices:
            log.warning(
                "gateway %s has no voice: bot replies are logged, not spoken", self.config.gateway
            )

    def stop_accepting(self) -> None:
        """Refuse new calls from now on (503 with Retry-After); calls in progress go on.

        The first step of :meth:`aclose`; a process that drains its calls first calls it alone.
        """
        self._accepting = False

    async def aclose(self) -> None:
        """Graceful shutdown: refuse new calls, end every call with BYE, wait for the answers."""
        self.stop_accepting()
        for call in list(self.calls.values()):
            call.end("bridge shutting down", bye=True)
        supervisors, byes = self._leg.supervisors, self._dialogs.pending
        if supervisors:
            await asyncio.wait(set(supervisors), timeout=self.config.grace_s + 2)
        if byes:
            await asyncio.wait(set(byes), timeout=self.config.grace_s)
        tasks = [*supervisors, *byes]
        await cancel_and_wait(*tasks)
        for task in tasks:  # one that failed (a bug) still fails the shutdown
            if not task.cancelled() and (exc := task.exception()) is not None:
                raise exc
        self._tx.close()
        if self._transport is not None:
            self._transport.close()
            self._transport = None
        if self._leg.client is not None:
            await self._leg.client.aclose()
            self._leg.client = None

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
        return await self._dialogs.transfer(self.calls.get(call_id), target, timeout_s=timeout_s)

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
                self._tx.reply_bare(exc.message, source, 400, f"Bad Request ({exc})"[:100])
            return
        if msg.is_request:
            self.stats["requests"] += 1
            self._on_request(msg, source)
        else:
            self._tx.on_response(msg)

    def _send(self, data: bytes, dest: tuple[str, int]) -> None:
        if self._transport is not None:
            self._transport.sendto(data, dest)

    # -- requests ---------------------------------------------------------------------------------

    def _on_request(self, req: SipMessage, source: tuple[str, int]) -> None:
        method = req.method or ""
        if method == "ACK":
            self._on_ack(req)
            return
        key = self._tx.key(req, method)
        if self._tx.answer_retransmission(key):
            return
        if method == "CANCEL":
            self._tx.on_cancel(req, source)
            return
        respond = self._tx.respond
        require = req.get("Require")
        unsupported = [t.strip() for t in (require or "").split(",") if t.strip()]
        unsupported = [t for t in unsupported if t.lower() != "timer"]
        if unsupported:
            # Echo only well-formed short option tags, so the reply stays bounded.
            shown = ", ".join(t for t in option_tags(require) if t != "timer")
            respond(
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
                self._dialogs.on_reinvite(self._dialog(req), req, source)
        elif method == "OPTIONS":
            respond(
                req,
                source,
                200,
                "OK",
                to_tag=to_tag or new_tag(),
                headers=[
                    ("Allow", ALLOW),
                    ("Accept", "application/sdp"),
                    ("Supported", SUPPORTED),
                ],
            )
        elif method in ("BYE", "INFO", "UPDATE", "NOTIFY"):
            call = self._dialog(req)
            if call is None:
                respond(req, source, 481, "Call/Transaction Does Not Exist")
            elif method == "BYE":
                respond(req, source, 200, "OK")
                call.end("caller hung up (BYE)", bye=False)
            elif method == "UPDATE":
                self._dialogs.on_update(call, req, source)
            elif method == "NOTIFY":
                self._dialogs.on_notify(call, req, source)
            else:
                self._dialogs.on_info(call, req, source)
        else:
            respond(
                req,
                source,
                405,
                "Method Not Allowed",
                to_tag=to_tag or new_tag(),
                headers=[("Allow", ALLOW)],
            )

    def _dialog(self, req: SipMessage) -> SipCall | None:
        """The call an in-dialog request belongs to (Call-ID and both tags match), if any."""
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
        self._tx.ack(req.call_id, num)
        if call is not None and call.state == "answered" and num == call.invite.cseq()[0]:
            self._leg.confirm(call)

    def _on_invite(self, req: SipMessage, source: tuple[str, int], key: str) -> None:
        local_tag = new_tag()
        tx = self._tx
        tx.respond(req, source, 100, "Trying")
        tx.bind_call(key, None)
        retry_after = [("Retry-After", str(self.config.retry_after_s))]
        if not self._accepting:
            tx.final(req, source, 503, "Service Unavailable", local_tag, retry_after)
            return
        if req.call_id in self.calls:
            tx.final(req, source, 482, "Loop Detected", local_tag)
            return
        try:
            parse_sip_uri(req.uri or "")
        except UriError as exc:
            self.stats["bad_uri"] += 1
            if exc.unsupported_scheme:
                tx.final(req, source, 416, "Unsupported URI Scheme", local_tag)
            else:
                tx.final(req, source, 400, f"Bad Request-URI ({exc})", local_tag)
            return
        if len(req.call_id) > _MAX_CALL_ID:
            tx.final(req, source, 400, "Bad Request (Call-ID too long)", local_tag)
            return
        try:
            target = contact_uri(req.get("Contact"))
        except UriError as exc:
            # The reason is one of a few fixed phrases: the Contact itself is never echoed.
            self.stats["bad_contact"] += 1
            log.info("INVITE from %s:%d: bad Contact (%s)", *source, exc)
            tx.final(req, source, 400, f"Bad Contact ({exc})", local_tag)
            return
        try:
            routes = record_route(req)
        except UriError as exc:
            self.stats["bad_record_route"] += 1
            tx.final(req, source, 400, f"Bad Record-Route ({exc})", local_tag)
            return
        try:
            timer = self._dialogs.session_timer(req)
        except SessionIntervalTooSmall as exc:
            min_se = [("Min-SE", str(exc.min_se_s))]
            tx.final(req, source, 422, "Session Interval Too Small", local_tag, min_se)
            return
        except SessionTimerError as exc:
            tx.final(req, source, 400, f"Bad Request ({exc})", local_tag)
            return
        origin = ""
        try:
            sdp = parse_sdp(req.body) if req.body else None
            choice = negotiate(sdp) if sdp is not None else None
            origin = sdp.origin if sdp is not None else ""
        except SdpError as exc:
            log.info("INVITE %s: unreadable SDP (%s)", short(req.call_id), exc)
            choice = None
        if choice is None:
            warning = [("Warning", '305 voxgate "PCMU or PCMA at 8000 Hz required"')]
            tx.final(req, source, 488, "Not Acceptable Here", local_tag, warning)
            return
        if len(self.calls) >= self.config.max_calls:
            tx.final(req, source, 486, "Busy Here", local_tag, retry_after)
            return
        call = SipCall(
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
            peer_allows_update=allows(req, "UPDATE"),
            sdp_origin=origin,
            local_ip=self._local_ip(source[0]),
            local_port=self.address[1],
        )
        tx.bind_call(key, call)
        self.calls[call.call_id] = call
        self.stats["calls"] += 1
        self._leg.begin(call)
        log.info(
            "INVITE %s from %s (%s, contact %s%s%s)",
            call.call_id,
            short(header_uri(req.get("From") or "")),
            choice.encoding,
            target.text,
            f", session timer {timer.interval_s} s by {timer.refresher}" if timer else "",
            f", {len(routes)} Record-Route" if routes else "",
        )

    def _local_ip(self, peer_ip: str) -> str:
        """The address we write in Contact and SDP for a call from ``peer_ip``."""
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
