"""CallSession's logic on a virtual clock, with FAKE engines (voxgate.gateway.testing): no model, no
server.

Pacing, barge-in, marks, clear, interims, speculative finals, playback accounting, faults and
shutdown. Every timestamp is exact (virtual time), so these assertions cannot be flaky; the same
behaviour through a real server with real models is covered by the e2e tests.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pytest

from voxgate.common.pcm import WireEncoding
from voxgate.gateway.call.options import (
    BargeInOptions,
    IngressOptions,
    InterimOptions,
    PlaybackOptions,
    RecognitionOptions,
)
from voxgate.gateway.config import LimitsConfig, VadConfig
from voxgate.gateway.errors import CallError, ErrorKind
from voxgate.gateway.events import (
    AudioIn,
    AudioOutEvent,
    ClearIn,
    ErrorOut,
    HangupIn,
    InboundEvent,
    InterruptedOut,
    MarkIn,
    MarkReachedOut,
    OutboundEvent,
    PlaybackFinishedOut,
    SpeakIn,
    SpeechOut,
    TranscriptOut,
)
from voxgate.gateway.metrics import GatewayMetrics
from voxgate.gateway.session import CallConfig, CallSession
from voxgate.gateway.testing.fake_engines import (
    EnergyVoiceDetector,
    FakeToneSynthesizer,
    FakeTranscriber,
)
from voxgate.gateway.testing.virtual_time import run_virtual
from voxgate_client import AS_FAST_AS_ALLOWED, Pacing

pytestmark = pytest.mark.component

FRAME_S = 0.02
LEAD_S = 0.06
PREBUFFER_S = 0.06


def tone(ms: int) -> bytes:
    """A loud tone: "speech" to the fake energy detector."""
    t = np.arange(16 * ms) / 16000.0
    return (0.3 * 32767 * np.sin(2 * np.pi * 300 * t)).astype("<i2").tobytes()


def silence(ms: int) -> bytes:
    return bytes(32 * ms)


@dataclass
class Call:
    """One session driven from a test: ``inbox`` feeds it, ``out`` records (time, event)."""

    transcriber: FakeTranscriber | None = None
    synth: FakeToneSynthesizer | None = field(default_factory=FakeToneSynthesizer)
    options: dict[str, Any] = field(default_factory=dict)
    limits: LimitsConfig = field(default_factory=LimitsConfig)
    out: list[tuple[float, OutboundEvent]] = field(default_factory=list)
    metrics: GatewayMetrics = field(default_factory=GatewayMetrics)
    #: CallSession's own keyword arguments (beside the call's config).
    session_options: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        cfg = CallConfig(
            ingress=IngressOptions(WireEncoding.LINEAR16, 16000),
            playback=PlaybackOptions(WireEncoding.LINEAR16, 16000),
            vad=VadConfig(),
            **self.options,
        )
        self.inbox: asyncio.Queue[InboundEvent | None] = asyncio.Queue()
        self.session = CallSession(
            cfg,
            self.limits,
            self.transcriber,
            self.synth,
            metrics=self.metrics,
            detector=EnergyVoiceDetector(),
            **self.session_options,
        )

    async def run(self) -> None:
        loop = asyncio.get_running_loop()

        async def sink(event: OutboundEvent) -> None:
            self.out.append((loop.time(), event))

        await self.session.run(self.inbox.get, sink)

    async def say(self, pcm: bytes) -> None:
        """Send caller audio in real time, 20 ms a message."""
        for i in range(0, len(pcm), 640):
            await self.inbox.put(AudioIn(pcm[i : i + 640]))
            await asyncio.sleep(FRAME_S)

    def of(self, kind: type[Any]) -> list[tuple[float, Any]]:
        return [(t, e) for t, e in self.out if isinstance(e, kind)]


def drive(call: Call, script: Any) -> None:
    """Run the session and ``script(call)`` together on the virtual clock; the script ends the
    call (None = end of stream) and the session must then end by itself."""

    async def main() -> None:
        runner = asyncio.create_task(call.run())
        await script(call)
        await asyncio.wait_for(runner, 600)  # virtual seconds: a hang guard

    run_virtual(main())


# --- pace: real time or bulk --------------------------------------------------------------------


def test_a_call_is_bulk_while_its_audio_runs_ahead_and_a_declared_one_from_its_start() -> None:
    """Bulk (served from spare capacity) by pace: audio over ``realtime_slack_ms`` ahead of the
    call's clock. A call that declared it (``voxgate-pacing: bulk``) is bulk from its start,
    until its pace can show (twice the slack): one that keeps to real time is real-time then."""
    plain = Call(synth=None)
    declared = Call(synth=None, session_options={"declared_bulk": True})
    seen: dict[str, list[bool]] = {"plain": [], "declared": []}

    async def script(c: Call) -> None:
        await asyncio.sleep(0.1)
        seen["plain" if c is plain else "declared"].append(c.session.bulk)  # no audio yet
        for _ in range(3):  # 3 s at real time, then 3 s more
            await c.say(silence(1000))
            seen["plain" if c is plain else "declared"].append(c.session.bulk)
        await c.say(silence(2000))
        seen["plain" if c is plain else "declared"].append(c.session.bulk)  # 5 s in: real time
        for _ in range(2):  # a file's worth at once: 4 s ahead
            await c.inbox.put(AudioIn(silence(2000)))
        await asyncio.sleep(0.1)
        seen["plain" if c is plain else "declared"].append(c.session.bulk)
        await c.inbox.put(None)

    drive(plain, script)
    drive(declared, script)
    assert seen["plain"] == [False, False, False, False, False, True]
    assert seen["declared"] == [True, True, True, True, False, True]


def _paced_with_server_lag(
    call: Call, factor: float, burst_ms: float, lag_s: float, audio_ms: int = 12_000
) -> list[CallError]:
    """A client paced on its own clock from the stream's opening (t = 0), whose chunks the
    server reads no sooner than ``lag_s`` (a busy loop): those sent meanwhile arrive at once.
    The refusal that ends the call, if any."""
    pacing = Pacing(factor, burst_ms)
    ended: list[CallError] = []

    async def main() -> None:
        loop = asyncio.get_running_loop()
        runner = asyncio.create_task(call.run())
        for sent_ms in range(0, audio_ms, 20):
            delay = max(pacing.due_s(sent_ms), lag_s) - loop.time()
            if delay > 0:
                await asyncio.sleep(delay)
            if runner.done():
                break
            await call.inbox.put(AudioIn(silence(20)))
        await call.inbox.put(None)
        try:
            await asyncio.wait_for(runner, 600)
        except CallError as exc:
            ended.append(exc)

    run_virtual(main())
    return ended


def test_a_client_sending_as_fast_as_allowed_is_not_refused_for_the_servers_own_lag() -> None:
    """The real-time-factor quota counts real time from the stream's opening, not from the
    first chunk the server got round to: a client sending a file as fast as the default limits
    allow (4 s at once, then 3.5x) and read 400 ms late by a busy server had 5.4 s of audio
    bunched in its first read, and counting from there refused it (a suite run hit this)."""
    fast = AS_FAST_AS_ALLOWED
    assert fast.factor is not None
    from_open = Call(synth=None, session_options={"opened_at": 0.0})
    assert _paced_with_server_lag(from_open, fast.factor, fast.burst_ms, lag_s=0.4) == []
    from_first_chunk = Call(synth=None)  # the origin before: the first chunk read
    (refused,) = _paced_with_server_lag(from_first_chunk, fast.factor, fast.burst_ms, lag_s=0.4)
    assert refused.kind is ErrorKind.RESOURCE_EXHAUSTED


def test_a_client_faster_than_the_limit_is_still_refused_counting_from_the_opening() -> None:
    """The earlier origin forgives the server's lag, not a client's speed: past the 5 s burst
    at 5x real time (limit 4x), the call is still refused."""
    call = Call(synth=None, session_options={"opened_at": 0.0})
    (refused,) = _paced_with_server_lag(call, 5.0, 4000.0, lag_s=0.4)
    assert refused.kind is ErrorKind.RESOURCE_EXHAUSTED
    assert "max_realtime_factor=4x" in refused.message


# --- pacing and playback accounting ------------------------------------------------------------


def test_reply_frames_leave_on_an_absolute_clock_with_no_drift() -> None:
    """Replaces the wall-clock pacing-drift check: 10 s of reply, every frame exactly on time."""
    call = Call()

    async def script(c: Call) -> None:
        await c.inbox.put(SpeakIn("x" * 100, "s1"))
        await c.inbox.put(MarkIn("after"))
        await asyncio.sleep(11)
        await c.inbox.put(None)

    drive(call, script)
    frames = call.of(AudioOutEvent)
    assert len(frames) == 500 and frames[-1][1].is_last
    t0 = frames[0][0]
    for k, (t, ev) in enumerate(frames):
        assert ev.offset_ms == 20 * k and ev.sequence_number == k + 1
        # Frame k leaves `lead` + `prebuffer` before it is due (the first is due `lead` after
        # it leaves): the first `prebuffer` of audio goes at once, then one frame per 20 ms,
        # so a client that plays frames as they arrive always holds `prebuffer`.
        assert t == pytest.approx(t0 + max(0.0, k * FRAME_S - PREBUFFER_S), abs=1e-9), k
    ((t_fin, fin),) = call.of(PlaybackFinishedOut)
    assert fin.duration_ms == 10_000
    assert t_fin == pytest.approx(t0 + LEAD_S + 10.0, abs=1e-9)  # when the tail was heard
    ((t_mark, mark),) = call.of(MarkReachedOut)
    assert mark.name == "after" and t_mark >= t_fin


def test_barge_in_stops_playback_and_reports_exactly_what_was_heard() -> None:
    call = Call()

    async def script(c: Call) -> None:
        await c.inbox.put(SpeakIn("one two three four five six seven eight nine", "s1"))
        await asyncio.sleep(2.0)
        await c.say(tone(400) + silence(800))
        await c.inbox.put(None)

    drive(call, script)
    ((t_begin, begin),) = [(t, e) for t, e in call.of(SpeechOut) if e.begin]
    ((t_int, intr),) = call.of(InterruptedOut)
    assert t_int == t_begin  # barge-in right behind SPEECH_BEGIN, same loop turn
    frames = call.of(AudioOutEvent)
    assert all(t <= t_int for t, _ in frames)  # nothing sent after the interruption
    started = frames[0][0] + LEAD_S
    heard_ms = int((t_int - started) * 1000)
    assert intr.played_ms == heard_ms
    words = ["one", "two", "three", "four", "five", "six", "seven", "eight", "nine"]
    ends = np.cumsum([len(w) + 1 for w in words]) * 100 - 100
    assert list(intr.words_played) == [w for w, e in zip(words, ends, strict=True) if e <= heard_ms]
    assert intr.at_offset_ms == begin.offset_ms
    assert not call.of(PlaybackFinishedOut)


@pytest.mark.parametrize(
    ("speak", "options", "interrupted"),
    [
        (
            SpeakIn("x" * 50, "s1"),
            {"barge_in": BargeInOptions(min_speech_ms=600)},
            False,
        ),  # 400 ms < 600
        (SpeakIn("x" * 50, "s1"), {"barge_in": BargeInOptions(min_speech_ms=200)}, True),
        (SpeakIn("x" * 50, "s1", uninterruptible=True), {}, False),
        (SpeakIn("x" * 50, "s1"), {"barge_in": BargeInOptions(enabled=False)}, False),
    ],
    ids=["too-short", "long-enough", "uninterruptible", "disabled"],
)
def test_barge_in_options(speak: SpeakIn, options: dict[str, Any], interrupted: bool) -> None:
    call = Call(options=options)

    async def script(c: Call) -> None:
        await c.inbox.put(speak)
        await asyncio.sleep(1.0)
        await c.say(tone(400) + silence(800))
        await asyncio.sleep(5.0)
        await c.inbox.put(None)

    drive(call, script)
    assert bool(call.of(InterruptedOut)) is interrupted
    assert bool(call.of(PlaybackFinishedOut)) is not interrupted


def test_clear_drops_the_queue_and_interrupts_the_current_reply() -> None:
    call = Call()

    async def script(c: Call) -> None:
        for i in range(3):
            await c.inbox.put(SpeakIn("x" * 20, f"s{i}"))
        await asyncio.sleep(0.5)
        await c.inbox.put(ClearIn())
        await asyncio.sleep(3.0)
        await c.inbox.put(None)

    drive(call, script)
    assert {e.speak_id for _, e in call.of(AudioOutEvent)} == {"s0"}
    # Every Speak ends with one event, the queued ones too (played 0 ms), in queue order.
    cut = [e for _, e in call.of(InterruptedOut)]
    assert [e.speak_id for e in cut] == ["s0", "s1", "s2"]
    assert all(e.at_offset_ms == -1 for e in cut)
    assert cut[0].played_ms > 0 and [e.played_ms for e in cut[1:]] == [0, 0]
    assert not call.of(PlaybackFinishedOut)


def test_a_barge_in_also_ends_the_replies_queued_behind_the_one_it_cuts() -> None:
    call = Call()

    async def script(c: Call) -> None:
        await c.inbox.put(SpeakIn("one two three four five six seven eight nine", "s1"))
        await c.inbox.put(SpeakIn("ten eleven", "s2"))
        await asyncio.sleep(2.0)
        await c.say(tone(400) + silence(800))
        await asyncio.sleep(3.0)
        await c.inbox.put(None)

    drive(call, script)
    ((_, begin),) = [(t, e) for t, e in call.of(SpeechOut) if e.begin]
    cut = [e for _, e in call.of(InterruptedOut)]
    assert [e.speak_id for e in cut] == ["s1", "s2"]
    assert cut[0].played_ms > 0 and cut[1].played_ms == 0 and cut[1].words_played == ()
    assert all(e.at_offset_ms == begin.offset_ms for e in cut)  # both by the caller's speech
    assert {e.speak_id for _, e in call.of(AudioOutEvent)} == {"s1"}
    assert not call.of(PlaybackFinishedOut)


def test_marks_queued_behind_a_cleared_reply_are_reached_in_order_not_dropped() -> None:
    call = Call()

    async def script(c: Call) -> None:
        await c.inbox.put(SpeakIn("x" * 20, "s1"))
        await c.inbox.put(MarkIn("m1"))
        await c.inbox.put(SpeakIn("x" * 20, "s2"))
        await c.inbox.put(MarkIn("m2"))
        await asyncio.sleep(0.5)
        await c.inbox.put(ClearIn())
        await asyncio.sleep(3.0)
        await c.inbox.put(None)

    drive(call, script)
    ((t_cut, _), *_) = call.of(InterruptedOut)
    marks = call.of(MarkReachedOut)
    assert [m.name for _, m in marks] == ["m1", "m2"]
    # Reached once the cut reply's audio already sent has played: within a frame, the lead
    # and the prebuffer (sent that much ahead).
    assert all(t_cut <= t <= t_cut + LEAD_S + PREBUFFER_S + FRAME_S for t, _ in marks)


# --- recognition: finals, speculation, interims, faults -----------------------------------------


def test_a_speculative_final_hides_the_decode_behind_the_hangover() -> None:
    """Replaces the e2e speculation count: exact latency with and without speculation."""

    def latency(speculative: bool) -> tuple[int, int]:
        asr = FakeTranscriber(["hello there"], delay_s=0.1)
        call = Call(
            transcriber=asr,
            synth=None,
            options={"recognition": RecognitionOptions(speculative_finals=speculative)},
        )

        async def script(c: Call) -> None:
            await c.say(silence(200) + tone(1000) + silence(1500))
            await c.inbox.put(None)

        drive(call, script)
        ((_, final),) = call.of(TranscriptOut)
        assert final.is_final and final.result.text == "hello there"
        return final.latency_ms, len(asr.requests)

    assert latency(speculative=True) == (0, 1)
    assert latency(speculative=False) == (100, 1)


def speech_resumes_after(asr: FakeTranscriber, pause_ms: int) -> Call:
    """Speech, ``pause_ms`` of silence (past the 320 ms settle point, short of the 600 ms
    hangover), speech again: one utterance, whose final the call must send once."""
    call = Call(transcriber=asr, synth=None)

    async def script(c: Call) -> None:
        await c.say(tone(800) + silence(pause_ms) + tone(800) + silence(1500))
        await c.inbox.put(None)

    drive(call, script)
    finals = [e for _, e in call.of(TranscriptOut) if e.is_final]
    assert len(finals) == 1 and finals[0].utterance_index == 0
    return call


def test_speech_resuming_cancels_the_speculation() -> None:
    asr = FakeTranscriber(delay_s=0.5)
    call = speech_resumes_after(asr, 400)
    assert asr.cancelled == [0]  # the speculation on the first part
    assert call.metrics.value("voxgate_asr_speculative_finals_total", outcome="cancelled") == 1


def test_a_speculation_that_finished_before_speech_resumed_is_not_an_utterance() -> None:
    """``voxgate_utterances_total`` counts the decode each final came from, one per utterance.

    The recogniser counted every final decode that finished: a speculation done before the
    caller went on was counted, and so was the utterance's real final after it.
    """
    asr = FakeTranscriber(["hello there"], delay_s=0.05)
    # The speculation starts at the 320 ms settle point and is back at 370 ms; speech resumes
    # at 500 ms.
    call = speech_resumes_after(asr, 500)
    assert [r.is_final for r in asr.requests] == [True, True] and asr.cancelled == []
    assert call.metrics.value("voxgate_utterances_total", outcome="text") == 1


def test_interims_come_at_the_interval_and_never_after_speech_end() -> None:
    asr = FakeTranscriber(lambda r: "final" if r.is_final else "partial", delay_s=0.05)
    call = Call(transcriber=asr, synth=None, options={"interims": InterimOptions(results=True)})

    async def script(c: Call) -> None:
        await c.say(tone(3500) + silence(1500))
        await c.inbox.put(None)

    drive(call, script)
    interims = [(t, e) for t, e in call.of(TranscriptOut) if not e.is_final]
    ((t_end, _),) = [(t, e) for t, e in call.of(SpeechOut) if not e.begin]
    assert len(interims) >= 2 and all(e.result.text == "partial" for _, e in interims)
    assert all(t < t_end for t, _ in interims)
    gaps = np.diff([t for t, _ in interims])
    assert all(g >= 1.0 - 1e-9 for g in gaps)  # interim_interval_ms = 1000
    assert [e.result.text for _, e in call.of(TranscriptOut) if e.is_final] == ["final"]


def test_an_engine_fault_fails_one_utterance_and_the_next_is_transcribed() -> None:
    asr = FakeTranscriber(["", "second"], fail={0}, speculate=False)
    call = Call(transcriber=asr, synth=None)

    async def script(c: Call) -> None:
        await c.say(tone(600) + silence(1000) + tone(600) + silence(1000))
        await c.inbox.put(None)

    drive(call, script)
    ((_, err),) = call.of(ErrorOut)
    assert err.scope == "utterance" and err.utterance_index == 0
    assert err.kind is ErrorKind.INTERNAL and "scripted" not in err.message
    assert [(e.utterance_index, e.result.text) for _, e in call.of(TranscriptOut)] == [
        (1, "second")
    ]


def test_hangup_mid_utterance_stops_playback_and_still_delivers_the_final() -> None:
    asr = FakeTranscriber(["bye"], speculate=False)
    call = Call(transcriber=asr)

    async def script(c: Call) -> None:
        await c.inbox.put(SpeakIn("x" * 100, "s1", uninterruptible=True))
        await c.say(tone(700))
        await c.inbox.put(HangupIn())

    drive(call, script)
    ((t_int, _),) = call.of(InterruptedOut)
    assert all(t <= t_int for t, _ in call.of(AudioOutEvent))
    assert [e.begin for _, e in call.of(SpeechOut)] == [True, False]
    ((_, final),) = call.of(TranscriptOut)
    assert final.result.text == "bye"


def test_shutdown_flushes_the_open_utterance_then_ends_with_unavailable() -> None:
    asr = FakeTranscriber(["half a sentence"], speculate=False)
    call = Call(transcriber=asr)
    ended: list[BaseException] = []

    async def main() -> None:
        runner = asyncio.create_task(call.run())
        await call.inbox.put(SpeakIn("x" * 100, "s1", uninterruptible=True))
        await call.say(tone(700))
        call.session.shutdown()
        try:
            await asyncio.wait_for(runner, 600)
        except CallError as exc:
            ended.append(exc)

    run_virtual(main())
    assert ended and isinstance(ended[0], CallError)
    assert ended[0].kind is ErrorKind.UNAVAILABLE
    speech = [e.begin for _, e in call.of(SpeechOut)]
    assert speech == [True, False]
    ((_, final),) = call.of(TranscriptOut)
    assert final.result.text == "half a sentence"
    assert call.of(InterruptedOut)  # the reply was stopped, not left playing


def test_a_call_cancelled_again_while_it_cleans_up_leaves_no_task_running() -> None:
    """The client leaves (grpc cancels the handler), then the server stops (it cancels again).

    The cleanup awaited the call's tasks one by one and cancelled each only when its turn
    came: a second cancellation during the first wait ended the cleanup, and the interim loop
    and its decode ran on after the call, for good. Where the loop was then closed without
    cancelling them, they were destroyed pending. CI once failed on exactly that: a later
    test's garbage collection ran the interim loop's ``finally`` on a closed loop. The second
    cancellation is tried at each of the first loop iterations of the cleanup.
    """
    left_over: dict[int, list[str]] = {}
    for gap in range(40):
        call = Call(
            FakeTranscriber(lambda r: "words", delay_s=0.3),
            synth=None,
            options={"interims": InterimOptions(results=True)},
        )

        async def main(call: Call = call, gap: int = gap) -> list[str]:
            runner = asyncio.create_task(call.run())
            await call.say(tone(2500))  # interims running, one decode in flight
            runner.cancel()
            for _ in range(gap):
                await asyncio.sleep(0)
            runner.cancel()
            await asyncio.wait([runner])
            await asyncio.sleep(1.0)  # what was cancelled has ended by now
            me = asyncio.current_task()
            return [t.get_name() for t in asyncio.all_tasks() if t is not me and not t.done()]

        left = run_virtual(main())
        if left:
            left_over[gap] = left
    assert left_over == {}


# --- limits: idle calls and the longest call ---------------------------------------------------


def test_a_call_without_audio_for_idle_timeout_is_ended() -> None:
    call = Call(limits=LimitsConfig(idle_timeout_s=5.0))
    ended: list[CallError] = []

    async def main() -> None:
        runner = asyncio.create_task(call.run())
        await call.say(silence(1000))  # audio keeps the call alive...
        await asyncio.sleep(30)  # ...silence from the client does not
        try:
            await asyncio.wait_for(runner, 600)
        except CallError as exc:
            ended.append(exc)

    run_virtual(main())
    assert ended and ended[0].kind is ErrorKind.DEADLINE_EXCEEDED
    assert "idle_timeout_s=5" in ended[0].message


def test_the_longest_call_ends_after_delivering_its_open_utterance() -> None:
    asr = FakeTranscriber(["cut short"], speculate=False)
    call = Call(transcriber=asr, limits=LimitsConfig(max_call_duration_s=2.0))
    ended: list[tuple[float, CallError]] = []

    async def main() -> None:
        loop = asyncio.get_running_loop()
        runner = asyncio.create_task(call.run())
        feeder = asyncio.create_task(call.say(silence(1000) + tone(5000)))
        try:
            await asyncio.wait_for(runner, 600)
        except CallError as exc:
            ended.append((loop.time(), exc))
        feeder.cancel()

    run_virtual(main())
    ((t_end, err),) = ended
    assert err.kind is ErrorKind.DEADLINE_EXCEEDED and "max_call_duration_s=2" in err.message
    assert t_end == pytest.approx(2.0, abs=0.05)
    assert [e.begin for _, e in call.of(SpeechOut)] == [True, False]
    ((_, final),) = call.of(TranscriptOut)
    assert final.result.text == "cut short"
