"""Read Whisper's decoder weights out of a CTranslate2 ``model.bin`` into NumPy arrays.

Our own decode loop (``voxgate.engines.asr._decode``) runs Whisper's decoder step by step so that
logits processors can act between steps, which CTranslate2's ``generate`` does not allow. It reuses
the very weights CTranslate2 loaded, read straight from ``model.bin``, so no second model file has
to ship. The layout (CTranslate2 binary spec, version 6) is plain: a version, the spec name and
revision, then for each variable its name, rank, dims, dtype and bytes, then aliases. q/k/v are
fused in the file (``linear_0`` of self-attention is [q; k; v], of cross-attention ``linear_1`` is
[k; v]) with a zero k bias, so splitting them back is exact.

``quantize="int8"`` rounds every linear weight to int8 with one scale per output row, as
CTranslate2 does at load for ``compute_type="int8"``; together with the per-row activation
quantization in the decode loop this reproduces CTranslate2's int8 arithmetic (integer products
are exact in float32 below 2**24), which is what makes our tokens equal to ``generate``'s.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import numpy as np
import numpy.typing as npt

__all__ = [
    "DecoderWeights",
    "Linear",
    "WeightFileError",
    "load_decoder_weights",
    "read_variables",
]

F32 = npt.NDArray[np.float32]

# CTranslate2 DataType enum values.
_DTYPES: dict[int, np.dtype[np.generic]] = {
    0: np.dtype("<f4"),
    1: np.dtype("i1"),
    2: np.dtype("<i2"),
    3: np.dtype("<i4"),
    4: np.dtype("<f2"),
}
_BF16 = 5
_SUPPORTED_VERSION = 6


class WeightFileError(RuntimeError):
    """``model.bin`` is not a CTranslate2 Whisper file this reader understands."""


@dataclass(frozen=True, slots=True)
class Linear:
    """One dense layer, stored ready for ``x @ w_t``.

    Attributes:
        w_t: the weight transposed, (in, out), float32; with int8 it holds the integer values.
        bias: (out,) or None.
        inv_scale: (out,) 1/scale per output row when int8, else None.
    """

    w_t: F32
    bias: F32 | None
    inv_scale: F32 | None

    @property
    def quantized(self) -> bool:
        """True when ``w_t`` holds int8 values and activations must be quantized too."""
        return self.inv_scale is not None


@dataclass(frozen=True, slots=True)
class DecoderLayer:
    """Weights of one pre-norm decoder layer (self-attention, cross-attention, FFN)."""

    ln_self: tuple[F32, F32]
    q: Linear
    k: Linear
    v: Linear
    out_self: Linear
    ln_cross: tuple[F32, F32]
    q_cross: Linear
    k_cross: Linear
    v_cross: Linear
    out_cross: Linear
    ln_ffn: tuple[F32, F32]
    ffn_in: Linear
    ffn_out: Linear


@dataclass(frozen=True, slots=True)
class DecoderWeights:
    """Whisper's decoder: embeddings, positions, layers, final norm; projection = embeddings^T."""

    embeddings: F32
    positions: F32
    layers: tuple[DecoderLayer, ...]
    ln_final: tuple[F32, F32]
    projection: Linear
    num_heads: int
    quantize: str

    @property
    def d_model(self) -> int:
        """Hidden width (512 for base)."""
        return int(self.embeddings.shape[1])

    @property
    def vocab_size(self) -> int:
        """Output vocabulary size (51865 multilingual, 51864 English-only)."""
        return int(self.embeddings.shape[0])


