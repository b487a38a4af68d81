"""The production engine hub: loads the configured engines and adapts them for sessions.

Engines are synchronous classes (``engines/``); this module owns their threads. Recognition goes
through the cross-call :class:`~voxgate.gateway.scheduling.Batcher` (one or more engine
workers), and speech synthesis through a small pool of threads that each advance one reply's
generator a window at a time, so that no model work ever runs on the event loop.
"""

from __future__ import annotations

import asyncio
import logging
import math
import os
import time
import wave
from collections.abc import Callable
from pathlib import Path

import numpy as np
import numpy.typing as npt

from voxgate.engines.asr import (
    BUNDLED_MODELS,
    ModelFilesError,
    WhisperConfig,
    WhisperEngine,
    load_asr_engine,
    resolve_model_dir,
)
from voxgate.engines.asr.base import AsrEngine, AsrOptions, AsrRequest, AsrResult
from voxgate.engines.base import ASR_SAMPLE_RATE_HZ, UtteranceStats
from voxgate.engines.tts import (
    SpeakOptions,
    TtsEngine,
    TtsError,
    VitsStreamer,
    resolve_voice,
)
from voxgate.gateway.base import (
    EngineInfo,
    ModelDescription,
    Synthesizer,
    Transcriber,
    VoiceDescription,
)
from voxgate.gateway.config import GatewayConfig
from voxgate.gateway.errors import CallError
from voxgate.gateway.metrics import GatewayMetrics
from voxgate.gateway.models import (
    BARGE_IN_KEY,
    LoadedModel,
    ModelEntry,
    ModelRegistry,
)
from voxgate.gateway.priority import call_lowered, limit_blas_threads
from voxgate.gateway.runtime._adapters import (
    AsrTranscriber,
    BatchMetrics,
    ModelRouter,
    TtsSynthesizer,
)
from voxgate.gateway.scheduling import (
    BatchEngine,
    Batcher,
    BatchPlan,
    BatchPolicy,
    default_plan,
)
from voxgate.gateway.scheduling.synthesis_policy import default_synth_plan

__all__ = ["EngineHubImpl", "EngineLoadError", "build_hub", "read_reference_utterance"]

log = logging.getLogger("voxgate.runtime")


