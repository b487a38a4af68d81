"""BatchPolicy.join (iteration-level batching), pure, step by step on a fake clock.

The last tests drive ``next_batch`` and ``join`` together through a tiny discrete-event model
of one worker running a step-wise engine (FAKE: an item is the number of steps it takes), so the
guarantees are checked over whole schedules: every item runs once, keys never mix, a batch never
passes ``max_batch_size``, and a short utterance that arrives mid-batch no longer waits for the
slowest item of that batch.
"""

from __future__ import annotations

import math
from collections.abc import Hashable
from dataclasses import dataclass

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from voxgate.gateway.scheduling import Batch, BatchPolicy

pytestmark = pytest.mark.unit


@dataclass(frozen=True)
class Item:
    """A queued item as the policy sees it; ``seq`` doubles as its name."""

    seq: int
    key: Hashable = "k"
    is_final: bool = True
    deadline: float = math.inf
    enqueued_at: float = 0.0
    steps: int = 1


class FakeClock:
    """Virtual seconds; only the test moves it."""

    def __init__(self, start: float = 100.0) -> None:
        self.now = start


def names(items: tuple[Item, ...]) -> list[int]:
    return [e.seq for e in items]


def test_same_key_items_join_most_urgent_first_up_to_the_room_left() -> None:
    policy = BatchPolicy(max_batch_size=4)
    queue = [Item(0, deadline=9.0), Item(1, key="other"), Item(2, deadline=3.0), Item(3)]
    assert names(policy.join(queue, key="k", running=2, idle_workers=0)) == [2, 0]


def test_nothing_joins_a_full_batch() -> None:
    policy = BatchPolicy(max_batch_size=2)
    assert policy.join([Item(0)], key="k", running=2, idle_workers=0) == ()
    assert policy.join([Item(0)], key="k", running=3, idle_workers=0) == ()


def test_nothing_joins_while_a_worker_is_idle() -> None:
    # The idle worker serves the queue with a batch of its own (next_batch) instead.
    policy = BatchPolicy(max_batch_size=8)
    assert policy.join([Item(0)], key="k", running=1, idle_workers=1) == ()


def test_an_empty_queue_gives_nothing() -> None:
    assert BatchPolicy().join([], key="k", running=0, idle_workers=0) == ()


def test_interims_do_not_join_while_a_final_of_another_key_waits() -> None:
    policy = BatchPolicy(max_batch_size=8)
    queue = [Item(0, is_final=False), Item(1, key="other"), Item(2, deadline=1.0)]
    # The more urgent final of this key joins; the interim would only slow the worker that
    # "other" waits for.
    assert names(policy.join(queue, key="k", running=1, idle_workers=0)) == [2]


def test_nothing_overtakes_a_more_urgent_item_of_another_key() -> None:
    # Under a steady stream of "k" the running batch must still drain, or "other" would wait
    # forever on a one-worker GPU: a "k" final queued after the "other" final does not join.
    policy = BatchPolicy(max_batch_size=8)
    queue = [Item(1, key="other"), Item(2), Item(0, deadline=0.5)]
    assert names(policy.join(queue, key="k", running=1, idle_workers=0)) == [0]


def test_interims_join_behind_finals_when_no_other_item_is_more_urgent() -> None:
    policy = BatchPolicy(max_batch_size=8)
    queue = [
        Item(0, is_final=False, deadline=1.0),
        Item(1, deadline=5.0),
        Item(2, key="o", is_final=False, deadline=9.0),
    ]
    assert names(policy.join(queue, key="k", running=1, idle_workers=0)) == [1, 0]


def test_a_max_wait_hold_does_not_stop_joining() -> None:
    # Joining delays no dispatch, so the hold that fills a new batch does not apply to it.
    policy = BatchPolicy(max_batch_size=4, max_wait_ms=500.0)
    queue = [Item(0, enqueued_at=100.0)]
    assert names(policy.join(queue, key="k", running=1, idle_workers=0)) == [0]


items_strategy = st.lists(
    st.tuples(st.sampled_from(["a", "b"]), st.booleans(), st.floats(0.0, 10.0)), max_size=20
)


