"""Export a Piper voice's two TTS halves to ONNX files and pre-build their TensorRT engines.

Run (from the repository root)::

    .venv/bin/python benchmarks/export_tts.py --out-dir /models/tts            # bundled voice
    .venv/bin/python benchmarks/export_tts.py --voice /models/en_US-x.onnx --out-dir /models/tts \\
        --trt-cache /models/trt                                               # on the GPU host

What it does:

1. Splits the voice with :func:`voxgate.engines.tts.split_vits_graph` (the same split
   :class:`voxgate.engines.tts.VitsStreamer` makes at load time) and writes
   ``<stem>.front_end.onnx``, ``<stem>.decoder.onnx`` and ``<stem>.split.json`` (the crossing
   tensors, which of them are frame-indexed, the latent, durations and audio names, the hop
   length and the window schedule). The halves are for inspection, profiling (``trtexec``,
   Nsight) and other runtimes; the gateway itself still loads the original voice and splits it.
2. Verifies on CPU that front end then decoder reproduce the whole graph **bit-exactly** with
   noise off (``noise_scale = noise_w = 0``), for a few sentences; exit status 1 if not.
3. When ONNX Runtime offers ``TensorrtExecutionProvider`` (and ``--no-trt`` is not given),
   pre-builds the TensorRT engines into ``--trt-cache`` (default ``~/.cache/voxgate/trt``, the
   streamer's default): it opens each half exactly as the streamer does (same model bytes, same
   provider options from :func:`voxgate.engines.tts.select_providers`, engine cache on) and runs it
   at the extremes of its input shapes, then at the streamer's window shapes. TensorRT builds one
   engine per input-shape profile and widens the profile when a shape falls outside it, so
   after the extremes every later shape reuses the cached engine. The decoder sees
   ``first_window_frames`` (8) frames plus ``context_frames`` (24) on each side where the
   sentence has them, then windows sized by the synthesis scheduler up to twice
   ``window_frames`` (192), batched up to 8 on a GPU: from 1 up to 192 + 2 x 24 = 240 latent
   frames, batch 1 to 8. Point the gateway at the same directory (``tts.trt_cache_dir`` in
   the YAML config, or ``VOXGATE_TTS__TRT_CACHE_DIR``) so a restart loads the engines instead
   of building them (minutes). The cache is specific to the GPU model, TensorRT and ONNX Runtime
   versions: build it on the machine type that serves (or in the image's first start).

Whisper large-v3 (or a fine-tune) for the GPU path. voxgate never downloads models at run time;
convert once, on a machine that has the Hugging Face model locally (``pip install
transformers torch`` there; ``ctranslate2`` provides the converter)::

    ct2-transformers-converter --model openai/whisper-large-v3 \\
        --output_dir whisper-large-v3-ct2 \\
        --copy_files tokenizer.json preprocessor_config.json --quantization float16

``--model`` may be a local directory (a fine-tuned checkpoint saved with ``save_pretrained``
plus its tokenizer files). Copy ``whisper-large-v3-ct2/`` to the serving host and point
voxgate at it::

    voxgate serve --model /models/whisper-large-v3-ct2 --device cuda
    # or: VOXGATE_ASR__MODEL=/models/whisper-large-v3-ct2 VOXGATE_ASR__DEVICE=cuda voxgate serve

See ``deploy/GPU.md``; ``benchmarks/gpu_check.sh --model /models/whisper-large-v3-ct2`` measures
it.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

if __package__ in (None, ""):
    # Run as a script: make the repository root importable (engines/).
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import onnx  # noqa: E402
import onnxruntime as ort  # noqa: E402

from voxgate.engines.tts import GraphSplit, TtsConfig, select_providers, split_vits_graph  # noqa: E402

TRT = "TensorrtExecutionProvider"
CPU = "CPUExecutionProvider"

#: Sentences whose phoneme ids drive the bit-exactness check (short, long, with numbers).
VERIFY_TEXTS = (
    "Hello.",
    "The quick brown fox jumps over the lazy dog.",
    "Your appointment with Dr. Lee is on March 3rd at 10:30, and it costs $45.",
)


@dataclass(frozen=True, slots=True)
class ExportedVoice:
    """Where the halves went and what connects them."""

    front_end: Path
    decoder: Path
    manifest: Path
    split: GraphSplit
    hop_length: int
    sample_rate: int
    num_speakers: int


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _voice_files(voice: str) -> tuple[Path, Path]:
    from voxgate.engines.tts._voice import resolve_voice

    files = resolve_voice(voice)
    return files.model_path, files.config_path


def export_halves(voice: str, out_dir: Path, config: TtsConfig | None = None) -> ExportedVoice:
    """Split ``voice`` ("joe" or a Piper ``.onnx`` path) and write both halves + a manifest.

    Args:
        voice: as ``TtsConfig.voice``.
        out_dir: created if missing; existing files of the same names are replaced.
        config: window schedule recorded in the manifest (defaults: ``TtsConfig()``).

    Returns:
        The written paths and the split.
    """
    cfg = config or TtsConfig()
    model_path, config_path = _voice_files(voice)
    voice_json = json.loads(config_path.read_text(encoding="utf-8"))
    model = onnx.load(str(model_path))
    split = split_vits_graph(model)
    out_dir.mkdir(parents=True, exist_ok=True)
    stem = model_path.name.removesuffix(".onnx")
    front_path = out_dir / f"{stem}.front_end.onnx"
    decoder_path = out_dir / f"{stem}.decoder.onnx"
    front_bytes = split.front_end.SerializeToString()
    decoder_bytes = split.decoder.SerializeToString()
    front_path.write_bytes(front_bytes)
    decoder_path.write_bytes(decoder_bytes)
    hop = int(voice_json.get("audio", {}).get("hop_length", 256))
    rate = int(voice_json.get("audio", {}).get("sample_rate", 22050))
    speakers = int(voice_json.get("num_speakers", 1))
    manifest = {
        "voice": model_path.name,
        "voice_sha256": _sha256(model_path.read_bytes()),
        "front_end": {"file": front_path.name, "sha256": _sha256(front_bytes)},
        "decoder": {"file": decoder_path.name, "sha256": _sha256(decoder_bytes)},
        "front_end_inputs": [i.name for i in split.front_end.graph.input],
        "front_end_outputs": [o.name for o in split.front_end.graph.output],
        "decoder_inputs": [i.name for i in split.decoder.graph.input],
        "crossing": [
            {"name": c.name, "shape": list(c.shape), "frame_indexed": c.frame_indexed}
            for c in split.crossing
        ],
        "latent": split.latent,
        "durations": split.durations,
        "audio_output": split.audio_output,
        "decoder_graph_inputs": list(split.decoder_graph_inputs),
        "hop_length": hop,
        "sample_rate": rate,
        "num_speakers": speakers,
        "windows": {
            "first_window_frames": cfg.first_window_frames,
            "window_frames": cfg.window_frames,
            "context_frames": cfg.context_frames,
        },
        "onnx": onnx.__version__,
        "onnxruntime": ort.__version__,
    }
    manifest_path = out_dir / f"{stem}.split.json"
    manifest_path.write_text(json.dumps(manifest, indent=2))
    return ExportedVoice(front_path, decoder_path, manifest_path, split, hop, rate, speakers)


def _session(model: bytes, providers: list[Any]) -> ort.InferenceSession:
    # Same session options as the streamer (voxgate.engines.tts._session.make_session), without its
    # silent CPU fallback: here a provider failure must be visible.
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    options.inter_op_num_threads = 1
    options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    return ort.InferenceSession(model, sess_options=options, providers=providers)


def phoneme_ids(voice: str, text: str) -> tuple[int, ...]:
    """The voice's phoneme ids for ``text`` (first unit), as the streamer computes them."""
    from voxgate.engines.tts._text import prepare_text
    from voxgate.engines.tts._voice import load_voice_config, phonemize_unit, resolve_voice

    voice_config, _ = load_voice_config(resolve_voice(voice).config_path)
    unit = prepare_text(text, max_chars=10_000, max_unit_chars=10_000, first_unit_max_chars=0)[0]
    return phonemize_unit(unit, voice_config).phoneme_ids


