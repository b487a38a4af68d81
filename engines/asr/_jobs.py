"""A recognition job's state across decode rounds, and the retry ladder that moves it on.

:class:`Job` is one ≤30 s chunk of one request; every decode of it is an :class:`Attempt`. After
each decode :func:`next_step` decides, against the job's own latency budget, whether it is done
or takes the ladder's next step (runner-up language, full window, hotter temperature); when it
is done :func:`chosen_attempt` picks what it keeps and :func:`merge` joins a request's chunks
into its result. The engine's batch path (``infer_batch``) and its step path (``add`` /
``step``) share all of it, so a fallback is decided the same way whichever path ran the decode.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np
import numpy.typing as npt
from faster_whisper.tokenizer import _LANGUAGE_CODES

from voxgate.engines.asr import _policy as policy
from voxgate.engines.asr.base import AsrAlternative, AsrOptions, AsrRequest, AsrResult, AsrWord
from voxgate.engines.asr.config import FULL_WINDOW_FRAMES, MEL_FRAMES_PER_S, WhisperConfig
from voxgate.engines.base import ASR_SAMPLE_RATE_HZ, FloatArray, UtteranceStats

__all__ = [
    "Attempt",
    "EngineCounters",
    "Hyp",
    "Job",
    "chosen_attempt",
    "end_mark_probability",
    "is_end_mark",
    "language_probability",
    "merge",
    "next_step",
    "plan_jobs",
    "refusal",
]

_log = logging.getLogger(__name__)

#: Samples in Whisper's 30 s window.
_WINDOW_SAMPLES = 30 * ASR_SAMPLE_RATE_HZ


@dataclass(slots=True)
class EngineCounters:
    """Cumulative cost counters, for benchmarks and metrics (reset with ``reset()``).

    Attributes:
        encode_s: wall time inside ``encode``.
        generate_s: wall time inside ``generate``.
        align_s: wall time inside ``align``.
        detect_s: wall time inside ``detect_language``.
        encoded_frames: mel frames sent through the encoder.
        window_fallbacks: items re-encoded on the full window.
        prompt_fallbacks: decode retries without the prompt (a prompted decode failed).
        temperature_fallbacks: decode retries at a higher temperature.
        language_fallbacks: decode retries in the runner-up detected language.
        budget_cuts: items whose retry ladder stopped because the next step would have ended
            after their latency budget (``DecodingPolicyConfig.decode_budget_s``).
        loop_s: wall time inside our own decode loop.
        loop_items: decodes run by the loop instead of ``generate``.
        loop_steps: decoder steps the loop ran (one step serves every live item).
        loop_rows: rows those steps decoded (one per live item and beam); with items decoding
            together, ``loop_rows`` exceeds ``loop_steps``.
        loop_joined: loop decodes that joined a batch mid-run (``add`` after the batch's
            first step, while another item was still decoding).
        lone_encodes: encoder passes of finals run on ``lone_encode_threads`` (the call alone
            on the server, no other worker busy).
    """

    encode_s: float = 0.0
    generate_s: float = 0.0
    align_s: float = 0.0
    detect_s: float = 0.0
    encoded_frames: int = 0
    window_fallbacks: int = 0
    prompt_fallbacks: int = 0
    temperature_fallbacks: int = 0
    language_fallbacks: int = 0
    budget_cuts: int = 0
    loop_s: float = 0.0
    loop_items: int = 0
    loop_steps: int = 0
    loop_rows: int = 0
    loop_joined: int = 0
    lone_encodes: int = 0

    def reset(self) -> None:
        """Zero every counter."""
        for name in self.__slots__:
            setattr(self, name, type(getattr(self, name))())


@dataclass(slots=True)
class Hyp:
    """One hypothesis of a decode: its text tokens and scores."""

    tokens: list[int]
    text: str
    avg_logprob: float
    cum_logprob: float
    #: See ``AsrResult.end_mark_probability``; None unless asked for and the text ends on a mark.
    end_mark: float | None = None


@dataclass(slots=True)
class Attempt:
    """One decode of a job: where and how it ran, its hypotheses and whether it failed."""

    frames: int
    language: str
    temperature: float
    hyps: list[Hyp]
    no_speech_prob: float
    degenerate: bool
    #: Degenerate in a way only short encoder windows were seen to be (a phrase said twice, a
    #: recital of the prompt): the full window is its first retry, before a runner-up language.
    window_artifact: bool = False
    #: A final's text stopped short of its speech (``_policy.cut_short``): it ranks below every
    #: attempt that did not. An empty decode scores a log-prob of 0, the best there is, so
    #: without this a runner-up language's empty text on 2 s of speech ("zh" for "Pat has
    #: taught them that he's in charge here") outranked the English words.
    short: bool = False
    #: Decoded with previous text (the prompt, the hotwords) in the decoder's context.
    prompted: bool = False


@dataclass(slots=True)
class Job:
    """One ≤30 s chunk of one request, with its decoding state across rounds."""

    req: int
    offset_s: float
    audio: FloatArray
    options: AsrOptions
    stats: UtteranceStats
    plan: policy.DecodingPlan
    language: str | None
    frames: int
    temp_idx: int = 0
    #: Runner-up detected languages worth a decode if the detected one fails (see _detect).
    alt_languages: list[str] = field(default_factory=list)
    #: Detection probabilities of the detected language and its runners-up; empty when the
    #: language was given (the request's, or the only one of an English-only model).
    language_probs: dict[str, float] = field(default_factory=dict)
    encoder_out: dict[int, npt.NDArray[Any]] = field(default_factory=dict)
    #: The VAD's voiced spans (ms), for the silence-aware end of text; single-chunk jobs only.
    voiced_spans_ms: tuple[tuple[int, int], ...] = ()
    attempts: list[Attempt] = field(default_factory=list)
    #: The retry steps taken, in order (``AsrResult.fallbacks``).
    fallbacks: list[str] = field(default_factory=list)
    encoded_frames: int = 0
    done: bool = False
    #: When the job's latency budget ends, on the engine's clock (``plan.budget_s`` after the
    #: engine started on it); no retry starts that would end after it.
    deadline: float = math.inf
    #: How long the job's last decode round took (the whole round: the job waits for all of
    #: it), the estimate of what its next retry costs.
    decode_s: float = 0.0
    #: When its decode in our loop began (``add`` / ``step``), on the engine's clock.
    round_started: float = 0.0
    #: May encode on every core: a final (``AsrRequest.is_final``) of a call alone on the server
    #: (``AsrRequest.alone``).
    wide: bool = False

    @property
    def content_frames(self) -> int:
        """Mel frames of real audio in the job (at most the full window)."""
        return min(FULL_WINDOW_FRAMES, len(self.audio) // (ASR_SAMPLE_RATE_HZ // MEL_FRAMES_PER_S))


def runner_up_languages(
    ranked: Sequence[tuple[str, float]], min_prob: float, hint: str | None
) -> list[str]:
    """The languages a job retries in when its decode in the detected one fails, in order.

    ``ranked`` is the detection, most likely first (the first is the detected language). The
    call's language (``AsrOptions.language_hint``) comes first where detection disagrees with
    it; then the detection's runners-up of at least ``min_prob``: a close runner-up is worth
    a decode of its own (a Scottish "anything is possible in football": Welsh 0.51, English
    0.48).
    """
    detected = ranked[0][0]
    out = [hint] if hint and hint != detected else []
    out += [code for code, prob in ranked[1:] if prob >= min_prob and code not in out]
    return out


def _retry_step(job: Job, cfg: WhisperConfig) -> str | None:
    """The ladder's next step for a job whose last decode failed, or None at its end.

    The order: without the prompt (a final whose last decode had one, ``Attempt.prompted``), the
    runner-up detected language, the full window, a hotter temperature (the full window first
    after a short window's own artifact, ``Attempt.window_artifact``); short speech stops after
    ``plan.max_fallbacks`` steps.

    The prompt goes first because, where a prompted decode fails, the prompt is the likeliest
    cause (openai-whisper drops it too, from temperature 0.5 on) and the cheapest retry: one
    greedy decode on the encoder output the job already has.
    """
    if len(job.fallbacks) >= job.plan.max_fallbacks:
        return None
    window = (
        job.frames < FULL_WINDOW_FRAMES
        and cfg.encoder.fallback_to_full_window
        and job.plan.window_fallback
    )
    if window and job.attempts and job.attempts[-1].window_artifact:
        return "window"  # the window's fault, not the language's (short speech: one retry)
    if job.plan.prompt_fallback and job.attempts and job.attempts[-1].prompted:
        return "prompt"
    if job.alt_languages:
        return "language"
    if window:
        return "window"
    if job.temp_idx + 1 < len(job.plan.temperatures):
        return "temperature"
    return None


def without_prompt(options: AsrOptions) -> AsrOptions:
    """``options`` without previous text: neither the prompt nor the hotwords in the context.

    The ``hotwords`` field itself stays, for whatever else reads it; only the tokens go.
    """
    return replace(options, initial_prompt="", context_tokens=())


def encode_cost(encode_cost_s: Mapping[int, float], frames: int) -> float:
    """Expected seconds to encode one item on ``frames``: measured, else scaled up.

    ``warmup`` measures the full window; an engine that was not warmed up scales its largest
    measured encode by the frame ratio (an underestimate: the cost grows faster).
    """
    if frames in encode_cost_s:
        return encode_cost_s[frames]
    if not encode_cost_s:
        return 0.0
    known = max(encode_cost_s)
    return encode_cost_s[known] * frames / known


def _retry_fits(job: Job, step: str, now: float, encode_cost_s: Mapping[int, float]) -> bool:
    """Whether ``step`` is expected to end before the job's deadline.

    A retry costs about what the job's last round did (the same decode at another language or
    temperature), plus a full-window encode for a ``window`` step. Measured, not configured,
    so a loaded machine or a slow device retries less by itself.
    """
    if now >= job.deadline:
        return False
    plan = job.plan
    rows = (plan.beam_size if job.temp_idx == 0 else plan.best_of, plan.best_of)
    if step == "temperature" and rows[0] < rows[1]:
        # Sampling decodes best_of rows where greedy decoded one: the first hotter round took
        # 2.3x the greedy one for best_of 5 on the 2-core CPU (15 s of speech); sqrt(rows) is
        # that ratio, and on a GPU an overestimate.
        cost = job.decode_s * math.sqrt(rows[1] / rows[0])
    else:
        cost = job.decode_s
    if step == "window" and FULL_WINDOW_FRAMES not in job.encoder_out:
        cost += encode_cost(encode_cost_s, FULL_WINDOW_FRAMES)
    return now + cost <= job.deadline


def next_step(
    job: Job,
    now: float,
    cfg: WhisperConfig,
    counters: EngineCounters,
    encode_cost_s: Mapping[int, float],
) -> None:
    """After a decode: the job is done, or takes the ladder's next step if it fits.

    A step that would end after the job's deadline is not taken: the job leaves with its best
    attempt so far (:func:`chosen_attempt`) and ``budget`` ends its fallbacks.

    Args:
        job: the job whose last attempt was just recorded.
        now: the engine's clock.
        cfg: the engine's settings (whether a window fallback is allowed).
        counters: the engine's counters (budget cuts and fallbacks are counted).
        encode_cost_s: measured seconds per item of an encode, by frame count.
    """
    if not job.attempts[-1].degenerate:
        job.done = True
        return
    step = _retry_step(job, cfg)
    if step is None:
        job.done = True
        return
    if not _retry_fits(job, step, now, encode_cost_s):
        job.done = True
        job.fallbacks.append("budget")
        counters.budget_cuts += 1
        return
    if step == "prompt":
        job.options = without_prompt(job.options)
        job.temp_idx = 0
        counters.prompt_fallbacks += 1
    elif step == "language":
        job.language = job.alt_languages.pop(0)
        job.temp_idx = 0
        counters.language_fallbacks += 1
    elif step == "window":
        job.frames = FULL_WINDOW_FRAMES
        job.temp_idx = 0
        counters.window_fallbacks += 1
    else:
        job.temp_idx += 1
        counters.temperature_fallbacks += 1
    job.fallbacks.append(step)


def chosen_attempt(job: Job, ratio_threshold: float) -> Attempt:
    """The attempt to keep: the last one if it passed, else the best of all so far.

    Whisper's rule when every temperature failed: prefer non-looping text, then log-prob.
    Text cut short of its speech (``Attempt.short``) comes after all other text, and text in
    a runner-up language after text in the call's (its ``language_hint``, else the first
    attempt's): a runner-up's retry is a guess that the detection was wrong, and when it
    fails too it has not shown that it was. A short window's own artifact (a phrase said
    twice, the prompt recited: ``Attempt.window_artifact``, often sure of itself) comes after
    the rest; otherwise the short bucket's decode and the full window's compete on log-prob,
    as Whisper's temperatures do. Until 2026-12-07 the latest window always came first, and
    JFK's lone "Not!" (0.9 s) lost its word on the default server: the bucket's decode read
    "NOT!" at -1.08, which only asks for a retry (under -1.0), the full window's read worse
    (-1.32), and the full window's text was kept and then dropped under -1.2
    (tests/test_budget_converse.py). A ladder cut by the budget gets the same choice over the
    attempts it had time for.
    """
    last = job.attempts[-1]
    if not last.degenerate:
        return last

    spoken = job.options.language_hint or job.attempts[0].language

    def rank(a: Attempt) -> tuple[bool, bool, bool, bool, float]:
        best = a.hyps[0]
        loops = policy.compression_ratio(best.text) > ratio_threshold
        loops = loops or policy.has_repetition_loop(best.tokens)
        ours = a.language == spoken
        return (not loops, not a.short, ours, not a.window_artifact, best.avg_logprob)

    return max(job.attempts, key=rank)


def language_probability(job: Job) -> float:
    """How sure the engine is of the job's (final) language: 1.0 unless it was detected."""
    if not job.language_probs:
        return 1.0
    return job.language_probs.get(job.language or "", 0.0)


