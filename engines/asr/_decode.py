"""Our own Whisper decode loop: step by step over CTranslate2's encoder output, with a KV cache.

CTranslate2's ``Whisper.generate`` decodes a whole batch in C++ with no per-step hook, one
suppress list for the batch and no way to add an utterance once it started. This loop runs the
same decoder (weights read from ``model.bin`` by :mod:`voxgate.engines.asr._ct2_weights`) in NumPy
so
that:

* a chain of logits processors (:mod:`voxgate.engines.asr._processors`) runs between steps, per
item;
* each item carries its own processors, beam size and length cap inside one batch;
* an item can join the running batch before any step (:meth:`DecodeLoop.add`) and leaves it the
  step it finishes (iteration-level batching).

Search follows CTranslate2 4.x exactly so that, with only Whisper's own rules active, the tokens
are the ones ``generate`` returns: the prompt up to the last task token is run in one pass
(``forward_prompt``), the no-speech probability is read at ``<|startoftranscript|>``, greedy
sums log-probs, beam search keeps ``2 * beam`` candidates per step, replaces finished beams with
the next non-EOS candidate, stops after ``beam`` finished hypotheses and ranks them by
``score / length``. The dense layers are batched over every live row of every item; attention
is per item (each has its own cache length and encoder length), which is what lets items of any
age share a step.

Arithmetic: float32 throughout (NumPy 2 would promote ``x / np.sqrt(2)`` to float64, 5x slower,
so every constant is a float32). With int8 weights the activations are quantized per row as
CTranslate2 does; integer products are exact in float32, so the logits match ``int8`` ones.
One BLAS thread is the measured best on shared cores (the caller sets it; see docs).
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import numpy.typing as npt

from voxgate.engines.asr._ct2_weights import DecoderWeights, Linear, load_decoder_weights

__all__ = [
    "DecodeItem",
    "DecodeLoop",
    "DecodeResult",
    "LogitsProcessor",
    "SharedDecoder",
    "StepLoop",
    "WhisperDecoder",
]

#: float32 arrays (NumPy's stubs type matmul results loosely, so the dtype is a convention).
F32 = npt.NDArray[Any]
_NEG_INF = np.float32(-np.inf)
_EPS = np.float32(1e-5)
_HALF = np.float32(0.5)
_ONE = np.float32(1.0)
_Q127 = np.float32(127.0)
_SQRT_HALF = np.float32(np.sqrt(0.5))
# Abramowitz-Stegun 7.1.26 (|error| < 1.5e-7, below float32 resolution of GELU's output).
_AS_P = np.float32(0.3275911)
_AS_A = tuple(np.float32(a) for a in (0.254829592, -0.284496736, 1.421413741, -1.453152027))
_AS_A5 = np.float32(1.061405429)
#: Whisper's decoder holds at most 448 positions.
MAX_POSITIONS = 448


class LogitsProcessor(Protocol):
    """One rule applied to an item's logits between decode steps (in place).

    Args of ``apply``:
        step: index of the token being chosen (0 = the first after the prompt).
        logits: (rows, vocab) float32 for this item's live rows (beams or samples).
        sequences: the tokens each row generated so far (excluding the prompt).
    """

    def apply(self, step: int, logits: F32, sequences: Sequence[Sequence[int]]) -> None:
        """Modify ``logits`` in place: ``-inf`` forbids a token, a finite add biases it."""
        ...


class StepLoop(Protocol):
    """What the engine drives: :class:`DecodeLoop` here, ``._torch.loop`` on torch."""

    steps: int
    rows: int

    @property
    def active(self) -> int:
        """Items still decoding."""
        ...

    def add(self, item: DecodeItem) -> None:
        """Put ``item`` in the batch for the next step."""
        ...

    def step(self) -> list[DecodeItem]:
        """One decode step; the items that finished on it."""
        ...

    def abort(self, item: DecodeItem) -> bool:
        """Take ``item`` out of the batch (its ``result`` stays None); False if not in it."""
        ...

    def run(self, items: Sequence[DecodeItem]) -> list[DecodeResult]:
        """Decode ``items`` together to the end."""
        ...


def run_to_end(loop: StepLoop, items: Sequence[DecodeItem]) -> list[DecodeResult]:
    """Add ``items`` to ``loop`` and step until every item has ended; their results in order.

    Shared by both step loops (NumPy here, torch in ``._torch.loop``): the batch path of the
    engine runs them this way, joins aside.
    """
    for it in items:
        loop.add(it)
    while loop.active:
        loop.step()
    out = []
    for it in items:
        assert it.result is not None
        out.append(it.result)
    return out


def ranked_result(
    hyps: list[tuple[float, list[int]]], limit: int, no_speech: float, steps: int
) -> DecodeResult:
    """An item's result from its finished hypotheses: best length-normalised score first.

    One rule for both step loops, so that their beams rank (and tie) alike.
    """
    ranked = []
    for score, toks in hyps:
        norm = score / len(toks) if toks else float("-inf") if score < 0 else 0.0
        ranked.append((norm, toks))
    ranked.sort(key=lambda p: p[0], reverse=True)
    ranked = ranked[:limit]
    return DecodeResult([t for _, t in ranked], [s for s, _ in ranked], no_speech, steps)


def _erf(x: F32) -> F32:
    s = np.sign(x)
    a = np.abs(x)
    t = _ONE / (_ONE + _AS_P * a)
    a1, a2, a3, a4 = _AS_A
    y = _ONE - (((((_AS_A5 * t + a4) * t) + a3) * t + a2) * t + a1) * t * np.exp(-a * a)
    out: F32 = (s * y).astype(np.float32, copy=False)
    return out


def _gelu(x: F32) -> F32:
    return (_HALF * x * (_ONE + _erf(x * _SQRT_HALF))).astype(np.float32, copy=False)


def _layer_norm(x: F32, ln: tuple[F32, F32]) -> F32:
    mean = x.mean(axis=-1, keepdims=True, dtype=np.float32)
    d = x - mean
    var = np.mean(d * d, axis=-1, keepdims=True, dtype=np.float32)
    out: F32 = d / np.sqrt(var + _EPS) * ln[0] + ln[1]
    return out


def _linear(x: F32, lin: Linear) -> F32:
    if lin.inv_scale is None:
        y: F32 = x @ lin.w_t
    else:
        amax = np.max(np.abs(x), axis=-1, keepdims=True)
        scale = np.where(amax > 0, _Q127 / np.maximum(amax, np.float32(1e-30)), _ONE)
        scale = scale.astype(np.float32, copy=False)
        q = np.rint(x * scale)
        y = (q @ lin.w_t) * (lin.inv_scale / scale)
    if lin.bias is not None:
        y += lin.bias
    return y


def _softmax_inplace(x: F32) -> F32:
    x -= x.max(axis=-1, keepdims=True)
    np.exp(x, out=x)
    x /= x.sum(axis=-1, keepdims=True)
    return x


def log_softmax(x: F32) -> F32:
    """Row-wise log-softmax in float32 (``-inf`` entries stay ``-inf``)."""
    m = x.max(axis=-1, keepdims=True)
    z = x - m
    out: F32 = z - np.log(np.exp(z).sum(axis=-1, keepdims=True))
    return out


@dataclass(slots=True)
class _Cache:
    """Per-item attention state: self K (rows,H,dh,T), V (rows,H,T,dh); cross K^T, V."""

    self_k: list[F32]
    self_v: list[F32]
    cross_k: list[F32]
    cross_v: list[F32]
    length: int = 0


class WhisperDecoder:
    """Whisper's decoder as NumPy functions over :class:`DecoderWeights` (no search)."""

    def __init__(self, weights: DecoderWeights) -> None:
        self.w = weights
        self.heads = weights.num_heads
        self.d_head = weights.d_model // weights.num_heads
        self._qscale = np.float32(1.0 / np.sqrt(self.d_head))

    def new_cache(self, memory: F32, capacity: int) -> _Cache:
        """Cross-attention K/V of one item's encoder output (computed once) and an empty cache."""
        mem = np.ascontiguousarray(memory, dtype=np.float32)
        s = mem.shape[0]
        h, dh = self.heads, self.d_head
        ck, cv, sk, sv = [], [], [], []
        for layer in self.w.layers:
            k = _linear(mem, layer.k_cross).reshape(s, h, dh)
            v = _linear(mem, layer.v_cross).reshape(s, h, dh)
            ck.append(np.ascontiguousarray(k.transpose(1, 2, 0)))  # (H, dh, S)
            cv.append(np.ascontiguousarray(v.transpose(1, 0, 2)))  # (H, S, dh)
            sk.append(np.zeros((1, h, dh, capacity), np.float32))
            sv.append(np.zeros((1, h, capacity, dh), np.float32))
        return _Cache(sk, sv, ck, cv)

    def prefill(self, cache: _Cache, tokens: Sequence[int], logits_at: int | None) -> F32 | None:
        """Run ``tokens`` (one row, positions 0..T-1) into ``cache``; logits at one position."""
        t = len(tokens)
        h, dh = self.heads, self.d_head
        x = self.w.embeddings[np.asarray(tokens)] + self.w.positions[:t]
        mask = np.triu(np.full((t, t), _NEG_INF, np.float32), 1)
        for li, layer in enumerate(self.w.layers):
            y = _layer_norm(x, layer.ln_self)
            q = (_linear(y, layer.q) * self._qscale).reshape(t, h, dh).transpose(1, 0, 2)
            k = _linear(y, layer.k).reshape(t, h, dh)
            v = _linear(y, layer.v).reshape(t, h, dh)
            cache.self_k[li][0, :, :, :t] = k.transpose(1, 2, 0)
            cache.self_v[li][0, :, :t, :] = v.transpose(1, 0, 2)
            att = q @ cache.self_k[li][0, :, :, :t] + mask  # (H, T, T)
            o = _softmax_inplace(att) @ cache.self_v[li][0, :, :t, :]  # (H, T, dh)
            x = x + _linear(o.transpose(1, 0, 2).reshape(t, h * dh), layer.out_self)
            y = _layer_norm(x, layer.ln_cross)
            q = (_linear(y, layer.q_cross) * self._qscale).reshape(t, h, dh).transpose(1, 0, 2)
            att = q @ cache.cross_k[li]
            o = _softmax_inplace(att) @ cache.cross_v[li]
            x = x + _linear(o.transpose(1, 0, 2).reshape(t, h * dh), layer.out_cross)
            y = _layer_norm(x, layer.ln_ffn)
            x = x + _linear(_gelu(_linear(y, layer.ffn_in)), layer.ffn_out)
        cache.length = t
        if logits_at is None:
            return None
        return self.logits(x[logits_at : logits_at + 1])

    def logits(self, x: F32) -> F32:
        """Final norm and the projection on the (tied) embeddings."""
        return _linear(_layer_norm(x, self.w.ln_final), self.w.projection)

    def step(self, tokens: Sequence[npt.NDArray[np.int64]], caches: Sequence[_Cache]) -> F32:
        """One decode step for several items: ``tokens[i]`` are item i's row inputs.

        Each item's rows sit at its own position (``cache.length``); the new K/V are written
        there and the length advances. Returns (sum of rows, vocab) logits, items in order.
        """
        h, dh = self.heads, self.d_head
        counts = [len(t) for t in tokens]
        bounds = np.cumsum([0, *counts])
        ids = np.concatenate(tokens)
        pos = np.concatenate([np.full(n, c.length) for n, c in zip(counts, caches, strict=True)])
        x = self.w.embeddings[ids] + self.w.positions[pos]
        r = len(ids)
        for li, layer in enumerate(self.w.layers):
            y = _layer_norm(x, layer.ln_self)
            q = (_linear(y, layer.q) * self._qscale).reshape(r, h, 1, dh)
            k = _linear(y, layer.k).reshape(r, h, dh)
            v = _linear(y, layer.v).reshape(r, h, dh)
            o = np.empty((r, h, 1, dh), np.float32)
            for i, c in enumerate(caches):
                a, b, n = bounds[i], bounds[i + 1], c.length
                c.self_k[li][:, :, :, n] = k[a:b]
                c.self_v[li][:, :, n, :] = v[a:b]
                att = q[a:b] @ c.self_k[li][:, :, :, : n + 1]
                o[a:b] = _softmax_inplace(att) @ c.self_v[li][:, :, : n + 1, :]
            x = x + _linear(o.reshape(r, h * dh), layer.out_self)
            y = _layer_norm(x, layer.ln_cross)
            q2 = (_linear(y, layer.q_cross) * self._qscale).reshape(r, h, dh).transpose(1, 0, 2)
            o2 = np.empty((h, r, dh), np.float32)
            for i, c in enumerate(caches):
                a, b = bounds[i], bounds[i + 1]
                att = q2[:, a:b] @ c.cross_k[li]  # (H, rows, S)
                o2[:, a:b] = _softmax_inplace(att) @ c.cross_v[li]
            x = x + _linear(o2.transpose(1, 0, 2).reshape(r, h * dh), layer.out_cross)
            y = _layer_norm(x, layer.ln_ffn)
            x = x + _linear(_gelu(_linear(y, layer.ffn_in)), layer.ffn_out)
        for c in caches:
            c.length += 1
        return self.logits(x)


