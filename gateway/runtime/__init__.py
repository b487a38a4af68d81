"""The production engine hub: loads the configured engines and adapts them for sessions.

Engines are synchronous classes (``engines/``); this package owns their threads. Recognition goes
through the cross-call :class:`~voxgate.gateway.scheduling.Batcher` (one or more engine
workers), and speech synthesis through the deadline scheduler's workers, so that no model work
ever runs on the event loop. ``_hub`` loads, warms, calibrates and closes the engines;
``_adapters`` holds what sessions call (the transcriber, the synthesizer, batch metrics, the
per-model router).
"""

from __future__ import annotations

from voxgate.gateway.runtime._adapters import (
    AsrTranscriber,
    BatchMetrics,
    ModelRouter,
    TtsSynthesizer,
)
from voxgate.gateway.runtime._hub import EngineHubImpl, EngineLoadError, build_hub

__all__ = [
    "AsrTranscriber",
    "BatchMetrics",
    "EngineHubImpl",
    "EngineLoadError",
    "ModelRouter",
    "TtsSynthesizer",
    "build_hub",
]