def front_feeds(
    session: ort.InferenceSession,
    ids: Sequence[int],
    *,
    noise_scale: float = 0.0,
    length_scale: float = 1.0,
    noise_w: float = 0.0,
    speaker_id: int = 0,
) -> dict[str, npt.NDArray[Any]]:
    """Inputs of a Piper graph (whole or front end) for ``ids``; only those it declares."""
    feeds: dict[str, npt.NDArray[Any]] = {
        "input": np.array([list(ids)], dtype=np.int64),
        "input_lengths": np.array([len(ids)], dtype=np.int64),
        "scales": np.array([noise_scale, length_scale, noise_w], dtype=np.float32),
        "sid": np.array([speaker_id], dtype=np.int64),
    }
    names = {i.name for i in session.get_inputs()}
    return {k: v for k, v in feeds.items() if k in names}


def run_halves(
    front: ort.InferenceSession,
    decoder: ort.InferenceSession,
    split: GraphSplit,
    feeds: dict[str, npt.NDArray[Any]],
) -> npt.NDArray[np.float32]:
    """Front end, then the decoder on the whole latent: the unwindowed split path."""
    outputs = front.run(None, {k: v for k, v in feeds.items() if k in _names(front)})
    dec_feeds = {c.name: outputs[i] for i, c in enumerate(split.crossing)}
    dec_feeds.update({k: feeds[k] for k in split.decoder_graph_inputs})
    return np.asarray(decoder.run(None, dec_feeds)[0], dtype=np.float32).reshape(-1)


