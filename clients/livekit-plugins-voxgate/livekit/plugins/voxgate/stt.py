"""``voxgate.STT``: LiveKit's streaming STT over voxgate's ``StreamingRecognize``.

One gRPC stream per ``RecognizeStream``; audio frames are sent as pushed (resampled by LiveKit
to ``sample_rate`` first), ``flush()`` becomes voxgate's ``Flush`` (finish the utterance now:
the ``manual_flush`` capability), ``end_input()`` a hangup (the open utterance still gets its
final). Events follow LiveKit's order: START_OF_SPEECH on voxgate's speech begin, INTERIM
transcripts, RECOGNITION_USAGE (audio seconds since the last one) then FINAL_TRANSCRIPT with
word-aligned ``TimedString``s, then END_OF_SPEECH (voxgate sends its speech end *before* the
final; LiveKit's turn logic expects the final first, as its own inference STT sends them).
"""

from __future__ import annotations

import asyncio
import contextlib
from dataclasses import dataclass, replace
from typing import Literal

import grpc
from livekit import rtc
from livekit.agents import (
    DEFAULT_API_CONNECT_OPTIONS,
    APIConnectOptions,
    APITimeoutError,
    LanguageCode,
    stt,
    utils,
)
from livekit.agents.types import NOT_GIVEN, NotGivenOr, TimedString
from livekit.agents.utils import AudioBuffer, is_given
from voxgate_client import (
    AS_FAST_AS_ALLOWED,
    Call,
    CallConfig,
    CallEndedError,
    ErrorEvent,
    QualityChanged,
    SpeechBegin,
    SpeechEnd,
    Transcript,
    VadOptions,
    VoxgateClient,
    VoxgateError,
    WireAudio,
    stream_audio,
)

from ._errors import api_error
from .log import logger

__all__ = ["STT", "SpeechStream"]

#: Input rates the gateway takes without resampling.
SERVED_RATES_HZ = (8000, 16000, 24000, 48000)


@dataclass(frozen=True)
class _Options:
    language: str
    model: str
    interim_results: bool
    hotwords: tuple[str, ...]
    initial_prompt: str
    sample_rate: int
    end_silence_ms: int


