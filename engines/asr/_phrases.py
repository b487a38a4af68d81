"""Phrase boosting: a per-call list of phrases with boosts, applied as a prefix-tree logit bias.

Speech APIs let a caller name words the recogniser should favour (phrase sets with boost
values). Whisper's only native lever is the previous-text prompt, which helps but cannot make
"voxgate" win over "Box-8". With our decode loop, a :class:`PhraseBoost` adds the phrase's boost
to the logits of the tokens that start a phrase and, once a row has emitted a phrase's first
tokens, to the token that continues it: the tokenised phrases form a prefix tree and each row's
recent text tokens say where in the tree it is.

The cap, so a boost never forces a phrase the audio does not contain: a token is boosted only
while the model itself finds it plausible (its log-probability before the boost is at least
``floor`` nats), and the boost never exceeds :data:`MAX_BOOST`. A phrase the audio supports
closes the gap to the acoustically similar mis-spelling; one it does not support stays far
below the floor and gets nothing. Two more limits came from measurement on the phrase set
(benchmarks/decode_loop.py): a phrase's first token gets only :data:`START_FRACTION` of the
boost (first pieces such as " K" or " vo" are common, and a full push on them bent ordinary
words), and a phrase already in the row's text is not started again (a full boost on its start
made Whisper repeat it until the repetition gate dropped the whole utterance).

Syntax (reusing the call's ``hotwords``, so no new API field is needed): a hotword written
``phrase^boost`` (e.g. ``voxgate^6``) is boosted with that value and also kept in the prompt as
today; a hotword without ``^`` only goes into the prompt, exactly as before.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt

__all__ = [
    "MAX_BOOST",
    "PhraseBoost",
    "PhraseTree",
    "parse_hotwords",
    "phrase_variants",
]

F32 = npt.NDArray[np.float32]
#: Largest boost accepted (nats added to a logit); above it a phrase would drown the audio.
MAX_BOOST = 10.0
#: Default plausibility floor: log-probability a token needs before it may be boosted.
DEFAULT_FLOOR = -8.0
#: Share of the boost a phrase's first token gets (continuations get all of it).
START_FRACTION = 0.5
#: Log-probability a phrase's *first* token needs before it may be boosted: stricter than the
#: floor, because a first piece such as " N" also begins ordinary words (" not") and, once
#: emitted, the continuation boost carries the phrase through (measured: "ask not what" became
#: "ask Nwachukwu what" with the plain floor).
DEFAULT_START_FLOOR = -2.0
_BOOST_RE = re.compile(r"^(?P<text>.*\S)\s*\^(?P<boost>[0-9]+(?:\.[0-9]+)?)$")


def parse_hotwords(
    hotwords: Iterable[str],
) -> tuple[tuple[str, ...], tuple[tuple[str, float], ...]]:
    """Split hotwords into prompt words and boosted phrases.

    ``"voxgate^6"`` -> prompt word ``"voxgate"`` and phrase ``("voxgate", 6.0)``; a word
    without ``^`` is a prompt word only. Boosts are clamped to ``[0, MAX_BOOST]``.

    Returns:
        ``(prompt_words, phrases)``.
    """
    words: list[str] = []
    phrases: list[tuple[str, float]] = []
    for raw in hotwords:
        w = raw.strip()
        m = _BOOST_RE.match(w)
        if m:
            text = m.group("text").strip()
            boost = min(MAX_BOOST, max(0.0, float(m.group("boost"))))
            words.append(text)
            if boost > 0.0:
                phrases.append((text, boost))
        elif w:
            words.append(w)
    return tuple(words), tuple(phrases)


def phrase_variants(text: str) -> tuple[str, ...]:
    """The spellings Whisper may start a phrase with: as given and capitalised, after a space."""
    out = [" " + text]
    cap = text[:1].upper() + text[1:]
    if cap != text:
        out.append(" " + cap)
    return tuple(out)


@dataclass(slots=True)
class _Node:
    children: dict[int, _Node] = field(default_factory=dict)
    boost: dict[int, float] = field(default_factory=dict)


class PhraseTree:
    """Token sequences of boosted phrases as a prefix tree (immutable once built)."""

    def __init__(
        self,
        phrases: Sequence[tuple[str, float]],
        encode: Callable[[str], Sequence[int]],
        start_fraction: float = START_FRACTION,
    ) -> None:
        self.root = _Node()
        self.depth = 0
        #: (boost, token sequences of its spellings) per phrase.
        self.phrases: list[tuple[float, list[tuple[int, ...]]]] = []
        self.start_fraction = start_fraction
        for text, boost in phrases:
            seqs = []
            for variant in phrase_variants(text):
                ids = tuple(encode(variant))
                if not ids:
                    continue
                seqs.append(ids)
                self.depth = max(self.depth, len(ids))
                node = self.root
                for tok in ids:
                    node.boost[tok] = max(node.boost.get(tok, 0.0), boost)
                    node = node.children.setdefault(tok, _Node())
            if seqs:
                self.phrases.append((boost, seqs))

    def __bool__(self) -> bool:
        return bool(self.root.children)

    @staticmethod
    def _contains(text: Sequence[int], seq: tuple[int, ...]) -> bool:
        n = len(seq)
        return any(tuple(text[i : i + n]) == seq for i in range(len(text) - n + 1))

    def continuations(self, text: Sequence[int]) -> set[int]:
        """Tokens that continue a phrase in progress at the end of ``text``."""
        return {t for t, _ in self._continue(text)}

    def _continue(self, text: Sequence[int]) -> list[tuple[int, float]]:
        out: list[tuple[int, float]] = []
        n = len(text)
        for length in range(1, min(n, self.depth - 1) + 1):
            node: _Node | None = self.root
            for tok in text[n - length :]:
                node = node.children.get(tok) if node is not None else None
                if node is None:
                    break
            if node is not None:
                out.extend(node.boost.items())
        return out

    def next_boosts(self, text: Sequence[int]) -> dict[int, float]:
        """Boost per token for the step after ``text``: phrase starts plus every continuation.

        A phrase not yet in ``text`` may start (at ``start_fraction`` of its boost); every
        suffix of ``text`` that is a path from the root is an in-progress phrase, and its
        children continue it at the full boost.
        """
        out: dict[int, float] = {}
        for boost, seqs in self.phrases:
            if any(self._contains(text, q) for q in seqs):
                continue
            for q in seqs:
                out[q[0]] = max(out.get(q[0], 0.0), boost * self.start_fraction)
        for tok, b in self._continue(text):
            out[tok] = max(out.get(tok, 0.0), b)
        return out


@dataclass(frozen=True, slots=True)
class PhraseBoost:
    """Add each phrase's boost to plausible tokens that start or continue it.

    Attributes:
        tree: the call's phrases.
        text_limit: first non-text token id (``<|endoftext|>``); timestamps and specials in a
            row's history are skipped when locating it in the tree.
        floor: log-probability a token needs (before boosting) to be boosted at all.
        start_floor: the same for a phrase's first token (stricter).
    """

    tree: PhraseTree
    text_limit: int
    floor: float = DEFAULT_FLOOR
    start_floor: float = DEFAULT_START_FLOOR

    def apply(self, step: int, logits: F32, sequences: Sequence[Sequence[int]]) -> None:
        """Bias each row toward the phrase tokens its history makes possible."""
        for r, seq in enumerate(sequences):
            text = [t for t in seq if t < self.text_limit]
            boosts = self.tree.next_boosts(text)
            if not boosts:
                continue
            cont = self.tree.continuations(text)
            ids = np.fromiter(boosts.keys(), np.int64, len(boosts))
            add = np.fromiter(boosts.values(), np.float32, len(boosts))
            floors = np.array(
                [self.floor if t in cont else self.start_floor for t in boosts], np.float32
            )
            row = logits[r]
            m = np.max(row)
            lse = m + np.log(np.sum(np.exp(row - m), dtype=np.float32))
            plausible = (row[ids] - lse) >= floors
            row[ids[plausible]] += add[plausible]
