"""WER helpers for the ASR benchmarks and tests: a small English normaliser plus jiwer.

Whisper's ``EnglishTextNormalizer`` is not shipped by faster-whisper, so this is a deliberately
small stand-in: lower-case, unify apostrophes, expand ``%``/``&``, spell out digits (year style
for 1100-1999 and 2010-2099, so "1455" and "fourteen fifty-five" agree), read ordinals ("20th"
as "twentieth") and spell out the titles Whisper abbreviates ("Mr." as "mister"), as Whisper's
normaliser does, drop punctuation and hyphens. Both reference and hypothesis go through it, so
only consistency matters.
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Sequence

import jiwer

from engines.tts import cardinal, ordinal, year

__all__ = ["corpus_wer", "normalize", "number_to_words", "wer"]


def number_to_words(n: int) -> str:
    """Spell a non-negative integer the way the TTS front end reads it (years as pairs).

    Shared with ``engines.tts`` so that one English number reader serves both synthesis and
    scoring; scoring only needs both sides of a comparison normalised the same way.
    """
    return year(n) if 1100 <= n <= 2099 else cardinal(n)


_NUM_RE = re.compile(r"\d+")
_ORDINAL_RE = re.compile(r"\b(\d+)(st|nd|rd|th)\b")
_TITLES = {"mr": "mister", "mrs": "missus", "dr": "doctor", "prof": "professor"}
_TITLE_RE = re.compile(r"\b(" + "|".join(_TITLES) + r")\b\.?")


def normalize(text: str) -> str:
    """Normalise English text for WER: see the module docstring."""
    t = unicodedata.normalize("NFKC", text).lower()
    t = t.replace("’", "'").replace("‘", "'").replace("%", " percent ").replace("&", " and ")
    t = re.sub(r"(?<=\d),(?=\d{3})", "", t)  # 1,000 -> 1000
    t = _ORDINAL_RE.sub(lambda m: " " + ordinal(int(m.group(1))) + " ", t)
    t = _TITLE_RE.sub(lambda m: _TITLES[m.group(1)], t)
    t = _NUM_RE.sub(lambda m: " " + number_to_words(int(m.group())) + " ", t)
    t = re.sub(r"[^\w\s']", " ", t)
    t = re.sub(r"(?<!\w)'|'(?!\w)", " ", t)  # quotes, not apostrophes inside words
    t = t.replace("_", " ")
    return re.sub(r"\s+", " ", t).strip()


def wer(reference: str, hypothesis: str) -> float:
    """WER of one pair after normalisation (1.0 for any words against an empty reference)."""
    ref, hyp = normalize(reference), normalize(hypothesis)
    if not ref:
        return 0.0 if not hyp else 1.0
    return float(jiwer.wer(ref, hyp if hyp else ""))


def corpus_wer(references: Sequence[str], hypotheses: Sequence[str]) -> float:
    """Total edits over total reference words, after normalisation."""
    refs = [normalize(r) for r in references]
    hyps = [normalize(h) for h in hypotheses]
    out = jiwer.process_words(refs, hyps)
    edits = out.substitutions + out.deletions + out.insertions
    return float(edits / max(1, sum(len(r.split()) for r in refs)))
