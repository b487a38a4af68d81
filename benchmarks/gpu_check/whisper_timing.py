"""Section 3: Whisper encode + generate on full 30 s windows, per batch size."""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import ctranslate2
import numpy as np
import numpy.typing as npt

from benchmarks.gpu_check.common import ASR_RATE, FULL_WINDOW_FRAMES, Budget, log, percentile

__all__ = [
    "Prompt",
    "bench_batches",
    "engine_config",
    "engine_max_length",
    "load_ct2",
    "log_mel",
]


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


def engine_config(
    model_dir: Path,
    device: str,
    compute_type: str,
    random_model: bool,
    **fields: Any,
) -> Any:
    """The :class:`WhisperConfig` gpu_check runs the engine with (full 30 s window).

    With random weights the decoder never emits end-of-text, so every decode "loops" and hits
    its cap; Whisper's temperature fallback would then re-decode each item five more times with
    best_of sampling. One pass at temperature 0 is the cost of a real decode.
    """
    from voxgate.engines.asr.config import DecodingPolicyConfig, EncoderWindowConfig, WhisperConfig

    policy: dict[str, Any] = {"temperatures": (0.0,)} if random_model else {}
    return WhisperConfig(
        model=str(model_dir),
        device="cuda" if device == "cuda" else "cpu",
        compute_type=compute_type,
        encoder=EncoderWindowConfig(buckets_s=(30.0,)),
        policy=DecodingPolicyConfig(**policy),
        **fields,
    )


def engine_max_length(
    model: Any,
    model_dir: Path,
    device: str,
    compute_type: str,
    features: npt.NDArray[np.float32],
    prompt: Prompt,
    new_tokens: int,
    random_model: bool,
) -> dict[str, Any]:
    """The ``max_length`` the engine itself would pass to ``generate`` for ``new_tokens``.

    ``max_length`` should be prompt + new tokens (faster-whisper's reading), but CTranslate2
    4.8.5 stops after ``max_length // 2`` new tokens. :class:`WhisperEngine` measures which
    reading holds in ``warmup()`` and sizes every decode accordingly, so the batch timings use
    the same rule: the engine is built over ``model`` (no second copy of the weights), warmed
    up, and asked for its ``max_length``. The token counts at the nominal and at the chosen
    ``max_length`` on ``features`` are then measured and reported, so a wrong rule shows.
    """
    import tokenizers

    from voxgate.engines.asr._whisper import WhisperEngine

    def tokens(max_length: int) -> int:
        feats = ctranslate2.StorageView.from_array(np.ascontiguousarray(features[None]))
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
    out: dict[str, Any] = {
        "prompt_tokens": len(prompt.ids),
        "new_tokens_wanted": new_tokens,
        "nominal_max_length": nominal,
        "tokens_at_nominal": tokens(nominal),
        "calibrated_by": "WhisperEngine.warmup",
    }
    try:
        hf_tokenizer = tokenizers.Tokenizer.from_file(str(model_dir / "tokenizer.json"))
        engine = WhisperEngine(
            model, hf_tokenizer, engine_config(model_dir, device, compute_type, random_model)
        )
        engine.warmup()
        # NOTE: WhisperEngine has no public accessor for the max_length it decodes with yet.
        chosen = int(engine.max_length(len(prompt.ids), new_tokens))
    except Exception as error:  # noqa: BLE001 - e.g. a model dir the engine cannot read
        log(f"WhisperEngine unavailable for max_length ({error!r}); using the nominal value")
        out["calibrated_by"] = None
        out["engine_error"] = repr(error)
        chosen = nominal
    out["max_length_used"] = chosen
    out["tokens_at_used"] = tokens(chosen)
    return out


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
    """Encode + generate with ``max_length`` (see :func:`engine_max_length`) per batch size."""
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
