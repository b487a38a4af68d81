"""The call leg: one SIP call's media and its gateway side, from answer to teardown.

Per call: RTP audio in → jitter buffer → the gateway call's audio; the gateway's audio → 20 ms
RTP; transcripts and keys → the bot (``voxgate_client.BotLink``) → speech; an interruption
drops the queued RTP. Either side hanging up ends the other: BYE → hang-up; the gateway
stream's end or error → BYE.

Setup opens the RTP socket and the ``Converse`` call before the 200 OK (a gateway that does
not answer in ``gateway_timeout_s`` gets the caller 503), and no RTP is sent before the ACK
that carries our To-tag. Teardown sends the BYE, hangs the gateway call up after the caller's
last queued audio, closes the bot link and releases the RTP port.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import Counter, deque
from collections.abc import Awaitable, Callable

import grpc

from voxgate.bridges.sip._call import Ended, ReferOutcome, SipCall, until_ended
from voxgate.bridges.sip._config import BridgeConfig
from voxgate.bridges.sip._dialogs import Dialogs
from voxgate.bridges.sip._media import SILENCE, RtpSession, bind_rtp_socket
from voxgate.bridges.sip._message import header_uri
from voxgate.bridges.sip._rtp import DtmfEvent
from voxgate.bridges.sip._timers import CallTimers
from voxgate.bridges.sip._transactions import Transactions
from voxgate.v1 import voxgate_pb2 as pb
from voxgate_client import (
    AudioOut,
    BotHandler,
    BotLink,
    BotPolicy,
    CallConfig,
    CallEndedError,
    CallInfo,
    EncodingName,
    ErrorEvent,
    PlaybackInterrupted,
    ServerEvent,
    Transcript,
    TransferResult,
    TurnOptions,
    VoxgateClient,
    VoxgateError,
)
from voxgate_client._common.aio import cancel_and_wait

__all__ = ["CallLeg"]

log = logging.getLogger("voxgate.sip")


class CallLeg:
    """Sets up, runs and tears down every call of one bridge on its media and gateway side.

    Args:
        config: the bridge's settings.
        stats: the bridge's counters.
        tx: the transaction layer (the INVITE's 180, 200 or failure response).
        dialogs: the dialog layer (our SDP and 2xx headers, the BYE at teardown).
        timers: the calls' timers (started at the answer, cancelled at teardown).
        client: the gateway client every call's ``Converse`` opens on; None until the bridge
            starts (a call then gets 503).
        bot: the bot every call is handed to (see :class:`~voxgate.bridges.sip.SipBridge`).
        bot_policy: what happens to a call whose bot misbehaves.
        on_event: the bridge's observer of every gateway event.
        transfer: the bridge's blind transfer (the bot's transfer requests go there).
        calls: the bridge's calls by Call-ID (a call leaves it when its teardown is done).
        ended: the bridge's record of ended calls (Call-ID, reason).
    """

    def __init__(  # noqa: PLR0913  # the bridge's parts, each passed in once
        self,
        config: BridgeConfig,
        stats: Counter[str],
        *,
        tx: Transactions,
        dialogs: Dialogs,
        timers: CallTimers,
        client: VoxgateClient | None,
        bot: BotHandler | str,
        bot_policy: BotPolicy,
        on_event: Callable[[str, ServerEvent], None] | None,
        transfer: Callable[[str, str], Awaitable[ReferOutcome]],
        calls: dict[str, SipCall],
        ended: deque[tuple[str, str]],
    ) -> None:
        self._config = config
        self._stats = stats
        self._tx = tx
        self._dialogs = dialogs
        self._timers = timers
        self.client = client
        self._bot = bot
        self._bot_policy = bot_policy
        self._on_event = on_event
        self._transfer = transfer
        self._calls = calls
        self._ended = ended
        #: Each call's supervisor task (setup, the call, teardown); shutdown awaits them.
        self.supervisors: set[asyncio.Task[None]] = set()

    def begin(self, call: SipCall) -> None:
        """Start the call's supervisor: setup, wait for either side to end it, teardown."""
        task = asyncio.create_task(self._supervise(call), name=f"sip-call-{call.call_id}")
        self.supervisors.add(task)
        task.add_done_callback(self.supervisors.discard)

    def confirm(self, call: SipCall) -> None:
        """The ACK of our 200 OK came: the call is confirmed and RTP may flow."""
        call.state = "confirmed"
        call.confirmed.set()
        log.info("call %s confirmed (ACK)", call.call_id)
        if call.media is not None:
            call.media.arm()  # the first moment we may send RTP
        call.rtp_since = asyncio.get_running_loop().time()
        self._timers.arm_rtp_check(call)

    async def _supervise(self, call: SipCall) -> None:
        """Set the call up, wait for either side to end it, then tear everything down."""
        try:
            if await self._setup(call):
                await call.ended.wait()
        except Exception:  # a bug in one call must not leak past it
            log.exception("call %s failed", call.call_id)
            call.end("internal error", bye=True)
        finally:
            await self._teardown(call)

    def _unavailable(self, call: SipCall) -> None:
        self._tx.final(
            call.invite,
            call.source,
            503,
            "Service Unavailable",
            call.local_tag,
            [("Retry-After", str(self._config.retry_after_s))],
        )

    async def _setup(self, call: SipCall) -> bool:
        req, src = call.invite, call.source
        cfg = self._config
        try:
            sock = bind_rtp_socket(cfg.listen_host, cfg.rtp_port_min, cfg.rtp_port_max)
        except OSError as exc:
            log.error("call %s: %s", call.call_id, exc)
            self._unavailable(call)
            return False
        call.media = RtpSession(
            sock,
            encoding=call.choice.encoding,
            payload_type=call.choice.payload_type,
            dtmf_payload_type=call.choice.dtmf_payload_type,
            remote=call.choice.remote,
            on_audio=lambda frame: self._caller_audio(call, frame),
            on_dtmf=lambda ev: self.caller_dtmf(call, ev),
            jitter_ms=cfg.jitter_ms,
            symmetric=cfg.symmetric_rtp,
            # Behind NAT, RTP comes from the host the INVITE came from, not the SDP's c=.
            trusted_hosts=frozenset({src[0]}),
            latch_probation=cfg.latch_probation,
        )
        call.media.sending_enabled = call.choice.we_send
        try:
            await until_ended(call, self._open_gateway(call), cfg.gateway_timeout_s)
        except (Ended, VoxgateError, OSError) as exc:
            if call.ended.is_set():
                self._tx.final(req, src, 487, "Request Terminated", call.local_tag)
            else:
                log.warning(
                    "call %s: gateway %s did not start the call: %s",
                    call.call_id,
                    cfg.gateway,
                    _rpc_text(exc),
                )
                self._unavailable(call)
            return False
        if cfg.ring_ms:
            call.state = "ringing"
            self._tx.respond(
                req,
                src,
                180,
                "Ringing",
                to_tag=call.local_tag,
                headers=[
                    *[("Record-Route", v) for v in call.route_set],  # an early dialog's route
                    ("Contact", call.contact),
                ],
            )
            with contextlib.suppress(Ended):
                await until_ended(call, asyncio.sleep(cfg.ring_ms / 1000), None)
        if call.ended.is_set():
            self._tx.final(req, src, 487, "Request Terminated", call.local_tag)
            return False
        await call.media.start()
        call.state = "answered"
        self._tx.final(
            req,
            src,
            200,
            "OK",
            call.local_tag,
            self._dialogs.answer_headers(call),
            body=self._dialogs.sdp(call),
            call=call,
        )
        self._timers.answered(call)
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

    async def _open_gateway(self, call: SipCall) -> None:
        """Start the call's Converse stream (voxgate_client: its status handling, its errors)."""
        if self.client is None:
            raise OSError("no gateway channel (bridge not started)")
        cfg = self._config
        enc: EncodingName = "alaw" if call.choice.encoding == "PCMA" else "mulaw"
        call.gw = await self.client.converse(
            CallConfig(
                encoding=enc,
                sample_rate_hz=8000,
                language=cfg.language,
                voice=cfg.voice,
                call_id=call.call_id,
                echo_handling=cfg.echo_handling or None,
                turns=TurnOptions(mode=cfg.turns or None, eagerness=cfg.turn_eagerness),
            )
        )
        assert call.gw.session is not None
        self._observe(call, call.gw.session)

    def _bot_info(self, call: SipCall) -> CallInfo:
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

    async def _bot_transfer(self, call: SipCall, target_uri: str) -> TransferResult:
        """The link's transfer hook: REFER (the bridge's ``transfer``) as a ``TransferResult``."""
        outcome = await self._transfer(call.call_id, target_uri)
        if outcome.ok:
            code = grpc.StatusCode.OK
        elif outcome.status == 400:
            code = grpc.StatusCode.INVALID_ARGUMENT
        elif outcome.status == 408:
            code = grpc.StatusCode.DEADLINE_EXCEEDED
        else:
            code = grpc.StatusCode.FAILED_PRECONDITION
        return TransferResult("", code, outcome.reason, outcome.status)

    async def _run_link(self, call: SipCall) -> None:
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

    def _observe(self, call: SipCall, event: ServerEvent) -> None:
        if self._on_event is not None:
            try:
                self._on_event(call.call_id, event)
            except Exception:  # an observer's bug must not end the call
                log.exception("on_event observer failed")

    async def _teardown(self, call: SipCall) -> None:
        if call.send_bye and call.state == "answered" and self._tx.awaiting_ack(call):
            # RFC 3261 15: no BYE before the ACK of our 2xx (a bot may hang up at once); the
            # 200 keeps being resent meanwhile, and its 64*T1 timeout bounds the wait.
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(call.confirmed.wait(), 64 * self._config.t1_ms / 1000)
        prev, call.state = call.state, "ended"
        self._timers.cancel_all(call)
        if not call.ended.is_set():
            call.end("setup failed", bye=False)
        log.info("call %s ended: %s", call.call_id, call.end_reason)
        self._ended.append((call.call_id, call.end_reason))
        if call.send_bye and prev in ("answered", "confirmed"):
            self._dialogs.send_bye(call)
        if prev == "answered":  # stop resending the 200 once we hang up
            self._tx.ack(call.call_id, call.invite.cseq()[0])
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
        await cancel_and_wait(*call.tasks)
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
            self._stats["rtp_dropped_foreign"] += st.dropped_foreign
            await call.media.aclose()
        if self._calls.get(call.call_id) is call:
            del self._calls[call.call_id]

    # -- caller → gateway -------------------------------------------------------------------------

    def _put(self, call: SipCall, req: pb.ConverseRequest) -> None:
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

    def _caller_audio(self, call: SipCall, frame: bytes) -> None:
        if call.state in ("answered", "confirmed"):
            self._put(call, pb.ConverseRequest(audio=pb.AudioChunk(data=frame)))

    def caller_dtmf(self, call: SipCall, ev: DtmfEvent) -> None:
        """A key press (RFC 4733 or SIP INFO), for the gateway."""
        if self._config.log_content:
            log.info("call %s: DTMF %s (%d ms)", call.call_id, ev.digit, ev.duration_ms)
        else:
            log.debug("call %s: DTMF key (%d ms)", call.call_id, ev.duration_ms)
        self._put(
            call, pb.ConverseRequest(dtmf=pb.Dtmf(digit=ev.digit, duration_ms=ev.duration_ms))
        )

    def hold_keepalive(self, call: SipCall) -> None:
        """20 ms of silence for the gateway while the media is on hold (its idle timeout)."""
        frame = bytes([SILENCE[call.choice.encoding]]) * 160
        self._put(call, pb.ConverseRequest(audio=pb.AudioChunk(data=frame)))

    async def _gateway_writer(self, call: SipCall) -> None:
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

    # -- gateway → caller -------------------------------------------------------------------------

    def _on_gateway(self, call: SipCall, event: ServerEvent) -> None:
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
        elif isinstance(event, Transcript) and event.is_final and self._config.log_content:
            log.info("call %s: caller said %r", call.call_id, event.text)
        elif isinstance(event, ErrorEvent):
            log.warning(
                "call %s: gateway error event %s %s (%s)",
                call.call_id,
                event.code.name,
                event.message,
                event.scope,
            )


def _rpc_text(exc: BaseException) -> str:
    if isinstance(exc, grpc.aio.AioRpcError):
        return f"{exc.code().name}: {exc.details()}"
    return str(exc) or type(exc).__name__
