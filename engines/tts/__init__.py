"""Streaming VITS speech synthesis (a Piper voice split into front end and windowed decoder).

Use :class:`VitsStreamer` (``load`` -> ``warmup`` -> ``stream`` ... -> ``close``). Requests are
validated when :meth:`VitsStreamer.stream` is called and raise :class:`TtsInputError`; the returned
iterator then yields :class:`TtsChunk` objects, one decoder window each.

Text policy: SSML/HTML tags are stripped, not interpreted (their inner text is spoken);
entities are decoded; numbers, ordinals, years, currency, clock times, percentages and common
abbreviations are spoken as words; empty text, text with nothing speakable, and text longer than
``TtsConfig.max_chars`` are refused with ``TtsInputError(field="text")``.
"""

from __future__ import annotations

from voxgate.engines.tts._graph import CrossingTensor, GraphSplit, split_vits_graph
from voxgate.engines.tts._session import select_providers
from voxgate.engines.tts._streamer import ReplyJob, VitsStreamer, WindowPlan, soft_limit
from voxgate.engines.tts._text import cardinal, ordinal, year
from voxgate.engines.tts._voice import VoiceFiles, resolve_voice
from voxgate.engines.tts._windows import window_bounds
from voxgate.engines.tts.base import (
    SpeakOptions,
    TtsChunk,
    TtsEngine,
    TtsError,
    TtsInputError,
    VoiceGraphError,
    VoiceInfo,
    WordSpan,
)
from voxgate.engines.tts.config import TtsConfig

__all__ = [
    "CrossingTensor",
    "GraphSplit",
    "ReplyJob",
    "SpeakOptions",
    "TtsChunk",
    "TtsConfig",
    "TtsEngine",
    "TtsError",
    "TtsInputError",
    "VitsStreamer",
    "VoiceFiles",
    "VoiceGraphError",
    "VoiceInfo",
    "WindowPlan",
    "WordSpan",
    "cardinal",
    "ordinal",
    "resolve_voice",
    "select_providers",
    "soft_limit",
    "split_vits_graph",
    "window_bounds",
    "year",
]
