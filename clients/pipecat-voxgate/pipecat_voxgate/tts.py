"""Pipecat TTS over voxgate's ``Synthesize``: one server-streaming RPC per sentence.

Audio is requested in the pipeline's own output format (16-bit PCM at ``self.sample_rate``),
so the server's resampler (soxr, per stream) does the conversion once and nothing is
resampled here. A rate the gateway does not serve (it speaks 8, 16, 24 and 48 kHz) is
requested at 48 kHz and resampled by Pipecat's resampler.

Word timestamps: voxgate reports, for each chunk, the words whose audio *ends* in it. Pipecat
wants each word's *start*, relative to the first audio of the turn; a word starts where the
previous one ended (the first at 0), and sentences of one turn follow each other, so the
service keeps a running offset per turn context.

Interruption: Pipecat cancels the task running :meth:`run_tts` when the user barges in; the
cancellation leaves the RPC's iteration, whose ``finally`` cancels the call, so the server
stops synthesising at once (``tests/test_pipecat_voxgate.py`` checks the server side).
"""

from __future__ import annotations

from collections.abc import AsyncGenerator
from dataclasses import dataclass, field
from typing import Any

import grpc
from pipecat.frames.frames import (
    CancelFrame,
    EndFrame,
    ErrorFrame,
    Frame,
    StartFrame,
    TTSAudioRawFrame,
)
from pipecat.services.settings import TTSSettings
from pipecat.services.tts_service import TTSService
from pipecat.utils.errors import ErrorCategory
from pipecat.utils.types import NOT_GIVEN, NotGiven

from voxgate_client import VoiceInfo, VoxgateClient, VoxgateError

from ._errors import error_category

__all__ = ["SERVED_RATES_HZ", "VoxgateTTSService", "VoxgateTTSSettings"]

#: Output rates the gateway synthesises to directly.
SERVED_RATES_HZ = (8000, 16000, 24000, 48000)


@dataclass
class VoxgateTTSSettings(TTSSettings):
    """Runtime-updatable settings (``TTSUpdateSettingsFrame(delta=VoxgateTTSSettings(...))``).

    ``voice`` is a voice the server lists (None = its default); ``model`` and ``language`` are
    inherited and unused (a voxgate voice fixes both).

    Parameters:
        rate: speaking rate, 1.0 normal (0 or None = the voice's default).
        speaker_id: speaker of a multi-speaker voice.
    """

    rate: float | None | NotGiven = field(default_factory=lambda: NOT_GIVEN)
    speaker_id: int | NotGiven = field(default_factory=lambda: NOT_GIVEN)


class VoxgateTTSService(TTSService):
    """Streaming text-to-speech from a voxgate gateway.

    Args:
        target: ``host:port`` of the gateway.
        tls: False (plaintext), True (system roots) or ``grpc.ChannelCredentials``.
        token: bearer token, when the gateway requires one.
        settings: initial :class:`VoxgateTTSSettings`.
        **kwargs: passed to Pipecat's ``TTSService`` (``sample_rate``, text aggregation...).
    """

    Settings = VoxgateTTSSettings
    _settings: VoxgateTTSSettings

    def __init__(
        self,
        *,
        target: str,
        tls: bool | grpc.ChannelCredentials = False,
        token: str | None = None,
        settings: VoxgateTTSSettings | None = None,
        **kwargs: Any,
    ) -> None:
        defaults = VoxgateTTSSettings(
            model=None, voice=None, language=None, rate=None, speaker_id=0
        )
        if settings is not None:
            defaults.apply_update(settings)
        # push_text_frames=False: the words come out as TTSTextFrames timed by the server's
        # word alignment (add_word_timestamps), not as one untimed frame per sentence.
        super().__init__(
            push_start_frame=True,
            push_stop_frames=True,
            push_text_frames=False,
            settings=defaults,
            **kwargs,
        )
        self._target = target
        self._tls = tls
        self._token = token
        self._client: VoxgateClient | None = None
        self._turn_context: str | None = None
        self._turn_offset_s = 0.0
        #: Synthesize streams this service has open (0 or 1); tests read it.
        self.open_streams = 0

    def can_generate_metrics(self) -> bool:
        """TTFB (request -> first audio) and usage metrics are reported."""
        return True

    def _classify_error(self, exception: Exception) -> ErrorCategory | None:
        """Pipecat categories of gRPC statuses (a refused voice is permanent)."""
        return error_category(exception)

    async def list_voices(self) -> list[VoiceInfo]:
        """The voices the gateway serves (``ListVoices``); any one's ``name`` is a ``voice``.

        Each has ``name``, ``language``, ``sample_rate_hertz``, ``num_speakers`` and
        ``is_default``. Works before the pipeline starts too (on a channel of its own).

        Raises:
            VoxgateError: the gateway refused or could not be reached.
        """
        if self._client is not None:
            return await self._client.list_voices()
        async with VoxgateClient(self._target, self._tls, self._token) as client:
            return await client.list_voices()

    async def start(self, frame: StartFrame) -> None:
        """Open the channel (streams open per sentence)."""
        await super().start(frame)
        self._client = VoxgateClient(self._target, self._tls, self._token)

    async def stop(self, frame: EndFrame) -> None:
        """Close the channel after the last sentence."""
        await super().stop(frame)
        await self._close()

    async def cancel(self, frame: CancelFrame) -> None:
        """Close the channel now (any open stream is cancelled with it)."""
        await super().cancel(frame)
        await self._close()

    async def _close(self) -> None:
        client, self._client = self._client, None
        if client is not None:
            await client.aclose()

    async def run_tts(self, text: str, context_id: str) -> AsyncGenerator[Frame | None, None]:
        """Stream one sentence; word times are offset to the turn's audio clock."""
        if self._client is None:
            yield ErrorFrame(error="voxgate TTS used before the pipeline started")
            return
        if context_id != self._turn_context:
            self._turn_context, self._turn_offset_s = context_id, 0.0
        rate = self.sample_rate
        wire_rate = rate if rate in SERVED_RATES_HZ else 48000
        s = self._settings
        await self.start_tts_usage_metrics(text)
        previous_end_s = 0.0
        sentence_s = 0.0
        stream = self._client.synthesize(
            text,
            voice=s.voice if isinstance(s.voice, str) else "",
            rate=s.rate if isinstance(s.rate, float) else None,
            speaker_id=s.speaker_id if isinstance(s.speaker_id, int) else 0,
            encoding="linear16",
            sample_rate_hz=wire_rate,
        )
        self.open_streams += 1
        try:
            async for chunk in stream:
                if chunk.data:
                    audio = chunk.data
                    if wire_rate != rate:
                        audio = await self._resampler.resample(audio, wire_rate, rate)
                    sentence_s += len(chunk.data) / (2 * wire_rate)
                    yield TTSAudioRawFrame(audio, rate, 1, context_id=context_id)
                if chunk.words:
                    times = []
                    for word, end_ms in chunk.words:
                        times.append((word, self._turn_offset_s + previous_end_s))
                        previous_end_s = end_ms / 1000.0
                    await self.add_word_timestamps(times, context_id)
        except VoxgateError as exc:
            yield ErrorFrame(error=f"voxgate: {exc}", exception=exc)
        finally:
            # Closing the client's iterator cancels the RPC: on an interruption this runs as
            # Pipecat cancels run_tts, whether it was waiting on the server or on the pipeline.
            await stream.aclose()
            self.open_streams -= 1
            self._turn_offset_s += sentence_s
