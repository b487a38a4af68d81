"""Silence-aware decoding policy: pure functions from utterance statistics to decoding choices.

Whisper was trained on captioned video, so on silence, noise or tones it tends to produce the
captions that such videos end with ("Thank you for watching", "you", music notes). The VAD
cannot prevent this alone: DTMF, hum and some noise are voiced enough to pass it. The policy
therefore acts at three points, all pure and table-testable:

1. before decoding: skip utterances with too little or too quiet speech (:func:`skip_reason`);
2. during decoding: suppress non-speech tokens, cap the decode length by the audio duration,
   optionally penalise repetition (:func:`plan_decoding`);
3. after decoding: drop results that look like silence, loops or known hallucinations
   (:func:`gate_result`), after a temperature fallback (:func:`needs_fallback`).
"""

from __future__ import annotations

import math
import re
import unicodedata
import zlib
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

import numpy as np
from rapidfuzz.distance import Levenshtein

from voxgate.engines.asr.base import AsrOptions
from voxgate.engines.asr.config import (
    FULL_WINDOW_FRAMES,
    MEL_FRAMES_PER_S,
    DecodingPolicyConfig,
    EncoderWindowConfig,
)
from voxgate.engines.base import UtteranceStats

__all__ = [
    "EXTRA_SUPPRESS_SYMBOLS",
    "HALLUCINATION_PHRASES",
    "MAX_FALLBACKS",
    "DecodingPlan",
    "choose_encoder_frames",
    "compression_ratio",
    "gate_result",
    "has_repeated_block",
    "has_repetition_loop",
    "mbr_select",
    "is_hallucination_phrase",
    "max_new_tokens",
    "needs_fallback",
    "normalize_phrase",
    "plan_decoding",
    "skip_reason",
    "suppress_token_ids",
]

#: Whisper's longest decode (448 positions) minus room for the prompt.
MAX_DECODE_TOKENS = 224

#: No cap on retry steps beyond the ladder's own length (languages, window, temperatures).
MAX_FALLBACKS = 64

#: A final whose text has fewer tokens than this per second of voiced speech stopped short of
#: it (:func:`cut_short`); where it had a prompt, the prompt is the likely cause. Whisper,
#: given a turn's earlier words ending on a full stop ("Somehow or other. Pat has taught them
#: that he's in charge here."), closed the next 3.5 s of speech after its first word: "And"
#: (log-prob -0.91, which passes), where the same audio without the prompt gave all 13 words.
#: The slowest of the 40 shared clips has 1.3 words per second of recording, pauses included.
MIN_TOKENS_PER_SPEECH_S = 0.6
#: ...on at least this much voiced speech, s (a word or two says too little).
CUT_SHORT_MIN_SPEECH_S = 1.5

#: Phrases Whisper emits on non-speech, per language, in :func:`normalize_phrase` form. A result
#: that *is* one of these (not merely contains one) is dropped: a caller really saying
#: "thank you" to an agent is kept unless the audio barely had speech (see :func:`gate_result`).
HALLUCINATION_PHRASES: dict[str, frozenset[str]] = {
    "en": frozenset(
        {
            "thank you for watching",
            "thanks for watching",
            "thank you for watching and see you next time",
            "thank you very much for watching",
            "thank you so much for watching",
            "thanks for watching and see you next time",
            "please subscribe",
            "please subscribe to my channel",
            "like and subscribe",
            "dont forget to like and subscribe",
            "subscribe to my channel",
            "see you next time",
            "see you in the next video",
            "bye bye",
            "subtitles by the amaraorg community",
            "transcription by castingwords",
            "music",
            "applause",
            "silence",
            "beep",
        }
    ),
    "de": frozenset({"untertitel im auftrag des zdf 2017", "vielen dank fürs zuschauen"}),
    "fr": frozenset({"sous-titrage st 501", "merci davoir regardé", "sous-titres réalisés par"}),
    "es": frozenset({"gracias por ver", "subtítulos realizados por la comunidad de amaraorg"}),
}

#: Phrases that begin a caption credit line whatever follows ("Subtitles by ...").
_CREDIT_PREFIXES = ("subtitles by", "subtitled by", "captions by", "translated by", "untertitel")

