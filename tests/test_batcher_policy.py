"""BatchPolicy step by step with a fake clock, its Hypothesis properties, and the plan chooser."""

from __future__ import annotations

import math
from collections.abc import Hashable
from dataclasses import dataclass

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from voxgate.gateway.scheduling import (
    DEFAULT_PLANS,
    Batch,
    BatchPlan,
    BatchPolicy,
    QueueFullError,
    WaitUntil,
    choose_plan,
    default_candidates,
    default_plan,
)

pytestmark = pytest.mark.unit


@dataclass(frozen=True)
class Item:
    """A queued item as the policy sees it; ``seq`` doubles as its name in assertions."""

    seq: int
    key: Hashable = "k"
    is_final: bool = True
    deadline: float = math.inf
    enqueued_at: float = 0.0


class FakeClock:
    """Virtual seconds; only the test moves it."""

    def __init__(self, start: float = 100.0) -> None:
        self.now = start

    def advance_ms(self, ms: float) -> float:
        self.now += ms / 1000.0
        return self.now


def make_items(n: int, *, start_seq: int = 0, **kw: object) -> list[Item]:
    return [Item(seq=start_seq + i, **kw) for i in range(n)]  # type: ignore[arg-type]


def seqs(decision: Batch[Item] | WaitUntil | None) -> list[int]:
    assert isinstance(decision, Batch), decision
    return [e.seq for e in decision.entries]


# ------------------------------------------------------------------------------------------
# Dispatch timing
# ------------------------------------------------------------------------------------------


def test_lone_item_dispatches_at_once_when_a_worker_is_idle() -> None:
    clock = FakeClock()
    policy = BatchPolicy(max_batch_size=8)
    queue = [Item(0, enqueued_at=clock.now)]
    assert seqs(policy.next_batch(queue, clock.now, idle_workers=1)) == [0]


def test_empty_queue_gives_nothing() -> None:
    assert BatchPolicy().next_batch([], 0.0, idle_workers=2) is None


def test_items_accumulate_while_all_workers_are_busy_then_go_together() -> None:
    clock = FakeClock()
    policy = BatchPolicy(max_batch_size=8)
    queue: list[Item] = []
    for i in range(5):
        queue.append(Item(i, enqueued_at=clock.advance_ms(3)))
        assert policy.next_batch(queue, clock.now, idle_workers=0) is None
    # A worker frees up: everything that piled up goes in one batch, oldest first.
    assert seqs(policy.next_batch(queue, clock.now, idle_workers=1)) == [0, 1, 2, 3, 4]


def test_max_batch_size_caps_the_batch_and_the_rest_waits_its_turn() -> None:
    policy = BatchPolicy(max_batch_size=3)
    queue = make_items(7)
    first = seqs(policy.next_batch(queue, 0.0, idle_workers=1))
    assert first == [0, 1, 2]
    queue = [e for e in queue if e.seq not in first]
    assert seqs(policy.next_batch(queue, 0.0, idle_workers=1)) == [3, 4, 5]


def test_zero_max_wait_never_holds_a_partial_batch() -> None:
    policy = BatchPolicy(max_batch_size=8, max_wait_ms=0)
    decision = policy.next_batch([Item(0, enqueued_at=5.0)], 5.0, idle_workers=1)
    assert isinstance(decision, Batch)


def test_max_wait_holds_a_partial_batch_until_the_window_ends() -> None:
    clock = FakeClock()
    policy = BatchPolicy(max_batch_size=4, max_wait_ms=20)
    queue = [Item(0, enqueued_at=clock.now)]
    t0 = clock.now
    assert policy.next_batch(queue, clock.now, idle_workers=1) == WaitUntil(t0 + 0.020)
    clock.advance_ms(5)
    queue.append(Item(1, enqueued_at=clock.now))
    # The window belongs to the oldest item; a newcomer does not extend it.
    assert policy.next_batch(queue, clock.now, idle_workers=1) == WaitUntil(t0 + 0.020)
    clock.advance_ms(15)
    assert seqs(policy.next_batch(queue, clock.now, idle_workers=1)) == [0, 1]


