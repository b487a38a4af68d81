"""Types shared by every engine and by the gateway that feeds them.

Inside the engines audio is float32 mono; the ASR path is at 16 kHz, a voice at its own rate
(``VoiceInfo.sample_rate_hz``). Formats convert only at the gateway's edges.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

__all__ = ["ASR_SAMPLE_RATE_HZ", "FloatArray", "UtteranceStats"]

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