def _names(session: ort.InferenceSession) -> set[str]:
    return {i.name for i in session.get_inputs()}


def verify_bit_exact(
    voice: str, exported: ExportedVoice, texts: Sequence[str] = VERIFY_TEXTS
) -> list[dict[str, Any]]:
    """Whole graph vs front end + decoder (files as written), noise off, on CPU.

    Returns:
        One row per text: samples, whether the waveforms are identical, max abs difference.
    """
    model_path, _ = _voice_files(voice)
    whole = _session(model_path.read_bytes(), [CPU])
    front = _session(exported.front_end.read_bytes(), [CPU])
    decoder = _session(exported.decoder.read_bytes(), [CPU])
    rows = []
    for text in texts:
        ids = phoneme_ids(voice, text)
        feeds = front_feeds(whole, ids)
        reference = np.asarray(whole.run(None, feeds)[0], dtype=np.float32).reshape(-1)
        split_audio = run_halves(front, decoder, exported.split, feeds)
        same_shape = reference.shape == split_audio.shape
        diff = float(np.max(np.abs(reference - split_audio))) if same_shape else None
        rows.append(
            {
                "text": text,
                "samples": int(reference.size),
                "bit_exact": bool(same_shape and np.array_equal(reference, split_audio)),
                "max_abs_diff": diff,
            }
        )
    return rows


def decoder_window_lengths(total: int, config: TtsConfig) -> list[int]:
    """Decoder input lengths (frames, context included) the streamer uses for a unit."""
    lengths = []
    size, start = config.first_window_frames, 0
    while start < total:
        stop = min(total, start + size)
        if total - stop < config.first_window_frames // 2:
            stop = total
        lo = max(0, start - config.context_frames)
        hi = min(total, stop + config.context_frames)
        lengths.append(hi - lo)
        start = stop
        size = min(config.window_frames, size * 2)
    return lengths


