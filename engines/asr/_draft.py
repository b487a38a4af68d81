"""Greedy decoding that checks a draft's tokens in one decoder pass instead of one step each.

Why: a final's words are mostly known before it is decoded. The interims decoded growing
prefixes of the same utterance, and the last of them holds all but its last word or two. On a
CPU the greedy decode is the larger part of a final (CTranslate2 ``generate``: about 40 ms to
start and 7-9 ms a token for Whisper base on one core of the 2-core machine, so 110 ms for a
10-token sentence and 240 ms for 22 tokens), and each step reads every decoder weight again.
One pass of ``WhisperDecoder.extend`` over the prompt and the draft reads them once and
gives the decoder's choice at every draft position: where the choice is the draft's token the
token is taken as it stands, and the first position where it is not is where stepping starts.

The result is the greedy decode of the same decoder (the tokens :class:`DecodeLoop` would
choose, with the same logits processors), never the draft: a draft only saves steps. After the
first disagreement the draft is looked up again (the tokens that followed the last two tokens
decoded, where the draft has them) and the next few are checked in one more pass, so a draft
that lost a word or changed a comma still saves the steps after it. A pass with no candidate
is one ordinary step.

Only temperature 0 with one hypothesis (greedy) is drafted; beams, samples and every retry
go the usual way (docs/decode_loop.md, "Drafted finals").
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np
import tokenizers

from voxgate.engines.asr._decode import (
    F32,
    MAX_POSITIONS,
    DecodeResult,
    LogitsProcessor,
    ranked_result,
)

__all__ = ["DraftResult", "PassDecoder", "draft_greedy", "lookup", "with_first_merge"]

#: Draft tokens checked per pass after the first disagreement (the first pass checks all).
LOOKAHEAD = 8
#: Longest run of decoded tokens matched against the draft to find where to go on reading it.
_MATCH = 2


class PassDecoder(Protocol):
    """What the drafted decode needs of a decoder (:class:`WhisperDecoder` has it)."""

    def new_cache(self, memory: F32, capacity: int) -> Any:
        """An empty self-attention cache for ``capacity`` positions over ``memory``."""

    def extend(self, cache: Any, tokens: Sequence[int]) -> F32:
        """Run ``tokens`` at the cache's next positions; their hidden states (T, d)."""

    def logits(self, x: F32) -> F32:
        """The vocabulary scores of hidden states ``x`` (rows, vocab)."""


@dataclass(slots=True)
class DraftResult:
    """A greedy decode's result plus what the draft saved.

    Attributes:
        result: tokens (no EOT), score and no-speech probability in ``DecodeLoop``'s shape.
        logits: the processed scores at each generated position (``logits[i]`` chose token
            ``i``), for the end mark's probability; the EOT's row last.
        accepted: tokens taken from the draft without a step of their own.
        passes: decoder passes after the prompt's (each is one step's weight reads).
    """

    result: DecodeResult
    logits: list[F32] = field(default_factory=list)
    accepted: int = 0
    passes: int = 0


def lookup(decoded: Sequence[int], draft: Sequence[int], limit: int) -> list[int]:
    """The draft's tokens that follow what was just decoded, at most ``limit`` of them.

    The last ``_MATCH`` decoded tokens (then the last one) are searched in the draft, latest
    occurrence first; what follows that occurrence is the guess. None found: no guess.
    """
    for n in range(min(_MATCH, len(decoded)), 0, -1):
        tail = list(decoded[-n:])
        for start in range(len(draft) - n, -1, -1):
            if list(draft[start : start + n]) == tail:
                return list(draft[start + n : start + n + limit])
    return []


def with_first_merge(tokenizer: Any) -> Any:
    """A copy of a byte-level BPE ``tokenizer`` with GPT-2's first merge ("Ġ t") put back.

    A ``tokenizer.json`` whose merges list lost its first entry (read as a header) cannot
    form "Ġt" and every token built on it; where the vocabulary holds "Ġt" and the merge is
    missing, the merge is restored at rank 0. Otherwise the copy encodes as the original.
    """
    spec = json.loads(tokenizer.to_str())
    model = spec.get("model", {})
    merges = model.get("merges")
    if "Ġt" in model.get("vocab", {}) and isinstance(merges, list):
        first: Any = ["Ġ", "t"] if merges and isinstance(merges[0], list) else "Ġ t"
        if first not in merges:
            merges.insert(0, first)
    return tokenizers.Tokenizer.from_str(json.dumps(spec))


