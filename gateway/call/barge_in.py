"""Barge-in on a call: the caller heard over a reply, and when that stops it.

The policy (what interrupts a reply: ``immediate``, ``after_words``, ``never``; backchannels,
minimum words) is :mod:`voxgate.gateway.barge_in`; this stage applies it to one call: it
follows the caller's speech against the reply being played (:mod:`.playback`), cuts the reply
right behind SPEECH_BEGIN (``immediate``) or on a transcript with enough words
(``after_words``, :meth:`BargeIn.words_heard`), and tells the interim driver when the caller
over such a reply has said enough to decode (:attr:`BargeIn.interim_due`).
"""

from __future__ import annotations

import asyncio
from dataclasses import replace

from voxgate.gateway.barge_in import BargeInPolicy
from voxgate.gateway.call.options import CallConfig
from voxgate.gateway.call.playback import Playback
from voxgate.gateway.events import SpeakIn
from voxgate.gateway.segmenter import Segmenter, SegmenterState

__all__ = ["BargeIn"]


class BargeIn:
    """When the caller interrupts the bot's reply, on one call.

    Args:
        config: the call's settings (barge-in policy and minimum, the VAD's start).
        segmenter: the call's segmenter (what the caller is doing now).
        playback: the call's replies (the one being played, and its cut).
    """

    def __init__(self, config: CallConfig, segmenter: Segmenter, playback: Playback) -> None:
        self.config = config
        self._segmenter = segmenter
        self._player = playback
        self._barge_pending_from: int | None = None
        # The utterance in progress (index, SPEECH_BEGIN offset), None between utterances.
        self._speech: tuple[int, int] | None = None
        #: Set when an interim must run now: the caller talking over an after_words reply has
        #: said enough to decode (:meth:`maybe_first_interim`); the interim driver runs one at
        #: once and clears it.
        self.interim_due = asyncio.Event()
        # Speech began over an after_words reply and its first interim has not run yet.
        self._first_interim_due = False

    def speech_began(self, index: int, offset_ms: int) -> None:
        """SPEECH_BEGIN of utterance ``index``: over a reply, it is heard over it."""
        self._barge_pending_from = offset_ms
        self._speech = (index, offset_ms)
        if self._player.current is not None:
            self._player.current.heard_from[index] = offset_ms
            if self._player.current.policy.mode == "after_words":
                self._first_interim_due = True

    def speech_ended(self) -> None:
        """SPEECH_END: nothing is pending until the caller speaks again."""
        self._barge_pending_from = None
        self._speech = None

    def start_reply(self, speak: SpeakIn) -> BargeInPolicy:
        """A reply starts: its barge-in policy (the call's, as its Speak overrides it).

        Speech in progress now counts only once the reply plays and the caller is heard over
        it (speech_in_progress), not at once: they may be done by then.
        """
        call = self.config.barge_in.policy
        if not self.config.barge_in.enabled:
            call = replace(call, mode="never")
        self._barge_pending_from = None
        return call.for_speak(
            speak.barge_in, speak.barge_in_min_words, uninterruptible=speak.uninterruptible
        )

    def speech_in_progress(self) -> None:
        """Speech in progress when a reply starts playing counts once it goes on over it.

        A caller still talking when the bot's reply starts is talked over as much as one who
        starts during it (before this, such a reply played on for 1.3-1.6 s, until the caller's
        next utterance). The utterance counts from the reply's first frame as if it had begun
        then, under the reply's policy (``immediate``: the cut, after
        ``barge_in.min_speech_ms`` counted from the speech's start, while the caller still
        talks; ``after_words``: its interims, words said before the reply included; ``never``:
        nothing), once the caller is heard over the reply:

        * voiced at the first look after the first frame went out: that audio left the caller
          before the reply could reach them, so it cannot be its echo;
        * in a pause then (trailing silence, the hangover running), only once they say as much
          again as begins an utterance (``vad.start_speech_ms`` voiced): a caller who is done
          lets the bot answer, and the reply's echo, should a block slip past the echo guard,
          needs as much to cut it as to open an utterance of its own.

        So a caller whose utterance ends within the hangover without talking again is not cut
        off: they had finished, and the bot's reply is the answer.
        """
        pb, speech = self._player.current, self._speech
        if pb is None or pb.started_at == 0.0 or speech is None or pb.policy.mode == "never":
            return
        index, begin_ms = speech
        if index in pb.heard_from:
            return  # began during the reply (SPEECH_BEGIN counted it), or already counted
        seg = self._segmenter
        if not pb.looked_at_speech:
            pb.looked_at_speech = True
            pb.voiced_ms_at_start = seg.voiced_ms
            heard = seg.state is SegmenterState.SPEAKING
        else:
            said = seg.voiced_ms - pb.voiced_ms_at_start
            heard = seg.state is SegmenterState.SPEAKING and said >= self.config.vad.start_speech_ms
        if not heard:
            return
        pb.heard_from[index] = begin_ms
        if pb.policy.mode == "immediate":
            self._barge_pending_from = begin_ms  # cut_if_due applies the minimum
        else:
            self._first_interim_due = True

    def maybe_first_interim(self) -> None:
        """Wake the interim loop once the caller over an after_words reply can be decoded.

        The first interim runs when the utterance holds ``barge_in.first_interim_speech_ms``
        of voiced audio (the recogniser skips less as too short), not one interim interval
        after SPEECH_BEGIN: at SPEECH_BEGIN about 100 ms are voiced, 200 ms hold a short first
        word ("and", "go for"), and an interval later (360 ms) the word has been said for a
        while already. Every later interim follows at the interval.
        """
        if not self._first_interim_due:
            return
        if not self.listening_for_words():
            self._first_interim_due = False  # the reply ended or the utterance did
            return
        if self._segmenter.voiced_ms >= self.config.barge_in.first_interim_speech_ms:
            self._first_interim_due = False
            self.interim_due.set()

    async def cut_if_due(self) -> None:
        """``immediate``: cut the reply once the caller's speech over it is old enough."""
        start = self._barge_pending_from
        pb = self._player.current
        if start is None or pb is None or pb.policy.mode != "immediate":
            return
        state = self._segmenter.state
        if state not in (SegmenterState.SPEAKING, SegmenterState.STOPPING):
            return
        min_ms = self.config.barge_in.min_speech_ms
        # The minimum counts while the caller is still talking: in STOPPING the clock runs on
        # trailing silence, and a 400 ms "mm" used to interrupt a 600 ms minimum that way.
        if min_ms and (
            state is not SegmenterState.SPEAKING or self._segmenter.offset_ms - start < min_ms
        ):
            return
        self._barge_pending_from = None
        await self._player.stop(reason_offset_ms=start, clear_queue=True)

    def listening_for_words(self) -> bool:
        """Whether the caller is talking over a reply that ``after_words`` may interrupt."""
        pb = self._player.current
        return (
            pb is not None
            and pb.policy.mode == "after_words"
            and self._segmenter.state in (SegmenterState.SPEAKING, SegmenterState.STOPPING)
            and self._segmenter.utterance_index in pb.heard_from
        )

    async def words_heard(self, index: int, text: str) -> None:
        """``after_words``: a transcript of speech heard over the reply may stop it.

        Speech that began during the reply, or was in progress when it started and went on
        over it (:meth:`speech_in_progress`): then every word of the utterance counts,
        those said before the reply too.
        """
        pb = self._player.current
        if pb is None or pb.policy.mode != "after_words" or index not in pb.heard_from:
            return
        if not pb.policy.interrupts(text):
            return
        await self._player.stop(
            reason_offset_ms=pb.heard_from[index], clear_queue=True, caller_text=text
        )
