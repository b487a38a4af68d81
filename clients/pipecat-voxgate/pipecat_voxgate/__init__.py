"""Pipecat services for the voxgate gateway: streaming STT and TTS over gRPC.

``VoxgateSTTService`` (``StreamingRecognize``) and ``VoxgateTTSService`` (``Synthesize``); see
docs/pipecat.md in the voxgate repository for a runnable pipeline.
"""

from __future__ import annotations

from pipecat_voxgate.stt import VoxgateSTTService, VoxgateSTTSettings
from pipecat_voxgate.tts import VoxgateTTSService, VoxgateTTSSettings

__all__ = ["VoxgateSTTService", "VoxgateSTTSettings", "VoxgateTTSService", "VoxgateTTSSettings"]
