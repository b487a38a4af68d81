"""A virtual clock for asyncio: timers fire at once, in order, and ``loop.time()`` jumps to them.

For component tests of code that paces itself with ``loop.time()`` and ``asyncio.sleep``
(playout, interims, speculation): ten seconds of a call run in milliseconds, and every
timestamp is exact, so a test can assert "frame 50 left at 1.000 s" on a shared machine without
being flaky. Only for code whose waiting is all timers and in-memory queues: real I/O and
worker threads still take real time, while the clock only moves when the loop has nothing
ready to run.
"""

from __future__ import annotations

import asyncio
import selectors
from collections.abc import Coroutine
from typing import Any, TypeVar

__all__ = ["VirtualClockLoop", "run_virtual"]

T = TypeVar("T")


class _VirtualSelector(selectors.DefaultSelector):
    """A selector whose waits advance the loop's virtual clock instead of sleeping."""

    loop: VirtualClockLoop

    def select(self, timeout: float | None = None) -> list[tuple[selectors.SelectorKey, int]]:
        ready = super().select(0)
        if ready or timeout == 0:
            return ready
        if timeout is None:  # nothing scheduled: only I/O or a thread can wake the loop
            return super().select(None)
        self.loop.advance(timeout)
        return []


class VirtualClockLoop(asyncio.SelectorEventLoop):
    """An event loop on virtual time, starting at 0.0 s."""

    def __init__(self) -> None:
        selector = _VirtualSelector()
        selector.loop = self
        self._now = 0.0
        super().__init__(selector)

    def time(self) -> float:
        """The virtual time, s."""
        return self._now

    def advance(self, seconds: float) -> None:
        """Move the clock forward (the loop does this itself whenever it would wait)."""
        self._now += max(0.0, seconds)


def run_virtual(coro: Coroutine[Any, Any, T]) -> T:
    """Run ``coro`` to completion on a fresh :class:`VirtualClockLoop`."""
    loop = VirtualClockLoop()
    try:
        return loop.run_until_complete(coro)
    finally:
        loop.run_until_complete(loop.shutdown_asyncgens())
        loop.close()
