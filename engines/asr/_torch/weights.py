"""Whisper's weights as torch tensors, from a CTranslate2 directory or a Hugging Face checkpoint.

The gateway already serves CTranslate2 model directories (``model.bin``); reading them through
the project's one parser (:func:`voxgate.engines.asr._ct2_weights.read_variables`) means the PyTorch
engine runs the very weights the CPU engine runs, and no second model file has to ship. A
Hugging Face checkpoint (``config.json`` plus ``model.safetensors`` or ``pytorch_model.bin``,
as ``transformers`` saves it) is read directly with ``safetensors`` / ``torch.load``, without
importing ``transformers``. Both become one layout, :class:`WhisperTensors`, whose names are
ours: q/k/v of self-attention fused (CTranslate2's layout: one matmul), k/v of cross-attention
fused, the output projection tied to the embeddings.

Quantized CTranslate2 weights (``int8`` files) are dequantized here; the torch engine computes
in float32 on CPU and in float16/bfloat16 on CUDA.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from safetensors.torch import load_file

from voxgate.engines.asr._ct2_weights import WeightFileError, read_variables

__all__ = ["WhisperTensors", "is_hf_checkpoint", "load_tensors"]


@dataclass(slots=True)
class WhisperTensors:
    """One Whisper model's tensors (our names) and the facts the engine needs about it.

    Attributes:
        tensors: name -> tensor; ``enc.*`` / ``dec.*`` (see :func:`_from_ct2`).
        encoder_layers / decoder_layers: layer counts.
        heads: attention heads (encoder and decoder: equal in every Whisper size).
        n_mels: mel bins the encoder takes (80, or 128 for large-v3).
        config: the CTranslate2 ``config.json`` keys the engine reads (``suppress_ids``,
            ``suppress_ids_begin``, ``alignment_heads``, ``lang_ids``), also for a HF
            checkpoint (mapped from its ``generation_config.json``).
    """

    tensors: dict[str, torch.Tensor]
    encoder_layers: int
    decoder_layers: int
    heads: int
    n_mels: int
    config: dict[str, Any]

    @property
    def d_model(self) -> int:
        """Hidden width."""
        return int(self.tensors["dec.emb"].shape[1])

    @property
    def vocab_size(self) -> int:
        """Output vocabulary (51865 multilingual, 51864 English-only, 51866 large-v3)."""
        return int(self.tensors["dec.emb"].shape[0])

    @property
    def is_multilingual(self) -> bool:
        """Whisper's rule: English-only models have a 51864-token vocabulary."""
        return self.vocab_size >= 51865

    def to(self, device: torch.device, dtype: torch.dtype) -> WhisperTensors:
        """The same model with every floating tensor on ``device`` in ``dtype``."""
        moved = {k: v.to(device=device, dtype=dtype) for k, v in self.tensors.items()}
        return WhisperTensors(
            moved, self.encoder_layers, self.decoder_layers, self.heads, self.n_mels, self.config
        )


def is_hf_checkpoint(model_dir: Path) -> bool:
    """A Hugging Face checkpoint directory (no ``model.bin``; weights in safetensors or .bin)."""
    if (model_dir / "model.bin").exists():
        return False
    return (model_dir / "model.safetensors").exists() or (model_dir / "pytorch_model.bin").exists()


def load_tensors(model_dir: Path) -> WhisperTensors:
    """Load the Whisper model in ``model_dir`` (either kind) as float32 CPU tensors.

    Raises:
        WeightFileError: neither a CTranslate2 Whisper directory nor a HF Whisper checkpoint.
    """
    model_dir = Path(model_dir)
    if is_hf_checkpoint(model_dir):
        return _from_hf(model_dir)
    if not (model_dir / "model.bin").exists():
        raise WeightFileError(f"{model_dir}: no model.bin and no Hugging Face weights")
    return _from_ct2(model_dir)


def _f32(a: Any) -> torch.Tensor:
    return torch.from_numpy(np.array(a, dtype=np.float32))


