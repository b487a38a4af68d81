"""The synthesis scheduler: the pure policy, the window geometry, batched decoding, the driver.

The policy tests drive :func:`voxgate.engines.tts._scheduler.next_work` with hand-made snapshots and
a fixed cost model (no clock, no threads). The engine and driver tests use the bundled Piper
voice and real worker threads: batched windows must equal each window decoded alone, the
scheduler's slack-sized windows must keep the one-shot waveform, a cancelled reply must leave
the queue at once, and a new reply's first audio must go ahead of replies already playing.
"""

from __future__ import annotations

import asyncio
import dataclasses
import threading
import time
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

from voxgate.engines.tts import (
    ReplyJob,
    SpeakOptions,
    TtsConfig,
    VitsStreamer,
    WindowPlan,
    window_bounds,
)
from voxgate.gateway.errors import CallError, ErrorKind
from voxgate.gateway.events import SpeakIn
from voxgate.gateway.metrics import GatewayMetrics
from voxgate.gateway.runtime import TtsSynthesizer
from voxgate.gateway.scheduling import WaitUntil
from voxgate.gateway.scheduling.synthesis import (
    SLACK_USE,
    ReplyStats,
    SynthesisScheduler,
    policy_for,
)
from voxgate.gateway.scheduling.synthesis_policy import (
    CostModel,
    Dispatch,
    SynthItem,
    SynthPolicy,
    Work,
    default_synth_plan,
    next_work,
)

# The logic tests' fixed cost model and slacks were laid out for 24 frames of context each side;
# the rules they check do not depend on that number (the served default is 28, tts.context_frames).
POLICY = SynthPolicy(context_frames=24)


def _policy(**fields: Any) -> SynthPolicy:
    """A policy with the tests' context (24 frames) and the given fields."""
    return SynthPolicy(**{"context_frames": 24, **fields})


COST = CostModel(fixed_s=0.005, per_frame_s=0.001, front_s=0.01)  # a fixed, fast device
QUIET = SpeakOptions(noise_scale=0.0, noise_w=0.0)  # deterministic, so comparisons are exact
LONG = (
    "Thanks for calling, your order has shipped. It should arrive on Tuesday, March 3rd. "
    "The total came to $42.50, including tax. Is there anything else I can help you with?"
)


def window(key: int, deadline: float | None, *, position: int = 0, frames: int = 400) -> SynthItem:
    return SynthItem(key, arrival=0.0, deadline=deadline, kind="window", position=position,
                     unit_frames=frames)  # fmt: skip


def dispatch(decision: Dispatch | WaitUntil) -> tuple[Work, ...]:
    assert isinstance(decision, Dispatch), decision
    return decision.work


# -- the policy ----------------------------------------------------------------------------


@pytest.mark.unit
def test_first_audio_goes_ahead_of_every_deadline_that_can_wait_for_it() -> None:
    queue = [window(1, 10.5), window(2, 10.51), SynthItem(3, 9.0, None, "front")]
    (work,) = dispatch(next_work(queue, 10.0, POLICY, COST))
    assert (work.key, work.kind) == (3, "front")
    # A started reply that would starve behind the new reply's first step goes first (a gap
    # in speech is worse than first audio one window later)...
    due = [window(1, 10.03), SynthItem(3, 9.0, None, "front")]
    assert dispatch(next_work(due, 10.0, POLICY, COST))[0].key == 1
    # ...unless another free worker takes it at once.
    assert dispatch(next_work(due, 10.0, POLICY, COST, idle_workers=2))[0].key == 3


@pytest.mark.unit
def test_replies_not_started_go_oldest_first_then_earliest_deadline() -> None:
    queue = [
        SynthItem(1, 5.0, None, "window", unit_frames=100),
        SynthItem(2, 4.0, None, "window", unit_frames=100),
    ]
    assert dispatch(next_work(queue, 6.0, POLICY, COST))[0].key == 2
    started = [window(1, 7.0), window(2, 6.5), window(3, 6.9)]
    assert dispatch(next_work(started, 6.0, POLICY, COST))[0].key == 2


@pytest.mark.unit
def test_a_first_window_is_small_and_never_past_the_unit() -> None:
    (work,) = dispatch(next_work([window(1, None)], 0.0, POLICY, COST))
    assert work.frames == POLICY.first_window_frames
    (short,) = dispatch(next_work([window(1, None, frames=5)], 0.0, POLICY, COST))
    assert short.frames == 5


