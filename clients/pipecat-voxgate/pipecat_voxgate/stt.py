"""Pipecat STT over voxgate's ``StreamingRecognize``: one gRPC stream at a time per pipeline.

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

End of turn (the ``turn_detection`` argument, ``"smart"`` or ``"silence"``): the server decides
when the user's *turn* is over (``EndOfTurn``: a pause inside a sentence ends an utterance,
not the turn), and the service takes the route Pipecat's Deepgram Flux service takes for its
own end-of-turn events: ``ProposedUserStartedSpeakingFrame`` when a turn's first speech
begins, ``InterimTranscriptionFrame``s holding the turn so far (its finals, then the
utterance's interim), and on the server's EndOfTurn one ``TranscriptionFrame`` per turn marked
``finalized``, as Flux's turn transcript is, then ``ProposedUserStoppedSpeakingFrame`` and the
``on_end_of_turn`` event (with the :class:`~voxgate_client.EndOfTurn`, on the service's audio
clock), with ``ExternalUserTurnStrategies`` asked for in the metadata, so the user aggregator's
turn stop, and the LLM's reply, follow the server's end of turn. That frame's text is the
EndOfTurn's: the turn decoded again as one when that decode is back in time (a pause splits a
sentence into utterances decoded apart: "The codon is chest" for "the cut on his chest"), else
its finals joined; its ``result`` is the EndOfTurn. The turn's finals (with their word times)
reach the pipeline as the interims' ``result``s.

Reconnection, with Pipecat's own hooks (``STTService._reconnect`` / ``_do_reconnect``, as its
NVIDIA gRPC service does): when the server ends the stream (``DEADLINE_EXCEEDED`` after its
idle timeout, ``UNAVAILABLE`` on a restart...) the service logs a warning and fires
``on_connection_error``, as Pipecat's websocket services do on a drop, and the next audio
frame opens a new stream; audio that arrives meanwhile is buffered and replayed into it, and
so is the audio the dead stream took since its last final (at most ``REPLAY_LIMIT_S``): the
server may never have heard it (sent after it stopped reading, or the utterance open when the
connection died). Sends are paced to the server's real-time limit, so that backlog never gets
the new stream refused. A
refused reopening is an ``ErrorFrame`` and is retried with Pipecat's exponential backoff up to
``reconnect_attempts`` times; a refusal that retrying cannot fix (a bad model, a bad token) and
the last failed attempt are reported with ``force_treat_as_permanent``, which makes the service
unusable and lets the pipeline worker's ``ProcessorUnusablePolicy`` decide. A settings change
reconnects through ``_request_reconnect``, which waits for the user's turn to end.

Keepalive, with Pipecat's hook: ``keepalive_timeout=`` (seconds without audio) makes the base
class send 100 ms of silence, which this service writes into the stream, so a server's idle
timeout never ends a stream that a transport leaves silent (a bot started before its user
joins).

Times: every transcript's ``start_ms``/``end_ms`` and word times are on the service's audio
clock, the pipeline audio this service has received since it started, across reconnects and
settings changes; keepalive silence is not on it. ``utterance_index`` likewise keeps counting
across streams.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import deque
from collections.abc import AsyncGenerator
from dataclasses import dataclass, field, replace
from typing import Any

import grpc
from loguru import logger
from pipecat.audio.utils import create_stream_resampler
from pipecat.frames.frames import (
    CancelFrame,
    EndFrame,
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
from pipecat.utils.errors import ErrorCategory
from pipecat.utils.network import QuickFailureTracker, exponential_backoff_time
from pipecat.utils.time import time_now_iso8601
from pipecat.utils.types import NOT_GIVEN, NotGiven

from voxgate_client import (
    AS_FAST_AS_ALLOWED,
    Call,
    CallConfig,
    CallEndedError,
    EndOfTurn,
    ErrorEvent,
    QualityChanged,
    SessionStarted,
    SpeechBegin,
    Transcript,
    TurnDetectionName,
    TurnOptions,
    VadOptions,
    VoxgateClient,
    VoxgateError,
)

from ._errors import error_category

__all__ = ["DEFAULT_KEYTERM_BOOST", "VoxgateSTTService", "VoxgateSTTSettings"]

#: Input rates the gateway takes as they are; others are resampled to 16 kHz here.
SERVED_RATES_HZ = (8000, 16000, 24000, 48000)

#: How long ``stop`` waits for the finals of audio still in flight after the hangup, s.
DRAIN_TIMEOUT_S = 30.0

#: Measured on the bundled base model on 2 CPU cores (benchmarks/framework_latency.py): p99 of
#: end of speech -> final through this service. Override with ``ttfs_p99_latency``.
DEFAULT_TTFS_P99_S = 1.0

#: Boost of a keyterm, in nats (the server's ``phrase^boost`` hotword; it caps boosts at 10).
#: 6 is the value docs/decode_loop.md measured (9 of 10 domain terms recognised).
DEFAULT_KEYTERM_BOOST = 6.0

#: Audio kept for the next stream when a send finds the stream dead before the reconnect
#: starts (the moments between the server's end and the reader seeing it), s.
UNSENT_LIMIT_S = 10.0

#: Most audio a new stream hears again of what a dead one took since its last final, s.
#: Within the server's burst allowance (5 s by default), and the sends are paced.
REPLAY_LIMIT_S = 4.0


@dataclass
class VoxgateSTTSettings(STTSettings):
    """Runtime-updatable settings (``STTUpdateSettingsFrame(delta=VoxgateSTTSettings(...))``).

    ``model`` and ``language`` are inherited (a model name the server lists; a Pipecat
    ``Language`` or a code such as ``"en"``; None = the server's default / detection).
    A change reconnects with the new config once the user's turn has ended.

    Parameters:
        hotwords: words or phrases to bias recognition towards (Whisper hotwords, sent as
            written: ``"Zorblax^6"`` is boosted by 6 nats, a word without ``^`` only goes into
            the decoding prompt).
        keyterms: terms to recognise (product and person names): each is sent as the boosted
            hotword ``term^keyterm_boost``.
        keyterm_boost: the boost of each keyterm, nats (the server caps it at 10).
        initial_prompt: decoding prompt (context, spelling of names).
        interim_results: ask for interim transcripts of the growing utterance.
        interim_interval_ms: interval between interims (0 = the server's default).
        end_silence_ms: the server VAD's trailing silence before it ends an utterance on its
            own (0 = server default).
    """

    hotwords: list[str] | NotGiven = field(default_factory=lambda: NOT_GIVEN)
    keyterms: list[str] | NotGiven = field(default_factory=lambda: NOT_GIVEN)
    keyterm_boost: float | NotGiven = field(default_factory=lambda: NOT_GIVEN)
    initial_prompt: str | NotGiven = field(default_factory=lambda: NOT_GIVEN)
    interim_results: bool | NotGiven = field(default_factory=lambda: NOT_GIVEN)
    interim_interval_ms: int | NotGiven = field(default_factory=lambda: NOT_GIVEN)
    end_silence_ms: int | NotGiven = field(default_factory=lambda: NOT_GIVEN)


@dataclass
class _Stream:
    """One recognition stream and where its own clock sits on the service's audio clock.

    The server times a stream's events from the stream's first sample, counting everything
    sent on it; the service's clock counts pipeline audio only, over every stream.
    """

    call: Call
    #: The service's clock at this stream's first sample, s.
    base_s: float
    #: Utterances of the streams before this one (its own indexes start at 0).
    index_base: int
    #: When it opened (monotonic), for Pipecat's quick-failure tracking.
    opened_at: float = field(default_factory=time.monotonic)
    #: Everything sent on it (pipeline audio and keepalive silence), s.
    sent_s: float = 0.0
    #: Keepalive silences on the stream's own clock: (start, length), s.
    silences: list[tuple[float, float]] = field(default_factory=list)
    #: One more than the highest utterance index it reported.
    utterances: int = 0
    reader: asyncio.Task[None] | None = None
    #: This service ended it (hangup, close, a settings change): its end is no drop.
    ended_here: bool = False
    #: Pipeline audio sent since its last final, with where each piece starts on the
    #: service's clock (s): what a new stream hears again if this one dies.
    replay: deque[tuple[float, bytes, float]] = field(default_factory=deque)
    #: When its first write went (loop time), for pacing.
    first_write_at: float | None = None

    def sent_audio(self, audio: bytes, seconds: float) -> None:
        """Keep pipeline audio just sent, up to ``REPLAY_LIMIT_S``."""
        start_s = self.base_s + self.audio_s
        self.replay.append((start_s, audio, seconds))
        while self.replay and start_s + seconds - self.replay[0][0] > REPLAY_LIMIT_S:
            self.replay.popleft()

    def settle(self, heard_s: float) -> None:
        """The server decided the audio up to ``heard_s`` (a final's end, service clock)."""
        while self.replay and self.replay[0][0] + self.replay[0][2] <= heard_s:
            self.replay.popleft()

    @property
    def audio_s(self) -> float:
        """Pipeline audio sent on this stream, s."""
        return self.sent_s - sum(length for _, length in self.silences)

    def service_ms(self, stream_ms: int) -> int:
        """A time on this stream's clock as a time on the service's audio clock."""
        t = stream_ms / 1000
        inserted = sum(min(length, t - start) for start, length in self.silences if start < t)
        return round((self.base_s + t - inserted) * 1000)

    def rebase(self, t: Transcript) -> Transcript:
        """``t`` with its times and utterance index on the service's clock and count."""
        self.utterances = max(self.utterances, t.utterance_index + 1)
        return replace(
            t,
            start_ms=self.service_ms(t.start_ms),
            end_ms=self.service_ms(t.end_ms),
            utterance_index=self.index_base + t.utterance_index,
            words=tuple(
                replace(w, start_ms=self.service_ms(w.start_ms), end_ms=self.service_ms(w.end_ms))
                for w in t.words
            ),
        )


class VoxgateSTTService(STTService):
    """Streaming speech-to-text from a voxgate gateway.

    Args:
        target: ``host:port`` of the gateway.
        tls: False (plaintext), True (system roots) or ``grpc.ChannelCredentials``.
        token: bearer token, when the gateway requires one.
        server_turns: let voxgate's VAD propose turn starts and stops (see module docstring).
        turn_detection: ask the server for end-of-turn detection: ``"smart"`` (silence, the
            words so far and its audio model), ``"silence"`` (every utterance is a turn) or
            ``"off"``; None = the server's default (off unless its operator set one). With
            ``"smart"``/``"silence"`` the server's EndOfTurn ends the user's turn (see module
            docstring); ``server_turns`` is then implied.
        turn_eagerness: ``"smart"``: how readily a turn ends, 0..1 (0 = the server's default).
        reconnect_attempts: how many times a refused stream is tried before the service gives
            up (the first reopening after the server ended a stream is immediate, later ones
            follow Pipecat's exponential backoff).
        reconnect_backoff_min_wait: shortest wait between refused attempts, s.
        reconnect_backoff_max_wait: longest wait between refused attempts, s.
        settings: initial :class:`VoxgateSTTSettings`.
        **kwargs: passed to Pipecat's ``STTService`` (``sample_rate``, ``audio_passthrough``,
            ``ttfs_p99_latency``, ``keepalive_timeout``, ``keepalive_interval``...).
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
        turn_detection: TurnDetectionName | None = None,
        turn_eagerness: float = 0.0,
        reconnect_attempts: int = 3,
        reconnect_backoff_min_wait: float = 4.0,
        reconnect_backoff_max_wait: float = 10.0,
        settings: VoxgateSTTSettings | None = None,
        **kwargs: Any,
    ) -> None:
        if reconnect_attempts < 1:
            raise ValueError(f"reconnect_attempts={reconnect_attempts}; at least 1")
        defaults = VoxgateSTTSettings(
            model=None,
            language=None,
            hotwords=[],
            keyterms=[],
            keyterm_boost=DEFAULT_KEYTERM_BOOST,
            initial_prompt="",
            interim_results=True,
            interim_interval_ms=0,
            end_silence_ms=0,
        )
        if settings is not None:
            defaults.apply_update(settings)
        kwargs.setdefault("ttfs_p99_latency", DEFAULT_TTFS_P99_S)
        super().__init__(settings=defaults, **kwargs)
        self._target = target
        self._tls = tls
        self._token = token
        self._turn_options = (
            TurnOptions(mode=turn_detection, eagerness=turn_eagerness)
            if turn_detection is not None
            else TurnOptions()
        )
        #: The server's EndOfTurn ends the user's turn (the turn proposals follow it).
        self._turns = turn_detection in ("silence", "smart")
        self._server_turns = server_turns or self._turns
        #: A proposed turn is open (with ``_turns``): its start was broadcast, not its stop.
        self._turn_open = False
        #: With ``_turns``: the open turn's finals, shown as interims until its EndOfTurn
        #: brings the turn's text (or the stream ends first: then they are the text).
        self._turn_finals: list[Transcript] = []
        #: One write and its bookkeeping at a time (pipeline audio and keepalive silence).
        self._write_lock = asyncio.Lock()
        self._reconnect_attempts = reconnect_attempts
        self._backoff_min_s = reconnect_backoff_min_wait
        self._backoff_max_s = reconnect_backoff_max_wait
        self._client: VoxgateClient | None = None
        self._stream: _Stream | None = None
        #: The service's audio clock at the end of the last stream closed, s.
        self._clock_s = 0.0
        self._utterances = 0
        #: Refused attempts in a row; 0 after a stream opens.
        self._failures = 0
        self._quick_failures = QuickFailureTracker()
        #: A reconnect started by the reader (a task of its own: it replaces the reader).
        self._recovery: asyncio.Task[None] | None = None
        #: Audio a send found no live stream for, before the reconnect's buffering began.
        self._unsent: list[bytes] = []
        self._unsent_s = 0.0
        #: Utterances begun whose final has not arrived: the proposed turn is open while any is.
        self._open_utterances: set[int] = set()
        self._resampler = create_stream_resampler()
        #: ``SessionStarted`` of every stream opened, oldest first (the server's effective
        #: config of each, e.g. after a settings change or a reconnect).
        self.sessions: list[SessionStarted] = []
        self._register_event_handler("on_end_of_turn")

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

    def _classify_error(self, exception: Exception) -> ErrorCategory | None:
        """Pipecat categories of gRPC statuses (a refused model is permanent, a drop is not)."""
        return error_category(exception)

    async def start(self, frame: StartFrame) -> None:
        """Open the channel and the recognition stream at the pipeline's input rate.

        A refusal that retrying may fix (the server is restarting, at capacity) is retried in
        the background, with the audio buffered meanwhile.
        """
        await super().start(frame)
        self._client = VoxgateClient(self._target, self._tls, self._token)
        if await self._try_open() == "retry":
            self._recovery = self.create_task(
                self._reconnect(),  # type: ignore[no-untyped-call]
                name="voxgate-stt-reconnect",
            )
        self._create_keepalive_task()  # type: ignore[no-untyped-call]

    async def stop(self, frame: EndFrame) -> None:
        """Graceful end: hang up, so the server finalises the open utterance, and wait for it.

        The finals are pushed before the ``EndFrame`` continues downstream. A reconnect in
        progress finishes first, so the audio it holds is heard too.
        """
        recovery = self._recovery
        if recovery is not None and not recovery.done():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(asyncio.shield(recovery), DRAIN_TIMEOUT_S)
        await self._cancel_recovery()
        s = self._stream
        if s is not None and s.reader is not None and not s.call.done:
            s.ended_here = True
            try:
                await s.call.hangup()
                await asyncio.wait_for(asyncio.shield(s.reader), DRAIN_TIMEOUT_S)
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
        await self._send(audio, keepalive=False)
        yield None

    def _is_keepalive_ready(self) -> bool:
        """Keepalive silence goes out only on a live stream (never into a reconnect)."""
        s = self._stream
        return s is not None and not s.call.done and not self._reconnecting

    async def _send_keepalive(self, silence: bytes) -> None:
        """Pipecat's keepalive: its silence into the stream, off the service's audio clock."""
        await self._send(silence, keepalive=True)

    async def _do_reconnect(self) -> None:
        """Pipecat's reconnect step (inside its buffering guard): a new stream.

        Refusals are retried with backoff; the audio the last stream could not take is
        replayed first, then Pipecat replays what arrived during the reconnect.
        """
        await self._close_stream()
        while True:
            if self._failures:
                await asyncio.sleep(
                    exponential_backoff_time(
                        self._failures, min_wait=self._backoff_min_s, max_wait=self._backoff_max_s
                    )
                )
            outcome = await self._try_open()
            if outcome != "retry":
                break
        unsent, self._unsent, self._unsent_s = self._unsent, [], 0.0
        if outcome == "open":
            for audio in unsent:
                await self._send(audio, keepalive=False)

    async def process_frame(self, frame: Frame, direction: FrameDirection) -> None:
        """The pipeline's end of the user's speech finalises the utterance now (Flush)."""
        await super().process_frame(frame, direction)
        s = self._stream
        if (
            isinstance(frame, VADUserStoppedSpeakingFrame)
            and not self._server_turns
            and s is not None
            and not s.call.done
        ):
            self.request_finalize()  # type: ignore[no-untyped-call]
            try:
                await s.call.flush()
            except (VoxgateError, CallEndedError) as exc:
                await self.push_error(f"voxgate flush failed: {exc}")

    # Pipecat narrows the argument to STTSettings itself (STTService._update_settings).
    async def _update_settings(self, delta: STTSettings) -> dict[str, Any]:  # type: ignore[override]
        changed = await super()._update_settings(delta)
        if changed and self._client is not None:
            # Every setting is part of the stream's first message: a new stream applies it,
            # once the user's turn is over (Pipecat defers the reconnect while they speak).
            await self._request_reconnect()  # type: ignore[no-untyped-call]
        return changed

    # -- the stream ------------------------------------------------------------------------------

    @property
    def _wire_rate(self) -> int:
        return self.sample_rate if self.sample_rate in SERVED_RATES_HZ else 16000

    def call_config(self) -> CallConfig:
        """The voxgate config the current settings describe (public for tests and logs)."""
        s = self._settings
        language = s.language if isinstance(s.language, str) else None
        hotwords = list(s.hotwords) if isinstance(s.hotwords, list) else []
        if isinstance(s.keyterms, list) and s.keyterms:
            boost = s.keyterm_boost if isinstance(s.keyterm_boost, int | float) else None
            hotwords += [_boosted(term, boost or DEFAULT_KEYTERM_BOOST) for term in s.keyterms]
        return CallConfig(
            encoding="linear16",
            sample_rate_hz=self._wire_rate,
            interim_results=bool(s.interim_results),
            interim_interval_ms=(
                s.interim_interval_ms if isinstance(s.interim_interval_ms, int) else 0
            ),
            language=language or "",
            model=s.model if isinstance(s.model, str) else "",
            word_timestamps=True,
            hotwords=tuple(hotwords),
            initial_prompt=s.initial_prompt if isinstance(s.initial_prompt, str) else "",
            vad=VadOptions(
                end_silence_ms=s.end_silence_ms if isinstance(s.end_silence_ms, int) else 0
            ),
            turns=self._turn_options,
        )

    async def _try_open(self) -> str:
        """Open a stream: ``"open"``; refused, worth another try: ``"retry"``; else ``"gave_up"``.

        Every refusal is reported; the one that ends the trying is reported as permanent.
        """
        assert self._client is not None
        try:
            call = await self._client.recognize(self.call_config())
        except VoxgateError as exc:
            self._failures += 1
            category = error_category(exc) or ErrorCategory.UNKNOWN
            last = category.is_permanent or self._failures >= self._reconnect_attempts
            await self.push_error(
                f"voxgate refused the stream: {exc}"
                + ("" if last else f" (attempt {self._failures}, retrying)"),
                exception=exc,
                force_treat_as_permanent=last,
            )
            if not last:
                await self._call_event_handler("on_connection_error", str(exc))
            return "gave_up" if last else "retry"
        self._failures = 0
        s = _Stream(call, base_s=self._clock_s, index_base=self._utterances)
        self._stream = s
        if call.session is not None:
            self.sessions.append(call.session)
        await self._call_event_handler("on_connected")
        s.reader = self.create_task(self._read(s), name="voxgate-stt-reader")
        return "open"

    async def _send(self, audio: bytes, *, keepalive: bool) -> None:
        """Send pipeline audio (or keepalive silence) at the pipeline's rate.

        Audio for a stream the server ended starts Pipecat's reconnect cycle (in a task of
        its own, so frames keep flowing downstream meanwhile) and is sent on the new stream.
        """
        s = self._stream
        seconds = len(audio) / (2 * self.sample_rate)
        if s is None or s.call.done or s.ended_here:
            if not keepalive and s is not None and not s.ended_here:
                self._keep_unsent(audio, seconds)
                if self.is_usable and (self._recovery is None or self._recovery.done()):
                    self._recovery = self.create_task(
                        self._reconnect(),  # type: ignore[no-untyped-call]
                        name="voxgate-stt-reconnect",
                    )
            return
        wire = audio
        if self.sample_rate != self._wire_rate:
            wire = await self._resampler.resample(audio, self.sample_rate, self._wire_rate)
        # Paced as the client library paces a file: a backlog (replayed audio, what buffered
        # during a reconnect) goes no faster than the server's real-time limit accepts.
        loop = asyncio.get_running_loop()
        if s.first_write_at is not None:
            due = s.first_write_at + AS_FAST_AS_ALLOWED.due_s(s.sent_s * 1000)
            if (wait := due - loop.time()) > 0:
                await asyncio.sleep(wait)
        async with self._write_lock:
            try:
                await s.call.send_audio(wire)
            except (VoxgateError, CallEndedError):
                # The stream just ended (the reader reports why); the next audio reconnects.
                if not keepalive and not s.ended_here:
                    self._keep_unsent(audio, seconds)
                return
            if s.first_write_at is None:
                s.first_write_at = loop.time()
            if keepalive:
                s.silences.append((s.sent_s, seconds))
            else:
                s.sent_audio(audio, seconds)
            s.sent_s += seconds

    def _keep_unsent(self, audio: bytes, seconds: float) -> None:
        self._unsent.append(audio)
        self._unsent_s += seconds
        while self._unsent_s > UNSENT_LIMIT_S:
            dropped = self._unsent.pop(0)
            self._unsent_s -= len(dropped) / (2 * self.sample_rate)

    async def _close_stream(self) -> None:
        s, self._stream = self._stream, None
        if s is None:
            return
        hung_up = s.ended_here
        s.ended_here = True
        await s.call.aclose()
        if s.reader is not None and s.reader is not asyncio.current_task():
            await self.cancel_task(s.reader)
        await self._release_turn()  # no EndOfTurn will come for it on this stream
        self._clock_s = s.base_s + s.audio_s
        self._utterances = s.index_base + s.utterances
        if not hung_up and s.replay:
            # Dropped or cancelled: the next stream hears again what this one took since
            # its last final, ahead of what it could not send, and its clock starts there.
            self._clock_s = s.replay[0][0]
            self._unsent[:0] = [audio for _, audio, _ in s.replay]
            self._unsent_s += sum(seconds for _, _, seconds in s.replay)

    async def _cancel_recovery(self) -> None:
        task, self._recovery = self._recovery, None
        if task is not None and task is not asyncio.current_task():
            await self.cancel_task(task)

    async def _close(self) -> None:
        await self._cancel_recovery()
        await self._close_stream()
        client, self._client = self._client, None
        if client is not None:
            await client.aclose()
            await self._call_event_handler("on_disconnected")

    async def _read(self, s: _Stream) -> None:
        error: VoxgateError | None = None
        try:
            async for event in s.call:
                if isinstance(event, SpeechBegin):
                    s.utterances = max(s.utterances, event.utterance_index + 1)
                    await self._speech_began(s.index_base + event.utterance_index)
                elif isinstance(event, Transcript):
                    t = s.rebase(event)
                    if t.is_final:
                        s.settle(t.end_ms / 1000)
                    await self._transcript(t)
                elif isinstance(event, EndOfTurn):
                    await self._end_of_turn(s, event)
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
            error = exc
        if s.ended_here or self._stream is not s:
            return  # this service ended it
        await self._dropped(s, error)

    async def _dropped(self, s: _Stream, error: VoxgateError | None) -> None:
        """The server ended a stream this service still used.

        As Pipecat's websocket services do, a drop is a warning and the ``on_connection_error``
        event; only a failed reconnection is an ``ErrorFrame``. The next audio opens a new
        stream (:meth:`_send`): a pipeline that stays silent past the server's idle timeout
        holds no stream until its user speaks. A stream the server refuses for good (a
        permanent status), or that keeps ending within seconds of opening, is given up.
        """
        why = str(error) if error is not None else "the server ended the stream"
        lasted_s = time.monotonic() - s.opened_at
        category = error_category(error) if error is not None else None
        give_up = category is not None and category.is_permanent
        if self._quick_failures.record(lasted_s).should_give_up:
            give_up = True
            why += f" ({self._quick_failures.count} streams in a row ended within seconds)"
        await self._call_event_handler("on_connection_error", why)
        # The dead stream's open utterances get no final: close the turn they opened (the
        # new stream proposes a new one when it hears speech); its finals are not lost.
        await self._release_turn()
        if self._open_utterances or self._turn_open:
            self._open_utterances.clear()
            self._turn_open = False
            await self.broadcast_frame(ProposedUserStoppedSpeakingFrame)
        if give_up:
            await self.push_error(
                f"voxgate stream ended: {why}", exception=error, force_treat_as_permanent=True
            )
        else:
            logger.warning(f"{self}: voxgate stream ended: {why}; the next audio reconnects")

    async def _speech_began(self, utterance: int) -> None:
        # Utterances overlap on the wire: the next one can begin before the previous one's
        # final is decoded. One proposed turn spans them all.
        if self._turns:
            if not self._turn_open:
                self._turn_open = True
                await self.broadcast_frame(ProposedUserStartedSpeakingFrame)
            return
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
                        self._turn_so_far(t), self._user_id, time_now_iso8601(), language, result=t
                    )
                )
            return
        # The first final after a Flush is the one that Flush produced.
        self.confirm_finalize()  # type: ignore[no-untyped-call]
        if self._turns and t.text:
            # The turn's text comes with its EndOfTurn; until then the final shows as the
            # turn so far, as Flux's updates do.
            self._turn_finals.append(t)
            await self.push_frame(
                InterimTranscriptionFrame(
                    self._turn_so_far(), self._user_id, time_now_iso8601(), language, result=t
                )
            )
            return
        if t.text:
            await self.emit_stt_usage_metrics()  # type: ignore[no-untyped-call]
            await self.push_frame(
                TranscriptionFrame(t.text, self._user_id, time_now_iso8601(), language, result=t)
            )
        else:
            # A flushed utterance that held no words still ends the TTFB measurement.
            await self.stop_ttfb_metrics()
        if self._server_turns and not self._turns and t.utterance_index in self._open_utterances:
            self._open_utterances.discard(t.utterance_index)
            if not self._open_utterances:
                await self.broadcast_frame(ProposedUserStoppedSpeakingFrame)

    async def _end_of_turn(self, s: _Stream, eot: EndOfTurn) -> None:
        """The server says the user's turn is over: close the proposed turn (after its finals).

        ``on_end_of_turn`` gets the event with its offset and utterances on the service's
        clock and count, as Deepgram Flux's service fires its own ``on_end_of_turn``.
        """
        if not self._turns:
            return  # the server's own default turned it on; this service did not ask
        eot = replace(
            eot,
            offset_ms=s.service_ms(eot.offset_ms),
            first_utterance_index=s.index_base + eot.first_utterance_index,
            last_utterance_index=s.index_base + eot.last_utterance_index,
        )
        await self._release_turn(eot)
        if self._turn_open:
            self._turn_open = False
            await self.broadcast_frame(ProposedUserStoppedSpeakingFrame)
        await self._call_event_handler("on_end_of_turn", eot)

    def _turn_so_far(self, interim: Transcript | None = None) -> str:
        """The open turn's finals and ``interim`` (the utterance still being heard), joined."""
        parts = [t.text.strip() for t in self._turn_finals]
        if interim is not None:
            parts.append(interim.text.strip())
        return " ".join(p for p in parts if p)

    async def _release_turn(self, eot: EndOfTurn | None = None) -> None:
        """Push the open turn's transcript: one ``TranscriptionFrame`` per turn.

        With the server's ``eot``: its text (the turn decoded whole, or its finals joined),
        ``finalized``, as Deepgram Flux's service pushes its turn transcript on its
        EndOfTurn: Pipecat reads ``finalized`` as "this transcript is complete" (its STT
        span and TTFB end there, and its turn stop strategies stop waiting for text).
        Without (the stream ended before the turn did): the finals heard so far, not
        finalized, as Flux's service does for a turn its connection cut short. Nothing when
        the turn holds no words.
        """
        finals, self._turn_finals = self._turn_finals, []
        text = eot.text.strip() if eot is not None else ""
        if not text:
            text = " ".join(t.text.strip() for t in finals if t.text.strip())
        if not text:
            return
        language = _language(finals[-1].language) if finals else None
        await self.emit_stt_usage_metrics()  # type: ignore[no-untyped-call]
        await self.push_frame(
            TranscriptionFrame(
                text,
                self._user_id,
                time_now_iso8601(),
                language,
                result=eot if eot is not None else finals[-1],
                finalized=eot is not None,
            )
        )


def _boosted(term: str, boost: float) -> str:
    """``term`` as the server's boosted hotword (``term^boost``), unless it carries a boost."""
    term = term.strip()
    return term if "^" in term else f"{term}^{boost:g}"


def _language(code: str) -> Language | None:
    try:
        return Language(code) if code else None
    except ValueError:
        return None