def _from_ct2(model_dir: Path) -> WhisperTensors:
    v = read_variables(model_dir / "model.bin")

    def w(name: str) -> torch.Tensor:
        arr = np.array(v[name], dtype=np.float32)  # a copy: the file's bytes are read-only
        scale = v.get(name + "_scale")
        if scale is not None and np.asarray(v[name]).dtype == np.int8:
            # CTranslate2 int8: one scale per output row; value = q / scale.
            arr = arr / np.asarray(scale, dtype=np.float32).reshape(-1, *([1] * (arr.ndim - 1)))
        return torch.from_numpy(np.ascontiguousarray(arr))

    t: dict[str, torch.Tensor] = {}

    def ln(ours: str, theirs: str) -> None:
        t[ours + ".g"] = w(theirs + "/gamma")
        t[ours + ".b"] = w(theirs + "/beta")

    def lin(ours: str, theirs: str) -> None:
        t[ours + ".w"] = w(theirs + "/weight")
        if theirs + "/bias" in v:
            t[ours + ".b"] = w(theirs + "/bias")

    def self_and_ffn(p: str, q: str) -> None:
        """The self-attention and feed-forward blocks every encoder and decoder layer has."""
        ln(p + ".ln_self", q + "/self_attention/layer_norm")
        lin(p + ".qkv", q + "/self_attention/linear_0")
        lin(p + ".out_self", q + "/self_attention/linear_1")
        ln(p + ".ln_ffn", q + "/ffn/layer_norm")
        lin(p + ".fc1", q + "/ffn/linear_0")
        lin(p + ".fc2", q + "/ffn/linear_1")

    if int(v["decoder/pre_norm"]) != 1 or int(v["decoder/activation"]) != 3:
        raise WeightFileError("only pre-norm decoders with exact GELU are supported (Whisper)")
    for i in (1, 2):
        lin(f"enc.conv{i}", f"encoder/conv{i}")
    t["enc.pos"] = w("encoder/position_encodings/encodings")
    ne = 0
    while f"encoder/layer_{ne}/self_attention/linear_0/weight" in v:
        self_and_ffn(f"enc.{ne}", f"encoder/layer_{ne}")
        ne += 1
    ln("enc.ln", "encoder/layer_norm")
    t["dec.emb"] = w("decoder/embeddings/weight")
    t["dec.pos"] = w("decoder/position_encodings/encodings")
    nd = 0
    while f"decoder/layer_{nd}/self_attention/linear_0/weight" in v:
        p, q = f"dec.{nd}", f"decoder/layer_{nd}"
        self_and_ffn(p, q)
        ln(p + ".ln_cross", q + "/attention/layer_norm")
        lin(p + ".q_cross", q + "/attention/linear_0")
        lin(p + ".kv_cross", q + "/attention/linear_1")
        lin(p + ".out_cross", q + "/attention/linear_2")
        nd += 1
    ln("dec.ln", "decoder/layer_norm")
    config: dict[str, Any] = {}
    if (model_dir / "config.json").exists():
        config = json.loads((model_dir / "config.json").read_text())
    heads = int(v["decoder/num_heads"])
    if int(v["encoder/num_heads"]) != heads:
        raise WeightFileError("encoder and decoder head counts differ (not a Whisper model)")
    n_mels = int(t["enc.conv1.w"].shape[1])
    return WhisperTensors(t, ne, nd, heads, n_mels, config)


def _read_hf_state(model_dir: Path) -> dict[str, torch.Tensor]:
    if (model_dir / "model.safetensors").exists():
        return dict(load_file(str(model_dir / "model.safetensors")))
    state = torch.load(model_dir / "pytorch_model.bin", map_location="cpu", weights_only=True)
    return {str(k): v for k, v in state.items()}


