"""Section 5: TTS first audio per ONNX Runtime provider (accelerators in a subprocess)."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from benchmarks.gpu_check.audio import active_providers, load_streamer
from benchmarks.gpu_check.common import TTS_TEXTS, percentile

__all__ = ["tts_first_audio", "tts_in_subprocess", "tts_worker"]

#: The repository root: the subprocess runs ``python -m benchmarks.gpu_check`` from here.
REPO_ROOT = Path(__file__).resolve().parents[2]


def tts_first_audio(streamer: Any, reps: int, provider: str, load_s: float) -> dict[str, Any]:
    """First-audio time and RTF per reply, cold (first time each text) and warm."""
    from voxgate.engines.tts import SpeakOptions

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
    cmd = [sys.executable, "-m", "benchmarks.gpu_check", "--tts-worker", provider]
    cmd += ["--tts-reps", str(reps)]
    if trt_cache:
        cmd += ["--trt-cache", trt_cache]
    try:
        done = subprocess.run(
            cmd, cwd=REPO_ROOT, capture_output=True, text=True, timeout=timeout_s, check=False
        )
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
