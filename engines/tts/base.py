"""The TTS engine contract: what the gateway asks a synthesiser for and what it gets back.

Threading: :meth:`TtsEngine.stream` may be called from several worker threads at once (each call
has its own state); the iterator it returns must be advanced by one thread at a time, and each
``next()`` does a bounded amount of work (one front-end run or one decoder window), so a gateway
can pull it with ``loop.run_in_executor(pool, next, it, None)`` without blocking its loop for long.

Units: audio is float32 mono at the voice's own rate (``sample_rate_hz``); the gateway resamples
at the edge. Word times are milliseconds from the first sample of the reply.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Protocol

from voxgate.engines.base import FloatArray

__all__ = [
    "MAX_LENGTH_SCALE",
    "MIN_LENGTH_SCALE",
    "SpeakOptions",
    "TtsChunk",
    "TtsEngine",
    "TtsError",
    "TtsInputError",
    "VoiceGraphError",
    "VoiceInfo",
    "WordSpan",
]

#: ``length_scale`` bounds: outside them VITS durations degenerate (clipped or minute-long
#: phonemes), so the request is refused instead of producing garbage audio.
MIN_LENGTH_SCALE = 0.25
MAX_LENGTH_SCALE = 4.0
#: Noise scales above this are far outside what the voices were trained with (0.33-1.0).
MAX_NOISE_SCALE = 2.0


class TtsError(Exception):
    """Base class of every error the TTS engine raises on purpose."""


class TtsInputError(TtsError, ValueError):
    """A request the engine refuses (bad text or options); maps to INVALID_ARGUMENT.

    Attributes:
        field: the request field at fault (``text``, ``length_scale``, ``voice`` ...), so that the
            servicer can fill a ``BadRequest.FieldViolation`` without parsing the message.
    """

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field


class VoiceGraphError(TtsError):
    """The voice's ONNX graph does not have the VITS structure the streamer splits on."""


@dataclass(frozen=True, slots=True)
class SpeakOptions:
    """Per-request synthesis options (from the proto's ``Speak``/``SynthesizeRequest``).

    ``None`` means "use the voice's own default from its ``.onnx.json``".

    Attributes:
        length_scale: phoneme duration multiplier; > 1 is slower speech. Range
            [MIN_LENGTH_SCALE, MAX_LENGTH_SCALE].
        noise_scale: latent sampling noise (expressiveness); 0 makes the output deterministic.
        noise_w: duration-predictor noise (rhythm variation); 0 is deterministic.
        speaker_id: speaker index for multi-speaker voices; must be ``None`` or 0 otherwise.
        voice: voice name from :meth:`TtsEngine.voices`; ``None`` is the default voice.
        window_frames: size of the later decoder windows; ``None`` = ``TtsConfig.window_frames``.
            Larger windows decode less thrown-away context per second of speech (the gateway
            raises it under load); the first window, and so the first audio, is unchanged.
    """

    length_scale: float | None = None
    noise_scale: float | None = None
    noise_w: float | None = None
    speaker_id: int | None = None
    voice: str | None = None
    window_frames: int | None = None


@dataclass(frozen=True, slots=True)
class WordSpan:
    """Where a word sits in the reply's audio.

    Attributes:
        text: the word as written in the request (punctuation stripped), e.g. ``$3.50`` even
            though it is spoken as four words; barge-in reports what the caller wrote.
        start_ms: first millisecond of the word, from the start of the reply.
        end_ms: last millisecond of the word (exclusive), from the start of the reply.
    """

    text: str
    start_ms: float
    end_ms: float


@dataclass(frozen=True, slots=True)
class TtsChunk:
    """One block of synthesised audio, in reply order.

    Attributes:
        samples: float32 mono samples in (-1, 1) at ``sample_rate_hz``.
        sample_rate_hz: the voice's output rate.
        offset_samples: index of ``samples[0]`` within the whole reply.
        words: the words whose end falls inside this chunk, so that once a chunk has been played
            its words have been heard in full.
        sentence_index: which sentence/clause unit of the reply this chunk belongs to.
        is_last: True on the reply's final chunk.
    """

    samples: FloatArray
    sample_rate_hz: int
    offset_samples: int
    words: tuple[WordSpan, ...]
    sentence_index: int
    is_last: bool

    @property
    def duration_ms(self) -> float:
        """Length of the chunk in milliseconds."""
        return 1000.0 * len(self.samples) / self.sample_rate_hz

    @property
    def end_ms(self) -> float:
        """End of the chunk from the start of the reply, in milliseconds."""
        return 1000.0 * (self.offset_samples + len(self.samples)) / self.sample_rate_hz


@dataclass(frozen=True, slots=True)
class VoiceInfo:
    """A voice the engine can speak with (for ``ListVoices``).

    Attributes:
        name: the name ``SpeakOptions.voice`` selects it by.
        language: BCP-47-like code from the voice config, e.g. ``en_US``.
        sample_rate_hz: output rate of the voice.
        num_speakers: 1 for single-speaker voices; otherwise valid ``speaker_id`` is below it.
    """

    name: str
    language: str
    sample_rate_hz: int
    num_speakers: int


class TtsEngine(Protocol):
    """A streaming speech synthesiser (implemented by :class:`voxgate.engines.tts.VitsStreamer`)."""

    @property
    def sample_rate_hz(self) -> int:
        """Output rate of the default voice."""
        ...

    @property
    def max_text_chars(self) -> int:
        """Longest text one ``stream`` call accepts (``TtsConfig.max_chars``)."""
        ...

    def warmup(self) -> None:
        """Synthesise a short phrase so that the first real reply does not pay for lazy init."""
        ...

    def voices(self) -> list[VoiceInfo]:
        """The voices this engine serves."""
        ...

    def stream(self, text: str, options: SpeakOptions) -> Iterator[TtsChunk]:
        """Validate now (raising :class:`TtsInputError`), then yield audio chunks lazily."""
        ...

    def close(self) -> None:
        """Release the ONNX sessions."""
        ...