def _from_hf(model_dir: Path) -> WhisperTensors:
    cfg = json.loads((model_dir / "config.json").read_text())
    if cfg.get("model_type") != "whisper":
        raise WeightFileError(f"{model_dir}: model_type {cfg.get('model_type')!r} is not whisper")
    state = {
        k.removeprefix("model."): v.to(torch.float32) for k, v in _read_hf_state(model_dir).items()
    }
    d = int(cfg["d_model"])
    t: dict[str, torch.Tensor] = {}

    def lin(ours: str, theirs: str) -> None:
        t[ours + ".w"] = state[theirs + ".weight"]
        if theirs + ".bias" in state:
            t[ours + ".b"] = state[theirs + ".bias"]

    def ln(ours: str, theirs: str) -> None:
        t[ours + ".g"] = state[theirs + ".weight"]
        t[ours + ".b"] = state[theirs + ".bias"]

    def qkv(ours: str, theirs: str) -> None:
        # Whisper's k projection has no bias; CTranslate2's fused layout carries a zero one.
        zero = torch.zeros(d)
        t[ours + ".w"] = torch.cat([state[f"{theirs}.{x}_proj.weight"] for x in "qkv"])
        t[ours + ".b"] = torch.cat(
            [state[f"{theirs}.q_proj.bias"], zero, state[f"{theirs}.v_proj.bias"]]
        )

    lin("enc.conv1", "encoder.conv1")
    lin("enc.conv2", "encoder.conv2")
    t["enc.pos"] = state["encoder.embed_positions.weight"]
    ne, nd = int(cfg["encoder_layers"]), int(cfg["decoder_layers"])
    for i in range(ne):
        p, q = f"enc.{i}", f"encoder.layers.{i}"
        ln(p + ".ln_self", q + ".self_attn_layer_norm")
        qkv(p + ".qkv", q + ".self_attn")
        lin(p + ".out_self", q + ".self_attn.out_proj")
        ln(p + ".ln_ffn", q + ".final_layer_norm")
        lin(p + ".fc1", q + ".fc1")
        lin(p + ".fc2", q + ".fc2")
    ln("enc.ln", "encoder.layer_norm")
    t["dec.emb"] = state["decoder.embed_tokens.weight"]
    t["dec.pos"] = state["decoder.embed_positions.weight"]
    for i in range(nd):
        p, q = f"dec.{i}", f"decoder.layers.{i}"
        ln(p + ".ln_self", q + ".self_attn_layer_norm")
        qkv(p + ".qkv", q + ".self_attn")
        lin(p + ".out_self", q + ".self_attn.out_proj")
        ln(p + ".ln_cross", q + ".encoder_attn_layer_norm")
        lin(p + ".q_cross", q + ".encoder_attn.q_proj")
        t[p + ".kv_cross.w"] = torch.cat(
            [state[q + ".encoder_attn.k_proj.weight"], state[q + ".encoder_attn.v_proj.weight"]]
        )
        t[p + ".kv_cross.b"] = torch.cat([torch.zeros(d), state[q + ".encoder_attn.v_proj.bias"]])
        lin(p + ".out_cross", q + ".encoder_attn.out_proj")
        ln(p + ".ln_ffn", q + ".final_layer_norm")
        lin(p + ".fc1", q + ".fc1")
        lin(p + ".fc2", q + ".fc2")
    ln("dec.ln", "decoder.layer_norm")
    heads = int(cfg["decoder_attention_heads"])
    if int(cfg["encoder_attention_heads"]) != heads:
        raise WeightFileError("encoder and decoder head counts differ (not supported)")
    gen: dict[str, Any] = {}
    if (model_dir / "generation_config.json").exists():
        gen = json.loads((model_dir / "generation_config.json").read_text())
    config: dict[str, Any] = {
        "suppress_ids": list(gen.get("suppress_tokens") or cfg.get("suppress_tokens") or []),
        "suppress_ids_begin": list(
            gen.get("begin_suppress_tokens") or cfg.get("begin_suppress_tokens") or []
        ),
        "alignment_heads": list(gen.get("alignment_heads") or []),
        "lang_ids": sorted(int(i) for i in (gen.get("lang_to_id") or {}).values()),
    }
    return WhisperTensors(t, ne, nd, heads, int(cfg["num_mel_bins"]), config)
