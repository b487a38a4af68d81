"""The synthesis scheduler's driver: replies' steps on engine workers, in deadline order.

:mod:`engines.tts._scheduler` decides what runs (a pure policy over a snapshot); this module
owns the state that the policy reads and the threads that do the work:

* every reply is a :class:`~engines.tts.ReplyJob` with one next step (front end or window)
  and, once its first chunk is out, a playout clock: the chunk at reply sample ``s`` is due at
  ``first_audio + s / rate`` (plus any starvation so far, since a starved player resumes
  later), exactly as the session paces frames out from the first one;
* a dispatcher task asks the policy whenever a worker is free or a reply changes, runs the
  chosen step on a worker thread (or, for a reply's first audio while every worker is busy,
  on one extra first-audio thread) (``engine.decode_windows`` for windows, batched where the
  policy said so) and delivers the chunks to the reply's queue on the event loop;
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
import time
from collections import deque
from collections.abc import AsyncGenerator, Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

from engines.tts import ReplyJob, SpeakOptions, TtsChunk, VitsStreamer, WindowPlan
from engines.tts._scheduler import (
    CostModel,
    Dispatch,
    SynthItem,
    SynthPolicy,
    WaitUntil,
    Work,
    next_work,
)
from gateway.metrics import GatewayMetrics

__all__ = ["ReplyStats", "SynthesisScheduler", "policy_for"]

log = logging.getLogger("voxgate.synthesis")


def policy_for(streamer: VitsStreamer, max_batch_size: int = 1) -> SynthPolicy:
    """The scheduling policy for ``streamer``'s voice and window settings.

    Windows range from 32 frames (at most ``TtsConfig.window_frames``) to twice
    ``window_frames`` (192 by default): the slack decides within that range, where the fixed
    schedule doubled from the first window up to ``window_frames``.
    """
    cfg = streamer.config
    return SynthPolicy(
        context_frames=cfg.context_frames,
        first_window_frames=cfg.first_window_frames,
        min_window_frames=max(cfg.first_window_frames, min(32, cfg.window_frames)),
        max_window_frames=2 * cfg.window_frames,
        max_batch_size=max_batch_size,
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

#: A worker's answer: per reply its chunks (or its error), seconds taken, decoder input frames.
_RunResult = tuple[list[list[TtsChunk] | BaseException], float, int]


@dataclass(eq=False)
class _Reply:
    key: int
    job: ReplyJob
    arrival: float
    rate: int
    out: asyncio.Queue[TtsChunk | _Done | BaseException] = field(default_factory=asyncio.Queue)
    origin: float | None = None  # loop time at which sample 0 plays (first chunk ready)
    running: bool = False
    cancelled: bool = False
    stats: ReplyStats = field(default_factory=ReplyStats)

    def due(self, sample: int) -> float | None:
        return None if self.origin is None else self.origin + sample / self.rate

    def item(self, guard_s: float) -> SynthItem:
        due = self.due(self.job.samples_out)
        job = self.job
        return SynthItem(
            key=self.key,
            arrival=self.arrival,
            deadline=None if due is None else due - guard_s,
            kind="front" if job.needs_front_end else "window",
            position=job.position,
            unit_frames=job.unit_frames,
        )


class SynthesisScheduler:
    """Runs every reply's synthesis on ``workers`` threads, earliest playout deadline first.

    Args:
        streamer: the loaded voice (its sessions are shared by the workers).
        workers: engine threads (one per core on a CPU, one on a GPU).
        policy: the scheduling policy; :func:`policy_for` fits it to the voice.
        metrics: where to export slack, lateness, batch sizes and queue depth.
        guard_s: a step is due this long before its first sample plays, for the session's
            frame hold-back (one 20 ms frame) and the hop from worker to sender.
        clock: the event loop's clock unless a test passes its own.
    """

    def __init__(
        self,
        streamer: VitsStreamer,
        workers: int,
        policy: SynthPolicy,
        metrics: GatewayMetrics | None = None,
        *,
        guard_s: float = 0.05,
        clock: Callable[[], float] | None = None,
    ) -> None:
        self.streamer = streamer
        self.policy = policy
        self.workers = workers
        self.cost = CostModel()
        self._metrics = metrics
        self._guard_s = guard_s
        self._clock = clock
        # One thread more than the workers: the first-audio lane (see next_work's urgent_only).
        # While every worker runs a window, a new reply's first steps still start at once and
        # share the cores with them (the OS preempts; ONNX Runtime cannot).
        self._pool = ThreadPoolExecutor(max_workers=workers + 1, thread_name_prefix="tts")
        self._idle = workers
        self._urgent_idle = True
        self._waiting: dict[int, _Reply] = {}
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
        """Replies whose next step waits for a worker."""
        return len(self._waiting)

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
        self, text: str, options: SpeakOptions, stats: ReplyStats | None = None
    ) -> AsyncGenerator[TtsChunk]:
        """Validate ``text`` (raising ``TtsInputError``), then yield its chunks as they are made.

        Closing the iterator (or cancelling the task iterating it) cancels the reply: its
        queued steps leave the queue at once.
        """
        wake = self._ensure_started()
        loop = asyncio.get_running_loop()
        job = await loop.run_in_executor(None, self.streamer.open, text, options)
        reply = _Reply(next(self._ids), job, self._now(), self.streamer.sample_rate_hz)
        if stats is not None:
            reply.stats = stats
        reply.stats.reply_id = reply.key
        self._waiting[reply.key] = reply
        self._queue_changed()
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
        if self._waiting.pop(reply.key, None) is not None:
            self._queue_changed()

    async def aclose(self) -> None:
        """Stop dispatching and the worker threads (after the server stopped calling)."""
        self._closed = True
        if self._task is not None:
            self._task.cancel()
            await asyncio.wait({self._task})
        for reply in self._waiting.values():
            reply.out.put_nowait(RuntimeError("the synthesis scheduler is closed"))
        self._waiting.clear()
        await asyncio.to_thread(self._pool.shutdown, wait=True, cancel_futures=True)

    # -- dispatch --------------------------------------------------------------------------

    def _queue_changed(self) -> None:
        if self._metrics is not None:
            self._metrics.tts_queue_depth.set(len(self._waiting))

    async def _dispatch_loop(self) -> None:
        assert self._wake is not None
        loop = asyncio.get_running_loop()
        while True:
            self._wake.clear()
            wait: float | None = None
            while self._waiting and (self._idle > 0 or self._urgent_idle):
                now = self._now()
                items = [r.item(self._guard_s) for r in self._waiting.values()]
                urgent = self._idle == 0
                decision = next_work(
                    items,
                    now,
                    self.policy,
                    self.cost,
                    idle_workers=self._idle,
                    urgent_only=urgent,
                )
                if isinstance(decision, WaitUntil):
                    if not urgent:
                        wait = decision.time
                    break
                self._start(decision, loop, urgent)
            timeout = None if wait is None else max(0.0, wait - self._now())
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), timeout)

    def _start(self, decision: Dispatch, loop: asyncio.AbstractEventLoop, urgent: bool) -> None:
        replies = [self._waiting.pop(w.key) for w in decision.work]
        self.dispatches.append(tuple((w.key, w.kind, w.frames) for w in decision.work))
        for reply in replies:
            reply.running = True
        if urgent:
            self._urgent_idle = False
        else:
            self._idle -= 1
        self._queue_changed()
        fut = loop.run_in_executor(self._pool, self._run, decision.work, replies)
        fut.add_done_callback(lambda f: self._finished(f, replies, urgent))

    def _run(self, work: tuple[Work, ...], replies: list[_Reply]) -> _RunResult:
        """On a worker thread: one step of one reply, or one batched decoder call."""
        t0 = time.perf_counter()
        if work[0].kind == "front":
            try:
                result: list[list[TtsChunk] | BaseException] = [replies[0].job.run_front_end()]
            except Exception as exc:  # noqa: BLE001 - fails that reply only
                result = [exc]
            return result, time.perf_counter() - t0, 0
        plans: list[tuple[ReplyJob, WindowPlan]] = [
            (r.job, r.job.plan(w.frames, w.pad_to)) for w, r in zip(work, replies, strict=True)
        ]
        frames = sum(p.input_frames for _, p in plans)
        try:
            audio = self.streamer.decode_windows(plans)
            result = [
                [job.finish_window(plan, a)] for (job, plan), a in zip(plans, audio, strict=True)
            ]
        except Exception as exc:  # noqa: BLE001 - a failing batch fails its own replies
            result = [exc for _ in replies]
        return result, time.perf_counter() - t0, frames

    def _finished(
        self, fut: asyncio.Future[_RunResult], replies: list[_Reply], urgent: bool
    ) -> None:
        """On the loop: learn the cost, deliver chunks, requeue the replies that go on."""
        if urgent:
            self._urgent_idle = True
        else:
            self._idle += 1
        if self._wake is not None:
            self._wake.set()
        if fut.cancelled():
            return
        exc = fut.exception()
        if exc is not None:
            for reply in replies:
                reply.out.put_nowait(exc)
            return
        results, seconds, frames = fut.result()
        if frames:
            self.cost.observe_window(frames, seconds)
            if self._metrics is not None:
                self._metrics.tts_batch_size.observe(len(replies))
        else:
            self.cost.observe_front(seconds)
        now = self._now()
        for reply, result in zip(replies, results, strict=True):
            reply.running = False
            if reply.cancelled:
                continue
            if isinstance(result, BaseException):
                reply.out.put_nowait(result)
                continue
            for chunk in result:
                self._deliver(reply, chunk, now)
            if reply.job.done:
                reply.out.put_nowait(_DONE)
            else:
                self._waiting[reply.key] = reply
        self._queue_changed()

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