#: Fillers that are real speech when the audio is mostly speech, hallucinations otherwise.
_LOW_SPEECH_FILLERS = frozenset({"you", "thank you", "thanks", "bye", "okay", "oh", "so", "uh"})

#: Symbols suppressed on top of Whisper's own non-speech set (``suppress_tokens=[-1]``): music
#: notes and brackets that open sound-event captions like "[Music]" or "(upbeat music)".
EXTRA_SUPPRESS_SYMBOLS = ("♪", "♫", "♬", " ♪", " ♫", " [", " (", "[", "(", " *", "*")


@dataclass(frozen=True, slots=True)
class DecodingPlan:
    """Decoding options chosen for one item (pure data; the engine maps it to CTranslate2).

    Attributes:
        beam_size: beam width at temperature 0.
        num_hypotheses: N-best returned at temperature 0 (MBR candidates, alternatives).
        temperatures: temperatures to try while gates fail; the first is 0.
        best_of: samples per item at temperatures above 0.
        suppress_hallucination_tokens: suppress Whisper's non-speech set plus
            :data:`EXTRA_SUPPRESS_SYMBOLS` (else only Whisper's default ``[-1]``).
        repetition_penalty: CTranslate2 repetition penalty (1 = off).
        no_repeat_ngram_size: CTranslate2 n-gram blocking (0 = off).
        max_new_tokens: decode-length cap derived from the audio duration.
        encoder_frames: mel frames fed to the encoder (bucket from the window policy).
        mbr_candidates: >1 selects the output by MBR among that many candidates.
        apply_gates: run :func:`gate_result` on the output.
        window_fallback: a degenerate decode on a short bucket may be re-encoded on the full
            window (still subject to ``EncoderWindowConfig.fallback_to_full_window``).
        prompt_fallback: a degenerate decode with a prompt (the call's or its turn's earlier
            words) is decoded again without it, before any other step; finals only.
        max_fallbacks: most retry steps (prompt, language, window, temperature) the item may take;
            short speech gets ``DecodingPolicyConfig.short_speech_max_fallbacks``.
        budget_s: the item's latency budget from when the engine starts on it; a retry that
            would end after it is not started (``DecodingPolicyConfig.decode_budget_s``).
    """

    beam_size: int
    num_hypotheses: int
    temperatures: tuple[float, ...]
    best_of: int
    suppress_hallucination_tokens: bool
    repetition_penalty: float
    no_repeat_ngram_size: int
    max_new_tokens: int
    encoder_frames: int
    mbr_candidates: int
    apply_gates: bool
    window_fallback: bool = True
    prompt_fallback: bool = True
    max_fallbacks: int = MAX_FALLBACKS
    budget_s: float = math.inf


def skip_reason(stats: UtteranceStats, options: AsrOptions, cfg: DecodingPolicyConfig) -> str:
    """Decide before decoding whether the utterance is worth the encoder's time.

    Returns:
        ``"too_short"``, ``"too_quiet"`` or ``""`` (decode it).
    """
    if not options.silence_aware:
        return ""
    if stats.speech_ms < cfg.min_speech_ms:
        return "too_short"
    if stats.speech_rms_dbfs < cfg.min_speech_rms_dbfs:
        return "too_quiet"
    return ""


def choose_encoder_frames(num_frames: int, cfg: EncoderWindowConfig) -> int:
    """Pick the smallest bucket that holds the audio plus the margin.

    Args:
        num_frames: mel frames of the utterance (100 per second).
        cfg: the window policy.

    Returns:
        Mel frames to encode, at most 3000 (the full window).
    """
    needed = num_frames + cfg.margin_ms * MEL_FRAMES_PER_S // 1000
    for bucket_s in cfg.buckets_s:
        frames = round(bucket_s * MEL_FRAMES_PER_S)
        if frames >= needed:
            return min(frames, FULL_WINDOW_FRAMES)
    return FULL_WINDOW_FRAMES


def max_new_tokens(duration_ms: float, cfg: EncoderWindowConfig) -> int:
    """Bound the decode length by what a human could say in ``duration_ms``.

    A looping decoder otherwise runs to Whisper's 448-token limit; the cap both saves the decode
    time and turns "hit the cap" into a cheap loop signal.
    """
    by_rate = math.ceil(duration_ms / 1000.0 * cfg.max_tokens_per_s)
    return max(cfg.min_max_new_tokens, min(MAX_DECODE_TOKENS, by_rate))


