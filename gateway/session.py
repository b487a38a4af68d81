"""One call: the stages of :mod:`voxgate.gateway.call`, wired as an asyncio task graph.

The servicer turns protobuf messages into the events of :mod:`voxgate.gateway.events` and back;
nothing here knows about gRPC or protobuf. The session owns the call's life (its tasks, its
end, its limits in time) and routes events between the stages, each of which holds its own
state (see :mod:`voxgate.gateway.call`). One :class:`asyncio.TaskGroup` per call:

* ``recv`` reads client events; caller audio goes through ingress (checks, decode, echo,
  DTMF), the segmenter (cheap: tens of µs per 20 ms frame), then barge-in, speculation and
  turns; Speak, Mark and Clear go to playback;
* ``asr`` is recognition: utterances to the shared cross-call transcriber, in order, finals
  out; an ``interim`` task beside it re-decodes the growing utterance at low priority;
* ``tts`` is playback: queued Speak requests, paced at real time, the only task barge-in
  touches;
* ``send`` is the only writer to the client.

Queues between tasks are bounded, so a client that stops reading slows its own call down rather
than growing the server's memory. Cancelling the RPC cancels the group; teardown awaits every
task it cancelled.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable, Sequence

from voxgate.common.aio import cancel_and_wait
from voxgate.gateway.barge_in import BargeInPolicy
from voxgate.gateway.base import Synthesizer, Transcriber
from voxgate.gateway.call.barge_in import BargeIn
from voxgate.gateway.call.ingress import Ingress
from voxgate.gateway.call.interims import Interims
from voxgate.gateway.call.options import CallConfig
from voxgate.gateway.call.playback import Playback, SynthesisCap
from voxgate.gateway.call.queues import END, End
from voxgate.gateway.call.recognition import Recognition
from voxgate.gateway.call.turn_taking import EndOfTurnModel, TurnTaking
from voxgate.gateway.config import (
    LimitsConfig,
)
from voxgate.gateway.degrade import QualityLevel
from voxgate.gateway.dtmf import DtmfDigit
from voxgate.gateway.errors import CallError, ErrorKind
from voxgate.gateway.events import (
    AudioIn,
    ClearIn,
    DtmfIn,
    DtmfOut,
    ErrorOut,
    FlushIn,
    HangupIn,
    InboundEvent,
    MarkIn,
    OutboundEvent,
    QualityOut,
    RejectedSpeakIn,
    SpeakIn,
    SpeechOut,
)
from voxgate.gateway.metrics import GatewayMetrics
from voxgate.gateway.segmenter import (
    Segmenter,
    SpeechBegin,
    SpeechEnd,
    Utterance,
    VoiceDetector,
)

__all__ = ["CallConfig", "CallSession", "SynthesisCap", "write_stalled"]

log = logging.getLogger("voxgate.session")

# --- the call -----------------------------------------------------------------------------------


class _Shutdown:
    """``_next_event``'s result once the server asked the call to end (``CallSession.shutdown``)."""


_SHUTDOWN = _Shutdown()


class _FinalDecoded:
    """In the inbox when an utterance's final decode finished before the utterance ended.

    recv then ends the utterance at once if it may (:meth:`CallSession._end_early`) instead of
    at the next audio chunk, 20 ms later on a phone line.
    """


_FINAL_DECODED = _FinalDecoded()


