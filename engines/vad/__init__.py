"""Voice activity models that run per frame, for the gateway's segmenter.

:class:`SileroVad` is the Silero VAD network (the ONNX file ``faster-whisper`` ships, run on
ONNX Runtime; no download): one process-wide session, shared by every call, and a small
per-call :class:`SileroStream` that holds the LSTM state and buffers frames into the model's
32 ms windows. It answers the gateway's ``VoiceDetector`` seam (``voice_confidence(frame)``).
"""

from __future__ import annotations

from voxgate.engines.vad._silero import (
    SILERO_CONTEXT,
    SILERO_RATE_HZ,
    SILERO_WINDOW,
    SileroStream,
    SileroVad,
    silero_model_path,
)

__all__ = [
    "SILERO_CONTEXT",
    "SILERO_RATE_HZ",
    "SILERO_WINDOW",
    "SileroStream",
    "SileroVad",
    "silero_model_path",
]
