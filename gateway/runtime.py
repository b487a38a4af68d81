"""The production engine hub: loads the configured engines and adapts them for sessions.

Engines are synchronous classes (``engines/``); this module owns their threads. Recognition goes
through the cross-call :class:`~gateway.batcher.Batcher` (one or more engine workers), and speech
synthesis through a small pool of threads that each advance one reply's generator a window at a
time, so that no model work ever runs on the event loop.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Literal

from engines.asr import BUNDLED_MODELS, ModelFilesError, WhisperEngine, resolve_model_dir
from engines.asr.base import AsrEngine, AsrRequest, AsrResult
from engines.tts import (
    SpeakOptions,
    TtsChunk,
    TtsEngine,
    TtsError,
    TtsInputError,
    VitsStreamer,
    resolve_voice,
)
from engines.tts._scheduler import default_synth_plan
from gateway.base import (
    EngineInfo,
    ModelDescription,
    Synthesizer,
    Transcriber,
    TtsPiece,
    VoiceDescription,
)
from gateway.batcher import (
    BatchEngine,
    Batcher,
    BatchObserver,
    BatchPlan,
    BatchPolicy,
    BatchTimeoutError,
    QueueFullError,
    default_plan,
)
from gateway.config import GatewayConfig
from gateway.errors import CallError, ErrorKind
from gateway.events import SpeakIn
from gateway.metrics import GatewayMetrics
from gateway.synthesis import ReplyStats, SynthesisScheduler, policy_for

__all__ = [
    "AsrTranscriber",
    "BatchMetrics",
    "EngineHubImpl",
    "EngineLoadError",
    "TtsSynthesizer",
    "build_hub",
]

log = logging.getLogger("voxgate.runtime")

_END = object()


class EngineLoadError(RuntimeError):
    """A configured model or voice cannot be loaded; the message names the setting and why."""


class TtsSynthesizer:
    """The VITS streamer as sessions see it: an async stream of audio pieces per Speak.

    Two ways to run the replies, chosen by ``scheduling``:

    * ``deadline`` (the default): :class:`~gateway.synthesis.SynthesisScheduler` runs every
      reply's front-end runs and decoder windows on ``threads`` workers, earliest playout
      deadline first, first audio ahead of everything, window sizes from each reply's slack;
    * ``fifo``: the earlier design, kept for comparison (``benchmarks/tts_concurrency.py``):
      a plain thread pool that advances each reply's fixed-schedule generator a window at a
      time, in the order the ``next()`` calls arrive.

    Args:
        streamer: a loaded, warmed voice engine (thread-safe across streams).
        threads: engine worker threads.
        metrics: where first audio, streams, slack, lateness and batches are counted.
        scheduling: ``deadline`` or ``fifo`` (see above).
        max_batch_size: decoder windows per ONNX Runtime call under ``deadline``.
    """

    def __init__(
        self,
        streamer: TtsEngine,
        threads: int,
        metrics: GatewayMetrics,
        *,
        scheduling: Literal["deadline", "fifo"] = "deadline",
        max_batch_size: int = 1,
    ) -> None:
        self.streamer = streamer
        self._metrics = metrics
        self.sample_rate_hz = streamer.sample_rate_hz
        self.max_text_chars = streamer.max_text_chars
        self._window_frames = int(getattr(getattr(streamer, "config", None), "window_frames", 96))
        self.scheduler: SynthesisScheduler | None = None
        self._pool: ThreadPoolExecutor | None = None
        if scheduling == "deadline":
            if not isinstance(streamer, VitsStreamer):
                raise TypeError("deadline scheduling needs a VitsStreamer (open/decode_windows)")
            policy = policy_for(streamer, max_batch_size)
            self.scheduler = SynthesisScheduler(streamer, threads, policy, metrics)
        else:
            self._pool = ThreadPoolExecutor(max_workers=threads, thread_name_prefix="tts")
        metrics.engine_workers.labels("tts").set(threads)

    def _options(self, speak: SpeakIn) -> SpeakOptions:
        return SpeakOptions(
            length_scale=1.0 / speak.rate if speak.rate else None,
            speaker_id=speak.speaker_id or None,
            voice=speak.voice or None,
            # The degradation ladder's tts_window step (gateway/degrade.py), for the fifo
            # pool; the deadline scheduler sizes windows from slack, up to this size anyway.
            window_frames=2 * self._window_frames if speak.degraded else None,
        )

    async def stream(
        self, speak: SpeakIn, stats: ReplyStats | None = None
    ) -> AsyncIterator[TtsPiece]:
        """Synthesize ``speak``, window by window, on the engine threads.

        ``stats`` (deadline scheduling only) receives what the caller's player experiences.
        """
        options = self._options(speak)
        t0 = time.perf_counter()
        chunks = (
            self._scheduled(speak.text, options, stats)
            if self.scheduler
            else self._fifo(speak.text, options)
        )
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
        self, text: str, options: SpeakOptions, stats: ReplyStats | None
    ) -> AsyncGenerator[TtsChunk]:
        assert self.scheduler is not None
        async for chunk in self.scheduler.stream(text, options, stats):
            yield chunk

    async def _fifo(self, text: str, options: SpeakOptions) -> AsyncGenerator[TtsChunk]:
        """The earlier pool: each ``next()`` of the reply's generator on a TTS thread."""
        assert self._pool is not None
        loop = asyncio.get_running_loop()
        it = await loop.run_in_executor(self._pool, self.streamer.stream, text, options)
        while True:
            chunk = await loop.run_in_executor(self._pool, next, it, _END)
            if chunk is _END:
                return
            assert isinstance(chunk, TtsChunk)
            yield chunk

    async def aclose(self) -> None:
        """Stop the threads (after the server stopped calling)."""
        if self.scheduler is not None:
            await self.scheduler.aclose()
        if self._pool is not None:
            await asyncio.to_thread(self._pool.shutdown, wait=True, cancel_futures=True)


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
    """

    def __init__(
        self,
        batcher: Batcher[AsrRequest, AsrResult],
        workers: int,
        context_encoder: Callable[[str, Sequence[str]], tuple[int, ...]],
        metrics: GatewayMetrics,
        deadline_s: float = 1.0,
    ) -> None:
        self.batcher = batcher
        self._metrics = metrics
        self._encode_context = context_encoder
        self._deadline_s = deadline_s
        self._interim_slots = asyncio.Semaphore(max(1, workers - 1))

    async def transcribe(self, request: AsrRequest) -> AsrResult:
        """Queue one utterance; finals are due ``deadline_s`` after they are queued."""
        if request.is_final:
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

    def encode_context(self, initial_prompt: str, hotwords: Sequence[str]) -> tuple[int, ...]:
        """The engine's previous-text tokens for a call's prompt and hotwords (once per call)."""
        return self._encode_context(initial_prompt, hotwords)

    async def _submit(self, request: AsrRequest) -> AsrResult:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + (self._deadline_s if request.is_final else 4 * self._deadline_s)
        try:
            fut = self.batcher.submit(
                request, key=request.batch_key, is_final=request.is_final, deadline=deadline
            )
        except QueueFullError as exc:
            raise CallError.exhausted(str(exc), quota="batcher.max_queue_size") from None
        try:
            result = await fut
        except BatchTimeoutError as exc:
            raise CallError(ErrorKind.DEADLINE_EXCEEDED, str(exc)) from None
        if request.is_final:  # interim re-decodes are not utterances
            self._metrics.utterances.labels(result.dropped_reason or "text").inc()
        return result


class EngineHubImpl:
    """Loads, warms and closes the engines named by ``config.engines``."""

    def __init__(self, config: GatewayConfig) -> None:
        self.config = config
        self.transcriber: Transcriber | None = None
        self.synthesizer: Synthesizer | None = None
        self._batcher: Batcher[AsrRequest, AsrResult] | None = None
        self._tts: TtsSynthesizer | None = None
        self.info = EngineInfo()
        self._asr_engines: list[AsrEngine] = []
        self._asr_plan_used: BatchPlan | None = None
        self._streamer: TtsEngine | None = None
        self._metrics = GatewayMetrics()  # replaced by the server's in start()

    async def start(self, metrics: GatewayMetrics) -> None:
        """Check the model files, load and warm both engines in parallel, start the batcher.

        Raises:
            EngineLoadError: a model or voice is missing or unusable (one sentence, no
                traceback needed); nothing is left loaded.
        """
        self._metrics = metrics
        names = self.config.engines
        self._check_files(names)
        jobs = []
        if "tts" in names:
            jobs.append(asyncio.to_thread(self._load_tts))
        if "asr" in names:
            jobs.append(asyncio.to_thread(self._load_asr))
        try:
            await asyncio.gather(*jobs)
        except (ModelFilesError, TtsError, OSError) as exc:
            await self.aclose()
            raise EngineLoadError(f"cannot load the engines: {exc}") from exc
        if self._asr_engines:
            await self._start_batcher()

    def _check_files(self, names: frozenset[str]) -> None:
        """Find every configured model file before loading anything.

        A wrong ``--model`` used to fail only after the voice had loaded, with a traceback.
        """
        try:
            if "asr" in names and self.config.asr.model not in BUNDLED_MODELS:
                resolve_model_dir(self.config.asr.model)
            if "tts" in names:
                resolve_voice(self.config.tts.voice)
        except ModelFilesError as exc:
            raise EngineLoadError(f"asr.model: {exc}") from None
        except FileNotFoundError as exc:
            raise EngineLoadError(f"tts.voice: {exc}") from None

    def _load_tts(self) -> None:
        scfg = self.config.session
        streamer = VitsStreamer.load(self.config.tts)
        streamer.warmup()
        # Workers and batch size by device, as measured (engines/tts/_scheduler.py).
        workers, batch = default_synth_plan(streamer.device, os.cpu_count() or 1)
        threads = scfg.tts_threads or workers
        self._streamer = streamer
        self._tts = TtsSynthesizer(
            streamer,
            threads,
            self._metrics,
            scheduling=scfg.tts_scheduling,
            max_batch_size=scfg.tts_max_batch_size or batch,
        )
        log.info(
            "tts: %s scheduling, %d worker(s), up to %d window(s) per decoder call on %s",
            scfg.tts_scheduling,
            threads,
            scfg.tts_max_batch_size or batch,
            streamer.device,
        )
        self.synthesizer = self._tts
        self.info.voices = [
            VoiceDescription(
                name=v.name,
                language=v.language,
                sample_rate_hz=v.sample_rate_hz,
                num_speakers=v.num_speakers,
                license_note=getattr(v, "license_note", ""),
            )
            for v in streamer.voices()
        ]

    def _asr_plan(self, device: str) -> BatchPlan:
        """Workers and batch size: the batcher config where set, else the device's default."""
        bcfg = self.config.batcher
        plan = default_plan("cuda" if device == "cuda" else "cpu", cpu_cores=os.cpu_count() or 1)
        return BatchPlan(
            max_batch_size=bcfg.max_batch_size or plan.max_batch_size,
            workers=bcfg.workers or plan.workers,
        )

    def _load_asr(self) -> None:

        cfg = self.config.asr
        plan = self._asr_plan(cfg.device)
        thread_keys = {"inter_threads", "intra_threads", "cpu_threads"}
        if cfg.device == "cpu" and not thread_keys & cfg.model_fields_set:
            # One CTranslate2 replica per batcher worker, the cores split between them: with a
            # single replica the workers queue behind each other inside CTranslate2. Measured on
            # 2 cores (benchmarks/asr_capacity.py --tune, 8 queued utterances, 2 workers, batch
            # 2): inter 2 x intra 1 did 5.2 utt/s, inter 1 x intra 0 (the engine default) 3.6.
            cores = os.cpu_count() or 1
            cfg = cfg.model_copy(
                update={
                    "inter_threads": plan.workers,
                    "intra_threads": max(1, cores // plan.workers),
                }
            )
        engine = WhisperEngine.load(cfg)
        engine.warmup()
        # One engine object per worker over the one CTranslate2 model (see WhisperEngine.sibling).
        workers: list[AsrEngine] = [engine, *(engine.sibling() for _ in range(plan.workers - 1))]
        self._asr_engines = workers
        self._asr_plan_used = plan
        log.info(
            "asr engine: %s on %s, CTranslate2 inter_threads=%d intra_threads=%d",
            engine.name,
            cfg.device,
            cfg.inter_threads,
            cfg.resolved_intra_threads,
        )
        self.info.models = [
            ModelDescription(
                name=engine.name,
                family="whisper",
                languages=engine.languages,
                device=cfg.device,
                compute_type=str(getattr(engine, "compute_type", "")),
            )
        ]

    async def _start_batcher(self) -> None:
        bcfg = self.config.batcher
        plan = self._asr_plan_used
        assert plan is not None and len(self._asr_engines) == plan.workers
        workers, batch = plan.workers, plan.max_batch_size
        engines: list[BatchEngine[AsrRequest, AsrResult]] = list(self._asr_engines)
        policy = BatchPolicy(
            max_batch_size=batch, max_wait_ms=bcfg.max_wait_ms, max_queue_size=bcfg.max_queue_size
        )
        first = self._asr_engines[0]
        batcher: Batcher[AsrRequest, AsrResult] = Batcher(
            engines,
            policy,
            observer=BatchMetrics(self._metrics),
            name="asr",
            batch_timeout_s=bcfg.batch_timeout_s or None,
            # A hung worker gets a fresh engine object over the same model on a fresh thread.
            replace=lambda _worker: first.sibling(),
            # The config allows it only with the decode loop on (GatewayConfig checks).
            join_running=bcfg.join_running,
        )
        self._metrics.engine_workers.labels("asr").set(workers)
        await batcher.start()
        self._batcher = batcher
        self.transcriber = AsrTranscriber(
            batcher, workers, self._asr_engines[0].encode_context, self._metrics
        )
        log.info(
            "asr batcher: %d worker(s), max batch %d%s",
            workers,
            batch,
            ", utterances join running batches" if bcfg.join_running else "",
        )

    async def aclose(self) -> None:
        """Stop the batcher, then close the engines."""
        if self._batcher is not None:
            await self._batcher.aclose()
        if self._tts is not None:
            await self._tts.aclose()
        for engine in self._asr_engines[:1]:
            await asyncio.to_thread(engine.close)
        if self._streamer is not None:
            await asyncio.to_thread(self._streamer.close)


def build_hub(config: GatewayConfig) -> EngineHubImpl | None:
    """The engines named by ``config.engines``; None for a VAD-only server."""
    if not config.engines:
        return None
    return EngineHubImpl(config)