class STT(stt.STT[Literal["metrics_collected", "error"]]):
    """Streaming speech-to-text from a voxgate gateway.

    Args:
        target: ``host:port`` of the gateway.
        tls: False (plaintext), True (system roots) or ``grpc.ChannelCredentials``.
        token: bearer token, when the gateway requires one.
        language: ISO 639-1 code ("en"); empty = the server's default or detection.
        model: a model the server lists; empty = its default.
        interim_results: ask for interim transcripts.
        hotwords: words or phrases to bias recognition towards.
        initial_prompt: decoding prompt (context, spelling of names).
        sample_rate: the rate audio is sent at (LiveKit resamples to it); 8, 16, 24 or 48 kHz.
        end_silence_ms: the server VAD's trailing silence that ends an utterance (0 = default).
    """

    def __init__(
        self,
        *,
        target: str = "127.0.0.1:50051",
        tls: bool | grpc.ChannelCredentials = False,
        token: str | None = None,
        language: str = "",
        model: str = "",
        interim_results: bool = True,
        hotwords: tuple[str, ...] | list[str] = (),
        initial_prompt: str = "",
        sample_rate: int = 16000,
        end_silence_ms: int = 0,
    ) -> None:
        if sample_rate not in SERVED_RATES_HZ:
            raise ValueError(f"sample_rate={sample_rate}; use one of {SERVED_RATES_HZ}")
        super().__init__(
            capabilities=stt.STTCapabilities(
                streaming=True,
                interim_results=interim_results,
                aligned_transcript="word",
                offline_recognize=True,
                manual_flush=True,
            )
        )
        self._target, self._tls, self._token = target, tls, token
        self._opts = _Options(
            language,
            model,
            interim_results,
            tuple(hotwords),
            initial_prompt,
            sample_rate,
            end_silence_ms,
        )
        self._client: VoxgateClient | None = None
        self._streams: set[SpeechStream] = set()

    @property
    def model(self) -> str:
        """The model name sent to the server ("" = its default)."""
        return self._opts.model or "default"

    @property
    def provider(self) -> str:
        """Reported in LiveKit's metrics metadata."""
        return "voxgate"

    def _ensure_client(self) -> VoxgateClient:
        # grpc.aio channels belong to the loop that creates them: create on first use.
        if self._client is None:
            self._client = VoxgateClient(self._target, self._tls, self._token)
        return self._client

    def _config(self, language: NotGivenOr[str], sample_rate: int) -> CallConfig:
        o = self._opts
        return CallConfig(
            encoding="linear16",
            sample_rate_hz=sample_rate,
            interim_results=o.interim_results,
            language=language if is_given(language) and language else o.language,
            model=o.model,
            word_timestamps=True,
            hotwords=o.hotwords,
            initial_prompt=o.initial_prompt,
            vad=VadOptions(end_silence_ms=o.end_silence_ms),
        )

    def update_options(
        self,
        *,
        language: NotGivenOr[str] = NOT_GIVEN,
        hotwords: NotGivenOr[list[str]] = NOT_GIVEN,
    ) -> None:
        """Change options for streams opened from now on.

        A stream's config is its first message, so streams already open keep theirs.
        """
        if is_given(language):
            self._opts = replace(self._opts, language=language)
        if is_given(hotwords):
            self._opts = replace(self._opts, hotwords=tuple(hotwords))

    def stream(
        self,
        *,
        language: NotGivenOr[str] = NOT_GIVEN,
        conn_options: APIConnectOptions = DEFAULT_API_CONNECT_OPTIONS,
    ) -> SpeechStream:
        """Open a streaming recognition (``push_frame``, ``flush``, ``end_input``)."""
        s = SpeechStream(
            stt=self,
            config=self._config(language, self._opts.sample_rate),
            conn_options=conn_options,
        )
        self._streams.add(s)
        return s

    async def _recognize_impl(
        self,
        buffer: AudioBuffer,
        *,
        language: NotGivenOr[str] = NOT_GIVEN,
        conn_options: APIConnectOptions,
    ) -> stt.SpeechEvent:
        """Offline recognition of a whole buffer: one stream, hung up after the audio."""
        frame = rtc.combine_audio_frames(buffer)
        if frame.sample_rate not in SERVED_RATES_HZ:
            resampler = rtc.AudioResampler(frame.sample_rate, self._opts.sample_rate)
            frame = rtc.combine_audio_frames([*resampler.push(frame), *resampler.flush()])
        config = self._config(language, frame.sample_rate)
        try:
            call = await _open(self._ensure_client(), config, conn_options)
            try:
                # As fast as the gateway accepts audio (its real-time-factor limit).
                audio = WireAudio(frame.data.tobytes(), "linear16", frame.sample_rate)
                await stream_audio(call, audio, AS_FAST_AS_ALLOWED, chunk_ms=100)
                await call.hangup()
                finals = [e async for e in call if isinstance(e, Transcript) and e.is_final]
            finally:
                await call.aclose()
        except VoxgateError as exc:
            raise api_error(exc) from exc
        text = " ".join(t.text.strip() for t in finals if t.text.strip())
        words = [w for t in finals for w in _words(t, 0.0)]
        return stt.SpeechEvent(
            type=stt.SpeechEventType.FINAL_TRANSCRIPT,
            alternatives=[
                stt.SpeechData(
                    language=LanguageCode(
                        finals[0].language if finals and finals[0].language else "en"
                    ),
                    text=text,
                    start_time=finals[0].start_ms / 1000 if finals else 0.0,
                    end_time=finals[-1].end_ms / 1000 if finals else 0.0,
                    confidence=min((t.confidence for t in finals), default=0.0),
                    words=words,
                )
            ],
        )

    async def aclose(self) -> None:
        """Close every open stream, then the channel."""
        for s in list(self._streams):
            await s.aclose()
        self._streams.clear()
        client, self._client = self._client, None
        if client is not None:
            await client.aclose()


async def _open(client: VoxgateClient, config: CallConfig, conn: APIConnectOptions) -> Call:
    try:
        return await asyncio.wait_for(client.recognize(config), conn.timeout)
    except TimeoutError:
        raise APITimeoutError(f"voxgate: no SessionStarted within {conn.timeout:g} s") from None


def _words(t: Transcript, offset_s: float) -> list[TimedString]:
    return [
        TimedString(
            w.word,
            start_time=w.start_ms / 1000 + offset_s,
            end_time=w.end_ms / 1000 + offset_s,
            confidence=w.probability,
            start_time_offset=offset_s,
        )
        for w in t.words
    ]


