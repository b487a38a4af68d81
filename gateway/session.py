"""One call as an asyncio task graph: ``recv`` → (``asr``, ``tts``) → ``send``.

The servicer turns protobuf messages into the events of :mod:`voxgate.gateway.events` and back;
nothing
here knows about gRPC or protobuf. One :class:`asyncio.TaskGroup` per call:

* ``recv`` reads client events, validates and decodes audio at the edge, runs the segmenter
  (cheap: tens of µs per 20 ms frame) and routes utterances, speech events and speak requests;
* ``asr`` sends utterances to the shared cross-call transcriber, in order, and emits transcripts;
  an optional ``interim`` task re-decodes the growing utterance at low priority;
* ``tts`` plays queued Speak requests, paced at real time, and is the only task barge-in
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
import math
from collections import deque
from collections.abc import Awaitable, Callable, Hashable, Sequence
from dataclasses import dataclass, field, replace
from typing import Protocol

import numpy as np
import numpy.typing as npt

from voxgate.common.aio import cancel_and_wait
from voxgate.engines.asr.base import AsrOptions, AsrRequest, AsrResult
from voxgate.engines.base import ASR_SAMPLE_RATE_HZ
from voxgate.gateway.barge_in import BargeInPolicy
from voxgate.gateway.base import Synthesizer, Transcriber
from voxgate.gateway.batcher import WithdrawnError
from voxgate.gateway.call.barge_in import BargeIn
from voxgate.gateway.call.ingress import Ingress
from voxgate.gateway.call.options import CallConfig
from voxgate.gateway.call.playback import Playback, SynthesisCap
from voxgate.gateway.call.queues import END, End
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
    EndOfTurnOut,
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
    TranscriptOut,
)
from voxgate.gateway.metrics import GatewayMetrics
from voxgate.gateway.segmenter import (
    Segmenter,
    SegmenterState,
    SpeechBegin,
    SpeechEnd,
    Utterance,
    VoiceDetector,
)
from voxgate.gateway.turns import TurnDecision, TurnDetector, TurnInput

__all__ = ["CallConfig", "CallSession", "SynthesisCap", "write_stalled"]

log = logging.getLogger("voxgate.session")

#: Why a final may have no text although the caller spoke: its decode looped or was unsure.
#: Its utterance's last interim then stands in (``CallSession._final_or_interim``).
_UNSURE = frozenset({"repetition", "low_logprob"})


# --- the call -----------------------------------------------------------------------------------


class _Shutdown:
    """``_next_event``'s result once the server asked the call to end (``CallSession.shutdown``)."""


_SHUTDOWN = _Shutdown()


#: How much of a word's unvoiced tail a speculative final may lack and still stand for the
#: final, ms (see :meth:`_Speculation.covers`).
_SPEC_TAIL_SLACK_MS = 100


@dataclass
class _Speculation:
    """A final decode started while the hangover still runs (see ``_maybe_speculate``).

    Attributes:
        start_ms: the utterance's start (call offset of its first sample).
        speech_end_ms: its end of speech as it stood when the decode started.
        audio_end_ms: call offset just past the last sample the decode got.
        task: the decode.
    """

    start_ms: int
    speech_end_ms: int
    audio_end_ms: int
    task: asyncio.Task[AsrResult]

    def covers(self, utt: Utterance) -> bool:
        """Whether this decode may stand for the final of ``utt`` (the utterance as it ends).

        It must have started at the same place and hold the speech up to the end ``utt``
        reports, or all but its last ``_SPEC_TAIL_SLACK_MS``. Any voiced frame after the
        decode started cancels it (speech resumed), so what it can lack is only unvoiced
        audio that the segmenter counts as speech because it stands above the call's noise
        floor: the fading tail of the last word. On clean recordings that tail goes on, one
        20 ms frame after another, for 60-200 ms after the voice model's last frame; when each
        such frame restarted the decode, the superseded decodes (already on the engine, where
        they cannot be stopped) held both workers and the one that counted waited behind them:
        2-4 decodes per utterance, and the final 200-300 ms later than the first of them, whose
        audio already ended 120 ms after the last voiced frame.
        """
        return (
            self.start_ms == utt.start_ms
            and utt.speech_end_ms <= self.audio_end_ms + _SPEC_TAIL_SLACK_MS
        )