@pytest.mark.unit
def test_replies_far_ahead_wait_until_their_lead_is_spent_when_capped() -> None:
    queue = [window(1, 10.0), window(2, 12.0)]
    capped = _policy(max_lead_s=2.0)
    assert next_work(queue, 5.0, capped, COST) == WaitUntil(8.0)
    assert next_work([], 5.0, capped, COST) == WaitUntil(None)
    # A reply that has not started is never held back.
    assert isinstance(next_work([*queue, window(3, None)], 5.0, capped, COST), Dispatch)
    # By default idle workers run ahead (work-conserving).
    assert dispatch(next_work(queue, 5.0, POLICY, COST))[0].key == 1


@pytest.mark.unit
def test_window_size_grows_with_slack() -> None:
    sizes = [
        dispatch(next_work([window(1, 10.0 + slack)], 10.0, POLICY, COST))[0].frames
        for slack in (-0.5, 0.0, 0.05, 0.1, 0.2, 0.3, 1.0, 2.0)
    ]
    assert sizes == sorted(sizes)
    assert sizes[0] == POLICY.min_window_frames  # starving: the smallest sustainable window
    assert sizes[-1] == POLICY.max_window_frames
    # Every chosen window is decoded before its deadline when the slack allows it.
    for slack, size in zip((0.1, 0.2, 0.3), sizes[3:6], strict=True):
        assert COST.window_s(size + 2 * POLICY.context_frames) <= slack


@pytest.mark.unit
def test_the_served_slack_use_leaves_a_window_room_to_run_slower_than_its_estimate() -> None:
    """A lone reply's second window (its 16-frame first window, 186 ms, just out): with the
    whole slack a window estimated to end just in time took it all, and ran late by 70-110 ms
    once the next caller's reply started beside it (benchmarks.calls.replies, N = 8); with the
    served ``slack_use`` its estimate takes at most that fraction of the slack."""
    slack = 16 * POLICY.frame_s - 0.025
    ctx = 2 * POLICY.context_frames
    whole = dispatch(next_work([window(1, 10.0 + slack)], 10.0, POLICY, COST))[0].frames
    served = _policy(slack_use=SLACK_USE)
    (work,) = dispatch(next_work([window(1, 10.0 + slack)], 10.0, served, COST))
    assert 0.0 < SLACK_USE < 1.0
    assert COST.window_s(work.frames + ctx) <= SLACK_USE * slack < COST.window_s(whole + ctx)
    assert work.frames >= served.min_window_frames
    # Far ahead, the window is as large as ever: the margin costs context only while the
    # reply builds its lead.
    far = dispatch(next_work([window(1, 12.0)], 10.0, served, COST))[0].frames
    assert far == dispatch(next_work([window(1, 12.0)], 10.0, POLICY, COST))[0].frames


@pytest.mark.unit
def test_a_slow_device_gets_windows_that_keep_up_with_real_time() -> None:
    """On a loaded CPU small windows (mostly context) would fall further behind every time."""
    slow = CostModel(fixed_s=0.005, per_frame_s=0.008, front_s=0.05)
    (work,) = dispatch(next_work([window(1, 9.9)], 10.0, POLICY, slow))  # already late
    ctx = 2 * POLICY.context_frames
    assert slow.window_s(work.frames + ctx) <= work.frames * POLICY.frame_s
    assert work.frames > POLICY.min_window_frames


@pytest.mark.unit
def test_a_window_never_holds_a_waiting_reply_past_its_deadline() -> None:
    far, near = window(1, 11.5), window(2, 11.0)
    queue = [far, near, window(3, 10.12)]
    # One free worker: reply 3 runs first; its window must leave room for nobody else's
    # deadline, here reply 2 at 11.0 s, so it may be large.
    (work,) = dispatch(next_work(queue, 10.0, POLICY, COST, idle_workers=1))
    assert work.key == 3
    alone = dispatch(next_work([window(3, 10.12)], 10.0, POLICY, COST))[0].frames
    # A waiting reply due soon shrinks the head's window...
    tight = [window(3, 10.5), window(4, 10.09)]
    (head,) = dispatch(next_work(tight, 10.0, POLICY, COST, idle_workers=1))
    assert head.key == 4
    (big,) = dispatch(next_work([window(4, 10.09)], 10.0, POLICY, COST))
    blocked_budget = 10.5 - 10.0 - COST.window_s(POLICY.min_window_frames + 48)
    assert COST.window_s(head.frames + 48) <= max(
        blocked_budget, COST.window_s(POLICY.min_window_frames + 48)
    )
    assert head.frames <= big.frames and alone >= POLICY.min_window_frames
    # ...unless another free worker takes that reply at once.
    (free,) = dispatch(next_work(tight, 10.0, POLICY, COST, idle_workers=2))
    assert free.frames == big.frames


