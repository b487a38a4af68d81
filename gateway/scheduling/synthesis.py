"""The synthesis scheduler's driver: replies' steps on engine workers, in deadline order.

:mod:`voxgate.gateway.scheduling.synthesis_policy` decides what runs (a pure policy over a
snapshot); this module owns the state that the policy reads and the threads that do the work:

* every reply is a :class:`~voxgate.engines.tts.ReplyJob` with one next step (front end or window)
  and, once its first chunk is out, a playout clock: the chunk at reply sample ``s`` is due at
  ``first_audio + s / rate`` (plus any starvation so far, since a starved player resumes
  later), exactly as the session paces frames out from the first one;
* a dispatcher task asks the policy whenever a worker is free or a reply changes, runs the
  chosen step on a worker thread, or a reply's first audio on a thread of the first-audio
  lane (``first_audio_lanes``, one by default) when one is free (also while every worker is busy)
  (``engine.decode_windows`` for windows, batched where the policy said so) and delivers the
  chunks to the reply's queue on the event loop; the workers run below the loop's and the
  first-audio lane's CPU priority (:mod:`voxgate.gateway.priority`);
* a window's estimated decode takes at most ``SLACK_USE`` of its reply's slack, so that it
  is still in time when another reply's first steps start beside it;
* a reply that starts while nothing else is synthesised runs its front end and first window
  on the streamer's first-audio pair (sessions with ``tts.first_audio_threads`` intra-op
  threads, the idle cores), and nothing else of it until that window is out
  (``SynthPolicy.alone_first_window_frames``);
* a reply that is cancelled (barge-in, Clear, hang-up) leaves the queue at once; a step of it
  already running finishes and its result is dropped.

It also measures what a caller hears: per chunk, the playout slack (how long before its play
time it was ready), late chunks and starvation, exported as Prometheus metrics and kept per
reply in :class:`ReplyStats`.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import math
import time
from collections import deque
from collections.abc import AsyncGenerator, Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

from voxgate.engines.tts import ReplyJob, SpeakOptions, TtsChunk, VitsStreamer, WindowPlan
from voxgate.gateway.metrics import GatewayMetrics
from voxgate.gateway.priority import lower_current_thread
from voxgate.gateway.scheduling.base import WaitUntil
from voxgate.gateway.scheduling.synthesis_policy import (
    CostModel,
    Dispatch,
    SynthItem,
    SynthPolicy,
    next_work,
)

__all__ = ["DEFAULT_GUARD_S", "ReplyStats", "SynthesisScheduler", "policy_for"]

log = logging.getLogger("voxgate.synthesis")

#: A step is due this long before its first sample plays: the session holds one 20 ms frame
#: back, and the hop from worker to sender takes a few ms.
DEFAULT_GUARD_S = 0.025


#: Threads of the first-audio lane (``SynthesisScheduler(first_audio_lanes=...)``). Two let two
#: replies that start at once both run their first steps at the loop's priority (with one, the
#: second runs them on a worker, below it); measured through Converse at N = 8
#: (benchmarks.calls.replies, 2026-12-05, 7 rows each side) that cut first audio p95 (median of
#: the rows 184 against 232 ms) but added late frames (38 against 31): a second thread at the
#: loop's priority preempts the windows of replies already playing. One stays the default.
FIRST_AUDIO_LANES = 1

#: A window's estimated decode may take at most this fraction of its reply's slack
#: (``SynthPolicy.slack_use``): the estimate is a moving average, and a window that starts with
#: the cores free shares them as soon as another reply's first steps (the first-audio thread, at
#: the loop's priority) or the caller's recognition start beside it.
SLACK_USE = 0.6


def policy_for(streamer: VitsStreamer, max_batch_size: int = 1) -> SynthPolicy:
    """The scheduling policy for ``streamer``'s voice and window settings.

    Windows range from 16 frames (at most ``TtsConfig.window_frames``) to twice
    ``window_frames`` (192 by default): the slack decides within that range (and the cost
    model raises the lower end on a slow device), where the fixed schedule doubled from the
    first window up to ``window_frames``.
    """
    cfg = streamer.config
    return SynthPolicy(
        context_frames=cfg.context_frames,
        first_window_frames=cfg.first_window_frames,
        min_window_frames=max(cfg.first_window_frames, min(16, cfg.window_frames)),
        max_window_frames=2 * cfg.window_frames,
        max_batch_size=max_batch_size,
        # A reply that starts alone runs its first steps on the first-audio pair (both
        # cores) and nothing beside them, so its first window buys the lead the second
        # window would have built beside it: 16 frames (186 ms of audio) cost about as much
        # as 8 on two threads (20 against 18 ms on 2 cores).
        alone_first_window_frames=2 * cfg.first_window_frames if streamer.has_wide else 0,
        slack_use=SLACK_USE,
        frame_s=streamer.hop_length / streamer.sample_rate_hz,
    )


@dataclass
class ReplyStats:
    """What one reply's caller experienced, on the scheduler's clock.

    Attributes:
        first_audio_s: queued to first chunk ready (``None`` until then).
        late_chunks: chunks ready after their play time.
        starved_s: total time the player would have waited for audio.
        min_slack_s: the smallest playout slack of any later chunk (``inf`` if none).
        chunks: chunks delivered.
        reply_id: the scheduler's id of the reply (as in ``SynthesisScheduler.dispatches``).
    """

    first_audio_s: float | None = None
    late_chunks: int = 0
    starved_s: float = 0.0
    min_slack_s: float = float("inf")
    chunks: int = 0
    reply_id: int = -1


class _Done:
    """Queue sentinel: the reply is complete."""


_DONE = _Done()

#: A worker's answer: per reply its chunks (or its error), decoder seconds, decoder input
#: frames, front-end seconds, and whether a front end went straight on to its first window
#: (then the reply's ``front_running`` was already cleared by ``_front_done``).
_RunResult = tuple[list[list[TtsChunk] | BaseException], float, int, float, bool]


@dataclass(eq=False)
class _Reply:
    key: int
    job: ReplyJob
    arrival: float
    rate: int
    out: asyncio.Queue[TtsChunk | _Done | BaseException] = field(default_factory=asyncio.Queue)
    origin: float | None = None  # loop time at which sample 0 plays (first chunk ready)
    first_eta: float = 0.0  # before that: when the first window is expected to be ready
    first_frames: int = 0  # the first window's size, once chosen
    inflight: int = 0  # steps running on workers
    front_running: bool = False
    cancelled: bool = False
    pending: dict[int, TtsChunk] = field(default_factory=dict)  # finished out of order
    next_offset: int = 0  # the next sample to deliver
    stats: ReplyStats = field(default_factory=ReplyStats)
    paced: bool = False  # played to a caller in real time (see SynthesisScheduler max_lead_s)

    def due(self, sample: int) -> float | None:
        return None if self.origin is None else self.origin + sample / self.rate

    def eligible(self, max_inflight: int, alone_first: bool = False) -> bool:
        """Whether this reply has a step a worker could start now.

        ``alone_first``: nothing more of a reply starts while its first window runs
        (``SynthPolicy.alone_first_window_frames``, for a reply with no other active).
        """
        job = self.job
        return not (
            self.cancelled
            or job.planned_all
            or self.front_running
            or self.inflight >= max_inflight
            or (alone_first and self.origin is None and self.inflight > 0)
        )

    def item(self, guard_s: float) -> SynthItem:
        job = self.job
        planned = job.samples_planned
        if self.origin is not None:
            deadline: float | None = self.origin + planned / self.rate - guard_s
        elif planned == 0:
            deadline = None  # first audio
        else:  # the first window is running: due after it, by its expected end
            deadline = self.first_eta + planned / self.rate - guard_s
        return SynthItem(
            key=self.key,
            arrival=self.arrival,
            deadline=deadline,
            kind="front" if job.needs_front_end else "window",
            position=job.position,
            unit_frames=job.unit_frames,
            running=self.inflight,
        )

    def upcoming(self, guard_s: float, hop: int) -> float | None:
        """For a reply that cannot start a step now: when its next step will be due."""
        if self.cancelled or self.job.planned_all:
            return None
        if self.front_running and self.origin is None and self.job.samples_planned == 0:
            # Its first front end and window are running: the second window is due when
            # the first window's audio has played.
            return self.first_eta + self.first_frames * hop / self.rate - guard_s
        return self.item(guard_s).deadline

    def held_until(self, now: float, guard_s: float, max_lead_s: float) -> float | None:
        """When a paced reply held ``max_lead_s`` ahead of its player may go on (or None).

        ``None`` for a reply that is not held: unpaced, not started, or not that far ahead.
        """
        if not self.paced or self.origin is None or self.cancelled or self.job.planned_all:
            return None
        deadline = self.item(guard_s).deadline
        if deadline is None or deadline - max_lead_s <= now:
            return None
        return deadline - max_lead_s

    @property
    def finished(self) -> bool:
        return self.job.planned_all and not self.inflight and not self.front_running


class SynthesisScheduler:
    """Runs every reply's synthesis on ``workers`` threads, earliest playout deadline first.

    Args:
        streamer: the loaded voice (its sessions are shared by the workers).
        workers: engine threads (one per core on a CPU, one on a GPU).
        policy: the scheduling policy; :func:`policy_for` fits it to the voice.
        metrics: where to export slack, lateness, batch sizes and queue depth.
        guard_s: a step is due this long before its first sample plays, for the session's
            frame hold-back (one 20 ms frame) and the hop from worker to sender.
        max_inflight: steps of one reply that may run at once (its windows are independent
            once its sentence's front end has run; two lets a reply's second window start
            beside its first).
        inline_open_chars: texts up to this long are validated and normalised on the event
            loop (well under a millisecond); longer ones on a thread.
        nice: the workers run this many nice levels below the event loop and the first-audio
            lane (Linux; 0 = the same priority, see :mod:`voxgate.gateway.priority`).
        max_lead_s: a paced reply (one a caller hears in real time, ``stream(paced=True)``)
            further than this ahead of its player waits: above the recogniser's CPU priority,
            synthesis of audio due seconds later would otherwise take the cores from finals
            due now. Unpaced replies (``Synthesize``) run as far ahead as the device allows.
        first_audio_lanes: threads at the loop's priority for replies' first steps (and for a
            started reply about to starve while every worker is busy).
        clock: the event loop's clock unless a test passes its own.
    """

    def __init__(
        self,
        streamer: VitsStreamer,
        workers: int,
        policy: SynthPolicy,
        metrics: GatewayMetrics | None = None,
        *,
        guard_s: float = DEFAULT_GUARD_S,
        max_inflight: int = 2,
        inline_open_chars: int = 1000,
        nice: int = 0,
        max_lead_s: float = math.inf,
        first_audio_lanes: int = FIRST_AUDIO_LANES,
        clock: Callable[[], float] | None = None,
    ) -> None:
        self.streamer = streamer
        self.policy = policy
        self.workers = workers
        self.cost = CostModel()
        self._metrics = metrics
        self._guard_s = guard_s
        self._max_inflight = max_inflight
        self._inline_open_chars = inline_open_chars
        self._max_lead_s = max_lead_s
        self._clock = clock
        self._wide = streamer.has_wide
        # The workers, below the event loop's CPU priority: a window is due hundreds of ms
        # ahead, while the loop's frame pacing and dispatching are due within a few ms.
        self._pool = ThreadPoolExecutor(
            max_workers=workers,
            thread_name_prefix="tts",
            initializer=lower_current_thread,
            initargs=(nice,),
        )
        # And threads at the loop's priority: the first-audio lane. A reply's first steps run
        # there whenever a lane thread is free (on an idle worker otherwise), so that first
        # audio takes a core ahead of the workers' windows; and while every worker runs a
        # window, a new reply's first steps still start at once (see next_work's
        # urgent_only) and the OS preempts the windows for them (ONNX Runtime cannot).
        # Replies whose callers' turns end together start together (their finals come out of
        # one recognition batch): with one lane thread the second one's first steps run on a
        # worker, below the loop and the first one's steps (FIRST_AUDIO_LANES weighs a second).
        self._lanes = max(1, first_audio_lanes)
        self._lane = ThreadPoolExecutor(max_workers=self._lanes, thread_name_prefix="tts-first")
        self._idle = workers
        self._lanes_idle = self._lanes
        self._active: dict[int, _Reply] = {}  # every reply not yet complete nor cancelled
        self._ids = itertools.count()
        self._wake: asyncio.Event | None = None
        self._task: asyncio.Task[None] | None = None
        self._closed = False
        #: The latest dispatches, oldest first: (reply id, kind, frames) per item, one tuple
        #: per worker run (for benchmarks and tests; bounded).
        self.dispatches: deque[tuple[tuple[int, str, int], ...]] = deque(maxlen=4096)

    # -- the public side -------------------------------------------------------------------

    @property
    def queue_depth(self) -> int:
        """Replies with a step that waits for a worker."""
        alone = self.policy.alone_first_window_frames > 0 and len(self._active) == 1
        now = self._now()
        return sum(
            1
            for r in self._active.values()
            if r.eligible(self._max_inflight, alone)
            and r.held_until(now, self._guard_s, self._max_lead_s) is None
        )

    def _now(self) -> float:
        return self._clock() if self._clock is not None else asyncio.get_running_loop().time()

    def _ensure_started(self) -> asyncio.Event:
        if self._closed:
            raise RuntimeError("the synthesis scheduler is closed")
        if self._task is None or self._wake is None:
            self._wake = asyncio.Event()
            self._task = asyncio.create_task(self._dispatch_loop(), name="tts-scheduler")
        return self._wake

    async def stream(
        self,
        text: str,
        options: SpeakOptions,
        stats: ReplyStats | None = None,
        *,
        paced: bool = False,
    ) -> AsyncGenerator[TtsChunk]:
        """Validate ``text`` (raising ``TtsInputError``), then yield its chunks as they are made.

        ``paced``: a caller hears the reply in real time from its first chunk, so its
        synthesis need not run more than ``max_lead_s`` ahead. Closing the iterator (or
        cancelling the task iterating it) cancels the reply: its queued steps leave the queue
        at once.
        """
        wake = self._ensure_started()
        loop = asyncio.get_running_loop()
        arrival = self._now()
        if len(text) <= self._inline_open_chars:
            # Text normalisation of a short reply takes well under a millisecond: done here,
            # it saves two thread hops before first audio (they cost milliseconds each on a
            # busy machine).
            job = self.streamer.open(text, options)
        else:
            job = await loop.run_in_executor(None, self.streamer.open, text, options)
        reply = _Reply(next(self._ids), job, arrival, self.streamer.sample_rate_hz, paced=paced)
        if stats is not None:
            reply.stats = stats
        reply.stats.reply_id = reply.key
        self._active[reply.key] = reply
        # Dispatch now, in this task: the reply's first step starts before this returns.
        self._pump()
        wake.set()
        try:
            while True:
                item = await reply.out.get()
                if isinstance(item, _Done):
                    return
                if isinstance(item, BaseException):
                    raise item
                yield item
        finally:
            self._cancel(reply)

    def _cancel(self, reply: _Reply) -> None:
        reply.cancelled = True
        if self._active.pop(reply.key, None) is not None:
            self._queue_changed()

    async def aclose(self) -> None:
        """Stop dispatching and the worker threads (after the server stopped calling)."""
        self._closed = True
        if self._task is not None:
            self._task.cancel()
            await asyncio.wait({self._task})
        for reply in self._active.values():
            reply.out.put_nowait(RuntimeError("the synthesis scheduler is closed"))
        self._active.clear()
        await asyncio.to_thread(self._pool.shutdown, wait=True, cancel_futures=True)
        await asyncio.to_thread(self._lane.shutdown, wait=True, cancel_futures=True)

    # -- dispatch --------------------------------------------------------------------------

    def _queue_changed(self) -> None:
        if self._metrics is not None:
            self._metrics.tts_queue_depth.set(self.queue_depth)

    async def _dispatch_loop(self) -> None:
        assert self._wake is not None
        while True:
            self._wake.clear()
            wait = self._pump()
            timeout = None if wait is None else max(0.0, wait - self._now())
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), timeout)

    def _pump(self) -> float | None:
        """Start what the policy picks while a worker (or the first-audio lane) is free.

        Runs on the loop, from the dispatcher task and directly where a reply arrives or a
        step ends (no task switch between a free worker and its next step). Returns when the
        policy wants to be asked again (``None``: when something changes).
        """
        if self._closed:
            return None
        loop = asyncio.get_running_loop()
        wait: float | None = None
        release = math.inf  # when the next paced reply held at max_lead_s may go on
        while self._idle > 0 or self._lanes_idle > 0:
            ready: list[_Reply] = []
            waiting: list[_Reply] = []
            alone = self.policy.alone_first_window_frames > 0 and len(self._active) == 1
            now = self._now()
            release = math.inf
            for r in self._active.values():
                held = r.held_until(now, self._guard_s, self._max_lead_s)
                if held is not None:
                    release = min(release, held)
                    waiting.append(r)
                    continue
                (ready if r.eligible(self._max_inflight, alone) else waiting).append(r)
            if not ready:
                break
            hop = self.streamer.hop_length
            upcoming = [d for r in waiting if (d := r.upcoming(self._guard_s, hop)) is not None]
            urgent = self._idle == 0
            decision = next_work(
                [r.item(self._guard_s) for r in ready],
                now,
                self.policy,
                self.cost,
                idle_workers=self._idle,
                urgent_only=urgent,
                active=len(self._active),
                workers=self.workers,
                upcoming=upcoming,
            )
            if isinstance(decision, WaitUntil):
                if not urgent:
                    wait = decision.at
                break
            self._start(decision, loop, urgent, now)
        self._queue_changed()
        if math.isfinite(release):
            wait = release if wait is None else min(wait, release)
        return wait

    def _start(
        self, decision: Dispatch, loop: asyncio.AbstractEventLoop, urgent: bool, now: float
    ) -> None:
        """Plan the chosen steps here (planning is serial per reply), run them on a worker.

        ``urgent``: only the first-audio lane is free. A reply's first audio chosen for a
        worker runs on the lane instead while a lane thread is free (the worker stays free).
        """
        replies = [self._active[w.key] for w in decision.work]
        self.dispatches.append(tuple((w.key, w.kind, w.frames) for w in decision.work))
        lane = urgent or (
            self._lanes_idle > 0
            and len(replies) == 1
            and replies[0].origin is None
            and replies[0].job.samples_planned == 0
        )
        plans: list[WindowPlan | None] = []
        for w, reply in zip(decision.work, replies, strict=True):
            reply.inflight += 1
            if w.kind == "front":
                reply.front_running = True
                plans.append(None)
                if reply.origin is None and reply.job.samples_planned == 0:
                    ctx = self.policy.context_frames
                    first = w.frames or self.policy.first_window_frames
                    reply.first_frames = first
                    reply.first_eta = now + self.cost.front_s + self.cost.window_s(first + ctx)
                continue
            if reply.origin is None and reply.job.samples_planned == 0:
                ctx = self.policy.context_frames
                reply.first_eta = now + self.cost.window_s(w.frames + ctx)
            plans.append(reply.job.plan(w.frames, w.pad_to))
        # A reply's first steps with nothing else synthesised (no other reply, every worker
        # idle) run on the streamer's first-audio pair, whose threads take the idle cores;
        # its later steps wait for its first window (alone_first_window_frames), so nothing
        # of it shares the cores with that.
        wide = (
            lane
            and self._wide
            and self.policy.alone_first_window_frames > 0
            and len(self._active) == 1
            and self._idle == self.workers
            and self._lanes_idle == self._lanes
            and replies[0].origin is None
        )
        if lane:
            self._lanes_idle -= 1
        else:
            self._idle -= 1
        first = decision.work[0].frames or self.policy.first_window_frames
        pool = self._lane if lane else self._pool
        fut = loop.run_in_executor(pool, self._run, replies, plans, loop, first, wide)
        front = plans[0] is None
        fut.add_done_callback(lambda f: self._finished(f, replies, lane, front, wide))

    def _run(
        self,
        replies: list[_Reply],
        plans: list[WindowPlan | None],
        loop: asyncio.AbstractEventLoop,
        first: int,
        wide: bool = False,
    ) -> _RunResult:
        """On a worker thread: one reply's front end, or one (batched) decoder call.

        A reply's first front end goes straight on to its first window (of ``first`` frames,
        as the policy chose) in the same run (one hop less before first audio); the reply is
        handed back to the dispatcher as soon as that window is planned, so its second window
        can start beside the first. ``wide``: on the streamer's first-audio pair (more
        threads).
        """
        front_s = 0.0
        if plans[0] is None:
            reply = replies[0]
            job = reply.job
            t0 = time.perf_counter()
            try:
                chunks = job.run_front_end(wide=wide)
            except Exception as exc:  # noqa: BLE001 - fails that reply only
                return [exc], 0.0, 0, time.perf_counter() - t0, False
            front_s = time.perf_counter() - t0
            fuse = reply.origin is None and not chunks and job.samples_planned == 0
            if not fuse or job.unit_frames == 0:
                return [chunks], 0.0, 0, front_s, False
            plan = job.plan(first)
            loop.call_soon_threadsafe(self._front_done, reply, first)
            items = [(job, plan)]
        else:
            items = [(r.job, p) for r, p in zip(replies, plans, strict=True) if p is not None]
        frames = sum(p.input_frames for _, p in items)
        t0 = time.perf_counter()
        try:
            audio = self.streamer.decode_windows(items, wide=wide)
            result: list[list[TtsChunk] | BaseException] = [
                [job.finish_window(plan, a)] for (job, plan), a in zip(items, audio, strict=True)
            ]
        except Exception as exc:  # noqa: BLE001 - a failing batch fails its own replies
            result = [exc for _ in replies]
        return result, time.perf_counter() - t0, frames, front_s, plans[0] is None

    def _front_done(self, reply: _Reply, first: int) -> None:
        """On the loop: a first front end is done and its first window is decoding."""
        reply.front_running = False
        ctx = self.policy.context_frames
        reply.first_eta = self._now() + self.cost.window_s(first + ctx)
        self._pump()  # its second window may start beside the first at once
        if self._wake is not None:
            self._wake.set()

    def _finished(
        self,
        fut: asyncio.Future[_RunResult],
        replies: list[_Reply],
        lane: bool,
        front: bool,
        wide: bool = False,
    ) -> None:
        """On the loop: settle the run, then give the free worker its next step at once.

        Settling learns the cost, delivers chunks in order and finishes complete replies.
        Only one-thread runs teach the cost model: ``wide`` ones (the first-audio pair) are
        faster than the workers' runs the policy plans.
        """
        try:
            if lane:
                self._lanes_idle += 1
            else:
                self._idle += 1
            if self._wake is not None:
                self._wake.set()
            # A front end that went on to its first window handed the reply back when the window
            # was planned (_front_done): by now the reply's *next* front end may be running on
            # another worker, and its flag is that run's, not this one's.
            fused = not fut.cancelled() and fut.exception() is None and fut.result()[4]
            for reply in replies:
                reply.inflight -= 1
                if front and not fused:
                    reply.front_running = False
            if fut.cancelled():
                return
            exc = fut.exception()
            if exc is not None:
                for reply in replies:
                    self._fail(reply, exc)
                return
            results, seconds, frames, front_s, _ = fut.result()
            if frames:
                if not wide:
                    self.cost.observe_window(frames, seconds)
                if self._metrics is not None:
                    self._metrics.tts_batch_size.observe(len(replies))
            if front and not wide:
                self.cost.observe_front(front_s)
            now = self._now()
            for reply, result in zip(replies, results, strict=True):
                if reply.cancelled:
                    continue
                if isinstance(result, BaseException):
                    self._fail(reply, result)
                    continue
                for chunk in result:
                    reply.pending[chunk.offset_samples] = chunk
                while reply.next_offset in reply.pending:
                    chunk = reply.pending.pop(reply.next_offset)
                    reply.next_offset += len(chunk.samples)
                    self._deliver(reply, chunk, now)
                if reply.finished and not reply.pending:
                    reply.out.put_nowait(_DONE)
                    self._active.pop(reply.key, None)
        finally:
            self._pump()

    def _fail(self, reply: _Reply, exc: BaseException) -> None:
        if not reply.cancelled:
            reply.out.put_nowait(exc)
        reply.cancelled = True
        self._active.pop(reply.key, None)

    def _deliver(self, reply: _Reply, chunk: TtsChunk, now: float) -> None:
        stats = reply.stats
        stats.chunks += 1
        due = reply.due(chunk.offset_samples)
        if due is None:
            reply.origin = now
            stats.first_audio_s = now - reply.arrival
        else:
            slack = due - now
            stats.min_slack_s = min(stats.min_slack_s, slack)
            if self._metrics is not None:
                self._metrics.tts_playout_slack.observe(slack)
            if slack < 0:
                # The player waited; it resumes from now, so every later chunk is due later.
                stats.late_chunks += 1
                stats.starved_s -= slack
                assert reply.origin is not None
                reply.origin -= slack
                if self._metrics is not None:
                    self._metrics.tts_late_chunks.inc()
                    self._metrics.tts_starvation.inc(-slack)
        reply.out.put_nowait(chunk)
