"""What the batch driver needs from an engine, and what it reports: protocols, hooks, counters.

Two kinds of engine serve the driver:

* a :class:`BatchEngine` runs a whole batch in one ``infer_batch`` call;
* a :class:`StepEngine` keeps a batch open (vLLM-shaped ``add`` / ``step`` / ``abort``): the
  driver adds the batch, then between steps adds what the policy lets join, steps, and hands
  each result back the moment its item is done (iteration-level batching).

The engine never calls into the scheduler. ``WhisperEngine`` (and the torch engine) satisfy
both protocols structurally; engines do not import the gateway.
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable, Sequence
from dataclasses import dataclass
from typing import Protocol, TypeVar

__all__ = ["BatchEngine", "BatchObserver", "BatcherStats", "StepEngine"]

R = TypeVar("R")
T_contra = TypeVar("T_contra", contravariant=True)


class BatchEngine(Protocol[T_contra, R]):
    """What the driver needs from an engine (``AsrEngine`` satisfies it).

    Threading: ``infer_batch`` runs on the worker's own thread. One engine object listed as
    several workers is called from several threads at once, so it must then be thread-safe.
    """

    def infer_batch(self, items: Sequence[T_contra]) -> list[R]:
        """Process ``items`` together; exactly one result per item, in order."""
        ...


class StepEngine(Protocol[T_contra, R]):
    """An engine whose batch stays open: items join it between steps and leave when done.

    ``WhisperEngine`` provides this (its decode loop; ``continuous`` says whether every
    utterance runs in it). The batcher uses it only with ``join_running``; ``infer_batch`` is
    then never called.

    Contract (the driver's worker thread calls every method, one at a time):

    * ``add(items)`` starts the ``(key, item)`` pairs (keys are unique among open items); they
      join the next step. An item may finish without a step (refused at once): it comes out of
      the next ``step``.
    * ``step()`` advances every open item one step and returns ``(key, result)`` for each item
      that finished, exactly once per item, whatever rounds it took (fallback re-decodes are
      the engine's own). Raising fails every open item with that exception.
    * ``abort(keys)`` drops items (unknown keys ignored); no result comes for them. The
      driver ends every run with an ``abort`` of what is left of it (usually nothing), so an
      engine may close its batch state there.
    * ``has_unfinished()``: an item is open, or a finished one has not been returned yet.
    * ``open_count`` / ``capacity``: the driver adds at most ``capacity - open_count``.
    """

    @property
    def capacity(self) -> int:
        """The most items open at once."""
        ...

    @property
    def open_count(self) -> int:
        """Items added and not yet finished."""
        ...

    def has_unfinished(self) -> bool:
        """Whether an item is open or a finished one waits to be returned by :meth:`step`."""
        ...

    def add(self, items: Sequence[tuple[Hashable, T_contra]]) -> None:
        """Start ``items`` (key, item); they join the next step."""
        ...

    def step(self) -> list[tuple[Hashable, R]]:
        """Advance every open item one step; the (key, result) of each that finished."""
        ...

    def abort(self, keys: Iterable[Hashable]) -> None:
        """Drop the items of ``keys``; no result comes for them."""
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
