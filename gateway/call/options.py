"""A call's settings: :class:`CallConfig`, and the typed groups its stages read.

The servicer resolves a ``CallConfig`` once, from the call's first request and the server's
configuration (gateway/wire.py); each stage takes the group it uses (:attr:`CallConfig.interims`,
:attr:`CallConfig.playback`) instead of reading loose fields.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from voxgate.common.pcm import WireEncoding
from voxgate.engines.asr.base import AsrOptions
from voxgate.gateway.barge_in import BargeInModel, BargeInPolicy
from voxgate.gateway.config import DtmfConfig, EchoCancellerName, LanguageConfig, VadConfig
from voxgate.gateway.turns import TurnOptions

__all__ = ["CallConfig", "InterimOptions", "PlaybackOptions"]


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

    results: bool
    interval_ms: int
    barge_in_interval_ms: int
    barge_in_overlap_ms: int
    barge_in_urgent: bool


@dataclass(frozen=True, slots=True)
class PlaybackOptions:
    """How a call's replies go out (:mod:`voxgate.gateway.call.playback`).

    Attributes:
        encoding: the wire encoding of the reply audio.
        rate_hz: its sample rate.
        lead_ms: how long after a frame leaves the far end plays it (the playout every
            barge-in, mark and echo account assumes).
        prebuffer_ms: a reply's first this many ms leave at once and every later frame that
            much sooner (a client that plays on arrival holds it).
    """

    encoding: WireEncoding
    rate_hz: int
    lead_ms: int
    prebuffer_ms: int


@dataclass(frozen=True, slots=True)
class CallConfig:
    """A call's effective settings, resolved and validated from its first request."""

    input_encoding: WireEncoding
    input_rate_hz: int
    output_encoding: WireEncoding
    output_rate_hz: int
    vad: VadConfig
    asr_options: AsrOptions = field(default_factory=AsrOptions)
    #: In-band DTMF detection and VAD gating; None = off (the servicer passes the server's).
    dtmf: DtmfConfig | None = None
    interim_results: bool = False
    interim_interval_ms: int = 1000
    barge_in: bool = True
    barge_in_min_speech_ms: int = 0
    #: What interrupts a reply (a Speak may override it); ``barge_in=False`` means never.
    barge_in_policy: BargeInPolicy = field(default_factory=BargeInPolicy)
    #: Interim interval while the caller talks over an ``after_words`` reply, ms.
    barge_in_interim_ms: int = 250
    #: Voiced audio after which the first such interim runs, ms.
    barge_in_first_interim_speech_ms: int = 200
    #: Schedule those interims as finals (``AsrRequest.urgent``).
    barge_in_urgent_interims: bool = True
    #: Start the next such interim this long after one still decoding, on a spare worker,
    #: at most two in flight, ms; 0 = one at a time.
    barge_in_overlap_ms: int = 0
    #: Decodes the interims only ``after_words`` reads; None = the call's own model.
    barge_in_model: BargeInModel | None = None
    #: The language the bot's voice speaks (ISO 639-1): interims only ``after_words`` reads,
    #: of a call that has no language yet (none set, none learnt, no ``interim_default``),
    #: decode in it instead of detecting one on a prefix of a few hundred ms.
    reply_language: str | None = None
    #: Suppress the echo of the bot's own replies in the caller's audio (gateway/echo.py).
    echo_guard: bool = True
    #: How: the correlation gate (``gate``), the gate with AEC3's output in its echo blocks
    #: (``gate_aec3``) or WebRTC's AEC3 alone (``aec3``).
    echo_canceller: EchoCancellerName = "gate_aec3"
    mode: Literal["converse", "recognize"] = "converse"
    playout_lead_ms: int = 60
    #: A reply's first this many ms leave at once and every later frame that much sooner
    #: (a client that plays on arrival holds it); the accounting keeps ``playout_lead_ms``.
    playout_prebuffer_ms: int = 60
    speculative_finals: bool = True
    #: How interims choose a language when ``asr_options.language`` is None (detect).
    language: LanguageConfig = field(default_factory=LanguageConfig)  # type: ignore[arg-type]
    #: End-of-turn detection (gateway/turns.py); off by default.
    turns: TurnOptions = field(default_factory=TurnOptions)

    @property
    def interims(self) -> InterimOptions:
        """The settings the interim policy reads."""
        return InterimOptions(
            results=self.interim_results,
            interval_ms=self.interim_interval_ms,
            barge_in_interval_ms=self.barge_in_interim_ms,
            barge_in_overlap_ms=self.barge_in_overlap_ms,
            barge_in_urgent=self.barge_in_urgent_interims,
        )

    @property
    def playback(self) -> PlaybackOptions:
        """The settings reply playback reads."""
        return PlaybackOptions(
            encoding=self.output_encoding,
            rate_hz=self.output_rate_hz,
            lead_ms=self.playout_lead_ms,
            prebuffer_ms=self.playout_prebuffer_ms,
        )