def read_variables(path: Path) -> dict[str, npt.NDArray[np.generic]]:
    """Every variable of a CTranslate2 Whisper ``model.bin``, by its spec name, in file order.

    Arrays keep the stored dtype (float16 for the bundled base) and are read-only views of the
    file's bytes; an alias (``decoder/projection/weight``) is the very array it names. The
    adaptation pipeline (``voxgate.adapt.convert``) reads the whole model through this one parser so
    there is no second reader of the format to drift.

    Raises:
        WeightFileError: the file is not a CTranslate2 Whisper model of binary version 6.
    """
    data = path.read_bytes()
    off = 0

    def u32() -> int:
        nonlocal off
        (v,) = struct.unpack_from("<I", data, off)
        off += 4
        return int(v)

    def string() -> str:
        nonlocal off
        (n,) = struct.unpack_from("<H", data, off)
        off += 2
        s = data[off : off + n].rstrip(b"\0").decode()
        off += n
        return s

    version = u32()
    if version != _SUPPORTED_VERSION:
        raise WeightFileError(f"{path}: CTranslate2 binary version {version}, expected 6")
    spec = string()
    if spec != "WhisperSpec":
        raise WeightFileError(f"{path}: spec {spec!r} is not a Whisper model")
    u32()  # spec revision
    out: dict[str, npt.NDArray[np.generic]] = {}
    for _ in range(u32()):
        name = string()
        rank = data[off]
        off += 1
        dims = struct.unpack_from("<" + "I" * rank, data, off)
        off += 4 * rank
        code = data[off]
        off += 1
        nbytes = u32()
        if code == _BF16:
            raw = np.frombuffer(data, "<u2", nbytes // 2, off).astype(np.uint32) << 16
            arr: npt.NDArray[np.generic] = raw.view(np.float32)
        elif code in _DTYPES:
            dt = _DTYPES[code]
            arr = np.frombuffer(data, dt, nbytes // dt.itemsize, off)
        else:
            raise WeightFileError(f"{path}: variable {name} has unknown dtype {code}")
        out[name] = arr.reshape(dims) if rank else arr.reshape(())
        off += nbytes
    if off < len(data):
        for _ in range(u32()):
            alias, target = string(), string()
            out[alias] = out[target]
    return out


def _quantize_rows(w: F32) -> tuple[F32, F32]:
    """int8 values and 1/scale per row, as CTranslate2 quantizes a weight at load."""
    amax = np.max(np.abs(w), axis=1)
    scale = np.where(amax > 0, np.float32(127.0) / np.maximum(amax, np.float32(1e-30)), 1.0)
    scale = scale.astype(np.float32)
    q = np.rint(w * scale[:, None]).astype(np.float32)
    return q, (np.float32(1.0) / scale).astype(np.float32)


def _linear(w: npt.NDArray[np.generic], b: npt.NDArray[np.generic] | None, int8: bool) -> Linear:
    wf = np.asarray(w, dtype=np.float32)
    bias = None if b is None else np.ascontiguousarray(b, dtype=np.float32)
    if int8:
        q, inv = _quantize_rows(wf)
        return Linear(np.ascontiguousarray(q.T), bias, inv)
    return Linear(np.ascontiguousarray(wf.T), bias, None)


def load_decoder_weights(
    model_dir: Path, quantize: Literal["none", "int8"] = "int8"
) -> DecoderWeights:
    """Load the decoder of the Whisper model in ``model_dir`` (a CTranslate2 directory).

    Args:
        model_dir: directory with ``model.bin``.
        quantize: ``int8`` to match CTranslate2's ``compute_type="int8"`` on CPU; ``none`` for
            float32 (matches ``compute_type="float32"``).

    Raises:
        WeightFileError: the file is not a CTranslate2 Whisper model.
    """
    v = read_variables(Path(model_dir) / "model.bin")
    int8 = quantize == "int8"

    def f32(name: str) -> F32:
        return np.ascontiguousarray(v[name], dtype=np.float32)

    def ln(prefix: str) -> tuple[F32, F32]:
        return f32(prefix + "/gamma"), f32(prefix + "/beta")

    def lin(prefix: str) -> Linear:
        return _linear(v[prefix + "/weight"], v.get(prefix + "/bias"), int8)

    if int(v["decoder/pre_norm"]) != 1 or int(v["decoder/activation"]) != 3:
        raise WeightFileError("only pre-norm decoders with exact GELU are supported (Whisper)")
    layers = []
    i = 0
    while f"decoder/layer_{i}/self_attention/linear_0/weight" in v:
        p = f"decoder/layer_{i}"
        qkv_w = np.asarray(v[p + "/self_attention/linear_0/weight"], dtype=np.float32)
        qkv_b = np.asarray(v[p + "/self_attention/linear_0/bias"], dtype=np.float32)
        d = qkv_w.shape[1]
        kv_w = np.asarray(v[p + "/attention/linear_1/weight"], dtype=np.float32)
        kv_b = np.asarray(v[p + "/attention/linear_1/bias"], dtype=np.float32)
        # CTranslate2 quantizes the fused matrix row by row, so splitting before quantizing
        # gives the same per-row scales.
        layers.append(
            DecoderLayer(
                ln_self=ln(p + "/self_attention/layer_norm"),
                q=_linear(qkv_w[:d], qkv_b[:d], int8),
                k=_linear(qkv_w[d : 2 * d], qkv_b[d : 2 * d], int8),
                v=_linear(qkv_w[2 * d :], qkv_b[2 * d :], int8),
                out_self=lin(p + "/self_attention/linear_1"),
                ln_cross=ln(p + "/attention/layer_norm"),
                q_cross=lin(p + "/attention/linear_0"),
                k_cross=_linear(kv_w[:d], kv_b[:d], int8),
                v_cross=_linear(kv_w[d:], kv_b[d:], int8),
                out_cross=lin(p + "/attention/linear_2"),
                ln_ffn=ln(p + "/ffn/layer_norm"),
                ffn_in=lin(p + "/ffn/linear_0"),
                ffn_out=lin(p + "/ffn/linear_1"),
            )
        )
        i += 1
    emb = f32("decoder/embeddings/weight")
    proj = _linear(emb, None, int8)
    if int8:
        # The embedding table is the same int8 variable: a lookup dequantizes one row.
        assert proj.inv_scale is not None
        emb = np.ascontiguousarray(proj.w_t.T * proj.inv_scale[:, None], dtype=np.float32)
    return DecoderWeights(
        embeddings=emb,
        positions=f32("decoder/position_encodings/encodings"),
        layers=tuple(layers),
        ln_final=ln("decoder/layer_norm"),
        projection=proj,
        num_heads=int(v["decoder/num_heads"]),
        quantize=quantize,
    )