@pytest.mark.unit
def test_the_tail_of_a_unit_is_never_left_as_a_sliver() -> None:
    item = window(1, 12.0, position=100, frames=100 + POLICY.max_window_frames + 5)
    (work,) = dispatch(next_work([item], 10.0, POLICY, COST))
    assert work.frames == POLICY.max_window_frames + 5


@pytest.mark.unit
def test_the_first_audio_lane_takes_only_replies_that_have_not_started() -> None:
    started = [window(1, 10.0 + POLICY.urgent_slack_s), window(2, 10.5)]
    assert next_work(started, 10.0, POLICY, COST, urgent_only=True) == WaitUntil(None)
    fresh = [*started, SynthItem(3, 9.5, None, "window", unit_frames=50)]
    (work,) = dispatch(next_work(fresh, 10.0, POLICY, COST, urgent_only=True))
    assert (work.key, work.frames) == (3, POLICY.busy_first_window_frames)


@pytest.mark.unit
def test_the_first_audio_lane_also_takes_a_reply_about_to_starve_with_nothing_running() -> None:
    lane = _policy(urgent_slack_s=0.15)
    about_to_starve = window(1, 10.05)
    (work,) = dispatch(next_work([about_to_starve], 10.0, lane, COST, urgent_only=True))
    assert (work.key, work.kind) == (1, "window")
    assert work.frames >= lane.min_window_frames
    # Not while a step of it runs (that step is its audio), nor with slack to wait.
    running = SynthItem(1, 0.0, 10.05, "window", unit_frames=400, running=1)
    assert next_work([running], 10.0, lane, COST, urgent_only=True) == WaitUntil(None)
    assert next_work([window(1, 10.2)], 10.0, lane, COST, urgent_only=True) == WaitUntil(None)
    # A reply that has not started still goes first.
    fresh = SynthItem(2, 9.9, None, "front")
    (first,) = dispatch(next_work([about_to_starve, fresh], 10.0, lane, COST, urgent_only=True))
    assert first.key == 2


@pytest.mark.unit
def test_a_reply_far_ahead_leaves_the_second_worker_free() -> None:
    """A decoder call cannot be interrupted: a reply with lead to spare runs one at a time."""
    policy = _policy(parallel_slack_s=0.5)
    ahead = SynthItem(1, 0.0, 12.0, "window", unit_frames=400, running=1)
    assert next_work([ahead], 10.0, policy, COST, idle_workers=2) == WaitUntil(11.5)
    behind = SynthItem(1, 0.0, 10.3, "window", unit_frames=400, running=1)
    assert dispatch(next_work([behind], 10.0, policy, COST, idle_workers=2))[0].key == 1
    # With nothing running, a reply far ahead still uses an idle worker (work-conserving).
    assert dispatch(next_work([window(1, 12.0)], 10.0, policy, COST))[0].key == 1


@pytest.mark.unit
def test_a_reply_starting_while_every_worker_is_busy_gets_a_longer_first_window() -> None:
    policy = _policy(busy_first_window_frames=16)
    fresh = SynthItem(1, 0.0, None, "front")
    # Every worker busy (the first-audio lane), or one free worker of two: the second window
    # cannot start beside the first, so the first buys more lead.
    (lane,) = dispatch(next_work([fresh], 0.0, policy, COST, urgent_only=True, workers=2))
    (one_free,) = dispatch(next_work([fresh], 0.0, policy, COST, idle_workers=1, workers=2))
    (two_free,) = dispatch(next_work([fresh], 0.0, policy, COST, idle_workers=2, workers=2))
    assert lane.frames == one_free.frames == 16
    assert two_free.frames == policy.first_window_frames
    # Two free, but other replies speaking: their windows race its second for a worker.
    (others,) = dispatch(next_work([fresh], 0.0, policy, COST, idle_workers=2, workers=2, active=3))
    assert others.frames == 16
    # A device with one worker (a GPU) never has a second free one: small first windows,
    # however many replies speak.
    (gpu,) = dispatch(next_work([fresh], 0.0, policy, COST, idle_workers=1, workers=1, active=4))
    assert gpu.frames == policy.first_window_frames
    # A later sentence's front end carries no first-window size.
    later = SynthItem(2, 0.0, 10.0, "front")
    assert dispatch(next_work([later], 10.0, policy, COST))[0].frames == 0


