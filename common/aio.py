"""Cancellation helpers shared by the server, the bridges and the client library.

They live in the neutral package because every layer that owns asyncio tasks has to end them
without losing its *own* cancellation: the gateway's calls, the SIP bridge's call legs and the
media-stream links. v0.1's zombie calls came from exactly that mistake.
"""

from __future__ import annotations

import asyncio
from typing import Any

__all__ = ["being_cancelled", "cancel_and_wait"]


async def cancel_and_wait(*tasks: asyncio.Future[Any]) -> None:
    """Cancel ``tasks`` and wait until all have finished, never swallowing our own cancellation.

    ``with suppress(CancelledError): await task`` is the classic way to lose a cancellation:
    when the *awaiting* task is cancelled during that await, the suppress eats its
    CancelledError and it runs on (v0.1's zombie calls). ``asyncio.wait`` raises only for the
    caller's own cancellation and never for the awaited tasks' outcomes. Every task is
    cancelled before any is awaited, so several end concurrently (LiveKit's
    ``utils.aio.cancel_and_wait(*futures)`` has the same shape); a task already done is only
    looked at.
    """
    if not tasks:
        return
    for task in tasks:
        task.cancel()
    await asyncio.wait(set(tasks))
    for task in tasks:
        if not task.cancelled():
            task.exception()  # retrieved here; whoever owns the task reports it


def being_cancelled() -> bool:
    """Whether the running task itself has a pending cancellation request."""
    current = asyncio.current_task()
    return current is not None and current.cancelling() > 0
