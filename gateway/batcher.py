"""Cross-call micro-batching: a pure scheduling policy, a thin asyncio driver, a plan chooser.

Three layers, each testable on its own:

* :class:`BatchPolicy` decides *what* runs next from a snapshot of the queue, the time and the
  number of idle workers. It is synchronous and pure (no clock, no loop, no threads), so tests
  drive it step by step with a fake clock.
* :class:`Batcher` owns the queue, the futures and one single-thread executor per engine worker.
  It asks the policy, runs ``engine.infer_batch`` on a worker thread and completes the futures.
  With ``join_running`` it runs a :class:`ContinuousEngine` instead: one long call per batch
  that takes newly queued items between its decode steps and hands each result back the moment
  that item is done (iteration-level batching; see :meth:`BatchPolicy.join`).
* :func:`choose_plan` picks ``max_batch_size`` and the worker count from measured throughput;
  :func:`default_plan` is the starting point before anything has been measured.

The batcher knows nothing of gRPC or Whisper: an engine is anything with
``infer_batch(items) -> list[result]`` (one result per item, in order), and a batch key is any
hashable value the caller derives from its request (for ASR, ``AsrRequest.batch_key``).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import math
import threading
from collections import deque
from collections.abc import Callable, Hashable, Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Generic, Literal, Protocol, TypeVar, cast

from voxgate.gateway.scheduling import WaitUntil

__all__ = [
    "DEFAULT_PLANS",
    "Batch",
    "BatchEngine",
    "BatchObserver",
    "BatchPlan",
    "BatchPolicy",
    "BatchResultLengthError",
    "BatchTimeoutError",
    "Batcher",
    "BatcherClosedError",
    "BatcherStats",
    "ContinuousEngine",
    "QueueFullError",
    "Schedulable",
    "WithdrawnError",
    "choose_plan",
    "default_candidates",
    "default_plan",
]

T = TypeVar("T")
R = TypeVar("R")
T_contra = TypeVar("T_contra", contravariant=True)
R_co = TypeVar("R_co", covariant=True)
E = TypeVar("E", bound="Schedulable")


# --------------------------------------------------------------------------------------------
# Errors
# --------------------------------------------------------------------------------------------


class QueueFullError(Exception):
    """The batch queue is at ``max_queue_size``; the item was not accepted.

    The servicer maps this to ``RESOURCE_EXHAUSTED`` with a ``QuotaFailure`` detail, whose
    violation can be built from :attr:`subject` and :attr:`description` without parsing the
    message.

    Attributes:
        limit: the configured ``max_queue_size``.
        depth: items queued when the submission was refused.
        subject: the quota's name, for ``QuotaFailure.Violation.subject``.
        description: a human-readable reason, for ``QuotaFailure.Violation.description``.
    """

    def __init__(self, *, limit: int, depth: int) -> None:
        self.limit = limit
        self.depth = depth
        self.subject = "batcher.max_queue_size"
        self.description = (
            f"batch queue is full: {depth} items waiting, max_queue_size={limit}; "
            "retry later or raise max_queue_size"
        )
        super().__init__(self.description)


class BatcherClosedError(RuntimeError):
    """The batcher is closing or closed: a new item was refused or a queued one never ran."""


class BatchTimeoutError(RuntimeError):
    """A batch ran past the batcher's ``batch_timeout_s``: the engine is taken to be hung.

    Its items fail with this error (the servicer maps it to ``DEADLINE_EXCEEDED``, as an error
    event on each call; the calls go on), and the worker gets a fresh thread (and a fresh engine
    when the batcher has a ``replace`` factory) so that the next batch does not queue behind the
    stuck one. Python cannot kill a thread: the stuck one is abandoned and counted
    (``BatcherStats.abandoned_threads``); if it ever returns, its results are discarded.

    Attributes:
        worker: the worker whose batch hung.
        timeout_s: the limit it ran past.
    """

    def __init__(self, *, worker: int, timeout_s: float, size: int) -> None:
        self.worker = worker
        self.timeout_s = timeout_s
        super().__init__(
            f"the recognition engine did not finish a batch of {size} within "
            f"batch_timeout_s={timeout_s:g} (worker {worker} was replaced)"
        )


class WithdrawnError(RuntimeError):
    """A queued item left the queue unrun because a later submission superseded it.

    :meth:`Batcher.withdraw` raises it into the futures of the queued items of a group: an
    utterance's interim re-decodes, once the final decode of that utterance is submitted. The
    final covers the whole utterance, so the interim's result would be stale on arrival, and
    it would take a worker (or a place in the final's own batch) that the final needs.
    """


class BatchResultLengthError(RuntimeError):
    """An engine broke its contract by returning a different number of results than items.

    Results cannot be matched to items once the lengths differ, so the whole batch fails.
    """


# --------------------------------------------------------------------------------------------
# Policy (pure)
# --------------------------------------------------------------------------------------------


class Schedulable(Protocol):
    """What the policy reads from a queued item; the driver's entries provide these.

    Times are seconds on the same clock as the ``now`` passed to :meth:`BatchPolicy.next_batch`
    (the driver uses ``loop.time()``).
    """

    @property
    def key(self) -> Hashable:
        """Batch key: items with different keys never share a batch."""
        ...

    @property
    def is_final(self) -> bool:
        """Finals outrank interim re-decodes, whose results are soon superseded anyway."""
        ...

    @property
    def deadline(self) -> float:
        """When the result is due (``math.inf`` for none); earliest first within a priority."""
        ...

    @property
    def enqueued_at(self) -> float:
        """When the item entered the queue; starts the ``max_wait_ms`` window."""
        ...

    @property
    def seq(self) -> int:
        """Submission order, a unique tie-breaker so that ordering is total and stable."""
        ...


@dataclass(frozen=True, slots=True)
class Batch(Generic[E]):
    """Dispatch these entries together now.

    Attributes:
        key: the batch key every entry shares.
        entries: most urgent first; never more than ``max_batch_size``.
    """

    key: Hashable
    entries: tuple[E, ...]


def _urgency(entry: Schedulable) -> tuple[bool, float, int]:
    # NOTE: finals first (False sorts before True), then earliest deadline, then FIFO. Interim
    # re-decodes can starve under sustained overload of finals; that is intended, because an
    # interim result that arrives late is worthless and the next one supersedes it.
    return (not entry.is_final, entry.deadline, entry.seq)


class BatchPolicy:
    """Decides which queued items run next; pure and synchronous.

    Rules:

    * Dispatch at once when a worker is idle: with ``max_wait_ms == 0`` (the default) a lone
      caller never waits for a window.
    * While every worker is busy, items accumulate; the next batch forms when one frees up.
    * The most urgent item (finals before interim, then earliest deadline, then FIFO) picks the
      batch key; the batch fills with same-key items in urgency order up to
      ``max_batch_size``. Items with different keys never share a batch.
    * With several idle workers, a burst is spread: the batch takes at most
      ``ceil(same-key items / idle workers)``, so the other workers get the rest at once.
    * With ``max_wait_ms > 0`` (worth it on a GPU, where a batch of 8 costs little more than 1),
      a partial batch is held until it is full, or until ``max_wait_ms`` after its oldest item
      was queued, or until the earliest deadline among its items, whichever comes first. While
      it is held nothing else is dispatched, so a less urgent key cannot overtake it.
    * The queue is bounded: :meth:`admit` raises :class:`QueueFullError` at ``max_queue_size``.

    Args:
        max_batch_size: most items per ``infer_batch`` call.
        max_wait_ms: longest a partial batch may be held for more items; 0 never holds.
        max_queue_size: most items waiting (not counting those already running).

    Raises:
        ValueError: when a limit is out of range.
    """

    def __init__(
        self, *, max_batch_size: int = 8, max_wait_ms: float = 0.0, max_queue_size: int = 256
    ) -> None:
        if max_batch_size < 1:
            raise ValueError(f"max_batch_size must be >= 1, got {max_batch_size}")
        if not (max_wait_ms >= 0.0 and math.isfinite(max_wait_ms)):
            raise ValueError(f"max_wait_ms must be a finite number >= 0, got {max_wait_ms}")
        if max_queue_size < 1:
            raise ValueError(f"max_queue_size must be >= 1, got {max_queue_size}")
        self.max_batch_size = max_batch_size
        self.max_wait_ms = max_wait_ms
        self.max_queue_size = max_queue_size

    def __repr__(self) -> str:
        return (
            f"BatchPolicy(max_batch_size={self.max_batch_size}, "
            f"max_wait_ms={self.max_wait_ms}, max_queue_size={self.max_queue_size})"
        )

    def admit(self, depth: int) -> None:
        """Check that one more item fits in a queue that already holds ``depth`` items.

        Raises:
            QueueFullError: when the queue is at ``max_queue_size``.
        """
        if depth >= self.max_queue_size:
            raise QueueFullError(limit=self.max_queue_size, depth=depth)

    def next_batch(
        self, queue: Sequence[E], now: float, *, idle_workers: int
    ) -> Batch[E] | WaitUntil | None:
        """Choose the next batch, or say how long to hold, or that there is nothing to do.

        Args:
            queue: live waiting items in any order (the driver drops cancelled ones first).
            now: the current time on the entries' clock, in seconds.
            idle_workers: workers free to take a batch right now.

        Returns:
            A :class:`Batch` to dispatch now; a :class:`WaitUntil` when a partial batch is held
            for ``max_wait_ms``; ``None`` when the queue is empty or every worker is busy (ask
            again when either changes).
        """
        if not queue or idle_workers <= 0:
            return None
        ordered = sorted(queue, key=_urgency)
        key = ordered[0].key
        same_key = [e for e in ordered if e.key == key]
        if self.max_wait_ms > 0.0 and len(same_key) < self.max_batch_size:
            oldest = min(e.enqueued_at for e in same_key)
            hold_until = min(oldest + self.max_wait_ms / 1000.0, *(e.deadline for e in same_key))
            if hold_until > now:
                return WaitUntil(hold_until)
        # NOTE: spread a burst over the idle workers instead of piling it on one: on a small CPU
        # two concurrent single calls beat one batch of two (DESIGN.md), and with one worker
        # (the GPU plan) this is a no-op.
        size = min(self.max_batch_size, -(-len(same_key) // idle_workers))
        return Batch(key=key, entries=tuple(same_key[:size]))

    def join(
        self, queue: Sequence[E], *, key: Hashable, running: int, idle_workers: int
    ) -> tuple[E, ...]:
        """Which queued items may join a running batch now (iteration-level batching).

        A continuous engine takes new items between its decode steps, so an utterance that
        arrives while a batch decodes need not wait for that batch's slowest item. Rules:

        * Only while every worker is busy: an idle worker serves the queue through
          :meth:`next_batch` (a batch of its own, concurrent with the running one, which is
          what a small CPU wants; on a one-worker GPU there is never an idle worker while a
          batch runs, so everything that fits joins).
        * Same batch key only, and the running batch never grows past ``max_batch_size``.
        * Most urgent first (finals, then earliest deadline, then FIFO).
        * Nothing overtakes a more urgent item of another key: only the items of this key that
          are more urgent than every waiting item of another key join. So finals go before
          interims (no interim joins while a final of another key waits, since a bigger batch
          makes every step slower), and under a steady stream of one key the running batch
          still drains, freeing the worker for the other key's turn instead of starving it.

        The ``max_wait_ms`` hold does not apply: joining a batch that is already running
        delays nobody's dispatch.

        Args:
            queue: live waiting items in any order.
            key: the running batch's key.
            running: items in the running batch now (decoding or handed over, not yet done).
            idle_workers: workers free to take a batch right now.

        Returns:
            The items to hand to the running batch, most urgent first (empty for none).
        """
        room = self.max_batch_size - running
        if room <= 0 or not queue or idle_workers > 0:
            return ()
        picks: list[E] = []
        for entry in sorted(queue, key=_urgency):
            if entry.key != key:
                break  # the most urgent item of another key: nothing after it may join
            picks.append(entry)
            if len(picks) == room:
                break
        return tuple(picks)


# --------------------------------------------------------------------------------------------
# Driver (async)
# --------------------------------------------------------------------------------------------


class BatchEngine(Protocol[T_contra, R]):
    """What the driver needs from an engine (``AsrEngine`` satisfies it).

    Threading: ``infer_batch`` runs on the worker's own thread. One engine object listed as
    several workers is called from several threads at once, so it must then be thread-safe.
    """

    def infer_batch(self, items: Sequence[T_contra]) -> list[R]:
        """Process ``items`` together; exactly one result per item, in order."""
        ...


class ContinuousEngine(Protocol[T, R_co]):
    """An engine whose batch stays open: items join it between steps and leave when done.

    ``WhisperEngine`` provides this when its own decode loop is in use (``asr.decode_loop``).
    The batcher uses it only with ``join_running``; ``infer_batch`` is then never called.

    Threading: ``run_continuous`` runs on the worker's own thread; ``pull`` and ``emit`` may be
    called from that thread (or any other) and return at once.
    """

    def run_continuous(
        self,
        first: Sequence[T],
        pull: Callable[[int], list[T]],
        emit: Callable[[T, R_co], None],
    ) -> None:
        """Process ``first``, taking more items from ``pull`` until nothing is left.

        Contract:

        * Call ``pull(free_slots)`` between every two steps (it is also the liveness signal:
          ``batch_timeout_s`` runs from the last ``pull`` or ``emit``). It returns at most
          ``free_slots`` new items, possibly none, never blocks.
        * Call ``emit(item, result)`` exactly once per item (``first`` and pulled ones) as soon
          as that item is finished, whatever rounds it took (fallback re-decodes included); the
          item is matched by identity, so pass back the object that was handed over.
        * Return when no item is live and ``pull`` gave nothing. Raising fails every item not
          yet emitted with that exception; returning with items not emitted fails them with
          :class:`BatchResultLengthError`.
        """
        ...


class BatchObserver:
    """Metrics hooks; the default methods do nothing, so override only what you export.

    Every hook is called on the event loop thread and must be quick and must not raise (an
    exception from a hook is not caught and would break the calling operation).
    """

    def queue_depth(self, depth: int) -> None:
        """The number of waiting items changed to ``depth``."""

    def rejected(self, depth: int) -> None:
        """A submission was refused because the queue held ``depth`` items."""

    def dropped(self, count: int) -> None:
        """``count`` queued items were removed without running (cancelled by their caller)."""

    def batch_started(self, worker: int, size: int, waits_s: Sequence[float]) -> None:
        """A batch of ``size`` went to ``worker``; ``waits_s`` is each item's queueing time."""

    def items_joined(self, worker: int, waits_s: Sequence[float]) -> None:
        """Items joined ``worker``'s running batch; ``waits_s`` is each one's queueing time."""

    def batch_finished(
        self, worker: int, size: int, duration_s: float, error: BaseException | None
    ) -> None:
        """A batch finished after ``duration_s`` of engine time; ``error`` when it failed."""

    def worker_replaced(self, worker: int, timeout_s: float) -> None:
        """``worker``'s batch ran past ``timeout_s``; its thread was abandoned and replaced."""


@dataclass(slots=True)
class BatcherStats:
    """Running counters, readable at any time (tests and ``/debug`` pages use them).

    Attributes:
        submitted: items accepted into the queue.
        rejected: submissions refused with :class:`QueueFullError`.
        dropped: queued or dispatched items removed unrun because their future was done.
        batches: ``infer_batch`` calls made.
        failed_batches: calls that raised or broke the length contract.
        items_run: items handed to the engine.
        max_batch_seen: the largest batch so far.
        timed_out_batches: batches that ran past ``batch_timeout_s`` (also in failed_batches).
        abandoned_threads: stuck worker threads left behind when their worker was replaced.
        joined: items that joined a running batch (``join_running``; also in items_run).
        returned: items handed to a running batch but not taken before it ended, put back
            in the queue.
        withdrawn: queued items removed unrun by :meth:`Batcher.withdraw`.
    """

    submitted: int = 0
    rejected: int = 0
    dropped: int = 0
    batches: int = 0
    failed_batches: int = 0
    items_run: int = 0
    max_batch_seen: int = 0
    timed_out_batches: int = 0
    abandoned_threads: int = 0
    joined: int = 0
    returned: int = 0
    withdrawn: int = 0


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
    """A continuous engine call in progress, shared by the loop and the worker thread.

    ``handover`` (items given to the run, not yet pulled) and ``live`` (pulled, not yet
    emitted) are touched only under ``lock``; ``dead`` (the run ended or was abandoned) is set
    under it too, so a pull after the end takes nothing and a late emit is ignored.
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
        join_running: run every worker as a :class:`ContinuousEngine`: queued items join a
            running batch between its steps (:meth:`BatchPolicy.join`) and each item's future
            resolves when that item is done, not when its batch is. ``batch_timeout_s`` then
            counts from the run's last sign of progress (a ``pull`` or an ``emit``), so a long
            run that keeps stepping is not taken for a hung one.

    Raises:
        ValueError: no workers, a bad ``batch_timeout_s``, or ``join_running`` with a worker
            that has no ``run_continuous``.
    """

    def __init__(
        self,
        workers: Sequence[BatchEngine[T, R] | ContinuousEngine[T, R]],
        policy: BatchPolicy,
        *,
        observer: BatchObserver | None = None,
        name: str = "batcher",
        batch_timeout_s: float | None = None,
        replace: Callable[[int], BatchEngine[T, R] | ContinuousEngine[T, R]] | None = None,
        join_running: bool = False,
    ) -> None:
        if not workers:
            raise ValueError("Batcher needs at least one worker engine, got none")
        if batch_timeout_s is not None and not (
            batch_timeout_s > 0.0 and math.isfinite(batch_timeout_s)
        ):
            raise ValueError(f"batch_timeout_s must be a finite number > 0, got {batch_timeout_s}")
        if join_running and not all(callable(getattr(w, "run_continuous", None)) for w in workers):
            raise ValueError("join_running needs engines with run_continuous (ContinuousEngine)")
        self._join_running = join_running
        self._runs: dict[int, _Run[T, R]] = {}
        #: seq -> the run an item was handed to and has not yet pulled.
        self._handed: dict[int, _Run[T, R]] = {}
        self._engines: list[BatchEngine[T, R] | ContinuousEngine[T, R]] = list(workers)
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
        runner = self._run_continuous if self._join_running else self._run_batch
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

    async def _run_batch(self, worker: int, entries: Sequence[_Entry[T, R]]) -> None:
        assert self._loop is not None and self._wake is not None
        loop = self._loop
        # Drop items cancelled after they were picked (ray #50054): their calls have gone, so
        # running them would only delay everyone else in the batch.
        live = [e for e in entries if not e.future.done()]
        if len(live) < len(entries):
            self.stats.dropped += len(entries) - len(live)
            self._observer.dropped(len(entries) - len(live))
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

    def _pull(self, run: _Run[T, R], free_slots: int) -> list[T]:
        """The engine thread asks for new items between two steps (never blocks)."""
        taken: list[_Entry[T, R]] = []
        with run.lock:
            if run.dead:
                return []
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
        return [e.item for e in taken]

    def _emit(self, run: _Run[T, R], item: T, result: R) -> None:
        """The engine thread hands over one finished item's result."""
        self._call_on_loop(self._on_emitted, run, item, result)

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

    def _on_emitted(self, run: _Run[T, R], item: T, result: R) -> None:
        assert self._loop is not None and self._wake is not None
        if run.dead:
            return  # the run was abandoned (hung); its items already failed
        with run.lock:
            index = next((i for i, e in enumerate(run.live) if e.item is item), None)
            entry = run.live.pop(index) if index is not None else None
        run.last_progress = self._loop.time()
        if entry is not None:
            _resolve(entry.future, result)
        self._wake.set()

    async def _run_continuous(self, worker: int, entries: Sequence[_Entry[T, R]]) -> None:
        assert self._loop is not None and self._wake is not None
        loop = self._loop
        live = [e for e in entries if not e.future.done()]
        if len(live) < len(entries):
            self.stats.dropped += len(entries) - len(live)
            self._observer.dropped(len(entries) - len(live))
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
            engine = cast(ContinuousEngine[T, R], self._engines[worker])
            future = loop.run_in_executor(
                self._executors[worker],
                engine.run_continuous,
                [e.item for e in live],
                functools.partial(self._pull, run),
                functools.partial(self._emit, run),
            )
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
            # Every emit the engine made before returning was queued on the loop ahead of the
            # future's completion, so the results are all delivered by now.
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
                    f"engine ended a continuous run on worker {worker} without a result for "
                    f"{len(missing)} of its {run.size} items; run_continuous must emit one "
                    "result per item"
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


# --------------------------------------------------------------------------------------------
# Plan: batch size and worker count per device
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class BatchPlan:
    """How to run an engine on one device.

    Attributes:
        max_batch_size: the policy's ``max_batch_size``.
        workers: how many worker threads (engine instances or threads on a thread-safe one).
    """

    max_batch_size: int
    workers: int

    def __post_init__(self) -> None:
        if self.max_batch_size < 1 or self.workers < 1:
            raise ValueError(
                f"BatchPlan needs max_batch_size >= 1 and workers >= 1, got "
                f"max_batch_size={self.max_batch_size}, workers={self.workers}"
            )


#: Starting points before anything is measured, from measurements in DESIGN.md:
#: - ``cpu`` (2 cores): concurrent single calls on two workers (CT2 ``inter_threads=2``,
#:   ``intra_threads=1``) beat every batch-of-8 setup by 1.25-1.3x; batching the encoder gains
#:   nothing on CPU and the decoder only 1.15-1.45x at 8, so a batch of 2 is enough to soak up
#:   bursts without making a lone caller pay for others' decoding.
#: - ``cuda``: one worker owns the GPU and batching pays (faster-whisper: 3.7x at batch 8 for
#:   large-v2); 8 is the measured point, 16 is worth measuring with :func:`choose_plan`.
DEFAULT_PLANS: dict[str, BatchPlan] = {
    "cpu": BatchPlan(max_batch_size=2, workers=2),
    "cuda": BatchPlan(max_batch_size=8, workers=1),
}


def default_plan(device: Literal["cpu", "cuda"], cpu_cores: int = 2) -> BatchPlan:
    """The unmeasured starting plan for ``device``.

    On CPU the worker count follows the core count (one intra-op thread per worker, as measured
    on 2 cores); more than 2 cores is an extrapolation that :func:`choose_plan` should confirm.

    Args:
        device: ``cpu`` or ``cuda``.
        cpu_cores: cores available to the engine process (CPU only).

    Raises:
        ValueError: for an unknown device or fewer than one core.
    """
    if device not in DEFAULT_PLANS:
        raise ValueError(f"unknown device {device!r}; expected one of {sorted(DEFAULT_PLANS)}")
    if cpu_cores < 1:
        raise ValueError(f"cpu_cores must be >= 1, got {cpu_cores}")
    plan = DEFAULT_PLANS[device]
    if device == "cpu":
        return BatchPlan(max_batch_size=plan.max_batch_size, workers=cpu_cores)
    return plan


def default_candidates(device: Literal["cpu", "cuda"], cpu_cores: int = 2) -> list[BatchPlan]:
    """Plans worth measuring on ``device``: the default plus its neighbours.

    Raises:
        ValueError: for an unknown device or fewer than one core.
    """
    if device not in DEFAULT_PLANS:
        raise ValueError(f"unknown device {device!r}; expected one of {sorted(DEFAULT_PLANS)}")
    if cpu_cores < 1:
        raise ValueError(f"cpu_cores must be >= 1, got {cpu_cores}")
    if device == "cpu":
        worker_counts = sorted({1, max(1, cpu_cores // 2), cpu_cores})
        sizes = (1, 2, 4, 8)
    else:
        worker_counts = [1, 2]
        sizes = (1, 4, 8, 16)
    return [BatchPlan(max_batch_size=b, workers=w) for w in worker_counts for b in sizes]


def choose_plan(
    measure: Callable[[int, int], float],
    candidates: Iterable[BatchPlan],
    *,
    tolerance: float = 0.05,
) -> BatchPlan:
    """Measure each candidate and pick the best, preferring small plans when close.

    Plans whose throughput is within ``tolerance`` of the best count as equal; among those the
    smallest ``max_batch_size`` wins (a smaller batch means less waiting for a lone caller),
    then the fewest workers (less memory, fewer threads competing for cores).

    Args:
        measure: ``measure(max_batch_size, workers)`` returns throughput (items per second,
            higher is better) for that plan under a saturating load; called once per plan.
        candidates: plans to try; duplicates are measured once.
        tolerance: relative margin, in [0, 1), within which plans count as tied.

    Returns:
        The chosen plan.

    Raises:
        ValueError: when there are no candidates, ``tolerance`` is out of range, or a
            measurement is not a finite positive number (a broken benchmark must not silently
            pick a plan).
    """
    if not 0.0 <= tolerance < 1.0:
        raise ValueError(f"tolerance must be in [0, 1), got {tolerance}")
    plans = list(dict.fromkeys(candidates))
    if not plans:
        raise ValueError("choose_plan needs at least one candidate plan")
    measured: list[tuple[BatchPlan, float]] = []
    for plan in plans:
        throughput = measure(plan.max_batch_size, plan.workers)
        if not (math.isfinite(throughput) and throughput > 0.0):
            raise ValueError(
                f"measure returned {throughput!r} for {plan}; expected a positive rate"
            )
        measured.append((plan, throughput))
    best = max(t for _, t in measured)
    near = [plan for plan, t in measured if t >= best * (1.0 - tolerance)]
    return min(near, key=lambda p: (p.max_batch_size, p.workers))