def plan_decoding(
    stats: UtteranceStats,
    options: AsrOptions,
    cfg: DecodingPolicyConfig,
    window: EncoderWindowConfig,
    *,
    is_final: bool = True,
) -> DecodingPlan:
    """Derive the decoding options for one utterance from its statistics and call options.

    An interim (``is_final=False``) gets one decode at temperature 0 on its bucket and no
    retries: no temperature ladder and no full-window re-encode. A prefix cut mid-word often
    decodes unsurely, and on the 2-core machine the retries of one 0.8 s prefix ("Mister
    Quil-") took 5-8 s of the worker (six sampled decodes of 5 on a 30 s window), during
    which no newer interim of that call ran and every other call's decode waited; the next
    interim, 0.25 s later with more of the word, is the cheaper retry. The gates still apply
    to what that one decode says.

    Short speech (less than ``short_speech_ms`` voiced) gets a short ladder: on a word or two
    ("Not!") a log-prob under -1 is common and says nothing of a loop, yet such a word ran the
    whole ladder (4.6 s for 0.3 s of speech). Every item carries ``decode_budget_s`` too; the
    engine stops its ladder there.

    Args:
        stats: VAD statistics; ``duration_ms`` sizes the encoder bucket and decode cap.
        options: the call's options (beam, MBR, alternatives, silence awareness).
        cfg: policy thresholds.
        window: encoder window policy.
        is_final: False for an interim re-decode of a growing utterance.

    Returns:
        The plan; call :func:`skip_reason` first, this does not skip.
    """
    mbr = options.mbr_candidates if options.mbr_candidates > 1 else 0
    beam = max(1, options.beam_size, mbr)
    num_hyp = max(1, mbr, 1 + options.num_alternatives)
    beam = max(beam, num_hyp)
    frames = math.ceil(stats.duration_ms * MEL_FRAMES_PER_S / 1000)
    if options.encoder_margin_ms is not None and options.encoder_margin_ms != window.margin_ms:
        window = window.model_copy(update={"margin_ms": max(0, options.encoder_margin_ms)})
    return DecodingPlan(
        beam_size=beam,
        num_hypotheses=num_hyp,
        temperatures=cfg.temperatures if is_final else cfg.temperatures[:1],
        best_of=cfg.best_of,
        suppress_hallucination_tokens=options.silence_aware,
        repetition_penalty=cfg.repetition_penalty,
        no_repeat_ngram_size=cfg.no_repeat_ngram_size,
        max_new_tokens=max_new_tokens(stats.duration_ms, window),
        encoder_frames=choose_encoder_frames(frames, window),
        mbr_candidates=mbr,
        apply_gates=options.silence_aware,
        window_fallback=is_final,
        prompt_fallback=is_final,
        max_fallbacks=(
            cfg.short_speech_max_fallbacks
            if stats.speech_ms < cfg.short_speech_ms
            else MAX_FALLBACKS
        ),
        budget_s=cfg.decode_budget_s,
    )


def cut_short(n_tokens: int, speech_s: float) -> bool:
    """Whether a final's ``n_tokens`` are too few for ``speech_s`` of voiced speech.

    See :data:`MIN_TOKENS_PER_SPEECH_S`. Such a decode fails: with a prompt the
    ladder first decodes once more without it (``AsrResult.fallbacks`` step ``prompt``);
    without one (where the model hears speech) it takes the ladder's other steps.
    """
    return speech_s >= CUT_SHORT_MIN_SPEECH_S and n_tokens < MIN_TOKENS_PER_SPEECH_S * speech_s


def compression_ratio(text: str) -> float:
    """Whisper's repetition measure: UTF-8 length over zlib-compressed length (0 for '')."""
    data = text.encode("utf-8")
    if not data:
        return 0.0
    return len(data) / len(zlib.compress(data))


