"""A call's settings: :class:`CallConfig`, one typed group per stage of the call.

The servicer resolves a ``CallConfig`` once, from the call's first request and the server's
configuration (gateway/wire.py), building each group directly; each stage reads its own group
(``config.ingress``, ``config.recognition``, ``config.interims``, ``config.barge_in``,
``config.playback``). Every option is declared once, in its group, with its default.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from voxgate.common.pcm import WireEncoding
from voxgate.engines.asr.base import AsrOptions
from voxgate.gateway.barge_in import BargeInModel, BargeInPolicy
from voxgate.gateway.config import DtmfConfig, EchoCancellerName, LanguageConfig, VadConfig
from voxgate.gateway.turns import TurnOptions

__all__ = [
    "BargeInOptions",
    "CallConfig",
    "IngressOptions",
    "InterimOptions",
    "PlaybackOptions",
    "RecognitionOptions",
]


@dataclass(frozen=True, slots=True)
class IngressOptions:
    """How a call's audio comes in (:mod:`voxgate.gateway.call.ingress`).

    Attributes:
        encoding: the wire encoding of the caller's audio.
        rate_hz: its sample rate.
        dtmf: in-band DTMF detection and VAD gating; None = off (the servicer passes the
            server's).
        echo_guard: suppress the echo of the bot's own replies in the caller's audio
            (gateway/echo.py).
        echo_canceller: how: the correlation gate (``gate``), the gate with AEC3's output in
            its echo blocks (``gate_aec3``) or WebRTC's AEC3 alone (``aec3``).
    """

    encoding: WireEncoding
    rate_hz: int
    dtmf: DtmfConfig | None = None
    echo_guard: bool = True
    echo_canceller: EchoCancellerName = "gate_aec3"


@dataclass(frozen=True, slots=True)
class RecognitionOptions:
    """How a call's speech is recognised (:mod:`voxgate.gateway.call.recognition`).

    Attributes:
        asr_options: the call's decode options (language, task, beam, hotwords, model).
        speculative_finals: start a final's decode before its utterance has settled.
        language: how interims choose a language when ``asr_options.language`` is None
            (detect).
        turns: end-of-turn detection (gateway/turns.py); off by default.
    """

    asr_options: AsrOptions = field(default_factory=AsrOptions)
    speculative_finals: bool = True
    language: LanguageConfig = field(default_factory=LanguageConfig)  # type: ignore[arg-type]
    turns: TurnOptions = field(default_factory=TurnOptions)


@dataclass(frozen=True, slots=True)
class InterimOptions:
    """When a call's interim decodes run (:mod:`voxgate.gateway.call.interims`).

    Attributes:
        results: the client asked for interim transcripts.
        interval_ms: their interval.
        barge_in_interval_ms: the interval while the caller talks over an ``after_words`` reply.
        barge_in_overlap_ms: there, start the next interim this long after one still decoding,
            on a spare worker, at most two in flight; 0 = one at a time.
        barge_in_urgent: schedule those interims as finals (``AsrRequest.urgent``).
    """

    results: bool = False
    interval_ms: int = 1000
    barge_in_interval_ms: int = 250
    barge_in_overlap_ms: int = 0
    barge_in_urgent: bool = True


@dataclass(frozen=True, slots=True)
class BargeInOptions:
    """When the caller heard over a reply stops it (:mod:`voxgate.gateway.call.barge_in`).

    Attributes:
        enabled: barge-in is on; False means a reply is never interrupted.
        min_speech_ms: the caller's speech a reply must hear before it stops, ms.
        policy: what interrupts a reply (a Speak may override it).
        first_interim_speech_ms: voiced audio after which the first interim over an
            ``after_words`` reply runs, ms.
        model: decodes the interims only ``after_words`` reads; None = the call's own model.
        reply_language: the language the bot's voice speaks (ISO 639-1): interims only
            ``after_words`` reads, of a call that has no language yet (none set, none learnt,
            no ``interim_default``), decode in it instead of detecting one on a prefix of a
            few hundred ms.
    """

    enabled: bool = True
    min_speech_ms: int = 0
    policy: BargeInPolicy = field(default_factory=BargeInPolicy)
    first_interim_speech_ms: int = 200
    model: BargeInModel | None = None
    reply_language: str | None = None


@dataclass(frozen=True, slots=True)
class PlaybackOptions:
    """How a call's replies go out (:mod:`voxgate.gateway.call.playback`).

    Attributes:
        encoding: the wire encoding of the reply audio.
        rate_hz: its sample rate.
        lead_ms: how long after a frame leaves the far end plays it (the playout every
            barge-in, mark and echo account assumes).
        prebuffer_ms: a reply's first this many ms leave at once and every later frame that
            much sooner (a client that plays on arrival holds it); the accounting keeps
            ``lead_ms``.
    """

    encoding: WireEncoding
    rate_hz: int
    lead_ms: int = 60
    prebuffer_ms: int = 60


@dataclass(frozen=True, slots=True)
class CallConfig:
    """A call's effective settings, resolved and validated from its first request.

    Attributes:
        ingress: the caller's audio in.
        playback: the replies out.
        vad: voice activity detection, which the segmenter (and barge-in's speech count) use.
        mode: ``converse`` plays replies; ``recognize`` only transcribes.
        recognition: finals, their language and turns.
        interims: when interims run.
        barge_in: when the caller stops a reply.
    """

    ingress: IngressOptions
    playback: PlaybackOptions
    vad: VadConfig
    mode: Literal["converse", "recognize"] = "converse"
    recognition: RecognitionOptions = field(default_factory=RecognitionOptions)
    interims: InterimOptions = field(default_factory=InterimOptions)
    barge_in: BargeInOptions = field(default_factory=BargeInOptions)
