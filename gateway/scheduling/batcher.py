"""The batch driver: owns the queue, the futures and the engine workers; asks the policy.

:class:`Batcher` runs items from many calls through one or more engine workers. It asks
:class:`~voxgate.gateway.scheduling.batch_policy.BatchPolicy` what runs next, runs
``engine.infer_batch`` on a worker thread and completes the futures. With ``join_running`` the
workers are :class:`~voxgate.gateway.scheduling.batch_engine.StepEngine` s and a batch stays
open: the driver adds it, and between the engine's steps adds what the policy lets join
(:meth:`BatchPolicy.join`), steps, and resolves each item's future the moment it is done
(iteration-level batching, vLLM's schedule -> execute -> update); the engine never calls back.

The batcher knows nothing of gRPC or Whisper: an engine is anything with ``infer_batch`` (or
``add`` / ``step`` / ``abort``), and a batch key is any hashable value the caller derives from
its request (for ASR, ``AsrRequest.batch_key``).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import math
import threading
from collections import deque
from collections.abc import Callable, Hashable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar, cast

from voxgate.gateway.scheduling.batch_engine import (
    BatchEngine,
    BatcherStats,
    BatchObserver,
    StepEngine,
)
from voxgate.gateway.scheduling.batch_policy import Batch, BatchPolicy
from voxgate.gateway.scheduling.errors import (
    BatcherClosedError,
    BatchResultLengthError,
    BatchTimeoutError,
    QueueFullError,
    WithdrawnError,
)

__all__ = ["Batcher"]

T = TypeVar("T")
R = TypeVar("R")


@dataclass(slots=True, eq=False)
class _Entry(Generic[T, R]):
    """One queued item with its scheduling attributes and the caller's future."""

    item: T
    key: Hashable
    is_final: bool
    deadline: float
    enqueued_at: float
    seq: int
    future: asyncio.Future[R]
    #: What :meth:`Batcher.withdraw` names it by (None: never withdrawn).
    group: Hashable = None


@dataclass(slots=True, eq=False)
class _Run(Generic[T, R]):
    """A running step batch, shared by the loop and the worker thread that steps it.

    ``handover`` (items the policy let join, not yet added to the engine) and ``live`` (added,
    not yet finished) are touched only under ``lock``; ``dead`` (the run ended or was
    abandoned) is set under it too, so a pull after the end takes nothing (and stops the
    worker's step loop) and a late result is ignored.
    """

    worker: int
    key: Hashable
    live: list[_Entry[T, R]]
    last_progress: float
    lock: threading.Lock = field(default_factory=threading.Lock)
    handover: deque[_Entry[T, R]] = field(default_factory=deque)
    dead: bool = False
    size: int = 0


def _resolve(future: asyncio.Future[Any], result: Any) -> None:
    # NOTE: the caller may have cancelled while the batch ran; completing a done future raises
    # InvalidStateError and would take the other items of the batch down with it (ray #41199).
    if not future.done():
        future.set_result(result)


def _fail(future: asyncio.Future[Any], error: BaseException) -> None:
    if not future.done():
        future.set_exception(error)


