"""Types shared by every engine and by the gateway that feeds them.

Inside the engines audio is float32 mono; the ASR path is at 16 kHz, a voice at its own rate
(``VoiceInfo.sample_rate_hz``). Formats convert only at the gateway's edges.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

__all__ = ["ASR_SAMPLE_RATE_HZ", "LEVEL_FLOOR", "FloatArray", "UtteranceStats", "dbfs"]

#: The ASR path is float32 mono at 16 kHz from the edge converters inward.
ASR_SAMPLE_RATE_HZ = 16_000

FloatArray = npt.NDArray[np.float32]


@dataclass(frozen=True, slots=True)
class UtteranceStats:
    """What the VAD learned about one utterance; drives the silence-aware decoding policy.

    All times are in milliseconds relative to the utterance's first sample.

    Attributes:
        duration_ms: length of the utterance audio (pre-roll and hangover included).
        speech_ms: time the VAD judged to be voiced.
        speech_ratio: ``speech_ms / duration_ms``.
        leading_silence_ms: unvoiced time before the first voiced frame.
        trailing_silence_ms: unvoiced time after the last voiced frame.
        rms_dbfs: RMS level of the whole utterance in dB relative to full scale.
        speech_rms_dbfs: RMS level of the voiced frames only.
        peak_dbfs: absolute peak level in dBFS.
        forced_cut: True when the utterance was cut at ``max_utterance_ms``.
    """

    duration_ms: int
    speech_ms: int
    speech_ratio: float
    leading_silence_ms: int
    trailing_silence_ms: int
    rms_dbfs: float
    speech_rms_dbfs: float
    peak_dbfs: float
    forced_cut: bool = False

    @classmethod
    def from_frames(
        cls,
        audio: FloatArray,
        voiced: Sequence[bool] | npt.NDArray[np.bool_],
        frame_ms: int,
        *,
        forced_cut: bool = False,
    ) -> UtteranceStats:
        """Statistics of ``audio`` (16 kHz) from one voiced/unvoiced flag per ``frame_ms`` frame.

        The one builder: the segmenter (flags from its voice model) and the test signals
        (flags from an energy threshold) both use it, so their levels share a floor.
        """
        flags = np.asarray(voiced, dtype=bool)
        frame_len = ASR_SAMPLE_RATE_HZ * frame_ms // 1000
        n = len(flags)
        duration_ms = round(1000 * len(audio) / ASR_SAMPLE_RATE_HZ)
        idx = np.flatnonzero(flags)
        speech_ms = len(idx) * frame_ms
        framed = audio[: n * frame_len].reshape(n, frame_len)
        peak = float(np.max(np.abs(audio))) if len(audio) else 0.0
        return cls(
            duration_ms=duration_ms,
            speech_ms=speech_ms,
            speech_ratio=speech_ms / duration_ms if duration_ms else 0.0,
            leading_silence_ms=int(idx[0]) * frame_ms if len(idx) else duration_ms,
            trailing_silence_ms=(n - 1 - int(idx[-1])) * frame_ms if len(idx) else duration_ms,
            rms_dbfs=dbfs(audio),
            speech_rms_dbfs=dbfs(framed[idx].reshape(-1)) if len(idx) else dbfs(audio),
            peak_dbfs=20.0 * math.log10(max(peak, LEVEL_FLOOR)),
            forced_cut=forced_cut,
        )


#: Linear level floor of every dBFS figure (-120 dBFS): digital silence has a level too.
LEVEL_FLOOR = 1e-6


def dbfs(x: npt.NDArray[np.floating[Any]]) -> float:
    """RMS level of ``x`` in dB relative to full scale, floored at -120 dBFS."""
    if len(x) == 0:
        return 20.0 * math.log10(LEVEL_FLOOR)
    rms = math.sqrt(float(np.mean(np.square(x, dtype=np.float64))))
    return 20.0 * math.log10(max(rms, LEVEL_FLOOR))
