"""Pipecat STT over voxgate's ``StreamingRecognize``: one gRPC stream per pipeline.

Modelled on Pipecat's own streaming services: audio goes out as it arrives (``run_stt`` yields
nothing; results arrive on a reader task, as in the Riva and Deepgram services), interim and
final transcripts become ``InterimTranscriptionFrame`` / ``TranscriptionFrame`` whose ``result``
is the voxgate :class:`~voxgate_client.Transcript` (word times in ms, confidence, language).

Turns, two ways (the ``server_turns`` argument):

* ``False`` (default, Pipecat decides): the pipeline's own VAD and turn strategies rule. When
  they say the user stopped (``VADUserStoppedSpeakingFrame``), the service sends voxgate's
  ``Flush`` so the utterance is finalised at once instead of after the server's own trailing
  silence, and the final is marked ``finalized`` (Pipecat's STT TTFB is measured to it), the
  same as the Deepgram service's ``Finalize``.
* ``True`` (voxgate decides): the server's VAD events are offered to the pipeline's turn logic
  as ``ProposedUserStartedSpeakingFrame`` (on speech begin) and
  ``ProposedUserStoppedSpeakingFrame`` (after the utterance's final), and the service asks for
  ``ExternalUserTurnStrategies`` in its metadata, as Pipecat's Gladia and Soniox services do.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator
from dataclasses import dataclass, field
from typing import Any

import grpc
from loguru import logger
from pipecat.audio.utils import create_stream_resampler
from pipecat.frames.frames import (
    CancelFrame,
    EndFrame,
    ErrorFrame,
    Frame,
    InterimTranscriptionFrame,
    ProposedUserStartedSpeakingFrame,
    ProposedUserStoppedSpeakingFrame,
    StartFrame,
    STTMetadataFrame,
    TranscriptionFrame,
    VADUserStoppedSpeakingFrame,
)
from pipecat.processors.frame_processor import FrameDirection
from pipecat.services.settings import STTSettings
from pipecat.services.stt_service import STTService
from pipecat.transcriptions.language import Language
from pipecat.turns.user_turn_strategies import ExternalUserTurnStrategies
from pipecat.utils.time import time_now_iso8601
from pipecat.utils.types import NOT_GIVEN, NotGiven
from voxgate_client import (
    Call,
    CallConfig,
    CallEndedError,
    ErrorEvent,
    QualityChanged,
    SessionStarted,
    SpeechBegin,
    Transcript,
    VadOptions,
    VoxgateClient,
    VoxgateError,
)

__all__ = ["VoxgateSTTService", "VoxgateSTTSettings"]

#: Input rates the gateway takes as they are; others are resampled to 16 kHz here.
SERVED_RATES_HZ = (8000, 16000, 24000, 48000)

#: How long ``stop`` waits for the finals of audio still in flight after the hangup, s.
DRAIN_TIMEOUT_S = 30.0

#: Measured on the bundled base model on 2 CPU cores (benchmarks/framework_latency.py): p99 of
#: end of speech -> final through this service. Override with ``ttfs_p99_latency``.
DEFAULT_TTFS_P99_S = 1.0


@dataclass
class VoxgateSTTSettings(STTSettings):
    """Runtime-updatable settings (``STTUpdateSettingsFrame(delta=VoxgateSTTSettings(...))``).

    ``model`` and ``language`` are inherited (a model name the server lists; a Pipecat
    ``Language`` or a code such as ``"en"``; None = the server's default / detection).
    A change restarts the recognition stream with the new config.

    Parameters:
        hotwords: words or phrases to bias recognition towards (Whisper hotwords).
        initial_prompt: decoding prompt (context, spelling of names).
        interim_results: ask for interim transcripts of the growing utterance.
        end_silence_ms: the server VAD's trailing silence before it ends an utterance on its
            own (0 = server default).
    """

    hotwords: list[str] | NotGiven = field(default_factory=lambda: NOT_GIVEN)
    initial_prompt: str | NotGiven = field(default_factory=lambda: NOT_GIVEN)
    interim_results: bool | NotGiven = field(default_factory=lambda: NOT_GIVEN)
    end_silence_ms: int | NotGiven = field(default_factory=lambda: NOT_GIVEN)


class VoxgateSTTService(STTService):
    """Streaming speech-to-text from a voxgate gateway.

    Args:
        target: ``host:port`` of the gateway.
        tls: False (plaintext), True (system roots) or ``grpc.ChannelCredentials``.
        token: bearer token, when the gateway requires one.
        server_turns: let voxgate's VAD propose turn starts and stops (see module docstring).
        settings: initial :class:`VoxgateSTTSettings`.
        **kwargs: passed to Pipecat's ``STTService`` (``sample_rate``, ``audio_passthrough``,
            ``ttfs_p99_latency``...).
    """

    Settings = VoxgateSTTSettings
    _settings: VoxgateSTTSettings

    def __init__(
        self,
        *,
        target: str,
        tls: bool | grpc.ChannelCredentials = False,
        token: str | None = None,
        server_turns: bool = False,
        settings: VoxgateSTTSettings | None = None,
        **kwargs: Any,
    ) -> None:
        defaults = VoxgateSTTSettings(
            model=None,
            language=None,
            hotwords=[],
            initial_prompt="",
            interim_results=True,
            end_silence_ms=0,
        )
        if settings is not None:
            defaults.apply_update(settings)
        kwargs.setdefault("ttfs_p99_latency", DEFAULT_TTFS_P99_S)
        super().__init__(settings=defaults, **kwargs)
        self._target = target
        self._tls = tls
        self._token = token
        self._server_turns = server_turns
        self._client: VoxgateClient | None = None
        self._call: Call | None = None
        self._reader: asyncio.Task[None] | None = None
        #: Utterances begun whose final has not arrived: the proposed turn is open while any is.
        self._open_utterances: set[int] = set()
        self._resampler = create_stream_resampler()
        #: ``SessionStarted`` of every stream opened, oldest first (the server's effective
        #: config of each, e.g. after a settings change restarted the stream).
        self.sessions: list[SessionStarted] = []

    # -- Pipecat hooks ---------------------------------------------------------------------------

    def can_generate_metrics(self) -> bool:
        """TTFB (speech end -> final) and usage metrics are reported."""
        return True

    def language_to_service_language(self, language: Language) -> str | None:
        """Whisper takes a bare ISO 639-1 code: ``Language.EN_US`` -> ``"en"``."""
        return str(language.value).split("-")[0].lower()

    def service_metadata_frame(self) -> STTMetadataFrame:
        """With ``server_turns``, ask the turn logic to follow this service's proposals."""
        frame = super().service_metadata_frame()
        if self._server_turns:
            frame.user_turn_strategies = ExternalUserTurnStrategies()
        return frame

    async def start(self, frame: StartFrame) -> None:
        """Open the channel and the recognition stream at the pipeline's input rate."""
        await super().start(frame)
        self._client = VoxgateClient(self._target, self._tls, self._token)
        await self._open_stream()

    async def stop(self, frame: EndFrame) -> None:
        """Graceful end: hang up, so the server finalises the open utterance, and wait for it.

        The finals are pushed before the ``EndFrame`` continues downstream.
        """
        if self._call is not None and self._reader is not None:
            try:
                await self._call.hangup()
                await asyncio.wait_for(asyncio.shield(self._reader), DRAIN_TIMEOUT_S)
            except (VoxgateError, CallEndedError, TimeoutError) as exc:
                logger.warning(f"{self}: stream did not end cleanly: {exc!r}")
        await self._close()
        await super().stop(frame)

    async def cancel(self, frame: CancelFrame) -> None:
        """Immediate end: cancel the stream."""
        await self._close()
        await super().cancel(frame)

    async def run_stt(self, audio: bytes) -> AsyncGenerator[Frame | None, None]:
        """Send the audio; results arrive on the reader task."""
        if self._call is not None and not self._call.done:
            if self.sample_rate != self._wire_rate:
                audio = await self._resampler.resample(audio, self.sample_rate, self._wire_rate)
            try:
                await self._call.send_audio(audio)
            except VoxgateError as exc:
                yield ErrorFrame(error=f"voxgate: {exc}")
            except CallEndedError:
                pass  # the stream just ended; the reader reports why
        yield None

    async def process_frame(self, frame: Frame, direction: FrameDirection) -> None:
        """The pipeline's end of the user's speech finalises the utterance now (Flush)."""
        await super().process_frame(frame, direction)
        if (
            isinstance(frame, VADUserStoppedSpeakingFrame)
            and not self._server_turns
            and self._call is not None
            and not self._call.done
        ):
            self.request_finalize()  # type: ignore[no-untyped-call]
            try:
                await self._call.flush()
            except (VoxgateError, CallEndedError) as exc:
                await self.push_error(f"voxgate flush failed: {exc}")

    # Pipecat narrows the argument to STTSettings itself (STTService._update_settings).
    async def _update_settings(self, delta: STTSettings) -> dict[str, Any]:  # type: ignore[override]
        changed = await super()._update_settings(delta)
        if changed and self._client is not None:
            # Every setting is part of the stream's first message: a new stream applies it.
            await self._close_stream()
            await self._open_stream()
        return changed

    # -- the stream ------------------------------------------------------------------------------

    @property
    def _wire_rate(self) -> int:
        return self.sample_rate if self.sample_rate in SERVED_RATES_HZ else 16000

    def call_config(self) -> CallConfig:
        """The voxgate config the current settings describe (public for tests and logs)."""
        s = self._settings
        language = s.language if isinstance(s.language, str) else None
        return CallConfig(
            encoding="linear16",
            sample_rate_hz=self._wire_rate,
            interim_results=bool(s.interim_results),
            language=language or "",
            model=s.model if isinstance(s.model, str) else "",
            word_timestamps=True,
            hotwords=tuple(s.hotwords) if isinstance(s.hotwords, list) else (),
            initial_prompt=s.initial_prompt if isinstance(s.initial_prompt, str) else "",
            vad=VadOptions(
                end_silence_ms=s.end_silence_ms if isinstance(s.end_silence_ms, int) else 0
            ),
        )

    async def _open_stream(self) -> None:
        assert self._client is not None
        try:
            self._call = await self._client.recognize(self.call_config())
        except VoxgateError as exc:
            await self.push_error(f"voxgate refused the stream: {exc}", fatal=True)
            return
        if self._call.session is not None:
            self.sessions.append(self._call.session)
        await self._call_event_handler("on_connected")
        self._reader = self.create_task(self._read(self._call), name="voxgate-stt-reader")

    async def _close_stream(self) -> None:
        call, self._call = self._call, None
        reader, self._reader = self._reader, None
        if call is not None:
            await call.aclose()
        if reader is not None:
            await self.cancel_task(reader)

    async def _close(self) -> None:
        await self._close_stream()
        client, self._client = self._client, None
        if client is not None:
            await client.aclose()
            await self._call_event_handler("on_disconnected")

    async def _read(self, call: Call) -> None:
        try:
            async for event in call:
                if isinstance(event, SpeechBegin):
                    await self._speech_began(event.utterance_index)
                elif isinstance(event, Transcript):
                    await self._transcript(event)
                elif isinstance(event, ErrorEvent):
                    # One utterance failed; the stream goes on.
                    await self.push_error(f"voxgate: {event.code.name}: {event.message}")
                elif isinstance(event, QualityChanged):
                    # The server sheds quality past its capacity (interims, word times...):
                    # say so, rather than let the pipeline wonder where its interims went.
                    logger.warning(
                        f"{self}: voxgate server quality: "
                        f"{', '.join(event.shed) or 'full'} ({event.description})"
                    )
        except VoxgateError as exc:
            await self.push_error(f"voxgate stream ended: {exc}")
            await self._call_event_handler("on_connection_error", str(exc))

    async def _speech_began(self, utterance: int) -> None:
        # Utterances overlap on the wire: the next one can begin before the previous one's
        # final is decoded. One proposed turn spans them all.
        if not self._server_turns:
            return
        was_open = bool(self._open_utterances)
        self._open_utterances.add(utterance)
        if not was_open:
            await self.broadcast_frame(ProposedUserStartedSpeakingFrame)

    async def _transcript(self, t: Transcript) -> None:
        language = _language(t.language)
        if not t.is_final:
            if t.text:
                await self.push_frame(
                    InterimTranscriptionFrame(
                        t.text, self._user_id, time_now_iso8601(), language, result=t
                    )
                )
            return
        # The first final after a Flush is the one that Flush produced.
        self.confirm_finalize()  # type: ignore[no-untyped-call]
        if t.text:
            await self.emit_stt_usage_metrics()  # type: ignore[no-untyped-call]
            await self.push_frame(
                TranscriptionFrame(t.text, self._user_id, time_now_iso8601(), language, result=t)
            )
        else:
            # A flushed utterance that held no words still ends the TTFB measurement.
            await self.stop_ttfb_metrics()
        if self._server_turns and t.utterance_index in self._open_utterances:
            self._open_utterances.discard(t.utterance_index)
            if not self._open_utterances:
                await self.broadcast_frame(ProposedUserStoppedSpeakingFrame)


def _language(code: str) -> Language | None:
    try:
        return Language(code) if code else None
    except ValueError:
        return None