def is_end_mark(token: str) -> bool:
    """Whether a token's text closes a sentence.

    ``.``, ``?`` or ``!``, maybe doubled or with a closing quote or bracket (``."``, ``?!``,
    ``).``); never an ellipsis (a sentence trailing off is still open).
    """
    text = token.strip()
    return (
        bool(text)
        and set(text) <= set(".?!\"')]")
        and any(c in text for c in ".?!")
        and ".." not in text
    )


def end_mark_probability(
    ids: Sequence[int], step_logits: Sequence[Any], marks: Sequence[int], eot: int
) -> float | None:
    """How sure the decoder was that the text ends where it closed it with a sentence mark.

    At the step where the text's last token, a sentence-final mark, was chosen: the summed
    probability of every such mark and of ``<|endoftext|>`` (ending without one). What is
    left is the sentence going on: a comma, an ellipsis, a next word.

    Args:
        ids: the decode's tokens (text tokens below ``eot``, then maybe special ones).
        step_logits: the decoder's output over the vocabulary at each step (``ids[i]`` was
            chosen from ``step_logits[i]``), log-probabilities or logits.
        marks: the token ids that close a sentence (:func:`is_end_mark`).
        eot: ``<|endoftext|>``; tokens from it up are not text.

    Returns:
        That probability, or None when the text does not end on a mark or that step's scores
        are missing (beam search returns none).
    """
    text = [i for i, t in enumerate(ids) if t < eot]
    if not text or ids[text[-1]] not in marks or text[-1] >= len(step_logits):
        return None
    try:
        row = np.asarray(step_logits[text[-1]], dtype=np.float64)
    except ValueError:  # an empty StorageView
        return None
    if row.ndim != 1 or row.size <= max(eot, *marks):
        return None
    p = np.exp(row - row.max())
    return float((p[list(marks)].sum() + p[eot]) / p.sum())