def has_repetition_loop(tokens: Sequence[int], min_repeats: int = 3, min_span: int = 12) -> bool:
    """Detect a decoder loop: the sequence ends in a block repeated back to back.

    Short repeats ("no, no, no") are real speech, so the repeated span must cover at least
    ``min_span`` tokens as well as ``min_repeats`` copies.

    Args:
        tokens: text tokens of one hypothesis.
        min_repeats: copies of the block required at the tail.
        min_span: tokens the repeated tail must cover.
    """
    n = len(tokens)
    for period in range(1, n // min_repeats + 1):
        block = list(tokens[n - period :])
        repeats = 1
        while (repeats + 1) * period <= n and list(
            tokens[n - (repeats + 1) * period : n - repeats * period]
        ) == block:
            repeats += 1
        if repeats >= min_repeats and repeats * period >= min_span:
            return True
    return False


def has_repeated_block(tokens: Sequence[int], min_block: int = 8) -> bool:
    """Detect the milder loop: some run of ``min_block`` tokens occurs twice without overlap.

    On short encoder windows Whisper sometimes says a sentence twice, or restarts it ("20th
    century research has shown ... hidden in express. 20th century research has shown ..."),
    which neither the compression ratio nor :func:`has_repetition_loop` catch. People rarely
    repeat an 8-token run verbatim within one utterance, and this only triggers a re-decode on
    the full window (never a drop), so a false alarm costs time only.
    """
    first: dict[tuple[int, ...], int] = {}
    for i in range(len(tokens) - min_block + 1):
        gram = tuple(tokens[i : i + min_block])
        j = first.setdefault(gram, i)
        if i - j >= min_block:
            return True
    return False


def echoes_prompt(text: str, prompt: str, min_words: int = 3) -> bool:
    """Whether ``text`` opens with the end of its previous-text ``prompt``, word for word.

    A turn's later utterance is decoded with the turn's earlier words as its prompt
    (``gateway/call/turn_taking.py``), and Whisper sometimes recites a prompt before the new
    words ("Captain Frere of the penal colony. Captain Frere says ..."). The engine strips a
    recital of the whole prompt token for token; one of its last words only, or with other
    casing or punctuation, is not its tokens. At least ``min_words`` words (the whole prompt
    when it is shorter, and never a one-word prompt) must match, compared without case or
    punctuation. Like :func:`has_repeated_block` this only asks for a re-decode on the full
    window, never drops a word: a caller who really repeats themselves keeps it there.
    """
    said = normalize_phrase(text).split()
    before = normalize_phrase(prompt).split()
    if len(before) < 2:
        return False
    for m in range(min(min_words, len(before)), min(len(before), len(said)) + 1):
        if said[:m] == before[-m:]:
            return True
    return False


def repeats_a_phrase(text: str, min_words: int = 3) -> bool:
    """Whether ``text`` says some run of at least ``min_words`` words twice in a row.

    The short-window loop too small for :func:`has_repeated_block`: on a 7 s window Whisper
    gave a fragment "He was not." as "He was not. He was not." (a 10 s window: "He was
    not."; docs/turns.md). Compared without case or punctuation; a re-decode on the full
    window only, so a caller who really says "I want to go, I want to go" keeps it there.
    """
    words = normalize_phrase(text).split()
    n = len(words)
    for size in range(min_words, n // 2 + 1):
        for i in range(n - 2 * size + 1):
            if words[i : i + size] == words[i + size : i + 2 * size]:
                return True
    return False


def needs_fallback(
    avg_logprob: float, ratio: float, no_speech_prob: float, cfg: DecodingPolicyConfig
) -> bool:
    """Whisper's temperature-fallback rule for one decode.

    Silence (high no-speech probability) is not retried: sampling on silence only invents text.
    """
    if no_speech_prob > cfg.no_speech_threshold:
        return False
    return ratio > cfg.compression_ratio_threshold or avg_logprob < cfg.logprob_threshold


_PUNCT_RE = re.compile(r"[^\w\s'-]")
_SPACE_RE = re.compile(r"\s+")


def normalize_phrase(text: str) -> str:
    """Lower-case, drop punctuation and apostrophes, squeeze spaces (for phrase matching)."""
    t = unicodedata.normalize("NFKC", text).lower()
    t = _PUNCT_RE.sub(" ", t).replace("'", "")
    return _SPACE_RE.sub(" ", t).strip(" -")


def is_hallucination_phrase(
    text: str, language: str, stats: UtteranceStats, cfg: DecodingPolicyConfig
) -> bool:
    """True when ``text`` is a known non-speech caption for ``language``.

    Fillers like "you" are only hallucinations when the audio was mostly not speech.
    """
    norm = normalize_phrase(text)
    if not norm:
        return False
    # English captions are hallucinated whatever the language, so that set always applies.
    if (
        norm in HALLUCINATION_PHRASES.get(language, frozenset())
        or norm in HALLUCINATION_PHRASES["en"]
    ):
        return True
    if norm.startswith(_CREDIT_PREFIXES):
        return True
    return norm in _LOW_SPEECH_FILLERS and stats.speech_ratio < cfg.low_speech_ratio


def gate_result(
    text: str,
    *,
    tokens: Sequence[int],
    avg_logprob: float,
    no_speech_prob: float,
    language: str,
    stats: UtteranceStats,
    cfg: DecodingPolicyConfig,
) -> str:
    """Decide after decoding whether to keep the text.

    Args:
        text: the chosen hypothesis.
        tokens: its text tokens (for the loop detector).
        avg_logprob: its average token log-probability.
        no_speech_prob: Whisper's no-speech probability for the utterance.
        language: language the text was decoded in.
        stats: VAD statistics of the utterance.
        cfg: thresholds.

    Returns:
        ``"no_speech"``, ``"repetition"``, ``"low_logprob"``, ``"hallucination"`` or ``""``.
    """
    if not normalize_phrase(text):
        return "no_speech"
    # Whisper's rule: silence needs both a confident no-speech token and an unsure decode.
    if no_speech_prob > cfg.no_speech_threshold and avg_logprob < cfg.logprob_threshold:
        return "no_speech"
    if compression_ratio(text) > cfg.compression_ratio_threshold or has_repetition_loop(
        list(tokens)
    ):
        return "repetition"
    if avg_logprob < cfg.drop_logprob_threshold:
        return "low_logprob"
    if is_hallucination_phrase(text, language, stats, cfg):
        return "hallucination"
    return ""


def suppress_token_ids(
    encode: Callable[[str], list[int]],
    non_speech_ids: Iterable[int],
    extra_symbols: Iterable[str] = EXTRA_SUPPRESS_SYMBOLS,
) -> tuple[int, ...]:
    """Build the hallucination suppress list for one tokenizer.

    Args:
        encode: text -> token ids without special tokens (``Tokenizer.encode``).
        non_speech_ids: Whisper's non-speech set (``Tokenizer.non_speech_tokens``, what ``-1``
            expands to inside CTranslate2).
        extra_symbols: more symbols; a symbol that spans several tokens contributes its first
            token only when that token is not a plain letter or space piece.

    Returns:
        Sorted unique token ids, ``-1`` first so CTranslate2 also adds its defaults.
    """
    ids = set(non_speech_ids)
    for sym in extra_symbols:
        toks = encode(sym)
        if len(toks) == 1 or (toks and not sym.strip().isalnum()):
            ids.add(toks[0])
    return (-1, *sorted(i for i in ids if i >= 0))


def mbr_select(candidates: Sequence[str], logprobs: Sequence[float], temperature: float) -> int:
    """Minimum-Bayes-risk choice: the candidate with the lowest expected WER against the others.

    Args:
        candidates: hypothesis texts.
        logprobs: their sequence log-probabilities (posterior up to normalisation).
        temperature: divides the log-probs before the softmax (>1 flattens the posterior).

    Returns:
        Index of the chosen candidate.
    """
    if len(candidates) <= 1:
        return 0
    lp = np.asarray(logprobs, dtype=np.float64) / temperature
    w = np.exp(lp - lp.max())
    w /= w.sum()
    words = [normalize_phrase(c).split() for c in candidates]
    risks = []
    for i, hyp in enumerate(words):
        risk = 0.0
        for j, ref in enumerate(words):
            if i != j:
                # Word-level edit distance (rapidfuzz on token lists), normalised as WER.
                risk += w[j] * Levenshtein.distance(ref, hyp) / max(1, len(ref))
        risks.append(risk)
    return int(np.argmin(risks))