class _Greedy:
    """The greedy choice, one position at a time, in ``DecodeLoop._greedy``'s arithmetic."""

    def __init__(self, processors: Sequence[LogitsProcessor], eot: int, max_length: int) -> None:
        self.processors = processors
        self.eot = eot
        self.max_length = max_length
        self.seq: list[int] = []
        self.rows: list[F32] = []
        self.cum = 0.0
        self.done = False

    def choose(self, row: F32) -> int:
        """Choose the next token from one position's logits (1, vocab), processed in place."""
        step = len(self.seq)
        for proc in self.processors:
            proc.apply(step, row, [self.seq])
        scores = row[0]
        tok = int(np.argmax(scores))
        top = scores.max()
        lse = top + np.log(np.exp(scores - top).sum())
        self.cum += float(scores[tok] - lse)
        self.rows.append(scores)
        if tok == self.eot or step + 1 >= self.max_length:
            if tok != self.eot:
                self.seq.append(tok)
            self.done = True
        else:
            self.seq.append(tok)
        return tok


def draft_greedy(
    decoder: PassDecoder,
    memory: F32,
    prompt: Sequence[int],
    draft: Sequence[int],
    *,
    sot: int,
    eot: int,
    no_speech: int,
    max_length: int,
    processors: Sequence[LogitsProcessor] = (),
    lookahead: int = LOOKAHEAD,
) -> DraftResult:
    """Greedy decode of ``memory`` after ``prompt``, checking ``draft``'s tokens in passes.

    Args:
        decoder: the NumPy decoder (:class:`WhisperDecoder`); its cache's ``length`` is
            the next position, and may be set back to drop positions after it.
        memory: the encoder output (positions, d_model) float32.
        prompt: previous text (optional), the SOT sequence and the last task token.
        draft: the tokens the decode is expected to produce (text tokens, no EOT).
        sot: ``<|startoftranscript|>`` (the no-speech probability is read after it).
        eot: ``<|endoftext|>``.
        no_speech: ``<|nospeech|>``.
        max_length: generated tokens allowed, EOT included (``DecodeItem.max_length``).
        processors: the item's logits processors, applied at every position in order.
        lookahead: draft tokens checked per pass after the first disagreement.
    """
    prompt = list(prompt)
    plen = len(prompt)
    steps = max(1, min(max_length, MAX_POSITIONS - (plen - 1)))
    draft = [t for t in draft if t < eot][: max(0, steps - 1)]
    cache = decoder.new_cache(memory, plen + steps + lookahead + 1)
    hidden = decoder.extend(cache, prompt + draft)
    sot_index = prompt.index(sot)
    rows = [sot_index, *range(plen - 1, plen + len(draft))]
    logits = decoder.logits(hidden[rows])
    ns = logits[:1].copy()
    ns -= ns.max()
    np.exp(ns, out=ns)
    no_speech_prob = float(ns[0, no_speech] / ns.sum())
    g = _Greedy(processors, eot, steps)
    out = DraftResult(DecodeResult([], [], no_speech_prob), passes=1)
    pending = -1
    for i in range(len(draft) + 1):
        tok = g.choose(logits[1 + i : 2 + i])
        if g.done:
            break
        if i < len(draft) and tok == draft[i]:
            out.accepted += 1
            continue
        pending = tok
        break
    # The cache holds the prompt and the draft tokens taken; the rest of it is stale.
    cache.length = plen + out.accepted
    while not g.done:
        guess = lookup(g.seq, draft, lookahead)
        guess = guess[: max(0, steps - len(g.seq) - 1)]
        hidden = decoder.extend(cache, [pending, *guess])
        logits = decoder.logits(hidden)
        out.passes += 1
        base = cache.length - len(guess) - 1
        taken = 0
        for j in range(len(guess) + 1):
            tok = g.choose(logits[j : j + 1])
            if g.done:
                break
            if j < len(guess) and tok == guess[j]:
                taken += 1
                continue
            pending = tok
            break
        out.accepted += taken
        cache.length = base + 1 + taken
    out.result = ranked_result([(g.cum, g.seq)], 1, no_speech_prob, len(g.rows))
    out.logits = g.rows
    return out