class SpeechStream(stt.SpeechStream):
    """One ``StreamingRecognize`` call; LiveKit retries ``_run`` on a retryable APIError."""

    def __init__(self, *, stt: STT, config: CallConfig, conn_options: APIConnectOptions) -> None:
        super().__init__(stt=stt, conn_options=conn_options, sample_rate=config.sample_rate_hz)
        self._voxgate = stt
        self._config = config
        self._speaking = False
        self._audio_s = 0.0
        self._request_id = ""

    async def aclose(self) -> None:
        """Close now (the RPC is cancelled with ``_run``)."""
        await super().aclose()
        self._voxgate._streams.discard(self)

    async def _run(self) -> None:
        try:
            call = await _open(self._voxgate._ensure_client(), self._config, self._conn_options)
        except VoxgateError as exc:
            raise api_error(exc) from exc
        assert call.session is not None
        self._request_id = call.session.session_id
        try:
            sender = asyncio.create_task(self._send(call), name="voxgate-stt-send")
            try:
                await self._receive(call)
            finally:
                await utils.aio.cancel_and_wait(sender)
            if sender.done() and not sender.cancelled() and (err := sender.exception()):
                raise err
        except VoxgateError as exc:
            raise api_error(exc) from exc
        finally:
            await call.aclose()

    async def _send(self, call: Call) -> None:
        try:
            async for item in self._input_ch:
                if isinstance(item, rtc.AudioFrame):
                    await call.send_audio(item.data.tobytes())
                    self._audio_s += item.duration
                else:  # a flush: finish the utterance now
                    await call.flush()
            await call.hangup()
        except CallEndedError:
            return  # the server ended the stream; the receiver raises its status

    async def _receive(self, call: Call) -> None:
        async for event in call:
            if isinstance(event, SpeechBegin):
                self._start_of_speech()
            elif isinstance(event, Transcript):
                self._transcript(event)
            elif isinstance(event, SpeechEnd):
                pass  # END_OF_SPEECH follows the final (see module docstring)
            elif isinstance(event, ErrorEvent):
                # One utterance failed; the stream goes on.
                logger.warning("voxgate utterance error %s: %s", event.code.name, event.message)
            elif isinstance(event, QualityChanged):
                # The server sheds quality past its capacity (interims, word times...).
                logger.warning(
                    "voxgate server quality: %s (%s)",
                    ", ".join(event.shed) or "full",
                    event.description,
                )

    def _start_of_speech(self) -> None:
        if not self._speaking:
            self._speaking = True
            self._event_ch.send_nowait(
                stt.SpeechEvent(
                    type=stt.SpeechEventType.START_OF_SPEECH, request_id=self._request_id
                )
            )

    def _transcript(self, t: Transcript) -> None:
        if not t.is_final and not t.text.strip():
            return
        self._start_of_speech()
        offset = self.start_time_offset
        data = stt.SpeechData(
            language=LanguageCode(t.language or self._config.language or "en"),
            text=t.text.strip(),
            start_time=t.start_ms / 1000 + offset,
            end_time=t.end_ms / 1000 + offset,
            confidence=t.confidence,
            words=_words(t, offset),
            # What LiveKit's SpeechData has no field for; received_s (the client's loop time
            # of the message's arrival) lets a benchmark see what the plugin adds.
            metadata={
                "utterance_index": t.utterance_index,
                "no_speech_probability": t.no_speech_probability,
                "received_s": t.received_s,
            },
        )
        if not t.is_final:
            self._event_ch.send_nowait(
                stt.SpeechEvent(
                    type=stt.SpeechEventType.INTERIM_TRANSCRIPT,
                    request_id=self._request_id,
                    alternatives=[data],
                )
            )
            return
        if self._audio_s > 0:
            self._event_ch.send_nowait(
                stt.SpeechEvent(
                    type=stt.SpeechEventType.RECOGNITION_USAGE,
                    request_id=self._request_id,
                    recognition_usage=stt.RecognitionUsage(audio_duration=self._audio_s),
                )
            )
            self._audio_s = 0.0
        if data.text:
            self._event_ch.send_nowait(
                stt.SpeechEvent(
                    type=stt.SpeechEventType.FINAL_TRANSCRIPT,
                    request_id=self._request_id,
                    alternatives=[data],
                )
            )
        if self._speaking:
            self._speaking = False
            with contextlib.suppress(RuntimeError):  # the channel may close with the stream
                self._event_ch.send_nowait(
                    stt.SpeechEvent(
                        type=stt.SpeechEventType.END_OF_SPEECH, request_id=self._request_id
                    )
                )