class CallSession:
    """Runs one call. Create one per RPC, then ``await run(source, sink)``.

    Args:
        config: the call's effective settings.
        limits: per-call limits.
        transcriber: shared recogniser, or None when the server runs without ASR.
        synthesizer: shared voice, or None when the server runs without TTS.
        on_event: optional hook for metrics (called with every outbound event).
        log_id: the call's id in log lines (the server's session id).
        metrics: where to count speculation and final latency (a private registry if None).
        detector: the voice model behind the segmenter (default: the configured one).
        quality: the server's degradation level (gateway/degrade.py), read at every request so
            that shedding reaches calls in progress; full quality when omitted.
        realtime_slack_ms: audio this far ahead of the call's own clock makes it :attr:`bulk`.
        turn_model: the audio end-of-turn model ``smart`` turn detection consults, if any.
        declared_bulk: the client said it sends faster than real time (``voxgate-pacing:
            bulk``): the call is :attr:`bulk` from its start, until its pace says otherwise.
        opened_at: the loop's time when the call's stream opened, where the real-time-factor
            quota starts counting (see :class:`~voxgate.gateway.call.ingress.Ingress`); from
            the first audio chunk when omitted.
        alone: asked when a final is requested: whether the call has the server to itself
            (``VoiceGatewayServicer.alone``), so that its final may encode on every core
            (``AsrRequest.alone``); never when omitted.
        decode_budget_s: the recogniser's budget for one final's decode
            (``asr.policy.decode_budget_s``): the end of a turn that lost words waits that long
            for the turn decoded whole (``TurnTaking``).
    """

    def __init__(
        self,
        config: CallConfig,
        limits: LimitsConfig,
        transcriber: Transcriber | None,
        synthesizer: Synthesizer | None,
        *,
        on_event: Callable[[OutboundEvent], None] | None = None,
        log_id: str = "-",
        metrics: GatewayMetrics | None = None,
        detector: VoiceDetector | None = None,
        quality: QualityLevel | None = None,
        realtime_slack_ms: int = 2_000,
        turn_model: EndOfTurnModel | None = None,
        declared_bulk: bool = False,
        opened_at: float | None = None,
        alone: Callable[[], bool] | None = None,
        decode_budget_s: float = 2.0,
    ) -> None:
        self.config = config
        self._quality = quality if quality is not None else QualityLevel()
        self.log_id = log_id
        self._metrics = metrics if metrics is not None else GatewayMetrics()
        self.limits = limits
        self._transcriber = transcriber
        self._on_event = on_event
        self._ingress = Ingress(
            config,
            limits,
            plays_replies=config.mode == "converse" and synthesizer is not None,
            realtime_slack_ms=realtime_slack_ms,
            declared_bulk=declared_bulk,
            opened_at=opened_at,
        )
        self._segmenter = Segmenter(config.vad, detector)
        self._out: asyncio.Queue[OutboundEvent | End] = asyncio.Queue(maxsize=256)
        self._hangup = False
        # Segmenter events are produced synchronously and drained (awaiting queues) right after.
        self._pending_emits: list[OutboundEvent] = []
        self._pending_utts: list[Utterance] = []
        # The reader task feeds recv through this small queue; `end()` drops a _SHUTDOWN in
        # it, so recv never has to race two futures per message (that doubled the VAD path's
        # CPU per stream).
        self._inbox: asyncio.Queue[InboundEvent | None | _Shutdown | _FinalDecoded | Exception] = (
            asyncio.Queue(maxsize=8)
        )
        self._ending = False
        self._quality_pending = False
        self._idle_timer: asyncio.TimerHandle | None = None
        #: Why the call is being ended from the server side (shutdown, a limit), if it is.
        self._end_reason: CallError | None = None
        self._ended_by_server = False
        self._last_audio_at = 0.0
        self._player = Playback(
            config.playback,
            limits,
            synthesizer,
            converse=config.mode == "converse",
            quality=self._quality,
            emit=self._emit,
            start_reply=self._start_reply,
            frame_sent=self._ingress.frame_sent if self._ingress.echo_guard else None,
            log_id=log_id,
        )
        self._barge_in = BargeIn(config, self._segmenter, self._player)
        self._turns = TurnTaking(
            config.recognition.turns,
            self._segmenter,
            transcriber,
            turn_model,
            emit=self._emit,
            log_id=log_id,
            decode_budget_s=decode_budget_s,
        )
        self._recognition = Recognition(
            config,
            self._segmenter,
            transcriber,
            turns=self._turns,
            barge_in=self._barge_in,
            quality=self._quality,
            metrics=self._metrics,
            emit=self._emit,
            bulk=lambda: self._ingress.bulk,
            log_id=log_id,
            final_decoded=self._final_decoded,
            alone=alone,
        )
        self._interims = (
            Interims(
                config,
                self._segmenter,
                transcriber,
                recognition=self._recognition,
                barge_in=self._barge_in,
                quality=self._quality,
                emit=self._emit,
            )
            if transcriber is not None
            else None
        )

    @property
    def bulk(self) -> bool:
        """Whether the caller's audio runs ahead of real time now (see :attr:`Ingress.bulk`)."""
        return self._ingress.bulk

    def shutdown(self) -> None:
        """End the call for a server shutdown, losing no speech (see :meth:`end`)."""
        self.end(
            CallError(
                ErrorKind.UNAVAILABLE,
                "the server is shutting down; the call ended after its last utterance was "
                "transcribed (reconnect to another replica)",
            )
        )

    def end(self, reason: CallError) -> None:
        """End the call from the server side, losing no speech.

        The call stops reading, flushes its open utterance (SPEECH_END, then the final),
        stops playback, delivers every pending event and then :meth:`run` raises ``reason``.
        The first reason wins; safe to call from any task on the loop.
        """
        if self._end_reason is None:
            self._end_reason = reason
        self._ending = True
        # When the queue is full, recv is not waiting: it checks `_ending` after its next get.
        with contextlib.suppress(asyncio.QueueFull):
            self._inbox.put_nowait(_SHUTDOWN)

    async def run(
        self,
        source: Callable[[], Awaitable[InboundEvent | None]],
        sink: Callable[[OutboundEvent], Awaitable[None]],
    ) -> None:
        """Run the call until the client ends it; raises :class:`CallError` to end it early."""
        loop = asyncio.get_running_loop()
        self._last_audio_at = loop.time()
        max_s = self.limits.max_call_duration_s
        if self.limits.idle_timeout_s:
            self._arm_idle_check(loop)
        timers: list[asyncio.TimerHandle] = []
        if max_s:
            reason = CallError(
                ErrorKind.DEADLINE_EXCEEDED,
                f"the call reached max_call_duration_s={max_s:g}; it ended after its last "
                "utterance was transcribed",
            )
            timers.append(loop.call_later(max_s, self.end, reason))
        # The call is told what the server sheds under load, now and at every change.
        if self._quality.level:
            self._quality_changed(self._quality.level)
        self._quality.listeners.append(self._quality_changed)
        reader = asyncio.create_task(self._read_loop(source), name="reader")
        try:
            async with asyncio.TaskGroup() as tg:
                recv = tg.create_task(self._recv(), name="recv")
                asr = tg.create_task(self._asr(), name="asr")
                tts = tg.create_task(self._player.run(), name="tts")
                tg.create_task(self._send(sink, [recv, asr, tts]), name="send")
        except BaseExceptionGroup as eg:
            # Surface the first domain error as such; anything else stays an exception group
            # and the servicer turns it into INTERNAL. CancelledError is never wrapped here.
            call_errors = eg.subgroup(CallError)
            if call_errors is not None:
                raise _first(call_errors) from eg
            raise
        finally:
            self._quality.listeners.remove(self._quality_changed)
            for timer in timers:
                timer.cancel()
            if self._idle_timer is not None:
                self._idle_timer.cancel()
            # Every task the call owns is cancelled before any is awaited: a second
            # cancellation (the client gone, then the server stopping) ends the awaits below,
            # and a task cancelled only after one of them would outlive the call.
            reader.cancel()
            if self._interims is not None:
                self._interims.cancel()
            self._turns.cancel()
            self._recognition.cancel()
            await cancel_and_wait(reader)
            await self._cancel_interims()
            await self._turns.aclose()
            await self._recognition.aclose()
        if self._ended_by_server and self._end_reason is not None:
            raise self._end_reason

    async def _read_loop(self, source: Callable[[], Awaitable[InboundEvent | None]]) -> None:
        """Read client events into the inbox until EOF; a read error goes in as the item."""
        try:
            while True:
                event = await source()
                await self._inbox.put(event)
                if event is None:
                    return
        except Exception as exc:  # recv raises it, in order, after the events before it
            await self._inbox.put(exc)

    def _final_decoded(self) -> None:
        """An utterance's final decode finished: wake recv to end the utterance if it may."""
        # When the queue is full, recv is busy with audio: the next chunk checks anyway.
        with contextlib.suppress(asyncio.QueueFull):
            self._inbox.put_nowait(_FINAL_DECODED)

    def _end_early(self) -> None:
        """Smart turns: end the utterance now when its final is decoded and the caller silent.

        The hangover (``min_silence_ms``, 200 ms) would end it later with the same final; the
        voice model must have heard no speech for half of it, so a pause inside a word or
        between two close words does not split the utterance.
        """
        # The silence first: it is a counter, the readiness check builds the utterance.
        half = self.config.recognition.turns.min_silence_ms // 2
        if self._segmenter.trailing_silence_ms >= half and self._recognition.final_ready():
            self._handle_segments(self._segmenter.end_early())

    async def _next_event(self) -> InboundEvent | None | _Shutdown | _FinalDecoded:
        """The next client event, or ``_SHUTDOWN`` once the call is being ended."""
        event = await self._inbox.get()
        if self._ending:
            return _SHUTDOWN
        if isinstance(event, Exception):
            raise event
        return event

    def _arm_idle_check(self, loop: asyncio.AbstractEventLoop) -> None:
        """Check for ``idle_timeout_s`` without audio at the moment it could first be true."""
        idle_s = self.limits.idle_timeout_s

        def check() -> None:
            if loop.time() >= self._last_audio_at + idle_s:
                self.end(
                    CallError(
                        ErrorKind.DEADLINE_EXCEEDED,
                        f"no audio arrived for idle_timeout_s={idle_s:g}; a call must keep "
                        "sending audio (silence included)",
                    )
                )
            else:
                self._idle_timer = loop.call_at(self._last_audio_at + idle_s, check)

        self._idle_timer = loop.call_at(self._last_audio_at + idle_s, check)

    # -- recv --------------------------------------------------------------------------------------

    async def _recv(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            event = await self._next_event()
            if event is None or isinstance(event, HangupIn | _Shutdown):
                self._hangup = isinstance(event, HangupIn | _Shutdown)
                self._ended_by_server = isinstance(event, _Shutdown)
                for held, digits in self._ingress.flush():
                    self._queue_digits(digits)
                    self._handle_segments(self._segmenter.push(held))
                self._handle_segments(self._segmenter.flush())
                self._turns.ended_by("hangup")
                await self._flush_pending_emits()
                await self._recognition.queue.put(END)
                if self._hangup:
                    await self._player.stop(reason_offset_ms=-1, clear_queue=True)
                await self._player.close()
                return
            if isinstance(event, AudioIn):
                self._last_audio_at = loop.time()
                gated, digits = self._ingress.audio(event.data)
                self._queue_digits(digits)
                if self._turns.hears_audio:
                    self._turns.remember(gated)
                self._handle_segments(self._segmenter.push(gated))
                self._barge_in.speech_in_progress()
                self._barge_in.maybe_first_interim()
                # SPEECH_BEGIN goes out first, then barge-in stops playback right behind it.
                await self._flush_pending_emits()
                await self._barge_in.cut_if_due()
                self._recognition.maybe_speculate()
                self._end_early()
                if self._turns.on:
                    self._turns.check()
            elif isinstance(event, _FinalDecoded):
                self._end_early()
                if self._turns.on:
                    self._turns.check()
            elif isinstance(event, SpeakIn | MarkIn):
                self._player.accept(event)
            elif isinstance(event, ClearIn):
                await self._player.stop(reason_offset_ms=-1, clear_queue=True)
            elif isinstance(event, FlushIn):
                self._handle_segments(self._segmenter.flush())
                self._turns.ended_by("flush")
            elif isinstance(event, DtmfIn):
                await self._emit(DtmfOut(event.digit, event.duration_ms))
            elif isinstance(event, RejectedSpeakIn):
                err = event.error
                await self._emit(ErrorOut(err.kind, err.message, "speak", speak_id=event.speak_id))
            await self._flush_pending_emits()

    def _queue_digits(self, digits: Sequence[DtmfDigit]) -> None:
        for d in digits:
            self._pending_emits.append(DtmfOut(d.digit, d.duration_ms))

    def _handle_segments(self, events: Sequence[SpeechBegin | SpeechEnd | Utterance]) -> None:
        # Runs synchronously inside recv; emits are queued and flushed right after.
        for ev in events:
            if isinstance(ev, SpeechBegin):
                self._pending_emits.append(SpeechOut(True, ev.offset_ms, ev.utterance_index))
                self._barge_in.speech_began(ev.utterance_index, ev.offset_ms)
                self._turns.speech_began(ev.utterance_index)
            elif isinstance(ev, SpeechEnd):
                self._pending_emits.append(SpeechOut(False, ev.offset_ms, ev.utterance_index))
                ended_at = self._recognition.speech_ended(ev.utterance_index)
                self._barge_in.speech_ended()
                self._turns.speech_ended(ev.utterance_index, ev.offset_ms, ended_at)
            elif not ev.dropped and self._transcriber is not None:
                self._pending_utts.append(ev)
                self._turns.queued(ev.index)

    async def _flush_pending_emits(self) -> None:
        emits, self._pending_emits = self._pending_emits, []
        utts, self._pending_utts = self._pending_utts, []
        for e in emits:
            await self._emit(e)
        for u in utts:
            await self._recognition.queue.put(u)
        for end in self._turns.take_ends():
            await self._recognition.queue.put(end)

    # -- asr ---------------------------------------------------------------------------------------

    async def _asr(self) -> None:
        """Finals in order; interims beside them while the call may want any."""
        # Interims also serve the after_words barge-in policy, which any Speak may ask for.
        if self._interims is not None and (
            self.config.interims.results or self.config.mode == "converse"
        ):
            self._interims.start()
        await self._recognition.run()
        await self._cancel_interims()

    async def _cancel_interims(self) -> None:
        if self._interims is not None:
            await self._interims.aclose()

    def _start_reply(self, speak: SpeakIn) -> BargeInPolicy:
        """A reply starts: barge-in gives its policy (built after playback, which calls this)."""
        return self._barge_in.start_reply(speak)

    # -- send --------------------------------------------------------------------------------------

    async def _emit(self, event: OutboundEvent) -> None:
        await self._out.put(event)

    def _quality_changed(self, level: int) -> None:
        """Queue a ``QualityChanged`` for the client (the ladder moved, or it is in force).

        Called synchronously by :class:`QualityLevel`; when the outbound queue is full (a
        client that does not read) the send loop writes it after its next event instead.
        """
        if self._out.full():
            self._quality_pending = True
        else:
            self._out.put_nowait(self._quality_event())

    def _quality_event(self) -> QualityOut:
        steps = self._quality.shed
        return QualityOut(
            tuple(step.name for step in steps),
            "; ".join(step.description for step in steps) or "full quality",
        )

    async def _send(
        self,
        sink: Callable[[OutboundEvent], Awaitable[None]],
        producers: list[asyncio.Task[None]],
    ) -> None:
        async def close_when_done() -> None:
            await asyncio.wait(producers)
            await self._out.put(END)

        closer = asyncio.create_task(close_when_done(), name="send-closer")
        stall_s = self.limits.write_stall_timeout_s or None
        try:
            while True:
                event = await self._out.get()
                if isinstance(event, End):
                    return
                if self._on_event is not None:
                    self._on_event(event)
                # A client that stops reading blocks this write once HTTP/2 flow control is
                # spent; without a bound the call (and its slot) would wait for good.
                try:
                    async with asyncio.timeout(stall_s):
                        await sink(event)
                        if self._quality_pending:
                            self._quality_pending = False
                            await sink(self._quality_event())
                except TimeoutError:
                    raise write_stalled(self.limits.write_stall_timeout_s) from None
        finally:
            await cancel_and_wait(closer)


def write_stalled(limit_s: float) -> CallError:
    """The error that ends a stream whose client stopped reading (``write_stall_timeout_s``)."""
    return CallError(
        ErrorKind.DEADLINE_EXCEEDED,
        f"a write to the client did not complete within write_stall_timeout_s={limit_s:g}; "
        "the client stopped reading",
    )


def _first(group: BaseExceptionGroup[CallError]) -> CallError:
    for exc in group.exceptions:
        if isinstance(exc, BaseExceptionGroup):
            return _first(exc)
        return exc
    raise AssertionError("empty exception group")
