"""Per-call options as a typed dataclass that renders to ``voxgate.v1.SessionConfig``."""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field
from typing import Literal

from ._common.messages import fill
from ._proto import voxgate_pb2 as pb

__all__ = [
    "BargeInName",
    "CallConfig",
    "CallControls",
    "EchoHandlingName",
    "EncodingName",
    "TurnDetectionName",
    "TurnOptions",
    "VadOptions",
    "barge_in_number",
    "encoding_number",
    "new_id",
    "speak_request",
]

EncodingName = Literal["linear16", "mulaw", "alaw"]
#: What must happen for the caller to interrupt a reply (see ``CallConfig.barge_in_policy``).
BargeInName = Literal["immediate", "after_words", "never"]
EchoHandlingName = Literal["gate", "gate_aec3", "aec3"]
#: How the server decides the caller's turn is over (see :class:`TurnOptions`).
TurnDetectionName = Literal["off", "silence", "smart"]

_TURN_DETECTION = {
    "off": pb.TURN_DETECTION_OFF,
    "silence": pb.TURN_DETECTION_SILENCE,
    "smart": pb.TURN_DETECTION_SMART,
}

_ECHO_HANDLING: dict[str, pb.EchoHandling] = {
    "gate": pb.ECHO_HANDLING_GATE,
    "gate_aec3": pb.ECHO_HANDLING_GATE_AEC3,
    "aec3": pb.ECHO_HANDLING_AEC3,
}

_BARGE_IN = {
    "immediate": pb.BARGE_IN_IMMEDIATE,
    "after_words": pb.BARGE_IN_AFTER_WORDS,
    "never": pb.BARGE_IN_NEVER,
}


def _echo_handling_number(name: EchoHandlingName | None) -> pb.EchoHandling:
    """The wire value of an echo handling name (None = the server's)."""
    if name is None:
        return pb.ECHO_HANDLING_UNSPECIFIED
    try:
        return _ECHO_HANDLING[name]
    except KeyError:
        names = ", ".join(repr(n) for n in _ECHO_HANDLING)
        raise ValueError(f"echo_handling={name!r} is not one of {names}") from None


def barge_in_number(name: BargeInName | None) -> pb.BargeIn:
    """The wire value of a barge-in policy name (None = inherit: the call's or the server's)."""
    if name is None:
        return pb.BARGE_IN_UNSPECIFIED
    try:
        return _BARGE_IN[name]
    except KeyError:
        raise ValueError(
            f"barge_in={name!r} is not one of 'immediate', 'after_words', 'never'"
        ) from None


def speak_request(  # noqa: PLR0913  # the arguments of Call.speak, one to one
    text: str,
    speak_id: str,
    voice: str | None,
    rate: float | None,
    *,
    speaker_id: int,
    uninterruptible: bool,
    barge_in: BargeInName | None,
    barge_in_min_words: int,
) -> pb.ConverseRequest:
    """The ``speak`` control for ``Call.speak`` and ``ServedCall.speak`` alike.

    One builder for both, so a handler's reply means the same on a direct call and on a call a
    bridge handed to a served bot.
    """
    return pb.ConverseRequest(
        speak=pb.Speak(
            text=text,
            speak_id=speak_id,
            voice=voice or "",
            rate=rate or 0.0,
            speaker_id=speaker_id,
            uninterruptible=uninterruptible,
            barge_in=barge_in_number(barge_in),
            barge_in_min_words=barge_in_min_words,
        )
    )


def new_id() -> str:
    """A short random id for a reply or a transfer, made where the request is sent.

    Made client-side so that the sender can match the events of a reply (AudioOut,
    PlaybackFinished, PlaybackInterrupted) to it without waiting for the server.
    """
    return uuid.uuid4().hex[:12]


