"""Admission from measured load: the pure pieces, then a real server that refuses in time.

The policy and the windowed views are checked exactly with readings passed in. The server tests
run a real grpc.aio server on loopback with a FAKE recogniser behind the REAL batcher
(``voxgate.gateway.testing.batched``): its latency is what the test sets, so "the recogniser got
slow" is a fact of the test, not a hope about the machine. Waits are on events and metrics with
generous hang guards; nothing asserts on how long anything took.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import grpc
import pytest
from calls import chunks, config, encode_wav, requests
from google.rpc import error_details_pb2, status_pb2
from grpc_health.v1 import health_pb2, health_pb2_grpc

from voxgate.engines.asr.base import AsrRequest, AsrResult
from voxgate.gateway.admission import (
    AdmissionPolicy,
    LoadSampler,
    LoadSnapshot,
    WindowedTotal,
    quantile,
)
from voxgate.gateway.config import AdmissionConfig, LimitsConfig
from voxgate.gateway.degrade import LADDER
from voxgate.gateway.metrics import GatewayMetrics, RecentValues
from voxgate.gateway.server import SERVICE_NAME, GatewayServer
from voxgate.gateway.testing.batched import FakeBatchedAsrHub, fake_result
from voxgate.gateway.testing.fake_engines import FakeBatchEngine, FakeToneSynthesizer
from voxgate.gateway.testing.server import running_server
from voxgate.v1 import voxgate_pb2 as pb
from voxgate.v1 import voxgate_pb2_grpc as pb_grpc

pytestmark = pytest.mark.e2e

NAN = math.nan
#: A hang guard only.
HANG_S = 30.0


# -- windowed views ----------------------------------------------------------------------------


def test_recent_values_give_exact_quantiles_of_the_window() -> None:
    r = RecentValues()
    for i in range(20):
        r.add(float(i), 0.1 * (i + 1))  # 0.1 .. 2.0 s at 0 .. 19 s
    window = r.window(19.0, 10.0)  # observed after 9 s: ten values, 1.1 .. 2.0 s
    assert len(window) == 10
    # Nearest rank: the p95 of ten finals is the slowest, the p50 the fifth; no bucket edges.
    assert quantile(window, 0.95) == pytest.approx(2.0)
    assert quantile(window, 0.5) == pytest.approx(1.5)
    assert math.isnan(quantile(r.window(100.0, 10.0), 0.95))
    assert quantile([0.51] * 19 + [0.9], 0.95) == pytest.approx(0.51)  # a bucket read 0.75


def test_windowed_total_rate_mean_and_maximum() -> None:
    t = WindowedTotal(window_s=4.0)
    assert t.rate() == 0.0
    for now, total in [(0.0, 0.0), (1.0, 0.5), (2.0, 1.0), (3.0, 1.5), (4.0, 2.0), (5.0, 3.0)]:
        t.add(now, total)
    assert t.rate() == pytest.approx((3.0 - 0.5) / 4.0)  # baseline: the reading at 1.0 s
    assert t.mean() == pytest.approx((0.5 + 1.0 + 1.5 + 2.0 + 3.0) / 5)
    assert t.maximum() == 3.0


def test_sampler_reads_what_the_server_measures() -> None:
    m = GatewayMetrics()
    m.engine_workers.labels("asr").set(2)
    m.engine_workers.labels("tts").set(4)
    sampler = LoadSampler(m, window_s=10.0)
    sampler.sample(0.0, calls=0, bulk_calls=0)
    for i, latency in enumerate([0.2] * 19 + [2.5]):
        m.realtime_finals.add(5.0 + i * 0.1, latency)
    m.asr_busy.inc(8.0)  # 8 s of engine time in 10 s over 2 workers
    m.tts_streams_active.set(2)
    snap = sampler.sample(10.0, calls=4, bulk_calls=1, calibrated_capacity=12)
    assert (snap.calls, snap.bulk_calls, snap.asr_workers) == (4, 1, 2)
    assert (snap.tts_threads, snap.tts_streams, snap.calibrated_capacity) == (4, 2, 12)
    assert snap.final_p95_s == 0.2 and snap.finals == 20  # 19 of 20 within 0.2 s
    assert snap.asr_utilisation == pytest.approx(0.4)
    assert snap.priced_utilisation == pytest.approx(0.4)
    assert snap.calls_mean == pytest.approx(1.5)  # 0 then 3 real-time calls
    assert snap.bulk_in_window


# -- the policy ----------------------------------------------------------------------------------


def policy(**over: Any) -> AdmissionPolicy:
    return AdmissionPolicy(AdmissionConfig(**over), LimitsConfig(max_concurrent_calls=50))


def calm(**over: Any) -> LoadSnapshot:
    base: dict[str, Any] = {
        "calls": 4,
        "calls_mean": 4.0,
        "asr_workers": 2,
        "asr_utilisation": 0.2,
        "priced_utilisation": 0.2,
        "final_p95_s": 0.3,
        "finals": 40,
        "calibrated_capacity": 10,
        "tts_threads": 2,
    }
    return LoadSnapshot(**{**base, **over})


def test_a_calm_replica_admits_and_reports_its_load() -> None:
    p = policy()
    assert p.decide("call", calm(), active_calls=4, active_synthesize=0) is None
    # 4 calls cost 0.2 of the engine: 0.05 each, 15 fit at 0.75 utilisation.
    assert p.capacity(calm()) == 15
    assert p.load(calm(), active_calls=4) == pytest.approx(4 / 15, abs=0.01)


def test_an_idle_replica_always_admits() -> None:
    """However slow its last finals were: nobody is on it."""
    hot = calm(final_p95_s=9.0, asr_utilisation=1.0, calibrated_capacity=1, calls_mean=0.0)
    assert policy().decide("call", hot, active_calls=0, active_synthesize=0) is None


def test_slow_finals_on_a_quiet_engine_are_its_speed_not_overload() -> None:
    """One real-time caller whose finals take 1-2 s on a small CPU never locks out the next."""
    slow = calm(
        calls=1, calls_mean=1.0, final_p95_s=2.0, asr_utilisation=0.15, priced_utilisation=0.05
    )
    p = policy()
    for active in (1, 2, 5):
        assert p.decide("call", slow, active_calls=active, active_synthesize=0) is None
    assert not p.over_capacity(slow, active_calls=2)


def test_the_latency_guard_acts_only_while_the_engine_is_busy() -> None:
    p = policy(retry_after_ms=1500)
    busy = calm(final_p95_s=1.21, asr_utilisation=0.8, calls_mean=16.0)  # 60 fit
    refusal = p.decide("call", busy, active_calls=5, active_synthesize=0)
    assert refusal is not None and refusal.reason == "latency"
    assert "1.21 s, over the admission limit 1.20 s" in refusal.message
    assert refusal.retry_after_ms == 1500 and "retry in 1.5 s" in refusal.message
    assert p.load(busy, active_calls=5) == 1.0
    assert p.over_capacity(busy, active_calls=5)
    # Below the refusal point, or too few finals, it admits.
    assert (
        p.decide(
            "call",
            calm(final_p95_s=1.19, asr_utilisation=0.8, calls_mean=16.0),
            active_calls=5,
            active_synthesize=0,
        )
        is None
    )
    few = calm(final_p95_s=3.0, finals=4, asr_utilisation=0.8, calls_mean=16.0)
    assert p.decide("call", few, active_calls=5, active_synthesize=0) is None


def test_the_hard_ceiling_holds_with_admission_off() -> None:
    p = policy(enabled=False)
    hot = calm(final_p95_s=9.0, asr_utilisation=1.0, calibrated_capacity=1)
    assert p.decide("call", hot, active_calls=49, active_synthesize=0) is None
    refusal = p.decide("call", hot, active_calls=50, active_synthesize=0)
    assert refusal is not None and refusal.reason == "max_concurrent_calls"
    assert "max_concurrent_calls=50" in refusal.message


def test_the_capacity_refuses_the_call_that_would_not_fit() -> None:
    p = policy()
    snap = calm(calls=10, calls_mean=10.0, priced_utilisation=0.6)  # 0.06 a call: 12 fit
    assert p.capacity(snap) == 12
    assert p.decide("call", snap, active_calls=11, active_synthesize=0) is None
    refusal = p.decide("call", snap, active_calls=12, active_synthesize=0)
    assert refusal is not None and refusal.reason == "engine_capacity"
    assert "holds about 12 real-time calls" in refusal.message
    assert p.load(snap, active_calls=12) == 1.0
    assert p.load(snap, active_calls=6) < 1.0
    assert p.over_capacity(snap, active_calls=13)


@pytest.mark.parametrize(
    "snap",
    [
        calm(priced_utilisation=0.05),  # too little work to price a call
        calm(calls_mean=0.5),
        calm(bulk_in_window=True),  # a file's backlog is not the real-time calls' cost
    ],
)
def test_unmeasured_windows_fall_back_to_the_calibration(snap: LoadSnapshot) -> None:
    p = policy()
    assert p.measured_capacity(snap) is None
    assert p.capacity(snap) == 10
    assert p.decide("call", snap, active_calls=9, active_synthesize=0) is None
    refusal = p.decide("call", snap, active_calls=10, active_synthesize=0)
    assert refusal is not None and refusal.reason == "engine_capacity"


def test_configured_capacity_wins_and_no_recogniser_has_none() -> None:
    assert policy(capacity_calls=3).capacity(calm()) == 3
    assert policy().capacity(calm(asr_workers=0)) is None
    none = calm(asr_workers=0, calibrated_capacity=0)
    assert policy().decide("call", none, active_calls=40, active_synthesize=0) is None


def test_bulk_calls_reserve_no_capacity_and_no_latency() -> None:
    """Files sent at 3.5x use spare capacity only; they neither price nor refuse real-time calls."""
    p = policy()
    snap = calm(
        calls=3,
        bulk_calls=1,
        calls_mean=2.0,
        asr_utilisation=0.55,
        bulk_in_window=True,
        finals=10,
        final_p95_s=0.6,
    )
    for active in range(1, 10):
        assert p.decide("call", snap, active_calls=active, active_synthesize=0) is None
    assert p.decide("call", snap, active_calls=10, active_synthesize=0) is not None
    # Ten calls of which three are files: seven real-time calls, room for the eighth.
    assert p.decide("call", snap, active_calls=10, active_synthesize=0, bulk_calls=3) is None
    assert p.load(snap, active_calls=10, bulk_calls=3) == pytest.approx(0.7)
    assert p.decide("call", snap, active_calls=13, active_synthesize=0, bulk_calls=3) is not None


def test_a_call_that_declares_bulk_takes_spare_capacity_past_every_guard_but_the_ceiling() -> None:
    """``voxgate-pacing: bulk``: a file client is not refused because real-time callers fill
    the capacity, are near their latency limit, or are ramping up; the hard ceiling holds."""
    p = policy(ramp_doubling=True, capacity_calls=4)  # max_concurrent_calls=50
    hot = calm(final_p95_s=1.4, asr_utilisation=0.9, calls_mean=4.0)
    for refused_by in ("engine_capacity", "latency", "ramp"):
        snap = hot if refused_by != "ramp" else calm(calls=0, calls_mean=0.0, finals=0)
        active = 4 if refused_by == "engine_capacity" else 2
        refusal = p.decide("call", snap, active_calls=active, active_synthesize=0)
        assert refusal is not None and refusal.reason == refused_by, refused_by
        assert (
            p.decide("call", snap, active_calls=active, active_synthesize=0, declared_bulk=True)
            is None
        ), refused_by
    ceiling = p.decide("call", hot, active_calls=50, active_synthesize=0, declared_bulk=True)
    assert ceiling is not None and ceiling.reason == "max_concurrent_calls"


def test_unmeasured_load_may_at_most_double_per_window() -> None:
    """With slow start on, a burst of callers cannot get in before their cost is measured."""
    assert policy().ramp_limit(calm()) is None  # off by default
    p = policy(ramp_doubling=True, capacity_calls=100)
    idle = calm(calls=0, calls_mean=0.0, asr_utilisation=0.0, finals=0)
    assert p.ramp_limit(idle) == 2  # one call per worker to start with
    assert p.decide("call", idle, active_calls=1, active_synthesize=0) is None
    refusal = p.decide("call", idle, active_calls=2, active_synthesize=0)
    assert refusal is not None and refusal.reason == "ramp"
    assert "at most double per 5 s" in refusal.message
    grown = calm(calls=3, calls_mean=3.0, priced_utilisation=0.05)
    assert p.ramp_limit(grown) == 6
    assert p.decide("call", grown, active_calls=5, active_synthesize=0) is None
    assert p.decide("call", grown, active_calls=6, active_synthesize=0) is not None


def test_synthesis_has_its_own_capacity_and_ignores_recognition_load() -> None:
    p = policy()
    assert p.max_synthesize(calm(tts_threads=2)) == 12
    assert p.max_synthesize(calm(tts_threads=0)) == 1
    assert policy(max_synthesize_streams=8).max_synthesize(calm()) == 8
    # Recognition past every limit: a bot's reply is still synthesized.
    hot = calm(final_p95_s=9.0, asr_utilisation=1.0, calibrated_capacity=1)
    assert p.decide("synthesize", hot, active_calls=50, active_synthesize=3) is None
    # Replies of calls and Synthesize streams together fill it.
    full = calm(tts_streams=12)
    refusal = p.decide("synthesize", full, active_calls=0, active_synthesize=2)
    assert refusal is not None and refusal.reason == "synthesis"
    assert "max_synthesize_streams=12" in refusal.message
    assert p.decide("synthesize", calm(), active_calls=0, active_synthesize=12) is not None


# -- through a real server ---------------------------------------------------------------------


async def wait_for(condition: Callable[[], bool], what: str) -> None:
    """Poll a server-side condition (metrics have no change events), with a hang guard."""
    async with asyncio.timeout(HANG_S):
        while not condition():  # noqa: ASYNC110
            await asyncio.sleep(0.02)
    assert condition(), what


@asynccontextmanager
async def fake_asr_server(
    engine: FakeBatchEngine[AsrRequest, AsrResult], **overrides: Any
) -> AsyncIterator[tuple[GatewayServer, grpc.aio.Channel]]:
    over: dict[str, Any] = {
        "limits": {"max_realtime_factor": 1000.0},
        "session": {"speculative_finals": False},
        # These calls send their audio at once but stand for real-time callers here (the tests
        # are about the latency guard and the ladder, which read only real-time finals).
        "admission": {
            "window_s": 2.0,
            "sample_interval_s": 0.05,
            "retry_after_ms": 1500,
            "realtime_slack_ms": 600_000,
            "capacity_window_s": 2.0,
            "min_samples": 3,
        },
        "degrade": {"enabled": False},
    }
    for key, value in overrides.items():
        over[key] = {**over.get(key, {}), **value}
    hub = FakeBatchedAsrHub([engine])
    async with (
        running_server(hub=hub, **over) as srv,  # type: ignore[arg-type]
        grpc.aio.insecure_channel(srv.target) as ch,
    ):
        yield srv, ch


async def health(ch: grpc.aio.Channel, service: str) -> int:
    stub = health_pb2_grpc.HealthStub(ch)
    reply = await stub.Check(health_pb2.HealthCheckRequest(service=service))
    return int(reply.status)


def call_audio(speech_dir: Path) -> list[pb.ConverseRequest]:
    wav = sorted((speech_dir / "calls").glob("call_02*.wav"))[0]  # four utterances
    return [config(), *chunks(encode_wav(wav, pb.LINEAR16, 16000), 640)]


async def test_a_slow_recogniser_makes_the_server_refuse_new_calls_before_it_degrades(
    speech_dir: Path,
) -> None:
    engine: FakeBatchEngine[AsrRequest, AsrResult] = FakeBatchEngine(fake_result, delay_s=0.8)
    # The slow-start limit is off here: this is about the recogniser's measured latency.
    admission = {"refuse_at": 0.5, "ramp_doubling": False}
    async with fake_asr_server(engine, admission=admission) as (srv, ch):
        stub = pb_grpc.VoiceGatewayStub(ch)
        assert await health(ch, SERVICE_NAME) == health_pb2.HealthCheckResponse.SERVING
        # One call whose utterances queue behind a 0.8 s recogniser: finals take 0.8-3.2 s.
        first = asyncio.create_task(_collect(stub.Converse(requests(call_audio(speech_dir)))))
        await wait_for(lambda: srv.metrics.value("voxgate_load") == 1.0, "load reached 1")
        await wait_for(lambda: srv.full, "the monitor marked the replica full")
        assert await health(ch, SERVICE_NAME) == health_pb2.HealthCheckResponse.NOT_SERVING
        assert await health(ch, "") == health_pb2.HealthCheckResponse.SERVING  # alive

        refused = stub.Converse(requests([config()]))
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await _collect(refused)
        assert err.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        # Either guard may see it first: the slow finals, or one call using the whole engine.
        details = err.value.details() or ""
        assert "server is at capacity" in details and "retry in 1.5 s" in details
        trailers = dict(err.value.trailing_metadata() or ())
        assert trailers["grpc-retry-pushback-ms"] == "1500"
        status = status_pb2.Status.FromString(trailers["grpc-status-details-bin"])
        retry, quota = error_details_pb2.RetryInfo(), error_details_pb2.QuotaFailure()
        assert any(d.Unpack(retry) for d in status.details)
        assert any(d.Unpack(quota) for d in status.details)
        assert retry.retry_delay.ToMilliseconds() == 1500
        assert quota.violations[0].subject == "admission"
        refusals = [
            srv.metrics.value("voxgate_calls_refused_total", reason=reason)
            for reason in ("latency", "engine_capacity")
        ]
        assert sum(refusals) >= 1

        # The admitted call is not cut: every utterance gets its final.
        events = await asyncio.wait_for(first, HANG_S)
        assert len([e for e in events if e.WhichOneof("event") == "transcript"]) == 4

        # Fast again: once the slow finals leave the window the replica accepts again.
        engine.delay_s = 0.0
        await wait_for(lambda: not srv.full, "the replica accepts again")
        assert await health(ch, SERVICE_NAME) == health_pb2.HealthCheckResponse.SERVING
        events = await _collect(stub.Converse(requests(call_audio(speech_dir))))
        assert len([e for e in events if e.WhichOneof("event") == "transcript"]) == 4


async def test_a_file_client_that_says_bulk_is_admitted_where_a_caller_is_refused(
    speech_dir: Path,
) -> None:
    """A real server holding one real-time call at ``capacity_calls=1``: a second real-time
    call is refused, the same call with ``voxgate-pacing: bulk`` is admitted and transcribed
    whole, and a pacing value that is neither is INVALID_ARGUMENT, echoed cut short."""
    engine: FakeBatchEngine[AsrRequest, AsrResult] = FakeBatchEngine(fake_result, delay_s=0.8)
    admission = {"capacity_calls": 1, "ramp_doubling": False}
    async with fake_asr_server(engine, admission=admission) as (srv, ch):
        stub = pb_grpc.VoiceGatewayStub(ch)
        assert srv.servicer is not None
        servicer = srv.servicer
        first = asyncio.create_task(_collect(stub.Converse(requests(call_audio(speech_dir)))))
        await wait_for(lambda: servicer.calls.active_calls == 1, "the real-time call is in")

        with pytest.raises(grpc.aio.AioRpcError) as err:
            await _collect(stub.Converse(requests([config()])))
        assert err.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert "1 real-time calls in progress" in (err.value.details() or "")

        bulk = stub.Converse(
            requests(call_audio(speech_dir)), metadata=(("voxgate-pacing", "bulk"),)
        )
        events = await asyncio.wait_for(_collect(bulk), HANG_S)
        assert len([e for e in events if e.WhichOneof("event") == "transcript"]) == 4
        assert srv.metrics.value("voxgate_calls_refused_total", reason="engine_capacity") == 1

        bad = stub.Converse(requests([config()]), metadata=(("voxgate-pacing", "x" * 5000),))
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await _collect(bad)
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        details = err.value.details() or ""
        assert "'realtime' or 'bulk'" in details and "(5000 characters)" in details
        assert len(details) < 400

        events = await asyncio.wait_for(first, HANG_S)  # the caller was never disturbed
        assert len([e for e in events if e.WhichOneof("event") == "transcript"]) == 4


async def test_synthesize_is_admitted_against_its_own_limit(speech_dir: Path) -> None:
    engine: FakeBatchEngine[AsrRequest, AsrResult] = FakeBatchEngine(fake_result)
    voice = FakeToneSynthesizer(first_piece_delay_s=HANG_S)  # the first stream stays open
    hub = FakeBatchedAsrHub([engine], synthesizer=voice)
    over = {
        "admission": {"max_synthesize_streams": 1, "sample_interval_s": 0.05},
        "limits": {"max_realtime_factor": 1000.0},
    }
    async with (
        running_server(hub=hub, **over) as srv,  # type: ignore[arg-type]
        grpc.aio.insecure_channel(srv.target) as ch,
    ):
        stub = pb_grpc.VoiceGatewayStub(ch)
        assert srv.servicer is not None
        servicer = srv.servicer
        held = stub.Synthesize(pb.SynthesizeRequest(text="a long reply"))
        await held.initial_metadata()
        await wait_for(
            lambda: servicer.calls.active_synthesize == 1, "one Synthesize stream active"
        )
        second = stub.Synthesize(pb.SynthesizeRequest(text="another"))
        assert await second.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert "max_synthesize_streams=1" in (await second.details() or "")
        assert srv.metrics.value("voxgate_synthesize_refused_total", reason="synthesis") == 1
        # A call is not a Synthesize stream: it is admitted beside it.
        events = await _collect(stub.Converse(requests(call_audio(speech_dir))))
        assert len([e for e in events if e.WhichOneof("event") == "transcript"]) == 4
        held.cancel()
        await wait_for(lambda: servicer.calls.active_synthesize == 0, "the held stream ended")
        voice._first_delay_s = 0.0
        replies = [r async for r in stub.Synthesize(pb.SynthesizeRequest(text="now it fits"))]
        assert replies and replies[-1].is_last


async def test_the_ladder_sheds_under_latency_and_restores_when_calm(speech_dir: Path) -> None:
    engine: FakeBatchEngine[AsrRequest, AsrResult] = FakeBatchEngine(fake_result, delay_s=0.6)
    degrade = {
        "enabled": True,
        "latency_s": 0.3,
        "step_interval_s": 0.1,
        "restore_after_s": 0.3,
    }
    async with fake_asr_server(
        engine,
        degrade=degrade,
        # Past capacity whenever the fake recogniser works (the ladder sheds only then).
        admission={
            "enabled": False,
            "window_s": 1.0,
            "min_samples": 1,
            "target_utilisation": 0.2,
        },
    ) as (srv, ch):
        stub = pb_grpc.VoiceGatewayStub(ch)
        assert srv.servicer is not None
        servicer = srv.servicer
        task = asyncio.create_task(_collect(stub.Converse(requests(call_audio(speech_dir)))))
        await wait_for(lambda: servicer.quality.level == len(LADDER), "every step shed")
        assert srv.metrics.value("voxgate_degrade_level") == len(LADDER)
        # A call that starts now is told what it gets less of, before anything else.
        late = await _collect(stub.Converse(requests([config()])))
        kinds = [e.WhichOneof("event") for e in late]
        assert kinds[:2] == ["started", "quality_changed"]
        assert list(late[1].quality_changed.shed) == [s.name for s in LADDER]
        for step in (s.name for s in LADDER):
            assert srv.metrics.value("voxgate_degrade_steps_total", direction="shed", step=step)
        events = await asyncio.wait_for(task, HANG_S)
        # The call in progress heard every step as it was shed, in order.
        told = [list(e.quality_changed.shed) for e in events if e.HasField("quality_changed")]
        names = [s.name for s in LADDER]
        assert all(t == names[: len(t)] for t in told)  # always the ladder's order
        assert names in told
        # Requests queued after the encoder step carry the smaller margin.
        margins = {item.options.encoder_margin_ms for item in engine.items_seen}
        assert 500 in margins
        assert any(not item.options.word_timestamps for item in engine.items_seen)
        engine.delay_s = 0.0
        await wait_for(lambda: servicer.quality.level == 0, "every step restored")
        assert srv.metrics.value("voxgate_degrade_level") == 0
        assert srv.metrics.value(
            "voxgate_degrade_steps_total", direction="restore", step="interim_results"
        )


async def _collect(call: Any) -> list[pb.ConverseResponse]:
    return [r async for r in call]
