"""``voxgate.STT``: LiveKit's streaming STT over voxgate's ``StreamingRecognize``.

A ``RecognizeStream`` sends audio frames as pushed (resampled by LiveKit to ``sample_rate``
first) on one gRPC stream at a time; ``flush()`` becomes voxgate's ``Flush`` (finish the
utterance now: the ``manual_flush`` capability), ``end_input()`` a hangup (the open utterance
still gets its final). Events follow LiveKit's order: START_OF_SPEECH on voxgate's speech
begin, INTERIM transcripts, RECOGNITION_USAGE (audio seconds since the last one) then
FINAL_TRANSCRIPT with word-aligned ``TimedString``s, then END_OF_SPEECH (voxgate sends its
speech end *before* the final; LiveKit's turn logic expects the final first, as its own
inference STT sends them).

Keepalive, as LiveKit's own streaming plugins do it (Deepgram's ``KeepAlive`` task beside its
send and receive tasks): voxgate has no keepalive message, a call stays alive on audio, so a
task beside the sender writes 100 ms of silence whenever no audio has gone out for
``keepalive_interval_s``. A room whose audio pauses (a muted or departed participant) then
keeps its stream past the server's ``idle_timeout_s``. The silence is not on the audio clock.

Reconnection is LiveKit's: a stream the server ends (``DEADLINE_EXCEEDED`` after its idle
timeout with keepalive off, ``UNAVAILABLE`` on a restart or a lost connection) or refuses at
capacity raises a retryable ``APIError`` from ``_run`` and LiveKit runs it again
(``APIConnectOptions``). Once a gRPC stream has ended, the next opens only when audio is
there to send; audio pushed meanwhile waits in LiveKit's input channel. Audio the old stream
accepted but whose words never came back (sent after the server stopped reading, or the
utterance open when the connection died) is not lost: the audio sent since the last final
(at most ``REPLAY_LIMIT_S``) is sent again first on the next stream, whose clock starts
where that audio starts. Sends are paced to the server's real-time limit, so a backlog never
gets a stream refused.

Times are on the audio clock: a transcript's times are the stream's ``start_time_offset``
(what LiveKit's ``AgentSession`` sets: where the stream's audio begins on the session's
timeline) plus the audio before the current gRPC stream plus the audio (not the keepalive
silence) the server's time in the current one covers. LiveKit's base class adds the
*wall-clock* time between retries to that offset, which is wrong whenever the audio that
arrived meanwhile is buffered and sent afterwards; each run sets it back on the audio clock.

End of turn: ``turn_detection="smart"`` (or ``"silence"``) asks the server to detect the end
of the user's turn (``EndOfTurn``). START_OF_SPEECH then opens a turn and END_OF_SPEECH closes
it after the turn's last final, on ``EndOfTurn`` (not after each utterance's final), which is
what LiveKit's ``turn_detection="stt"`` mode takes as the end of the user's turn. Its
``speech_end_time`` is the wall-clock time the turn's last speech was sent (for a real-time
input, when the user said it), the anchor LiveKit's endpointing delay counts from.

Options that change (``update_options``, LiveKit's session keyterms) apply to running streams
too: a stream's config is its first message, so the stream moves to a new gRPC stream with
the new config once the user is not speaking, as LiveKit's own STT defers keyterm updates to
the end of speech.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Literal

import grpc
from livekit import rtc
from livekit.agents import (
    DEFAULT_API_CONNECT_OPTIONS,
    APIConnectionError,
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
    EndOfTurn,
    ErrorEvent,
    ModelInfo,
    QualityChanged,
    SessionStarted,
    SpeechBegin,
    SpeechEnd,
    Transcript,
    TurnDetectionName,
    TurnOptions,
    VadOptions,
    VoxgateClient,
    VoxgateError,
    WireAudio,
    stream_audio,
)

from ._errors import api_error
from .log import logger

__all__ = ["DEFAULT_KEYTERM_BOOST", "STT", "SpeechStream"]

#: Input rates the gateway takes without resampling.
SERVED_RATES_HZ = (8000, 16000, 24000, 48000)

#: Boost of a keyterm, in nats (the server's ``phrase^boost`` hotword; it caps boosts at 10).
#: 6 is the value docs/decode_loop.md measured (9 of 10 domain terms recognised).
DEFAULT_KEYTERM_BOOST = 6.0

#: Length of one keepalive silence, s (what Pipecat's keepalive sends too).
KEEPALIVE_SILENCE_S = 0.1

#: Most audio sent again on a new gRPC stream, s: what the old one accepted since its last
#: final. Within the server's burst allowance (5 s by default), and the sends are paced.
REPLAY_LIMIT_S = 4.0

#: Frames whose send time is remembered (END_OF_SPEECH's wall-clock ``speech_end_time``): at
#: LiveKit's 10-100 ms frames, 20 s or more, longer than any turn's wait for its end.
SENT_AT_FRAMES = 2048


@dataclass(frozen=True)
class _Options:
    language: str
    model: str
    interim_results: bool
    interim_interval_ms: int
    hotwords: tuple[str, ...]
    keyterms: tuple[str, ...]
    keyterm_boost: float
    initial_prompt: str
    sample_rate: int
    end_silence_ms: int
    keepalive_interval_s: float | None
    turn_detection: TurnDetectionName | None
    turn_eagerness: float


class STT(stt.STT[Literal["metrics_collected", "error"]]):
    """Streaming speech-to-text from a voxgate gateway.

    Args:
        target: ``host:port`` of the gateway.
        tls: False (plaintext), True (system roots) or ``grpc.ChannelCredentials``.
        token: bearer token, when the gateway requires one.
        language: ISO 639-1 code ("en"); empty = the server's default or detection.
        model: a model the server lists; empty = its default.
        interim_results: ask for interim transcripts.
        interim_interval_ms: interval between interims (0 = the server's default).
        hotwords: words or phrases to bias recognition towards, sent as written
            (``"Zorblax^6"`` is boosted by 6 nats; a word without ``^`` goes into the prompt).
        keyterms: terms to recognise (names of products, people): each is sent as the boosted
            hotword ``term^keyterm_boost``; an ``AgentSession``'s keyterms are added to them.
        keyterm_boost: the boost of a keyterm, nats (the server caps it at 10).
        initial_prompt: decoding prompt (context, spelling of names).
        sample_rate: the rate audio is sent at (LiveKit resamples to it); 8, 16, 24 or 48 kHz.
        end_silence_ms: the server VAD's trailing silence that ends an utterance (0 = default).
        keepalive_interval_s: after this long without audio, send 100 ms of silence (and again
            every interval), so that the server's ``idle_timeout_s`` (60 s by default) does not
            end a stream whose room is silent; keep it below that timeout. None: no keepalive
            (a stream the server ends is reopened when audio comes).
        turn_detection: ask the server for end-of-turn detection: ``"smart"`` (silence, the
            words so far and its audio model), ``"silence"`` (every utterance is a turn) or
            ``"off"``; None = the server's default (off unless its operator set one). With
            ``"smart"``/``"silence"``, END_OF_SPEECH marks the end of the user's turn: use it
            with ``AgentSession(turn_handling={"turn_detection": "stt"})``.
        turn_eagerness: ``"smart"``: how readily a turn ends, 0..1 (0 = the server's default).
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
        interim_interval_ms: int = 0,
        hotwords: tuple[str, ...] | list[str] = (),
        keyterms: tuple[str, ...] | list[str] = (),
        keyterm_boost: float = DEFAULT_KEYTERM_BOOST,
        initial_prompt: str = "",
        sample_rate: int = 16000,
        end_silence_ms: int = 0,
        keepalive_interval_s: float | None = 5.0,
        turn_detection: TurnDetectionName | None = None,
        turn_eagerness: float = 0.0,
    ) -> None:
        if sample_rate not in SERVED_RATES_HZ:
            raise ValueError(f"sample_rate={sample_rate}; use one of {SERVED_RATES_HZ}")
        if keepalive_interval_s is not None and keepalive_interval_s <= 0:
            raise ValueError(f"keepalive_interval_s={keepalive_interval_s}; > 0, or None for off")
        super().__init__(
            capabilities=stt.STTCapabilities(
                streaming=True,
                interim_results=interim_results,
                aligned_transcript="word",
                offline_recognize=True,
                manual_flush=True,
                keyterms=True,
            )
        )
        self._target, self._tls, self._token = target, tls, token
        self._opts = _Options(
            language,
            model,
            interim_results,
            interim_interval_ms,
            tuple(hotwords),
            tuple(keyterms),
            keyterm_boost,
            initial_prompt,
            sample_rate,
            end_silence_ms,
            keepalive_interval_s,
            turn_detection,
            turn_eagerness,
        )
        #: The AgentSession's keyterms (static and detected), kept apart from the user's.
        self._session_keyterms: tuple[str, ...] = ()
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
        keyterms = dict.fromkeys(t.strip() for t in (*o.keyterms, *self._session_keyterms))
        boosted = tuple(t if "^" in t else f"{t}^{o.keyterm_boost:g}" for t in keyterms if t)
        return CallConfig(
            encoding="linear16",
            sample_rate_hz=sample_rate,
            interim_results=o.interim_results,
            interim_interval_ms=o.interim_interval_ms,
            language=language if is_given(language) and language else o.language,
            model=o.model,
            word_timestamps=True,
            hotwords=(*o.hotwords, *boosted),
            initial_prompt=o.initial_prompt,
            vad=VadOptions(end_silence_ms=o.end_silence_ms),
            turns=(
                TurnOptions(mode=o.turn_detection, eagerness=o.turn_eagerness)
                if o.turn_detection is not None
                else TurnOptions()
            ),
        )

    def update_options(
        self,
        *,
        language: NotGivenOr[str] = NOT_GIVEN,
        model: NotGivenOr[str] = NOT_GIVEN,
        hotwords: NotGivenOr[list[str]] = NOT_GIVEN,
        keyterms: NotGivenOr[list[str]] = NOT_GIVEN,
        initial_prompt: NotGivenOr[str] = NOT_GIVEN,
        interim_interval_ms: NotGivenOr[int] = NOT_GIVEN,
        end_silence_ms: NotGivenOr[int] = NOT_GIVEN,
    ) -> None:
        """Change options, for streams opened from now on and for running ones.

        A running stream moves to a new gRPC stream with the new config once the user is not
        speaking (a stream's config is its first message).
        """
        o = self._opts
        self._opts = replace(
            o,
            language=language if is_given(language) else o.language,
            model=model if is_given(model) else o.model,
            hotwords=tuple(hotwords) if is_given(hotwords) else o.hotwords,
            keyterms=tuple(keyterms) if is_given(keyterms) else o.keyterms,
            initial_prompt=initial_prompt if is_given(initial_prompt) else o.initial_prompt,
            interim_interval_ms=(
                interim_interval_ms if is_given(interim_interval_ms) else o.interim_interval_ms
            ),
            end_silence_ms=end_silence_ms if is_given(end_silence_ms) else o.end_silence_ms,
        )
        self._reconfigure_streams()

    def _update_session_keyterms(self, keyterms: list[str]) -> None:
        """LiveKit's hook for an ``AgentSession``'s keyterms (static and detected).

        They are boosted like the user's own and reach running streams too.
        """
        if tuple(keyterms) == self._session_keyterms:
            return
        self._session_keyterms = tuple(keyterms)
        self._reconfigure_streams()

    def _reconfigure_streams(self) -> None:
        for s in self._streams:
            s._reconfigure(self._config(s._language, s._config.sample_rate_hz))

    async def list_models(self) -> list[ModelInfo]:
        """The recognition models the gateway serves (``ListModels``).

        Any one's ``name`` is a ``model`` option.

        Raises:
            APIError: the gateway refused or could not be reached.
        """
        try:
            return await self._ensure_client().list_models()
        except VoxgateError as exc:
            raise api_error(exc, "ListModels") from exc

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
            language=language,
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
            raise api_error(exc, "StreamingRecognize") from exc
        text = " ".join(t.text.strip() for t in finals if t.text.strip())
        words = [w for t in finals for w in _words(t, 0.0, lambda ms: ms / 1000)]
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


def _words(t: Transcript, offset_s: float, audio_s: Callable[[int], float]) -> list[TimedString]:
    return [
        TimedString(
            w.word,
            start_time=audio_s(w.start_ms) + offset_s,
            end_time=audio_s(w.end_ms) + offset_s,
            confidence=w.probability,
            start_time_offset=offset_s,
        )
        for w in t.words
    ]


class SpeechStream(stt.SpeechStream):
    """One recognition; LiveKit retries ``_run`` on a retryable APIError (see the module)."""

    def __init__(
        self,
        *,
        stt: STT,
        config: CallConfig,
        language: NotGivenOr[str],
        conn_options: APIConnectOptions,
    ) -> None:
        super().__init__(stt=stt, conn_options=conn_options, sample_rate=config.sample_rate_hz)
        self._voxgate = stt
        self._config = config
        self._language = language
        #: A config to move to once the user is not speaking (update_options, keyterms).
        self._next_config: CallConfig | None = None
        #: Whether END_OF_SPEECH waits for EndOfTurn rather than each final.
        self._turns = stt._opts.turn_detection in ("silence", "smart")
        self._speaking = False
        #: Where the open turn's first final starts on the audio clock, s.
        self._turn_start_s: float | None = None
        #: Audio sent since the last RECOGNITION_USAGE, s.
        self._audio_s = 0.0
        #: Audio sent on every gRPC stream before the current one, and on it so far, s.
        self._sent_s = 0.0
        #: ``start_time_offset`` as first set (by the AgentSession): the audio clock's origin.
        self._anchor_s: float | None = None
        #: Frames taken from the input that no stream has taken yet (sent first on the next).
        self._unsent: list[rtc.AudioFrame] = []
        #: Frames a dead stream took whose words never came back: sent before ``_unsent``.
        self._resend: list[rtc.AudioFrame] = []
        #: Frames the current gRPC stream took since its last final, with where each starts
        #: (``_sent_s`` before it): what a new stream sends again if this one dies.
        self._replay: deque[tuple[float, rtc.AudioFrame]] = deque()
        #: The current gRPC stream: everything written to it (audio and keepalive), s; its
        #: keepalive silences on its own clock, (start, length) s; when its first write went
        #: and its last (loop time), for pacing and keepalive.
        self._wire_s = 0.0
        self._silences: list[tuple[float, float]] = []
        self._first_write_at: float | None = None
        self._last_write_at = 0.0
        #: One write (and its bookkeeping) at a time: the sender and the keepalive share it.
        self._write_lock = asyncio.Lock()
        #: Where each recent frame sent ends on the audio clock (``_sent_s``) and when it went
        #: (``time.time()``): turns an audio time into the wall-clock time LiveKit wants.
        self._sent_at: deque[tuple[float, float]] = deque(maxlen=SENT_AT_FRAMES)
        #: Utterances of earlier gRPC streams (each stream numbers its own from 0).
        self._index_base = 0
        self._utterances = 0
        self._hung_up = False
        self._request_id = ""
        #: ``SessionStarted`` of every gRPC stream this recognition opened, oldest first.
        self.sessions: list[SessionStarted] = []

    async def aclose(self) -> None:
        """Close now (the RPC is cancelled with ``_run``)."""
        await super().aclose()
        self._voxgate._streams.discard(self)

    def _reconfigure(self, config: CallConfig) -> None:
        if config != self._config:
            self._next_config = config

    async def _run(self) -> None:
        if self._anchor_s is None:
            self._anchor_s = self.start_time_offset
        while True:
            if not await self._audio_waiting():
                return  # the input ended with nothing more to send
            if self._next_config is not None:
                self._config, self._next_config = self._next_config, None
            # Undo the wall-clock time LiveKit's retry added: this stream's first sample is
            # the audio clock's origin plus everything sent before it.
            self.start_time_offset = self._anchor_s + self._sent_s
            self._index_base += self._utterances
            self._utterances = 0
            if not await self._one_stream():
                return

    async def _audio_waiting(self) -> bool:
        """After a gRPC stream has ended, wait for audio to send: a silent input holds none.

        The first gRPC stream opens at once, so a refused config is known before any audio
        and the stream is ready when the audio comes. A flush before any audio has nothing
        to finish. Audio to send again waits for new audio too (a stream the server ended
        for idleness is not reopened only to idle again), unless the input has ended. False
        once the input has ended with nothing to send.
        """
        if self._unsent or not self.sessions:
            return True
        async for item in self._input_ch:
            if isinstance(item, rtc.AudioFrame):
                self._unsent.append(item)
                return True
        return bool(self._resend)

    async def _one_stream(self) -> bool:
        """One gRPC stream; True when it ended to move to a new config (more to send)."""
        try:
            call = await _open(self._voxgate._ensure_client(), self._config, self._conn_options)
        except VoxgateError as exc:
            raise api_error(exc, "StreamingRecognize") from exc
        assert call.session is not None
        self.sessions.append(call.session)
        self._request_id = call.session.session_id
        self._hung_up = False
        self._wire_s, self._silences, self._first_write_at = 0.0, [], None
        self._last_write_at = asyncio.get_running_loop().time()
        try:
            # As LiveKit's Deepgram plugin runs its connection: send, keepalive, receive.
            sender = asyncio.create_task(self._send(call), name="voxgate-stt-send")
            keepalive = asyncio.create_task(self._keepalive(call), name="voxgate-stt-keepalive")
            try:
                await self._receive(call)
            finally:
                await utils.aio.cancel_and_wait(sender, keepalive)
            if sender.done() and not sender.cancelled() and (err := sender.exception()):
                raise err
        except VoxgateError as exc:
            self._end_of_speech()  # the dead stream's utterance gets no final
            self._rewind()
            raise api_error(exc, "StreamingRecognize") from exc
        finally:
            await call.aclose()
        if not self._hung_up:
            self._end_of_speech()
            self._rewind()
            raise APIConnectionError("voxgate: the server ended the recognition stream")
        self._replay.clear()  # a hangup: the server heard everything
        return self._next_config is not None

    def _rewind(self) -> None:
        """Put what the dead stream took since its last final back in front of the input.

        The server may not have heard it (sent after it stopped reading, or the utterance
        open when the connection died). The next stream starts where that audio starts.
        """
        if self._replay:
            self._sent_s = self._replay[0][0]
            self._resend[:0] = [frame for _, frame in self._replay]
            self._replay.clear()

    async def _send(self, call: Call) -> None:
        try:
            while self._resend:  # what an earlier stream took but the server may not have heard
                await self._send_frame(call, self._resend[0])
                self._resend.pop(0)
            while self._unsent:  # what an earlier stream took but could not send
                await self._send_frame(call, self._unsent[0])
                self._unsent.pop(0)
            async for item in self._input_ch:
                if isinstance(item, rtc.AudioFrame):
                    self._unsent.append(item)
                    if self._next_config is not None and not self._speaking:
                        break  # move to the new config before this frame
                    await self._send_frame(call, item)
                    self._unsent.pop()
                else:  # a flush: finish the utterance now
                    await call.flush()
            self._hung_up = True
            await call.hangup()
        except CallEndedError:
            return  # the server ended the stream; the receiver raises its status

    async def _send_frame(self, call: Call, frame: rtc.AudioFrame) -> None:
        # Paced as the client library paces a file: a backlog (audio that waited through a
        # retry, a replay) goes no faster than the server's real-time limit accepts.
        loop = asyncio.get_running_loop()
        if self._first_write_at is not None:
            due = self._first_write_at + AS_FAST_AS_ALLOWED.due_s(self._wire_s * 1000)
            if (wait := due - loop.time()) > 0:
                await asyncio.sleep(wait)
        async with self._write_lock:
            await call.send_audio(frame.data.tobytes())
            self._wrote(frame.duration)
        self._replay.append((self._sent_s, frame))
        self._audio_s += frame.duration
        self._sent_s += frame.duration
        self._sent_at.append((self._sent_s, time.time()))
        while self._replay and self._sent_s - self._replay[0][0] > REPLAY_LIMIT_S:
            self._replay.popleft()

    def _wrote(self, seconds: float) -> None:
        now = asyncio.get_running_loop().time()
        if self._first_write_at is None:
            self._first_write_at = now
        self._last_write_at = now
        self._wire_s += seconds

    async def _keepalive(self, call: Call) -> None:
        """Silence whenever no audio went out for ``keepalive_interval_s`` (see the module)."""
        interval = self._voxgate._opts.keepalive_interval_s
        if interval is None:
            return
        loop = asyncio.get_running_loop()
        samples = round(self._config.sample_rate_hz * KEEPALIVE_SILENCE_S)
        silence = bytes(2 * samples)
        while True:
            wait = self._last_write_at + interval - loop.time()
            if wait > 0:
                await asyncio.sleep(wait)
                continue
            async with self._write_lock:
                try:
                    await call.send_audio(silence)
                except (CallEndedError, VoxgateError):
                    return  # hung up, or ended: the receiver raises the stream's status
                self._silences.append((self._wire_s, samples / self._config.sample_rate_hz))
                self._wrote(samples / self._config.sample_rate_hz)

    def _audio_at(self, stream_ms: int) -> float:
        """A time on the current gRPC stream's clock as audio since it began, s.

        The server counts the keepalive silence too; the audio clock does not.
        """
        t = stream_ms / 1000
        return t - sum(min(length, t - start) for start, length in self._silences if start < t)

    async def _receive(self, call: Call) -> None:
        async for event in call:
            if isinstance(event, SpeechBegin):
                self._utterances = max(self._utterances, event.utterance_index + 1)
                self._start_of_speech()
            elif isinstance(event, Transcript):
                self._utterances = max(self._utterances, event.utterance_index + 1)
                self._transcript(event)
            elif isinstance(event, EndOfTurn):
                if self._turns:
                    self._end_of_turn(event)
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

    def _end_of_speech(
        self, turn: stt.SpeechData | None = None, speech_end_time: float | None = None
    ) -> None:
        self._turn_start_s = None
        if self._speaking:
            self._speaking = False
            with contextlib.suppress(RuntimeError):  # the channel may close with the stream
                self._event_ch.send_nowait(
                    stt.SpeechEvent(
                        type=stt.SpeechEventType.END_OF_SPEECH,
                        request_id=self._request_id,
                        alternatives=[turn] if turn is not None else [],
                        speech_end_time=speech_end_time,
                    )
                )

    def _wall_time_of(self, audio_s: float) -> float | None:
        """When the audio at ``audio_s`` (on ``_sent_s``'s clock) was sent, ``time.time()``.

        For a real-time input that is when the user said it, give or take a frame. The first
        frame sent past that point says when (audio sent again after a dropped stream is
        found at its first sending); None before any audio went out.
        """
        for end_s, at in self._sent_at:
            if end_s >= audio_s:
                return at - (end_s - audio_s)
        return time.time() if self._sent_at else None

    def _end_of_turn(self, eot: EndOfTurn) -> None:
        """END_OF_SPEECH for the turn, carrying its text and where its speech ended.

        LiveKit's ``turn_detection="stt"`` reads the end time of an END_OF_SPEECH's first
        alternative as when the user last spoke (its endpointing delay counts from there).
        """
        offset = self.start_time_offset
        end_s = offset + self._audio_at(eot.offset_ms)
        # The turn's end as LiveKit's SpeechEvent.speech_end_time wants it (wall clock):
        # with turn_detection="stt" it is when the user last spoke, the anchor its endpointing
        # delay and turn metrics count from; without it LiveKit works that out from the end
        # time and its own idea of when the input started.
        wall = self._wall_time_of(end_s - (self._anchor_s or 0.0))
        self._end_of_speech(
            stt.SpeechData(
                language=LanguageCode(self._config.language or "en"),
                text=eot.text.strip(),
                start_time=self._turn_start_s if self._turn_start_s is not None else end_s,
                end_time=end_s,
                confidence=eot.probability,
                metadata={
                    "turn_index": eot.turn_index,
                    "reason": eot.reason,
                    "silence_ms": eot.silence_ms,
                    "first_utterance_index": self._index_base + eot.first_utterance_index,
                    "last_utterance_index": self._index_base + eot.last_utterance_index,
                    "received_s": eot.received_s,
                },
            ),
            speech_end_time=wall,
        )

    def _transcript(self, t: Transcript) -> None:
        if not t.is_final and not t.text.strip():
            return
        self._start_of_speech()
        offset = self.start_time_offset
        data = stt.SpeechData(
            language=LanguageCode(t.language or self._config.language or "en"),
            text=t.text.strip(),
            start_time=self._audio_at(t.start_ms) + offset,
            end_time=self._audio_at(t.end_ms) + offset,
            confidence=t.confidence,
            words=_words(t, offset, self._audio_at),
            # What LiveKit's SpeechData has no field for; received_s (the client's loop time
            # of the message's arrival) lets a benchmark see what the plugin adds.
            metadata={
                "utterance_index": self._index_base + t.utterance_index,
                "no_speech_probability": t.no_speech_probability,
                "received_s": t.received_s,
                "turn_index": t.turn_index,
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
        # The server has decided this audio: a new stream need not hear it again.
        heard_s = data.end_time - (self._anchor_s or 0.0)
        while self._replay and self._replay[0][0] + self._replay[0][1].duration <= heard_s:
            self._replay.popleft()
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
            if self._turn_start_s is None:
                self._turn_start_s = data.start_time
            self._event_ch.send_nowait(
                stt.SpeechEvent(
                    type=stt.SpeechEventType.FINAL_TRANSCRIPT,
                    request_id=self._request_id,
                    alternatives=[data],
                )
            )
        if not self._turns:
            self._end_of_speech()
