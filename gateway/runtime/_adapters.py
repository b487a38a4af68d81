"""The engines as sessions see them.

Recognition goes through the cross-call batcher, synthesis through the deadline scheduler; batch
metrics and one worker's engine per model sit beside them.

Each adapter implements a :mod:`voxgate.gateway.base` Protocol over a synchronous engine, so no
model work runs on the event loop; the hub (``_hub``) builds and closes them.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Hashable, Iterable, Sequence
from typing import cast

from voxgate.engines.asr.base import AsrEngine, AsrRequest, AsrResult, StepAsrEngine
from voxgate.engines.tts import (
    SpeakOptions,
    TtsChunk,
    TtsEngine,
    TtsError,
    TtsInputError,
    VitsStreamer,
)
from voxgate.gateway.base import (
    TtsPiece,
)
from voxgate.gateway.errors import CallError, ErrorKind
from voxgate.gateway.events import SpeakIn
from voxgate.gateway.metrics import GatewayMetrics
from voxgate.gateway.models import (
    ModelRegistry,
    model_name_of,
)
from voxgate.gateway.scheduling import (
    Batcher,
    BatchObserver,
    BatchTimeoutError,
    QueueFullError,
    WithdrawnError,
)
from voxgate.gateway.scheduling.synthesis import ReplyStats, SynthesisScheduler, policy_for

__all__ = ["AsrTranscriber", "BatchMetrics", "ModelRouter", "TtsSynthesizer"]

log = logging.getLogger("voxgate.runtime")


class TtsSynthesizer:
    """The VITS streamer as sessions see it: an async stream of audio pieces per Speak.

    :class:`~voxgate.gateway.scheduling.synthesis.SynthesisScheduler` runs every reply's
    front-end runs and decoder windows on ``threads`` workers, earliest playout deadline first,
    first audio ahead of everything, window sizes from each reply's slack. (The earlier plain
    FIFO pool left production code in v0.3; the TTS benchmarks keep it as their baseline,
    ``benchmarks/_fifo_pool.py``.)

    Args:
        streamer: a loaded, warmed voice engine (thread-safe across streams).
        threads: engine worker threads.
        metrics: where first audio, streams, slack, lateness and batches are counted.
        max_batch_size: decoder windows per ONNX Runtime call.
        nice: the workers run this many nice levels below the event loop
            (``session.tts_nice``; :mod:`voxgate.gateway.priority`).
        max_lead_s: a paced reply (``SpeakIn.paced``) is synthesized at most this far ahead
            of its player (``session.tts_max_lead_ms``).
    """

    def __init__(
        self,
        streamer: TtsEngine,
        threads: int,
        metrics: GatewayMetrics,
        *,
        max_batch_size: int = 1,
        nice: int = 0,
        max_lead_s: float = math.inf,
    ) -> None:
        self.streamer = streamer
        self._metrics = metrics
        self.sample_rate_hz = streamer.sample_rate_hz
        self.max_text_chars = streamer.max_text_chars
        self._window_frames = int(getattr(getattr(streamer, "config", None), "window_frames", 96))
        if not isinstance(streamer, VitsStreamer):
            raise TypeError("deadline scheduling needs a VitsStreamer (open/decode_windows)")
        self.scheduler = SynthesisScheduler(
            streamer,
            threads,
            policy_for(streamer, max_batch_size),
            metrics,
            nice=nice,
            max_lead_s=max_lead_s,
        )
        metrics.engine_workers.labels("tts").set(threads)

    def _options(self, speak: SpeakIn) -> SpeakOptions:
        return SpeakOptions(
            length_scale=1.0 / speak.rate if speak.rate else None,
            speaker_id=speak.speaker_id or None,
            voice=speak.voice or None,
            # The degradation ladder's tts_window step (gateway/degrade.py): the scheduler
            # sizes windows from slack, up to this size.
            window_frames=2 * self._window_frames if speak.degraded else None,
        )

    async def stream(
        self, speak: SpeakIn, stats: ReplyStats | None = None
    ) -> AsyncIterator[TtsPiece]:
        """Synthesize ``speak``, window by window, on the engine threads.

        ``stats`` receives what the caller's player experiences.
        """
        options = self._options(speak)
        t0 = time.perf_counter()
        chunks = self._scheduled(speak.text, options, stats, speak.paced)
        # Counted until the consumer stops (end, error or a barge-in's cancel): the synthesis
        # load admission reads (voxgate_tts_streams_active).
        self._metrics.tts_streams_active.inc()
        try:
            first = True
            try:
                async for chunk in chunks:
                    if first:
                        self._metrics.tts_first_audio.observe(time.perf_counter() - t0)
                        first = False
                    yield TtsPiece(
                        samples=chunk.samples,
                        words=tuple((w.text, round(w.end_ms)) for w in chunk.words),
                        is_last=chunk.is_last,
                    )
            except TtsInputError as exc:
                raise CallError.invalid(f"speak.{exc.field}: {exc}") from None
            except TtsError as exc:
                raise CallError(ErrorKind.INTERNAL, f"speech synthesis failed: {exc}") from None
            finally:
                await chunks.aclose()
        finally:
            self._metrics.tts_streams_active.dec()

    async def _scheduled(
        self, text: str, options: SpeakOptions, stats: ReplyStats | None, paced: bool
    ) -> AsyncGenerator[TtsChunk]:
        async for chunk in self.scheduler.stream(text, options, stats, paced=paced):
            yield chunk

    async def aclose(self) -> None:
        """Stop the threads (after the server stopped calling)."""
        await self.scheduler.aclose()


class BatchMetrics(BatchObserver):
    """Exports the batcher's queue depth, waits, busy time and batch sizes to Prometheus.

    Queue wait and busy time are also what admission and the degradation ladder measure
    (gateway/admission.py reads them back from the registry).
    """

    def __init__(self, metrics: GatewayMetrics) -> None:
        self._metrics = metrics
        self._abandoned = 0

    def queue_depth(self, depth: int) -> None:
        """The queue depth gauge."""
        self._metrics.asr_queue_depth.set(depth)

    def batch_started(self, worker: int, size: int, waits_s: Sequence[float]) -> None:
        """Batch sizes, and each item's queue wait."""
        self._metrics.asr_batch_size.observe(size)
        for wait in waits_s:
            self._metrics.asr_queue_wait.observe(wait)

    def items_joined(self, worker: int, waits_s: Sequence[float]) -> None:
        """Queue waits of utterances that joined a running batch (admission reads them)."""
        for wait in waits_s:
            self._metrics.asr_queue_wait.observe(wait)

    def batch_finished(
        self, worker: int, size: int, duration_s: float, error: BaseException | None
    ) -> None:
        """Engine busy time (utilisation = its rate / workers)."""
        self._metrics.asr_busy.inc(duration_s)

    def worker_replaced(self, worker: int, timeout_s: float) -> None:
        """A hung batch: count it and the abandoned thread, and say so in the log."""
        self._abandoned += 1
        self._metrics.asr_batch_timeouts.inc()
        self._metrics.asr_abandoned_threads.set(self._abandoned)
        log.error(
            "asr worker %d: a batch ran past batch_timeout_s=%g; its items failed with "
            "DEADLINE_EXCEEDED and the worker runs on a fresh thread (%d stuck thread(s) "
            "abandoned so far)",
            worker,
            timeout_s,
            self._abandoned,
        )


