"""voxgate.common.aio.cancel_and_wait: several tasks at once, and the caller's own cancellation."""

from __future__ import annotations

import asyncio

import pytest

from voxgate.common.aio import cancel_and_wait

pytestmark = pytest.mark.unit


async def test_cancels_every_task_before_waiting_for_any() -> None:
    ended: list[str] = []
    gate = asyncio.Event()

    async def slow_to_end(name: str) -> None:
        try:
            await asyncio.sleep(3600)
        finally:
            ended.append(name)
            if name == "a":
                await gate.wait()  # "a" ends only once "b" has been cancelled too
            else:
                gate.set()

    a = asyncio.create_task(slow_to_end("a"))
    b = asyncio.create_task(slow_to_end("b"))
    await asyncio.sleep(0)
    await asyncio.wait_for(cancel_and_wait(a, b), timeout=5)
    assert a.cancelled() and b.cancelled()
    assert sorted(ended) == ["a", "b"]


async def test_failed_and_finished_tasks_are_looked_at_not_raised() -> None:
    async def fails() -> None:
        raise RuntimeError("boom")

    failed = asyncio.create_task(fails())
    finished = asyncio.create_task(asyncio.sleep(0))
    await asyncio.wait({failed, finished})
    await cancel_and_wait(failed, finished)  # neither raises; the failure is retrieved
    assert isinstance(failed.exception(), RuntimeError)
    assert not finished.cancelled()
    await cancel_and_wait()  # nothing to do


async def test_the_callers_own_cancellation_is_not_swallowed() -> None:
    stubborn_started = asyncio.Event()

    async def stubborn() -> None:
        try:
            await asyncio.sleep(3600)
        except asyncio.CancelledError:
            stubborn_started.set()
            await asyncio.sleep(3600)  # takes its time to end

    inner = asyncio.create_task(stubborn())
    await asyncio.sleep(0)

    async def closer() -> str:
        await cancel_and_wait(inner)
        return "ran on"  # a swallowed cancellation would get here

    outer = asyncio.create_task(closer())
    await stubborn_started.wait()
    outer.cancel()
    with pytest.raises(asyncio.CancelledError):
        await outer
    inner.cancel()
    with pytest.raises(asyncio.CancelledError):
        await inner