@pytest.mark.unit
def test_a_reply_starting_alone_gets_the_alone_first_window_only_when_alone() -> None:
    policy = _policy(alone_first_window_frames=12)
    fresh = SynthItem(1, 0.0, None, "front")
    (alone,) = dispatch(next_work([fresh], 0.0, policy, COST, idle_workers=2, workers=2, active=1))
    (two,) = dispatch(next_work([fresh], 0.0, policy, COST, idle_workers=2, workers=2, active=2))
    (lane,) = dispatch(next_work([fresh], 0.0, policy, COST, urgent_only=True, workers=2, active=1))
    # Two speaking: the other reply's windows race its second window for the free worker.
    busy = policy.busy_first_window_frames
    assert (alone.frames, two.frames, lane.frames) == (12, busy, busy)
    # Off: a reply alone gets the small first window (its second window starts beside it).
    (off,) = dispatch(next_work([fresh], 0.0, POLICY, COST, idle_workers=2, workers=2, active=1))
    assert off.frames == POLICY.first_window_frames


@pytest.mark.unit
def test_windows_grow_as_replies_pile_up_so_their_sum_fits_the_workers() -> None:
    policy = _policy(share_ratio=0.8)
    starving = window(1, 9.9)
    alone = dispatch(next_work([starving], 10.0, policy, COST, active=1, workers=2))[0].frames
    crowd = dispatch(next_work([starving], 10.0, policy, COST, active=8, workers=2))[0].frames
    assert alone == policy.min_window_frames < crowd
    ctx = 2 * policy.context_frames
    # Eight replies at this window size need at most 0.8 of the two workers.
    assert 8 * COST.window_s(crowd + ctx) <= 0.8 * 2 * crowd * policy.frame_s


@pytest.mark.unit
def test_a_reply_building_its_lead_gets_a_window_in_time_below_the_crowd_floor() -> None:
    policy = _policy(share_ratio=0.8)
    ctx = 2 * policy.context_frames
    late = dispatch(next_work([window(1, 9.9)], 10.0, policy, COST, active=8, workers=2))
    building = dispatch(next_work([window(1, 10.07)], 10.0, policy, COST, active=8, workers=2))
    assert COST.window_s(late[0].frames + ctx) > 0.07  # the floor would make it late...
    assert COST.window_s(building[0].frames + ctx) <= 0.07  # ...so it gets one in time
    assert building[0].frames >= policy.min_window_frames


@pytest.mark.unit
def test_a_window_leaves_room_for_a_reply_whose_first_step_is_running() -> None:
    ahead = window(1, 13.0)
    free = dispatch(next_work([ahead], 10.0, POLICY, COST))[0].frames
    (held,) = dispatch(next_work([ahead], 10.0, POLICY, COST, upcoming=[10.1]))
    ctx = 2 * POLICY.context_frames
    assert held.frames < free
    smallest = COST.window_s(POLICY.min_window_frames + ctx)
    assert COST.window_s(held.frames + ctx) <= max(0.1 - smallest, smallest)


@pytest.mark.unit
def test_front_ends_run_alone_and_unbatched_devices_get_one_window() -> None:
    queue = [SynthItem(1, 0.0, 10.2, "front"), window(2, 10.25), window(3, 10.3)]
    assert dispatch(next_work(queue, 10.0, POLICY, COST)) == (Work(1, "front"),)
    assert len(dispatch(next_work(queue[1:], 10.0, POLICY, COST))) == 1


@pytest.mark.unit
def test_windows_of_one_size_class_are_batched_with_a_common_input_length() -> None:
    policy = _policy(max_batch_size=3)
    queue = [
        window(1, 10.05),
        window(2, 10.06),
        window(3, 10.07, frames=40),  # too short to pad: not in the batch
        window(4, 10.08),
        window(5, 10.09),  # beyond max_batch_size
        window(6, 20.0),  # far beyond the horizon
    ]
    work = dispatch(next_work(queue, 10.0, policy, COST))
    assert [w.key for w in work] == [1, 2, 4]
    pads = {w.pad_to for w in work}
    assert len(pads) == 1 and pads.pop() >= work[0].frames + 2 * policy.context_frames
    assert len(dispatch(next_work(queue, 10.0, _policy(max_batch_size=1), COST))) == 1