class CallControls:
    """The in-call controls ``Call`` and ``ServedCall`` share, spelled once.

    Both send the same ``ConverseRequest`` controls; they differ only in how a request travels
    (straight onto the gRPC stream, or as a ``BotAction`` to the bridge that holds the gateway
    call), which each supplies as :meth:`_control`. ``hangup`` and ``transfer`` stay in the
    classes: what they do beyond sending the request is not the same.
    """

    async def _control(self, request: pb.ConverseRequest) -> None:
        """Send one control on this call."""
        raise NotImplementedError

    async def speak(
        self,
        text: str,
        speak_id: str | None = None,
        voice: str | None = None,
        rate: float | None = None,
        *,
        speaker_id: int = 0,
        uninterruptible: bool = False,
        barge_in: BargeInName | None = None,
        barge_in_min_words: int = 0,
    ) -> str:
        """Queue a reply; returns its speak_id (generated here when not given).

        ``barge_in`` overrides the call's policy for this reply (``"never"`` for an
        announcement, ``"after_words"`` so that "mm-hmm" does not cut it);
        ``barge_in_min_words`` the words ``after_words`` needs.
        """
        sid = speak_id or new_id()
        await self._control(
            speak_request(
                text,
                sid,
                voice,
                rate,
                speaker_id=speaker_id,
                uninterruptible=uninterruptible,
                barge_in=barge_in,
                barge_in_min_words=barge_in_min_words,
            )
        )
        return sid

    async def clear(self) -> None:
        """Drop queued and playing replies."""
        await self._control(pb.ConverseRequest(clear=pb.Clear()))

    async def mark(self, name: str) -> None:
        """Ask for ``MarkReached`` once everything queued before it has been played."""
        await self._control(pb.ConverseRequest(mark=pb.Mark(name=name)))

    async def flush(self) -> None:
        """Finish the current utterance now, as if the caller had stopped speaking."""
        await self._control(pb.ConverseRequest(flush=pb.Flush()))

    async def dtmf(self, digit: str, duration_ms: int = 0) -> None:
        """Pass a keypad digit (0-9, *, #, A-D) into the call."""
        await self._control(pb.ConverseRequest(dtmf=pb.Dtmf(digit=digit, duration_ms=duration_ms)))


_ENCODING: dict[str, pb.Encoding] = {"linear16": pb.LINEAR16, "mulaw": pb.MULAW, "alaw": pb.ALAW}


def encoding_number(name: EncodingName) -> pb.Encoding:
    """The proto enum number of an encoding name."""
    try:
        return _ENCODING[name]
    except KeyError:
        raise ValueError(f"encoding={name!r}; use one of {', '.join(_ENCODING)}") from None


@dataclass(frozen=True, slots=True)
class VadOptions:
    """Endpointing overrides for one call; ``None``/0 keeps the server default."""

    aggressiveness: int | None = None
    frame_ms: int = 0
    start_speech_ms: int = 0
    end_silence_ms: int = 0
    min_speech_ms: int = 0
    max_utterance_ms: int = 0
    pre_roll_ms: int = 0


@dataclass(frozen=True, slots=True)
class TurnOptions:
    """End-of-turn detection for one call (``EndOfTurn`` events); None/0 = the server's.

    Attributes:
        mode: ``"off"``, ``"silence"`` (every utterance is a turn) or ``"smart"`` (silence,
            the words so far and, where the server has one, an audio end-of-turn model);
            None = the server's default.
        eagerness: ``smart``: 0..1, higher ends turns sooner (0 = the server's).
        end_silence_ms: the silence that ends a turn (``silence``), or the shortest after
            which a finished sentence may end it (``smart``); 0 = the server's.
        max_pause_ms: ``smart``: the longest pause held over an unfinished sentence.
    """

    mode: TurnDetectionName | None = None
    eagerness: float = 0.0
    end_silence_ms: int = 0
    max_pause_ms: int = 0

    def to_proto(self) -> pb.TurnDetectionOptions:
        """Render as the wire message."""
        if self.mode is not None and self.mode not in _TURN_DETECTION:
            names = ", ".join(repr(n) for n in _TURN_DETECTION)
            raise ValueError(f"turns.mode={self.mode!r} is not one of {names}")
        return pb.TurnDetectionOptions(
            mode=_TURN_DETECTION[self.mode]
            if self.mode is not None
            else pb.TURN_DETECTION_UNSPECIFIED,
            eagerness=self.eagerness,
            end_silence_ms=self.end_silence_ms,
            max_pause_ms=self.max_pause_ms,
        )