class AsrTranscriber:
    """The batcher in front of the Whisper engine workers, as sessions see it.

    Interim re-decodes are best effort and must never delay a final: the batcher already
    orders finals first, and here interims may occupy at most ``workers - 1`` workers at once
    (all of them when there is only one, as on a GPU, where they share batches with finals).
    An interim that finds no free slot is skipped, not queued.

    Finals of bulk calls (audio sent faster than real time, ``AsrRequest.bulk``) are served
    from spare capacity: due ``bulk_deadline_s`` after they are queued (so real-time finals,
    due sooner, go first, and a bulk final still never starves), and at most ``workers - 1``
    of them run at once, so a file being transcribed never holds every worker while a
    real-time caller's final waits. They wait for a slot; they are never skipped.

    A final never waits behind an interim of its own utterance (``AsrRequest.utterance``):
    submitting it withdraws that utterance's interims still queued (they fail with
    :class:`~voxgate.gateway.scheduling.WithdrawnError`, which the session takes as "no
    interim"), so none runs before it or shares its batch. One already running finishes on its
    worker; with more than one worker it cannot hold the final, since interims never take the
    last one.
    """

    def __init__(
        self,
        batcher: Batcher[AsrRequest, AsrResult],
        workers: int,
        context_encoder: Callable[[str, Sequence[str]], tuple[int, ...]],
        metrics: GatewayMetrics,
        deadline_s: float = 1.0,
        *,
        default_model: str = "",
        bulk_deadline_s: float = 10.0,
    ) -> None:
        self.batcher = batcher
        self._metrics = metrics
        self._encode_context = context_encoder
        self._deadline_s = deadline_s
        self._bulk_deadline_s = bulk_deadline_s
        self._interim_slots = asyncio.Semaphore(max(1, workers - 1))
        self._bulk_slots = asyncio.Semaphore(max(1, workers - 1))
        self._default_model = default_model

    async def transcribe(self, request: AsrRequest) -> AsrResult:
        """Queue one utterance; finals are due ``deadline_s`` after they are queued.

        Interims share ``workers - 1`` slots (one worker stays free for finals) and yield to
        finals, except an urgent one (a barge-in check): it neither waits for a slot nor behind
        other calls' interims, since the bot talks over the caller until it comes back. A call
        has at most one interim in flight, and a second urgent one only while a worker is idle
        and nothing waits (:meth:`spare_worker`), so urgent ones are bounded by the calls
        talking over a reply.
        """
        if request.is_final and request.bulk:
            async with self._bulk_slots:
                return await self._submit(request)
        if request.is_final or request.urgent:
            return await self._submit(request)
        if self._interim_slots.locked():
            raise CallError.exhausted(
                "interim decode skipped: every interim slot is busy", quota="interim_slots"
            )
        async with self._interim_slots:
            return await self._submit(request)

    def can_speculate(self) -> bool:
        """Speculative finals only run when no other utterance is waiting for a worker."""
        return self.batcher.queue_depth == 0

    def spare_worker(self) -> bool:
        """A worker is idle and no utterance waits (an overlapping barge-in interim's rule)."""
        return self.batcher.queue_depth == 0 and self.batcher.idle_workers > 0

    def encode_context(self, initial_prompt: str, hotwords: Sequence[str]) -> tuple[int, ...]:
        """The engine's previous-text tokens for a call's prompt and hotwords (once per call)."""
        return self._encode_context(initial_prompt, hotwords)

    async def _submit(self, request: AsrRequest) -> AsrResult:
        loop = asyncio.get_running_loop()
        began = loop.time()
        first_rank = request.is_final or request.urgent
        if request.is_final:
            # Before the final is queued: its own interims are stale from now on.
            self.batcher.withdraw(request.utterance)
        if request.is_final and request.bulk:
            deadline = began + self._bulk_deadline_s
        else:
            deadline = began + (self._deadline_s if first_rank else 4 * self._deadline_s)
        # Counted by model name (a replaced model's generations share it).
        model = model_name_of(request.options.model) or self._default_model
        # A turn decoded again as one is neither an utterance's final nor its interim: counted
        # apart, so that final counts and latencies stay one per utterance.
        kind = "turn" if request.whole_turn else "final" if request.is_final else "interim"
        try:
            fut = self.batcher.submit(
                request,
                key=request.batch_key,
                is_final=first_rank,
                deadline=deadline,
                group=None if request.is_final else request.utterance,
            )
        except QueueFullError as exc:
            self._metrics.asr_model_requests.labels(model, kind, "refused").inc()
            raise CallError.exhausted(str(exc), quota="batcher.max_queue_size") from None
        try:
            result = await fut
        except BatchTimeoutError as exc:
            self._metrics.asr_model_requests.labels(model, kind, "failed").inc()
            raise CallError(ErrorKind.DEADLINE_EXCEEDED, str(exc)) from None
        except WithdrawnError:
            self._metrics.asr_model_requests.labels(model, kind, "withdrawn").inc()
            raise
        except asyncio.CancelledError:
            raise
        except Exception:
            self._metrics.asr_model_requests.labels(model, kind, "failed").inc()
            raise
        self._metrics.asr_model_requests.labels(model, kind, "ok").inc()
        for step in result.fallbacks:
            self._metrics.asr_model_fallbacks.labels(model, kind, step).inc()
        self._metrics.asr_model_latency.labels(model, kind).observe(loop.time() - began)
        return result