@pytest.mark.unit
def test_cost_model_learns_from_measured_runs() -> None:
    cost = CostModel(fixed_s=0.0, per_frame_s=0.001, front_s=0.01, alpha=0.5)
    for _ in range(20):
        cost.observe_window(100, 0.4)
        cost.observe_front(0.03)
    assert cost.per_frame_s == pytest.approx(0.004, rel=1e-3)
    assert cost.front_s == pytest.approx(0.03, rel=1e-3)
    assert cost.window_s(50, batch=2) == pytest.approx(0.4, rel=1e-3)


@pytest.mark.unit
def test_default_plan_by_device() -> None:
    assert default_synth_plan("cpu", 2) == (2, 1)
    assert default_synth_plan("cpu", 0) == (1, 1)
    assert default_synth_plan("cuda", 16) == (1, 8)


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        ((0, 8, 100, 24), (0, 8, 0, 32)),  # first window: no left context
        ((40, 32, 200, 24), (40, 72, 16, 96)),  # interior: context both sides
        ((180, 16, 200, 24), (180, 196, 156, 200)),  # near the end: right context clipped
        ((0, 10, 12, 24, 4), (0, 12, 0, 12)),  # a 2-frame tail folded in; short unit
    ],
)
@pytest.mark.unit
def test_window_bounds(args: tuple[int, ...], expected: tuple[int, int, int, int]) -> None:
    start, frames, total, context, *tail = args
    got = window_bounds(start, frames, total, context, min_tail=tail[0] if tail else 0)
    assert got == expected


@pytest.mark.unit
def test_window_bounds_pads_with_real_context_right_then_left() -> None:
    assert window_bounds(0, 8, 200, 24, pad_to=80) == (0, 8, 0, 80)
    assert window_bounds(180, 20, 200, 24, pad_to=80) == (180, 200, 120, 200)
    assert window_bounds(10, 8, 50, 24, pad_to=80) == (10, 18, 0, 50)  # unit too short


# -- the engine: batched windows and slack-sized windows -----------------------------------


@pytest.fixture(scope="module")
def streamer() -> Iterator[VitsStreamer]:
    engine = VitsStreamer.load(TtsConfig(cache_bytes=0))
    engine.warmup()
    yield engine
    engine.close()


def snr_db(reference: np.ndarray, test: np.ndarray) -> float:
    noise = float(np.sum((reference - test) ** 2))
    return float(10 * np.log10(float(np.sum(reference**2)) / max(noise, 1e-30)))


@pytest.mark.model
def test_batched_windows_equal_each_window_decoded_alone(streamer: VitsStreamer) -> None:
    a = streamer.open("The quick brown fox jumps over the lazy dog.", QUIET)
    b = streamer.open("Your appointment is confirmed for nine thirty tomorrow.", SpeakOptions())
    for job in (a, b):
        assert job.run_front_end() == []
    pad = 32 + 2 * streamer.config.context_frames
    assert min(a.unit_frames, b.unit_frames) >= pad
    items = [
        (a, a.plan(32, pad)),
        (b, b.plan(8, pad)),
        (a, WindowPlan(10, 30, 0, 60)),  # another input length: its own call
    ]
    assert items[0][1].input_frames == items[1][1].input_frames == pad
    batched = streamer.decode_windows(items)
    alone = [streamer.decode_windows([item])[0] for item in items]
    for one, ref, (_, plan) in zip(batched, alone, items, strict=True):
        assert len(one) == (plan.stop - plan.start) * streamer.hop_length
        assert np.array_equal(one, ref)


@pytest.mark.model
def test_slack_sized_windows_keep_the_one_shot_waveform(streamer: VitsStreamer) -> None:
    reference = streamer.synthesize_oneshot(LONG, QUIET)
    job = streamer.open(LONG, QUIET)
    sizes = iter([8, 32, 192, 48, 16, 96, 128, 24] * 20)
    chunks = []
    while not job.done:
        if job.needs_front_end:
            chunks.extend(job.run_front_end())
            continue
        plan = job.plan(next(sizes))
        chunks.append(job.finish_window(plan, streamer.decode_windows([(job, plan)])[0]))
    audio = np.concatenate([c.samples for c in chunks])
    assert len(audio) == len(reference.samples)
    assert snr_db(reference.samples, audio) >= 60.0
    assert [w.text for c in chunks for w in c.words] == [w.text for w in reference.words]
    assert chunks[-1].is_last and not any(c.is_last for c in chunks[:-1])
    assert [c.offset_samples for c in chunks] == list(
        np.cumsum([0] + [len(c.samples) for c in chunks[:-1]])
    )