@dataclass
class _Turn:
    """The caller's open turn: its utterances and the finals that came back so far."""

    index: int
    first_utterance: int
    last_utterance: int = -1
    speech_end_ms: int = 0
    #: Loop time of its last SPEECH_END (EndOfTurn's latency counts from there).
    speech_end_at: float = 0.0
    #: Utterances queued for recognition (a turn of none, only too-short noises, is no turn).
    queued: int = 0
    #: Utterances queued for a final that has not come back yet.
    pending: set[int] = field(default_factory=set)
    #: Utterance index -> its final's text.
    texts: dict[int, str] = field(default_factory=dict)
    #: Utterance index -> the audio model's probability at its end (absent while it runs).
    audio: dict[int, float] = field(default_factory=dict)

    def text(self, before: int | None = None) -> str:
        """The turn's finals joined, in order (only those of utterances before ``before``)."""
        return " ".join(
            t.strip()
            for i, t in sorted(self.texts.items())
            if t.strip() and (before is None or i < before)
        )


@dataclass(frozen=True, slots=True)
class _TurnEnd:
    """``_utts`` marker: the turn is over; the asr task sends EndOfTurn after its finals."""

    turn: _Turn
    decision: TurnDecision
    silence_ms: int


class EndOfTurnModel(Protocol):
    """An audio end-of-turn model (voxgate.engines.turn.SmartTurn): thread-safe, run on a worker."""

    def probability(self, audio: npt.NDArray[np.float32]) -> float:
        """How likely the speech that ends ``audio`` (16 kHz float) completes a turn."""
        ...


#: Utterances of a turn shorter than this (speech, ms) are decoded without its earlier words.
_PROMPT_MIN_SPEECH_MS = 1_000