@dataclass(slots=True)
class DecodeResult:
    """What ``generate`` returns for one item, in CTranslate2's shape.

    Attributes:
        sequences_ids: hypotheses (no EOS), best first.
        scores: ``sum(log p) / len`` per hypothesis (CTranslate2's length penalty 1).
        no_speech_prob: probability of ``<|nospeech|>`` at ``<|startoftranscript|>``.
        steps: decode steps this item took.
    """

    sequences_ids: list[list[int]]
    scores: list[float]
    no_speech_prob: float
    steps: int = 0


@dataclass(slots=True)
class DecodeItem:
    """One utterance to decode.

    Attributes:
        memory: encoder output (positions, d_model) float32.
        prompt: previous-text tokens (optional), SOT sequence and the last task token.
        max_length: decode steps allowed (CTranslate2's inner ``max_length``).
        beam_size: 1 = greedy (or sampling when ``temperature`` > 0).
        num_hypotheses: hypotheses returned (samples drawn when sampling).
        temperature: 0 = argmax; > 0 samples from ``softmax(logits / T)``.
        processors: this item's rules, applied in order every step.
        late_processors: builds more rules once the no-speech probability is known (after
            the prompt ran); they run after ``processors``.
        seed: sampling seed (only with ``temperature`` > 0).
        result: set when the item finishes.
    """

    memory: F32
    prompt: Sequence[int]
    max_length: int
    beam_size: int = 1
    num_hypotheses: int = 1
    temperature: float = 0.0
    processors: Sequence[LogitsProcessor] = ()
    late_processors: Callable[[float], Sequence[LogitsProcessor]] | None = None
    seed: int = 0
    result: DecodeResult | None = None