def merge(
    jobs: list[Job],
    chosen: dict[int, tuple[Attempt, Hyp, str]],
    words: dict[int, list[AsrWord]],
) -> AsrResult:
    """Combine the chunks of one request into its result.

    Args:
        jobs: the request's jobs, in audio order.
        chosen: ``id(job)`` -> its chosen attempt, hypothesis and gate verdict ("" = passed).
        words: ``id(job)`` -> its aligned words.
    """
    texts, all_words, reasons = [], [], []
    n_tok = 0
    sum_lp = 0.0
    end_mark: float | None = None
    for job in jobs:
        att, hyp, dropped = chosen[id(job)]
        if dropped:
            reasons.append(dropped)
            continue
        texts.append(hyp.text)
        if hyp.text:
            end_mark = hyp.end_mark  # the text's end is its last chunk's
        all_words.extend(words.get(id(job), []))
        n_tok += len(hyp.tokens) + 1
        sum_lp += hyp.avg_logprob * (len(hyp.tokens) + 1)
    first_att, first_hyp, _ = chosen[id(jobs[0])]
    text = " ".join(t for t in texts if t)
    avg_lp = sum_lp / n_tok if n_tok else first_hyp.avg_logprob
    alternatives: tuple[AsrAlternative, ...] = ()
    k = jobs[0].options.num_alternatives
    if len(jobs) == 1 and text and k > 0:
        seen = {text}
        alts = []
        for h in first_att.hyps:
            if h.text and h.text not in seen:
                seen.add(h.text)
                alts.append(AsrAlternative(h.text, math.exp(min(0.0, h.avg_logprob))))
        alternatives = tuple(alts[:k])
    return AsrResult(
        text=text,
        words=tuple(all_words),
        confidence=math.exp(min(0.0, avg_lp)) if text else 0.0,
        no_speech_prob=float(np.mean([chosen[id(j)][0].no_speech_prob for j in jobs])),
        avg_logprob=avg_lp,
        compression_ratio=policy.compression_ratio(text),
        language=jobs[0].language or "",
        language_probability=language_probability(jobs[0]),
        alternatives=alternatives,
        dropped_reason="" if text else (reasons[0] if reasons else "no_speech"),
        encoded_frames=sum(j.encoded_frames for j in jobs),
        fallbacks=tuple(step for j in jobs for step in j.fallbacks),
        end_mark_probability=end_mark if text else None,
    )