@settings(max_examples=200, deadline=None)
@given(
    raw=items_strategy,
    key=st.sampled_from(["a", "b"]),
    running=st.integers(0, 6),
    max_batch=st.integers(1, 6),
)
def test_join_picks_a_bounded_same_key_subset_in_urgency_order(
    raw: list[tuple[str, bool, float]], key: str, running: int, max_batch: int
) -> None:
    policy = BatchPolicy(max_batch_size=max_batch)
    queue = [Item(i, key=k, is_final=f, deadline=d) for i, (k, f, d) in enumerate(raw)]
    picks = policy.join(queue, key=key, running=running, idle_workers=0)
    assert len(picks) <= max(0, max_batch - running)
    assert all(p.key == key and p in queue for p in picks)
    order = [(not p.is_final, p.deadline, p.seq) for p in picks]
    assert order == sorted(order)

    def urgency(e: Item) -> tuple[bool, float, int]:
        return (not e.is_final, e.deadline, e.seq)

    if any(e.is_final and e.key != key for e in queue):
        assert all(p.is_final for p in picks)
    others = [urgency(e) for e in queue if e.key != key]
    # No pick overtakes a waiting item of another key ...
    assert all(not others or urgency(p) < min(others) for p in picks)
    # ... and with a slot free, an item of this key is left out only because of one.
    left = [e for e in queue if e.key == key and e not in picks]
    if left and len(picks) < max_batch - running:
        assert all(others and urgency(e) > min(others) for e in left)


# ------------------------------------------------------------------------------------------
# Whole schedules on one step-wise worker (virtual time: one step = 1 s)


def simulate(
    arrivals: list[tuple[float, Item]], *, join: bool, max_batch: int
) -> tuple[dict[int, float], list[list[int]]]:
    """Run one worker; return each item's finish time and the items of every step."""
    policy = BatchPolicy(max_batch_size=max_batch)
    clock = FakeClock(start=0.0)
    pending = sorted(arrivals, key=lambda a: a[0])
    queue: list[Item] = []
    running: dict[int, list[int]] = {}  # seq -> [steps left]
    run_key: Hashable = None
    finished: dict[int, float] = {}
    steps: list[list[int]] = []
    while pending or queue or running:
        while pending and pending[0][0] <= clock.now:
            queue.append(pending.pop(0)[1])
        if not running:
            decision = policy.next_batch(queue, clock.now, idle_workers=1)
            if isinstance(decision, Batch):
                run_key = decision.key
                for e in decision.entries:
                    running[e.seq] = [e.steps]
                    queue.remove(e)
        elif join:
            for e in policy.join(queue, key=run_key, running=len(running), idle_workers=0):
                running[e.seq] = [e.steps]
                queue.remove(e)
        if not running:
            clock.now = pending[0][0]
            continue
        steps.append(sorted(running))
        clock.now += 1.0
        for seq in list(running):
            running[seq][0] -= 1
            if running[seq][0] == 0:
                finished[seq] = clock.now
                del running[seq]
    return finished, steps


def test_a_short_utterance_arriving_mid_batch_no_longer_waits_for_the_slowest() -> None:
    long_item, short_item = Item(0, steps=10), Item(1, steps=1)
    arrivals = [(0.0, long_item), (0.5, short_item)]
    plain, _ = simulate(arrivals, join=False, max_batch=4)
    joined, steps = simulate(arrivals, join=True, max_batch=4)
    assert plain[1] == 11.0  # today: after the whole 10-step batch, then its own step
    assert joined[1] == 2.0  # joined at step 2, left after it
    assert joined[0] == plain[0] == 10.0  # the long one is not delayed
    assert steps[:2] == [[0], [0, 1]]


@settings(max_examples=150, deadline=None)
@given(
    raw=st.lists(
        st.tuples(
            st.floats(0.0, 20.0), st.sampled_from(["a", "b"]), st.booleans(), st.integers(1, 6)
        ),
        min_size=1,
        max_size=15,
    ),
    max_batch=st.integers(1, 4),
)
def test_every_schedule_runs_each_item_once_in_bounded_single_key_steps(
    raw: list[tuple[float, str, bool, int]], max_batch: int
) -> None:
    by_seq = {
        i: Item(i, key=k, is_final=f, enqueued_at=t, steps=n) for i, (t, k, f, n) in enumerate(raw)
    }
    arrivals = [(e.enqueued_at, e) for e in by_seq.values()]
    finished, steps = simulate(arrivals, join=True, max_batch=max_batch)
    assert sorted(finished) == sorted(by_seq)
    for step in steps:
        assert 1 <= len(step) <= max_batch
        assert len({by_seq[s].key for s in step}) == 1
    for seq, item in by_seq.items():
        ran = sum(1 for step in steps if seq in step)
        assert ran == item.steps  # each item decoded exactly its own steps, once
