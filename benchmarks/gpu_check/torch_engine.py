"""Section 3b: the PyTorch engine (voxgate.engines.asr._torch) beside CTranslate2's numbers.

* **Decode step**: ms per step of :class:`WhisperTorchModel` at each batch size, eager and
  replaying the step's CUDA graph, every row at position 64 of its static cache with a full
  1,500-frame cross cache (the shape of a 30 s window), and the largest difference between the
  graph's logits and the eager step's (``graph_vs_eager_max_abs``: the eager step attends only
  the positions in use, the graph all 448, masked). On CPU there are no graphs.
* **Processors on vs off**: ms per step of :class:`TorchDecodeLoop` (model step, the batched
  logits processors, token choice, the host read-back) at each batch size, with the gateway's
  full chain (suppress list, suppress blank, phrase boost, silence-aware end, timestamp rules,
  hallucination bias) and with only ``<|endoftext|>`` suppressed. End of text is suppressed in
  both so every row decodes every step.
* **Encoder**: ms per 30 s window at a few batch sizes (SDPA, the engine's dtype).

The capacity trial for this engine is :func:`benchmarks.gpu_check.capacity.find_capacity` on
``make_sim_engines(..., engine="torch")`` (the batcher with ``join_running``).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.gpu_check.common import FULL_WINDOW_FRAMES, Budget, log

__all__ = ["bench_torch"]

#: Position every row sits at while a step is timed (a mid-utterance decode).
_POSITION = 64


def _sync(device: str) -> None:
    import torch

    if device == "cuda":
        torch.cuda.synchronize()


def _timed(fn: Any, device: str, steps: int) -> float:
    """ms per call of ``fn`` over ``steps`` calls (after two warm-up calls)."""
    fn()
    fn()
    _sync(device)
    t0 = time.perf_counter()
    for _ in range(steps):
        fn()
    _sync(device)
    return 1000 * (time.perf_counter() - t0) / steps


def _processors(tok: Any, vocab: int, on: bool) -> tuple[list[Any], Any]:
    from voxgate.engines.asr._phrases import PhraseBoost, PhraseTree
    from voxgate.engines.asr._processors import (
        HallucinationBias,
        SilenceAwareEnd,
        SuppressBlank,
        SuppressTokens,
        TimestampRules,
    )

    if not on:
        return [SuppressTokens.of([tok.eot])], None
    begin = tok.timestamp_begin
    tree = PhraseTree([("voxgate", 6.0), ("Kowalczyk", 6.0)], tok.encode)
    procs: list[Any] = [
        SuppressTokens.of([tok.eot, *range(1, 100)]),
        SuppressBlank((220, tok.eot)),
        PhraseBoost(tree, tok.eot),
        SilenceAwareEnd(tok.eot, begin, 2500, ((0, 200), (2500, 4000))),
        TimestampRules(tok.eot, tok.no_timestamps, begin, vocab - 1, begin + 50),
    ]
    ids = np.array(tok.encode(" Thank")[:1] + tok.encode(" Thanks")[:1], np.int64)

    def late(no_speech: float) -> list[Any]:
        return [HallucinationBias(ids, 2.0, begin)]

    return procs, late


def bench_torch(
    model_dir: Path,
    device: str,
    batches: Sequence[int],
    encoder_batches: Sequence[int],
    steps: int,
    budget: Budget,
    reserve_s: float,
) -> dict[str, Any]:
    """Step, processor and encoder timings of the torch engine; rows per batch size."""
    import tokenizers
    import torch
    from faster_whisper.tokenizer import Tokenizer

    from voxgate.engines.asr._decode import DecodeItem
    from voxgate.engines.asr._torch.loop import TorchDecodeLoop
    from voxgate.engines.asr._torch.model import WhisperTorchModel
    from voxgate.engines.asr._torch.weights import load_tensors

    dtype = torch.float16 if device == "cuda" else torch.float32
    dev = "cuda:0" if device == "cuda" else "cpu"
    t0 = time.perf_counter()
    weights = load_tensors(model_dir)
    top = max(batches)
    model = WhisperTorchModel(weights, dev, dtype, top, graphs=device == "cuda")
    load_s = time.perf_counter() - t0
    hf_tok = tokenizers.Tokenizer.from_file(str(model_dir / "tokenizer.json"))
    tok = Tokenizer(hf_tok, weights.is_multilingual, task="transcribe", language="en")
    out: dict[str, Any] = {
        "dtype": str(dtype).removeprefix("torch."),
        "load_s": load_s,
        "steps": [],
        "encoder": [],
        "errors": [],
    }
    rng = np.random.default_rng(0)
    memory = torch.from_numpy(
        (rng.standard_normal((model.max_frames, model.d_model)) * 0.5).astype(np.float32)
    )
    prompt = [*tok.sot_sequence, tok.no_timestamps]
    for batch in batches:
        if out["steps"] and budget.left < reserve_s:
            log(f"torch: budget low, skipping batch {batch}")
            break
        row: dict[str, Any] = {"batch": batch}
        try:
            # Model step alone: rows [0, batch) mid-utterance, full cross cache.
            model.set_memory(list(range(batch)), memory)
            model.tokens[:batch] = prompt[-1]
            model.positions[:batch] = _POSITION
            frames = model.max_frames

            def step(b: int = batch, f: int = frames) -> None:
                model.step(b, _POSITION + 1, f)

            graphs = model.graphs_enabled
            model.graphs_enabled = False
            row["eager_ms"] = _timed(step, device, steps)
            model.graphs_enabled = graphs
            row["graph_ms"] = _timed(step, device, steps) if graphs else None
            if graphs:
                # The captured step must compute what the eager one does (same inputs).
                model.graphs_enabled = False
                eager = model.step(batch, _POSITION + 1, frames).clone()
                model.graphs_enabled = True
                graph = model.step(batch, _POSITION + 1, frames)
                row["graph_vs_eager_max_abs"] = float((graph - eager).abs().max())
            row["bucket"] = model.bucket(batch)
            # The loop's step with the processors off and on.
            for name, on in (("loop_off_ms", False), ("loop_on_ms", True)):
                loop = TorchDecodeLoop(
                    model,
                    sot=tok.sot,
                    eot=tok.eot,
                    no_timestamps=tok.no_timestamps,
                    no_speech=tok.no_speech,
                )
                procs, late = _processors(tok, model.vocab_size, on)
                ts_prompt = prompt[:-1] if on else prompt
                for _ in range(batch):
                    loop.add(
                        DecodeItem(
                            memory,  # type: ignore[arg-type]
                            ts_prompt,
                            max_length=400,
                            processors=procs,
                            late_processors=late,
                        )
                    )
                row[name] = _timed(loop.step, device, steps)
            row["processors_overhead_pct"] = 100 * (row["loop_on_ms"] / row["loop_off_ms"] - 1)
            row["tokens_per_s_graph_or_eager"] = 1000 * batch / (row["graph_ms"] or row["eager_ms"])
            if device == "cuda":
                row["max_memory_gib"] = torch.cuda.max_memory_allocated() / 2**30
        except RuntimeError as error:  # e.g. CUDA out of memory at a large batch
            log(f"torch batch {batch} failed: {error}")
            row["error"] = str(error)[:300]
            out["errors"].append(f"torch batch {batch}: {str(error)[:120]}")
            out["steps"].append(row)
            break
        out["steps"].append(row)
        log(
            f"torch batch {batch}: step eager {row['eager_ms']:.2f} ms"
            + (f", graph {row['graph_ms']:.2f} ms" if row["graph_ms"] is not None else "")
            + f"; loop {row['loop_off_ms']:.2f} -> {row['loop_on_ms']:.2f} ms with processors"
        )
    mel = torch.from_numpy(
        rng.standard_normal((1, model.n_mels, FULL_WINDOW_FRAMES)).astype(np.float32)
    )
    for batch in encoder_batches:
        if out["encoder"] and budget.left < reserve_s:
            break
        try:
            x = mel.expand(batch, -1, -1).contiguous()
            ms = _timed(lambda x=x: model.encode(x), device, 3)
            out["encoder"].append({"batch": batch, "ms": ms, "ms_per_window": ms / batch})
            log(f"torch encoder batch {batch}: {ms / batch:.1f} ms per 30 s window")
        except RuntimeError as error:
            out["encoder"].append({"batch": batch, "error": str(error)[:300]})
            out["errors"].append(f"torch encoder batch {batch}: {str(error)[:120]}")
            break
    model.release()
    return out
