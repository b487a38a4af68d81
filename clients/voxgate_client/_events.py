"""Typed server events: one frozen dataclass per ``ConverseResponse`` case.

Applications match on these classes instead of protobuf ``WhichOneof`` strings, so a typo is a
type error rather than a silently ignored event. Every event also carries ``received_s``, the
client's ``loop.time()`` when it arrived; it is excluded from equality so events compare by
content.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import grpc

from ._common.messages import fill
from ._errors import status_code_from_number
from ._proto import voxgate_pb2 as pb

__all__ = [
    "Alternative",
    "AudioOut",
    "Dtmf",
    "EndOfTurn",
    "ErrorEvent",
    "MarkReached",
    "PlaybackFinished",
    "PlaybackInterrupted",
    "QualityChanged",
    "ServerEvent",
    "SessionStarted",
    "SpeechBegin",
    "SpeechEnd",
    "SynthesisChunk",
    "Transcript",
    "Word",
    "event_from_proto",
    "event_to_proto",
]


def _received() -> float:
    return field(default=0.0, compare=False, repr=False)


@dataclass(frozen=True, slots=True)
class SessionStarted:
    """The server accepted the call's config; always the first event.

    Attributes:
        session_id: server-assigned id (quote it when reporting a problem).
        model: recognition model; empty when the server runs without ASR.
        voice: voice; empty when the server runs without TTS (``speak`` is then refused).
        server_version: the gateway's version string.
        effective_config: the config after server defaults were applied.
    """

    session_id: str
    model: str
    voice: str
    server_version: str
    effective_config: pb.SessionConfig
    received_s: float = _received()

    @property
    def has_asr(self) -> bool:
        """Whether transcripts will arrive on this call."""
        return bool(self.model)

    @property
    def has_tts(self) -> bool:
        """Whether ``speak`` is served on this call."""
        return bool(self.voice)

    @property
    def turn_detection(self) -> str:
        """The call's turn detection: ``"off"``, ``"silence"`` or ``"smart"``.

        When it is on, the server sends :class:`EndOfTurn` once the caller has finished, and
        a bot answers that (a final ends an utterance, which may be a pause in the turn).
        """
        mode = self.effective_config.turn_detection.mode
        return {pb.TURN_DETECTION_SILENCE: "silence", pb.TURN_DETECTION_SMART: "smart"}.get(
            mode, "off"
        )

    @property
    def turn_model(self) -> str:
        """The audio end-of-turn model deciding this call's ``smart`` turns, by file name.

        Empty when there is none (silence and the words alone) or the mode is not ``smart``.
        """
        return self.effective_config.turn_detection.audio_model


@dataclass(frozen=True, slots=True)
class SpeechBegin:
    """The caller started speaking (offset from the start of the call's audio)."""

    offset_ms: int
    utterance_index: int
    received_s: float = _received()


@dataclass(frozen=True, slots=True)
class SpeechEnd:
    """The caller stopped speaking; a final transcript of this utterance follows (with ASR)."""

    offset_ms: int
    utterance_index: int
    received_s: float = _received()


@dataclass(frozen=True, slots=True)
class Word:
    """One recognised word with call-relative times."""

    word: str
    start_ms: int
    end_ms: int
    probability: float


@dataclass(frozen=True, slots=True)
class Alternative:
    """An N-best alternative transcript."""

    text: str
    confidence: float


@dataclass(frozen=True, slots=True)
class Transcript:
    """An interim (``is_final=False``) or final transcript of one utterance.

    Attributes:
        latency_ms: server time from end of speech to this transcript (finals only).
        turn_index: finals, with turn detection on: the turn this utterance belongs to
            (see :class:`EndOfTurn`); None otherwise.
    """

    text: str
    is_final: bool
    start_ms: int
    end_ms: int
    utterance_index: int
    confidence: float = 0.0
    no_speech_probability: float = 0.0
    language: str = ""
    latency_ms: int = 0
    words: tuple[Word, ...] = ()
    alternatives: tuple[Alternative, ...] = ()
    received_s: float = _received()
    turn_index: int | None = None

    @property
    def interim(self) -> bool:
        """True for a growing utterance's provisional text."""
        return not self.is_final


@dataclass(frozen=True, slots=True)
class AudioOut:
    """One real-time-paced frame of synthesized reply audio, in the call's output format."""

    data: bytes
    sequence_number: int
    speak_id: str
    offset_ms: int
    is_last: bool
    received_s: float = _received()


@dataclass(frozen=True, slots=True)
class MarkReached:
    """Playout reached a mark sent with :meth:`Call.mark`."""

    name: str
    received_s: float = _received()


@dataclass(frozen=True, slots=True)
class PlaybackInterrupted:
    """A reply stopped early: barge-in (``at_offset_ms >= 0``) or ``clear``/hangup (-1).

    ``caller_text`` is the caller's transcript that interrupted under the ``after_words``
    policy (empty for the others).
    """

    speak_id: str
    played_ms: int
    words_played: tuple[str, ...]
    at_offset_ms: int
    received_s: float = _received()
    caller_text: str = ""

    @property
    def barge_in(self) -> bool:
        """Whether caller speech (not a Clear) caused it."""
        return self.at_offset_ms >= 0


@dataclass(frozen=True, slots=True)
class PlaybackFinished:
    """A reply played to its end."""

    speak_id: str
    duration_ms: int
    received_s: float = _received()


@dataclass(frozen=True, slots=True)
class ErrorEvent:
    """A failure that did not end the call (one utterance or one Speak).

    Attributes:
        code: the ``grpc.StatusCode`` the failure maps to.
        scope: ``"utterance"`` or ``"speak"``.
    """

    code: grpc.StatusCode
    message: str
    scope: str
    utterance_index: int = 0
    speak_id: str = ""
    received_s: float = _received()


@dataclass(frozen=True, slots=True)
class Dtmf:
    """A keypad digit, echoed back on the event stream for the bot."""

    digit: str
    duration_ms: int
    received_s: float = _received()


@dataclass(frozen=True, slots=True)
class QualityChanged:
    """The server sheds quality past its capacity; ``shed`` is what this call gets less of now.

    Sent when a call starts while steps are shed, and on every change; empty ``shed`` means
    full quality again. ``"interim_results"`` means no interim transcripts, ``"word_times"``
    finals without words: a bot that relies on either can see why they stopped.
    """

    shed: tuple[str, ...]
    description: str
    received_s: float = _received()


@dataclass(frozen=True, slots=True)
class EndOfTurn:
    """The caller has finished their turn (turn detection on): answer now.

    Sent after the turn's last final; a pause inside a turn ends an utterance (SpeechEnd, a
    final) but not the turn.

    Attributes:
        turn_index: the turn, from 0; its finals carry it (``Transcript.turn_index``).
        probability: how sure the detector is that the caller has finished, 0..1.
        offset_ms: end of the turn's last speech, ms of the call's audio.
        text: the turn's whole text: its finals joined, or the server's decode of the turn's
            audio as one (a turn of two or more utterances, where that was back in time).
        reason: what ended it: "silence", "words", "audio", "max_pause", "flush", "hangup".
        silence_ms: silence after the last speech when the turn was declared over, ms.
        latency_ms: server time from end of speech to this event, ms.
    """

    turn_index: int
    probability: float
    offset_ms: int
    text: str
    first_utterance_index: int = 0
    last_utterance_index: int = 0
    reason: str = ""
    silence_ms: int = 0
    latency_ms: int = 0
    received_s: float = _received()


ServerEvent = (
    SessionStarted
    | SpeechBegin
    | SpeechEnd
    | Transcript
    | AudioOut
    | MarkReached
    | PlaybackInterrupted
    | PlaybackFinished
    | ErrorEvent
    | Dtmf
    | QualityChanged
    | EndOfTurn
)


@dataclass(frozen=True, slots=True)
class SynthesisChunk:
    """One chunk of :meth:`VoxgateClient.synthesize` output.

    Attributes:
        words: ``(word, end_ms)`` for words whose audio ends within this chunk.
    """

    data: bytes
    sequence_number: int
    offset_ms: int
    is_last: bool
    words: tuple[tuple[str, int], ...] = ()


def event_from_proto(msg: pb.ConverseResponse, received_s: float = 0.0) -> ServerEvent | None:
    """Convert one ``ConverseResponse``; None for an event kind this client does not know.

    Unknown kinds are skipped rather than raised so that an older client keeps working against
    a newer server that added a response case.
    """
    kind = msg.WhichOneof("event")
    t = received_s
    if kind == "started":
        s = msg.started
        return SessionStarted(
            s.session_id, s.model, s.voice, s.server_version, s.effective_config, t
        )
    if kind == "speech":
        sp = msg.speech
        if sp.type == pb.SpeechEvent.SPEECH_BEGIN:
            return SpeechBegin(sp.offset_ms, sp.utterance_index, t)
        if sp.type == pb.SpeechEvent.SPEECH_END:
            return SpeechEnd(sp.offset_ms, sp.utterance_index, t)
        return None
    if kind == "transcript":
        tr = msg.transcript
        return Transcript(
            text=tr.text,
            is_final=tr.is_final,
            start_ms=tr.start_ms,
            end_ms=tr.end_ms,
            utterance_index=tr.utterance_index,
            confidence=tr.confidence,
            no_speech_probability=tr.no_speech_probability,
            language=tr.language,
            latency_ms=tr.latency_ms,
            words=tuple(Word(w.word, w.start_ms, w.end_ms, w.probability) for w in tr.words),
            alternatives=tuple(Alternative(a.text, a.confidence) for a in tr.alternatives),
            received_s=t,
            turn_index=tr.turn_index if tr.HasField("turn_index") else None,
        )
    if kind == "audio":
        a = msg.audio
        return AudioOut(a.data, a.sequence_number, a.speak_id, a.offset_ms, a.is_last, t)
    if kind == "mark":
        return MarkReached(msg.mark.name, t)
    if kind == "interrupted":
        i = msg.interrupted
        return PlaybackInterrupted(
            i.speak_id, i.played_ms, tuple(i.words_played), i.at_offset_ms, t, i.caller_text
        )
    if kind == "playback_finished":
        f = msg.playback_finished
        return PlaybackFinished(f.speak_id, f.duration_ms, t)
    if kind == "error":
        e = msg.error
        return ErrorEvent(
            status_code_from_number(e.code), e.message, e.scope, e.utterance_index, e.speak_id, t
        )
    if kind == "dtmf":
        return Dtmf(msg.dtmf.digit, msg.dtmf.duration_ms, t)
    if kind == "quality_changed":
        q = msg.quality_changed
        return QualityChanged(tuple(q.shed), q.description, t)
    if kind == "end_of_turn":
        eot = msg.end_of_turn
        return EndOfTurn(
            eot.turn_index,
            eot.probability,
            eot.offset_ms,
            eot.text,
            eot.first_utterance_index,
            eot.last_utterance_index,
            eot.reason,
            eot.silence_ms,
            eot.latency_ms,
            t,
        )
    return None


#: The events whose message is their own attributes under the contract's field names, and
#: the ``ConverseResponse`` case each one fills (``received_s`` is ours, not the wire's).
_PLAIN_CASES: dict[type[ServerEvent], str] = {
    SessionStarted: "started",
    Transcript: "transcript",
    AudioOut: "audio",
    MarkReached: "mark",
    PlaybackInterrupted: "interrupted",
    PlaybackFinished: "playback_finished",
    QualityChanged: "quality_changed",
    EndOfTurn: "end_of_turn",
    Dtmf: "dtmf",
}


def event_to_proto(event: ServerEvent) -> pb.ConverseResponse:
    """The wire message of a typed event: the inverse of :func:`event_from_proto`.

    A bridge relays the gateway's events to a bot (``BotEvent.converse``) after reading them as
    typed events; rebuilding the message keeps the client's single reader and its status
    handling in :class:`~voxgate_client.Call` instead of a second raw reader. The fields are
    copied by name (``_common.messages.fill``, the server's outbound mapping too); a speech
    event's class becomes its type and an error's status code its number.
    """
    response = pb.ConverseResponse()
    case = _PLAIN_CASES.get(type(event))
    if case is not None:
        fill(getattr(response, case), event)
    elif isinstance(event, SpeechBegin | SpeechEnd):
        begin = isinstance(event, SpeechBegin)
        t = pb.SpeechEvent.SPEECH_BEGIN if begin else pb.SpeechEvent.SPEECH_END
        fill(response.speech, event, type=t)
    elif isinstance(event, ErrorEvent):
        fill(response.error, event, code=event.code.value[0])
    else:
        raise TypeError(f"not a server event: {event!r}")
    return response