def test_max_wait_dispatches_a_full_batch_without_waiting() -> None:
    policy = BatchPolicy(max_batch_size=3, max_wait_ms=1000)
    queue = make_items(3, enqueued_at=10.0)
    assert seqs(policy.next_batch(queue, 10.0, idle_workers=1)) == [0, 1, 2]


def test_max_wait_never_holds_past_an_items_deadline() -> None:
    policy = BatchPolicy(max_batch_size=4, max_wait_ms=50)
    queue = [Item(0, enqueued_at=10.0, deadline=10.010)]
    assert policy.next_batch(queue, 10.0, idle_workers=1) == WaitUntil(10.010)
    assert seqs(policy.next_batch(queue, 10.010, idle_workers=1)) == [0]


def test_max_wait_with_busy_workers_accumulates() -> None:
    policy = BatchPolicy(max_batch_size=4, max_wait_ms=50)
    assert policy.next_batch([Item(0)], 0.0, idle_workers=0) is None


# ------------------------------------------------------------------------------------------
# Ordering: priority, EDF, keys
# ------------------------------------------------------------------------------------------


def test_finals_go_before_interim_re_decodes() -> None:
    policy = BatchPolicy(max_batch_size=2)
    queue = [
        Item(0, is_final=False, deadline=1.0),
        Item(1, is_final=False, deadline=2.0),
        Item(2, is_final=True, deadline=9.0),
        Item(3, is_final=True),
    ]
    # Finals outrank interim even when the interim ones are due sooner.
    assert seqs(policy.next_batch(queue, 0.0, idle_workers=1)) == [2, 3]


def test_interim_items_fill_spare_slots_behind_finals() -> None:
    policy = BatchPolicy(max_batch_size=4)
    queue = [Item(0, is_final=False), Item(1, is_final=True), Item(2, is_final=False)]
    assert seqs(policy.next_batch(queue, 0.0, idle_workers=1)) == [1, 0, 2]


def test_earliest_deadline_first_within_a_priority() -> None:
    policy = BatchPolicy(max_batch_size=2)
    queue = [Item(0, deadline=5.0), Item(1, deadline=3.0), Item(2), Item(3, deadline=4.0)]
    assert seqs(policy.next_batch(queue, 0.0, idle_workers=1)) == [1, 3]


def test_fifo_breaks_deadline_ties() -> None:
    policy = BatchPolicy(max_batch_size=2)
    queue = [Item(2, deadline=1.0), Item(0, deadline=1.0), Item(1, deadline=1.0)]
    assert seqs(policy.next_batch(queue, 0.0, idle_workers=1)) == [0, 1]


def test_different_keys_never_share_a_batch() -> None:
    policy = BatchPolicy(max_batch_size=8)
    queue = [Item(0, key="beam1"), Item(1, key="beam5"), Item(2, key="beam1")]
    decision = policy.next_batch(queue, 0.0, idle_workers=1)
    assert isinstance(decision, Batch)
    assert decision.key == "beam1"
    assert seqs(decision) == [0, 2]
    assert seqs(policy.next_batch([queue[1]], 0.0, idle_workers=1)) == [1]


def test_the_most_urgent_item_picks_the_key() -> None:
    policy = BatchPolicy(max_batch_size=8)
    queue = [
        Item(0, key="a", is_final=False),
        Item(1, key="a", is_final=False),
        Item(2, key="b", is_final=True, deadline=7.0),
        Item(3, key="a", is_final=True, deadline=8.0),
        Item(4, key="b", is_final=False),
    ]
    decision = policy.next_batch(queue, 0.0, idle_workers=1)
    assert isinstance(decision, Batch)
    assert decision.key == "b"
    assert seqs(decision) == [2, 4]


def test_a_held_batch_is_not_overtaken_by_another_key() -> None:
    policy = BatchPolicy(max_batch_size=2, max_wait_ms=10)
    queue = [Item(0, key="a", enqueued_at=0.0), *make_items(2, start_seq=1, key="b")]
    # "a" is most urgent and partial: hold it rather than let the full "b" batch jump ahead.
    assert policy.next_batch(queue, 0.0, idle_workers=1) == WaitUntil(0.010)


