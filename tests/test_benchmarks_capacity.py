"""benchmarks/asr_capacity.py: the capacity search (doubling, bisection, interleaving, budgets).

Fake probes with a known p95 per K stand in for the callers, so the search logic is checked
exactly; the real probes are what the benchmark itself runs.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable

import pytest

from benchmarks.asr_capacity import (
    Cache,
    Search,
    StepResult,
    UttResult,
    interleave,
    pool,
    print_table,
    resolve,
    widen,
)

pytestmark = pytest.mark.unit


def step(side: str, k: int, p95_s: float, n: int = 20) -> StepResult:
    """A probe whose ``n`` utterances all took ``p95_s`` (so every percentile is that)."""
    utts = [UttResult(i, f"clip{i}", "hello there", "hello there", p95_s) for i in range(n)]
    return StepResult(
        side=side,
        k=k,
        duration_s=1.0,
        offered=1,
        done=1,
        p50_s=p95_s,
        p95_s=p95_s,
        max_s=p95_s,
        server_p50_ms=None,
        server_p95_ms=None,
        wer=0.0,
        throughput_ups=1.0,
        audio_rtfx=1.0,
        saturated=False,
        spurious_finals=0,
        errors=0,
        loadavg_before=(0.0, 0.0, 0.0),
        loadavg_after=(0.0, 0.0, 0.0),
        utterances=utts,
    )


def fake(curves: dict[str, Callable[[int], float]], calls: list[tuple[str, int]]) -> Callable:
    def probe(side: str, k: int) -> StepResult:
        calls.append((side, k))
        return step(side, k, curves[side](k))

    return probe


@pytest.mark.parametrize(("capacity", "start"), [(1, 1), (10, 1), (13, 4), (37, 1), (5, 8)])
def test_search_finds_the_exact_largest_k(capacity: int, start: int) -> None:
    calls: list[tuple[str, int]] = []
    probe = fake({"gateway": lambda k: 0.5 if k <= capacity else 1.5}, calls)
    spec = Search("gateway", 1.0, start, max_k=64)
    cache: Cache = {}
    assert interleave({"gateway": [spec]}, probe, cache, deadline=math.inf)
    search, pending = resolve(spec, cache)
    assert pending is None and search.done
    assert search.good == capacity and search.bad == capacity + 1
    assert len(calls) == len(set(calls))  # no K probed twice
    assert len(calls) <= 2 * math.ceil(math.log2(capacity + 1)) + 2


def test_search_stops_at_max_k_and_at_zero() -> None:
    calls: list[tuple[str, int]] = []
    probe = fake({"gateway": lambda k: 0.1, "baseline": lambda k: math.inf}, calls)
    searches = {
        "gateway": [Search("gateway", 1.0, 1, max_k=20)],
        "baseline": [Search("baseline", 1.0, 1, max_k=20)],
    }
    cache: Cache = {}
    assert interleave(searches, probe, cache, deadline=math.inf, fill=False)
    gateway = resolve(searches["gateway"][0], cache)[0]
    baseline = resolve(searches["baseline"][0], cache)[0]
    assert gateway.good == 20 and gateway.bad is None
    assert baseline.good == 0 and baseline.bad == 1
    assert [k for side, k in calls if side == "gateway"] == [1, 2, 4, 8, 16, 20]
    assert [k for side, k in calls if side == "baseline"] == [1]


@pytest.mark.parametrize("fill", [True, False])
def test_probes_alternate_between_the_sides(fill: bool) -> None:
    calls: list[tuple[str, int]] = []
    probe = fake({"gateway": lambda k: 0.1 * k, "baseline": lambda k: 0.3 * k}, calls)
    searches = {
        "gateway": [Search("gateway", 1.0, 1, max_k=64)],
        "baseline": [Search("baseline", 1.0, 1, max_k=64)],
    }
    cache: Cache = {}
    assert interleave(searches, probe, cache, deadline=math.inf, fill=fill)
    assert resolve(searches["gateway"][0], cache)[0].good == 10
    assert resolve(searches["baseline"][0], cache)[0].good == 3
    sides = [side for side, _ in calls]
    gateway_ks = [k for side, k in calls if side == "gateway"]
    assert gateway_ks == [1, 2, 4, 8, 16, 12, 10, 11]
    if fill:
        # The baseline's search (1, 2, 4, 3) is over first; it repeats its boundary (3 and 4)
        # so that the sides alternate, gateway first, until the gateway's is over too.
        assert sides == ["gateway", "baseline"] * len(gateway_ks)
        assert [k for side, k in calls if side == "baseline"] == [1, 2, 4, 3, 3, 4, 3, 4]
    else:
        assert sides[:8] == ["gateway", "baseline"] * 4
        assert sides[8:] == ["gateway"] * 4


def test_looser_budgets_are_searched_while_the_baseline_holds_nothing() -> None:
    calls: list[tuple[str, int]] = []
    # Gateway p95 0.4 s per 4 calls; baseline 2.5 s at K=1, +0.4 s per extra call.
    curves = {"gateway": lambda k: 0.1 * k, "baseline": lambda k: 2.1 + 0.4 * k}
    probe = fake(curves, calls)
    starts = {"gateway": 1, "baseline": 1}
    searches = {side: [Search(side, 1.0, 1, max_k=64)] for side in starts}
    cache: Cache = {}
    budgets = [1.0]

    def on_round(current: dict[str, list[Search]]) -> None:
        widen(current, cache, budgets, [2.0, 3.0, 4.0], starts, 64)

    assert interleave(searches, probe, cache, deadline=math.inf, on_round=on_round, fill=False)
    # 1 s and 2 s: the baseline holds none; 3 s: it holds 2, so 4 s is never searched.
    assert budgets == [1.0, 2.0, 3.0]
    assert [resolve(s, cache)[0].good for s in searches["baseline"]] == [0, 0, 2]
    assert [resolve(s, cache)[0].good for s in searches["gateway"]] == [10, 20, 30]
    assert len(calls) == len(set(calls))  # the looser searches reuse every earlier probe


def test_repeated_probes_are_pooled_and_steer_the_search() -> None:
    # The baseline's K=1 looks fine once, then never again (nor does any larger K): once its
    # search is over it repeats K=1 while the gateway's goes on, and pooled, K=1 fails.
    seen: list[int] = []

    def probe(side: str, k: int) -> StepResult:
        if side == "gateway":
            return step(side, k, 0.1 * k)
        seen.append(k)
        return step(side, k, 0.5 if seen == [1] else 5.0)

    searches = {side: [Search(side, 1.0, 1, max_k=64)] for side in ("gateway", "baseline")}
    cache: Cache = {}
    assert interleave(searches, probe, cache, deadline=math.inf)
    assert seen[:3] == [1, 2, 1]
    assert len(cache[("baseline", 1)]) > 1
    assert pool(cache[("baseline", 1)]).p95_s == 5.0
    baseline = resolve(searches["baseline"][0], cache)[0]
    assert baseline.good == 0 and baseline.bad == 1


def test_widen_does_nothing_while_the_baseline_holds_a_call() -> None:
    cache: Cache = {
        ("baseline", 1): [step("baseline", 1, 0.5)],
        ("baseline", 2): [step("baseline", 2, 2.0)],
    }
    searches = {"baseline": [Search("baseline", 1.0, 1, max_k=64)]}
    budgets = [1.0]
    assert not widen(searches, cache, budgets, [2.0], {"baseline": 1}, 64)
    assert budgets == [1.0] and resolve(searches["baseline"][0], cache)[0].good == 1


def test_a_search_cut_by_the_deadline_reports_a_range() -> None:
    calls: list[tuple[str, int]] = []

    def slow(side: str, k: int) -> StepResult:
        calls.append((side, k))
        time.sleep(0.05)
        return step(side, k, 0.1)

    spec = Search("gateway", 1.0, 1, max_k=64)
    cache: Cache = {}
    assert not interleave({"gateway": [spec]}, slow, cache, deadline=time.monotonic() + 0.12)
    search = resolve(spec, cache)[0]
    assert not search.done and 1 <= search.good < 64
    assert "search cut" in search.describe()


def test_three_sides_alternate_and_the_table_has_the_join_side(
    capsys: pytest.CaptureFixture[str],
) -> None:
    calls: list[tuple[str, int]] = []
    curves = {"gateway": lambda k: 0.1 * k, "join": lambda k: 0.2 * k, "baseline": lambda k: k}
    probe = fake(curves, calls)
    searches = {side: [Search(side, 1.0, 1, max_k=64)] for side in curves}
    cache: Cache = {}
    assert interleave(searches, probe, cache, deadline=math.inf, fill=False)
    assert [s for s, _ in calls][:3] == ["gateway", "join", "baseline"]
    assert resolve(searches["join"][0], cache)[0].good == 5
    print_table(cache, [1.0], list(curves))
    head = capsys.readouterr().out.strip().splitlines()[0]
    assert "join p95 s" in head and head.count("server p50/p95 ms") == 2
