"""Deadline scheduling of synthesis work across replies: a pure policy, no clock, no threads.

(It lived in ``voxgate.engines.tts._scheduler``; it is the gateway's policy, beside the batcher's,
and the engine keeps only the window geometry both use, :func:`voxgate.engines.tts.window_bounds`.)

Every reply being synthesised has exactly one next step: a front-end run (its next sentence) or
a decoder window (the next frames of the current sentence). Once a reply's first audio is out,
the caller's player consumes its samples in real time, so the next step has a *playout
deadline*: the moment its first sample must be ready or the player runs dry. The policy
answers, from a snapshot of those steps and the time, "what runs next on a free worker":

* replies that have not started (no audio yet) go ahead of everything, oldest first: first
  audio is what a caller waits for, and it costs one small window (a larger one when every
  worker is busy, so that the reply has lead before its second window can run);
* the rest run earliest deadline first (optionally, a reply further ahead than
  ``max_lead_s`` waits: work for audio due in minutes is wasted if the caller barges in); a
  reply with a step running gets a second worker only while its slack is short, so a worker
  stays free for a reply that arrives meanwhile (decoder calls cannot be interrupted);
* the window size comes from the slack: a reply about to starve gets a small window (out
  sooner), one far ahead a large one (less context decoded per second of speech), bounded so
  that no window occupies a worker past the deadline of the next most urgent reply, and
  never so small that the replies speaking together would need more than the workers (as
  replies pile up, windows grow towards the one-shot's cost);
* where a device gains from it (``max_batch_size`` > 1, set by measurement per device),
  windows of several replies with the same input length run as one decoder call.

:func:`next_work` is the whole policy; :func:`voxgate.engines.tts.window_bounds` is the window
geometry that both the policy (to know which windows can share a batch) and the engine use.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Literal

from voxgate.gateway.scheduling.base import WaitUntil

__all__ = [
    "WINDOW_LADDER",
    "CostModel",
    "Dispatch",
    "SynthItem",
    "SynthPolicy",
    "WaitUntil",
    "Work",
    "default_synth_plan",
    "next_work",
]

#: Window sizes (latent frames) the policy picks from. A short list so that windows of
#: different replies often have the same length (and can share a batch, and an accelerator
#: sees few shapes).
WINDOW_LADDER = (8, 16, 24, 32, 48, 64, 96, 128, 192, 256)


@dataclass(frozen=True, slots=True)
class SynthItem:
    """A reply's next step, as the policy sees it.

    Attributes:
        key: the reply's id (returned in :class:`Work`).
        arrival: when the reply was queued (orders replies that have not started).
        deadline: when the step's first sample must be ready for the player; ``None`` until
            the reply's first audio is out (the step is then "first audio", due now).
        kind: ``front`` (a sentence's front end, or a cached sentence) or ``window``.
        position: frames of the current sentence already decoded (windows only).
        unit_frames: frames of the current sentence (windows only).
        running: steps of this reply running on workers now.
    """

    key: int
    arrival: float
    deadline: float | None
    kind: Literal["front", "window"]
    position: int = 0
    unit_frames: int = 0
    running: int = 0

    @property
    def started(self) -> bool:
        """Whether the reply's first audio is out (its steps then have playout deadlines)."""
        return self.deadline is not None


@dataclass(frozen=True, slots=True)
class Work:
    """One item of a dispatch: which reply, and for a window its geometry."""

    key: int
    kind: Literal["front", "window"]
    frames: int = 0
    pad_to: int = 0


@dataclass(frozen=True, slots=True)
class Dispatch:
    """Run these on one free worker now: a front end alone, or windows as one decoder call."""

    work: tuple[Work, ...]


@dataclass
class CostModel:
    """Seconds a decoder call and a front-end run take on this device, learnt as they run.

    The policy needs costs to size windows against other replies' deadlines; they are moving
    averages of measured runs (the machine's load changes them), seeded with what the bundled
    voice costs on one core here.
    """

    fixed_s: float = 0.006
    per_frame_s: float = 0.0011
    front_s: float = 0.012
    alpha: float = 0.2

    def window_s(self, input_frames: int, batch: int = 1) -> float:
        """Estimated decoder time for ``batch`` windows of ``input_frames`` each."""
        return self.fixed_s + self.per_frame_s * input_frames * batch

    def observe_window(self, input_frames: int, seconds: float) -> None:
        """Learn from one decoder call over ``input_frames`` frames in all."""
        if input_frames > 0:
            per = max(0.0, seconds - self.fixed_s) / input_frames
            self.per_frame_s += self.alpha * (per - self.per_frame_s)

    def observe_front(self, seconds: float) -> None:
        """Learn from one front-end run."""
        self.front_s += self.alpha * (seconds - self.front_s)


@dataclass(frozen=True, slots=True)
class SynthPolicy:
    """The scheduling knobs (see the module docstring for what each rule is for).

    Attributes:
        context_frames: real frames decoded each side of a window and discarded.
        first_window_frames: a reply's first window (first audio).
        min_window_frames: the smallest later window (a smaller one wastes most of its compute
            on context).
        max_window_frames: the largest window.
        max_window_s: a window may occupy a worker at most this long (estimated), so that
            other replies are never held up long.
        max_batch_size: windows per decoder call; 1 on a small CPU, where parallel workers beat
            batching (measured by ``benchmarks/tts_concurrency.py --batch-gain``).
        max_lead_s: a reply with more audio than this ready ahead of its player waits, even
            when a worker is free (saves work that a barge-in would throw away). Unbounded by
            default: idle workers building a reply's lead cost nothing and absorb later bursts,
            and a Synthesize stream (no player) should run as fast as the device allows.
        batch_horizon_s: windows due within this of the most urgent join its batch.
        sustain_ratio: the smallest window chosen is one whose estimated decode takes at
            most this fraction of its audio (larger on a slow or loaded device).
        share_ratio: with ``active`` replies speaking on ``workers``, the smallest window is
            also one at which all of them together need at most this fraction of the workers
            (windows grow towards one-shot cost as replies pile up: less context decoded
            twice).
        parallel_slack_s: a reply with a step running gets a second one at once only while
            its slack is below this, leaving a worker free for a reply that arrives meanwhile
            (a decoder call cannot be interrupted). Off by default: with the measured costs
            (``benchmarks/tts_schedule_sim.py``) the lead that the second worker builds is
            worth more than the free worker.
        urgent_slack_s: the first-audio lane also takes a started reply with nothing running
            whose slack is below this (every worker is busy and it would starve waiting).
        alone_first_window_frames: when set, a reply that starts alone (no other reply
            active) gets this first window instead of ``first_window_frames`` and runs it
            alone: its later steps wait until it is out (the driver's rule), so they never
            share the cores with it (on a machine where other processes use a core, a second
            window beside the first slowed first audio by a third); the larger window buys
            the lead its second window then needs. 0: off (the second window starts beside
            an 8-frame first window, which is 4 ms sooner on cores with nothing else on them).
        busy_first_window_frames: a reply's first window when it starts on the first-audio
            lane (every worker busy), or while other replies speak on a plan of two or more
            workers: its second window cannot start beside the first, or races the others'
            windows for the free worker, so the first buys more lead (24 frames, 279 ms of
            the bundled voice's audio; with its 28 frames of right context that is 52 frames
            decoded against 44 for 16).
        slack_use: a window's estimated decode may take at most this fraction of its
            reply's slack (estimates are averages; a call that runs beside more threads than
            cores runs slower than its average).
        starving_first: a started reply that would starve if a new reply's first step ran
            first goes first (with one worker free; the first-audio lane still takes the new
            reply).
        soft_floor: a reply that a window at the floor would make late, and a smaller one
            would not, gets the smaller one (a reply building its lead; the floor is for
            replies already behind).
        frame_s: seconds of audio per latent frame (hop / rate of the voice).
        ladder: the window sizes to choose from.
    """

    context_frames: int = 28
    first_window_frames: int = 8
    min_window_frames: int = 16
    max_window_frames: int = 192
    max_window_s: float = 0.25
    max_batch_size: int = 1
    max_lead_s: float = float("inf")
    batch_horizon_s: float = 0.5
    sustain_ratio: float = 0.7
    share_ratio: float = 0.8
    parallel_slack_s: float = float("inf")
    urgent_slack_s: float = 0.15
    alone_first_window_frames: int = 0
    busy_first_window_frames: int = 24
    slack_use: float = 1.0
    starving_first: bool = True
    soft_floor: bool = True
    frame_s: float = 256 / 22050
    ladder: tuple[int, ...] = field(default=WINDOW_LADDER)


def default_synth_plan(device: str, cpu_cores: int) -> tuple[int, int]:
    """(workers, max_batch_size) before anything is measured on this machine.

    CPU: one worker per core, one window per call; measured on 2 cores with the bundled voice
    (``benchmarks/tts_concurrency.py --batch-gain``), a batch of 2 windows in one call took as
    long as the two alone (0.99-1.08x), while two workers on two cores do both at once. GPU:
    one worker and batches of 8, where a decoder call costs little more for 8 windows than one.
    """
    if device == "cuda":
        return 1, 8
    return max(1, cpu_cores), 1


def _class_of(frames: int, ladder: Sequence[int]) -> int:
    """The smallest ladder size holding ``frames`` (the largest size if none does)."""
    for size in ladder:
        if size >= frames:
            return size
    return ladder[-1]


def _urgency(item: SynthItem) -> tuple[int, float]:
    # Not started: first audio, oldest first; then earliest deadline.
    if item.deadline is None:
        return (0, item.arrival)
    return (1, item.deadline)


def _window_frames(
    item: SynthItem,
    now: float,
    policy: SynthPolicy,
    cost: CostModel,
    blocking_s: float,
    *,
    first: int,
    share: float,
) -> int:
    """Frames for ``item``'s next window, from its slack and what the others can wait.

    ``first`` is the size of a first window; ``share`` the fraction of one worker each
    speaking reply may use (``share_ratio * workers / active``).
    """
    left = item.unit_frames - item.position
    if item.deadline is None:
        return min(left, first)
    ctx = 2 * policy.context_frames
    # The largest window that is ready before this reply's player runs dry, holds no other
    # reply past its deadline, and stays under the time limit: far ahead, a big window that
    # wastes little on context; about to starve, a small one, out sooner. Never below the
    # smallest window that still decodes faster than real time by ``sustain_ratio`` on this
    # device at its current speed: a reply that is late anyway needs throughput, and small
    # windows (mostly context) on a slow or loaded machine would make every reply later.
    sizes = [w for w in policy.ladder if policy.min_window_frames <= w <= policy.max_window_frames]
    ratio = min(policy.sustain_ratio, share)
    floor = next(
        (w for w in sizes if cost.window_s(w + ctx) <= ratio * w * policy.frame_s),
        sizes[-1],
    )
    own = (item.deadline - now) * policy.slack_use
    budget = min(own, blocking_s, policy.max_window_s)
    frames = floor
    for size in sizes:
        if size > floor and cost.window_s(size + ctx) <= budget:
            frames = size
    if policy.soft_floor and cost.window_s(floor + ctx) > own:
        # A reply still building its lead (a window at the floor would make it late, a
        # smaller one would not) gets the largest window that is in time; one already late
        # gets the floor, for throughput.
        fitting = [w for w in sizes if w < floor and cost.window_s(w + ctx) <= own]
        if fitting:
            frames = fitting[-1]
    if left - frames < policy.min_window_frames // 2:
        return left  # a sliver after this window would cost a whole context decode
    return max(1, min(left, frames))


def _step_s(item: SynthItem, cost: CostModel, smallest: float) -> float:
    """The least time ``item``'s next step can take."""
    return cost.front_s if item.kind == "front" else smallest


def next_work(
    queue: Sequence[SynthItem],
    now: float,
    policy: SynthPolicy,
    cost: CostModel,
    *,
    idle_workers: int = 1,
    urgent_only: bool = False,
    active: int = 0,
    workers: int = 1,
    upcoming: Sequence[float] = (),
) -> Dispatch | WaitUntil:
    """What a free worker runs next: see the module docstring for the rules.

    ``queue`` holds the next step of every reply that is waiting (not running); the caller
    removes the dispatched replies before asking again for another free worker.
    ``idle_workers`` counts the free workers, this one included: replies that another free
    worker can take at once are not held up by this dispatch, so they do not shorten it.
    ``urgent_only`` asks for first-audio work alone (the driver's extra lane, which runs even
    while every regular worker is busy, so a new reply never waits behind a long window), and
    for a started reply about to starve with nothing running (``urgent_slack_s``).
    ``active`` counts the replies speaking (started or not, waiting or running) and
    ``workers`` the regular workers; with them the smallest window grows as replies pile up
    (``share_ratio``). ``upcoming`` holds the deadlines of replies not in ``queue`` whose
    next step becomes ready soon (a reply whose first step is running): a window started now
    must not hold them past those deadlines either.
    """
    share = policy.share_ratio * max(1, workers) / max(1, active)
    # A reply's first window: small when its second window can start beside it on another
    # free worker; larger (more lead) when it starts with every worker busy, or on two or more
    # workers while other replies speak: their next windows take the free worker first as
    # often as not. Through Converse at N = 8 (benchmarks.calls.replies, 2026-12-05, six rows
    # against six of the 8-frame window, alternating) every late frame had fallen 60-160 ms
    # into a reply; with 24 frames there: 0 late frames against 4, first audio p95 93-134 ms
    # against 71-156, p50 about 15 ms later.
    first = (
        policy.first_window_frames
        if not urgent_only and idle_workers >= min(2, workers) and (workers < 2 or active <= 1)
        else policy.busy_first_window_frames
    )
    if policy.alone_first_window_frames and active == 1 and not urgent_only:
        first = policy.alone_first_window_frames  # it runs alone (see the driver)
    # A reply far enough ahead with a step running waits for it (parallel_slack_s).
    wake = math.inf
    free = []
    for item in queue:
        if (
            item.running
            and item.deadline is not None
            and item.deadline - now > policy.parallel_slack_s
        ):
            wake = min(wake, item.deadline - policy.parallel_slack_s)
            continue
        free.append(item)
    queue = free
    if urgent_only:
        fresh = [item for item in queue if item.deadline is None]
        if not fresh:
            starving = [
                item
                for item in queue
                if item.deadline is not None
                and not item.running
                and item.deadline - now < policy.urgent_slack_s
            ]
            if not starving:
                return WaitUntil(None)  # the regular dispatch keeps the timers
            head = min(starving, key=_urgency)
            if head.kind == "front":
                return Dispatch((Work(head.key, "front"),))
            frames = _window_frames(head, now, policy, cost, math.inf, first=first, share=share)
            return Dispatch((Work(head.key, "window", frames),))
        head = min(fresh, key=_urgency)
        if head.kind == "front":
            return Dispatch((Work(head.key, "front", first),))
        return Dispatch((Work(head.key, "window", min(head.unit_frames - head.position, first)),))
    ready = [
        item for item in queue if item.deadline is None or item.deadline - now <= policy.max_lead_s
    ]
    if not ready:
        later = [item.deadline - policy.max_lead_s for item in queue if item.deadline is not None]
        when = min([*later, wake])
        return WaitUntil(when if math.isfinite(when) else None)
    ready.sort(key=_urgency)
    head = ready[0]
    smallest = cost.window_s(policy.min_window_frames + 2 * policy.context_frames)
    if head.deadline is None and policy.starving_first:
        # First audio waits for a started reply that would starve behind it: a late first
        # chunk is latency, a late later chunk is a gap in speech.
        fresh_s = cost.window_s(first + policy.context_frames)
        if head.kind == "front":
            fresh_s += cost.front_s
        starving = [
            o
            for o in ready
            if o.deadline is not None and o.deadline - now - fresh_s < _step_s(o, cost, smallest)
        ]
        if starving and idle_workers <= 1:
            head = min(starving, key=_urgency)
            ready.remove(head)
            ready.insert(0, head)
    if head.kind == "front":
        return Dispatch((Work(head.key, "front", first if head.deadline is None else 0),))
    rest = ready[1:]
    # Replies beyond what the other free workers take at once wait for this one's window,
    # and so do replies whose next step is about to become ready (``upcoming``).
    held = rest[max(0, idle_workers - 1) :]
    blocking_s = min(
        [
            *(
                o.deadline - now - _step_s(o, cost, smallest)
                for o in held
                if o.deadline is not None
            ),
            *(d - now - smallest for d in upcoming),
        ],
        default=float("inf"),
    )
    frames = _window_frames(head, now, policy, cost, blocking_s, first=first, share=share)
    if policy.max_batch_size <= 1:
        return Dispatch((Work(head.key, "window", frames),))
    # Batch: windows of the same size class, padded with real context to one input length.
    size = _class_of(frames, policy.ladder)
    pad_to = size + 2 * policy.context_frames
    work = [Work(head.key, "window", frames, pad_to)]
    if head.unit_frames < pad_to:
        return Dispatch((Work(head.key, "window", frames),))
    horizon = (head.deadline if head.deadline is not None else now) + policy.batch_horizon_s
    for other in rest:
        if len(work) >= policy.max_batch_size:
            break
        if other.kind != "window" or other.unit_frames < pad_to:
            continue
        if other.deadline is not None and other.deadline > horizon:
            continue
        left = other.unit_frames - other.position
        if other.deadline is None:
            take = min(left, first)
            if _class_of(take, policy.ladder) != size:
                continue
        else:
            take = min(left, size)
        work.append(Work(other.key, "window", take, pad_to))
    return Dispatch(tuple(work))
