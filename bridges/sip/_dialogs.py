"""SIP dialogs (RFC 3261 12): the requests inside a call, both ways.

From the caller: re-INVITE and UPDATE (a target refresh, a session refresh and/or new media;
only new media re-opens the RTP latch), INFO (a key press), NOTIFY (a transfer's progress)
and BYE. From us: BYE, REFER (a blind transfer, RFC 3515) and session refreshes when we are
the refresher (RFC 4028: UPDATE when the caller allows it, else a re-INVITE). Our requests go
to the validated remote target through the route set (loose routing).
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import logging
import socket
from collections import Counter
from collections.abc import Callable

from voxgate.bridges.sip._call import (
    ALLOW,
    SUPPORTED,
    USER_AGENT,
    Ended,
    Refer,
    ReferOutcome,
    SipCall,
    allows,
    short,
    until_ended,
)
from voxgate.bridges.sip._config import BridgeConfig
from voxgate.bridges.sip._message import (
    DTMF_INFO_TYPES,
    DtmfInfoError,
    SipMessage,
    UriError,
    contact_uri,
    new_branch,
    next_hop,
    option_tags,
    parse_dtmf_info,
    parse_sip_uri,
    parse_sipfrag,
    record_route,
)
from voxgate.bridges.sip._rtp import DtmfEvent
from voxgate.bridges.sip._sdp import MediaChoice, SdpError, build_answer, negotiate, parse_sdp
from voxgate.bridges.sip._session_timer import (
    SessionIntervalTooSmall,
    SessionTimer,
    SessionTimerError,
    negotiate_session_timer,
)
from voxgate.bridges.sip._timers import CallTimers
from voxgate.bridges.sip._transactions import Transactions

__all__ = ["Dialogs"]

log = logging.getLogger("voxgate.sip")

#: A refusal of an in-dialog offer: (status, reason, headers).
Refusal = tuple[int, str, list[tuple[str, str]]]


class Dialogs:
    """In-dialog requests of every call of one bridge.

    Args:
        config: the bridge's settings (session timer limits).
        stats: the bridge's counters (``bye_sent``, ``refer_sent``, ``session_refreshed``, ...).
        tx: the transaction layer every response and request goes through.
        timers: the calls' timers (an accepted refresh or new media re-arms them).
        on_dtmf: a key press from an INFO, for the gateway (as an RFC 4733 one is).
    """

    def __init__(
        self,
        config: BridgeConfig,
        stats: Counter[str],
        tx: Transactions,
        timers: CallTimers,
        *,
        on_dtmf: Callable[[SipCall, DtmfEvent], None],
    ) -> None:
        self._config = config
        self._stats = stats
        self._tx = tx
        self._timers = timers
        self._on_dtmf = on_dtmf
        #: Requests we sent in the background (BYEs, session refreshes); shutdown awaits them.
        self.pending: set[asyncio.Task[None]] = set()

    def session_timer(self, req: SipMessage) -> SessionTimer | None:
        """The session timer an INVITE/UPDATE asks for (RFC 4028), within our limits.

        Raises:
            SessionIntervalTooSmall: below ``min_se_s`` (422 with Min-SE).
            SessionTimerError: unreadable headers (400).
        """
        tags = option_tags(req.get("Supported")) + option_tags(req.get("Require"))
        return negotiate_session_timer(
            req.get("Session-Expires"),
            req.get("Min-SE"),
            uac_supports="timer" in tags,
            default_s=self._config.session_expires_s,
            min_se_s=self._config.min_se_s,
        )

    # -- answers ----------------------------------------------------------------------------------

    def sdp(self, call: SipCall) -> bytes:
        """Our SDP answer for the call's current media (its version as the call counts it)."""
        assert call.media is not None
        return build_answer(
            call.choice,
            call.local_ip,
            call.media.local_port,
            session_id=call.session_id,
            version=call.sdp_version,
        )

    def answer_headers(self, call: SipCall, req: SipMessage | None = None) -> list[tuple[str, str]]:
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
            ("Contact", call.contact),
            ("Allow", ALLOW),
            ("Supported", SUPPORTED),
            *(call.session_timer.response_headers() if call.session_timer else []),
            ("Content-Type", "application/sdp"),
        ]

    # -- requests from the caller -----------------------------------------------------------------

    def on_reinvite(self, call: SipCall | None, req: SipMessage, source: tuple[str, int]) -> None:
        """A re-INVITE (``call`` None: no such dialog): new media, target or session refresh."""
        if call is None or call.media is None:
            self._tx.respond(req, source, 481, "Call/Transaction Does Not Exist")
            return
        refused = self._in_dialog_offer(call, req, "re-INVITE")
        if refused is not None:
            self._tx.final(req, source, *refused[:2], call.local_tag, refused[2])
            return
        call.sdp_version += 1
        self._tx.final(
            req,
            source,
            200,
            "OK",
            call.local_tag,
            self.answer_headers(call, req),
            body=self.sdp(call),
        )

    def on_update(self, call: SipCall, req: SipMessage, source: tuple[str, int]) -> None:
        """RFC 3311 UPDATE: a session refresh (RFC 4028) and/or a new offer, no ACK."""
        if call.media is None:
            self._tx.respond(req, source, 481, "Call/Transaction Does Not Exist")
            return
        refused = self._in_dialog_offer(call, req, "UPDATE")
        if refused is not None:
            self._tx.respond(req, source, refused[0], refused[1], headers=refused[2])
            return
        headers = [
            *_record_route_copy(req),
            ("Contact", call.contact),
            ("Supported", SUPPORTED),
            *(call.session_timer.response_headers() if call.session_timer else []),
        ]
        body = b""
        if req.body:
            call.sdp_version += 1
            headers.append(("Content-Type", "application/sdp"))
            body = self.sdp(call)
        self._tx.respond(req, source, 200, "OK", headers=headers, body=body)

    def on_info(self, call: SipCall, req: SipMessage, source: tuple[str, int]) -> None:
        """SIP INFO: a key press as ``application/dtmf-relay`` or ``application/dtmf``.

        It reaches the gateway exactly as an RFC 4733 key press does. An INFO with no body is
        a keep-alive some phones send (200); another body type gets 415 with the types we
        read; a body we cannot read gets 400, and the call goes on.
        """
        if not req.body.strip():
            self._tx.respond(req, source, 200, "OK")
            return
        try:
            digit, duration_ms = parse_dtmf_info(req.get("Content-Type"), req.body)
        except DtmfInfoError as exc:
            self._stats["info_refused"] += 1
            if exc.status == 415:
                accept = [("Accept", ", ".join(DTMF_INFO_TYPES))]
                self._tx.respond(req, source, 415, "Unsupported Media Type", headers=accept)
            else:
                self._tx.respond(req, source, 400, f"Bad Request ({exc})")
            return
        self._tx.respond(req, source, 200, "OK")
        self._stats["dtmf_info"] += 1
        if call.state in ("answered", "confirmed"):
            self._on_dtmf(call, DtmfEvent(digit, duration_ms))

    def on_notify(self, call: SipCall, req: SipMessage, source: tuple[str, int]) -> None:
        """NOTIFY of a REFER's implicit subscription (RFC 3515 2.4.4): the transfer's progress.

        The sipfrag's status line says how the transferee's call to the target goes: 1xx is
        progress, 2xx success, anything else failure. A ``terminated`` subscription without a
        final status is a failure too.
        """
        event = (req.get("Event") or "").split(";", 1)[0].strip().lower()
        if event != "refer":
            self._tx.respond(req, source, 489, "Bad Event", headers=[("Allow-Events", "refer")])
            return
        refer = call.refer
        if refer is None or refer.done.done():
            self._tx.respond(req, source, 481, "Subscription Does Not Exist")
            return
        self._tx.respond(req, source, 200, "OK")
        frag = parse_sipfrag(req.body)
        state = (req.get("Subscription-State") or "").split(";", 1)[0].strip().lower()
        if frag is not None:
            log.info("call %s: transfer NOTIFY %d %s", call.call_id, frag[0], frag[1])
        if frag is not None and frag[0] >= 200:
            refer.done.set_result(ReferOutcome(200 <= frag[0] < 300, frag[0], frag[1]))
        elif state == "terminated":
            reason = "subscription terminated without a final status"
            refer.done.set_result(ReferOutcome(False, 0, reason))

    def _in_dialog_offer(self, call: SipCall, req: SipMessage, what: str) -> Refusal | None:
        """Check, then apply, a re-INVITE or UPDATE: target refresh, session timer, new media.

        Returns the refusal (status, reason, headers) when any part is unacceptable; nothing
        is applied then. Accepted, it counts as a session refresh (RFC 4028 re-arms the timer).
        """
        target = None
        if req.get("Contact") is not None:
            try:
                target = contact_uri(req.get("Contact"))
            except UriError as exc:
                self._stats["bad_contact"] += 1
                return 400, f"Bad Contact ({exc})", []
        try:
            timer = self.session_timer(req)
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
            call.peer_allows_update = allows(req, "UPDATE")
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
                self._timers.arm_rtp_check(call)
            log.info("%s %s: %s to %s:%d", what, call.call_id, choice.direction, *choice.remote)
        if timer is not None or call.session_timer is not None:
            self._stats["session_refreshed"] += 1
        call.session_timer = timer
        self._timers.arm_session(call)
        return None

    # -- requests from us -------------------------------------------------------------------------

    def _request(
        self,
        call: SipCall,
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
        hop = next_hop(call.route_set, call.remote_target)
        req = SipMessage(method=method, uri=hop.request_uri, body=body)
        req.add("Via", f"SIP/2.0/UDP {call.local_ip}:{call.local_port};branch={branch};rport")
        req.add("Max-Forwards", "70")
        for route in hop.routes:
            req.add("Route", route)
        req.add("From", call.to_header)
        req.add("To", call.invite.get("From") or "")
        req.add("Call-ID", call.call_id)
        req.add("CSeq", f"{call.local_cseq} {method}")
        call.local_cseq += 1
        req.add("User-Agent", USER_AGENT)
        for k, v in headers or []:
            req.add(k, v)
        return req, branch

    async def _transact(self, call: SipCall, req: SipMessage, branch: str) -> int:
        """Send an in-dialog request until its final response (408 after 64*T1); the status."""
        try:
            dest = await self._first_hop(call)
        except OSError as exc:  # RFC 3261 8.1.3.1: a transport failure counts as 503
            log.warning("call %s: %s not sent: %s", call.call_id, req.method, exc)
            return 503
        return await self._tx.request(req, branch, dest, via=f"{call.local_ip}:{call.local_port}")

    async def _first_hop(self, call: SipCall) -> tuple[str, int]:
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
            raise OSError(f"route host {short(hop.host)} has no address")
        return str(infos[0][4][0]), int(infos[0][4][1])

    def send_bye(self, call: SipCall) -> None:
        """Hang up: BYE in the background (its answer is logged)."""
        req, branch = self._request(call, "BYE")
        self._stats["bye_sent"] += 1

        async def run() -> None:
            status = await self._transact(call, req, branch)
            log.info("BYE %s answered %d", call.call_id, status)

        task = asyncio.create_task(run(), name=f"sip-bye-{call.call_id}")
        self.pending.add(task)
        task.add_done_callback(self.pending.discard)

    async def transfer(
        self, call: SipCall | None, target: str, *, timeout_s: float
    ) -> ReferOutcome:
        """Blind-transfer a call (RFC 3515): REFER the caller to ``target`` and await NOTIFY.

        See :meth:`voxgate.bridges.sip.SipBridge.transfer`; ``call`` None: no such call.
        """
        if call is not None and call.state == "answered":
            # The bot starts on our 200 OK, so it may ask before the caller's ACK is in; the
            # REFER waits for it (the 200's retransmissions end the call if it never comes).
            with contextlib.suppress(Ended):
                await until_ended(call, call.confirmed.wait(), None)
        if call is None or call.state != "confirmed" or call.ended.is_set():
            self._stats["transfer_failed"] += 1
            return ReferOutcome(False, 481, "call is not up")
        try:
            uri = parse_sip_uri(target)
        except UriError as exc:
            self._stats["transfer_failed"] += 1
            return ReferOutcome(False, 400, f"bad transfer target ({exc})")
        if call.refer is not None:
            self._stats["transfer_failed"] += 1
            return ReferOutcome(False, 491, "a transfer is already in progress")
        me = call.contact
        headers = [("Refer-To", f"<{uri.text}>"), ("Referred-By", me), ("Contact", me)]
        req, branch = self._request(call, "REFER", headers)
        refer = Refer(asyncio.get_running_loop().create_future(), req.cseq()[0])
        call.refer = refer  # before sending: a NOTIFY may overtake the 202 on UDP
        self._stats["refer_sent"] += 1
        log.info("call %s: REFER to %s", call.call_id, short(uri.text))
        try:
            status = await until_ended(call, self._transact(call, req, branch), None)
            if not 200 <= status < 300:
                result = ReferOutcome(False, status, "REFER refused")
            else:
                try:
                    result = await until_ended(call, asyncio.shield(refer.done), timeout_s)
                except Ended:
                    if call.ended.is_set():
                        raise
                    result = ReferOutcome(False, 408, "no final NOTIFY in time")
        except Ended:
            result = ReferOutcome(False, 487, "the call ended during the transfer")
        finally:
            call.refer = None
            if not refer.done.done():
                refer.done.cancel()
        self._stats["transferred" if result.ok else "transfer_failed"] += 1
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

    def refresh_session(self, call: SipCall) -> None:
        """We refresh the session (RFC 4028 7.4): UPDATE when the caller allows it.

        Otherwise a re-INVITE with our unchanged SDP. A refusal or no answer ends the call;
        491 (glare) retries.
        """
        st = call.session_timer
        if st is None or call.ended.is_set() or call.state != "confirmed":
            return
        headers = [("Session-Expires", st.header()), ("Supported", SUPPORTED)]
        headers.append(("Contact", call.contact))
        body = b""
        if call.peer_allows_update:
            method = "UPDATE"
        else:
            method = "INVITE"
            headers += [("Allow", ALLOW), ("Content-Type", "application/sdp")]
            body = self.sdp(call)  # the same version: the media does not change
        req, branch = self._request(call, method, headers, body)
        self._stats["session_refresh_sent"] += 1

        async def run() -> None:
            status = await self._transact(call, req, branch)
            if call.ended.is_set():
                return
            if 200 <= status < 300:
                self._timers.arm_session(call)
            elif status == 491:  # glare: try again shortly (RFC 3261 14.1)
                self._timers.arm(call, "session", 1.0, lambda: self.refresh_session(call))
            else:
                self._stats["session_refresh_failed"] += 1
                call.end(f"session refresh ({method}) answered {status}", bye=True)

        task = asyncio.create_task(run(), name=f"sip-refresh-{call.call_id}")
        self.pending.add(task)
        task.add_done_callback(self.pending.discard)


def _record_route_copy(req: SipMessage) -> list[tuple[str, str]]:
    """Record-Route of an in-dialog request, for its 2xx (nothing when it does not validate).

    A proxy may record-route a re-INVITE too; its entries do not change the route set (12.2),
    but copying them back is what the proxy expects.
    """
    try:
        return [("Record-Route", v) for v in record_route(req)]
    except UriError:
        return []
