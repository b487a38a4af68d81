"""Section 4: how many callers the batcher + WhisperEngine serve within a p95 target."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import ctranslate2
import numpy as np

from benchmarks.gpu_check.common import FULL_WINDOW_FRAMES, Budget, cpu_count, log, percentile
from benchmarks.gpu_check.whisper_timing import Prompt, engine_config, load_ct2, log_mel

__all__ = ["Ct2Adapter", "SimSetup", "find_capacity", "make_sim_engines", "run_trial"]


class Ct2Adapter:
    """A minimal ``infer_batch`` over CTranslate2 for when WhisperEngine cannot load.

    Full 30 s window, greedy, decode capped by ``max_length``; returns the token counts.
    """

    name = "ct2-adapter"

    def __init__(self, model: Any, n_mels: int, prompt: Prompt, max_length: int) -> None:
        self._model = model
        self._n_mels = n_mels
        self._prompt = prompt
        self._max_length = max_length

    def infer_batch(self, items: Sequence[Any]) -> list[int]:
        """Encode and decode ``items`` (AsrRequest-like: ``.audio``); one token count each."""
        feats = np.stack([log_mel(np.asarray(i.audio), self._n_mels) for i in items])
        results = self._model.generate(
            ctranslate2.StorageView.from_array(feats),
            [list(self._prompt.ids) for _ in items],
            beam_size=1,
            max_length=self._max_length,
        )
        return [len(r.sequences_ids[0]) for r in results]


@dataclass(slots=True)
class SimSetup:
    """What the capacity simulation runs on."""

    workers: list[Any]
    max_batch_size: int
    engine: str
    engine_config: dict[str, Any]
    engine_error: str | None = None
    close: list[Callable[[], None]] = field(default_factory=list)
    #: Run the batcher with ``join_running`` (utterances join a running decode; torch engine).
    join_running: bool = False


def make_sim_engines(
    model_dir: Path,
    device: str,
    compute_type: str,
    workers: int,
    max_batch_size: int,
    random_weights_model: bool,
    max_length: int,
    flash_attention: bool = False,
    engine: str = "ctranslate2",
) -> SimSetup:
    """The gateway's engine layout: one WhisperEngine and ``workers - 1`` siblings.

    As ``voxgate.gateway.runtime`` builds it: on CPU one CTranslate2 replica per worker inside one
    model (``inter_threads=workers``, ``intra_threads=cores // workers``); on CUDA the engine's
    default threads. Each batcher worker gets its own engine object from
    :meth:`WhisperEngine.sibling`, which shares the model and the warmup's measurements. When
    the engine cannot load, one thin CTranslate2 adapter per worker stands in.

    ``engine="torch"`` loads the PyTorch engine instead (``asr.engine: torch``, its own
    precision: float16 on CUDA, float32 on CPU) and runs the batcher with ``join_running``, as
    the gateway would; it has no adapter to fall back to (a failure is the trial's error).
    """
    if engine == "torch":
        return _torch_setup(model_dir, device, workers, max_batch_size, random_weights_model)
    cores = cpu_count()
    threads = max(1, cores // workers) if device == "cpu" else 0
    try:
        from voxgate.engines.asr._whisper import WhisperEngine

        fields: dict[str, Any] = {
            "max_batch_size": max_batch_size,
            "flash_attention": flash_attention,
            "intra_threads": threads,
        }
        if device == "cpu":
            fields["inter_threads"] = workers
        config = engine_config(model_dir, device, compute_type, random_weights_model, **fields)
        primary = WhisperEngine.load(config)
        primary.warmup()
        engines = [primary, *(primary.sibling() for _ in range(workers - 1))]
        return SimSetup(
            workers=list(engines),
            max_batch_size=max_batch_size,
            engine="WhisperEngine",
            engine_config=json.loads(config.model_dump_json()),
            close=[primary.close],
        )
    except Exception as error:  # noqa: BLE001 - any failure: measure with the thin adapter
        log(f"WhisperEngine unavailable ({error!r}); using the CTranslate2 adapter")
        prompt = Prompt.from_model_dir(model_dir)
        models = [
            load_ct2(model_dir, device, compute_type, threads, flash_attention)
            for _ in range(workers)
        ]
        adapters = [Ct2Adapter(m, int(m.n_mels), prompt, max_length) for m in models]
        return SimSetup(
            workers=list(adapters),
            max_batch_size=max_batch_size,
            engine="ct2-adapter",
            engine_config={"window_frames": FULL_WINDOW_FRAMES, "max_length": max_length},
            engine_error=repr(error),
            close=[m.unload_model for m in models],
        )


def _torch_setup(
    model_dir: Path, device: str, workers: int, max_batch_size: int, random_weights_model: bool
) -> SimSetup:
    from voxgate.engines.asr import load_asr_engine

    config = engine_config(
        model_dir,
        device,
        "auto",
        random_weights_model,
        engine="torch",
        max_batch_size=max_batch_size,
        intra_threads=max(1, cpu_count() // workers) if device == "cpu" else 0,
    )
    try:
        primary = load_asr_engine(config)
        primary.warmup()
    except Exception as error:  # noqa: BLE001 - reported; the trial runs no engine
        log(f"torch engine unavailable ({error!r})")
        return SimSetup([], max_batch_size, "TorchWhisperEngine", {}, engine_error=repr(error))
    engines = [primary, *(primary.sibling() for _ in range(workers - 1))]
    return SimSetup(
        workers=list(engines),
        max_batch_size=max_batch_size,
        engine="TorchWhisperEngine",
        engine_config=json.loads(config.model_dump_json()),
        close=[e.close for e in engines],
        join_running=True,
    )


async def run_trial(
    setup: SimSetup,
    requests: Sequence[Any],
    calls: int,
    period_s: float,
    duration_s: float,
    abort_s: float,
    seed: int,
) -> dict[str, Any]:
    """K callers submit on their own schedule for ``duration_s``; latency per utterance.

    Each caller starts at a random phase and then submits every ``period_s`` (±15 %),
    regardless of whether its previous transcript has come back (people keep talking). The
    trial stops early once any latency exceeds ``abort_s`` (the replica is clearly full).
    """
    from voxgate.gateway.scheduling import Batcher, BatchPolicy, QueueFullError

    rng = np.random.default_rng(seed)
    loop = asyncio.get_running_loop()
    latencies: list[float] = []
    failures: list[str] = []
    rejected = 0
    aborted = asyncio.Event()
    pending: set[asyncio.Task[None]] = set()
    policy = BatchPolicy(max_batch_size=setup.max_batch_size, max_queue_size=4096)

    async with Batcher(
        setup.workers, policy, name="gpucheck", join_running=setup.join_running
    ) as batcher:
        start = loop.time()
        stop_at = start + duration_s

        async def one(request: Any) -> None:
            nonlocal rejected
            t0 = loop.time()
            try:
                future = batcher.submit(request, key=getattr(request, "batch_key", None))
            except QueueFullError:
                rejected += 1
                aborted.set()
                return
            try:
                await future
            except Exception as error:  # noqa: BLE001 - an engine failure fails the trial
                failures.append(repr(error))
                aborted.set()
                return
            latency = loop.time() - t0
            latencies.append(latency)
            if latency > abort_s:
                aborted.set()

        async def caller(index: int) -> None:
            next_at = start + float(rng.uniform(0.0, period_s))
            n = 0
            while next_at < stop_at and not aborted.is_set():
                await asyncio.sleep(max(0.0, next_at - loop.time()))
                if aborted.is_set():
                    break
                request = requests[(index + n) % len(requests)]
                task = asyncio.create_task(one(request))
                pending.add(task)
                task.add_done_callback(pending.discard)
                n += 1
                next_at += period_s * float(rng.uniform(0.85, 1.15))

        callers = [asyncio.create_task(caller(i)) for i in range(calls)]
        await asyncio.gather(*callers)
        # Drain what is in flight, but never wait on a clearly overloaded replica for long.
        drain_until = loop.time() + abort_s
        while pending and loop.time() < drain_until and not aborted.is_set():
            await asyncio.wait(set(pending), timeout=max(0.0, drain_until - loop.time()))
        unfinished = len(pending)
        for task in list(pending):
            task.cancel()
        await asyncio.gather(*list(pending), return_exceptions=True)
        elapsed = loop.time() - start
        stats = batcher.stats

    # Unfinished and rejected utterances count as over the target.
    tail = [abort_s * 2] * (unfinished + rejected + len(failures))
    all_lat = latencies + tail
    return {
        "calls": calls,
        "utterances": len(latencies),
        "unfinished": unfinished + rejected,
        "failed": len(failures),
        "first_failure": failures[0] if failures else None,
        "aborted": aborted.is_set(),
        "elapsed_s": elapsed,
        "p50_ms": 1000 * percentile(all_lat, 50) if all_lat else 0.0,
        "p95_ms": 1000 * percentile(all_lat, 95) if all_lat else 0.0,
        "max_ms": 1000 * max(all_lat) if all_lat else 0.0,
        "mean_batch": stats.items_run / stats.batches if stats.batches else 0.0,
        "max_batch": stats.max_batch_seen,
    }


def find_capacity(
    setup: SimSetup,
    requests: Sequence[Any],
    *,
    target_ms: float,
    period_s: float,
    duration_s: float,
    max_calls: int,
    budget: Budget,
    reserve_s: float,
    start_calls: int = 1,
) -> dict[str, Any]:
    """Largest K whose p95 latency meets ``target_ms``: doubling, then bisection (~10 %).

    The search starts at ``start_calls`` (an estimate from the batch throughput) to save
    trials; if that already fails it bisects down towards 0.
    """
    trials: list[dict[str, Any]] = []
    abort_s = max(4 * target_ms / 1000, 2.0)

    def trial(k: int) -> bool:
        result = asyncio.run(
            run_trial(setup, requests, k, period_s, duration_s, abort_s, seed=len(trials))
        )
        result["ok"] = bool(
            result["utterances"] > 0 and result["p95_ms"] <= target_ms and not result["aborted"]
        )
        trials.append(result)
        ok = bool(result["ok"])
        log(
            f"calls={k}: p95 {result['p95_ms']:.0f} ms over {result['utterances']} utterances "
            f"(mean batch {result['mean_batch']:.1f}) -> {'ok' if ok else 'over'}"
        )
        return ok

    good, bad = 0, None
    k = min(max(1, start_calls), max_calls)
    budget_hit = False
    while k <= max_calls:
        if trials and budget.left < reserve_s + duration_s + abort_s:
            budget_hit = True
            break
        if trial(k):
            good = k
            if k == max_calls:
                break
            k = min(max_calls, k * 2)
        else:
            bad = k
            break
    while bad is not None and bad - good > max(1, good // 10) and not budget_hit:
        if budget.left < reserve_s + duration_s + abort_s:
            budget_hit = True
            break
        mid = (good + bad) // 2
        if trial(mid):
            good = mid
        else:
            bad = mid
    return {
        "engine": setup.engine,
        "engine_error": setup.engine_error,
        "engine_config": setup.engine_config,
        "workers": len(setup.workers),
        "max_batch_size": setup.max_batch_size,
        "target_p95_ms": target_ms,
        "period_s": period_s,
        "trial_s": duration_s,
        "max_calls_tried": max_calls,
        "start_calls": min(max(1, start_calls), max_calls),
        "max_calls": good,
        "first_failing_calls": bad,
        "search_complete": not budget_hit,
        "trials": trials,
    }
