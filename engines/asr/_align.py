"""Word timing: CTranslate2's cross-attention alignment turned into per-word times.

``Whisper.align`` (cross-attention + DTW, as faster-whisper's ``add_word_timestamps``) gives,
per text token, the encoder frame it aligns to. Words are Whisper's own word split of the
tokens; a word starts where its first token jumps to a new frame and ends where the next word's
does. Punctuation is merged into its neighbour the way faster-whisper does it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
from faster_whisper.tokenizer import Tokenizer
from faster_whisper.transcribe import merge_punctuations

from voxgate.engines.asr.base import AsrWord
from voxgate.engines.asr.config import MEL_FRAMES_PER_S

__all__ = ["word_times"]

#: Alignment steps per second: the encoder halves the mel frame rate.
_TOKENS_PER_S = MEL_FRAMES_PER_S / 2
_PREPEND_PUNCT = "\"'“¿([{-"
_APPEND_PUNCT = "\"'.。,，!！?？:：”)]}、"


def word_times(
    tok: Tokenizer, tokens: Sequence[int], alignment: Any, *, offset_s: float, limit_s: float
) -> list[AsrWord]:
    """Per-word times (ms, from the utterance start) and probabilities for one hypothesis.

    Args:
        tok: the tokenizer of the hypothesis' language and task.
        tokens: the hypothesis' text tokens (no special tokens).
        alignment: one result of ``ctranslate2.models.Whisper.align``.
        offset_s: where this 30 s chunk starts in the utterance.
        limit_s: the chunk's audio length; no word ends after it.
    """
    words, word_tokens = tok.split_to_word_tokens([*tokens, tok.eot])
    if len(word_tokens) <= 1:
        return []
    text_idx = np.array([p[0] for p in alignment.alignments])
    time_idx = np.array([p[1] for p in alignment.alignments])
    if len(text_idx) == 0:
        return []
    bounds = np.pad(np.cumsum([len(t) for t in word_tokens[:-1]]), (1, 0))
    jumps = np.pad(np.diff(text_idx), (1, 0), constant_values=1).astype(bool)
    jump_times = time_idx[jumps] / _TOKENS_PER_S
    probs = np.asarray(alignment.text_token_probs, dtype=np.float64)
    timing = []
    for k in range(len(bounds) - 1):
        lo, hi = int(bounds[k]), int(bounds[k + 1])
        start = float(jump_times[min(lo, len(jump_times) - 1)])
        end = float(jump_times[min(hi, len(jump_times) - 1)])
        p = float(np.mean(probs[lo:hi])) if hi > lo and hi <= len(probs) else 0.0
        timing.append(
            {"word": words[k], "tokens": word_tokens[k], "start": start, "end": end, "p": p}
        )
    merge_punctuations(timing, _PREPEND_PUNCT, _APPEND_PUNCT)
    result: list[AsrWord] = []
    prev_end = 0.0
    for t in timing:
        if not str(t["word"]).strip():
            continue
        start = min(max(float(t["start"]), prev_end), limit_s)
        end = min(max(float(t["end"]), start), limit_s)
        prev_end = end
        result.append(
            AsrWord(
                text=str(t["word"]).strip(),
                start_ms=round(1000 * (offset_s + start)),
                end_ms=round(1000 * (offset_s + end)),
                probability=float(t["p"]),
            )
        )
    return result