# -- the driver ------------------------------------------------------------------------------


async def _collect(
    scheduler: SynthesisScheduler, text: str, stats: ReplyStats | None = None
) -> np.ndarray:
    parts = [c.samples async for c in scheduler.stream(text, QUIET, stats)]
    return np.concatenate(parts)


@pytest.mark.model
async def test_the_scheduler_streams_replies_like_the_one_shot(streamer: VitsStreamer) -> None:
    metrics = GatewayMetrics()
    scheduler = SynthesisScheduler(streamer, 2, policy_for(streamer), metrics)
    try:
        stats = [ReplyStats() for _ in range(3)]
        texts = [LONG, "Okay.", "Please hold while I look up your account."]
        audio = await asyncio.gather(
            *(_collect(scheduler, t, s) for t, s in zip(texts, stats, strict=True))
        )
        for text, got, st in zip(texts, audio, stats, strict=True):
            ref = streamer.synthesize_oneshot(text, QUIET).samples
            assert len(got) == len(ref) and snr_db(ref, got) >= 60.0
            assert st.first_audio_s is not None and st.chunks >= 1
        assert scheduler.queue_depth == 0
        chunks_after_first = sum(s.chunks - 1 for s in stats)
        assert metrics.value("voxgate_tts_playout_slack_seconds_count") == chunks_after_first
        # One decoder call per window dispatch, plus each reply's first window, which runs
        # in the same step as its first front end.
        assert metrics.value("voxgate_tts_batch_size_count") == len(texts) + sum(
            1 for d in scheduler.dispatches if d[0][1] == "window"
        )
        assert metrics.value("voxgate_tts_queue_depth") == 0
    finally:
        await scheduler.aclose()


@pytest.mark.model
async def test_a_cancelled_reply_leaves_the_queue_at_once(streamer: VitsStreamer) -> None:
    scheduler = SynthesisScheduler(streamer, 1, policy_for(streamer))
    try:
        stats = ReplyStats()
        stream = scheduler.stream(LONG, QUIET, stats)
        await anext(stream)
        await stream.aclose()  # what a barge-in's cancel of the consumer does
        assert scheduler.queue_depth == 0
        ran = len(scheduler.dispatches)
        # The step in flight (at most one) finishes; nothing else of that reply runs.
        await _collect(scheduler, "Okay.")
        assert all(d[0][0] != stats.reply_id for d in list(scheduler.dispatches)[ran:])
    finally:
        await scheduler.aclose()