# ------------------------------------------------------------------------------------------
# Admission and validation
# ------------------------------------------------------------------------------------------


def test_queue_full_raises_a_typed_error_naming_the_limit() -> None:
    policy = BatchPolicy(max_queue_size=3)
    for depth in range(3):
        policy.admit(depth)
    with pytest.raises(QueueFullError, match="max_queue_size=3") as info:
        policy.admit(3)
    assert info.value.limit == 3
    assert info.value.depth == 3
    assert info.value.subject == "batcher.max_queue_size"
    assert "max_queue_size=3" in info.value.description


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"max_batch_size": 0}, "max_batch_size"),
        ({"max_wait_ms": -1.0}, "max_wait_ms"),
        ({"max_wait_ms": math.nan}, "max_wait_ms"),
        ({"max_queue_size": 0}, "max_queue_size"),
    ],
)
def test_invalid_limits_are_refused(kwargs: dict[str, float], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        BatchPolicy(**kwargs)  # type: ignore[arg-type]


# ------------------------------------------------------------------------------------------
# Properties
# ------------------------------------------------------------------------------------------

items_strategy = st.lists(
    st.builds(
        lambda key, final, deadline, enq: (key, final, deadline, enq),
        st.sampled_from(["a", "b", "c"]),
        st.booleans(),
        st.one_of(st.just(math.inf), st.floats(0.0, 10.0)),
        st.floats(0.0, 1.0),
    ),
    max_size=40,
)


@settings(max_examples=200, deadline=None)
@given(
    raw=items_strategy,
    max_batch_size=st.integers(1, 6),
    max_wait_ms=st.sampled_from([0.0, 5.0, 100.0]),
    idle=st.integers(1, 3),
)
def test_draining_dispatches_every_item_once_in_bounded_single_key_batches(
    raw: list[tuple[str, bool, float, float]], max_batch_size: int, max_wait_ms: float, idle: int
) -> None:
    policy = BatchPolicy(max_batch_size=max_batch_size, max_wait_ms=max_wait_ms)
    queue = [
        Item(i, key=k, is_final=f, deadline=d, enqueued_at=e) for i, (k, f, d, e) in enumerate(raw)
    ]
    clock = FakeClock(start=1.0)
    dispatched: list[int] = []
    steps = 0
    while queue:
        steps += 1
        assert steps <= 2 * len(raw) + 2, "policy did not make progress"
        decision = policy.next_batch(queue, clock.now, idle_workers=idle)
        if isinstance(decision, WaitUntil):
            assert decision.at > clock.now
            clock.now = decision.at
            continue
        assert isinstance(decision, Batch)
        batch = decision.entries
        assert 1 <= len(batch) <= max_batch_size
        assert {e.key for e in batch} == {decision.key}
        # The head of each batch is the most urgent item left in the queue.
        best = min(queue, key=lambda e: (not e.is_final, e.deadline, e.seq))
        assert batch[0] == best
        dispatched.extend(e.seq for e in batch)
        chosen = {e.seq for e in batch}
        queue = [e for e in queue if e.seq not in chosen]
    assert sorted(dispatched) == list(range(len(raw)))


# ------------------------------------------------------------------------------------------
# Plans
# ------------------------------------------------------------------------------------------


def test_choose_plan_picks_the_highest_throughput() -> None:
    # Shaped like the 2-core CPU measurements: parallel workers beat batching.
    table = {(1, 1): 1.0, (8, 1): 1.2, (1, 2): 1.55, (2, 2): 1.6, (8, 2): 1.3}
    calls: list[tuple[int, int]] = []

    def measure(batch: int, workers: int) -> float:
        calls.append((batch, workers))
        return table[(batch, workers)]

    plans = [BatchPlan(b, w) for (b, w) in table]
    assert choose_plan(measure, plans, tolerance=0.0) == BatchPlan(2, 2)
    assert sorted(calls) == sorted(table)


def test_choose_plan_prefers_the_smaller_batch_when_within_tolerance() -> None:
    table = {(1, 2): 1.55, (2, 2): 1.6, (8, 1): 1.0}
    plans = [BatchPlan(b, w) for (b, w) in table]
    assert choose_plan(lambda b, w: table[(b, w)], plans, tolerance=0.05) == BatchPlan(1, 2)


def test_choose_plan_prefers_fewer_workers_on_a_tie() -> None:
    plans = [BatchPlan(8, 2), BatchPlan(8, 1)]
    assert choose_plan(lambda b, w: 10.0, plans) == BatchPlan(8, 1)


def test_choose_plan_gpu_shape_picks_a_big_batch_on_one_worker() -> None:
    def measure(batch: int, workers: int) -> float:
        return {1: 1.0, 4: 2.6, 8: 3.7, 16: 3.8}[batch] / (1.0 + 0.1 * (workers - 1))

    assert choose_plan(measure, default_candidates("cuda")) == BatchPlan(8, 1)


def test_choose_plan_measures_duplicates_once() -> None:
    calls: list[tuple[int, int]] = []

    def measure(batch: int, workers: int) -> float:
        calls.append((batch, workers))
        return 1.0

    choose_plan(measure, [BatchPlan(2, 2), BatchPlan(2, 2)])
    assert calls == [(2, 2)]


@pytest.mark.parametrize("bad", [0.0, -1.0, math.nan, math.inf])
def test_choose_plan_refuses_a_broken_measurement(bad: float) -> None:
    with pytest.raises(ValueError, match="measure returned"):
        choose_plan(lambda b, w: bad, [BatchPlan(1, 1)])


def test_choose_plan_refuses_no_candidates_and_bad_tolerance() -> None:
    with pytest.raises(ValueError, match="at least one"):
        choose_plan(lambda b, w: 1.0, [])
    with pytest.raises(ValueError, match="tolerance"):
        choose_plan(lambda b, w: 1.0, [BatchPlan(1, 1)], tolerance=1.0)


def test_default_table_matches_the_measured_devices() -> None:
    assert DEFAULT_PLANS["cpu"] == BatchPlan(max_batch_size=2, workers=2)
    assert DEFAULT_PLANS["cuda"] == BatchPlan(max_batch_size=8, workers=1)
    assert default_plan("cpu", cpu_cores=2) == BatchPlan(2, 2)
    assert default_plan("cpu", cpu_cores=1) == BatchPlan(2, 1)
    assert default_plan("cuda") == BatchPlan(8, 1)


def test_default_candidates_contain_the_default_plan() -> None:
    assert default_plan("cpu") in default_candidates("cpu")
    assert default_plan("cuda") in default_candidates("cuda")
    assert {p.workers for p in default_candidates("cpu", cpu_cores=4)} == {1, 2, 4}


def test_invalid_plan_inputs_are_refused() -> None:
    with pytest.raises(ValueError, match="workers >= 1"):
        BatchPlan(max_batch_size=1, workers=0)
    with pytest.raises(ValueError, match="unknown device"):
        default_plan("tpu")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="cpu_cores"):
        default_candidates("cpu", cpu_cores=0)


def test_a_burst_is_spread_over_idle_workers() -> None:
    policy = BatchPolicy(max_batch_size=8)
    queue = make_items(5)
    # ceil(5 / 2) = 3 for the first worker; the second worker then gets the other 2.
    first = seqs(policy.next_batch(queue, 0.0, idle_workers=2))
    assert first == [0, 1, 2]
    rest = [e for e in queue if e.seq not in first]
    assert seqs(policy.next_batch(rest, 0.0, idle_workers=1)) == [3, 4]


def test_two_items_on_two_idle_workers_run_as_two_single_calls() -> None:
    policy = BatchPolicy(max_batch_size=2)
    assert seqs(policy.next_batch(make_items(2), 0.0, idle_workers=2)) == [0]