class EngineLoadError(RuntimeError):
    """A configured model or voice cannot be loaded; the message names the setting and why."""


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
        #: The default model and the named ones of ``asr.models_dir`` (None without ASR).
        self.models: ModelRegistry | None = None
        self._asr_cfg_used = config.asr
        self._gauged: set[str] = set()

    async def start(self, metrics: GatewayMetrics) -> None:
        """Check the model files, load and warm both engines in parallel, start the batcher.

        Raises:
            EngineLoadError: a model or voice is missing or unusable (one sentence, no
                traceback needed); nothing is left loaded.
        """
        self._metrics = metrics
        names = self.config.engines
        self._check_files(names)
        blas = self.config.batcher.numpy_blas_threads
        was = limit_blas_threads(blas)
        if was is not None and was != blas:
            log.info("numpy BLAS: %d thread(s), was %d (batcher.numpy_blas_threads)", blas, was)
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
            if self.config.admission.enabled and not self.config.admission.capacity_calls:
                # After both engines loaded: the voice's warm-up must not share the cores.
                self.info.asr_capacity_calls = await asyncio.to_thread(self._calibrate)
            await self._start_models()
            await self._start_batcher()

    def _check_files(self, names: frozenset[str]) -> None:
        """Find every configured model file before loading anything.

        A wrong ``--model`` used to fail only after the voice had loaded, with a traceback.
        """
        asr = self.config.asr
        setting = "asr.model"
        try:
            if "asr" in names and asr.model not in BUNDLED_MODELS:
                resolve_model_dir(asr.model)
            setting = "asr.barge_in_model"
            if "asr" in names and asr.barge_in_model is not None:
                resolve_model_dir(asr.barge_in_model)
            if "tts" in names:
                resolve_voice(self.config.tts.voice)
        except ModelFilesError as exc:
            raise EngineLoadError(f"{setting}: {exc}") from None
        except FileNotFoundError as exc:
            raise EngineLoadError(f"tts.voice: {exc}") from None

    def _load_tts(self) -> None:
        scfg = self.config.session
        streamer = VitsStreamer.load(self.config.tts)
        streamer.warmup()
        # Workers and batch size by device, as measured (gateway/scheduling/synthesis_policy.py).
        workers, batch = default_synth_plan(streamer.device, os.cpu_count() or 1)
        threads = scfg.tts_threads or workers
        self._streamer = streamer
        self._tts = TtsSynthesizer(
            streamer,
            threads,
            self._metrics,
            max_batch_size=scfg.tts_max_batch_size or batch,
            nice=scfg.tts_nice,
            max_lead_s=scfg.tts_max_lead_ms / 1000.0 if scfg.tts_max_lead_ms else math.inf,
        )
        log.info(
            "tts: deadline scheduling, %d worker(s), up to %d window(s) per decoder call on %s",
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
        # One batch size (batcher.max_batch_size or the plan's): the engine chunks and joins
        # up to what the scheduler hands it.
        cfg = cfg.model_copy(update={"max_batch_size": plan.max_batch_size})
        self._asr_cfg_used = cfg
        # Loaded on a thread below the loop's CPU priority: CTranslate2's worker threads,
        # started here, inherit it (batcher.engine_nice; gateway/priority.py).
        engine = call_lowered(self.config.batcher.engine_nice, _load_whisper, cfg)
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

    def _calibrate(self) -> int:
        """Real-time calls this replica holds, from the engines' measured cost of one turn.

        Admission needs a capacity before any caller has been measured (an idle replica must
        know when to stop admitting a burst). A real-time call is modelled as one turn every
        ``admission.reference_turn_s``: the caller speaks the bundled 5.3 s reference
        utterance (its final decode, times ``reference_overhead`` for speculation, interims
        and barge-in checks) and, when this server has a voice on the same CPU, the bot
        answers with a reference reply. Each is timed twice on one worker and the faster run
        counts (the first may still warm caches). The replica holds the calls whose cost fills
        ``target_utilisation`` of its recogniser workers. Live traffic re-prices it
        (gateway/admission.py).

        Work on the CPU costs the CPU time it used where that is less than the wall-clock time
        (:func:`_fastest_of_two`): a replica started on a busy machine (another process, a test
        beside it) waits for the cores, and its wall clock priced the reference decode at
        8.3 s where it used 0.54 s of CPU (0.50-0.56 s on an idle machine), so the replica
        held "about 1 real-time call" and refused the second caller until live traffic had
        re-priced it. On a GPU the wall clock stays the cost.
        """
        adm = self.config.admission
        engine = self._asr_engines[0]
        audio = read_reference_utterance()
        voiced = np.abs(audio.reshape(-1, 320)).max(axis=1) > 0.01
        stats = UtteranceStats.from_frames(audio, voiced, 20)
        request = AsrRequest(audio, stats, AsrOptions(), is_final=True)
        asr_on_cpu = self.config.asr.device == "cpu"
        asr_s = _fastest_of_two(
            lambda _: engine.infer_batch([request]),
            cpu_clock=time.process_time if asr_on_cpu else None,
        )
        counters = getattr(engine, "counters", None)
        if counters is not None:
            counters.reset()
        tts_s = 0.0
        streamer = self._streamer
        on_cpu = getattr(streamer, "device", "cpu") == "cpu" and self.config.asr.device == "cpu"
        if streamer is not None and on_cpu:
            # Two texts: the second run of one text would be a phrase-cache hit.
            tts_s = _fastest_of_two(
                lambda i: list(streamer.stream(REFERENCE_REPLIES[i], SpeakOptions())),
                cpu_clock=time.process_time,
            )
        per_call = (asr_s * adm.reference_overhead + tts_s) / adm.reference_turn_s
        workers = len(self._asr_engines)
        capacity = max(1, int(workers * adm.target_utilisation / per_call))
        log.info(
            "admission: a reference turn costs %.0f ms of recognition and %.0f ms of synthesis; "
            "%d worker(s) hold about %d real-time calls at target_utilisation=%g",
            1000 * asr_s,
            1000 * tts_s,
            workers,
            capacity,
            adm.target_utilisation,
        )
        return capacity

    def _load_named(self, entry: ModelEntry) -> LoadedModel:
        """Load a named model with the default model's settings (threads, device, policy)."""
        return self._load_model(entry.name, str(entry.path))

    def _load_model(self, name: str, model: str) -> LoadedModel:
        """Load ``model`` (a bundled name or a directory) with the default model's settings.

        The same CTranslate2 thread split as the default: the batcher's workers take turns
        over every model, so each model's replica needs as many CTranslate2 workers.
        """
        cfg = self._asr_cfg_used.model_copy(update={"model": model, "barge_in_model": None})
        engine = call_lowered(self.config.batcher.engine_nice, _load_whisper, cfg)
        return LoadedModel(
            name=name,
            description=ModelDescription(
                name=name,
                family="whisper",
                languages=engine.languages,
                device=cfg.device,
                compute_type=str(getattr(engine, "compute_type", "")),
            ),
            engine=engine,
        )

    def _models_changed(self) -> None:
        registry = self.models
        if registry is None:
            return
        self.info.models = registry.descriptions()
        gauge = self._metrics.asr_model_loaded
        for desc in self.info.models:
            gauge.labels(desc.name).set(1 if desc.loaded else 0)
        offered = {d.name for d in self.info.models}
        for name in self._gauged - offered:
            gauge.labels(name).set(0)
        self._gauged |= offered

    async def _start_models(self) -> None:
        """The model registry: scan ``asr.models_dir`` and load ``asr.load_on_start``.

        Raises:
            EngineLoadError: a ``load_on_start`` model is not offered or fails to load.
        """
        cfg = self.config.asr
        default = self._asr_engines[0]
        barge_in = None
        if cfg.barge_in_model is not None:
            try:
                barge_in = await asyncio.to_thread(
                    self._load_model, BARGE_IN_KEY, cfg.barge_in_model
                )
            except (ModelFilesError, OSError, RuntimeError) as exc:
                await self.aclose()
                raise EngineLoadError(f"asr.barge_in_model: {exc}") from exc
            log.info("barge-in model: %s", barge_in.engine.name)
        self.models = ModelRegistry(
            LoadedModel(name=default.name, description=self.info.models[0], engine=default),
            _models_root(cfg.models_dir),
            self._load_named,
            on_change=self._models_changed,
            on_load=self._count_load,
            barge_in=barge_in,
        )
        await self.models.rescan()
        self._models_changed()
        try:
            await self.models.load_names(cfg.load_on_start)
        except CallError as exc:
            await self.aclose()
            raise EngineLoadError(
                f"asr.load_on_start names a model that cannot be served: {exc.message}"
            ) from None

    def _count_load(self, name: str, outcome: str) -> None:
        self._metrics.asr_model_loads.labels(name, outcome).inc()

    async def rescan_models(self) -> None:
        """Read ``asr.models_dir`` again (SIGHUP): new models offered, removed ones retired."""
        if self.models is not None and self.models.root is not None:
            await self.models.rescan()

    async def _start_batcher(self) -> None:
        bcfg = self.config.batcher
        plan = self._asr_plan_used
        assert plan is not None and len(self._asr_engines) == plan.workers
        workers, batch = plan.workers, plan.max_batch_size
        registry = self.models
        engines: list[BatchEngine[AsrRequest, AsrResult]] = [
            ModelRouter(i, engine, registry) for i, engine in enumerate(self._asr_engines)
        ]
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
            # A hung worker gets fresh engine objects over the same models on a fresh thread.
            replace=lambda worker: ModelRouter(worker, first.sibling(), registry),
            # The config allows it only with the decode loop on (GatewayConfig checks).
            join_running=bcfg.join_running,
        )
        self._metrics.engine_workers.labels("asr").set(workers)
        await batcher.start()
        self._batcher = batcher
        self.transcriber = AsrTranscriber(
            batcher,
            workers,
            self._asr_engines[0].encode_context,
            self._metrics,
            default_model=first.name,
            bulk_deadline_s=self.config.admission.bulk_deadline_s,
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
        if self.models is not None:
            await self.models.aclose()
        for engine in self._asr_engines[:1]:
            await asyncio.to_thread(engine.close)
        if self._streamer is not None:
            await asyncio.to_thread(self._streamer.close)


def _load_whisper(cfg: WhisperConfig) -> WhisperEngine:
    """Load and warm the Whisper engine ``asr.engine`` names (closed if the warm-up fails)."""
    engine = load_asr_engine(cfg)
    try:
        engine.warmup()
    except BaseException:
        engine.close()
        raise
    return engine


def _models_root(models_dir: str | None) -> Path | None:
    """``asr.models_dir`` as a path (``~`` expanded), None when it is not set."""
    return Path(models_dir).expanduser() if models_dir else None


def build_hub(config: GatewayConfig) -> EngineHubImpl | None:
    """The engines named by ``config.engines``; None for a VAD-only server."""
    if not config.engines:
        return None
    return EngineHubImpl(config)


#: The bot's side of the calibration's reference turn (about 2.5 s of speech each).
REFERENCE_REPLIES = (
    "Thanks. Let me check that for you right now.",
    "Sure. Let me look that up for you right away.",
)


def _fastest_of_two(
    work: Callable[[int], object],
    *,
    cpu_clock: Callable[[], float] | None = None,
    wall_clock: Callable[[], float] = time.perf_counter,
) -> float:
    """Seconds the faster of two runs of ``work`` (given the run's index) cost.

    A run costs its wall-clock time, or with ``cpu_clock`` (the process's CPU time, for work
    on the CPU) the smaller of that and the CPU time it used: waiting for cores that other
    processes hold stretches the wall clock but uses no CPU, and work spread over several
    threads uses more CPU than wall clock. Either way the smaller is what the work costs on a
    machine of its own.
    """
    costs = []
    for i in range(2):
        began, used = wall_clock(), cpu_clock() if cpu_clock is not None else 0.0
        work(i)
        cost = wall_clock() - began
        if cpu_clock is not None:
            cost = min(cost, cpu_clock() - used)
        costs.append(cost)
    return min(costs)


def read_reference_utterance() -> npt.NDArray[np.float32]:
    """The bundled calibration utterance (gateway/data/ATTRIBUTION.md), float32 at 16 kHz."""
    path = Path(__file__).parent.parent / "data" / "reference_utterance.wav"
    with wave.open(str(path), "rb") as w:
        assert w.getframerate() == ASR_SAMPLE_RATE_HZ and w.getsampwidth() == 2
        pcm = np.frombuffer(w.readframes(w.getnframes()), dtype="<i2")
    return (pcm.astype(np.float32) / 32768.0)[: len(pcm) // 320 * 320]
