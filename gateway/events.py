"""The session's events: what a call receives from the client and what it sends back.

The servicer turns protobuf messages into the inbound dataclasses and the outbound ones back
into protobuf; the session and everything below it see only these, never generated code.
"""

from __future__ import annotations

from dataclasses import dataclass

from voxgate.engines.asr.base import AsrResult
from voxgate.gateway.barge_in import BargeInMode
from voxgate.gateway.errors import CallError, ErrorKind

__all__ = [
    "AudioIn",
    "AudioOutEvent",
    "ClearIn",
    "DtmfIn",
    "DtmfOut",
    "ErrorOut",
    "FlushIn",
    "HangupIn",
    "InboundEvent",
    "InterruptedOut",
    "MarkIn",
    "MarkReachedOut",
    "OutboundEvent",
    "PlaybackFinishedOut",
    "QualityOut",
    "RejectedSpeakIn",
    "SpeakIn",
    "SpeechOut",
    "TranscriptOut",
]


# --- inbound ------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class AudioIn:
    """Caller audio, still in the wire encoding."""

    data: bytes


@dataclass(frozen=True, slots=True)
class SpeakIn:
    """Text to say to the caller (already validated by the servicer)."""

    text: str
    speak_id: str
    voice: str = ""
    rate: float = 1.0
    speaker_id: int = 0
    uninterruptible: bool = False
    #: This reply's barge-in policy; None = the call's (see voxgate.gateway.barge_in).
    barge_in: BargeInMode | None = None
    #: after_words: words needed for this reply; 0 = the call's.
    barge_in_min_words: int = 0
    #: Synthesize with the load-shedding settings (gateway/degrade.py: larger decoder windows).
    degraded: bool = False
    #: A caller hears it in real time from its first frame (a Converse reply), so synthesis
    #: need not run more than ``session.tts_max_lead_ms`` ahead of it; False (Synthesize):
    #: as fast as the device allows.
    paced: bool = False


@dataclass(frozen=True, slots=True)
class ClearIn:
    """Drop queued and playing speech."""


@dataclass(frozen=True, slots=True)
class MarkIn:
    """Report when playout reaches this point of the speech queue."""

    name: str


@dataclass(frozen=True, slots=True)
class HangupIn:
    """End the call after the pending utterance is transcribed."""


@dataclass(frozen=True, slots=True)
class FlushIn:
    """Finish the current utterance now."""


@dataclass(frozen=True, slots=True)
class DtmfIn:
    """A keypad digit from the caller's line."""

    digit: str
    duration_ms: int


@dataclass(frozen=True, slots=True)
class RejectedSpeakIn:
    """A Speak that failed validation: the call goes on, the bot gets an ErrorEvent."""

    speak_id: str
    error: CallError


InboundEvent = AudioIn | SpeakIn | ClearIn | MarkIn | HangupIn | FlushIn | DtmfIn | RejectedSpeakIn


# --- outbound -----------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class SpeechOut:
    """SPEECH_BEGIN (``begin=True``) or SPEECH_END at a call offset."""

    begin: bool
    offset_ms: int
    utterance_index: int


@dataclass(frozen=True, slots=True)
class TranscriptOut:
    """A transcript with call-relative times."""

    result: AsrResult
    is_final: bool
    start_ms: int
    end_ms: int
    utterance_index: int
    latency_ms: int = 0
    #: Finals, with turn detection on: the turn the utterance belongs to.
    turn_index: int | None = None


@dataclass(frozen=True, slots=True)
class AudioOutEvent:
    """One paced frame of synthesized audio in the call's output format."""

    data: bytes
    sequence_number: int
    speak_id: str
    offset_ms: int
    is_last: bool


@dataclass(frozen=True, slots=True)
class MarkReachedOut:
    """Playout reached a mark."""

    name: str


@dataclass(frozen=True, slots=True)
class InterruptedOut:
    """Playback of a Speak stopped early (barge-in or Clear)."""

    speak_id: str
    played_ms: int
    words_played: tuple[str, ...]
    at_offset_ms: int
    #: after_words: the caller's transcript that interrupted (empty otherwise).
    caller_text: str = ""


@dataclass(frozen=True, slots=True)
class PlaybackFinishedOut:
    """A Speak played to its end."""

    speak_id: str
    duration_ms: int


@dataclass(frozen=True, slots=True)
class ErrorOut:
    """A failure that does not end the call (one utterance, one Speak)."""

    kind: ErrorKind
    message: str
    scope: str
    utterance_index: int = 0
    speak_id: str = ""


@dataclass(frozen=True, slots=True)
class QualityOut:
    """What the server sheds under load now (``QualityChanged``); empty = full quality."""

    shed: tuple[str, ...]
    description: str


@dataclass(frozen=True, slots=True)
class DtmfOut:
    """A keypad digit, echoed to the bot on the event stream."""

    digit: str
    duration_ms: int


@dataclass(frozen=True, slots=True)
class EndOfTurnOut:
    """The caller has finished their turn (``EndOfTurn``); sent after the turn's last final."""

    turn_index: int
    probability: float
    offset_ms: int
    text: str
    first_utterance_index: int
    last_utterance_index: int
    reason: str
    silence_ms: int
    latency_ms: int = 0


OutboundEvent = (
    SpeechOut
    | TranscriptOut
    | AudioOutEvent
    | MarkReachedOut
    | InterruptedOut
    | PlaybackFinishedOut
    | ErrorOut
    | DtmfOut
    | QualityOut
    | EndOfTurnOut
)
