"""The caller's turns on one call: their books, for gateway/turns.py to decide on.

End of speech (the segmenter's SPEECH_END) and end of turn (the caller has finished) are
separate events. A turn opens at the SPEECH_BEGIN of its first utterance and gathers its
utterances and their finals; between utterances, on the call's own audio clock, the call's
:class:`~voxgate.gateway.turns.TurnDetector` decides from the silence, the words so far and
(``smart`` with an audio model) the end-of-turn model's probability whether it is over. A
closed turn's EndOfTurn goes out after its finals (recognition sends it when it takes the
marker off its queue); later utterances of a turn are decoded with its earlier words as their
prompt. A turn of two or more utterances is decoded again as one while it may end (``smart``,
``whole_text``): a pause splits a sentence into utterances decoded apart, and its EndOfTurn's
text is the whole decode when that is back in time.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field, replace
from typing import Protocol

import numpy as np
import numpy.typing as npt

from voxgate.common.aio import cancel_and_wait
from voxgate.engines.asr.base import AsrOptions, AsrRequest, AsrResult
from voxgate.engines.base import ASR_SAMPLE_RATE_HZ, UtteranceStats, dbfs
from voxgate.gateway.base import Transcriber
from voxgate.gateway.errors import CallError
from voxgate.gateway.events import EndOfTurnOut, OutboundEvent
from voxgate.gateway.scheduling import WithdrawnError
from voxgate.gateway.segmenter import Segmenter, SegmenterState, Utterance
from voxgate.gateway.turns import TurnDecision, TurnDetector, TurnInput, TurnOptions

__all__ = ["EndOfTurnModel", "Turn", "TurnEnd", "TurnTaking"]

log = logging.getLogger("voxgate.session")


@dataclass
class Turn:
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
    #: Utterance index -> Whisper's probability of the end mark closing its final, if reported.
    end_marks: dict[int, float] = field(default_factory=dict)
    #: Utterance index -> the utterance as decoded (its audio, for the whole-turn decode).
    utterances: dict[int, Utterance] = field(default_factory=dict)
    #: Utterances whose final lost the caller's words: no text because the recogniser was
    #: unsure of it (a low log-prob, a loop) or failed, not because it heard no speech.
    lost: set[int] = field(default_factory=set)
    #: The whole-turn decode in flight or done: the last utterance it holds, and its task.
    whole: tuple[int, asyncio.Task[AsrResult | None]] | None = None
    #: Longer than one window: not decoded whole (and its audio no longer kept).
    too_long: bool = False

    def whole_text(self) -> str | None:
        """The whole-turn decode's text, if it holds every utterance and is back and sane.

        Sane: it has text, no gate dropped it, and it has between half and twice the words of
        the finals joined (a decode that lost or invented a clause is not the turn's text).
        """
        if self.whole is None or self.whole[0] != self.last_utterance:
            return None
        task = self.whole[1]
        if not task.done() or task.cancelled() or task.exception() is not None:
            return None
        result = task.result()
        if result is None or result.dropped_reason or not result.text.strip():
            return None
        words, joined = len(result.text.split()), len(self.text().split())
        if not joined or not joined / 2 <= words <= 2 * joined:
            return None
        return result.text.strip()

    def end_mark(self) -> float | None:
        """The end mark's probability of the turn's last final with text (None: not reported)."""
        said = [i for i, t in self.texts.items() if t.strip()]
        return self.end_marks.get(max(said)) if said else None

    def text(self, before: int | None = None) -> str:
        """The turn's finals joined, in order (only those of utterances before ``before``)."""
        return " ".join(
            t.strip()
            for i, t in sorted(self.texts.items())
            if t.strip() and (before is None or i < before)
        )


@dataclass(frozen=True, slots=True)
class TurnEnd:
    """Recognition queue marker: the turn is over; the asr task sends EndOfTurn after its finals."""

    turn: Turn
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

#: The longest turn decoded whole, samples: one encoder window, with room for its padding.
_WHOLE_MAX_SAMPLES = 28 * ASR_SAMPLE_RATE_HZ

#: The least the EndOfTurn of a turn that lost words waits for the turn decoded whole, s
#: (the wait is the recogniser's decode budget where that is longer; see ``TurnTaking``).
#: Otherwise the bot answers a sentence with a hole in it; a turn's whole decode takes
#: 0.2-0.5 s of one core on the bundled base model (one encoder window and its words).
_LOST_WORDS_WAIT_S = 1.0


class TurnTaking:
    """The turns of one call.

    Args:
        options: the call's turn detection (off: only :meth:`options_for` and the books of
            utterances, which then stay empty).
        segmenter: the call's segmenter (its state and audio clock).
        transcriber: the recogniser (it encodes a turn's words as a prompt), if any.
        turn_model: the audio end-of-turn model ``smart`` detection consults, if any.
        emit: queues an event for the client.
        log_id: the call's id in log lines.
        decode_budget_s: the recogniser's latency budget for one final's decode
            (``asr.policy.decode_budget_s``): how long the end of a turn that lost words waits
            for the turn decoded whole (at least ``_LOST_WORDS_WAIT_S``). That decode is
            requested as a final is, so it is promised what a final is; on a machine whose
            cores other work holds it takes longer than the unloaded 0.2-0.5 s (1.1 s for JFK's
            turn beside one busy process), and a fixed second sent the sentence with its hole.
    """

    def __init__(
        self,
        options: TurnOptions,
        segmenter: Segmenter,
        transcriber: Transcriber | None,
        turn_model: EndOfTurnModel | None,
        *,
        emit: Callable[[OutboundEvent], Awaitable[None]],
        log_id: str,
        decode_budget_s: float,
    ) -> None:
        self._segmenter = segmenter
        self._lost_words_wait_s = max(_LOST_WORDS_WAIT_S, decode_budget_s)
        self._transcriber = transcriber
        self._emit = emit
        self.log_id = log_id
        # The open turn, the turns of utterances whose finals have not been sent, and the
        # next turn's index.
        self._turns = TurnDetector(options) if options.on else None
        self._turn: Turn | None = None
        self._turn_of: dict[int, Turn] = {}
        self._next_turn = 0
        self._pending_turn_ends: list[TurnEnd] = []
        self._turn_model = turn_model if options.mode == "smart" and options.audio_model else None
        # The last seconds of the caller's audio (what the turn model reads), newest last.
        self._recent: deque[np.ndarray] = deque()
        self._recent_samples = 0
        self._turn_model_tasks: set[asyncio.Task[None]] = set()
        # Utterances whose turn-model run waits for their final decode (set when it comes).
        self._final_waits: dict[int, asyncio.Event] = {}
        self._whole = options.on and options.mode == "smart" and options.whole_text
        self._whole_tasks: set[asyncio.Task[AsrResult | None]] = set()

    @property
    def on(self) -> bool:
        """Whether the call detects the end of turns."""
        return self._turns is not None

    @property
    def hears_audio(self) -> bool:
        """Whether :meth:`remember` wants the caller's audio (an audio model reads it)."""
        return self._turn_model is not None

    def speech_began(self, index: int) -> None:
        """SPEECH_BEGIN of utterance ``index``: it opens a turn unless one is open.

        In an open turn the caller goes on: its whole-turn decode lacks this utterance (the
        next final starts another).
        """
        if self._turns is not None and self._turn is None:
            self._turn = Turn(self._next_turn, index)
            self._next_turn += 1
        elif self._turn is not None and self._turn.whole is not None:
            self._turn.whole[1].cancel()
            self._turn.whole = None

    def speech_ended(self, index: int, offset_ms: int, at: float) -> None:
        """SPEECH_END of utterance ``index`` at call offset ``offset_ms``, loop time ``at``."""
        if self._turn is not None:
            self._turn.last_utterance = index
            self._turn.speech_end_ms = offset_ms
            self._turn.speech_end_at = at
            self._ask_turn_model(self._turn, index)

    def queued(self, index: int) -> None:
        """Utterance ``index`` was queued for its final."""
        if self._turn is not None:
            self._turn.pending.add(index)
            self._turn.queued += 1
            self._turn_of[index] = self._turn

    def speculating(self, index: int) -> bool:
        """Utterance ``index``'s final decode starts early: it belongs to the open turn.

        Returns:
            Whether a turn is open (then its earlier words are the decode's prompt).
        """
        if self._turn is None:
            return False
        self._turn_of.setdefault(index, self._turn)
        return True

    @property
    def reads_end_marks(self) -> bool:
        """Whether the call's finals report their end mark's probability (words decide turns)."""
        turns = self._turns
        return turns is not None and turns.options.mode == "smart" and turns.options.words

    def final_came(
        self,
        index: int,
        text: str,
        end_mark: float | None = None,
        *,
        utterance: Utterance | None = None,
        options: AsrOptions | None = None,
        lost: bool = False,
        bulk: bool = True,
        alone: bool = False,
    ) -> Turn | None:
        """Utterance ``index``'s final came back with ``text``: its turn, if it has one.

        With ``utterance`` (as decoded) and the call's decoding ``options``, a turn that now
        holds two or more utterances with text, all of them back, is decoded again as one
        (:meth:`_decode_whole`). ``lost``: the final lost the caller's words (no text, the
        recogniser unsure or failed); the whole decode hears that utterance too. ``bulk`` and
        ``alone``: as the final's request was (a call sending faster than real time; the call
        alone on the server), for a whole decode the turn's end waits for.
        """
        wait = self._final_waits.pop(index, None)
        if wait is not None:
            wait.set()
        turn = self._turn_of.pop(index, None)
        if turn is not None:
            turn.texts[index] = text
            if lost and not text.strip():
                turn.lost.add(index)
            if end_mark is not None:
                turn.end_marks[index] = end_mark
            turn.pending.discard(index)
            if utterance is not None and self._whole and not turn.too_long:
                turn.utterances[index] = utterance
                if sum(len(u.audio) for u in turn.utterances.values()) > _WHOLE_MAX_SAMPLES:
                    turn.too_long = True
                    turn.utterances.clear()
            if options is not None:
                self._decode_whole(turn, options, bulk=bulk, alone=alone)
        return turn

    def _decode_whole(self, turn: Turn, options: AsrOptions, *, bulk: bool, alone: bool) -> None:
        """Decode the open turn's utterances as one, from spare capacity, while it may end.

        A pause ends an utterance, not its turn, and each part is decoded on its own (with the
        turn's earlier words as its prompt): "The codon is chest. Still dripping blood." for
        "The cut on his chest is still dripping blood". Decoded whole, the sentence comes
        back as one (benchmarks.turn_taking, one caller: the pause set's turn WER 0.070
        against the finals' 0.100; docs/turns.md). The finals already sent stand; EndOfTurn's
        text is this decode when it holds every utterance of the turn and is back when the
        turn ends, else the finals joined, so the end of the turn does not wait for it (but
        for a turn that lost words, below).
        Scheduled as a bulk final (after every real-time final, on a spare worker): at load it
        may come back too late, and then it is not used.

        An utterance whose final lost its words (:attr:`Turn.lost`) is decoded whole with the
        rest: a short word alone, with nothing around it, is where Whisper is least sure (JFK's
        shouted "ask", 0.4 s between crowd noise, came back with no text), and in its sentence
        it is heard. Such a turn's EndOfTurn waits for this decode (:meth:`send_end`), so it is
        requested as the utterances' finals are (``bulk`` and ``alone`` as theirs: a real-time
        final, on every core when the call is alone), not from spare capacity.
        """
        if not self._whole or self._transcriber is None or turn is not self._turn or turn.too_long:
            return
        if turn.pending or self._segmenter.state is not SegmenterState.QUIET:
            return  # the words are not all back, or the caller goes on
        heard = [i for i, t in sorted(turn.texts.items()) if t.strip() or i in turn.lost]
        parts = [turn.utterances.get(i) for i in heard]
        if len(parts) < 2 or any(p is None for p in parts) or not turn.text():
            return
        utts = [p for p in parts if p is not None]
        audio = np.concatenate([u.audio for u in utts])
        if turn.whole is not None:
            turn.whole[1].cancel()
        speech_ms = sum(u.stats.speech_ms for u in utts)
        duration_ms = len(audio) * 1000 // ASR_SAMPLE_RATE_HZ
        stats = UtteranceStats(
            duration_ms=duration_ms,
            speech_ms=speech_ms,
            speech_ratio=speech_ms / max(1, duration_ms),
            leading_silence_ms=utts[0].stats.leading_silence_ms,
            trailing_silence_ms=utts[-1].stats.trailing_silence_ms,
            rms_dbfs=dbfs(audio),
            speech_rms_dbfs=max(u.stats.speech_rms_dbfs for u in utts),
            peak_dbfs=max(u.stats.peak_dbfs for u in utts),
        )
        options = replace(options, word_timestamps=False, end_mark=False)
        # Named for the queue as the utterances are (a final withdraws the queued interims of
        # its name): this turn of this call, which has no interims.
        request = AsrRequest(
            audio,
            stats,
            options,
            is_final=True,
            # Spare-capacity work, unless the turn's end waits for it (a part lost its words).
            bulk=bulk or not turn.lost,
            utterance=(self, "turn", turn.index),
            whole_turn=True,
            alone=alone and bool(turn.lost),  # a final's ``alone`` is never bulk
        )
        transcriber = self._transcriber

        async def decode() -> AsrResult | None:
            try:
                return await transcriber.transcribe(request)
            except (CallError, WithdrawnError):
                return None  # no capacity to spare: the finals joined are the text
            except Exception:  # an engine fault costs this text, not the turn or the call
                log.exception("call %s: decoding turn %d whole failed", self.log_id, turn.index)
                return None

        task = asyncio.create_task(decode(), name="whole-turn")
        self._whole_tasks.add(task)
        task.add_done_callback(self._whole_tasks.discard)
        turn.whole = (turn.last_utterance, task)

    def take_ends(self) -> list[TurnEnd]:
        """The turns closed since last asked, for recognition's queue (after their utterances)."""
        ends, self._pending_turn_ends = self._pending_turn_ends, []
        return ends

    def cancel(self) -> None:
        """Ask the turn model's runs and the whole-turn decodes to stop, without waiting."""
        for task in (*self._turn_model_tasks, *self._whole_tasks):
            task.cancel()

    async def aclose(self) -> None:
        """Cancel the turn model's runs and the whole-turn decodes in flight (the call ends)."""
        await cancel_and_wait(*self._turn_model_tasks, *self._whole_tasks)

    def check(self) -> None:
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
        end_mark = turn.end_mark() if text is not None else None
        decision = detector.decide(TurnInput(silence, text, audio, end_mark))
        if decision.end:
            self._end_turn(decision, silence)

    def _end_turn(self, decision: TurnDecision, silence_ms: int) -> None:
        """Close the open turn; its EndOfTurn goes out after its finals (recognition sends it)."""
        turn, self._turn = self._turn, None
        if turn is None:
            return
        if turn.queued == 0:
            # Nothing in it was long enough to transcribe: no turn; its index is reused.
            if turn.index == self._next_turn - 1:
                self._next_turn -= 1
            return
        self._pending_turn_ends.append(TurnEnd(turn, decision, silence_ms))

    def ended_by(self, reason: str) -> None:
        """End the open turn at once (the client flushed, or the call is ending)."""
        if self._turn is not None and self._turn.last_utterance >= 0:
            silence = max(0, self._segmenter.offset_ms - self._turn.speech_end_ms)
            self._end_turn(TurnDecision(True, 1.0, reason), silence)

    def remember(self, samples: np.ndarray) -> None:
        """Keep the last 8 s of the caller's (16 kHz, gated) audio for the turn model."""
        self._recent.append(samples)
        self._recent_samples += len(samples)
        while self._recent and self._recent_samples - len(self._recent[0]) >= _TURN_AUDIO_SAMPLES:
            self._recent_samples -= len(self._recent.popleft())

    def _ask_turn_model(self, turn: Turn, index: int) -> None:
        """Run the audio end-of-turn model on the audio up to now, on a worker thread.

        The run waits for the utterance's final decode when one is in flight: the final is
        what the caller waits for, and on a busy machine the model's 60-70 ms of one core
        beside the decode delayed it (23 ms p50 on the 40 clips, 31 of 36 later; docs/turns.md).
        The turn needs both anyway, and its hold is longer than the model's run.
        """
        model = self._turn_model
        if model is None:
            return
        audio = np.concatenate(list(self._recent)) if self._recent else np.zeros(0, np.float32)

        async def run() -> None:
            if index in turn.pending:  # queued, its final not back yet
                wait = self._final_waits.setdefault(index, asyncio.Event())
                await wait.wait()
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

    def options_for(self, options: AsrOptions, utt: Utterance) -> AsrOptions:
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

    async def send_end(self, end: TurnEnd) -> None:
        """Send a closed turn's EndOfTurn (after its finals).

        Its text is the turn decoded whole if that is back (:meth:`_decode_whole`), else its
        finals joined. A turn that lost words (:attr:`Turn.lost`) waits for that decode, up to
        the decode budget (at least ``_LOST_WORDS_WAIT_S``): its finals joined have a hole
        where the words were. Every other turn ends without waiting.
        """
        turn = end.turn
        whole = turn.whole
        if turn.lost and whole is not None and whole[0] == turn.last_utterance:
            await asyncio.wait({whole[1]}, timeout=self._lost_words_wait_s)
        text = turn.whole_text() or turn.text()
        if turn.whole is not None:
            turn.whole[1].cancel()  # a decode still running is of no use now
        loop = asyncio.get_running_loop()
        latency = int((loop.time() - turn.speech_end_at) * 1000) if turn.speech_end_at else 0
        await self._emit(
            EndOfTurnOut(
                turn_index=turn.index,
                probability=end.decision.probability,
                offset_ms=turn.speech_end_ms,
                text=text,
                first_utterance_index=turn.first_utterance,
                last_utterance_index=turn.last_utterance,
                reason=end.decision.reason,
                silence_ms=end.silence_ms,
                latency_ms=max(0, latency),
            )
        )
