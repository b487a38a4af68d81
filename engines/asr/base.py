"""The ASR engine contract: what the gateway hands an engine and what it gets back.

Threading: an :class:`AsrEngine` is used from one worker thread at a time; the gateway's batcher
owns those threads. ``infer_batch`` is eager (no lazy generators cross the thread boundary) and
returns exactly one :class:`AsrResult` per :class:`AsrRequest`, in order. An engine may also be a
:class:`StepAsrEngine` (iteration-level batching: utterances join a running batch).
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Literal, Protocol, Self

from voxgate.engines.base import FloatArray, UtteranceStats

__all__ = [
    "AsrAlternative",
    "AsrEngine",
    "AsrOptions",
    "AsrRequest",
    "AsrResult",
    "AsrWord",
    "StepAsrEngine",
]


@dataclass(frozen=True, slots=True)
class AsrOptions:
    """Per-call decoding options (from the proto's ``DecodingOptions``), validated by the gateway.

    Attributes:
        language: ISO 639-1 code, or ``None`` to detect per utterance.
        task: ``transcribe`` or ``translate`` (to English).
        beam_size: 1 = greedy.
        mbr_candidates: >1 turns on MBR selection over that many N-best candidates.
        num_alternatives: N-best alternatives to return besides the best one.
        word_timestamps: return per-word times.
        initial_prompt: text that conditions the decoder (vocabulary, style).
        hotwords: words to bias toward; folded into the prompt. A hotword written
            ``phrase^boost`` (e.g. ``voxgate^6``) is also boosted token by token in the decoder
            (``voxgate.engines.asr._phrases``; boost in nats, at most 10).
        silence_aware: apply the silence-aware policy (skip, suppress, gate); on by default.
        context_tokens: ``initial_prompt`` and ``hotwords`` already tokenised (once per call,
            by the gateway); ``None`` makes the engine tokenise them itself.
        encoder_margin_ms: padding that must fit after the utterance in its encoder bucket;
            ``None`` = the engine's ``encoder.margin_ms``. The gateway lowers it under load
            (a smaller bucket is a cheaper encode).
        model: which loaded model decodes the request: ``""`` = the server's default, else
            the gateway's routing key of a named model (``voxgate.gateway.models``). Part of the
            batch key, so one batch never mixes models. An engine ignores it (it is one model).
        language_hint: with ``language`` None, the language the call has spoken so far (its
            confidently detected finals'). The utterance is still detected (a caller may
            switch language), but when the decode in the detected language fails, the hint is
            the first language retried: detection on under a second of speech is unreliable
            (a 0.9 s "He is with us" of an English call came out Greek, and its only retry
            was a 30 s window re-encode in Greek again).
        end_mark: report :attr:`AsrResult.end_mark_probability` (set by the gateway on the
            finals of calls whose turn detection reads the words). Off elsewhere: it makes the
            decoder return every step's vocabulary, which is free on one CPU decode but not
            on a large GPU batch.
    """

    language: str | None = "en"
    task: Literal["transcribe", "translate"] = "transcribe"
    beam_size: int = 1
    mbr_candidates: int = 0
    num_alternatives: int = 0
    word_timestamps: bool = True
    initial_prompt: str = ""
    hotwords: tuple[str, ...] = ()
    silence_aware: bool = True
    context_tokens: tuple[int, ...] | None = None
    encoder_margin_ms: int | None = None
    model: str = ""
    language_hint: str | None = None
    end_mark: bool = False


@dataclass(frozen=True, slots=True)
class AsrRequest:
    """One utterance to transcribe.

    Attributes:
        audio: float32 mono samples at 16 kHz.
        stats: VAD statistics of the utterance, consumed by the decoding policy.
        options: the call's decoding options.
        is_final: False for an interim re-decode of a growing utterance.
        voiced_spans_ms: the VAD's voiced spans (start, end) in ms from the utterance start,
            for the silence-aware end-of-text processor; empty = only the leading and
            trailing silence from ``stats`` are known.
        urgent: an interim whose words may stop the bot's reply (``after_words`` barge-in):
            while it waits the caller and the bot talk at once, so it is scheduled as a final
            is. The engine decodes it like any interim.
        bulk: from a call sending audio faster than real time (a file): scheduled after
            real-time finals, from spare capacity. Scheduling only; the engine ignores it.
        utterance: which utterance of which call this decodes (any hashable, unique per
            utterance; None = unnamed): when its final is submitted, that utterance's interims
            still queued leave the queue, so that none runs ahead of, or in one batch with,
            the final it is superseded by. Scheduling only; the engine ignores it.
        whole_turn: a turn decoded again as one, after its utterances' finals (smart turns,
            gateway/call/turn_taking.py): a second pass over speech already counted, so the
            gateway's metrics count it as kind ``turn``, not as a final or an utterance.
            Accounting only; the engine ignores it.
        alone: a final of the only call on the server, with no reply being synthesized (the
            session asks the server when it makes the request): a CPU engine may run its
            encoder pass on every core (``WhisperConfig.lone_encode_threads``), since no other
            call's work would share them. False = one worker's threads, as for any request.
    """

    audio: FloatArray
    stats: UtteranceStats
    options: AsrOptions = field(default_factory=AsrOptions)
    is_final: bool = True
    voiced_spans_ms: tuple[tuple[int, int], ...] = ()
    urgent: bool = False
    bulk: bool = False
    utterance: Hashable = None
    whole_turn: bool = False
    alone: bool = False

    @property
    def batch_key(self) -> Hashable:
        """Options that CTranslate2 applies to a whole ``generate`` call; items must agree."""
        o = self.options
        return (
            o.model,
            o.task,
            o.beam_size,
            o.mbr_candidates,
            o.num_alternatives,
            o.word_timestamps,
        )


@dataclass(frozen=True, slots=True)
class AsrWord:
    """A recognised word with times in ms relative to the utterance start."""

    text: str
    start_ms: int
    end_ms: int
    probability: float


@dataclass(frozen=True, slots=True)
class AsrAlternative:
    """Another hypothesis for the same utterance."""

    text: str
    confidence: float


@dataclass(frozen=True, slots=True)
class AsrResult:
    """The outcome for one request.

    Attributes:
        text: the transcript; empty when the policy skipped or gated the utterance.
        words: per-word timing (empty when not requested).
        confidence: exp(average token log-probability), in [0, 1].
        no_speech_prob: Whisper's no-speech probability.
        avg_logprob: average token log-probability of the chosen hypothesis.
        compression_ratio: gzip compression ratio of the text (repetition detector).
        language: detected or fixed language code.
        language_probability: how sure the engine is of ``language``: Whisper's detection
            probability when it detected it (a caller's session learns its language only from
            a confident detection, and a short interim prefix's detection is unreliable), 1.0
            when the request fixed the language or the model knows only that one, 0.0 when
            no language was decided (a refusal before any decode).
        alternatives: N-best alternatives, best first, excluding ``text``.
        dropped_reason: why the text is empty (``too_short``, ``too_quiet``, ``no_speech``,
            ``low_logprob``, ``repetition``, ``hallucination``), or ``""``.
        encoded_frames: mel frames the encoder ran on (cost accounting for benchmarks).
        fallbacks: the retry steps the decode took, in order: ``window`` (re-encoded on the
            full 30 s window: the bucket was too short for the model), ``temperature`` (sampled
            again, hotter), ``language`` (the runner-up detected language) and ``prompt``
            (a final decoded again without its prompt: the prompted decode failed, or its text
            stopped short of its speech, ``_policy.cut_short``). Each costs
            about one more decode; a model trained on the serving windows needs fewer
            ``window`` steps (docs/adapt.md), which the gateway's metrics show per model.
            A last ``budget`` says the ladder was cut: its next step would have ended after
            the item's latency budget (``DecodingPolicyConfig.decode_budget_s``), so the text
            is the best of the attempts made. The gateway appends ``interim`` when a final
            had no text of its own and carries its utterance's last interim instead.
        end_mark_probability: with ``AsrOptions.end_mark``, how sure the decoder was that the
            text ends where it closed it with a sentence-final mark: at the step that chose
            the mark, the probability of any closing mark (``.``, ``?``, ``!``, with closing
            quotes or brackets) or of ending there without one, against going on (a comma,
            an ellipsis, a next word). None when the text does not end on a mark, or the
            engine does not report it. Whisper closes a fragment cut off by a pause ("He was
            not.") with a full stop as readily as a finished sentence, but less surely: on the
            turn-taking pause set the median was 0.91 at mid-sentence pauses and 0.96 at the
            clips' ends, and a quarter of the pauses were under 0.78.
    """

    text: str
    words: tuple[AsrWord, ...] = ()
    confidence: float = 0.0
    no_speech_prob: float = 0.0
    avg_logprob: float = 0.0
    compression_ratio: float = 0.0
    language: str = ""
    language_probability: float = 0.0
    alternatives: tuple[AsrAlternative, ...] = ()
    dropped_reason: str = ""
    encoded_frames: int = 0
    fallbacks: tuple[str, ...] = ()
    end_mark_probability: float | None = None


class AsrEngine(Protocol):
    """A speech recogniser that decodes many utterances in one call.

    Threading: not thread-safe; the gateway calls every method from one worker thread.
    """

    name: str

    def warmup(self) -> None:
        """Run one tiny inference so the first real call does not pay for lazy init."""
        ...

    @property
    def languages(self) -> tuple[str, ...]:
        """Language codes ``AsrOptions.language`` may name."""
        ...

    def sibling(self) -> Self:
        """Another engine over the same loaded model, for another worker thread."""
        ...

    def encode_context(self, initial_prompt: str, hotwords: Sequence[str]) -> tuple[int, ...]:
        """A call's prompt and hotwords as decoder context tokens (thread-safe)."""
        ...

    def infer_batch(self, items: Sequence[AsrRequest]) -> list[AsrResult]:
        """Transcribe ``items`` together; one result per item, in order."""
        ...

    def close(self) -> None:
        """Release the model."""
        ...


class StepAsrEngine(AsrEngine, Protocol):
    """An engine that keeps one decode batch open while utterances join and leave (vLLM-shaped).

    The gateway's batcher drives it with ``batcher.join_running`` (it matches
    ``voxgate.gateway.scheduling.StepEngine`` structurally; engines do not import the gateway):
    the scheduler decides which utterances run and join; the engine only adds, steps and
    aborts what it is given and never calls back into the scheduler. Keys are the
    scheduler's names for its requests (any hashable, unique among the open ones).
    """

    @property
    def continuous(self) -> bool:
        """Whether :meth:`add` / :meth:`step` really join utterances at decode steps."""
        ...

    @property
    def capacity(self) -> int:
        """The most requests decoding at once."""
        ...

    @property
    def open_count(self) -> int:
        """Requests added and not yet finished."""
        ...

    def has_unfinished(self) -> bool:
        """Whether a request is open or a finished one waits to be returned by :meth:`step`."""
        ...

    def add(self, requests: Sequence[tuple[Hashable, AsrRequest]]) -> None:
        """Start decoding ``requests`` (key, request); they join the next step."""
        ...

    def step(self) -> list[tuple[Hashable, AsrResult]]:
        """Advance every open request one decode step; (key, result) of those that finished.

        A request is returned once, when its last round (fallbacks included) is done.
        """
        ...

    def abort(self, keys: Iterable[Hashable]) -> None:
        """Drop the requests of ``keys``; no result comes for them."""
        ...
