"""Word error rate and domain-term recall, with the small English normaliser the benchmarks use.

Whisper's ``EnglishTextNormalizer`` is not shipped by faster-whisper, so this is a deliberately
small stand-in: lower-case, unify apostrophes, expand ``%``/``&``, spell out digits (year style
for 1100-1999 and 2010-2099, so "1455" and "fourteen fifty-five" agree), read ordinals ("20th"
as "twentieth") and spell out the titles Whisper abbreviates ("Mr." as "mister"), as Whisper's
normaliser does, drop punctuation and hyphens. Both reference and hypothesis go through it, so
only consistency matters.

It lives here rather than only in ``benchmarks/`` because ``voxgate adapt`` writes WER into its
report from an installed package, and a report and a benchmark that scored differently would
disagree about the same model. The edit distance is rapidfuzz's (a serving dependency already),
so the report needs no extra package; it counts the same edits as jiwer's alignment.
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Sequence

from rapidfuzz.distance import Levenshtein

from voxgate.engines.tts import cardinal, ordinal, year

__all__ = ["corpus_wer", "normalize", "number_to_words", "term_hits", "wer", "word_edits"]


def number_to_words(n: int) -> str:
    """Spell a non-negative integer the way the TTS front end reads it (years as pairs).

    Shared with ``voxgate.engines.tts`` so that one English number reader serves both synthesis and
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


def word_edits(reference: str, hypothesis: str) -> tuple[int, int]:
    """(substitutions + deletions + insertions, reference words) after normalisation."""
    ref, hyp = normalize(reference).split(), normalize(hypothesis).split()
    return int(Levenshtein.distance(ref, hyp)), len(ref)


def wer(reference: str, hypothesis: str) -> float:
    """WER of one pair after normalisation (1.0 for any words against an empty reference)."""
    edits, words = word_edits(reference, hypothesis)
    if not words:
        return 0.0 if not edits else 1.0
    return edits / words


def corpus_wer(references: Sequence[str], hypotheses: Sequence[str]) -> float:
    """Total edits over total reference words, after normalisation."""
    if len(references) != len(hypotheses):
        raise ValueError(f"{len(references)} references but {len(hypotheses)} hypotheses")
    edits = words = 0
    for r, h in zip(references, hypotheses, strict=True):
        e, n = word_edits(r, h)
        edits += e
        words += n
    return edits / max(1, words)


def _count(needle: tuple[str, ...], hay: list[str]) -> int:
    n = len(needle)
    return sum(tuple(hay[i : i + n]) == needle for i in range(len(hay) - n + 1)) if n else 0


def term_hits(reference: str, hypothesis: str, terms: Sequence[str]) -> dict[str, tuple[int, int]]:
    """For each term said in the reference: (times recognised, times said).

    A term counts as recognised when its normalised words appear, in order and adjacent, in the
    normalised hypothesis; each occurrence in the hypothesis answers at most one in the
    reference, so repeating a term cannot raise its recall.
    """
    ref, hyp = normalize(reference).split(), normalize(hypothesis).split()
    out: dict[str, tuple[int, int]] = {}
    for term in terms:
        words = tuple(normalize(term).split())
        said = _count(words, ref)
        if said:
            out[term] = (min(said, _count(words, hyp)), said)
    return out
