"""Score a model as a call hears it: WER and domain-term recall through the serving engine.

The transcripts come from :class:`voxgate.engines.asr.WhisperEngine` with the gateway's defaults
(the encoder-window buckets, greedy decoding, English, the silence-aware policy, int8 on CPU), one
utterance per ``infer_batch`` call as the batcher sends a lone caller's. Scoring a fine-tuned
model in ``transformers`` instead would report the float32 PyTorch model on 30 s windows, not
the int8 CTranslate2 model on bucketed windows that serves the call.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from voxgate.adapt.data import SAMPLE_RATE_HZ, Pair
from voxgate.adapt.scoring import term_hits, word_edits
from voxgate.engines.asr import WhisperConfig, WhisperEngine
from voxgate.engines.asr.base import AsrOptions, AsrRequest
from voxgate.engines.base import FloatArray, UtteranceStats

__all__ = [
    "SERVED_OPTIONS",
    "ItemScore",
    "Scores",
    "evaluate",
    "load_engine",
    "score",
    "transcribe",
]

#: What a call gets when its config sets no decoding options (gateway/service.py builds these).
SERVED_OPTIONS = AsrOptions(language="en", beam_size=1, word_timestamps=False)
#: Frame RMS above which a frame counts as voiced for the decoding policy's statistics.
_VOICED_DBFS = -50.0
_FRAME_MS = 20


@dataclass(frozen=True)
class ItemScore:
    """One clip's outcome.

    Attributes:
        origin: the pair's origin (file, manifest line or phrase).
        edits: word edits after normalisation.
        n_words: reference words after normalisation.
        terms: per term said in the clip, ``(times recognised, times said)``.
        hypothesis: the transcript (kept in memory for callers; the report does not print it).
        seconds: wall time of the ``infer_batch`` call.
    """

    origin: str
    edits: int
    n_words: int
    terms: dict[str, tuple[int, int]]
    hypothesis: str
    seconds: float

    @property
    def wer(self) -> float:
        """This clip's WER."""
        return self.edits / max(1, self.n_words)


@dataclass(frozen=True)
class Scores:
    """A model's scores over a set of clips.

    Attributes:
        wer: total edits over total reference words (corpus WER).
        term_recall: domain terms recognised over domain terms said (NaN when none was said).
        n_words: reference words.
        per_item: each clip's score, in input order.
    """

    wer: float
    term_recall: float
    n_words: int
    per_item: tuple[ItemScore, ...]

    @property
    def n_terms(self) -> int:
        """Domain-term occurrences said in the references."""
        return sum(said for item in self.per_item for _, said in item.terms.values())

    def recall_by_term(self) -> dict[str, tuple[int, int]]:
        """Per term over all clips: (times recognised, times said)."""
        out: dict[str, tuple[int, int]] = {}
        for item in self.per_item:
            for term, (hit, said) in item.terms.items():
                h, s = out.get(term, (0, 0))
                out[term] = (h + hit, s + said)
        return out


def load_engine(model: Path | str, **config: object) -> WhisperEngine:
    """Load and warm a serving engine for ``model`` ("base" or a model directory).

    Args:
        model: the bundled name or a CTranslate2 Whisper directory.
        config: further :class:`WhisperConfig` fields (threads, encoder windows).
    """
    engine = WhisperEngine.load(WhisperConfig.model_validate({"model": str(model), **config}))
    engine.warmup()
    return engine


def _stats(audio: FloatArray) -> UtteranceStats:
    """Energy-VAD statistics of a whole clip, standing in for the segmenter's."""
    hop = SAMPLE_RATE_HZ * _FRAME_MS // 1000
    n = len(audio) // hop
    frames = audio[: n * hop].reshape(n, hop).astype(np.float64)
    rms = np.sqrt(np.mean(frames**2, axis=1) + 1e-20)
    voiced = 20.0 * np.log10(rms) > _VOICED_DBFS
    return UtteranceStats.from_frames(audio, voiced, _FRAME_MS)


def transcribe(
    engine: WhisperEngine, audio: FloatArray, options: AsrOptions = SERVED_OPTIONS
) -> tuple[str, float]:
    """One utterance through ``infer_batch``: (text, wall seconds)."""
    t0 = time.perf_counter()
    result = engine.infer_batch([AsrRequest(audio, _stats(audio), options)])[0]
    return result.text, time.perf_counter() - t0


def score(
    pairs: Sequence[Pair],
    hypotheses: Sequence[str],
    *,
    terms: Sequence[str],
    seconds: Sequence[float] | None = None,
) -> Scores:
    """Score hypotheses against the pairs' transcripts (WER and term recall)."""
    if len(pairs) != len(hypotheses):
        raise ValueError(f"{len(pairs)} pairs but {len(hypotheses)} hypotheses")
    items = []
    for k, (pair, hyp) in enumerate(zip(pairs, hypotheses, strict=True)):
        edits, n = word_edits(pair.text, hyp)
        hits = term_hits(pair.text, hyp, terms)
        items.append(ItemScore(pair.origin, edits, n, hits, hyp, seconds[k] if seconds else 0.0))
    n_words = sum(i.n_words for i in items)
    hit = sum(h for i in items for h, _ in i.terms.values())
    said = sum(s for i in items for _, s in i.terms.values())
    return Scores(
        wer=sum(i.edits for i in items) / max(1, n_words),
        term_recall=hit / said if said else float("nan"),
        n_words=n_words,
        per_item=tuple(items),
    )


def evaluate(
    model_dir: Path | str,
    pairs: Sequence[Pair],
    *,
    terms: Sequence[str],
    engine: WhisperEngine | None = None,
) -> Scores:
    """Transcribe every pair with the serving engine and score it.

    Args:
        model_dir: "base" or a CTranslate2 Whisper directory (ignored when ``engine`` is given).
        pairs: the clips and their reference transcripts.
        terms: the domain terms whose recall is reported.
        engine: an already loaded engine to reuse (it is not closed).
    """
    own = engine is None
    eng = engine if engine is not None else load_engine(model_dir)
    try:
        texts, secs = [], []
        for pair in pairs:
            text, s = transcribe(eng, pair.audio)
            texts.append(text)
            secs.append(s)
        return score(pairs, texts, terms=terms, seconds=secs)
    finally:
        if own:
            eng.close()
