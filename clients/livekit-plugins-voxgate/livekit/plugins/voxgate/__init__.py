"""LiveKit Agents plugin for the voxgate gateway: ``voxgate.STT`` and ``voxgate.TTS``.

``from livekit.plugins import voxgate``; see docs/livekit.md in the voxgate repository.
"""

from __future__ import annotations

from livekit.agents import Plugin

from .log import logger
from .stt import STT, SpeechStream
from .tts import TTS, ChunkedStream, SynthesizeStream
from .version import __version__

__all__ = ["STT", "TTS", "ChunkedStream", "SpeechStream", "SynthesizeStream", "__version__"]


class VoxgatePlugin(Plugin):
    """Registers the plugin with LiveKit Agents (its convention for every plugin)."""

    def __init__(self) -> None:
        super().__init__(__name__, __version__, __package__, logger)


Plugin.register_plugin(VoxgatePlugin())
