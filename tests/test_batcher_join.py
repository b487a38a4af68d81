"""Iteration-level batching (``join_running``): the Batcher driver over a FAKE step engine.

The fake is not a recogniser: an item is an int saying how many decode steps it takes, and its
result is ``item * 10``. What is real is the batcher: its hand-over of queued items to a running
batch, cancellation before the engine pulls, one outcome per item, finals first and the hung-run
timeout. Steps are gated by a semaphore the test releases one at a time, so "B joined at the
next step" is checked exactly, never by timing. The real engine joining a running batch is
tests/test_decode_loop_join.py.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Hashable
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
)
from voxgate.gateway.testing.fake_engines import FakeBatchEngine
from voxgate.gateway.testing.fake_engines import FakeEngineError as FakeError
from voxgate.gateway.testing.fake_engines import FakeStepEngine as FakeContinuousEngine

pytestmark = pytest.mark.unit

#: Only bounds how long a broken test hangs; never part of what is asserted.
HANG_S = 10.0


async def settle(rounds: int = 20) -> None:
    """Let every ready callback and task run."""
    for _ in range(rounds):
        await asyncio.sleep(0)


async def waiting(engine: FakeContinuousEngine, n: int) -> None:
    assert await asyncio.to_thread(engine.wait_for_waiting, n), f"no wait #{n}"


@pytest.fixture
async def loop_errors() -> AsyncIterator[list[dict[str, Any]]]:
    """Collect what the loop would log (InvalidStateError in a callback, lost exceptions)."""
    loop = asyncio.get_running_loop()
    errors: list[dict[str, Any]] = []
    loop.set_exception_handler(lambda _loop, ctx: errors.append(ctx))
    yield errors
    loop.set_exception_handler(None)
    assert errors == []


def joined(engine: FakeContinuousEngine, **kw: Any) -> Batcher[int, int]:
    return Batcher(
        [engine], BatchPolicy(max_batch_size=kw.pop("max_batch_size", 4)), **kw, join_running=True
    )


# ------------------------------------------------------------------------------------------


async def test_an_item_submitted_mid_run_joins_at_the_next_step_and_leaves_when_done(
    loop_errors: list[Any],
) -> None:
    engine = FakeContinuousEngine(gated=True)
    async with joined(engine) as batcher:
        a = batcher.submit(3)
        await waiting(engine, 1)  # A pulled nothing and waits for step 1
        b = batcher.submit(1)
        await settle()
        assert batcher.queue_depth == 0  # handed to the running batch
        engine.allow(1)  # step 1: A alone (B was handed over after A's pull)
        await waiting(engine, 2)
        engine.allow(1)  # step 2: A and B; B is done
        assert await asyncio.wait_for(b, HANG_S) == 10
        assert not a.done()  # B did not wait for the slowest item of its batch
        engine.allow(1)
        assert await asyncio.wait_for(a, HANG_S) == 30
    assert engine.steps == [(3,), (3, 1), (3,)]
    assert engine.runs == 1
    assert batcher.stats.joined == 1 and batcher.stats.batches == 1
    assert batcher.stats.items_run == 2 and batcher.stats.max_batch_seen == 2


async def test_an_item_cancelled_after_hand_over_never_reaches_the_engine(
    loop_errors: list[Any],
) -> None:
    engine = FakeContinuousEngine(gated=True)
    async with joined(engine) as batcher:
        a = batcher.submit(2)
        await waiting(engine, 1)
        gone, kept = batcher.submit(5), batcher.submit(1)
        await settle()
        assert batcher.queue_depth == 0  # both handed over, neither pulled yet
        gone.cancel()
        engine.allow(3)
        assert await asyncio.wait_for(kept, HANG_S) == 10
        assert await asyncio.wait_for(a, HANG_S) == 20
        assert gone.cancelled()
        assert batcher.stats.dropped == 1
    assert 5 not in engine.seen
    assert engine.steps == [(2,), (2, 1)]


async def test_an_item_cancelled_after_the_engine_pulled_it_is_discarded_safely(
    loop_errors: list[Any],
) -> None:
    engine = FakeContinuousEngine(gated=True)
    async with joined(engine) as batcher:
        a = batcher.submit(3)
        await waiting(engine, 1)
        left = batcher.submit(2)
        await settle()
        engine.allow(1)
        await waiting(engine, 2)  # pulled after step 1
        left.cancel()
        engine.allow(5)
        assert await asyncio.wait_for(a, HANG_S) == 30
        assert left.cancelled()
    assert engine.seen == [3, 2]


async def test_fallback_rounds_still_end_in_one_result(loop_errors: list[Any]) -> None:
    engine = FakeContinuousEngine(rounds={2: 2})
    async with joined(engine) as batcher:
        assert await asyncio.wait_for(batcher.submit(2), HANG_S) == 20
    assert engine.steps == [(2,)] * 6


async def test_finals_go_first_an_interim_does_not_join_while_a_final_waits(
    loop_errors: list[Any],
) -> None:
    engine = FakeContinuousEngine(gated=True)
    async with joined(engine) as batcher:
        a = batcher.submit(2, key="k")
        await waiting(engine, 1)
        interim = batcher.submit(1, key="k", is_final=False)
        other_final = batcher.submit(3, key="j")
        await settle()
        # The interim may not make the running batch (and so the final's wait) longer.
        assert batcher.queue_depth == 2
        engine.allow(100)
        assert await asyncio.wait_for(a, HANG_S) == 20
        assert await asyncio.wait_for(other_final, HANG_S) == 30
        assert await asyncio.wait_for(interim, HANG_S) == 10
    assert engine.steps[:2] == [(2,), (2,)]
    assert engine.steps[2] == (3,)  # the other key's final ran next, in a run of its own
    assert batcher.stats.joined == 0


async def test_only_same_key_items_join_and_the_batch_stays_within_max_batch_size(
    loop_errors: list[Any],
) -> None:
    engine = FakeContinuousEngine(gated=True)
    async with joined(engine, max_batch_size=2) as batcher:
        a = batcher.submit(2, key="k")
        await waiting(engine, 1)
        b, c = batcher.submit(1, key="k"), batcher.submit(1, key="k")
        d = batcher.submit(1, key="j")
        await settle()
        assert batcher.queue_depth == 3 - 1  # one slot free: b joins; c and d wait
        engine.allow(100)
        assert list(await asyncio.wait_for(asyncio.gather(a, b, c, d), HANG_S)) == [
            20,
            10,
            10,
            10,
        ]
    for step in engine.steps:
        assert len(step) <= 2
    assert batcher.stats.max_batch_seen == 2


async def test_an_idle_worker_takes_back_what_a_running_batch_has_not_pulled(
    loop_errors: list[Any],
) -> None:
    e0, e1 = FakeContinuousEngine(gated=True), FakeContinuousEngine(gated=True)
    async with Batcher([e0, e1], BatchPolicy(max_batch_size=4), join_running=True) as batcher:
        a = batcher.submit(5)
        await waiting(e0, 1)
        c = batcher.submit(1)
        await waiting(e1, 1)
        b = batcher.submit(1)  # both busy: handed to worker 0's run, which is gated
        await settle()
        assert batcher.queue_depth == 0
        e1.allow(1)  # C ends; worker 1 goes idle and should take B rather than leave it
        assert await asyncio.wait_for(c, HANG_S) == 10
        await waiting(e1, 2)
        e1.allow(1)
        assert await asyncio.wait_for(b, HANG_S) == 10
        assert batcher.stats.returned == 1
        e0.allow(5)
        assert await asyncio.wait_for(a, HANG_S) == 50
    assert e0.seen == [5] and e1.seen == [1, 1]


async def test_an_engine_error_fails_only_the_items_not_yet_done(loop_errors: list[Any]) -> None:
    engine = FakeContinuousEngine(fail_at_step=2)
    async with joined(engine) as batcher:
        done_early = batcher.submit(1)
        failing = batcher.submit(4)
        assert await asyncio.wait_for(done_early, HANG_S) == 10
        with pytest.raises(FakeError, match="scripted failure"):
            await asyncio.wait_for(failing, HANG_S)
        assert await asyncio.wait_for(batcher.submit(1), HANG_S) == 10
        assert batcher.stats.failed_batches == 1


async def test_an_item_the_engine_never_emits_fails_with_a_clear_error(
    loop_errors: list[Any],
) -> None:
    engine = FakeContinuousEngine(forget={2})
    async with joined(engine) as batcher:
        ok, lost = batcher.submit(1), batcher.submit(2)
        assert await asyncio.wait_for(ok, HANG_S) == 10
        with pytest.raises(BatchResultLengthError, match="without a result for 1 of its 2"):
            await asyncio.wait_for(lost, HANG_S)


async def test_a_hung_run_fails_its_items_and_the_worker_gets_a_fresh_thread() -> None:
    engine = FakeContinuousEngine(hang_at_step=2)
    replaced: list[int] = []

    class Observer(BatchObserver):
        def worker_replaced(self, worker: int, timeout_s: float) -> None:
            replaced.append(worker)

    batcher = joined(engine, observer=Observer(), batch_timeout_s=0.3, replace=lambda w: engine)
    try:
        async with batcher:
            done_first = batcher.submit(1)
            hung = batcher.submit(3)
            assert await asyncio.wait_for(done_first, HANG_S) == 10
            with pytest.raises(BatchTimeoutError, match="batch_timeout_s=0.3"):
                await asyncio.wait_for(hung, HANG_S)
            assert await asyncio.wait_for(batcher.submit(1), HANG_S) == 10
            assert engine.thread_ids[0] != engine.thread_ids[1]
            assert batcher.stats.timed_out_batches == 1 and replaced == [0]
    finally:
        engine.release()


async def test_a_long_run_that_keeps_stepping_is_not_taken_for_a_hung_one() -> None:
    # 60 steps of 20 ms: the run lasts well past batch_timeout_s, each step well within it.
    engine = FakeContinuousEngine(delay_s=0.02)
    async with joined(engine, batch_timeout_s=0.8) as batcher:
        assert await asyncio.wait_for(batcher.submit(60), 60.0) == 600
        assert batcher.stats.timed_out_batches == 0


async def test_closing_gives_every_handed_over_item_an_outcome(loop_errors: list[Any]) -> None:
    engine = FakeContinuousEngine(gated=True)
    batcher = joined(engine)
    await batcher.start()
    a = batcher.submit(2)
    await waiting(engine, 1)
    b = batcher.submit(1)
    await settle()
    closing = asyncio.ensure_future(batcher.aclose())
    await settle()
    engine.allow(100)
    await asyncio.wait_for(closing, HANG_S)
    assert a.result() == 20
    assert b.done() and (b.exception() is None or isinstance(b.exception(), BatcherClosedError))


def test_join_running_needs_continuous_engines() -> None:
    with pytest.raises(ValueError, match="StepEngine"):
        Batcher([FakeBatchEngine(lambda x: x)], BatchPolicy(), join_running=True)


# ------------------------------------------------------------------------------------------
# Property: whatever is submitted and cancelled when, every item gets exactly one outcome.

ops_strategy = st.lists(
    st.one_of(
        st.tuples(st.just("submit"), st.integers(1, 4), st.sampled_from(["a", "b"]), st.booleans()),
        st.tuples(st.just("cancel"), st.integers(0, 20), st.just(""), st.just(True)),
        st.tuples(st.just("yield"), st.just(0), st.just(""), st.just(True)),
    ),
    max_size=25,
)


@settings(max_examples=40, deadline=None)
@given(ops=ops_strategy, workers=st.integers(1, 2), max_batch=st.integers(1, 3))
def test_every_item_gets_exactly_one_outcome(
    ops: list[tuple[str, int, Hashable, bool]], workers: int, max_batch: int
) -> None:
    asyncio.run(_scenario(ops, workers, max_batch))


async def _scenario(
    ops: list[tuple[str, int, Hashable, bool]], workers: int, max_batch: int
) -> None:
    loop = asyncio.get_running_loop()
    errors: list[dict[str, Any]] = []
    loop.set_exception_handler(lambda _loop, ctx: errors.append(ctx))
    engines = [FakeContinuousEngine(capacity=3) for _ in range(workers)]
    batcher: Batcher[int, int] = Batcher(
        engines, BatchPolicy(max_batch_size=max_batch), join_running=True
    )
    await batcher.start()
    futures: list[asyncio.Future[int]] = []
    items: list[int] = []
    for op, arg, key, final in ops:
        if op == "submit":
            futures.append(batcher.submit(100 * len(futures) + arg, key=key, is_final=final))
            items.append(100 * len(futures) - 100 + arg)
        elif op == "cancel" and arg < len(futures):
            futures[arg].cancel()
        else:
            await asyncio.sleep(0)
    outcomes = await asyncio.wait_for(asyncio.gather(*futures, return_exceptions=True), HANG_S)
    await batcher.aclose()
    seen = [x for e in engines for x in e.seen]
    assert len(seen) == len(set(seen)), "an item reached the engine twice"
    for item, fut, outcome in zip(items, futures, outcomes, strict=True):
        assert fut.done()
        if not fut.cancelled():
            assert outcome == item * 10 and item in seen
    for e in engines:
        for step in e.steps:
            assert len(step) <= max_batch
            assert len({futures_key(ops, x) for x in step}) == 1, f"keys mixed in {step}"
    assert errors == []


def futures_key(ops: list[tuple[str, int, Hashable, bool]], item: int) -> Hashable:
    submits = [o for o in ops if o[0] == "submit"]
    return submits[item // 100][2]


def test_the_config_refuses_join_running_without_the_decode_loop() -> None:
    from voxgate.gateway.config import ConfigError, load_config

    with pytest.raises(ConfigError, match="join_running needs asr.decode_loop.always"):
        load_config(overrides={"batcher": {"join_running": True}})
    on = {"batcher": {"join_running": True}, "asr": {"decode_loop": {"always": True}}}
    assert load_config(overrides=on).batcher.join_running
    assert not load_config().batcher.join_running  # off by default
