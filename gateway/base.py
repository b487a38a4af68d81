"""The gateway's public seams: the engines as a call sees them, and what a server lists.

Protocols here are what the session, the servicer and the server depend on;
``voxgate.gateway.runtime`` implements them over the real engines and ``voxgate.gateway.testing``
over fakes. Threading: every method is called on the event loop; implementations move model work to
their own threads.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from voxgate.engines.asr.base import AsrRequest, AsrResult
from voxgate.engines.base import FloatArray
from voxgate.gateway.events import SpeakIn
from voxgate.gateway.metrics import GatewayMetrics

__all__ = [
    "EngineHub",
    "EngineInfo",
    "ModelDescription",
    "Synthesizer",
    "Transcriber",
    "TtsPiece",
    "VoiceDescription",
]


class Transcriber(Protocol):
    """The shared, cross-call recogniser (the batcher in front of the Whisper engine)."""

    async def transcribe(self, request: AsrRequest) -> AsrResult:
        """Transcribe one utterance; raises :class:`CallError` for queue-full and the like."""
        ...

    def can_speculate(self) -> bool:
        """Whether there is spare capacity for a speculative final (nothing is waiting)."""
        ...

    def spare_worker(self) -> bool:
        """Whether a worker is idle and nothing waits: a request now starts at once.

        A second barge-in interim of one call may overlap the first only then, so that it
        takes only CPU that would otherwise idle.
        """
        ...

    def encode_context(self, initial_prompt: str, hotwords: Sequence[str]) -> tuple[int, ...]:
        """The recogniser's tokens for a call's prompt and hotwords (once, at call start)."""
        ...


@dataclass(frozen=True, slots=True)
class TtsPiece:
    """A piece of synthesized audio with the words that end inside it."""

    samples: FloatArray
    words: tuple[tuple[str, int], ...]  # (word, end_ms relative to the Speak's start)
    is_last: bool


class Synthesizer(Protocol):
    """The shared voice engine, seen as an async stream of audio pieces."""

    sample_rate_hz: int
    #: Longest text one Speak may carry (the voice's ``tts.max_chars``); the servicer checks it.
    max_text_chars: int

    def stream(self, speak: SpeakIn) -> AsyncIterator[TtsPiece]:
        """Synthesize ``speak.text``; raises :class:`CallError` for bad input."""
        ...


@dataclass(frozen=True, slots=True)
class ModelDescription:
    """A recognition model, as ListModels reports it."""

    name: str
    family: str
    languages: tuple[str, ...] = ()
    device: str = "cpu"
    compute_type: str = ""
    #: False for a named model that is offered but not in memory yet (its first call loads it).
    loaded: bool = True


@dataclass(frozen=True, slots=True)
class VoiceDescription:
    """A loaded voice, as ListVoices reports it."""

    name: str
    language: str
    sample_rate_hz: int
    num_speakers: int = 1
    license_note: str = ""


@dataclass
class EngineInfo:
    """What the servicer needs to know about loaded engines; the first of each is the default."""

    models: list[ModelDescription] = field(default_factory=list)
    voices: list[VoiceDescription] = field(default_factory=list)
    #: Real-time calls the recogniser holds by the start-up calibration (0: not calibrated).
    asr_capacity_calls: int = 0


class EngineHub(Protocol):
    """Loads, warms and closes the engines a server uses."""

    transcriber: Transcriber | None
    synthesizer: Synthesizer | None
    info: EngineInfo

    async def start(self, metrics: GatewayMetrics) -> None:
        """Load and warm every engine (in worker threads), counting into ``metrics``."""
        ...

    async def aclose(self) -> None:
        """Stop the batcher, then close the engines."""
        ...