@pytest.mark.model
async def test_a_new_reply_goes_ahead_of_replies_already_playing(
    streamer: VitsStreamer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One worker, busy with a long reply: a new reply's first step starts next, at once."""
    scheduler = SynthesisScheduler(streamer, 1, policy_for(streamer))
    arrived: list[int] = []
    opened = streamer.open

    def open_and_mark(text: str, options: SpeakOptions | None = None) -> ReplyJob:
        job = opened(text, options)
        arrived.append(len(scheduler.dispatches))  # dispatches before the reply is queued
        return job

    monkeypatch.setattr(streamer, "open", open_and_mark)
    try:
        long_stats, new_stats = ReplyStats(), ReplyStats()
        first_chunk = asyncio.Event()

        async def long_reply() -> None:
            async for _ in scheduler.stream(LONG, QUIET, long_stats):
                first_chunk.set()

        task = asyncio.create_task(long_reply())
        await first_chunk.wait()
        await _collect(scheduler, "Sure, one moment while I check that for you.", new_stats)
        await task
        log = list(scheduler.dispatches)
        mine = [i for i, d in enumerate(log) if d[0][0] == new_stats.reply_id]
        # Its front end (which goes on to its first window in the same run) is the next
        # dispatch after it arrived: the first-audio lane takes it while the worker runs one
        # of the long reply's windows (one more may start in the instant before it is queued).
        assert log[mine[0]][0][1] == "front"
        assert mine[0] - arrived[1] <= 1
        assert all(d[0][0] == long_stats.reply_id for d in log[arrived[1] : mine[0]])
        # The long reply was playing (several chunks out) and still had work queued.
        assert any(d[0][0] == long_stats.reply_id for d in log[mine[0] :])
        assert new_stats.first_audio_s is not None and long_stats.chunks > 2
    finally:
        await scheduler.aclose()


@pytest.mark.model
@pytest.mark.parametrize("alone", [0, 12])
async def test_a_lone_replys_first_window_runs_alone_when_the_policy_says_so(
    streamer: VitsStreamer, monkeypatch: pytest.MonkeyPatch, alone: int
) -> None:
    """``alone_first_window_frames``: nothing more of a lone reply starts until its first
    window is decoded; off, its second window starts beside the first (two workers)."""
    policy = dataclasses.replace(policy_for(streamer), alone_first_window_frames=alone)
    scheduler = SynthesisScheduler(streamer, 2, policy)
    spans: list[tuple[float, float, int]] = []  # decoder calls: start, end, first plan frame
    decode = streamer.decode_windows

    def timed(windows: list[tuple[ReplyJob, WindowPlan]], **kw: Any) -> list[np.ndarray]:
        t0 = time.perf_counter()
        out = decode(windows, **kw)
        spans.append((t0, time.perf_counter(), windows[0][1].start))
        return out

    monkeypatch.setattr(streamer, "decode_windows", timed)
    try:
        text = "Please hold while I look up your account."
        audio = await _collect(scheduler, text)
        assert len(audio) == len(streamer.synthesize_oneshot(text, QUIET).samples)
        spans.sort()
        first, second = spans[0], spans[1]
        if alone:
            assert first[2] == 0 and second[2] == alone
            assert second[0] >= first[1]
        else:
            # Two workers: which of the two decoder calls gets a core first is the OS's choice.
            assert {first[2], second[2]} == {0, policy.first_window_frames}
            assert second[0] < first[1]
    finally:
        await scheduler.aclose()


@pytest.mark.model
async def test_a_reply_starting_alone_runs_its_first_steps_on_the_first_audio_pair(
    streamer: VitsStreamer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With nothing else synthesised, a reply's front end and first window run on the
    streamer's first-audio pair (``wide``: both cores), its second window only after the first
    (no third thread on two cores), and the audio is the one-shot's; replies that start
    together share the workers as before (no step of them is ``wide``)."""
    assert streamer.has_wide  # TtsConfig.first_audio_threads: 2 by default on a CPU
    policy = policy_for(streamer)
    assert policy.alone_first_window_frames == 2 * policy.first_window_frames
    scheduler = SynthesisScheduler(streamer, 2, policy)
    calls: list[tuple[str, bool, float, float]] = []  # kind, wide, start, end
    decode, front = streamer.decode_windows, ReplyJob.run_front_end

    def decode_seen(windows: list[tuple[ReplyJob, WindowPlan]], **kw: Any) -> list[np.ndarray]:
        t0 = time.perf_counter()
        out = decode(windows, **kw)
        calls.append(("window", bool(kw.get("wide")), t0, time.perf_counter()))
        return out

    def front_seen(job: ReplyJob, **kw: Any) -> Any:
        t0 = time.perf_counter()
        out = front(job, **kw)
        calls.append(("front", bool(kw.get("wide")), t0, time.perf_counter()))
        return out

    monkeypatch.setattr(streamer, "decode_windows", decode_seen)
    monkeypatch.setattr(ReplyJob, "run_front_end", front_seen)
    try:
        text = "Please hold while I look up your account."
        audio = await _collect(scheduler, text)
        ref = streamer.synthesize_oneshot(text, QUIET).samples
        assert len(audio) == len(ref) and snr_db(ref, audio) >= 60.0
        calls.sort(key=lambda c: c[2])
        assert [(kind, wide) for kind, wide, _, _ in calls[:2]] == [
            ("front", True),
            ("window", True),
        ]
        assert not any(wide for _, wide, _, _ in calls[2:])
        assert calls[2][2] >= calls[1][3]  # the second window after the first
        calls.clear()
        await asyncio.gather(*(_collect(scheduler, t) for t in ("Okay then.", "One moment.")))
        # The first of two may start alone (the second is not queued yet); the second never.
        assert sum(wide for kind, wide, _, _ in calls if kind == "front") <= 1
    finally:
        await scheduler.aclose()


@pytest.mark.model
@pytest.mark.parametrize("lanes", [1, 2])
async def test_replies_starting_together_run_their_first_steps_on_the_first_audio_lane(
    streamer: VitsStreamer, monkeypatch: pytest.MonkeyPatch, lanes: int
) -> None:
    """Two replies queued at once (their callers' finals came out of one recognition batch):
    with two lane threads both first steps run at the loop's priority; with one (the
    default, FIRST_AUDIO_LANES), the second runs on a worker."""
    scheduler = SynthesisScheduler(streamer, 2, policy_for(streamer), first_audio_lanes=lanes)
    threads: list[str] = []  # the thread of each first front end, in start order
    front = ReplyJob.run_front_end

    def front_seen(job: ReplyJob, **kw: Any) -> Any:
        if job.samples_planned == 0:
            threads.append(threading.current_thread().name)
        return front(job, **kw)

    monkeypatch.setattr(ReplyJob, "run_front_end", front_seen)
    try:
        texts = ("Order 104 has shipped from Leeds.", "Order 105 has shipped from Porto.")
        audio = await asyncio.gather(*(_collect(scheduler, t) for t in texts))
        for text, got in zip(texts, audio, strict=True):
            ref = streamer.synthesize_oneshot(text, QUIET).samples
            assert len(got) == len(ref) and snr_db(ref, got) >= 60.0
        assert len(threads) == 2
        on_lane = [name.startswith("tts-first") for name in threads]
        assert on_lane == ([True, True] if lanes == 2 else [True, False])
    finally:
        await scheduler.aclose()


@pytest.mark.model
async def test_a_first_window_that_ends_last_never_lets_two_front_ends_of_a_reply_run(
    streamer: VitsStreamer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The fused first run (front end, then first window) ending after the reply's next front
    end started must leave that front end's flag alone.

    It once cleared it: the reply looked free, a second front end of it started beside the
    running one, the two raced over the reply's units and the reply never ended (found by
    ``benchmarks/tts_concurrency`` hanging on a faster machine). Gates force that order here:
    the first window's decoder call waits until the second sentence's front end is running,
    which then waits until the first window is done.
    """
    scheduler = SynthesisScheduler(streamer, 2, policy_for(streamer))
    decode, front = streamer.decode_windows, streamer._run_front_end
    second_front_started, first_window_done = threading.Event(), threading.Event()
    fronts = {"running": 0, "most": 0, "calls": 0}
    lock = threading.Lock()

    def gated_decode(windows: list[tuple[ReplyJob, WindowPlan]], **kw: Any) -> list[np.ndarray]:
        first = any(
            plan.start == 0 and plan.unit is not None and plan.unit.index == 0
            for _, plan in windows
        )
        if first:
            second_front_started.wait(10.0)
        out = decode(windows, **kw)
        if first:
            first_window_done.set()
        return out

    def counted_front(*args: Any, **kw: Any) -> Any:
        with lock:
            fronts["calls"] += 1
            fronts["running"] += 1
            fronts["most"] = max(fronts["most"], fronts["running"])
            call = fronts["calls"]
        try:
            if call == 2:  # the second sentence's front end
                second_front_started.set()
                first_window_done.wait(10.0)
                time.sleep(0.2)  # the moment a wrongly freed reply would start another
            return front(*args, **kw)
        finally:
            with lock:
                fronts["running"] -= 1

    monkeypatch.setattr(streamer, "decode_windows", gated_decode)
    monkeypatch.setattr(streamer, "_run_front_end", counted_front)
    try:
        text = "Sure, I can help you with that right away. Reference 1."
        audio = await asyncio.wait_for(_collect(scheduler, text), 30.0)
        assert second_front_started.is_set() and first_window_done.is_set()
        assert fronts["most"] == 1 and fronts["calls"] == 3
        ref = streamer.synthesize_oneshot(text, QUIET).samples
        assert len(audio) == len(ref) and snr_db(ref, audio) >= 60.0
    finally:
        await scheduler.aclose()


@pytest.mark.model
async def test_bad_text_fails_only_its_own_reply(streamer: VitsStreamer) -> None:
    synth = TtsSynthesizer(streamer, 2, GatewayMetrics())
    try:

        async def speak(text: str) -> int:
            return sum(
                [len(p.samples) async for p in synth.stream(SpeakIn(text=text, speak_id="s"))]
            )

        bad, good = await asyncio.gather(speak("<b></b>"), speak("Okay."), return_exceptions=True)
        assert isinstance(bad, CallError) and bad.kind is ErrorKind.INVALID_ARGUMENT
        assert "speak.text" in bad.message
        assert isinstance(good, int) and good > 0
    finally:
        await synth.aclose()


@pytest.mark.unit
def test_the_fifo_pool_left_production_code() -> None:
    """session.tts_scheduling: its old value still loads, 'fifo' is refused by name."""
    from voxgate.gateway.config import ConfigError, load_config

    assert load_config(overrides={"session": {"tts_scheduling": "deadline"}})
    with pytest.raises(ConfigError, match="tts_scheduling was removed"):
        load_config(overrides={"session": {"tts_scheduling": "fifo"}})
