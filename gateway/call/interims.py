"""Interim decodes of one call: a pure policy that decides, and the driver that runs them.

Interims re-decode the growing utterance at low priority, for the client when it asked for
them and for barge-in: the ``after_words`` policy needs them while the caller talks over such a
reply, and then they run at ``barge_in_interval_ms`` from the first one on, which runs as soon
as the caller has said enough to decode (:attr:`.barge_in.BargeIn.interim_due` wakes the
driver). There, while one decodes, the next may start ``barge_in_overlap_ms`` after it on a
spare worker (at most two in flight): a first prefix too short to hold a word then costs that
spacing, not the rest of the decode and the interval after it.

:class:`InterimPolicy` is synchronous and knows no clock (it is given ``now``), shaped like the
batcher's ``BatchPolicy``: asked what to do, it answers wait for a decode to end
(:class:`AwaitDecode`), try at a time (:class:`AttemptAt`), and at that time whether to decode
the utterance as it stands (:class:`Decode`) or not. :class:`Interims` is the asyncio driver.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, replace

from voxgate.common.aio import cancel_and_wait
from voxgate.engines.asr.base import AsrRequest
from voxgate.gateway.base import Transcriber
from voxgate.gateway.call.barge_in import BargeIn
from voxgate.gateway.call.options import CallConfig, InterimOptions
from voxgate.gateway.call.recognition import Recognition
from voxgate.gateway.degrade import QualityLevel
from voxgate.gateway.errors import CallError
from voxgate.gateway.events import OutboundEvent, TranscriptOut
from voxgate.gateway.scheduling import WithdrawnError
from voxgate.gateway.segmenter import Segmenter, Utterance

__all__ = [
    "AttemptAt",
    "AwaitDecode",
    "Decode",
    "InterimPolicy",
    "InterimState",
    "Interims",
]


@dataclass(frozen=True, slots=True)
class AwaitDecode:
    """Wait until the first decode in flight ends (not the last), then ask again."""


@dataclass(frozen=True, slots=True)
class AttemptAt:
    """Attempt an interim at ``at`` (at once when ``at <= now``), or sooner on a wake.

    When a decode in flight ends first (and no wake came), ask again instead: the spacing is
    then the interval, no longer the overlap.
    """

    at: float


@dataclass(frozen=True, slots=True)
class Decode:
    """Decode the utterance as it stands now.

    Attributes:
        seq: the interim's sequence number (a later one shown first makes it stale).
        wanted: the client gets it (else only barge-in reads it).
        fast: the caller talks over an ``after_words`` reply.
        urgent: schedule it as a final (``AsrRequest.urgent``).
    """

    seq: int
    wanted: bool
    fast: bool
    urgent: bool


@dataclass(slots=True)
class InterimState:
    """What the policy remembers between questions (one per call)."""

    #: Samples of the utterance the last interim decoded (0 between utterances).
    last_len: int = 0
    #: When the last attempt started (loop time).
    started: float = -math.inf
    #: Sequence number of the last interim started.
    seq: int = 0
    #: The spacing of the attempt being waited for, ms.
    spacing_ms: int = 0


class InterimPolicy:
    """When a call's next interim runs; pure and synchronous, ``now`` is given.

    Rules:

    * The client's interims follow ``interval_ms`` after each attempt; over an ``after_words``
      reply (``fast``) they follow ``barge_in_interval_ms`` after the start of the last
      attempt, so the period is max(interval, decode) rather than interval + decode.
    * One decode at a time, except over such a reply with ``barge_in_overlap_ms``: a second may
      start that long after the first on a spare worker; the next follows the first to end.
    * An attempt decodes only when someone wants it (the client asked and the server does not
      shed interims, or barge-in listens for words), the utterance grew by half a spacing (or a
      wake asked for it now), and its final has not started nor, outside barge-in, is about to.
    """

    def __init__(self, options: InterimOptions) -> None:
        self.options = options

    def wait(
        self, state: InterimState, *, fast: bool, running: int, spare_worker: bool, now: float
    ) -> AwaitDecode | AttemptAt:
        """What to wait for before the next attempt.

        Args:
            state: the call's interim state.
            fast: the caller talks over an ``after_words`` reply.
            running: interim decodes in flight.
            spare_worker: the recogniser has an idle worker and nothing waiting.
            now: the loop's time.
        """
        opts = self.options
        interval_ms = opts.barge_in_interval_ms if fast else opts.interval_ms
        overlap_ms = opts.barge_in_overlap_ms if fast else 0
        if running and not (overlap_ms > 0 and running < 2 and spare_worker):
            return AwaitDecode()
        state.spacing_ms = overlap_ms if running else interval_ms
        wait_s = state.spacing_ms / 1000.0
        if fast:
            # NOTE: over an after_words reply the decode counts toward the interval, so the
            # period is max(interval, decode) rather than interval + decode: the words that may
            # interrupt are heard one decode sooner.
            wait_s = max(0.0, state.started + wait_s - now)
        return AttemptAt(now + wait_s)

    def attempt(
        self,
        state: InterimState,
        *,
        fast: bool,
        shed: bool,
        running: int,
        spare_worker: bool,
        now: float,
    ) -> bool:
        """An attempt starts now: whether to look at the growing utterance.

        Args:
            state: the call's interim state.
            fast: the caller talks over an ``after_words`` reply.
            shed: the server sheds interims under load (the client's; barge-in's still run).
            running: interim decodes in flight.
            spare_worker: the recogniser has an idle worker and nothing waiting.
            now: the loop's time.
        """
        state.started = now
        wanted = self.options.results and not shed
        if not (wanted or fast):
            return False  # nobody needs interims now (or they are shed under load)
        # No longer a worker to spare (or no longer a barge-in).
        return not (running and not (fast and spare_worker))

    def decide(
        self,
        state: InterimState,
        samples: int | None,
        *,
        woken: bool,
        fast: bool,
        shed: bool,
        final_started: bool,
        final_imminent: bool,
    ) -> Decode | None:
        """Whether to decode the growing utterance of ``samples`` (None: none is growing).

        Args:
            state: the call's interim state.
            samples: the growing utterance's length, or None between utterances.
            woken: barge-in asked for this interim now.
            fast: the caller talks over an ``after_words`` reply.
            shed: the server sheds interims under load.
            final_started: the utterance's final decode has started.
            final_imminent: it is about to (smart turns, half the decode delay silent).
        """
        if samples is None:
            state.last_len = 0
            return None
        if final_started or (not fast and final_imminent):
            # Its final decode has started (the speech has ended, unless it resumes), or is
            # about to: an interim now would trail that final and take a core beside it.
            return None
        if not woken and samples - state.last_len < 16 * state.spacing_ms // 2:
            return None
        state.last_len = samples
        state.seq += 1
        return Decode(
            seq=state.seq,
            wanted=self.options.results and not shed,
            fast=fast,
            urgent=fast and self.options.barge_in_urgent,
        )


class Interims:
    """Runs one call's interim decodes (:class:`InterimPolicy` decides when).

    Args:
        config: the call's settings (interims, the barge-in model, the reply's language).
        segmenter: the call's segmenter (the growing utterance).
        transcriber: the shared recogniser.
        recognition: the call's finals (options, language, the interims it keeps).
        barge_in: wakes the driver, and reads the interims' words.
        quality: the server's degradation level (it may shed the client's interims).
        emit: queues an event for the client.
    """

    def __init__(
        self,
        config: CallConfig,
        segmenter: Segmenter,
        transcriber: Transcriber,
        *,
        recognition: Recognition,
        barge_in: BargeIn,
        quality: QualityLevel,
        emit: Callable[[OutboundEvent], Awaitable[None]],
    ) -> None:
        self.config = config
        self.policy = InterimPolicy(config.interims)
        self._segmenter = segmenter
        self._transcriber = transcriber
        self._recognition = recognition
        self._barge_in = barge_in
        self._quality = quality
        self._emit = emit
        self._task: asyncio.Task[None] | None = None
        #: Sequence number of the last interim sent to the client (overlapping decodes may
        #: come back out of order; an older one is then not sent).
        self._shown = 0

    def start(self) -> None:
        """Start the interim loop (the ``asr`` task does, beside the finals)."""
        self._task = asyncio.create_task(self._run(), name="interim")

    def cancel(self) -> None:
        """Ask the interim loop to stop, without waiting (see ``CallSession.run``'s cleanup)."""
        if self._task is not None:
            self._task.cancel()

    async def aclose(self) -> None:
        """Stop the interim loop and its decodes in flight."""
        task, self._task = self._task, None
        if task is not None:
            await cancel_and_wait(task)

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        policy, state, wake = self.policy, InterimState(), self._barge_in.interim_due
        running: set[asyncio.Task[None]] = set()
        try:
            while True:
                for done_task in [t for t in running if t.done()]:
                    running.discard(done_task)
                    if not done_task.cancelled():
                        done_task.result()  # a fault ends the interims, as an inline decode did
                now = loop.time()
                step = policy.wait(
                    state,
                    fast=self._barge_in.listening_for_words(),
                    running=len(running),
                    spare_worker=bool(running) and self._transcriber.spare_worker(),
                    now=now,
                )
                if isinstance(step, AwaitDecode):
                    await asyncio.wait(running, return_when=asyncio.FIRST_COMPLETED)
                    continue
                wait_s = step.at - now
                # A wake that came while the last decode ran is not lost: it is still set here.
                if not wake.is_set() and wait_s > 0:
                    woke = asyncio.ensure_future(wake.wait())
                    try:
                        done, _ = await asyncio.wait(
                            {woke, *running}, timeout=wait_s, return_when=asyncio.FIRST_COMPLETED
                        )
                    finally:
                        await cancel_and_wait(woke)
                    if done and not wake.is_set():
                        continue  # the decode in flight ended: the spacing is the interval now
                woken = wake.is_set()
                wake.clear()
                fast = self._barge_in.listening_for_words()
                shed = not self._quality.interim_results
                if not policy.attempt(
                    state,
                    fast=fast,
                    shed=shed,
                    running=len(running),
                    spare_worker=bool(running) and self._transcriber.spare_worker(),
                    now=loop.time(),
                ):
                    continue
                utt = self._segmenter.growing()
                decision = policy.decide(
                    state,
                    None if utt is None else len(utt.audio),
                    woken=woken,
                    fast=fast,
                    shed=shed,
                    final_started=utt is not None and self._recognition.final_started(utt.index),
                    final_imminent=self._recognition.final_imminent(),
                )
                if decision is None or utt is None:
                    continue
                task = asyncio.create_task(self._decode(utt, decision), name="interim-decode")
                running.add(task)
        finally:
            # All at once: awaited one by one, a second cancellation during the first wait
            # left the others running after the call.
            await cancel_and_wait(*running)

    async def _decode(self, utt: Utterance, decision: Decode) -> None:
        """One interim decode: to the client when it asked for interims, then to barge-in."""
        index = utt.index
        options, min_language_prob = self._recognition.interim_language(
            self._recognition.asr_options(), len(utt.audio)
        )
        if not decision.wanted:
            # Only barge-in reads this interim: its words' times would be aligned for no
            # one (the alignment pass is part of the interrupt's latency), and a smaller
            # model may count its words sooner. A caller talking over the bot's reply
            # most likely speaks its language: a prefix detected on its own came out
            # Chinese for "uh-huh, right" ("啊好"), which no backchannel list matches.
            options = replace(options, word_timestamps=False)
            if options.language is None and self.config.barge_in.reply_language:
                options = replace(options, language=self.config.barge_in.reply_language)
                min_language_prob = 0.0
            word_model = self.config.barge_in.model
            counted = word_model.options(options) if word_model is not None else None
            options = counted or options
        req = AsrRequest(
            utt.audio,
            utt.stats,
            options,
            is_final=False,
            urgent=decision.urgent,
            utterance=self._recognition.utterance(index),
        )
        try:
            result = await self._transcriber.transcribe(req)
        except (CallError, WithdrawnError):
            # Interim work is best-effort: a full queue just skips it, and the utterance's
            # final, once submitted, takes it off the queue (the final says it all).
            return
        if not result.text or result.language_probability < min_language_prob:
            return
        self._recognition.keep_interim(index, len(utt.audio), result)
        # Once SPEECH_END is out, only the final may describe that utterance.
        if self._recognition.closed(index):
            return
        if decision.wanted:
            if decision.seq < self._shown:
                return  # an overlapping later prefix came back first: this one is stale
            self._shown = decision.seq
            await self._emit(TranscriptOut(result, False, utt.start_ms, utt.end_ms, index))
        await self._barge_in.words_heard(index, result.text)