class Batcher(Generic[T, R]):
    """Runs items from many calls through one or more engine workers in micro-batches.

    Each worker is an engine object with its own single-thread executor; a worker runs one batch
    at a time. Listing one engine several times gives several threads over one object (for
    thread-safe engines such as CTranslate2 with ``inter_threads > 1``); listing distinct
    engines gives independent replicas. The driver is event-driven: it wakes on a submission, a
    finished batch, a cancellation or the end of a ``max_wait_ms`` hold, never on a poll.

    Example::

        batcher = Batcher([engine], BatchPolicy(max_batch_size=8))
        await batcher.start()
        result = await batcher.submit(req, key=req.batch_key, is_final=req.is_final)
        ...
        await batcher.aclose()

    Args:
        workers: one entry per worker thread; must not be empty.
        policy: the scheduling rules and limits.
        observer: optional metrics hooks.
        name: prefix of the worker thread names (shows up in stack dumps and profilers).
        batch_timeout_s: a batch still running after this long is taken as a hung engine (see
            :class:`BatchTimeoutError`); ``None`` waits forever.
        replace: ``replace(worker)`` builds the engine a replaced worker uses from then on
            (e.g. ``WhisperEngine.sibling``); without it the worker keeps its engine object on
            a fresh thread. Called on the event loop, so it must be quick.
        join_running: run every worker as a :class:`StepEngine`: queued items join a
            running batch between its steps (:meth:`BatchPolicy.join`) and each item's future
            resolves when that item is done, not when its batch is. ``batch_timeout_s`` then
            counts from the run's last sign of progress (a finished step), so a long run that
            keeps stepping is not taken for a hung one.

    Raises:
        ValueError: no workers, a bad ``batch_timeout_s``, or ``join_running`` with a worker
            that has no ``add`` / ``step`` / ``abort`` (not a StepEngine).
    """

    def __init__(
        self,
        workers: Sequence[BatchEngine[T, R] | StepEngine[T, R]],
        policy: BatchPolicy,
        *,
        observer: BatchObserver | None = None,
        name: str = "batcher",
        batch_timeout_s: float | None = None,
        replace: Callable[[int], BatchEngine[T, R] | StepEngine[T, R]] | None = None,
        join_running: bool = False,
    ) -> None:
        if not workers:
            raise ValueError("Batcher needs at least one worker engine, got none")
        if batch_timeout_s is not None and not (
            batch_timeout_s > 0.0 and math.isfinite(batch_timeout_s)
        ):
            raise ValueError(f"batch_timeout_s must be a finite number > 0, got {batch_timeout_s}")
        if join_running and not all(_is_step_engine(w) for w in workers):
            raise ValueError("join_running needs engines with add / step / abort (StepEngine)")
        self._join_running = join_running
        self._runs: dict[int, _Run[T, R]] = {}
        #: seq -> the run an item was handed to and has not yet pulled.
        self._handed: dict[int, _Run[T, R]] = {}
        self._engines: list[BatchEngine[T, R] | StepEngine[T, R]] = list(workers)
        self._policy = policy
        self._observer = observer if observer is not None else BatchObserver()
        self._name = name
        self._batch_timeout_s = batch_timeout_s
        self._replace = replace
        self._generation = [0] * len(self._engines)
        self._executors = [self._new_executor(i) for i in range(len(self._engines))]
        self._abandoned: list[ThreadPoolExecutor] = []
        self.stats = BatcherStats()
        # NOTE: a dict keyed by seq keeps submission order and makes removal on cancel O(1).
        self._queue: dict[int, _Entry[T, R]] = {}
        self._idle: deque[int] = deque(range(len(self._engines)))
        self._inflight: set[asyncio.Task[None]] = set()
        self._seq = 0
        self._loop: asyncio.AbstractEventLoop | None = None
        self._wake: asyncio.Event | None = None
        self._driver: asyncio.Task[None] | None = None
        self._closing = False
        self._closed = False

    def _new_executor(self, worker: int) -> ThreadPoolExecutor:
        gen = self._generation[worker]
        suffix = f"-r{gen}" if gen else ""
        return ThreadPoolExecutor(
            max_workers=1, thread_name_prefix=f"{self._name}-w{worker}{suffix}"
        )

    def _replace_worker(self, worker: int) -> None:
        """Abandon ``worker``'s stuck thread; later batches run on a fresh one."""
        stuck = self._executors[worker]
        stuck.shutdown(wait=False, cancel_futures=True)
        self._abandoned.append(stuck)
        self._generation[worker] += 1
        self._executors[worker] = self._new_executor(worker)
        if self._replace is not None:
            self._engines[worker] = self._replace(worker)
        self.stats.abandoned_threads += 1

    @property
    def policy(self) -> BatchPolicy:
        """The scheduling policy in force."""
        return self._policy

    @property
    def num_workers(self) -> int:
        """How many batches can run at once."""
        return len(self._engines)

    @property
    def queue_depth(self) -> int:
        """Items waiting to be dispatched (not counting running batches)."""
        return len(self._queue)

    @property
    def idle_workers(self) -> int:
        """Workers not running a batch right now."""
        return len(self._idle)

    @property
    def running(self) -> bool:
        """True between :meth:`start` and :meth:`aclose`."""
        return self._driver is not None and not self._closing

    async def start(self) -> None:
        """Start the dispatch task on the running loop; call once before :meth:`submit`.

        Raises:
            RuntimeError: when already started, or closed.
        """
        if self._closing:
            raise BatcherClosedError("Batcher is closed; it cannot be restarted")
        if self._driver is not None:
            raise RuntimeError("Batcher.start() called twice")
        self._loop = asyncio.get_running_loop()
        self._wake = asyncio.Event()
        self._driver = self._loop.create_task(self._drive(), name="batcher-driver")

    async def __aenter__(self) -> Batcher[T, R]:
        await self.start()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()

    def submit(
        self,
        item: T,
        *,
        key: Hashable = None,
        is_final: bool = True,
        deadline: float | None = None,
        group: Hashable = None,
    ) -> asyncio.Future[R]:
        """Queue ``item`` and return a future for its result.

        Cancelling the future (or the task awaiting it) withdraws the item: if it has not
        started it never reaches the engine; if its batch is running, the result is discarded.

        Args:
            item: passed to ``engine.infer_batch`` as one element of a batch.
            key: items with different keys never share a batch (e.g. ``AsrRequest.batch_key``).
            is_final: False for interim re-decodes, which yield to finals.
            deadline: when the result is due, in ``loop.time()`` seconds; ``None`` = no
                deadline (after every item that has one, within its priority).
            group: a name :meth:`withdraw` may take the item back by while it waits (e.g. an
                utterance, for its interims); ``None`` = never withdrawn.

        Returns:
            A future that resolves to the engine's result for ``item``, or fails with the
            engine's exception, :class:`BatchResultLengthError` or :class:`BatcherClosedError`.

        Raises:
            QueueFullError: when ``max_queue_size`` items are already waiting.
            BatcherClosedError: after :meth:`aclose` has begun.
            RuntimeError: before :meth:`start`.
        """
        if self._closing:
            raise BatcherClosedError("Batcher is closed; no new items are accepted")
        if self._loop is None or self._wake is None:
            raise RuntimeError("Batcher.start() must be awaited before submit()")
        depth = len(self._queue)
        try:
            self._policy.admit(depth)
        except QueueFullError:
            self.stats.rejected += 1
            self._observer.rejected(depth)
            raise
        future: asyncio.Future[R] = self._loop.create_future()
        entry = _Entry(
            item=item,
            key=key,
            is_final=is_final,
            deadline=math.inf if deadline is None else deadline,
            enqueued_at=self._loop.time(),
            seq=self._seq,
            future=future,
            group=group,
        )
        self._seq += 1
        self._queue[entry.seq] = entry
        self.stats.submitted += 1
        future.add_done_callback(functools.partial(self._on_done_while_queued, entry.seq))
        self._observer.queue_depth(len(self._queue))
        self._wake.set()
        return future

    def withdraw(self, group: Hashable) -> int:
        """Take back every waiting item of ``group``; their futures fail with WithdrawnError.

        Waiting means queued, or handed to a running batch that has not taken it yet
        (``join_running``). Items already running are left to finish: their results still
        arrive (an interim's words can stand in for a final that comes back empty), and a
        running item holds only its own worker, which the policy never waits for while
        another is idle. Returns how many items were withdrawn.
        """
        if group is None:
            return 0
        error = WithdrawnError("a later submission of its group superseded this item")
        taken = [e for e in self._queue.values() if e.group == group]
        for entry in taken:
            del self._queue[entry.seq]
        for run in {id(r): r for r in self._handed.values()}.values():
            with run.lock:
                mine = [e for e in run.handover if e.group == group]
                run.handover = deque(e for e in run.handover if e.group != group)
            for entry in mine:
                self._handed.pop(entry.seq, None)
            taken.extend(mine)
        if not taken:
            return 0
        # NOTE: removed before failing, so the done-callbacks find nothing left to drop and
        # the items count once, as withdrawn, not also as dropped.
        for entry in taken:
            _fail(entry.future, error)
        self.stats.withdrawn += len(taken)
        self._observer.queue_depth(len(self._queue))
        if self._wake is not None:
            self._wake.set()
        return len(taken)

    def _on_done_while_queued(self, seq: int, _future: object = None) -> None:
        # A future completes while queued only when its caller cancels it (or aclose fails it);
        # either way it must leave the queue so that it neither runs nor holds a slot.
        run = self._handed.pop(seq, None)
        if run is not None:
            # Handed to a running batch: withdraw it unless the engine already took it.
            with run.lock:
                kept = [e for e in run.handover if e.seq != seq]
                withdrawn = len(kept) < len(run.handover)
                run.handover = deque(kept)
            if withdrawn:
                self.stats.dropped += 1
                self._observer.dropped(1)
                if self._wake is not None:
                    self._wake.set()
            return
        if self._queue.pop(seq, None) is not None:
            self.stats.dropped += 1
            self._observer.dropped(1)
            self._observer.queue_depth(len(self._queue))
            if self._wake is not None:
                self._wake.set()

    def _drop_done(self) -> None:
        # Done-callbacks run one loop iteration after cancel(); catch the ones still pending so
        # that a cancelled item neither picks the batch key nor takes a batch slot.
        done = [seq for seq, e in self._queue.items() if e.future.done()]
        for seq in done:
            self._on_done_while_queued(seq)

    async def _drive(self) -> None:
        assert self._loop is not None and self._wake is not None
        loop, wake = self._loop, self._wake
        try:
            while not self._closing:
                wake.clear()
                self._drop_done()
                if self._idle and self._handed:
                    self._reclaim_handovers()
                decision = self._policy.next_batch(
                    list(self._queue.values()), loop.time(), idle_workers=len(self._idle)
                )
                if isinstance(decision, Batch):
                    self._dispatch(decision.entries)
                    continue
                if self._runs and self._hand_over():
                    continue
                if decision is None:
                    await wake.wait()
                    continue
                try:
                    async with asyncio.timeout_at(decision.at):
                        await wake.wait()
                except TimeoutError:
                    pass
        except BaseException as exc:
            # A bug in the policy must not leave callers waiting forever.
            error = BatcherClosedError(f"batcher driver stopped: {exc!r}")
            for entry in list(self._queue.values()):
                _fail(entry.future, error)
            raise

    def _dispatch(self, entries: Sequence[_Entry[T, R]]) -> None:
        assert self._loop is not None
        worker = self._idle.popleft()
        for entry in entries:
            del self._queue[entry.seq]
        self._observer.queue_depth(len(self._queue))
        runner = self._run_steps if self._join_running else self._run_batch
        task = self._loop.create_task(runner(worker, entries), name=f"batch-w{worker}")
        self._inflight.add(task)
        task.add_done_callback(self._on_batch_task_done)

    def _on_batch_task_done(self, task: asyncio.Task[None]) -> None:
        self._inflight.discard(task)
        # _run_batch handles engine errors itself, so anything escaping it is a bug in this
        # module: report it where asyncio reports lost exceptions instead of dropping it.
        if not task.cancelled() and (exc := task.exception()) is not None:
            assert self._loop is not None
            self._loop.call_exception_handler(
                {"message": "batcher batch task failed", "exception": exc, "task": task}
            )

    def _live(self, entries: Sequence[_Entry[T, R]]) -> list[_Entry[T, R]]:
        """The picked entries still wanted, counting the rest as dropped.

        Items cancelled after they were picked (ray #50054) belong to calls that have gone;
        running them would only delay everyone else in the batch or run.
        """
        live = [e for e in entries if not e.future.done()]
        if len(live) < len(entries):
            self.stats.dropped += len(entries) - len(live)
            self._observer.dropped(len(entries) - len(live))
        return live

    async def _run_batch(self, worker: int, entries: Sequence[_Entry[T, R]]) -> None:
        assert self._loop is not None and self._wake is not None
        loop = self._loop
        live = self._live(entries)
        try:
            if not live:
                return
            started = loop.time()
            self._observer.batch_started(worker, len(live), [started - e.enqueued_at for e in live])
            self.stats.batches += 1
            self.stats.items_run += len(live)
            self.stats.max_batch_seen = max(self.stats.max_batch_seen, len(live))
            error: BaseException | None = None
            try:
                # asyncio.timeout stops waiting, not the thread: a hung engine call keeps its
                # thread, which is why the worker gets a fresh one below.
                async with asyncio.timeout(self._batch_timeout_s):
                    engine = cast(BatchEngine[T, R], self._engines[worker])
                    results = await loop.run_in_executor(
                        self._executors[worker], engine.infer_batch, [e.item for e in live]
                    )
            except TimeoutError:
                assert self._batch_timeout_s is not None
                error = BatchTimeoutError(
                    worker=worker, timeout_s=self._batch_timeout_s, size=len(live)
                )
                self.stats.timed_out_batches += 1
                self._replace_worker(worker)
                self._observer.worker_replaced(worker, self._batch_timeout_s)
            except Exception as exc:
                error = exc
            else:
                if len(results) != len(live):
                    error = BatchResultLengthError(
                        f"engine returned {len(results)} results for a batch of {len(live)} "
                        f"items on worker {worker}; infer_batch must return one result per item"
                    )
                else:
                    for entry, result in zip(live, results, strict=True):
                        _resolve(entry.future, result)
            if error is not None:
                # A failing batch fails only its own futures; the driver keeps going.
                self.stats.failed_batches += 1
                for entry in live:
                    _fail(entry.future, error)
            self._observer.batch_finished(worker, len(live), loop.time() - started, error)
        finally:
            # Exactly one outcome per item even if this task is cancelled mid-batch.
            aborted = BatcherClosedError("batch was aborted before the engine returned")
            for entry in live:
                _fail(entry.future, aborted)
            self._idle.append(worker)
            self._wake.set()

    # ------------------------------------------------------------------ join_running

    def _hand_over(self) -> bool:
        """Give each running batch the queued items the policy lets join it; True if any."""
        moved = False
        for run in list(self._runs.values()):
            with run.lock:
                if run.dead:
                    continue
                running = len(run.live) + len(run.handover)
            picks = self._policy.join(
                list(self._queue.values()),
                key=run.key,
                running=running,
                idle_workers=len(self._idle),
            )
            if not picks:
                continue
            with run.lock:
                if run.dead:
                    continue
                for entry in picks:
                    del self._queue[entry.seq]
                    self._handed[entry.seq] = run
                    run.handover.append(entry)
            moved = True
        if moved:
            self._observer.queue_depth(len(self._queue))
        return moved

    def _take_back(self, run: _Run[T, R]) -> None:
        """Put what was handed to ``run`` but not pulled back in the queue (closing: fail it).

        Those items never reached the engine, so they keep their place and their wait.
        """
        with run.lock:
            back = list(run.handover)
            run.handover.clear()
        if not back:
            return
        error = BatcherClosedError("batcher closed before this item was dispatched")
        for entry in back:
            self._handed.pop(entry.seq, None)
            if self._closing:
                _fail(entry.future, error)
            elif not entry.future.done():
                self._queue[entry.seq] = entry
                self.stats.returned += 1
        self._observer.queue_depth(len(self._queue))

    def _reclaim_handovers(self) -> None:
        # A worker is idle: items still waiting for a running batch's next step go back to the
        # queue, so that the policy can give them that worker instead.
        for run in list(self._runs.values()):
            self._take_back(run)

    def _step_loop(self, engine: StepEngine[T, R], run: _Run[T, R]) -> None:
        """The worker thread's side of a running batch: add, then step until nothing is left.

        Between two steps it adds what the driver handed over (what the policy let join, on
        the event loop, which owns the queue), so the engine thread never waits for the loop
        between steps; each finished item's result goes to the loop at once. It ends when the
        engine has nothing unfinished and nothing was handed over, or when the run is dead
        (abandoned as hung, or closing), and always with an ``abort`` of what the engine still
        holds of this run (nothing, unless a step raised or the run was abandoned).
        """
        with run.lock:
            first = list(run.live)
        open_keys: set[Hashable] = {e.seq for e in first}
        try:
            engine.add([(e.seq, e.item) for e in first])
            while True:
                taken = self._pull(run, max(0, engine.capacity - engine.open_count))
                if taken is None:
                    break  # the run is dead: nobody waits for its results
                if taken:
                    open_keys.update(e.seq for e in taken)
                    engine.add([(e.seq, e.item) for e in taken])
                if not engine.has_unfinished():
                    break
                for key, result in engine.step():
                    open_keys.discard(key)
                    self._call_on_loop(self._on_finished, run, key, result)
        except BaseException:
            # The step's own error is what fails the run's items, not a second one from here.
            with contextlib.suppress(Exception):
                engine.abort(list(open_keys))
            raise
        engine.abort(list(open_keys))

    def _pull(self, run: _Run[T, R], free_slots: int) -> list[_Entry[T, R]] | None:
        """Take handed-over items between two steps (never blocks); None once the run is dead."""
        taken: list[_Entry[T, R]] = []
        with run.lock:
            if run.dead:
                return None
            kept: deque[_Entry[T, R]] = deque()
            for entry in run.handover:
                # NOTE: reads the future's state from this thread (a flag; never mutated
                # here): an item cancelled after it was handed over is left for the loop's
                # done-callback to count as dropped, and never reaches the engine.
                if len(taken) < free_slots and not entry.future.done():
                    taken.append(entry)
                else:
                    kept.append(entry)
            run.handover = kept
            run.live.extend(taken)
        self._call_on_loop(self._on_pulled, run, taken)
        return taken

    def _call_on_loop(self, fn: Callable[..., None], *args: Any) -> None:
        assert self._loop is not None
        # A closed loop raises RuntimeError: an abandoned engine thread outlived the batcher.
        with contextlib.suppress(RuntimeError):
            self._loop.call_soon_threadsafe(fn, *args)

    def _on_pulled(self, run: _Run[T, R], taken: Sequence[_Entry[T, R]]) -> None:
        assert self._loop is not None and self._wake is not None
        for entry in taken:
            self._handed.pop(entry.seq, None)
        if run.dead:
            return
        now = self._loop.time()
        run.last_progress = now
        if taken:
            self.stats.items_run += len(taken)
            self.stats.joined += len(taken)
            run.size += len(taken)
            self.stats.max_batch_seen = max(self.stats.max_batch_seen, len(run.live))
            self._observer.items_joined(run.worker, [now - e.enqueued_at for e in taken])
        self._wake.set()  # room may have changed: the driver may hand over more

    def _on_finished(self, run: _Run[T, R], key: Hashable, result: R) -> None:
        assert self._loop is not None and self._wake is not None
        if run.dead:
            return  # the run was abandoned (hung); its items already failed
        with run.lock:
            index = next((i for i, e in enumerate(run.live) if e.seq == key), None)
            entry = run.live.pop(index) if index is not None else None
        run.last_progress = self._loop.time()
        if entry is not None:
            _resolve(entry.future, result)
        self._wake.set()

    async def _run_steps(self, worker: int, entries: Sequence[_Entry[T, R]]) -> None:
        assert self._loop is not None and self._wake is not None
        loop = self._loop
        live = self._live(entries)
        run: _Run[T, R] | None = None
        try:
            if not live:
                return
            started = loop.time()
            run = _Run(worker=worker, key=live[0].key, live=list(live), last_progress=started)
            run.size = len(live)
            self._runs[worker] = run
            self._observer.batch_started(worker, len(live), [started - e.enqueued_at for e in live])
            self.stats.batches += 1
            self.stats.items_run += len(live)
            self.stats.max_batch_seen = max(self.stats.max_batch_seen, len(live))
            engine = cast(StepEngine[T, R], self._engines[worker])
            future = loop.run_in_executor(self._executors[worker], self._step_loop, engine, run)
            error: BaseException | None = None
            timed_out = False
            while True:
                if self._batch_timeout_s is None:
                    await asyncio.wait({future})
                    break
                remaining = run.last_progress + self._batch_timeout_s - loop.time()
                if remaining <= 0.0:
                    # As with infer_batch: stop waiting (the thread cannot be stopped); whatever
                    # it returns or raises later is discarded.
                    future.cancel()
                    timed_out = True
                    break
                done, _ = await asyncio.wait({future}, timeout=remaining)
                if done:
                    break
            # Every result the step loop posted before returning was queued on the loop ahead
            # of the future's completion, so the results are all delivered by now.
            with run.lock:
                run.dead = True
                missing = list(run.live)
                run.live.clear()
            if timed_out:
                assert self._batch_timeout_s is not None
                error = BatchTimeoutError(
                    worker=worker, timeout_s=self._batch_timeout_s, size=len(missing)
                )
                self.stats.timed_out_batches += 1
                self._replace_worker(worker)
                self._observer.worker_replaced(worker, self._batch_timeout_s)
            elif (exc := future.exception()) is not None:
                error = exc
            elif missing:
                error = BatchResultLengthError(
                    f"engine ended a running batch on worker {worker} without a result for "
                    f"{len(missing)} of its {run.size} items; step must return one result per "
                    "item"
                )
            if error is not None:
                self.stats.failed_batches += 1
                for entry in missing:
                    _fail(entry.future, error)
            self._observer.batch_finished(worker, run.size, loop.time() - started, error)
        finally:
            if run is not None:
                with run.lock:
                    run.dead = True
                    leftover = list(run.live)
                    run.live.clear()
                aborted = BatcherClosedError("batch was aborted before the engine returned")
                for entry in leftover:
                    _fail(entry.future, aborted)
                self._take_back(run)
                if self._runs.get(worker) is run:
                    del self._runs[worker]
            self._idle.append(worker)
            self._wake.set()

    async def aclose(self) -> None:
        """Stop accepting, fail queued items, await running batches, stop the worker threads.

        Queued items fail with :class:`BatcherClosedError`; batches already running finish and
        deliver their results. Engines are not closed here: their owner closes them after this
        returns (the server's shutdown order is: drain calls, stop the batcher, close engines).
        Idempotent.
        """
        if self._closed:
            return
        self._closing = True
        error = BatcherClosedError("batcher closed before this item was dispatched")
        for entry in list(self._queue.values()):
            _fail(entry.future, error)
        self._queue.clear()
        self._observer.queue_depth(0)
        try:
            if self._driver is not None:
                assert self._wake is not None
                self._wake.set()
                await self._driver
        finally:
            # Running batches deliver their results even if the driver died of a bug.
            while self._inflight:
                await asyncio.gather(*self._inflight, return_exceptions=True)
            for executor in self._executors:
                # Every batch has returned, so the threads are idle and exit at once.
                executor.shutdown(wait=False)
            # Abandoned (hung) threads are not waited for; they were shut down when replaced.
            self._closed = True


def _is_step_engine(engine: object) -> bool:
    return all(
        callable(getattr(engine, name, None)) for name in ("add", "step", "abort", "has_unfinished")
    )