def prebuild_trt(
    voice: str,
    exported: ExportedVoice,
    cache_dir: Path,
    config: TtsConfig | None = None,
    max_ids: int = 600,
    batch: int = 8,
) -> list[dict[str, Any]]:
    """Run each half under TensorRT at its extreme and usual shapes so the cache holds them.

    Sessions are opened from the same bytes and with the same provider options as
    :class:`voxgate.engines.tts.VitsStreamer` (ONNX Runtime keys cached engines on the model and its
    options), with TensorRT first and CUDA, then CPU for any node TensorRT does not take.

    Returns:
        One row per run: which half, the input length, seconds (a build shows as seconds to
        minutes, a cache hit as milliseconds), and the providers the session really used.
    """
    cfg = (config or TtsConfig()).model_copy(update={"trt_cache_dir": str(cache_dir)})
    cache_dir.mkdir(parents=True, exist_ok=True)
    providers = select_providers(
        ort.get_available_providers(), [TRT, "CUDAExecutionProvider"], str(cache_dir)
    )
    rows: list[dict[str, Any]] = []
    t0 = time.perf_counter()
    front = _session(exported.front_end.read_bytes(), list(providers))
    decoder = _session(exported.decoder.read_bytes(), list(providers))
    rows.append(
        {
            "half": "sessions",
            "frames_or_ids": 0,
            "seconds": time.perf_counter() - t0,
            "providers": sorted(set(front.get_providers()) | set(decoder.get_providers())),
        }
    )
    base_ids = list(phoneme_ids(voice, VERIFY_TEXTS[-1]))

    def ids_of(n: int) -> list[int]:
        reps = -(-n // len(base_ids))
        return (base_ids * reps)[:n]

    # Front end: longest, then shortest input, at the extreme speaking rates, then typical.
    latent: dict[str, npt.NDArray[Any]] | None = None
    for n, length_scale in ((max_ids, 4.0), (max_ids, 0.25), (5, 0.25), (5, 4.0), (80, 1.0)):
        feeds = front_feeds(
            front, ids_of(n), noise_scale=0.667, length_scale=length_scale, noise_w=0.8
        )
        start = time.perf_counter()
        outputs = front.run(None, feeds)
        rows.append(
            {
                "half": "front_end",
                "frames_or_ids": n,
                "length_scale": length_scale,
                "seconds": time.perf_counter() - start,
            }
        )
        if latent is None:
            latent = {c.name: outputs[i] for i, c in enumerate(exported.split.crossing)}
    assert latent is not None
    total = int(latent[exported.split.latent].shape[-1])
    # The synthesis scheduler's largest window is twice window_frames, and on a GPU it batches
    # up to 8 windows (gateway/scheduling/synthesis.py): widest first, at the largest batch, so
    # that one profile covers every later shape.
    widest = 2 * cfg.window_frames + 2 * cfg.context_frames
    shapes = [(widest, batch), (1, 1)]
    shapes += [(n, 1) for n in sorted(set(decoder_window_lengths(min(total, 400), cfg)))]
    for wanted, rows_in_batch in shapes:
        frames = min(wanted, total)
        feeds = {
            c.name: np.repeat(
                latent[c.name][..., :frames] if c.frame_indexed else latent[c.name],
                rows_in_batch,
                axis=0,
            )
            for c in exported.split.crossing
        }
        extra = front_feeds(decoder, base_ids)
        feeds.update({k: extra[k] for k in exported.split.decoder_graph_inputs if k in extra})
        start = time.perf_counter()
        decoder.run(None, feeds)
        rows.append(
            {
                "half": "decoder",
                "frames_or_ids": frames,
                "batch": rows_in_batch,
                "seconds": time.perf_counter() - start,
            }
        )
    return rows


def main(argv: Sequence[str] | None = None) -> int:
    """Export, verify, and pre-build TensorRT engines when TensorRT is available."""
    p = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    p.add_argument("--voice", default="joe", help="'joe' (bundled) or a Piper .onnx path")
    p.add_argument("--out-dir", default="tts-export", help="where the halves are written")
    p.add_argument("--trt-cache", help="TensorRT engine cache (default ~/.cache/voxgate/trt)")
    p.add_argument("--no-trt", action="store_true", help="skip the TensorRT pre-build")
    p.add_argument("--no-verify", action="store_true", help="skip the CPU bit-exactness check")
    p.add_argument("--json", help="also write the results here")
    args = p.parse_args(argv)

    exported = export_halves(args.voice, Path(args.out_dir))
    print(f"front end -> {exported.front_end}")
    print(f"decoder   -> {exported.decoder}")
    print(f"manifest  -> {exported.manifest}")
    result: dict[str, Any] = {
        "front_end": str(exported.front_end),
        "decoder": str(exported.decoder),
    }
    status = 0
    if not args.no_verify:
        rows = verify_bit_exact(args.voice, exported)
        result["verify"] = rows
        for row in rows:
            verdict = "bit-exact" if row["bit_exact"] else f"DIFFERS (max {row['max_abs_diff']})"
            print(f"verify: {row['samples']:>7} samples  {verdict}  {row['text']!r}")
        if not all(r["bit_exact"] for r in rows):
            status = 1
    if TRT in ort.get_available_providers() and not args.no_trt:
        cache = Path(args.trt_cache or Path("~/.cache/voxgate/trt").expanduser())
        try:
            rows = prebuild_trt(args.voice, exported, cache)
        except Exception as error:  # noqa: BLE001 - report any TensorRT/CUDA failure plainly
            print(f"TensorRT pre-build failed: {error!r}")
            result["trt"] = {"cache_dir": str(cache), "error": repr(error)}
            status = 1
        else:
            result["trt"] = {"cache_dir": str(cache), "runs": rows}
            for row in rows:
                print(f"trt: {row['half']:<9} {row['frames_or_ids']:>5}  {row['seconds']:8.2f} s")
            print(f"TensorRT engines cached in {cache} (providers: {rows[0]['providers']})")
    elif not args.no_trt:
        print("TensorrtExecutionProvider not available: export and verification only")
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2))
    return status


if __name__ == "__main__":
    sys.exit(main())
