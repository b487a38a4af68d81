"""The virtual clock the component tests run on (voxgate.gateway.testing.virtual_time).

Its promise is that a test's timestamps do not depend on the machine: timers fire in order at
their virtual times, and a short job on a worker thread takes no virtual time however slow the
thread is to run (a loaded CI runner once let a call's timers race past an end-of-turn model's
answer).
"""

from __future__ import annotations

import asyncio
import threading
import time

import pytest

from voxgate.gateway.testing import virtual_time
from voxgate.gateway.testing.virtual_time import run_virtual

pytestmark = pytest.mark.unit


def test_timers_fire_in_order_at_their_virtual_times_without_real_waiting() -> None:
    async def main() -> list[float]:
        loop = asyncio.get_running_loop()
        seen: list[float] = []
        for _ in range(3):
            await asyncio.sleep(10.0)
            seen.append(loop.time())
        return seen

    # Exact timestamps: a real loop would read its own clock, never 10.0 on the dot.
    assert run_virtual(main()) == [10.0, 20.0, 30.0]


def test_a_slow_worker_thread_takes_no_virtual_time() -> None:
    async def main() -> tuple[float, float]:
        loop = asyncio.get_running_loop()
        ticks: list[float] = []

        async def ticker() -> None:  # a call's timers, running beside the job
            while True:
                await asyncio.sleep(0.02)
                ticks.append(loop.time())

        task = asyncio.create_task(ticker())
        await asyncio.to_thread(time.sleep, 0.3)  # 300 real ms, a slow thread on a busy host
        done_at = loop.time()
        task.cancel()
        return done_at, len(ticks)

    done_at, ticks = run_virtual(main())
    assert done_at == 0.0 and ticks == 0


def test_a_thread_waiting_for_the_loop_holds_the_clock_only_so_long(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(virtual_time, "HOLD_S", 0.2)

    async def main() -> float:
        loop = asyncio.get_running_loop()
        flag = threading.Event()

        async def later() -> None:  # the loop's work the thread waits for, 5 virtual s away
            await asyncio.sleep(5.0)
            flag.set()

        task = asyncio.create_task(later())
        assert await asyncio.to_thread(flag.wait, 30.0)
        await task
        return loop.time()

    # Without the bound the clock would hold for the thread's 30 s wait, which then fails.
    assert run_virtual(main()) == 5.0


def test_a_task_left_running_is_cancelled_on_an_open_loop_and_reported() -> None:
    """A leak fails the test that made it, and the leaked task's cleanup runs while it can."""
    cleaned_up: list[bool] = []

    async def forever() -> None:
        try:
            await asyncio.sleep(3600)
        finally:
            cleaned_up.append(not asyncio.get_running_loop().is_closed())

    tasks: list[asyncio.Task[None]] = []

    async def main() -> int:
        tasks.append(asyncio.create_task(forever(), name="leaked"))
        await asyncio.sleep(1.0)
        return 1

    with pytest.raises(virtual_time.LeftRunningError, match="leaked"):
        run_virtual(main())
    assert cleaned_up == [True] and tasks[0].cancelled()


def test_the_coroutines_own_error_stands_over_a_leak() -> None:
    tasks: list[asyncio.Task[None]] = []

    async def main() -> None:
        tasks.append(asyncio.create_task(asyncio.sleep(3600), name="leaked"))
        raise ValueError("the test's own failure")

    with pytest.raises(ValueError, match="own failure"):
        run_virtual(main())
    assert tasks[0].cancelled()
