"""CTranslate2 Whisper <-> ``transformers`` Whisper, exactly, so a served model can be fine-tuned.

No Hugging Face-format Whisper checkpoint ships with voxgate: the model a call is served by is
the CTranslate2 ``model.bin``. Its layout maps one to one onto ``WhisperForConditionalGeneration``
(q/k/v are fused with a zero k bias, ``decoder/projection/weight`` aliases the embeddings), so
training starts from the very weights the gateway serves, and the merged result goes back
through ``ctranslate2.specs.WhisperSpec`` filled from NumPy. Both directions are torch-free; only
:func:`hf_model` imports torch and transformers, lazily. The unmodified base makes the round trip
bit for bit (``tests/test_adapt_convert.py``), and the original ``config.json`` (language ids,
alignment heads, suppressed tokens), ``tokenizer.json`` and ``vocabulary.txt`` are carried over:
CTranslate2's own Transformers converter would write empty language ids and default alignment
heads, which breaks language detection and word times.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from voxgate.engines.asr._ct2_weights import WeightFileError, read_variables

__all__ = [
    "BaseModel",
    "WhisperDims",
    "build_spec",
    "hf_config_kwargs",
    "hf_model",
    "read_base",
    "state_dict_of",
    "write_ct2_dir",
]

F32 = npt.NDArray[np.float32]
#: Files copied verbatim from the base directory into every written model.
CARRIED_FILES = ("config.json", "tokenizer.json", "vocabulary.txt", "preprocessor_config.json")


@dataclass(frozen=True, slots=True)
class WhisperDims:
    """The shape of a Whisper model, read from its weights (names as in ``transformers``)."""

    num_mel_bins: int
    d_model: int
    encoder_layers: int
    decoder_layers: int
    encoder_heads: int
    decoder_heads: int
    ffn_dim: int
    vocab_size: int
    max_source_positions: int
    max_target_positions: int


@dataclass(frozen=True, slots=True)
class BaseModel:
    """A CTranslate2 Whisper model read into ``transformers`` parameter names.

    Attributes:
        model_dir: the CTranslate2 directory it came from (its small files are carried over).
        dims: the model's shape.
        state: ``transformers`` name -> float32 array (exact: float16 widens without loss).
        dtype: the stored weight dtype, which a written model keeps (float16 for the base).
        config: the directory's ``config.json``.
        variables: every variable name in the base ``model.bin`` (see :func:`build_spec`).
    """

    model_dir: Path
    dims: WhisperDims
    state: dict[str, F32]
    dtype: np.dtype[Any]
    config: dict[str, Any]
    variables: frozenset[str]


def _layers(v: Mapping[str, Any], side: str) -> int:
    n = 0
    while f"{side}/layer_{n}/self_attention/linear_0/weight" in v:
        n += 1
    return n


def read_base(model_dir: Path) -> BaseModel:
    """Read a CTranslate2 Whisper directory as a ``transformers`` state dict.

    Args:
        model_dir: a directory with ``model.bin`` (float16 or float32 weights) and
            ``config.json``; quantized (int8) files cannot be trained and are refused.

    Raises:
        WeightFileError: the file is not a CTranslate2 Whisper model, or its weights are int8.
    """
    model_dir = Path(model_dir)
    v = read_variables(model_dir / "model.bin")
    emb = v["decoder/embeddings/weight"]
    if emb.dtype not in (np.float16, np.float32):
        raise WeightFileError(
            f"{model_dir}/model.bin stores {emb.dtype} weights; adaptation needs a float16 or "
            "float32 model (convert it without --quantization int8)"
        )
    d = int(emb.shape[1])
    dims = WhisperDims(
        num_mel_bins=int(v["encoder/conv1/weight"].shape[1]),
        d_model=d,
        encoder_layers=_layers(v, "encoder"),
        decoder_layers=_layers(v, "decoder"),
        encoder_heads=int(v["encoder/num_heads"]),
        decoder_heads=int(v["decoder/num_heads"]),
        ffn_dim=int(v["encoder/layer_0/ffn/linear_0/weight"].shape[0]),
        vocab_size=int(emb.shape[0]),
        max_source_positions=int(v["encoder/position_encodings/encodings"].shape[0]),
        max_target_positions=int(v["decoder/position_encodings/encodings"].shape[0]),
    )
    sd: dict[str, F32] = {}

    def put(name: str, value: Any) -> None:
        sd[name] = np.asarray(value, dtype=np.float32)

    def norm(hf: str, ct2: str) -> None:
        put(hf + ".weight", v[ct2 + "/gamma"])
        put(hf + ".bias", v[ct2 + "/beta"])

    def linear(hf: str, ct2: str) -> None:
        put(hf + ".weight", v[ct2 + "/weight"])
        put(hf + ".bias", v[ct2 + "/bias"])

    def unfuse(hf: str, ct2: str, parts: tuple[str, ...]) -> None:
        w = v[ct2 + "/weight"]
        b = v[ct2 + "/bias"]
        for i, p in enumerate(parts):
            put(f"{hf}.{p}_proj.weight", w[i * d : (i + 1) * d])
            if p != "k":  # Whisper's k projections have no bias; CTranslate2 stores zeros
                put(f"{hf}.{p}_proj.bias", b[i * d : (i + 1) * d])

    def ffn(hf: str, ct2: str) -> None:
        norm(hf + ".final_layer_norm", ct2 + "/ffn/layer_norm")
        linear(hf + ".fc1", ct2 + "/ffn/linear_0")
        linear(hf + ".fc2", ct2 + "/ffn/linear_1")

    def stack(side: str) -> None:  # what the encoder and the decoder hold beside their layers
        put(f"model.{side}.embed_positions.weight", v[f"{side}/position_encodings/encodings"])
        norm(f"model.{side}.layer_norm", f"{side}/layer_norm")

    def self_attention(hf: str, ct2: str) -> None:
        unfuse(hf + ".self_attn", ct2 + "/self_attention/linear_0", ("q", "k", "v"))
        linear(hf + ".self_attn.out_proj", ct2 + "/self_attention/linear_1")
        norm(hf + ".self_attn_layer_norm", ct2 + "/self_attention/layer_norm")

    for c in ("conv1", "conv2"):
        linear(f"model.encoder.{c}", f"encoder/{c}")
    stack("encoder")
    for i in range(dims.encoder_layers):
        hf, ct2 = f"model.encoder.layers.{i}", f"encoder/layer_{i}"
        self_attention(hf, ct2)
        ffn(hf, ct2)
    put("model.decoder.embed_tokens.weight", emb)
    stack("decoder")
    for i in range(dims.decoder_layers):
        hf, ct2 = f"model.decoder.layers.{i}", f"decoder/layer_{i}"
        self_attention(hf, ct2)
        unfuse(hf + ".encoder_attn", ct2 + "/attention/linear_0", ("q",))
        unfuse(hf + ".encoder_attn", ct2 + "/attention/linear_1", ("k", "v"))
        linear(hf + ".encoder_attn.out_proj", ct2 + "/attention/linear_2")
        norm(hf + ".encoder_attn_layer_norm", ct2 + "/attention/layer_norm")
        ffn(hf, ct2)
    config = json.loads((model_dir / "config.json").read_text(encoding="utf-8"))
    return BaseModel(model_dir, dims, sd, np.dtype(emb.dtype), config, frozenset(v))


def build_spec(state: Mapping[str, npt.NDArray[Any]], base: BaseModel) -> Any:
    """Fill a ``ctranslate2.specs.WhisperSpec`` from a ``transformers`` state dict, in NumPy.

    The inverse of :func:`read_base` and the same layout as CTranslate2's Transformers
    converter: q/k/v fused (a zero k bias inserted), k/v fused in cross-attention, the output
    projection tied to the embeddings. Weights are cast to ``base.dtype`` (float16 for the
    bundled base: the model keeps its served size and CTranslate2 quantizes it at load as
    before). The spec's config is the base's, so language ids and alignment heads survive.
    """
    from ctranslate2.specs import whisper_spec

    dims = base.dims
    d = dims.d_model
    spec = whisper_spec.WhisperSpec(
        dims.encoder_layers, dims.encoder_heads, dims.decoder_layers, dims.decoder_heads
    )

    def get(name: str) -> npt.NDArray[Any]:
        return np.ascontiguousarray(np.asarray(state[name]).astype(base.dtype))

    def linear(target: Any, name: str) -> None:
        target.weight = get(name + ".weight")
        target.bias = get(name + ".bias")

    def norm(target: Any, name: str) -> None:
        target.gamma = get(name + ".weight")
        target.beta = get(name + ".bias")

    def fused(target: Any, prefix: str, parts: tuple[str, ...]) -> None:
        target.weight = np.concatenate([get(f"{prefix}.{p}_proj.weight") for p in parts])
        target.bias = np.concatenate(
            [
                np.zeros((d,), dtype=base.dtype) if p == "k" else get(f"{prefix}.{p}_proj.bias")
                for p in parts
            ]
        )

    def ffn(target: Any, prefix: str) -> None:
        norm(target.layer_norm, prefix + ".final_layer_norm")
        linear(target.linear_0, prefix + ".fc1")
        linear(target.linear_1, prefix + ".fc2")

    def stack(target: Any, side: str) -> None:  # beside the layers, as in read_base
        target.position_encodings.encodings = get(f"model.{side}.embed_positions.weight")
        norm(target.layer_norm, f"model.{side}.layer_norm")

    def self_attention(target: Any, prefix: str) -> None:
        fused(target.linear[0], prefix + ".self_attn", ("q", "k", "v"))
        linear(target.linear[1], prefix + ".self_attn.out_proj")
        norm(target.layer_norm, prefix + ".self_attn_layer_norm")

    enc = spec.encoder
    linear(enc.conv1, "model.encoder.conv1")
    linear(enc.conv2, "model.encoder.conv2")
    stack(enc, "encoder")
    for i, layer in enumerate(enc.layer):
        p = f"model.encoder.layers.{i}"
        self_attention(layer.self_attention, p)
        ffn(layer.ffn, p)
    dec = spec.decoder
    dec.embeddings.weight = get("model.decoder.embed_tokens.weight")
    stack(dec, "decoder")
    for i, layer in enumerate(dec.layer):
        p = f"model.decoder.layers.{i}"
        self_attention(layer.self_attention, p)
        fused(layer.attention.linear[0], p + ".encoder_attn", ("q",))
        fused(layer.attention.linear[1], p + ".encoder_attn", ("k", "v"))
        linear(layer.attention.linear[2], p + ".encoder_attn.out_proj")
        norm(layer.attention.layer_norm, p + ".encoder_attn_layer_norm")
        ffn(layer.ffn, p)
    dec.projection.weight = dec.embeddings.weight
    # A newer CTranslate2 spec declares flags an older converter did not write (4.8.5 adds
    # decoder/alibi_use_positive_positions and decoder/scale_alibi, both off). A flag the base
    # file lacks takes the loader's default, which is what the base is served with, so leaving
    # it out keeps the written file byte-identical to the base.
    for name in ("alibi_use_positive_positions", "scale_alibi"):
        if f"decoder/{name}" not in base.variables and hasattr(dec, name):
            if bool(getattr(dec, name)):
                raise WeightFileError(f"decoder/{name} is set but the base model lacks it")
            delattr(dec, name)

    cfg = spec.config
    for key in ("suppress_ids", "suppress_ids_begin", "lang_ids", "alignment_heads"):
        if key in base.config:
            setattr(cfg, key, base.config[key])
    vocab = (base.model_dir / "vocabulary.txt").read_text(encoding="utf-8").split("\n")
    while vocab and vocab[-1] == "":
        vocab.pop()
    spec.register_vocabulary(vocab)
    return spec


def write_ct2_dir(state: Mapping[str, npt.NDArray[Any]], base: BaseModel, out_dir: Path) -> Path:
    """Write a CTranslate2 model directory: ``model.bin`` from ``state``, small files copied.

    ``out_dir`` must not exist yet (the caller writes into a private partial directory and
    renames it into place; see :mod:`voxgate.adapt.publish`).

    Returns:
        ``out_dir``.
    """
    spec = build_spec(state, base)
    spec.validate()
    spec.optimize(quantization=None)  # aliases the tied projection; keeps base.dtype
    out_dir.mkdir(parents=True)
    spec._serialize(str(out_dir / "model.bin"))  # noqa: SLF001 - save() minus config/vocab files
    for name in CARRIED_FILES:
        src = base.model_dir / name
        if src.is_file():
            shutil.copyfile(src, out_dir / name)
    return out_dir


def state_dict_of(model: Any) -> dict[str, F32]:
    """A torch module's state dict as float32 NumPy arrays (``proj_out`` left out: it is tied)."""
    return {
        k: v.detach().float().cpu().numpy()
        for k, v in model.state_dict().items()
        if k != "proj_out.weight"
    }


