"""WER helpers for the ASR benchmarks and tests: a small English normaliser plus jiwer.

Whisper's ``EnglishTextNormalizer`` is not shipped by faster-whisper, so this is a deliberately
small stand-in: lower-case, unify apostrophes, expand ``%``/``&``, spell out digits (year style
for 1100-1999 and 2010-2099, so "1455" and "fourteen fifty-five" agree), drop punctuation and
hyphens. Both reference and hypothesis go through it, so only consistency matters.
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Sequence

import jiwer

__all__ = ["corpus_wer", "normalize", "number_to_words", "wer"]

_ONES = [
    "zero",
    "one",
    "two",
    "three",
    "four",
    "five",
    "six",
    "seven",
    "eight",
    "nine",
    "ten",
    "eleven",
    "twelve",
    "thirteen",
    "fourteen",
    "fifteen",
    "sixteen",
    "seventeen",
    "eighteen",
    "nineteen",
]
_TENS = ["_", "_", "twenty", "thirty", "forty", "fifty", "sixty", "seventy", "eighty", "ninety"]


def _below_100(n: int) -> str:
    if n < 20:
        return _ONES[n]
    tens, ones = divmod(n, 10)
    return _TENS[tens] + ("" if ones == 0 else " " + _ONES[ones])


def _below_1000(n: int) -> str:
    hundreds, rest = divmod(n, 100)
    parts = []
    if hundreds:
        parts.append(_ONES[hundreds] + " hundred")
    if rest or not hundreds:
        parts.append(_below_100(rest))
    return " ".join(parts)


def number_to_words(n: int) -> str:
    """Spell a non-negative integer; four-digit years read as pairs ("fourteen fifty five")."""
    if 1100 <= n <= 1999 or 2010 <= n <= 2099:
        hi, lo = divmod(n, 100)
        return _below_100(hi) + (" hundred" if lo == 0 else " " + _below_100(lo))
    if n < 1000:
        return _below_1000(n)
    parts = []
    for scale, name in ((10**9, "billion"), (10**6, "million"), (1000, "thousand")):
        if n >= scale:
            q, n = divmod(n, scale)
            parts.append(_below_1000(q) + " " + name)
    if n:
        parts.append(_below_1000(n))
    return " ".join(parts)


_NUM_RE = re.compile(r"\d+")


def normalize(text: str) -> str:
    """Normalise English text for WER: see the module docstring."""
    t = unicodedata.normalize("NFKC", text).lower()
    t = t.replace("’", "'").replace("‘", "'").replace("%", " percent ").replace("&", " and ")
    t = re.sub(r"(?<=\d),(?=\d{3})", "", t)  # 1,000 -> 1000
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
