"""A virtual clock for asyncio: timers fire at once, in order, and ``loop.time()`` jumps to them.

For component tests of code that paces itself with ``loop.time()`` and ``asyncio.sleep``
(playout, interims, speculation): ten seconds of a call run in milliseconds, and every
timestamp is exact, so a test can assert "frame 50 left at 1.000 s" on a shared machine without
being flaky. Only for code whose waiting is all timers, in-memory queues and short jobs on
worker threads: real I/O still takes real time, while the clock only moves when the loop has
nothing ready to run.

A job handed to an executor (``run_in_executor``, ``asyncio.to_thread``) takes no virtual time:
the clock holds until it is done. Without the hold the loop, which owns the GIL while it runs,
can play seconds of a call's timers before a worker thread returns a result that would have
come back within a millisecond, and a test of what that result decides (an end-of-turn model's
answer) depends on the scheduler: it failed that way once on a loaded CI runner. A job that
waits for the loop's timers itself (a thread waiting for an engine call the loop makes later)
would hold the clock for ever, so a job holds it for at most :data:`HOLD_S` real seconds; after
that the clock runs past it.
"""

from __future__ import annotations

import asyncio
import selectors
import time
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

__all__ = ["HOLD_S", "LeftRunningError", "VirtualClockLoop", "run_virtual"]

T = TypeVar("T")

#: Real seconds an executor job holds the virtual clock at most (see the module's docstring).
HOLD_S = 2.0


class _VirtualSelector(selectors.DefaultSelector):
    """A selector whose waits advance the loop's virtual clock instead of sleeping."""

    loop: VirtualClockLoop

    def select(self, timeout: float | None = None) -> list[tuple[selectors.SelectorKey, int]]:
        ready = super().select(0)
        if ready or timeout == 0:
            return ready
        if timeout is None:  # nothing scheduled: only I/O or a thread can wake the loop
            return super().select(None)
        hold = self.loop.hold_s()
        if hold > 0:  # a worker thread's job is running: it takes no virtual time
            ready = super().select(hold)
            if ready:
                return ready
            if self.loop.hold_s() > 0:  # woken by nothing yet: try again, clock still
                return []
        self.loop.advance(timeout)
        return []


class VirtualClockLoop(asyncio.SelectorEventLoop):
    """An event loop on virtual time, starting at 0.0 s."""

    def __init__(self) -> None:
        selector = _VirtualSelector()
        selector.loop = self
        self._now = 0.0
        self._jobs: dict[asyncio.Future[Any], float] = {}
        super().__init__(selector)

    def time(self) -> float:
        """The virtual time, s."""
        return self._now

    def run_in_executor(
        self, executor: Any, func: Callable[..., T], *args: Any
    ) -> asyncio.Future[T]:
        """Run ``func`` on a worker thread, holding the virtual clock until it returns."""
        future = super().run_in_executor(executor, func, *args)
        self._jobs[future] = time.monotonic() + HOLD_S
        future.add_done_callback(self._jobs.pop)
        return future

    def hold_s(self) -> float:
        """Real seconds the clock may still hold for running executor jobs (0: it may move)."""
        now = time.monotonic()
        return max((until - now for until in self._jobs.values()), default=0.0)

    def advance(self, seconds: float) -> None:
        """Move the clock forward (the loop does this itself whenever it would wait)."""
        self._now += max(0.0, seconds)


class LeftRunningError(AssertionError):
    """Tasks were still running when the coroutine given to :func:`run_virtual` returned."""


def run_virtual(coro: Coroutine[Any, Any, T]) -> T:
    """Run ``coro`` to completion on a fresh :class:`VirtualClockLoop`.

    Tasks it leaves running are cancelled and awaited, as ``asyncio.run`` does, and then
    reported as :class:`LeftRunningError` (unless ``coro`` failed, whose error stands): a task
    outliving the code under test is a leak (a call's interim loop once outlived its call).
    Closed unfinished, such a task was destroyed pending and its ``finally`` ran, on a closed
    loop, whenever the garbage collector came by: the failure surfaced in a later, unrelated
    test.
    """
    loop = VirtualClockLoop()
    left: list[str] = []
    try:
        result = loop.run_until_complete(coro)
        left = sorted(t.get_name() for t in asyncio.all_tasks(loop))
        return result
    finally:
        pending = asyncio.all_tasks(loop)
        for task in pending:
            task.cancel()
        if pending:
            loop.run_until_complete(asyncio.wait(pending))
        loop.run_until_complete(loop.shutdown_asyncgens())
        loop.close()
        if left:
            raise LeftRunningError(f"tasks left running: {', '.join(left)}")