def refusal(req: AsrRequest, cfg: WhisperConfig, *, multilingual: bool) -> AsrResult | None:
    """The result of an item that is not decoded at all (language, policy skip), or None."""
    opts = req.options
    if opts.language is not None and (
        opts.language not in _LANGUAGE_CODES or (not multilingual and opts.language != "en")
    ):
        return AsrResult(text="", dropped_reason="unsupported_language")
    reason = policy.skip_reason(req.stats, opts, cfg.policy) if len(req.audio) else "too_short"
    if reason:
        return AsrResult(
            text="",
            dropped_reason=reason,
            language=opts.language or "",
            language_probability=1.0 if opts.language else 0.0,
        )
    return None


def plan_jobs(
    index: int, req: AsrRequest, started: float, cfg: WhisperConfig, *, multilingual: bool
) -> list[Job]:
    """One job per 30 s chunk of the request's audio, each with its decoding plan.

    ``index`` numbers the request within its batch (it seeds sampling); ``started`` is when the
    engine took the request: its budget counts from there.
    """
    audio = np.asarray(req.audio, dtype=np.float32).reshape(-1)
    limit = int(cfg.max_utterance_s * ASR_SAMPLE_RATE_HZ)
    if len(audio) > limit:
        _log.warning(
            "utterance of %.1f s exceeds max_utterance_s=%.1f s; the rest is ignored",
            len(audio) / ASR_SAMPLE_RATE_HZ,
            cfg.max_utterance_s,
        )
        audio = audio[:limit]
    jobs = []
    for start in range(0, len(audio), _WINDOW_SAMPLES):
        chunk = audio[start : start + _WINDOW_SAMPLES]
        stats = req.stats
        if len(audio) > _WINDOW_SAMPLES:
            dur = round(1000 * len(chunk) / ASR_SAMPLE_RATE_HZ)
            stats = replace(
                req.stats,
                duration_ms=dur,
                speech_ms=min(dur, req.stats.speech_ms),
                leading_silence_ms=0,
                trailing_silence_ms=0,
            )
        plan = policy.plan_decoding(
            stats, req.options, cfg.policy, cfg.encoder, is_final=req.is_final
        )
        lang = req.options.language if multilingual else "en"
        job = Job(
            index,
            start / ASR_SAMPLE_RATE_HZ,
            chunk,
            req.options,
            stats,
            plan,
            lang,
            plan.encoder_frames,
            deadline=started + plan.budget_s,
        )
        job.wide = req.is_final and req.alone
        if len(audio) <= _WINDOW_SAMPLES:
            job.voiced_spans_ms = req.voiced_spans_ms
        jobs.append(job)
    return jobs
