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
    describe_side,
    gateway_overrides,
    interleave,
    parse_args,
    pool,
    print_table,
    resolve,
    server_config,
    widen,
)
from voxgate.engines.asr.config import UTTERANCE_ENCODER_WINDOWS, WhisperConfig
from voxgate.gateway.config import GatewayConfig

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


UTTERANCE = {"buckets_s": [float(s) for s in range(1, 31)], "margin_ms": 500}


def test_default_sides_keep_the_server_defaults() -> None:
    assert gateway_overrides(parse_args([])) == {"gateway": {}}
    assert describe_side({}) == {
        "model": "base",
        "buckets": "10/15/20/30 s, margin 2000 ms",
        "buckets_s": [10.0, 15.0, 20.0, 30.0],
        "margin_ms": 2000,
    }


def test_model_and_utterance_buckets_map_to_the_gateway_sides_asr_config() -> None:
    args = parse_args(["--model", "models/acft", "--encoder-buckets", "utterance"])
    args_plan = ["--workers", "2", "--inter-threads", "2", "--join", "--skip-baseline"]
    sides = gateway_overrides(
        parse_args([*args_plan, "--model", "m", "--encoder-buckets", "utterance"])
    )
    assert gateway_overrides(args) == {
        "gateway": {"asr": {"model": "models/acft", "encoder": UTTERANCE}}
    }
    assert sides["gateway"] == {
        "batcher": {"workers": 2},
        "asr": {"inter_threads": 2, "model": "m", "encoder": UTTERANCE},
    }
    # join keeps the gateway's model and windows and adds its own decode loop and batching
    assert sides["join"]["asr"] == {**sides["gateway"]["asr"], "decode_loop": {"always": True}}
    assert sides["join"]["batcher"] == {"workers": 2, "join_running": True}
    # what the server makes of it: exactly the training's utterance windows
    cfg = WhisperConfig(**sides["gateway"]["asr"])
    assert cfg.encoder == UTTERANCE_ENCODER_WINDOWS and cfg.model == "m"
    assert describe_side(sides["gateway"])["buckets"] == "1..30 s every 1 s, margin 500 ms"


def test_alt_side_has_its_own_model_and_buckets_and_the_same_plan() -> None:
    argv = ["--skip-baseline", "--max-batch", "4", "--alt-model", "models/acft"]
    sides = gateway_overrides(parse_args([*argv, "--alt-encoder-buckets", "utterance"]))
    assert sides == {
        "gateway": {"batcher": {"max_batch_size": 4}},
        "alt": {
            "batcher": {"max_batch_size": 4},
            "asr": {"model": "models/acft", "encoder": UTTERANCE},
        },
    }
    only_buckets = gateway_overrides(parse_args(["--alt-encoder-buckets", "utterance"]))
    assert only_buckets["alt"] == {"asr": {"encoder": UTTERANCE}}
    assert "alt" not in gateway_overrides(parse_args(["--model", "x"]))
    assert list(gateway_overrides(parse_args(["--skip-gateway", "--alt-model", "x"]))) == ["alt"]


def test_table_names_each_sides_model_and_buckets(capsys: pytest.CaptureFixture[str]) -> None:
    cache: Cache = {("gateway", 4): [step("gateway", 4, 0.5)], ("alt", 4): [step("alt", 4, 0.4)]}
    served = {
        "gateway": describe_side({}),
        "alt": describe_side({"asr": {"model": "m", "encoder": UTTERANCE}}),
    }
    print_table(cache, [1.0], ["gateway", "alt"], served)
    lines = capsys.readouterr().out.strip().splitlines()
    assert lines[:2] == [
        "gateway: model base, encoder buckets 10/15/20/30 s, margin 2000 ms",
        "alt: model m, encoder buckets 1..30 s every 1 s, margin 500 ms",
    ]
    assert "alt p95 s" in lines[2] and lines[2].count("server p50/p95 ms") == 2


def test_every_gateway_side_serves_all_offered_calls_unshed() -> None:
    """Capacity is where p95 crosses the budget: admission must not refuse the callers first."""
    args = ["--alt-model", "m", "--alt-encoder-buckets", "utterance", "--join", "--workers", "1"]
    for overrides in gateway_overrides(parse_args(args)).values():
        cfg = GatewayConfig.model_validate(server_config(overrides))
        assert not cfg.admission.enabled and not cfg.degrade.enabled
        assert cfg.batcher.workers == 1 and cfg.server.port == 0
