"""The async Batcher driver over FakeBatchEngine: outcomes, failures, cancellation, shutdown.

No assertion depends on wall-clock timing: batches are held at a ``threading.Event`` gate that
the test releases, overlap is proven with a ``threading.Barrier``, and "has not happened yet"
is checked after yielding to the loop while the thing that would make it happen is gated.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator, Iterator, Sequence
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from voxgate.gateway.scheduling import (
    Batcher,
    BatcherClosedError,
    BatchObserver,
    BatchPolicy,
    BatchResultLengthError,
    BatchTimeoutError,
    QueueFullError,
)
from voxgate.gateway.testing.fake_engines import FakeBatchEngine, FakeEngineError

pytestmark = pytest.mark.unit

#: Only bounds how long a broken test hangs; never part of what is asserted.
HANG_S = 10.0


def times10(x: int) -> int:
    return x * 10


@pytest.fixture
async def loop_errors() -> AsyncIterator[list[dict[str, Any]]]:
    """Collect what the loop would log (InvalidStateError in a callback, lost exceptions)."""
    loop = asyncio.get_running_loop()
    errors: list[dict[str, Any]] = []
    loop.set_exception_handler(lambda _loop, ctx: errors.append(ctx))
    yield errors
    loop.set_exception_handler(None)
    assert errors == []


@pytest.fixture
def gate() -> Iterator[threading.Event]:
    """Holds fake batches until the test sets it; set at teardown so no worker thread is left
    blocked (a blocked thread would hang interpreter exit after a failing test)."""
    event = threading.Event()
    yield event
    event.set()


async def wait_calls(engine: FakeBatchEngine[Any, Any], n: int) -> None:
    assert await asyncio.to_thread(engine.wait_for_calls, n, HANG_S), f"no call #{n}"


async def settle(rounds: int = 20) -> None:
    """Let every ready callback and task run (no time passes on any clock)."""
    for _ in range(rounds):
        await asyncio.sleep(0)


class RecordingObserver(BatchObserver):
    def __init__(self) -> None:
        self.depths: list[int] = []
        self.started: list[tuple[int, int, list[float]]] = []
        self.finished: list[tuple[int, int, BaseException | None]] = []
        self.rejected_at: list[int] = []
        self.dropped_counts: list[int] = []

    def queue_depth(self, depth: int) -> None:
        self.depths.append(depth)

    def rejected(self, depth: int) -> None:
        self.rejected_at.append(depth)

    def dropped(self, count: int) -> None:
        self.dropped_counts.append(count)

    def batch_started(self, worker: int, size: int, waits_s: Sequence[float]) -> None:
        self.started.append((worker, size, list(waits_s)))

    def batch_finished(
        self, worker: int, size: int, duration_s: float, error: BaseException | None
    ) -> None:
        assert duration_s >= 0.0
        self.finished.append((worker, size, error))


# ------------------------------------------------------------------------------------------


async def test_a_lone_item_runs_at_once_and_gets_its_result(loop_errors: list[Any]) -> None:
    engine = FakeBatchEngine(times10)
    async with Batcher([engine], BatchPolicy(max_batch_size=8)) as batcher:
        assert await batcher.submit(7) == 70
    assert engine.batches == [(7,)]


async def test_items_queued_while_busy_run_as_one_batch(
    loop_errors: list[Any], gate: threading.Event
) -> None:
    engine = FakeBatchEngine(times10, gate=gate, gate_timeout_s=HANG_S)
    async with Batcher([engine], BatchPolicy(max_batch_size=8)) as batcher:
        first = batcher.submit(0)
        await wait_calls(engine, 1)
        rest = [batcher.submit(i) for i in (1, 2, 3)]
        assert batcher.queue_depth == 3
        gate.set()
        assert list(await asyncio.gather(first, *rest)) == [0, 10, 20, 30]
    assert engine.batches == [(0,), (1, 2, 3)]


async def test_engine_exception_fails_only_its_batch_and_the_next_succeeds(
    loop_errors: list[Any],
) -> None:
    boom = FakeEngineError("scripted failure")
    engine = FakeBatchEngine(times10, fail_calls={0: boom})
    async with Batcher([engine], BatchPolicy()) as batcher:
        with pytest.raises(FakeEngineError, match="scripted failure"):
            await batcher.submit(1)
        assert await batcher.submit(2) == 20
        assert batcher.stats.failed_batches == 1
        assert batcher.stats.batches == 2


async def test_failure_is_confined_to_the_failing_batch_under_load(
    loop_errors: list[Any],
    gate: threading.Event,
) -> None:
    engine = FakeBatchEngine(
        times10, gate=gate, gate_timeout_s=HANG_S, fail_calls={1: FakeEngineError("second")}
    )
    async with Batcher([engine], BatchPolicy(max_batch_size=2)) as batcher:
        a = batcher.submit(0)
        await wait_calls(engine, 1)
        b, c, d = batcher.submit(1), batcher.submit(2), batcher.submit(3)
        gate.set()
        outcomes = await asyncio.gather(a, b, c, d, return_exceptions=True)
    assert outcomes[0] == 0
    assert all(isinstance(o, FakeEngineError) for o in outcomes[1:3])
    assert outcomes[3] == 30
    assert engine.batches == [(0,), (1, 2), (3,)]


async def test_cancelled_queued_items_never_reach_the_engine(
    loop_errors: list[Any], gate: threading.Event
) -> None:
    engine = FakeBatchEngine(times10, gate=gate, gate_timeout_s=HANG_S)
    async with Batcher([engine], BatchPolicy(max_batch_size=8)) as batcher:
        first = batcher.submit(0)
        await wait_calls(engine, 1)
        keep1, gone, keep2 = batcher.submit(1), batcher.submit(2), batcher.submit(3)
        gone.cancel()
        gate.set()
        assert list(await asyncio.gather(first, keep1, keep2)) == [0, 10, 30]
        assert gone.cancelled()
        assert batcher.stats.dropped == 1
    assert 2 not in engine.items_seen
    assert engine.batches == [(0,), (1, 3)]


async def test_an_item_cancelled_before_the_driver_runs_is_dropped(
    loop_errors: list[Any],
) -> None:
    engine = FakeBatchEngine(times10)
    async with Batcher([engine], BatchPolicy()) as batcher:
        gone = batcher.submit(1)
        gone.cancel()  # before the loop gets a chance to dispatch it
        assert await batcher.submit(2) == 20
    assert engine.batches == [(2,)]


async def test_cancelling_the_awaiting_task_withdraws_the_item(
    loop_errors: list[Any], gate: threading.Event
) -> None:
    engine = FakeBatchEngine(times10, gate=gate, gate_timeout_s=HANG_S)
    async with Batcher([engine], BatchPolicy()) as batcher:
        first = batcher.submit(0)
        await wait_calls(engine, 1)
        waiter = asyncio.create_task(_await(batcher, 5))
        await settle()
        assert batcher.queue_depth == 1
        waiter.cancel()
        with pytest.raises(asyncio.CancelledError):
            await waiter
        await settle()
        assert batcher.queue_depth == 0
        gate.set()
        assert await first == 0
        assert await batcher.submit(6) == 60
    assert 5 not in engine.items_seen


async def _await(batcher: Batcher[int, int], item: int) -> int:
    return await batcher.submit(item)


async def test_a_result_for_a_caller_that_left_mid_batch_is_discarded_safely(
    loop_errors: list[Any],
    gate: threading.Event,
) -> None:
    engine = FakeBatchEngine(times10, gate=gate, gate_timeout_s=HANG_S)
    async with Batcher([engine], BatchPolicy(max_batch_size=4)) as batcher:
        left, stays = batcher.submit(1), batcher.submit(2)
        await wait_calls(engine, 1)  # the batch (1, 2) is running
        left.cancel()
        gate.set()
        assert await stays == 20
        assert left.cancelled()
    assert engine.batches == [(1, 2)]
    # No InvalidStateError reached the loop (checked by the loop_errors fixture).


async def test_wrong_result_count_fails_that_batch_with_a_clear_error(
    loop_errors: list[Any],
) -> None:
    engine = FakeBatchEngine(times10, short_calls={0}, outputs={1: [1, 2, 3]})
    async with Batcher([engine], BatchPolicy()) as batcher:
        with pytest.raises(BatchResultLengthError, match="returned 0 results for a batch of 1"):
            await batcher.submit(1)
        with pytest.raises(BatchResultLengthError, match="returned 3 results for a batch of 1"):
            await batcher.submit(2)
        assert await batcher.submit(3) == 30


async def test_two_workers_run_batches_concurrently(loop_errors: list[Any]) -> None:
    # Each call waits at the barrier for the other: it only passes if both run at once.
    barrier = threading.Barrier(2, timeout=HANG_S)
    engine = FakeBatchEngine(times10, barrier=barrier)
    async with Batcher([engine, engine], BatchPolicy(max_batch_size=2)) as batcher:
        assert list(await asyncio.gather(batcher.submit(1), batcher.submit(2))) == [10, 20]
    assert engine.max_concurrent == 2
    assert len(set(engine.thread_ids)) == 2
    # The burst was spread: two single calls, not one batch of two on one worker.
    assert sorted(engine.batches) == [(1,), (2,)]


async def test_distinct_engine_replicas_each_get_work(loop_errors: list[Any]) -> None:
    barrier = threading.Barrier(2, timeout=HANG_S)
    engines = [FakeBatchEngine(times10, barrier=barrier) for _ in range(2)]
    async with Batcher(engines, BatchPolicy(max_batch_size=1)) as batcher:
        assert list(await asyncio.gather(batcher.submit(1), batcher.submit(2))) == [10, 20]
    assert [e.calls for e in engines] == [1, 1]


async def test_finals_run_before_interim_and_keys_stay_apart(
    loop_errors: list[Any], gate: threading.Event
) -> None:
    engine = FakeBatchEngine(times10, gate=gate, gate_timeout_s=HANG_S)
    async with Batcher([engine], BatchPolicy(max_batch_size=8)) as batcher:
        first = batcher.submit(0)
        await wait_calls(engine, 1)
        futs = [
            batcher.submit(1, key="greedy", is_final=False),
            batcher.submit(2, key="beam5", is_final=True),
            batcher.submit(3, key="greedy", is_final=True),
            batcher.submit(4, key="beam5", is_final=False),
        ]
        gate.set()
        assert list(await asyncio.gather(first, *futs)) == [0, 10, 20, 30, 40]
    assert engine.batches == [(0,), (2, 4), (3, 1)]


async def test_earlier_deadline_runs_first(loop_errors: list[Any], gate: threading.Event) -> None:
    engine = FakeBatchEngine(times10, gate=gate, gate_timeout_s=HANG_S)
    async with Batcher([engine], BatchPolicy(max_batch_size=1)) as batcher:
        loop = asyncio.get_running_loop()
        first = batcher.submit(0)
        await wait_calls(engine, 1)
        late = batcher.submit(1, deadline=loop.time() + 60)
        soon = batcher.submit(2, deadline=loop.time() + 1)
        gate.set()
        await asyncio.gather(first, late, soon)
    assert engine.batches == [(0,), (2,), (1,)]


async def test_max_wait_holds_a_partial_batch_until_it_fills(loop_errors: list[Any]) -> None:
    engine = FakeBatchEngine(times10)
    # A window far longer than the test: if the hold were ignored, x0 would run alone.
    policy = BatchPolicy(max_batch_size=2, max_wait_ms=600_000)
    async with Batcher([engine], policy) as batcher:
        x0 = batcher.submit(0)
        await settle()
        assert engine.calls == 0
        x1 = batcher.submit(1)
        assert list(await asyncio.gather(x0, x1)) == [0, 10]
    assert engine.batches == [(0, 1)]


async def test_queue_full_is_refused_with_a_typed_error(
    loop_errors: list[Any], gate: threading.Event
) -> None:
    engine = FakeBatchEngine(times10, gate=gate, gate_timeout_s=HANG_S)
    observer = RecordingObserver()
    policy = BatchPolicy(max_batch_size=8, max_queue_size=2)
    async with Batcher([engine], policy, observer=observer) as batcher:
        running = batcher.submit(0)
        await wait_calls(engine, 1)
        a, b = batcher.submit(1), batcher.submit(2)
        with pytest.raises(QueueFullError, match="max_queue_size=2"):
            batcher.submit(3)
        assert batcher.stats.rejected == 1
        assert observer.rejected_at == [2]
        # A caller leaving frees its slot.
        a.cancel()
        await settle()
        c = batcher.submit(4)
        gate.set()
        assert list(await asyncio.gather(running, b, c)) == [0, 20, 40]


async def test_observer_sees_sizes_waits_and_depths(
    loop_errors: list[Any], gate: threading.Event
) -> None:
    engine = FakeBatchEngine(
        times10, gate=gate, gate_timeout_s=HANG_S, fail_calls={1: FakeEngineError("x")}
    )
    observer = RecordingObserver()
    async with Batcher([engine], BatchPolicy(), observer=observer) as batcher:
        first = batcher.submit(0)
        await wait_calls(engine, 1)
        more = [batcher.submit(1), batcher.submit(2)]
        gate.set()
        await first
        await asyncio.gather(*more, return_exceptions=True)
    assert [(w, n) for w, n, _ in observer.started] == [(0, 1), (0, 2)]
    assert all(wait >= 0.0 for _, _, waits in observer.started for wait in waits)
    assert observer.finished[0] == (0, 1, None)
    assert observer.finished[1][:2] == (0, 2)
    assert isinstance(observer.finished[1][2], FakeEngineError)
    assert max(observer.depths) == 2
    assert observer.depths[-1] == 0
    assert batcher.stats.max_batch_seen == 2


async def test_aclose_awaits_running_batches_and_fails_queued_ones(
    loop_errors: list[Any],
    gate: threading.Event,
) -> None:
    engine = FakeBatchEngine(times10, gate=gate, gate_timeout_s=HANG_S)
    batcher: Batcher[int, int] = Batcher([engine], BatchPolicy())
    await batcher.start()
    running = batcher.submit(0)
    await wait_calls(engine, 1)
    queued = batcher.submit(1)
    closing = asyncio.create_task(batcher.aclose())
    await settle()
    assert not closing.done()  # still waiting for the gated batch
    with pytest.raises(BatcherClosedError, match="closed before this item was dispatched"):
        async with asyncio.timeout(HANG_S):  # a hang guard only
            await queued
    with pytest.raises(BatcherClosedError):
        batcher.submit(2)
    gate.set()
    await closing
    assert await running == 0  # the in-flight batch delivered its result
    assert engine.items_seen == [0]
    assert not batcher.running
    await batcher.aclose()  # idempotent


async def test_lifecycle_misuse_is_reported(loop_errors: list[Any]) -> None:
    with pytest.raises(ValueError, match="at least one worker"):
        Batcher([], BatchPolicy())
    batcher: Batcher[int, int] = Batcher([FakeBatchEngine(times10)], BatchPolicy())
    with pytest.raises(RuntimeError, match="start"):
        batcher.submit(1)
    await batcher.start()
    with pytest.raises(RuntimeError, match="twice"):
        await batcher.start()
    await batcher.aclose()
    with pytest.raises(BatcherClosedError):
        await batcher.start()


# ------------------------------------------------------------------------------------------
# Property: exactly one outcome per item under random submissions, cancels and failures
# ------------------------------------------------------------------------------------------

ops_strategy = st.lists(
    st.one_of(
        st.tuples(st.just("submit"), st.sampled_from(["a", "b"]), st.booleans()),
        st.tuples(st.just("cancel"), st.integers(0, 30), st.just(False)),
        st.tuples(st.just("yield"), st.just(""), st.just(False)),
    ),
    max_size=30,
)


@settings(max_examples=60, deadline=None)
@given(
    ops=ops_strategy,
    workers=st.integers(1, 3),
    max_batch_size=st.integers(1, 4),
    fail_calls=st.sets(st.integers(0, 10), max_size=3),
    short_calls=st.sets(st.integers(0, 10), max_size=2),
)
def test_every_item_gets_exactly_one_outcome(
    ops: list[tuple[str, Any, bool]],
    workers: int,
    max_batch_size: int,
    fail_calls: set[int],
    short_calls: set[int],
) -> None:
    asyncio.run(_scenario(ops, workers, max_batch_size, fail_calls, short_calls))


async def _scenario(
    ops: list[tuple[str, Any, bool]],
    workers: int,
    max_batch_size: int,
    fail_calls: set[int],
    short_calls: set[int],
) -> None:
    loop = asyncio.get_running_loop()
    errors: list[dict[str, Any]] = []
    loop.set_exception_handler(lambda _loop, ctx: errors.append(ctx))
    engine = FakeBatchEngine(
        times10,
        fail_calls={i: FakeEngineError(f"call {i}") for i in fail_calls},
        short_calls=short_calls,
    )
    batcher: Batcher[int, int] = Batcher(
        [engine] * workers, BatchPolicy(max_batch_size=max_batch_size)
    )
    await batcher.start()
    futures: list[asyncio.Future[int]] = []
    keys: dict[int, str] = {}
    cancelled_while_queued: set[int] = set()
    for op, arg, final in ops:
        if op == "submit":
            item = len(futures)
            keys[item] = arg
            futures.append(batcher.submit(item, key=arg, is_final=final))
        elif op == "cancel" and arg < len(futures):
            queued = {e.item for e in batcher._queue.values()}  # white-box: still waiting?
            if futures[arg].cancel() and arg in queued:
                cancelled_while_queued.add(arg)
        else:
            await asyncio.sleep(0)
    outcomes = await asyncio.gather(*futures, return_exceptions=True)
    await batcher.aclose()

    seen = engine.items_seen
    assert len(seen) == len(set(seen)), "an item reached the engine twice"
    assert not cancelled_while_queued & set(seen), "a cancelled item reached the engine"
    for batch in engine.batches:
        assert 1 <= len(batch) <= max_batch_size
        assert len({keys[i] for i in batch}) == 1, f"keys mixed in {batch}"
    for item, (fut, outcome) in enumerate(zip(futures, outcomes, strict=True)):
        assert fut.done()
        if fut.cancelled():
            assert isinstance(outcome, asyncio.CancelledError)
        elif isinstance(outcome, BaseException):
            assert isinstance(outcome, FakeEngineError | BatchResultLengthError), outcome
            assert item in seen
        else:
            assert outcome == item * 10
            assert item in seen
    assert errors == []


async def test_a_hung_batch_fails_its_items_and_the_worker_runs_on_a_fresh_thread() -> None:
    engine: FakeBatchEngine[int, int] = FakeBatchEngine(times10, hang_calls={0})
    replaced: list[int] = []

    class Observer(BatchObserver):
        def worker_replaced(self, worker: int, timeout_s: float) -> None:
            replaced.append(worker)

    def fresh(worker: int) -> FakeBatchEngine[int, int]:
        return engine

    batcher: Batcher[int, int] = Batcher(
        [engine],
        BatchPolicy(max_batch_size=1),
        observer=Observer(),
        batch_timeout_s=0.2,
        replace=fresh,
    )
    try:
        async with batcher:
            hung = batcher.submit(1)
            with pytest.raises(BatchTimeoutError, match="batch_timeout_s=0.2"):
                await asyncio.wait_for(hung, HANG_S)
            # One worker only, still stuck in call 0: the next item runs on the fresh thread.
            assert await asyncio.wait_for(batcher.submit(2), HANG_S) == 20
            assert engine.thread_ids[0] != engine.thread_ids[1]
            assert batcher.stats.timed_out_batches == 1 and batcher.stats.abandoned_threads == 1
            assert batcher.stats.failed_batches == 1 and replaced == [0]
    finally:
        engine.release()


def test_batch_timeout_must_be_positive() -> None:
    with pytest.raises(ValueError, match="batch_timeout_s"):
        Batcher([FakeBatchEngine(times10)], BatchPolicy(), batch_timeout_s=0.0)
