"""Speech for the capacity section: the bundled voice (or a speech-like fallback)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np
import numpy.typing as npt

from benchmarks.gpu_check.common import ASR_RATE, UTTERANCE_TEXTS

__all__ = ["active_providers", "load_streamer", "speech_utterances", "utterance_stats"]


def load_streamer(providers: Sequence[str], trt_cache: str | None) -> Any:
    """A warmed-up VitsStreamer on ``providers`` with the phrase cache off."""
    from voxgate.engines.tts import TtsConfig, VitsStreamer

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

        from voxgate.engines.tts import SpeakOptions

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
    from voxgate.engines.base import UtteranceStats

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
