"""The batch policy: which queued recognition items run next, and which join a running batch.

:class:`BatchPolicy` is synchronous and pure (no clock, no loop, no threads): it decides from a
snapshot of the queue, the time and the number of idle workers, so tests drive it step by step
with a fake clock. The driver (:class:`voxgate.gateway.scheduling.batcher.Batcher`) asks it and
does what it says.
"""

from __future__ import annotations

import math
from collections.abc import Hashable, Sequence
from dataclasses import dataclass
from typing import Generic, Protocol, TypeVar

from voxgate.gateway.scheduling.base import WaitUntil
from voxgate.gateway.scheduling.errors import QueueFullError

__all__ = ["Batch", "BatchPolicy", "Schedulable"]

E = TypeVar("E", bound="Schedulable")


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