@dataclass(frozen=True, slots=True)
class CallConfig:
    """What a call sends as its first message; the server validates every field.

    Defaults describe the common case (16 kHz LINEAR16 in, the same format out, barge-in on).
    Values are not validated here: the server is the single source of truth for limits and
    answers INVALID_ARGUMENT with a sentence naming the field.

    Attributes:
        encoding: caller audio encoding.
        sample_rate_hz: caller audio rate (8000, 16000, 24000 or 48000).
        output_encoding: reply audio encoding; None = same as ``encoding``.
        output_sample_rate_hz: reply audio rate; None = same as ``sample_rate_hz``.
        interim_results: ask for interim transcripts of growing utterances.
        barge_in: stop reply playback when the caller starts speaking.
        barge_in_policy: what interrupts a reply: ``"immediate"`` (speech begins),
            ``"after_words"`` (a transcript with ``barge_in_min_words`` words that are not
            backchannels such as "mm-hmm" or "okay") or ``"never"``; None = the server's.
        barge_in_min_words: ``after_words``: words needed (0 = the server's default, 1).
        backchannels: ``after_words``: phrases that never interrupt (empty = the server's).
        echo_guard: keep the bot's own reply, echoed back by the line, from counting as the
            caller (turn off only for lines known to be echo-free).
        echo_handling: how: ``"gate"`` (silences what the reply explains at one delay),
            ``"gate_aec3"`` (the gate's echo blocks carry WebRTC's echo canceller's output
            instead of silence: a caller quieter than the echo is heard sooner) or ``"aec3"``
            (the echo canceller alone, for lines whose echo a hybrid or speakerphone spreads;
            it holds a caller back on lines with no echo); None = the server's.
        turns: end-of-turn detection (:class:`TurnOptions`); the default keeps the server's.
        boosted_phrases: ``(phrase, boost)`` pairs the decoder boosts token by token (boost
            in nats, (0, 10]; 2-6 helps a rare name): the typed form of a ``"phrase^boost"``
            entry in ``hotwords``.
    """

    encoding: EncodingName = "linear16"
    sample_rate_hz: int = 16000
    output_encoding: EncodingName | None = None
    output_sample_rate_hz: int | None = None
    interim_results: bool = False
    interim_interval_ms: int = 0
    language: str = ""
    model: str = ""
    voice: str = ""
    barge_in: bool = True
    barge_in_min_speech_ms: int = 0
    barge_in_policy: BargeInName | None = None
    barge_in_min_words: int = 0
    backchannels: tuple[str, ...] = ()
    echo_guard: bool = True
    echo_handling: EchoHandlingName | None = None
    call_id: str = ""
    word_timestamps: bool = False
    beam_size: int = 0
    max_alternatives: int = 0
    initial_prompt: str = ""
    hotwords: tuple[str, ...] = ()
    boosted_phrases: tuple[tuple[str, float], ...] = ()
    vad: VadOptions = field(default_factory=VadOptions)
    turns: TurnOptions = field(default_factory=TurnOptions)

    def to_proto(self) -> pb.SessionConfig:
        """Render as the wire message."""
        out = pb.SessionConfig(
            input_audio=pb.AudioFormat(
                encoding=encoding_number(self.encoding), sample_rate_hertz=self.sample_rate_hz
            ),
            interim_results=self.interim_results,
            interim_interval_ms=self.interim_interval_ms,
            language=self.language,
            model=self.model,
            voice=self.voice,
            barge_in=pb.BargeInConfig(
                disabled=not self.barge_in,
                min_speech_ms=self.barge_in_min_speech_ms,
                policy=barge_in_number(self.barge_in_policy),
                min_words=self.barge_in_min_words,
                backchannels=list(self.backchannels),
                echo_guard_disabled=not self.echo_guard,
                echo_handling=_echo_handling_number(self.echo_handling),
            ),
            call_id=self.call_id,
            decoding=pb.DecodingOptions(
                beam_size=self.beam_size,
                max_alternatives=self.max_alternatives,
                word_timestamps=self.word_timestamps,
                initial_prompt=self.initial_prompt,
                hotwords=list(self.hotwords),
                boosted_phrases=[
                    pb.PhraseBoost(phrase=phrase, boost=boost)
                    for phrase, boost in self.boosted_phrases
                ],
            ),
        )
        if self.output_encoding is not None:
            out.output_audio.encoding = encoding_number(self.output_encoding)
        if self.output_sample_rate_hz is not None:
            out.output_audio.sample_rate_hertz = self.output_sample_rate_hz
        fill(out.vad, self.vad)  # aggressiveness None stays unset: the server's
        if self.turns != TurnOptions():
            out.turn_detection.CopyFrom(self.turns.to_proto())
        return out