#: Caller audio the turn model reads, samples (its 8 s window).
_TURN_AUDIO_SAMPLES = 8 * ASR_SAMPLE_RATE_HZ


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
    ) -> None:
        self.config = config
        self._quality = quality if quality is not None else QualityLevel()
        self.log_id = log_id
        self._metrics = metrics if metrics is not None else GatewayMetrics()
        self.limits = limits
        self._transcriber = transcriber
        self._synth = synthesizer
        self._on_event = on_event
        self._ingress = Ingress(
            config,
            limits,
            plays_replies=config.mode == "converse" and synthesizer is not None,
            realtime_slack_ms=realtime_slack_ms,
            declared_bulk=declared_bulk,
        )
        self._segmenter = Segmenter(config.vad, detector)
        self._out: asyncio.Queue[OutboundEvent | End] = asyncio.Queue(maxsize=256)
        self._utts: asyncio.Queue[Utterance | _TurnEnd | End] = asyncio.Queue(maxsize=64)
        self._hangup = False
        self._speech_end_at: dict[int, float] = {}
        self._final_done: set[int] = set()
        #: Utterance index -> (samples decoded, result) of its longest interim with text: the
        #: final's stand-in when the final decode gives none (see _final_or_interim).
        self._interim_texts: dict[int, tuple[int, AsrResult]] = {}
        self._interim_task: asyncio.Task[None] | None = None
        #: Names this call's utterances to the recogniser (``AsrRequest.utterance``), so that
        #: an utterance's final takes its queued interims off the queue.
        self._asr_token = object()
        #: Sequence number of the last interim sent to the client (overlapping decodes may
        #: come back out of order; an older one is then not sent).
        self._interim_shown = 0
        self._specs: dict[int, _Speculation] = {}
        # End of turn (config.turns): the open turn, the turns of utterances whose finals
        # have not been sent, and the next turn's index.
        self._turns = TurnDetector(config.turns) if config.turns.on else None
        self._turn: _Turn | None = None
        self._turn_of: dict[int, _Turn] = {}
        self._next_turn = 0
        self._pending_turn_ends: list[_TurnEnd] = []
        self._turn_model = (
            turn_model if config.turns.mode == "smart" and config.turns.audio_model else None
        )
        # The last seconds of the caller's audio (what the turn model reads), newest last.
        self._recent: deque[np.ndarray] = deque()
        self._recent_samples = 0
        self._turn_model_tasks: set[asyncio.Task[None]] = set()
        # The language of the call's last confidently detected final (see _interim_language).
        self._learned_language: str | None = None
        # Segmenter events are produced synchronously and drained (awaiting queues) right after.
        self._pending_emits: list[OutboundEvent] = []
        self._pending_utts: list[Utterance] = []
        # The reader task feeds recv through this small queue; `end()` drops a _SHUTDOWN in
        # it, so recv never has to race two futures per message (that doubled the VAD path's
        # CPU per stream).
        self._inbox: asyncio.Queue[InboundEvent | None | _Shutdown | Exception] = asyncio.Queue(
            maxsize=8
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
            await cancel_and_wait(reader)
            await self._cancel_interim()
            for model_task in list(self._turn_model_tasks):
                await cancel_and_wait(model_task)
            for spec in self._specs.values():
                spec.task.cancel()
            specs, self._specs = list(self._specs.values()), {}
            await asyncio.gather(*(sp.task for sp in specs), return_exceptions=True)
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

    async def _next_event(self) -> InboundEvent | None | _Shutdown:
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
                self._turn_ended_by("hangup")
                await self._flush_pending_emits()
                await self._utts.put(END)
                if self._hangup:
                    await self._player.stop(reason_offset_ms=-1, clear_queue=True)
                await self._player.close()
                return
            if isinstance(event, AudioIn):
                self._last_audio_at = loop.time()
                gated, digits = self._ingress.audio(event.data)
                self._queue_digits(digits)
                if self._turn_model is not None:
                    self._remember(gated)
                self._handle_segments(self._segmenter.push(gated))
                self._barge_in.speech_in_progress()
                self._barge_in.maybe_first_interim()
                # SPEECH_BEGIN goes out first, then barge-in stops playback right behind it.
                await self._flush_pending_emits()
                await self._barge_in.cut_if_due()
                self._maybe_speculate()
                if self._turns is not None:
                    self._check_turn()
            elif isinstance(event, SpeakIn | MarkIn):
                self._player.accept(event)
            elif isinstance(event, ClearIn):
                await self._player.stop(reason_offset_ms=-1, clear_queue=True)
            elif isinstance(event, FlushIn):
                self._handle_segments(self._segmenter.flush())
                self._turn_ended_by("flush")
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
                if self._turns is not None and self._turn is None:
                    self._turn = _Turn(self._next_turn, ev.utterance_index)
                    self._next_turn += 1
            elif isinstance(ev, SpeechEnd):
                self._pending_emits.append(SpeechOut(False, ev.offset_ms, ev.utterance_index))
                self._speech_end_at[ev.utterance_index] = asyncio.get_running_loop().time()
                self._barge_in.speech_ended()
                if self._turn is not None:
                    self._turn.last_utterance = ev.utterance_index
                    self._turn.speech_end_ms = ev.offset_ms
                    self._turn.speech_end_at = self._speech_end_at[ev.utterance_index]
                    self._ask_turn_model(self._turn, ev.utterance_index)
            elif not ev.dropped and self._transcriber is not None:
                self._pending_utts.append(ev)
                if self._turn is not None:
                    self._turn.pending.add(ev.index)
                    self._turn.queued += 1
                    self._turn_of[ev.index] = self._turn

    async def _flush_pending_emits(self) -> None:
        emits, self._pending_emits = self._pending_emits, []
        utts, self._pending_utts = self._pending_utts, []
        for e in emits:
            await self._emit(e)
        for u in utts:
            await self._utts.put(u)
        ends, self._pending_turn_ends = self._pending_turn_ends, []
        for end in ends:
            await self._utts.put(end)

    # -- turns -------------------------------------------------------------------------------------

    def _check_turn(self) -> None:
        """Whether the open turn is over, now that more of the call's audio has been heard.

        Decided between utterances only (the caller silent since the turn's last SPEECH_END),
        on the call's own audio clock, by the call's :class:`~voxgate.gateway.turns.TurnDetector`:
        the turn's words are known once every final of it has come back.
        """
        turn, detector = self._turn, self._turns
        if turn is None or detector is None or turn.last_utterance < 0:
            return
        if self._segmenter.state is not SegmenterState.QUIET:
            return  # the caller is talking (or may be) again: the turn goes on
        silence = self._segmenter.offset_ms - turn.speech_end_ms
        text = None if turn.pending else turn.text()
        audio = turn.audio.get(turn.last_utterance)
        if self._turn_model is not None and audio is None:
            text = None  # the model still runs: wait for it as for the words
        decision = detector.decide(TurnInput(silence, text, audio))
        if decision.end:
            self._end_turn(decision, silence)

    def _end_turn(self, decision: TurnDecision, silence_ms: int) -> None:
        """Close the open turn; its EndOfTurn goes out after its finals (the asr task)."""
        turn, self._turn = self._turn, None
        if turn is None:
            return
        if turn.queued == 0:
            # Nothing in it was long enough to transcribe: no turn; its index is reused.
            if turn.index == self._next_turn - 1:
                self._next_turn -= 1
            return
        self._pending_turn_ends.append(_TurnEnd(turn, decision, silence_ms))

    def _turn_ended_by(self, reason: str) -> None:
        """End the open turn at once (the client flushed, or the call is ending)."""
        if self._turn is not None and self._turn.last_utterance >= 0:
            silence = max(0, self._segmenter.offset_ms - self._turn.speech_end_ms)
            self._end_turn(TurnDecision(True, 1.0, reason), silence)

    def _remember(self, samples: np.ndarray) -> None:
        """Keep the last 8 s of the caller's (16 kHz, gated) audio for the turn model."""
        self._recent.append(samples)
        self._recent_samples += len(samples)
        while self._recent and self._recent_samples - len(self._recent[0]) >= _TURN_AUDIO_SAMPLES:
            self._recent_samples -= len(self._recent.popleft())

    def _ask_turn_model(self, turn: _Turn, index: int) -> None:
        """Run the audio end-of-turn model on the audio up to now, on a worker thread."""
        model = self._turn_model
        if model is None:
            return
        audio = np.concatenate(list(self._recent)) if self._recent else np.zeros(0, np.float32)

        async def run() -> None:
            loop = asyncio.get_running_loop()
            try:
                p = await loop.run_in_executor(None, model.probability, audio)
            except Exception:  # the words and the silence still decide
                log.exception("call %s: the end-of-turn model failed", self.log_id)
                p = 0.5
            turn.audio[index] = p

        task = asyncio.create_task(run(), name="turn-model")
        self._turn_model_tasks.add(task)
        task.add_done_callback(self._turn_model_tasks.discard)

    def _turn_options(self, options: AsrOptions, utt: Utterance) -> AsrOptions:
        """An utterance's decoding options with its turn's earlier words as its prompt.

        A pause inside a sentence ends an utterance but not its turn; the next part is
        decoded knowing what came before it, as Whisper decodes a long file window after
        window. Not a fragment of under ``_PROMPT_MIN_SPEECH_MS``: with the sentence before
        it as its prompt Whisper gave JFK's "ask" and "not" (0.3-0.4 s each) no text at all;
        without, "ASK!" and "Not!".
        """
        turn = self._turn_of.get(utt.index)
        if turn is None or self._transcriber is None:
            return options
        if utt.speech_end_ms - utt.speech_start_ms < _PROMPT_MIN_SPEECH_MS:
            return options
        before = turn.text(before=utt.index)
        if not before:
            return options
        prompt = f"{options.initial_prompt.strip()} {before}".strip()
        tokens = self._transcriber.encode_context(prompt, options.hotwords)
        return replace(options, initial_prompt=prompt, context_tokens=tokens)

    async def _send_end_of_turn(self, end: _TurnEnd) -> None:
        turn = end.turn
        loop = asyncio.get_running_loop()
        latency = int((loop.time() - turn.speech_end_at) * 1000) if turn.speech_end_at else 0
        await self._emit(
            EndOfTurnOut(
                turn_index=turn.index,
                probability=end.decision.probability,
                offset_ms=turn.speech_end_ms,
                text=turn.text(),
                first_utterance_index=turn.first_utterance,
                last_utterance_index=turn.last_utterance,
                reason=end.decision.reason,
                silence_ms=end.silence_ms,
                latency_ms=max(0, latency),
            )
        )

    def _maybe_speculate(self) -> None:
        """Start the final decode once the trailing silence has settled.

        The hangover (``end_silence_ms``, 600 ms by default) is pure waiting: after
        ``settled_after_ms`` of it the utterance's speech span can no longer change unless the
        caller speaks again. Decoding from there hides most of the remaining hangover behind
        the decode. If speech resumes the speculation is cancelled; if the final differs in
        its span it is discarded and decoded normally. Only when the recogniser has nothing
        waiting, so that speculation never delays another call's final.
        """
        seg, transcriber = self._segmenter, self._transcriber
        if transcriber is None or not self.config.speculative_finals:
            return
        index = seg.utterance_index
        if seg.state is SegmenterState.SPEAKING:
            stale = self._specs.pop(index, None)
            if stale is not None:
                stale.task.cancel()
                self._metrics.asr_speculative.labels("cancelled").inc()
            return
        # With smart turn detection the utterance ends on a short hangover and this decode is
        # its final: it starts at the first silence, whatever else the recogniser has queued
        # (it is a final, scheduled as one), so that the words are known when the turn may end.
        smart = self.config.turns.mode == "smart"
        after_ms = self.config.turns.decode_after_ms if smart else seg.settled_after_ms
        if seg.trailing_silence_ms < after_ms:
            return
        spec = self._specs.get(index)
        if spec is not None and not smart:
            return
        if spec is None and not smart and not transcriber.can_speculate():
            return
        utt = seg.preview()
        if utt is None or utt.dropped:
            return
        if spec is not None:
            if spec.covers(utt):
                return
            # A late plosive moved the end of speech: decode the utterance as it now stands.
            spec.task.cancel()
            self._metrics.asr_speculative.labels("discarded").inc()
        options = self._asr_options()
        if self._turn is not None:
            self._turn_of.setdefault(index, self._turn)
            options = self._turn_options(options, utt)
        req = self._final_request(utt, options, index)
        task = asyncio.create_task(transcriber.transcribe(req), name=f"speculative-{index}")
        self._specs[index] = _Speculation(utt.start_ms, utt.speech_end_ms, utt.end_ms, task)

    def _final_request(self, utt: Utterance, options: AsrOptions, index: int) -> AsrRequest:
        """A final decode of utterance ``index``, speculative or not.

        One shape for both, so that a speculation's result can stand for the final (bulk
        calls' finals are due later; the utterance key lets the batcher withdraw its queued
        interims).
        """
        return AsrRequest(
            utt.audio,
            utt.stats,
            options,
            is_final=True,
            bulk=self.bulk,
            utterance=self._utterance(index),
        )

    # -- asr ---------------------------------------------------------------------------------------

    async def _asr(self) -> None:
        # Interims also serve the after_words barge-in policy, which any Speak may ask for.
        if self._transcriber is not None and (
            self.config.interim_results or self.config.mode == "converse"
        ):
            self._interim_task = asyncio.create_task(self._interim_loop(), name="interim")
        while True:
            item = await self._utts.get()
            if isinstance(item, End):
                break
            if isinstance(item, _TurnEnd):
                await self._send_end_of_turn(item)
                continue
            await self._transcribe_final(item)
        await self._cancel_interim()

    async def _transcribe_final(self, utt: Utterance) -> None:
        assert self._transcriber is not None
        spec = self._specs.pop(utt.index, None)
        if spec is not None and not spec.covers(utt):
            spec.task.cancel()
            self._metrics.asr_speculative.labels("discarded").inc()
            spec = None
        options = self._turn_options(self._asr_options(), utt)
        req = self._final_request(utt, options, utt.index)
        decoded: AsrResult | None = None
        failure: ErrorOut | None = None
        try:
            if spec is not None:
                decoded = await spec.task
                self._metrics.asr_speculative.labels("used").inc()
            else:
                decoded = await self._transcriber.transcribe(req)
        except CallError as exc:
            failure = ErrorOut(exc.kind, exc.message, "utterance", utt.index)
        except Exception:  # an engine fault fails this utterance, not the call
            log.exception("call %s: utterance %d failed", self.log_id, utt.index)
            message = f"recognition failed (internal error; server log has call {self.log_id})"
            failure = ErrorOut(ErrorKind.INTERNAL, message, "utterance", utt.index)
        self._final_done.add(utt.index)
        result = self._final_or_interim(utt.index, decoded, failure)
        turn = self._turn_of.pop(utt.index, None)
        if turn is not None:
            turn.texts[utt.index] = result.text if result is not None else ""
            turn.pending.discard(utt.index)
        if result is None:
            assert failure is not None
            await self._emit(failure)
            return
        if result is decoded:
            self._learn_language(req.options, result)
        ended = self._speech_end_at.pop(utt.index, None)
        now = asyncio.get_running_loop().time()
        latency = int((now - ended) * 1000) if ended is not None else 0
        if ended is not None:
            self._metrics.asr_final_latency.observe(latency / 1000.0)
            if not req.bulk:  # a file's backlog is no real-time caller's wait
                self._metrics.realtime_finals.add(now, latency / 1000.0)
        await self._emit(
            TranscriptOut(
                result,
                True,
                utt.start_ms,
                utt.end_ms,
                utt.index,
                latency_ms=latency,
                turn_index=turn.index if turn is not None else None,
            )
        )
        await self._barge_in.words_heard(utt.index, result.text)

    def _final_or_interim(
        self, index: int, decoded: AsrResult | None, failure: ErrorOut | None
    ) -> AsrResult | None:
        """The final to send: the decoded one, or the utterance's last interim in its place.

        No utterance with text is lost: when the final decode failed (a hung batch past
        ``batch_timeout_s``, a full queue, an engine fault) or gave no text because it looped
        or was unsure (``repetition``, ``low_logprob``: the ladder kept no usable attempt,
        often because its budget ran out), the caller's words that an interim already heard
        become the final (its ``fallbacks`` end with ``interim``), instead of an error event
        or nothing. A final that judged the audio not to be speech (``no_speech``,
        ``hallucination``) stands: it heard the whole utterance, the interim only a prefix.
        None when there is no final and no interim text (the failure is reported).
        """
        kept = self._interim_texts.pop(index, None)
        if decoded is not None and (decoded.text or decoded.dropped_reason not in _UNSURE):
            return decoded
        if kept is None:
            return decoded
        interim = kept[1]
        if decoded is not None:
            reason = decoded.dropped_reason
            steps = (*decoded.fallbacks, "interim")
        else:
            assert failure is not None
            reason = failure.kind.value
            steps = ("interim",)
        self._metrics.asr_finals_from_interim.labels(reason).inc()
        log.warning(
            "call %s: utterance %d: the final decode gave no text (%s); its last interim's "
            "text is the final",
            self.log_id,
            index,
            reason,
        )
        return replace(interim, fallbacks=steps)

    def _learn_language(self, options: AsrOptions, result: AsrResult) -> None:
        """Remember a final's language when it was detected confidently (for the interims)."""
        cfg = self.config.language
        if (
            cfg.learn
            and options.language is None
            and result.text
            and result.language
            and result.language_probability >= cfg.learn_min_probability
        ):
            self._learned_language = result.language

    def _interim_language(self, options: AsrOptions, samples: int) -> tuple[AsrOptions, float]:
        """An interim's options with its language, and the detection probability it needs.

        Whisper detects a language on each decode of a call that sets none, and on a short
        interim prefix (a barge-in's first 200-300 ms voiced) that detection is unreliable:
        English callers came out Russian or Indonesian, so ``caller_text`` and the client's
        interims were garbage. Interims therefore decode in the language of the call's last
        final detected with ``learn_min_probability`` (finals keep detecting: a caller may
        switch language), else in the server's ``interim_default``; with neither, a prefix
        shorter than ``interim_detect_min_ms`` is still detected, but its text is used only
        when the detection is at least ``interim_min_probability`` sure.
        """
        if options.language is not None:
            return options, 0.0
        cfg = self.config.language
        language = self._learned_language or cfg.interim_default or None
        if language is not None:
            return replace(options, language=language), 0.0
        if samples < cfg.interim_detect_min_ms * ASR_SAMPLE_RATE_HZ // 1000:
            return options, cfg.interim_min_probability
        return options, 0.0

    def _asr_options(self) -> AsrOptions:
        """The call's decoding options with the server's degradation steps in force."""
        return self._quality.asr_options(self.config.asr_options)

    async def _interim_loop(self) -> None:
        """Interim decodes of the growing utterance, for the client and for barge-in.

        The client gets them when it asked for them; the ``after_words`` barge-in policy needs
        them while the caller talks over such a reply, and then they run at
        ``barge_in_interim_ms`` from the first one on, which runs as soon as the caller has
        said enough to decode (:meth:`BargeIn.maybe_first_interim` wakes this loop). There,
        while one
        decodes, the next may start ``barge_in_overlap_ms`` after it on a spare worker (at most
        two in flight): a first prefix too short to hold a word then costs that spacing, not
        the rest of the decode and the interval after it.
        """
        assert self._transcriber is not None
        transcriber = self._transcriber
        loop = asyncio.get_running_loop()
        last_len = 0
        started = -math.inf  # when the last interim attempt started
        running: set[asyncio.Task[None]] = set()
        seq = 0
        try:
            while True:
                for done_task in [t for t in running if t.done()]:
                    running.discard(done_task)
                    if not done_task.cancelled():
                        done_task.result()  # a fault ends the interims, as an inline decode did
                fast = self._barge_in.listening_for_words()
                interval_ms = (
                    self.config.barge_in_interim_ms if fast else self.config.interim_interval_ms
                )
                overlap_ms = self.config.barge_in_overlap_ms if fast else 0
                if running and not (
                    overlap_ms > 0 and len(running) < 2 and transcriber.spare_worker()
                ):
                    # The next follows the first decode to end (not the last).
                    await asyncio.wait(running, return_when=asyncio.FIRST_COMPLETED)
                    continue
                spacing_ms = overlap_ms if running else interval_ms
                wait_s = spacing_ms / 1000.0
                if fast:
                    # NOTE: over an after_words reply the decode counts toward the interval, so
                    # the period is max(interval, decode) rather than interval + decode: the
                    # words that may interrupt are heard one decode sooner.
                    wait_s = max(0.0, started + wait_s - loop.time())
                # A wake that came while the last decode ran is not lost: it is still set here.
                if not self._barge_in.interim_due.is_set() and wait_s > 0:
                    wake = asyncio.ensure_future(self._barge_in.interim_due.wait())
                    try:
                        done, _ = await asyncio.wait(
                            {wake, *running}, timeout=wait_s, return_when=asyncio.FIRST_COMPLETED
                        )
                    finally:
                        await cancel_and_wait(wake)
                    if done and not self._barge_in.interim_due.is_set():
                        continue  # the decode in flight ended: the spacing is the interval now
                woken = self._barge_in.interim_due.is_set()
                self._barge_in.interim_due.clear()
                started = loop.time()
                fast = self._barge_in.listening_for_words()
                wanted = self.config.interim_results and self._quality.interim_results
                if not (wanted or fast):
                    continue  # nobody needs interims now (or they are shed under load)
                if running and not (fast and transcriber.spare_worker()):
                    continue  # no longer a worker to spare (or no longer a barge-in)
                utt = self._segmenter.growing()
                if utt is None:
                    last_len = 0
                    continue
                if utt.index in self._specs or (not fast and self._final_imminent()):
                    # Its final decode has started (the speech has ended, unless it resumes),
                    # or is about to: an interim now would trail that final and take a core
                    # beside it.
                    continue
                if not woken and len(utt.audio) - last_len < 16 * spacing_ms // 2:
                    continue
                last_len = len(utt.audio)
                seq += 1
                task = asyncio.create_task(
                    self._interim_decode(utt, seq, wanted=wanted, fast=fast), name="interim-decode"
                )
                running.add(task)
        finally:
            for task in list(running):
                await cancel_and_wait(task)

    async def _interim_decode(self, utt: Utterance, seq: int, *, wanted: bool, fast: bool) -> None:
        """One interim decode: to the client when it asked for interims, then to barge-in."""
        assert self._transcriber is not None
        index = utt.index
        options, min_language_prob = self._interim_language(self._asr_options(), len(utt.audio))
        if not wanted:
            # Only barge-in reads this interim: its words' times would be aligned for no
            # one (the alignment pass is part of the interrupt's latency), and a smaller
            # model may count its words sooner. A caller talking over the bot's reply
            # most likely speaks its language: a prefix detected on its own came out
            # Chinese for "uh-huh, right" ("啊好"), which no backchannel list matches.
            options = replace(options, word_timestamps=False)
            if options.language is None and self.config.reply_language:
                options = replace(options, language=self.config.reply_language)
                min_language_prob = 0.0
            word_model = self.config.barge_in_model
            counted = word_model.options(options) if word_model is not None else None
            options = counted or options
        urgent = fast and self.config.barge_in_urgent_interims
        req = AsrRequest(
            utt.audio,
            utt.stats,
            options,
            is_final=False,
            urgent=urgent,
            utterance=self._utterance(index),
        )
        try:
            result = await self._transcriber.transcribe(req)
        except (CallError, WithdrawnError):
            # Interim work is best-effort: a full queue just skips it, and the utterance's
            # final, once submitted, takes it off the queue (the final says it all).
            return
        if not result.text or result.language_probability < min_language_prob:
            return
        if index not in self._final_done:
            # Kept even after SPEECH_END (an interim still decoding then): the final's stand-in.
            kept = self._interim_texts.get(index)
            if kept is None or kept[0] <= len(utt.audio):
                self._interim_texts[index] = (len(utt.audio), result)
        # Once SPEECH_END is out, only the final may describe that utterance.
        if index in self._speech_end_at or index in self._final_done:
            return
        if wanted:
            if seq < self._interim_shown:
                return  # an overlapping later prefix came back first: this one is stale
            self._interim_shown = seq
            await self._emit(TranscriptOut(result, False, utt.start_ms, utt.end_ms, index))
        await self._barge_in.words_heard(index, result.text)

    def _final_imminent(self) -> bool:
        """Smart turns: the caller has been silent for half of ``decode_after_ms``.

        The utterance's final decode starts at ``decode_after_ms`` of silence, so an interim
        started now would show the client nothing the final does not show a moment later, and
        it would decode beside that final on the other core of a 2-core machine (traced: an
        interim started 150 ms after the last word ran alongside the final, which took 280 ms
        instead of 240). Speech that resumes makes interims due again.
        """
        turns = self.config.turns
        return (
            turns.mode == "smart"
            and self._segmenter.trailing_silence_ms >= turns.decode_after_ms // 2
        )

    def _utterance(self, index: int) -> Hashable:
        """Utterance ``index`` of this call, as the recogniser's queue knows it."""
        return (self._asr_token, index)

    async def _cancel_interim(self) -> None:
        task, self._interim_task = self._interim_task, None
        if task is not None:
            await cancel_and_wait(task)

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