class ModelRouter:
    """One batcher worker's engine for every model: each batch goes to its model's engine.

    Several models share the process through ONE batcher and its workers, not a batcher per
    model: the model is part of the batch key (``AsrOptions.model``), so a batch never mixes
    models, and the batcher's rules are the same for every model (dispatch at once to an idle
    worker, finals first, earliest deadline first, and a running batch of one model is no
    longer than any other batch). A lone request for a named model therefore waits behind
    another model's batch exactly as it would behind another call's batch of the same model,
    and the CPU is never split into per-model worker pools that would sit idle while another
    model's queue grows (on 2 cores, 2 workers x 1 thread for everything, as for one model).

    Each worker has its own engine object per model (``engine.sibling()``: the same
    CTranslate2 weights, this worker's caches and counters), made the first time the worker
    gets a batch of that model and forgotten once the model leaves memory.

    Args:
        worker: the worker's index (for messages).
        default: this worker's engine of the default model.
        registry: where a routing key's model is found; None routes everything to ``default``.
    """

    def __init__(
        self, worker: int, default: AsrEngine, registry: ModelRegistry | None = None
    ) -> None:
        self.worker = worker
        self.name = default.name
        self._default = default
        self._registry = registry
        self._engines: dict[str, AsrEngine] = {}
        #: The engine of the running step batch (join_running), None between runs.
        self._running: StepAsrEngine | None = None

    def engine_for(self, key: str) -> AsrEngine:
        """This worker's engine for routing key ``key`` ("" = the default model)."""
        registry = self._registry
        if registry is not None and self._engines:
            # Let go of models that left memory (a few dict lookups per batch), so that this
            # worker's engine object does not keep their weights alive.
            for gone in [k for k in self._engines if registry.model(k) is None]:
                del self._engines[gone]
        if not key:
            return self._default
        engine = self._engines.get(key)
        if engine is None:
            model = registry.model(key) if registry is not None else None
            if model is None:  # every call holding it has ended; its request was cancelled
                raise RuntimeError(f"model {model_name_of(key)!r} is no longer loaded")
            engine = model.engine.sibling()
            self._engines[key] = engine
        return engine

    def infer_batch(self, items: Sequence[AsrRequest]) -> list[AsrResult]:
        """Decode ``items`` (one model, as the batch key guarantees) on that model's engine."""
        return self.engine_for(items[0].options.model).infer_batch(items)

    @property
    def continuous(self) -> bool:
        """Whether the default model's engine joins utterances at decode steps."""
        return bool(getattr(self._default, "continuous", False))

    # The step path (batcher.join_running): one running batch per worker, of one model (the
    # batch key), on that model's engine; the driver ends each run with an abort.

    @property
    def capacity(self) -> int:
        """The running model's engine's capacity (the default model's between runs)."""
        return self._stepping(self._running or self._default).capacity

    @property
    def open_count(self) -> int:
        """Requests open in the running batch."""
        return self._running.open_count if self._running is not None else 0

    def has_unfinished(self) -> bool:
        """Whether the running batch has a request not yet returned."""
        return self._running is not None and self._running.has_unfinished()

    def add(self, items: Sequence[tuple[Hashable, AsrRequest]]) -> None:
        """Add to the running batch; the first add of a run picks its model's engine."""
        if not items:
            return
        if self._running is None:
            self._running = self._stepping(self.engine_for(items[0][1].options.model))
        self._running.add(items)

    def step(self) -> list[tuple[Hashable, AsrResult]]:
        """One step of the running batch."""
        return self._running.step() if self._running is not None else []

    def abort(self, keys: Iterable[Hashable]) -> None:
        """Drop requests of the running batch; the run ends once nothing is left."""
        if self._running is None:
            return
        self._running.abort(keys)
        if not self._running.has_unfinished():
            self._running = None

    @staticmethod
    def _stepping(engine: AsrEngine) -> StepAsrEngine:
        if not callable(getattr(engine, "step", None)):
            raise TypeError(f"{engine.name} has no add / step / abort (join_running needs it)")
        return cast(StepAsrEngine, engine)
