"""The batcher's errors: each names the limit or the event, so the servicer maps it in one table.

:class:`QueueFullError` becomes ``RESOURCE_EXHAUSTED`` with a ``QuotaFailure`` detail,
:class:`BatchTimeoutError` ``DEADLINE_EXCEEDED``; the others fail one item's future.
"""

from __future__ import annotations

__all__ = [
    "BatchResultLengthError",
    "BatchTimeoutError",
    "BatcherClosedError",
    "QueueFullError",
    "WithdrawnError",
]


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
