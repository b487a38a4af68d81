"""voxgate.gateway.priority: engine threads below the event loop's CPU priority (Linux nice values).

The call path's stall under load (issue 35) came from the loop and the synthesis workers
sharing oversubscribed cores evenly with the recogniser's threads; these check the mechanism
that orders them: a lowered thread has the nice value asked for, threads it starts inherit it,
the caller's own thread is never touched, and a failure in the lowered thread reaches the
caller.
"""

from __future__ import annotations

import sys
import threading

import pytest

from voxgate.gateway.priority import MAX_NICE, call_lowered, lower_current_thread, thread_nice

pytestmark = pytest.mark.unit

linux = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="per-thread nice")


@linux
def test_a_lowered_call_runs_on_a_thread_that_many_levels_down_and_leaves_the_caller() -> None:
    base = thread_nice()
    assert base is not None
    by = min(3, MAX_NICE - base)
    seen: list[int | None] = []

    def job() -> str:
        seen.append(thread_nice())
        return threading.current_thread().name

    name = call_lowered(by, job)
    assert name != threading.current_thread().name
    assert seen == [base + by]
    assert thread_nice() == base  # the calling thread keeps its priority


@linux
def test_threads_started_by_a_lowered_call_inherit_its_priority() -> None:
    """What puts CTranslate2's worker threads, started while a model loads, below the loop."""
    base = thread_nice()
    assert base is not None
    by = min(5, MAX_NICE - base)
    inner: list[int | None] = []

    def load() -> None:
        worker = threading.Thread(target=lambda: inner.append(thread_nice()))
        worker.start()
        worker.join()

    call_lowered(by, load)
    assert inner == [base + by]


@linux
def test_lowering_stops_at_the_lowest_priority() -> None:
    assert call_lowered(MAX_NICE + 10, thread_nice) == MAX_NICE


def test_nothing_is_lowered_for_zero_and_the_call_stays_on_this_thread() -> None:
    me = threading.current_thread().name
    assert call_lowered(0, lambda: threading.current_thread().name) == me
    assert lower_current_thread(0) is False


def test_a_failure_in_the_lowered_thread_reaches_the_caller() -> None:
    def broken() -> None:
        raise ValueError("no such model")

    with pytest.raises(ValueError, match="no such model"):
        call_lowered(2, broken)