@dataclass(slots=True)
class _Live:
    item: DecodeItem
    cache: _Cache
    eot: int
    inputs: npt.NDArray[np.int64]
    seqs: list[list[int]]
    cum: npt.NDArray[np.float64]
    no_speech: float
    rng: np.random.Generator | None
    processors: list[LogitsProcessor]
    step: int = 0
    finished: list[tuple[float, list[int]]] = field(default_factory=list)


class DecodeLoop:
    """Greedy, sampling and beam search over :class:`WhisperDecoder`, one step at a time.

    Threading: not thread-safe; one worker owns a loop. ``add`` may be called between any two
    ``step`` calls: the new item runs its prompt then joins the next step (iteration-level
    batching); an item leaves the batch the step it finishes and its ``result`` is set.
    """

    def __init__(
        self, decoder: WhisperDecoder, *, sot: int, eot: int, no_timestamps: int, no_speech: int
    ) -> None:
        self.decoder = decoder
        self.sot, self.eot = sot, eot
        self.no_timestamps, self.no_speech = no_timestamps, no_speech
        self._live: list[_Live] = []
        #: Decode steps run and rows stepped (for benchmarks).
        self.steps = 0
        self.rows = 0

    @property
    def active(self) -> int:
        """Items still decoding."""
        return len(self._live)

    def _prompt_length(self, prompt: Sequence[int]) -> int:
        """Index after the SOT sequence (CTranslate2's ``get_prompt_length``)."""
        i = list(prompt).index(self.sot)
        while i < len(prompt) and self.sot <= prompt[i] <= self.no_timestamps:
            i += 1
        return i

    def add(self, item: DecodeItem) -> None:
        """Run ``item``'s prompt and put it in the batch for the next step."""
        prompt = list(item.prompt)
        if self.sot not in prompt:
            raise ValueError("the prompt has no <|startoftranscript|>")
        plen = self._prompt_length(prompt)
        if plen != len(prompt):
            raise ValueError("text after the task tokens (a forced prefix) is not supported")
        sot_index = prompt.index(self.sot)
        steps = max(1, min(item.max_length, MAX_POSITIONS - (plen - 1)))
        item.max_length = steps
        cache = self.decoder.new_cache(item.memory, plen + steps)
        no_speech = float("nan")
        if plen > 1:
            at = sot_index if sot_index != plen - 1 else None
            logits = self.decoder.prefill(cache, prompt[: plen - 1], at)
            if logits is not None:
                no_speech = float(_softmax_inplace(logits)[0, self.no_speech])
        rows = item.num_hypotheses if item.temperature > 0.0 and item.beam_size == 1 else 1
        if rows > 1:
            self._expand(cache, np.zeros(rows, np.int64))
        rng = np.random.default_rng(item.seed) if item.temperature > 0.0 else None
        self._live.append(
            _Live(
                item,
                cache,
                self.eot,
                np.full(rows, prompt[plen - 1], np.int64),
                [[] for _ in range(rows)],
                np.zeros(rows),
                no_speech,
                rng,
                list(item.processors),
            )
        )

    @staticmethod
    def _expand(cache: _Cache, origins: npt.NDArray[np.int64]) -> None:
        """Reorder / replicate cache rows (beam origins); only the filled part is copied."""
        n = cache.length
        same = len(origins) == cache.self_k[0].shape[0] and np.array_equal(
            origins, np.arange(len(origins))
        )
        if same:
            return
        for li in range(len(cache.self_k)):
            k, v = cache.self_k[li], cache.self_v[li]
            if len(origins) == k.shape[0]:
                k[:, :, :, :n] = k[origins, :, :, :n]
                v[:, :, :n, :] = v[origins, :, :n, :]
            else:
                cache.self_k[li] = np.ascontiguousarray(k[origins])
                cache.self_v[li] = np.ascontiguousarray(v[origins])

    def step(self) -> list[DecodeItem]:
        """One decode step for every live item; returns the items that finished on it."""
        if not self._live:
            return []
        logits = self.decoder.step(
            [lv.inputs for lv in self._live], [lv.cache for lv in self._live]
        )
        self.steps += 1
        self.rows += logits.shape[0]
        done: list[DecodeItem] = []
        keep: list[_Live] = []
        a = 0
        for lv in self._live:
            n = len(lv.inputs)
            part = logits[a : a + n]
            a += n
            if lv.step == 0:
                if np.isnan(lv.no_speech):
                    lv.no_speech = float(_softmax_inplace(part[:1].copy())[0, self.no_speech])
                if lv.item.late_processors is not None:
                    lv.processors += lv.item.late_processors(lv.no_speech)
            for proc in lv.processors:
                proc.apply(lv.step, part, lv.seqs)
            finished = self._beam(lv, part) if lv.item.beam_size > 1 else self._greedy(lv, part)
            lv.step += 1
            if finished:
                done.append(lv.item)
            else:
                keep.append(lv)
        self._live = keep
        return done

    def abort(self, item: DecodeItem) -> bool:
        """Take ``item`` out of the batch (its ``result`` stays None); False if not in it."""
        kept = [lv for lv in self._live if lv.item is not item]
        found = len(kept) < len(self._live)
        self._live = kept
        return found

    def run(self, items: Sequence[DecodeItem]) -> list[DecodeResult]:
        """Decode ``items`` together to the end (all join at the first step)."""
        return run_to_end(self, items)

    # ------------------------------------------------------------------ search

    def _finish(self, lv: _Live, hyps: list[tuple[float, list[int]]], limit: int) -> None:
        lv.item.result = ranked_result(hyps, limit, lv.no_speech, lv.step + 1)

    def _greedy(self, lv: _Live, logits: F32) -> bool:
        lp = log_softmax(logits)
        if lv.rng is not None:
            temp = np.float32(lv.item.temperature)
            probs = _softmax_inplace((lp / temp).astype(np.float32))
            choice = np.array(
                [lv.rng.choice(probs.shape[1], p=p / p.sum(dtype=np.float64)) for p in probs]
            )
        else:
            choice = np.argmax(lp, axis=1)
        last = lv.step + 1 >= lv.item.max_length
        alive = []
        for r, tok in enumerate(choice.tolist()):
            lv.cum[r] += float(lp[r, tok])
            if tok == lv.eot or last:
                if tok != lv.eot:
                    lv.seqs[r].append(tok)
                lv.finished.append((float(lv.cum[r]), lv.seqs[r]))
            else:
                lv.seqs[r].append(tok)
                alive.append(r)
        if len(alive) < len(choice):
            if not alive:
                self._finish(lv, lv.finished, len(lv.finished))
                return True
            idx = np.asarray(alive, np.int64)
            self._shrink(lv.cache, idx)
            lv.seqs = [lv.seqs[r] for r in alive]
            lv.cum = lv.cum[idx]
            choice = choice[idx]
        lv.inputs = np.asarray(choice, np.int64)
        return False

    @staticmethod
    def _shrink(cache: _Cache, keep: npt.NDArray[np.int64]) -> None:
        for li in range(len(cache.self_k)):
            cache.self_k[li] = np.ascontiguousarray(cache.self_k[li][keep])
            cache.self_v[li] = np.ascontiguousarray(cache.self_v[li][keep])

    def _beam(self, lv: _Live, logits: F32) -> bool:
        beam = lv.item.beam_size
        vocab = logits.shape[1]
        total = log_softmax(logits) + lv.cum[:, None].astype(np.float32)
        flat = total.reshape(-1)
        ncand = 2 * beam
        top = np.argpartition(-flat, ncand)[:ncand]
        top = top[np.argsort(-flat[top], kind="stable")]
        toks = (top % vocab).tolist()
        origins = (top // vocab).tolist()
        scores = flat[top].tolist()
        last = lv.step + 1 >= lv.item.max_length
        active: list[int] = []
        secondary = beam
        for k in range(beam):
            chosen = k
            if toks[k] == lv.eot or last:
                hyp = list(lv.seqs[origins[k]])
                if toks[k] != lv.eot:
                    hyp.append(toks[k])
                lv.finished.append((scores[k], hyp))
                for j in range(secondary, ncand):
                    if toks[j] != lv.eot:
                        chosen = j
                        secondary = j + 1
                        break
            active.append(chosen)
        if last or len(lv.finished) >= beam:
            self._finish(lv, lv.finished, lv.item.num_hypotheses)
            return True
        orig = np.asarray([origins[j] for j in active], np.int64)
        self._expand(lv.cache, orig)
        lv.seqs = [[*lv.seqs[origins[j]], toks[j]] for j in active]
        lv.cum = np.asarray([scores[j] for j in active])
        lv.inputs = np.asarray([toks[j] for j in active], np.int64)
        return False


class SharedDecoder:
    """The decode loop's decoder weights, loaded on first use and shared by sibling engines.

    Reading and quantizing the decoder takes seconds and ~250 MB, so it happens only when an
    item first needs a processor, once per process-wide model (siblings share this object).
    """

    def __init__(self, model_dir: Path | None, weights: str) -> None:
        self.model_dir = model_dir
        self.weights = weights
        self._lock = threading.Lock()
        self._decoder: WhisperDecoder | None = None
        self._config: dict[str, Any] | None = None

    def decoder(self) -> WhisperDecoder:
        """The decoder, read from the model directory the first time it is asked for."""
        with self._lock:
            if self._decoder is None:
                if self.model_dir is None:
                    raise RuntimeError("the decode loop needs the model directory (use load())")
                weights = load_decoder_weights(
                    self.model_dir, "int8" if self.weights == "int8" else "none"
                )
                self._decoder = WhisperDecoder(weights)
            return self._decoder

    def model_config(self) -> dict[str, Any]:
        """The model directory's ``config.json`` ({} without a directory)."""
        with self._lock:
            if self._config is None:
                cfg: dict[str, Any] = {}
                if self.model_dir is not None:
                    cfg = json.loads((self.model_dir / "config.json").read_text())
                self._config = cfg
            return self._config
