"""Window geometry of the streaming decoder: where a window and its context sit in a unit.

Both the engine (to slice the latent, :mod:`voxgate.engines.tts._streamer`) and the gateway's
synthesis policy (to know which windows of several replies share an input length and can be batched,
:mod:`voxgate.gateway.scheduling.synthesis_policy`) use it, so it lives with the engine.
"""

from __future__ import annotations

__all__ = ["window_bounds"]


def window_bounds(
    start: int,
    frames: int,
    total: int,
    context: int,
    *,
    min_tail: int = 0,
    pad_to: int = 0,
    length: int = 0,
) -> tuple[int, int, int, int]:
    """Where a window of ``frames`` from ``start`` sits in a unit that speaks up to ``total``.

    Returns ``(start, stop, lo, hi)``: the window ``[start, stop)`` and the decoder input
    ``[lo, hi)`` with ``context`` real frames each side where the latent has them (it has
    ``length`` frames, ``total`` unless the unit reads words past the ones it speaks). A
    remainder shorter than ``min_tail`` after the window is folded into it (a sliver costs a
    full context decode). ``pad_to`` widens the input to that many frames with more real
    context (right first, then left), so that windows of several replies have one common input
    length and can be batched; latents shorter than ``pad_to`` keep their whole length.
    """
    length = max(length, total)
    stop = min(total, start + max(1, frames))
    if total - stop < min_tail:
        stop = total
    lo = max(0, start - context)
    hi = min(length, stop + context)
    want = min(max(pad_to, hi - lo), length)
    if hi - lo < want:
        hi = min(length, lo + want)
        lo = max(0, hi - want)
    return start, stop, lo, hi
