"""``voxgate.TTS``: LiveKit's TTS over voxgate's ``Synthesize`` (chunked and streamed).

``synthesize(text)`` is one ``Synthesize`` RPC (a ``ChunkedStream``). ``stream()`` takes text
as an LLM produces it, cuts it into sentences with LiveKit's own sentence tokenizer and runs
one RPC per sentence in order, so the first sentence is heard while the rest is still being
written; ``flush()`` ends a segment. Both report word-aligned transcripts (the
``aligned_transcript`` capability): voxgate gives each word's end time within its request; a
word starts where the previous one ended. Closing a stream (LiveKit does on an interruption)
cancels the RPC in flight, so the server stops synthesising at once.

The server synthesises to 8, 16, 24 and 48 kHz itself; any other ``sample_rate`` (22.05 or
44.1 kHz) is requested at the next served rate up and resampled here with LiveKit's resampler,
as LiveKit's own plugins resample. ``update_options`` changes the voice, rate and speaker for
the next RPC, so a running ``stream()`` speaks its next sentence with them.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, replace
from typing import Literal

import grpc
from livekit import rtc
from livekit.agents import (
    DEFAULT_API_CONNECT_OPTIONS,
    APIConnectOptions,
    APITimeoutError,
    tokenize,
    tts,
    utils,
)
from livekit.agents.types import NOT_GIVEN, NotGivenOr, TimedString
from livekit.agents.utils import is_given

from voxgate_client import VoiceInfo, VoxgateClient, VoxgateError

from ._errors import api_error

__all__ = ["TTS", "ChunkedStream", "SynthesizeStream"]

SERVED_RATES_HZ = (8000, 16000, 24000, 48000)


@dataclass(frozen=True)
class _Options:
    voice: str
    rate: float | None
    speaker_id: int
    sample_rate: int


class TTS(tts.TTS[Literal["metrics_collected", "error"]]):
    """Text-to-speech from a voxgate gateway.

    Args:
        target: ``host:port`` of the gateway.
        tls: False (plaintext), True (system roots) or ``grpc.ChannelCredentials``.
        token: bearer token, when the gateway requires one.
        voice: a voice the server lists; empty = its default.
        rate: speaking rate (1.0 normal; None = the voice's default).
        speaker_id: speaker of a multi-speaker voice.
        sample_rate: output rate: 8, 16, 24 or 48 kHz are synthesised to by the server, any
            other (22.05, 44.1 kHz) is resampled here from the next served rate up.
        sentence_tokenizer: how ``stream()`` cuts text (LiveKit's blingfire one by default).
    """

    def __init__(
        self,
        *,
        target: str = "127.0.0.1:50051",
        tls: bool | grpc.ChannelCredentials = False,
        token: str | None = None,
        voice: str = "",
        rate: float | None = None,
        speaker_id: int = 0,
        sample_rate: int = 24000,
        sentence_tokenizer: tokenize.SentenceTokenizer | None = None,
    ) -> None:
        if not 0 < sample_rate <= 192_000:
            raise ValueError(f"sample_rate={sample_rate}; a rate in Hz, e.g. 24000")
        super().__init__(
            capabilities=tts.TTSCapabilities(streaming=True, aligned_transcript=True),
            sample_rate=sample_rate,
            num_channels=1,
        )
        self._target, self._tls, self._token = target, tls, token
        self._opts = _Options(voice, rate, speaker_id, sample_rate)
        self._tokenizer = sentence_tokenizer or tokenize.blingfire.SentenceTokenizer(
            retain_format=True
        )
        self._client: VoxgateClient | None = None
        self._streams: set[SynthesizeStream] = set()
        #: Synthesize RPCs this TTS has open right now (tests read it).
        self.open_rpcs = 0

    @property
    def model(self) -> str:
        """The voice ("default" = the server's)."""
        return self._opts.voice or "default"

    @property
    def provider(self) -> str:
        """Reported in LiveKit's metrics metadata."""
        return "voxgate"

    def _ensure_client(self) -> VoxgateClient:
        if self._client is None:
            self._client = VoxgateClient(self._target, self._tls, self._token)
        return self._client

    @property
    def _wire_rate(self) -> int:
        """The rate the server synthesises to: ours, or the next served one up."""
        rate = self._opts.sample_rate
        return next((r for r in SERVED_RATES_HZ if r >= rate), SERVED_RATES_HZ[-1])

    def update_options(
        self,
        *,
        voice: NotGivenOr[str] = NOT_GIVEN,
        rate: NotGivenOr[float | None] = NOT_GIVEN,
        speaker_id: NotGivenOr[int] = NOT_GIVEN,
    ) -> None:
        """Change the voice (one :meth:`list_voices` names), speaking rate or speaker.

        Every RPC from now on uses them: a running ``stream()`` speaks its next sentence so.
        """
        o = self._opts
        self._opts = replace(
            o,
            voice=voice if is_given(voice) else o.voice,
            rate=rate if is_given(rate) else o.rate,
            speaker_id=speaker_id if is_given(speaker_id) else o.speaker_id,
        )

    async def list_voices(self) -> list[VoiceInfo]:
        """The voices the gateway serves (``ListVoices``); any one's ``name`` is a ``voice``.

        Each has ``name``, ``language``, ``sample_rate_hertz``, ``num_speakers`` and
        ``is_default``.

        Raises:
            APIError: the gateway refused or could not be reached.
        """
        try:
            return await self._ensure_client().list_voices()
        except VoxgateError as exc:
            raise api_error(exc, "ListVoices") from exc

    def synthesize(
        self, text: str, *, conn_options: APIConnectOptions = DEFAULT_API_CONNECT_OPTIONS
    ) -> ChunkedStream:
        """One text, one RPC."""
        return ChunkedStream(tts=self, input_text=text, conn_options=conn_options)

    def stream(
        self, *, conn_options: APIConnectOptions = DEFAULT_API_CONNECT_OPTIONS
    ) -> SynthesizeStream:
        """Text in as it is written (``push_text``/``flush``/``end_input``), audio out."""
        s = SynthesizeStream(tts=self, conn_options=conn_options)
        self._streams.add(s)
        return s

    async def _speak(
        self, text: str, emitter: tts.AudioEmitter, conn: APIConnectOptions, offset_s: float
    ) -> float:
        """Synthesise ``text`` into ``emitter``; returns the seconds of audio pushed."""
        o = self._opts
        wire_rate = self._wire_rate
        stream = self._ensure_client().synthesize(
            text,
            voice=o.voice,
            rate=o.rate,
            speaker_id=o.speaker_id,
            encoding="linear16",
            sample_rate_hz=wire_rate,
        )
        # One resampler per RPC: its audio is one continuous signal.
        resampler = (
            rtc.AudioResampler(wire_rate, o.sample_rate, quality=rtc.AudioResamplerQuality.HIGH)
            if wire_rate != o.sample_rate
            else None
        )

        def push(data: bytes) -> float:
            if resampler is None:
                emitter.push(data)
                return len(data) / (2 * o.sample_rate)
            frames = resampler.push(bytearray(data)) if data else resampler.flush()
            for f in frames:
                emitter.push(bytes(f.data))
            return sum(f.samples_per_channel for f in frames) / o.sample_rate

        pushed_s = 0.0
        previous_end_s = 0.0
        self.open_rpcs += 1
        try:
            first = True
            while True:
                try:
                    if first:
                        # The connect timeout bounds the wait for the first audio only.
                        chunk = await asyncio.wait_for(anext(stream), conn.timeout)
                        first = False
                    else:
                        chunk = await anext(stream)
                except StopAsyncIteration:
                    break
                except TimeoutError:
                    raise APITimeoutError(f"voxgate: no audio within {conn.timeout:g} s") from None
                if chunk.words:
                    emitter.push_timed_transcript(
                        [
                            TimedString(
                                f"{word} ",
                                start_time=offset_s + previous_end_s,
                                end_time=offset_s + (previous_end_s := end_ms / 1000),
                            )
                            for word, end_ms in chunk.words
                        ]
                    )
                if chunk.data:
                    pushed_s += push(chunk.data)
            if resampler is not None:
                pushed_s += push(b"")  # what the resampler still holds
        except VoxgateError as exc:
            raise api_error(exc, "Synthesize") from exc
        finally:
            await stream.aclose()  # cancels the RPC when we stop early
            self.open_rpcs -= 1
        return pushed_s

    async def aclose(self) -> None:
        """Close every open stream, then the channel."""
        for s in list(self._streams):
            await s.aclose()
        self._streams.clear()
        client, self._client = self._client, None
        if client is not None:
            await client.aclose()


class ChunkedStream(tts.ChunkedStream):
    """``TTS.synthesize``: one ``Synthesize`` RPC."""

    def __init__(self, *, tts: TTS, input_text: str, conn_options: APIConnectOptions) -> None:
        super().__init__(tts=tts, input_text=input_text, conn_options=conn_options)
        self._voxgate = tts

    async def _run(self, output_emitter: tts.AudioEmitter) -> None:
        output_emitter.initialize(
            request_id=utils.shortuuid(),
            sample_rate=self._voxgate.sample_rate,
            num_channels=1,
            mime_type="audio/pcm",
        )
        await self._voxgate._speak(self._input_text, output_emitter, self._conn_options, 0.0)


class SynthesizeStream(tts.SynthesizeStream):
    """``TTS.stream``: sentences as they complete, one RPC each, in order."""

    def __init__(self, *, tts: TTS, conn_options: APIConnectOptions) -> None:
        super().__init__(tts=tts, conn_options=conn_options)
        self._voxgate = tts

    async def aclose(self) -> None:
        """Stop now: the RPC in flight is cancelled with the task."""
        await super().aclose()
        self._voxgate._streams.discard(self)

    async def _run(self, output_emitter: tts.AudioEmitter) -> None:
        output_emitter.initialize(
            request_id=utils.shortuuid(),
            sample_rate=self._voxgate.sample_rate,
            num_channels=1,
            mime_type="audio/pcm",
            stream=True,
        )
        sentences = self._voxgate._tokenizer.stream()

        async def forward() -> None:
            async for data in self._input_ch:
                if isinstance(data, self._FlushSentinel):
                    sentences.flush()
                else:
                    sentences.push_text(data)
            sentences.end_input()

        async def speak() -> None:
            segment_open = False
            offset_s = 0.0
            async for ev in sentences:
                text = ev.token.strip()
                if not text:
                    continue
                if not segment_open:
                    output_emitter.start_segment(segment_id=utils.shortuuid())
                    segment_open = True
                self._mark_started()
                offset_s += await self._voxgate._speak(
                    text, output_emitter, self._conn_options, offset_s
                )
                output_emitter.flush()
            if segment_open:
                output_emitter.end_segment()

        tasks = [asyncio.create_task(forward()), asyncio.create_task(speak())]
        try:
            await asyncio.gather(*tasks)
        finally:
            await sentences.aclose()
            await utils.aio.cancel_and_wait(*tasks)
