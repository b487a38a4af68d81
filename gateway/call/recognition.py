"""Recognition on one call: finals, speculative finals, and the language the interims learn.

Each utterance the segmenter ends goes to the shared recogniser as a final, in order (the
``asr`` task, :meth:`Recognition.run`). Once the caller has been silent long enough for the
utterance's speech span to be settled, its final decode starts while the hangover still runs
(:meth:`Recognition.maybe_speculate`); speech that resumes cancels it. A final that gives no
text where an interim heard words takes the interim's text; a confidently detected final's
language becomes the interims' (:meth:`Recognition.interim_language`). Turn detection keeps its
books in :mod:`.turn_taking`; this stage sends a turn's EndOfTurn after its finals.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Hashable
from dataclasses import dataclass, replace

from voxgate.engines.asr.base import AsrOptions, AsrRequest, AsrResult
from voxgate.engines.base import ASR_SAMPLE_RATE_HZ
from voxgate.gateway.base import Transcriber
from voxgate.gateway.call.barge_in import BargeIn
from voxgate.gateway.call.options import CallConfig
from voxgate.gateway.call.queues import End
from voxgate.gateway.call.turn_taking import TurnEnd, TurnTaking
from voxgate.gateway.degrade import QualityLevel
from voxgate.gateway.errors import CallError, ErrorKind
from voxgate.gateway.events import ErrorOut, OutboundEvent, TranscriptOut
from voxgate.gateway.metrics import GatewayMetrics
from voxgate.gateway.segmenter import Segmenter, SegmenterState, Utterance

__all__ = ["Recognition"]

log = logging.getLogger("voxgate.session")

#: Why a final may have no text although the caller spoke: its decode looped or was unsure.
#: Its utterance's last interim then stands in (``Recognition._final_or_interim``).
_UNSURE = frozenset({"repetition", "low_logprob"})


#: How much of a word's unvoiced tail a speculative final may lack and still stand for the
#: final, ms (see :meth:`_Speculation.covers`).
_SPEC_TAIL_SLACK_MS = 100


@dataclass
class _Speculation:
    """A final decode started while the hangover still runs (see ``Recognition.maybe_speculate``).

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

        A decode that got every loud frame of ``utt`` (its ``loud_end_ms``) stands too,
        however long the faint tail after them: with smart turns it starts from the loud end
        while the voice model may still hear the tail (:meth:`Recognition.maybe_speculate`).
        """
        if self.start_ms != utt.start_ms:
            return False
        # It got every loud frame (the words; Segmenter.LOUD_REL_DB): the rest is the tail.
        if 0 < utt.loud_end_ms <= self.audio_end_ms:
            return True
        return utt.speech_end_ms <= self.audio_end_ms + _SPEC_TAIL_SLACK_MS


class Recognition:
    """Finals of one call's utterances, in order; :meth:`run` is the call's ``asr`` task.

    Args:
        config: the call's settings (decoding options, speculation, language, turns).
        segmenter: the call's segmenter (the utterance as it stands, for speculation).
        transcriber: the shared recogniser, or None when the server runs without ASR.
        turns: the call's turns (a final's turn, the prompt of a turn's later utterances).
        barge_in: where a final's words may stop the reply (``after_words``).
        quality: the server's degradation level (read at every request).
        metrics: where speculation and final latency are counted.
        emit: queues an event for the client.
        bulk: whether the call runs ahead of real time now (its finals are due later).
        log_id: the call's id in log lines.
        final_decoded: called when a smart call's final decode finishes before its
            utterance ends, so that the session may end the utterance then
            (:meth:`final_ready`).
        alone: whether the call has the server to itself now (``VoiceGatewayServicer.alone``), asked
            for each final request (``AsrRequest.alone``); never when None.
    """

    def __init__(
        self,
        config: CallConfig,
        segmenter: Segmenter,
        transcriber: Transcriber | None,
        *,
        turns: TurnTaking,
        barge_in: BargeIn,
        quality: QualityLevel,
        metrics: GatewayMetrics,
        emit: Callable[[OutboundEvent], Awaitable[None]],
        bulk: Callable[[], bool],
        log_id: str,
        final_decoded: Callable[[], None] | None = None,
        alone: Callable[[], bool] | None = None,
    ) -> None:
        self.config = config
        self._segmenter = segmenter
        self._transcriber = transcriber
        self._turns = turns
        self._barge_in = barge_in
        self._quality = quality
        self._metrics = metrics
        self._emit = emit
        self._bulk = bulk
        self.log_id = log_id
        self._final_decoded = final_decoded
        self._alone = alone
        #: Utterances ended and turns closed, in order, for :meth:`run`.
        self.queue: asyncio.Queue[Utterance | TurnEnd | End] = asyncio.Queue(maxsize=64)
        self._speech_end_at: dict[int, float] = {}
        self._final_done: set[int] = set()
        #: Utterance index -> (samples decoded, result) of its longest interim with text: the
        #: final's stand-in when the final decode gives none (see _final_or_interim).
        self._interim_texts: dict[int, tuple[int, AsrResult]] = {}
        #: Names this call's utterances to the recogniser (``AsrRequest.utterance``), so that
        #: an utterance's final takes its queued interims off the queue.
        self._asr_token = object()
        self._specs: dict[int, _Speculation] = {}
        # The language of the call's last confidently detected final (see interim_language).
        self._learned_language: str | None = None

    def speech_ended(self, index: int) -> float:
        """SPEECH_END of utterance ``index``: its final's latency counts from now (returned)."""
        at = self._speech_end_at[index] = asyncio.get_running_loop().time()
        return at

    def final_started(self, index: int) -> bool:
        """Whether utterance ``index``'s final decode has started (speculatively)."""
        return index in self._specs

    def closed(self, index: int) -> bool:
        """Whether only the final may describe utterance ``index`` now (SPEECH_END is out)."""
        return index in self._speech_end_at or index in self._final_done

    def keep_interim(self, index: int, samples: int, result: AsrResult) -> None:
        """An interim with text of utterance ``index`` over its first ``samples``.

        Kept even after SPEECH_END (an interim still decoding then): the longest is the
        final's stand-in (see :meth:`_final_or_interim`).
        """
        if index not in self._final_done:
            kept = self._interim_texts.get(index)
            if kept is None or kept[0] <= samples:
                self._interim_texts[index] = (samples, result)

    async def run(self) -> None:
        """Decode each queued utterance's final and send it; send EndOfTurn after a turn's."""
        while True:
            item = await self.queue.get()
            if isinstance(item, End):
                break
            if isinstance(item, TurnEnd):
                await self._turns.send_end(item)
                continue
            await self._transcribe_final(item)

    def cancel(self) -> None:
        """Ask the speculative finals in flight to stop, without waiting."""
        for spec in self._specs.values():
            spec.task.cancel()

    async def aclose(self) -> None:
        """Cancel the speculative finals in flight (the call ends) and await them."""
        self.cancel()
        specs, self._specs = list(self._specs.values()), {}
        await asyncio.gather(*(sp.task for sp in specs), return_exceptions=True)

    def maybe_speculate(self) -> None:
        """Start the final decode once the trailing silence has settled.

        The hangover (``end_silence_ms``, 600 ms by default) is pure waiting: after
        ``settled_after_ms`` of it the utterance's speech span can no longer change unless the
        caller speaks again. Decoding from there hides most of the remaining hangover behind
        the decode. If speech resumes the speculation is cancelled; if the final differs in
        its span it is discarded and decoded normally. Only when the recogniser has nothing
        waiting, so that speculation never delays another call's final.
        """
        seg, transcriber = self._segmenter, self._transcriber
        if transcriber is None or not self.config.recognition.speculative_finals:
            return
        index = seg.utterance_index
        # With smart turn detection the utterance ends on a short hangover and this decode is
        # its final: it starts at the first silence, whatever else the recogniser has queued
        # (it is a final, scheduled as one), so that the words are known when the turn may end.
        # That silence counts from the voice model's last voiced frame, or from the last loud
        # frame (Segmenter.quiet_ms), whichever says more:
        # the model lags a fading word end by 100-200 ms. A decode started on the loud end
        # runs on while the model still hears that tail, and only a loud frame after the
        # audio it got (speech that resumes) cancels it.
        smart = self.config.recognition.turns.mode == "smart"
        spec = self._specs.get(index)
        if seg.state is SegmenterState.SPEAKING:
            resumed = not smart or (spec is not None and seg.loud_end_ms > spec.audio_end_ms)
            if spec is not None and resumed:
                del self._specs[index]
                spec.task.cancel()
                self._metrics.asr_speculative.labels("cancelled").inc()
                spec = None
            if not smart or spec is not None:
                return
        after_ms = self.config.recognition.turns.decode_after_ms if smart else seg.settled_after_ms
        if self._silence_ms(smart) < after_ms:
            return
        if spec is not None and not smart:
            return
        if spec is None and not smart and not transcriber.can_speculate():
            return
        utt = seg.preview(early=smart)
        if utt is None or utt.dropped:
            return
        if spec is not None:
            if spec.covers(utt):
                return
            # A late plosive moved the end of speech: decode the utterance as it now stands.
            spec.task.cancel()
            self._metrics.asr_speculative.labels("discarded").inc()
        options = self.asr_options()
        if self._turns.speculating(index):
            options = self._turns.options_for(options, utt)
        req = self._final_request(utt, options, index)
        task = asyncio.create_task(transcriber.transcribe(req), name=f"speculative-{index}")
        self._specs[index] = _Speculation(utt.start_ms, utt.speech_end_ms, utt.end_ms, task)
        if smart and self._final_decoded is not None:
            wake = self._final_decoded
            task.add_done_callback(lambda t: None if t.cancelled() else wake())

    def final_ready(self) -> bool:
        """Smart turns: the utterance in progress has its final decoded, standing for it.

        Its decode (started at ``decode_after_ms`` of silence) has finished without error
        and still covers the utterance as it stands (no loud frame since), so the session
        may end the utterance before the hangover runs out (``Segmenter.end_early``).
        """
        if self.config.recognition.turns.mode != "smart":
            return False
        seg = self._segmenter
        spec = self._specs.get(seg.utterance_index)
        if spec is None or not spec.task.done() or spec.task.cancelled():
            return False
        if spec.task.exception() is not None:
            return False
        utt = seg.preview()
        return utt is not None and spec.covers(utt)

    def _final_request(self, utt: Utterance, options: AsrOptions, index: int) -> AsrRequest:
        """A final decode of utterance ``index``, speculative or not.

        One shape for both, so that a speculation's result can stand for the final (bulk
        calls' finals are due later; the utterance key lets the batcher withdraw its queued
        interims). A call that sets no language and has spoken one confidently names it as
        the hint (``AsrOptions.language_hint``): the final still detects its own, and falls
        back to the call's before a window re-encode. A call whose turns read the words asks
        for the end mark's probability (``AsrOptions.end_mark``): the turn detector believes
        a full stop as far as Whisper did. A real-time call alone on the server says so
        (``AsrRequest.alone``): a CPU engine may then encode it on every core.
        """
        if options.language is None and self._learned_language is not None:
            options = replace(options, language_hint=self._learned_language)
        if self._turns.reads_end_marks:
            options = replace(options, end_mark=True)
        bulk = self._bulk()
        return AsrRequest(
            utt.audio,
            utt.stats,
            options,
            is_final=True,
            bulk=bulk,
            utterance=self.utterance(index),
            # A real-time call with the server to itself: its final may take every core.
            alone=not bulk and self._alone is not None and self._alone(),
        )

    # -- finals ------------------------------------------------------------------------------------

    async def _transcribe_final(self, utt: Utterance) -> None:
        assert self._transcriber is not None
        spec = self._specs.pop(utt.index, None)
        if spec is not None and not spec.covers(utt):
            spec.task.cancel()
            self._metrics.asr_speculative.labels("discarded").inc()
            spec = None
        options = self._turns.options_for(self.asr_options(), utt)
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
        if decoded is not None:
            # Counted here, where the call uses the decode, not in the recogniser: a
            # speculative final that finished before the caller went on is decoded again, and
            # only the decode that stands for the utterance is one.
            self._metrics.utterances.labels(decoded.dropped_reason or "text").inc()
        result = self._final_or_interim(utt.index, decoded, failure)
        turn = self._turns.final_came(
            utt.index,
            result.text if result is not None else "",
            result.end_mark_probability if result is not None else None,
            utterance=utt,
            # The call's own options (its prompt and hotwords, not the turn's words), in the
            # language this final was decoded in: what decoding the turn whole starts from.
            options=self._whole_turn_options(result),
            # The caller's words, not silence: the recogniser was unsure of them, or failed.
            lost=result is None or result.dropped_reason in _UNSURE,
            # A whole decode the turn's end waits for is requested as this final was.
            bulk=req.bulk,
            alone=req.alone,
        )
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
            "call %s: utterance %d: the final decode gave no text (%s, after steps %s); its "
            "last interim's text is the final",
            self.log_id,
            index,
            reason,
            ",".join(steps[:-1]) or "none",
        )
        return replace(interim, fallbacks=steps)

    def _whole_turn_options(self, result: AsrResult | None) -> AsrOptions:
        """The call's decoding options for its turn decoded whole, hinted at ``result``'s language.

        A call that sets no language names the one its final was just decoded in as the hint
        (the whole decode still detects its own), else the call's learned language.
        """
        options = self.asr_options()
        if options.language is None:
            hint = (result.language if result is not None else "") or self._learned_language
            if hint:
                options = replace(options, language_hint=hint)
        return options

    def _learn_language(self, options: AsrOptions, result: AsrResult) -> None:
        """Remember a final's language when it was detected confidently (for the interims)."""
        cfg = self.config.recognition.language
        if (
            cfg.learn
            and options.language is None
            and result.text
            and result.language
            and result.language_probability >= cfg.learn_min_probability
        ):
            self._learned_language = result.language

    def interim_language(self, options: AsrOptions, samples: int) -> tuple[AsrOptions, float]:
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
        cfg = self.config.recognition.language
        language = self._learned_language or cfg.interim_default or None
        if language is not None:
            return replace(options, language=language), 0.0
        if samples < cfg.interim_detect_min_ms * ASR_SAMPLE_RATE_HZ // 1000:
            return options, cfg.interim_min_probability
        return options, 0.0

    def asr_options(self) -> AsrOptions:
        """The call's decoding options with the server's degradation steps in force."""
        return self._quality.asr_options(self.config.recognition.asr_options)

    def final_imminent(self) -> bool:
        """Smart turns: the caller has been silent for half of ``decode_after_ms``.

        The utterance's final decode starts at ``decode_after_ms`` of silence, so an interim
        started now would show the client nothing the final does not show a moment later, and
        it would decode beside that final on the other core of a 2-core machine (traced: an
        interim started 150 ms after the last word ran alongside the final, which took 280 ms
        instead of 240). Speech that resumes makes interims due again.
        """
        turns = self.config.recognition.turns
        return turns.mode == "smart" and self._silence_ms(True) >= turns.decode_after_ms // 2

    def _silence_ms(self, smart: bool) -> int:
        """The caller's silence as the final decode reads it, in ms.

        From the last loud frame with smart turns (see :meth:`maybe_speculate`), from the
        last voiced one otherwise. Until 2026-12-06 the loud frame counted 80 ms later: a
        fragment decoded sooner after its loud end came back closed as a finished sentence
        more often ("And so my fellow Americans."), and the turn believed it (JFK, one caller,
        ``words``: 120/160/200 ms after the loud end gave 3/2/1 premature ends). The turn now
        reads how sure Whisper was of that full stop (``AsrResult.end_mark_probability``),
        and without the margin benchmarks.turn_taking --clips 16 gave the real clips' final
        302-308 ms p50 against 360-396 and 5-6 premature ends on the pause set against 7-8
        (docs/turns.md).
        """
        seg = self._segmenter
        if not smart:
            return seg.trailing_silence_ms
        return max(seg.trailing_silence_ms, seg.quiet_ms)

    def utterance(self, index: int) -> Hashable:
        """Utterance ``index`` of this call, as the recogniser's queue knows it."""
        return (self._asr_token, index)
