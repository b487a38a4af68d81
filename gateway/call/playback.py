"""A call's replies: synthesis, paced frames, marks, stop and clear, and the length cap.

The ``tts`` task of a call (:meth:`Playback.run`) plays queued Speak requests one after the
other, paced at real time on an absolute clock, and is the only task barge-in touches: a cut
(:meth:`Playback.stop`) cancels the reply being played and reports what the caller heard of it.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field, replace

import numpy as np

from voxgate.common.aio import being_cancelled, cancel_and_wait
from voxgate.common.pcm import bytes_per_ms
from voxgate.gateway.audio import OutputEncoder
from voxgate.gateway.barge_in import BargeInPolicy
from voxgate.gateway.base import Synthesizer, TtsPiece
from voxgate.gateway.call.options import PlaybackOptions
from voxgate.gateway.call.queues import END, End
from voxgate.gateway.config import LimitsConfig
from voxgate.gateway.degrade import QualityLevel
from voxgate.gateway.errors import CallError, ErrorKind
from voxgate.gateway.events import (
    AudioOutEvent,
    ErrorOut,
    InterruptedOut,
    MarkIn,
    MarkReachedOut,
    OutboundEvent,
    PlaybackFinishedOut,
    SpeakIn,
)

__all__ = ["FRAME_MS", "Playback", "Reply", "SynthesisCap"]

log = logging.getLogger("voxgate.session")

#: Outgoing audio is cut into frames of this length; barge-in stops within one frame.
FRAME_MS = 20


@dataclass
class Reply:
    """State of the Speak being played, shared by the tts task and barge-in."""

    speak: SpeakIn
    started_at: float = 0.0  # loop time when its first frame was due
    sent_ms: int = 0
    words: list[tuple[str, int]] = field(default_factory=list)
    policy: BargeInPolicy = field(default_factory=BargeInPolicy)
    #: Utterances heard over this reply -> their SPEECH_BEGIN offset, ms: speech that began
    #: during it, and speech in progress when it started that went on over it
    #: (``BargeIn.speech_in_progress``).
    heard_from: dict[int, int] = field(default_factory=dict)
    #: The speech in progress when the first frame went out has been looked at once, and its
    #: voiced time then (what the caller says over the reply is counted from there).
    looked_at_speech: bool = False
    voiced_ms_at_start: int = 0


class Playback:
    """Plays one call's replies; :meth:`run` is the call's ``tts`` task.

    Args:
        options: output format and playout.
        limits: per-call limits (``max_queued_speaks``, ``max_synthesis_s``).
        synthesizer: the shared voice, or None when the server runs without TTS.
        converse: whether the call is a Converse (a StreamingRecognize call plays nothing).
        quality: the server's degradation level (it may shed parts of a Speak).
        emit: queues an event for the client (the send task writes it).
        start_reply: called as each reply starts: its barge-in policy (the call's, as the
            Speak overrides it), and barge-in forgets speech pending from before it.
        frame_sent: called with each frame as it leaves (the echo guard's reference), if any.
        log_id: the call's id in log lines.
    """

    def __init__(
        self,
        options: PlaybackOptions,
        limits: LimitsConfig,
        synthesizer: Synthesizer | None,
        *,
        converse: bool,
        quality: QualityLevel,
        emit: Callable[[OutboundEvent], Awaitable[None]],
        start_reply: Callable[[SpeakIn], BargeInPolicy],
        frame_sent: Callable[[bytes], None] | None,
        log_id: str,
    ) -> None:
        self._options = options
        self._limits = limits
        self._synth = synthesizer
        self._converse = converse
        self._quality = quality
        self._emit = emit
        self._start_reply = start_reply
        self._frame_sent = frame_sent
        self._log_id = log_id
        self._speaks: asyncio.Queue[SpeakIn | MarkIn | End] = asyncio.Queue(
            maxsize=limits.max_queued_speaks
        )
        #: The reply being played, if one is.
        self.current: Reply | None = None
        self._task: asyncio.Task[None] | None = None
        self._seq = 0
        self._encoder = (
            OutputEncoder(options.encoding, options.rate_hz, synthesizer.sample_rate_hz)
            if synthesizer is not None and converse
            else None
        )

    def accept(self, event: SpeakIn | MarkIn) -> None:
        """Queue a Speak or Mark from the client.

        Raises:
            CallError: not a Converse call, no voice, or ``max_queued_speaks`` queued already.
        """
        if not self._converse:
            raise CallError.invalid(
                "speak/mark are not accepted on StreamingRecognize; use Converse"
            )
        if self._synth is None and isinstance(event, SpeakIn):
            raise CallError(
                ErrorKind.FAILED_PRECONDITION,
                "this server runs without a voice (engines setting excludes 'tts'); "
                "Speak is unavailable",
            )
        if self._speaks.full():
            raise CallError.exhausted(
                f"more than max_queued_speaks={self._limits.max_queued_speaks} Speak/Mark "
                "requests are queued; wait for playback or send Clear",
                quota="max_queued_speaks",
            )
        self._speaks.put_nowait(event)

    async def close(self) -> None:
        """No more replies: :meth:`run` ends after those queued."""
        await self._speaks.put(END)

    async def run(self) -> None:
        """Play queued replies and reach marks, in order, until :meth:`close`."""
        loop = asyncio.get_running_loop()
        playout_until = loop.time()
        while True:
            item = await self._speaks.get()
            if isinstance(item, End):
                return
            if isinstance(item, MarkIn):
                # A mark is reached when everything queued before it has been heard.
                delay = playout_until - loop.time()
                if delay > 0:
                    await asyncio.sleep(delay)
                await self._emit(MarkReachedOut(item.name))
                continue
            # Speech in progress now counts only once the reply plays and the caller is heard
            # over it (BargeIn.speech_in_progress), not at once: they may be done by then.
            pb = Reply(item, policy=self._start_reply(item))
            self.current = pb
            task = asyncio.create_task(self._play(pb), name="playback")
            self._task = task
            try:
                await task
            except asyncio.CancelledError:
                # Barge-in and Clear cancel the playback task, which ends this await with
                # CancelledError too; only a cancellation of this task (the call ending) must
                # propagate. Swallowing that one left v0.1's calls open forever.
                if being_cancelled() or not task.cancelled():
                    raise
            finally:
                self.current = None
                self._task = None
            playout_until = max(loop.time(), pb.started_at + pb.sent_ms / 1000.0)

    async def _play(self, pb: Reply) -> None:
        assert self._synth is not None and self._encoder is not None
        loop = asyncio.get_running_loop()
        self._encoder.reset()
        frame_bytes = int(bytes_per_ms(self._options.encoding, self._options.rate_hz) * FRAME_MS)
        lead_s = self._options.lead_ms / 1000.0
        prebuffer_s = self._options.prebuffer_ms / 1000.0
        pieces: asyncio.Queue[TtsPiece | End | BaseException] = asyncio.Queue(maxsize=4)

        async def produce() -> None:
            assert self._synth is not None
            try:
                speech = self._synth.stream(replace(self._quality.speak(pb.speak), paced=True))
                async for piece in cap.apply(speech):
                    await pieces.put(piece)
            except asyncio.CancelledError:
                raise
            except BaseException as exc:
                await pieces.put(exc)
                return
            await pieces.put(END)

        cap = SynthesisCap(self._limits.max_synthesis_s, self._synth.sample_rate_hz)
        producer = asyncio.create_task(produce(), name="tts-producer")
        pending = b""
        try:
            while True:
                piece = await pieces.get()
                if isinstance(piece, BaseException):
                    await self._emit(self._speak_failure(piece, pb.speak.speak_id))
                    return
                last = isinstance(piece, End)
                if not last:
                    assert isinstance(piece, TtsPiece)
                    pb.words.extend(piece.words)
                    pending += self._encoder.encode(piece.samples)
                else:
                    pending += self._encoder.encode(np.zeros(0, np.float32), last=True)
                # One frame stays behind until the end is known, so that the last frame sent
                # carries is_last even when the reply is a whole number of frames long.
                while len(pending) > frame_bytes or (last and pending):
                    frame, pending = pending[:frame_bytes], pending[frame_bytes:]
                    if pb.started_at == 0.0:
                        pb.started_at = loop.time() + lead_s
                    # Paced on an absolute clock: frame k leaves `lead` before it is due
                    # (the playout that barge-in accounting, marks and the echo guard assume:
                    # `lead` after the first frame left), and `prebuffer` sooner still, so
                    # that a client that plays frames as they arrive is never a frame's
                    # jitter away from running dry: it holds `prebuffer` from the first.
                    due = pb.started_at + pb.sent_ms / 1000.0 - lead_s - prebuffer_s
                    delay = due - loop.time()
                    if delay > 0:
                        await asyncio.sleep(delay)
                    offset = pb.sent_ms
                    pb.sent_ms += (
                        FRAME_MS
                        if len(frame) == frame_bytes
                        else int(len(frame) / frame_bytes * FRAME_MS)
                    )
                    self._seq += 1
                    await self._emit(
                        AudioOutEvent(
                            frame, self._seq, pb.speak.speak_id, offset, last and not pending
                        )
                    )
                    if self._frame_sent is not None:
                        self._frame_sent(frame)
                if last:
                    break
            if cap.cut:
                await self._emit(
                    ErrorOut(
                        ErrorKind.INVALID_ARGUMENT,
                        cap.message("speak.text"),
                        "speak",
                        speak_id=pb.speak.speak_id,
                    )
                )
            # Wait until the tail has been heard, so barge-in during the last frames still counts.
            remaining = pb.started_at + pb.sent_ms / 1000.0 - loop.time()
            if remaining > 0:
                await asyncio.sleep(remaining)
            await self._emit(PlaybackFinishedOut(pb.speak.speak_id, pb.sent_ms))
        finally:
            await cancel_and_wait(producer)

    def _speak_failure(self, exc: BaseException, speak_id: str) -> ErrorOut:
        """A Speak that could not be synthesized: an error event, and the call goes on."""
        if isinstance(exc, CallError):
            return ErrorOut(exc.kind, exc.message, "speak", speak_id=speak_id)
        # An engine fault: the details go to the log (with the call id), not to the client.
        log.error("call %s: speak failed", self._log_id, exc_info=exc)
        return ErrorOut(
            ErrorKind.INTERNAL,
            f"speech synthesis failed (internal error; server log has call {self._log_id})",
            "speak",
            speak_id=speak_id,
        )

    async def stop(
        self, *, reason_offset_ms: int, clear_queue: bool, caller_text: str = ""
    ) -> None:
        """Cut the reply being played (barge-in, Clear, hangup), and the queued ones too.

        With ``clear_queue`` the replies queued behind it are dropped; each reply cut is
        reported as interrupted.
        """
        # Every Speak ends with exactly one PlaybackFinished or PlaybackInterrupted, also one
        # that was still queued behind the reply being cut: a client counts its open replies
        # by those events (and would otherwise wait for one forever).
        # Marks queued behind the cut replies stay, in order, and are reached at once (the
        # audio before them will never play): dropping them left a client that waits for its
        # mark waiting forever; a media-stream provider likewise returns its marks on clear.
        dropped: list[SpeakIn] = []
        if clear_queue:
            kept: list[MarkIn | End] = []
            while not self._speaks.empty():
                item = self._speaks.get_nowait()
                if isinstance(item, SpeakIn):
                    dropped.append(item)
                else:
                    kept.append(item)
                if isinstance(item, End):  # nothing is queued after the end-of-call sentinel
                    break
            for item in kept:  # the queue held at least these, so they fit again
                self._speaks.put_nowait(item)
        pb, task = self.current, self._task
        # NOTE: two overlapping barge-in interims (or an interim and a Clear) may both stop
        # one reply; the first to cancel it reports it, exactly once.
        if pb is not None and task is not None and not task.done() and not task.cancelling():
            await cancel_and_wait(task)
            loop = asyncio.get_running_loop()
            heard_ms = 0 if pb.started_at == 0.0 else int((loop.time() - pb.started_at) * 1000)
            played = max(0, min(pb.sent_ms, heard_ms))
            words = tuple(w for w, end in pb.words if end <= played)
            await self._emit(
                InterruptedOut(pb.speak.speak_id, played, words, reason_offset_ms, caller_text)
            )
        for speak in dropped:
            await self._emit(InterruptedOut(speak.speak_id, 0, (), reason_offset_ms, caller_text))


class SynthesisCap:
    """Cuts one reply at ``limits.max_synthesis_s``, exactly, in the voice's own samples.

    The length of a reply is known only as it is synthesized (each sentence's durations come
    out of the front end), so a text that is too long cannot be refused up front; it is cut
    where the limit falls, the last piece marked last, and :attr:`cut` tells the caller to
    say so (an ErrorEvent on Converse, INVALID_ARGUMENT after the audio on Synthesize).
    """

    def __init__(self, max_s: float, sample_rate_hz: int) -> None:
        self.max_s = max_s
        self._left = round(max_s * sample_rate_hz)
        self.cut = False

    async def apply(self, stream: AsyncIterator[TtsPiece]) -> AsyncIterator[TtsPiece]:
        """``stream`` up to the limit; closes ``stream`` (no synthesis past the cut)."""
        try:
            async for piece in stream:
                n = len(piece.samples)
                if n < self._left or (n == self._left and piece.is_last):
                    self._left -= n
                    yield piece
                    continue
                self.cut = True
                max_ms = 1000.0 * self.max_s
                words = tuple(w for w in piece.words if w[1] <= max_ms)
                yield TtsPiece(piece.samples[: self._left], words, True)
                return
        finally:
            aclose = getattr(stream, "aclose", None)
            if aclose is not None:
                await aclose()

    def message(self, field: str) -> str:
        """The sentence that tells the client its reply was cut."""
        return (
            f"{field} would play longer than max_synthesis_s={self.max_s:g}; the reply was cut "
            "there (split the text into several requests)"
        )
