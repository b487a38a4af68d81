"""Logits processors for :mod:`voxgate.engines.asr._decode`: small pure classes with one method.

Each ``apply(step, logits, sequences)`` edits one item's (rows, vocab) logits in place from the
step index and the tokens each row produced so far, and keeps no state between calls: the same
inputs give the same edit, so a processor is tested alone and items of one batch never share
one by accident. ``-inf`` forbids a token; a finite addition biases it.

Whisper's own rules come first, in CTranslate2's order (:class:`SuppressTokens`,
:class:`SuppressBlank`, then :class:`TimestampRules` last), so that with only them active our
loop returns ``generate``'s tokens. Ours sit between the suppress rules and the timestamp rules
(the timestamp rules must see the final text/timestamp balance to keep pairs valid):

* :class:`SilenceAwareEnd` - from the VAD's voiced spans: once the last timestamp passed the
  utterance's last speech, push content down and ``<|endoftext|>`` up; timestamps that would
  land inside a long silence are forbidden.
* :class:`HallucinationBias` - a negative bias on Whisper's favourite non-speech phrases,
  scaled by how little speech the VAD saw (speech ratio, level, no-speech probability).
* :class:`PhraseBoost` (in :mod:`voxgate.engines.asr._phrases`) - prefix-tree bias toward a call's
  phrases.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

__all__ = [
    "HallucinationBias",
    "RepetitionPenalty",
    "SilenceAwareEnd",
    "SuppressBlank",
    "SuppressTokens",
    "TimestampRules",
    "hallucination_strength",
]

F32 = npt.NDArray[np.float32]
_NEG_INF = np.float32(-np.inf)
#: One timestamp token is 20 ms (Whisper's time resolution).
TIMESTAMP_MS = 20


def _logsumexp(x: F32) -> float:
    m = float(np.max(x))
    if m == float("-inf"):
        return m
    return m + float(np.log(np.sum(np.exp(x - np.float32(m)), dtype=np.float32)))


def _log_softmax_row(x: F32) -> F32:
    m = np.max(x)
    z = x - m
    out: F32 = z - np.log(np.sum(np.exp(z), dtype=np.float32))
    return out


@dataclass(frozen=True, slots=True)
class SuppressTokens:
    """Forbid ``ids`` at every step (Whisper's ``suppress_tokens``; per item here)."""

    ids: npt.NDArray[np.int64]

    @classmethod
    def of(cls, ids: Sequence[int]) -> SuppressTokens:
        """From any sequence of token ids (duplicates and order do not matter)."""
        return cls(np.unique(np.asarray(list(ids), np.int64)))

    def apply(self, step: int, logits: F32, sequences: Sequence[Sequence[int]]) -> None:
        """Set the suppressed ids to ``-inf`` on every row."""
        if len(self.ids):
            logits[:, self.ids] = _NEG_INF


@dataclass(frozen=True, slots=True)
class SuppressBlank:
    """Forbid a blank start: ``ids`` (space, ``<|endoftext|>``) at the first step only."""

    ids: tuple[int, ...]

    def apply(self, step: int, logits: F32, sequences: Sequence[Sequence[int]]) -> None:
        """At step 0 set ``ids`` to ``-inf``."""
        if step == 0:
            logits[:, list(self.ids)] = _NEG_INF


@dataclass(frozen=True, slots=True)
class RepetitionPenalty:
    """CTranslate2's repetition penalty over the tokens a row already produced."""

    penalty: float

    def apply(self, step: int, logits: F32, sequences: Sequence[Sequence[int]]) -> None:
        """Divide positive / multiply negative logits of seen tokens by ``penalty``."""
        p = np.float32(self.penalty)
        for r, seq in enumerate(sequences):
            if not seq:
                continue
            ids = np.unique(np.asarray(seq, np.int64))
            v = logits[r, ids]
            logits[r, ids] = np.where(v < 0, v * p, v / p)


@dataclass(frozen=True, slots=True)
class TimestampRules:
    """Whisper's timestamp grammar, exactly as CTranslate2's ``ApplyTimestampRules``.

    ``<|notimestamps|>`` is never sampled; the first token is a timestamp no later than
    ``max_initial``; timestamps come in pairs (except right before EOT) and never decrease; when
    the timestamps' total probability beats every text token, a timestamp is forced.
    """

    eot: int
    no_timestamps: int
    begin: int
    end: int
    max_initial: int

    def apply(self, step: int, logits: F32, sequences: Sequence[Sequence[int]]) -> None:
        """Apply the grammar to each row."""
        for r, seq in enumerate(sequences):
            row = logits[r]
            row[self.no_timestamps] = _NEG_INF
            if step == 0:
                row[: self.begin] = _NEG_INF
                row[self.max_initial + 1 : self.end + 1] = _NEG_INF
                continue
            check = True
            last = seq[-1]
            if last >= self.begin:
                penult = seq[-2] if len(seq) > 1 else last
                if penult >= self.begin:
                    row[self.begin : self.end + 1] = _NEG_INF
                    check = False
                else:
                    row[: self.eot] = _NEG_INF
            for tok in reversed(seq):
                if tok >= self.begin:
                    row[self.begin : tok] = _NEG_INF
                    break
            if check:
                lp = _log_softmax_row(row)
                if _logsumexp(lp[self.begin : self.end + 1]) > float(np.max(lp[: self.begin])):
                    row[: self.begin] = _NEG_INF


@dataclass(frozen=True, slots=True)
class SilenceAwareEnd:
    """End the decode where the speech ended, using the VAD's voiced spans and timestamps.

    Whisper's trailing hallucinations ("Thank you.") are written into the silence after the
    last word. With timestamp tokens on, the decoder says where in the audio it is: once a row's
    latest timestamp is past the last voiced ms (plus ``grace_ms``), content tokens get
    ``-content_penalty`` and ``<|endoftext|>`` gets ``+eot_boost``. A timestamp that would
    land inside a silence longer than ``min_silence_ms`` (inside, not at its edges) is
    forbidden, so a segment cannot be anchored in a pause. The timestamp tokens themselves are
    removed from the text by the engine.

    Attributes:
        eot: ``<|endoftext|>``; begin: first timestamp token.
        speech_end_ms: last voiced ms of the utterance (from the VAD).
        silences: (start_ms, end_ms) unvoiced spans; only long ones are kept.
        grace_ms: slack after the last speech before the end is pushed.
        content_penalty / eot_boost: logit offsets once past the speech.
    """

    eot: int
    begin: int
    speech_end_ms: int
    silences: tuple[tuple[int, int], ...] = ()
    grace_ms: int = 400
    content_penalty: float = 8.0
    eot_boost: float = 4.0
    min_silence_ms: int = 1000
    edge_ms: int = 200

    def apply(self, step: int, logits: F32, sequences: Sequence[Sequence[int]]) -> None:
        """Bias toward EOT past the speech; forbid timestamps inside long silences."""
        n_ts = logits.shape[1] - self.begin
        for a, b in self.silences:
            if b - a < self.min_silence_ms:
                continue
            lo = max(0, (a + self.edge_ms) // TIMESTAMP_MS + 1)
            hi = min(n_ts, (b - self.edge_ms) // TIMESTAMP_MS)
            if hi > lo:
                logits[:, self.begin + lo : self.begin + hi] = _NEG_INF
        limit = (self.speech_end_ms + self.grace_ms) // TIMESTAMP_MS
        for r, seq in enumerate(sequences):
            last_ts = next((t for t in reversed(seq) if t >= self.begin), None)
            if last_ts is None or last_ts - self.begin < limit:
                continue
            logits[r, : self.eot] -= np.float32(self.content_penalty)
            logits[r, self.eot] += np.float32(self.eot_boost)


def hallucination_strength(
    speech_ratio: float, speech_rms_dbfs: float, no_speech_prob: float
) -> float:
    """How strongly to push Whisper's non-speech phrases down, in [0, 1].

    Little voiced time, a faint level or a high no-speech probability each make a phrase like
    "Thank you." more likely to be invented; clear, long speech makes it more likely real. The
    three cues are combined by their maximum so any one of them is enough.
    """
    ratio_cue = max(0.0, min(1.0, (0.5 - speech_ratio) / 0.5))
    level_cue = max(0.0, min(1.0, (-35.0 - speech_rms_dbfs) / 20.0))
    nsp = 0.0 if np.isnan(no_speech_prob) else no_speech_prob
    nsp_cue = max(0.0, min(1.0, (nsp - 0.2) / 0.6))
    return max(ratio_cue, level_cue, nsp_cue)


@dataclass(frozen=True, slots=True)
class HallucinationBias:
    """A per-item negative bias on the first tokens of Whisper's non-speech phrases.

    ``ids`` are the tokens that start those phrases ("Thank", " Thanks", " Subscribe", ...);
    the bias is ``-max_bias * strength`` with ``strength`` from :func:`hallucination_strength`
    of this item's statistics, so a quiet, mostly silent utterance gets the full push and a
    clear one almost none. Only the opening step of a phrase is biased (a real "thank you" in
    mid-sentence is untouched).
    """

    ids: npt.NDArray[np.int64]
    bias: float
    begin: int

    def apply(self, step: int, logits: F32, sequences: Sequence[Sequence[int]]) -> None:
        """Lower the phrase-opening tokens where a phrase could start (first text token)."""
        if self.bias == 0.0 or not len(self.ids):
            return
        for r, seq in enumerate(sequences):
            text = [t for t in seq if t < self.begin]
            if not text:
                logits[r, self.ids] -= np.float32(self.bias)