def hf_config_kwargs(base: BaseModel) -> dict[str, Any]:
    """Keyword arguments of ``transformers.WhisperConfig`` for ``base`` (special ids included)."""
    dims = base.dims
    vocab = (base.model_dir / "vocabulary.txt").read_text(encoding="utf-8").split("\n")
    eot = vocab.index("<|endoftext|>")
    return {
        "vocab_size": dims.vocab_size,
        "num_mel_bins": dims.num_mel_bins,
        "d_model": dims.d_model,
        "encoder_layers": dims.encoder_layers,
        "decoder_layers": dims.decoder_layers,
        "encoder_attention_heads": dims.encoder_heads,
        "decoder_attention_heads": dims.decoder_heads,
        "encoder_ffn_dim": dims.ffn_dim,
        "decoder_ffn_dim": dims.ffn_dim,
        "max_source_positions": dims.max_source_positions,
        "max_target_positions": dims.max_target_positions,
        "bos_token_id": eot,
        "eos_token_id": eot,
        "pad_token_id": eot,
        "decoder_start_token_id": vocab.index("<|startoftranscript|>"),
        "suppress_tokens": list(base.config.get("suppress_ids", [])),
        "begin_suppress_tokens": list(base.config.get("suppress_ids_begin", [])),
        "tie_word_embeddings": True,
    }


def hf_model(base: BaseModel) -> Any:
    """A ``transformers`` ``WhisperForConditionalGeneration`` holding ``base``'s weights.

    Imports torch and transformers (the ``adapt`` extra). The load is strict: a missing or
    unexpected key raises, so a layout change in a future transformers release fails loudly.
    """
    import torch
    import transformers

    config = transformers.WhisperConfig(**hf_config_kwargs(base))
    with torch.device("meta"):
        model = transformers.WhisperForConditionalGeneration(config)
    tensors = {k: torch.from_numpy(np.array(a, dtype=np.float32)) for k, a in base.state.items()}
    tensors["proj_out.weight"] = tensors["model.decoder.embed_tokens.weight"]
    model.load_state_dict(tensors, strict=True, assign=True)
    model.tie_weights()
    model.eval()  # type: ignore[no-untyped-call]
    return model
