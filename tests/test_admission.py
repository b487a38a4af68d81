"""Admission from measured load: the pure pieces, then a real server that refuses in time.

The policy and the windowed views are checked exactly with readings passed in. The server tests
run a real grpc.aio server on loopback with a FAKE recogniser behind the REAL batcher
(``gateway.testing.batched``): its latency is what the test sets, so "the recogniser got slow"
is a fact of the test, not a hope about the machine. Waits are on events and metrics with
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

from engines.asr.base import AsrRequest, AsrResult
from gateway.admission import (
    AdmissionPolicy,
    LoadSampler,
    LoadSnapshot,
    WindowedHistogram,
    WindowedTotal,
)
from gateway.config import AdmissionConfig, LimitsConfig
from gateway.degrade import LADDER
from gateway.metrics import GatewayMetrics
from gateway.server import SERVICE_NAME, GatewayServer
from gateway.testing.batched import FakeBatchedAsrHub, fake_result
from gateway.testing.fake_engines import FakeBatchEngine, FakeToneSynthesizer
from gateway.testing.server import running_server
from voxgate.v1 import voxgate_pb2 as pb
from voxgate.v1 import voxgate_pb2_grpc as pb_grpc

pytestmark = pytest.mark.e2e

NAN = math.nan
#: A hang guard only.
HANG_S = 30.0


# -- windowed views ----------------------------------------------------------------------------


def test_windowed_histogram_sees_only_the_last_window() -> None:
    bounds = (0.1, 0.5, 1.0, math.inf)
    h = WindowedHistogram(window_s=10.0)
    h.add(0.0, bounds, (0, 0, 0, 0))
    assert math.isnan(h.quantile(0.95)) and h.count == 0
    h.add(5.0, bounds, (90, 95, 100, 100))  # 90 fast, 5 medium, 5 slow
    assert h.count == 100
    assert (h.quantile(0.5), h.quantile(0.95), h.quantile(0.99)) == (0.1, 0.5, 1.0)
    # The baseline is the newest reading at or before the window's start: at 12 s that is
    # still 0 s (the 5 s reading holds observations that may be younger than 2 s).
    h.add(12.0, bounds, (90, 95, 100, 100))
    assert h.count == 100
    h.add(16.0, bounds, (90, 95, 100, 100))  # nothing new since 5 s, now out of the window
    assert h.count == 0 and math.isnan(h.quantile(0.95))
    h.add(17.0, bounds, (90, 95, 100, 101))  # one observation past the last bucket
    assert h.quantile(0.95) == math.inf


def test_windowed_total_rate_and_mean() -> None:
    t = WindowedTotal(window_s=4.0)
    assert t.rate() == 0.0
    for now, total in [(0.0, 0.0), (1.0, 0.5), (2.0, 1.0), (3.0, 1.5), (4.0, 2.0), (5.0, 3.0)]:
        t.add(now, total)
    assert t.rate() == pytest.approx((3.0 - 0.5) / 4.0)  # baseline: the reading at 1.0 s
    assert t.mean() == pytest.approx((0.5 + 1.0 + 1.5 + 2.0 + 3.0) / 5)


def test_sampler_reads_what_the_server_measures() -> None:
    m = GatewayMetrics()
    m.engine_workers.labels("asr").set(2)
    m.engine_workers.labels("tts").set(4)
    sampler = LoadSampler(m, window_s=10.0)
    sampler.sample(0.0)
    m.calls_active.set(3)
    for latency in [0.2] * 19 + [2.5]:
        m.asr_final_latency.observe(latency)
    m.asr_queue_wait.observe(0.04)
    m.asr_busy.inc(8.0)  # 8 s of engine time in 10 s over 2 workers
    m.tts_streams_active.set(2)
    snap = sampler.sample(10.0)
    assert (snap.calls, snap.asr_workers, snap.tts_threads, snap.tts_streams) == (3, 2, 4, 2)
    assert snap.final_p95_s == 0.2 and snap.finals == 20  # 19 of 20 within 0.2 s
    assert snap.queue_wait_p95_s == 0.05
    assert snap.asr_utilisation == pytest.approx(0.4)
    assert snap.calls_mean == pytest.approx(1.5)  # 0 then 3


# -- the policy ----------------------------------------------------------------------------------


def policy(**over: Any) -> AdmissionPolicy:
    return AdmissionPolicy(AdmissionConfig(**over), LimitsConfig(max_concurrent_calls=50))


def calm(**over: Any) -> LoadSnapshot:
    base: dict[str, Any] = {
        "calls": 4,
        "calls_mean": 4.0,
        "asr_workers": 2,
        "asr_utilisation": 0.2,
        "final_p95_s": 0.3,
        "finals": 40,
        "queue_wait_p95_s": 0.02,
        "queue_waits": 40,
        "tts_threads": 4,
    }
    return LoadSnapshot(**{**base, **over})


def test_a_calm_replica_admits_and_reports_its_load() -> None:
    p = policy()
    assert p.decide("call", calm(), active_calls=4, active_synthesize=0) is None
    # 4 calls cost 0.2 of the engine: 0.05 each, 15 fit at 0.75 utilisation.
    assert p.capacity(calm()) == 15
    # The largest part: latency 0.3 s of the 0.7 s refusal point (capacity is 4/15).
    assert p.load(calm(), active_calls=4) == pytest.approx(0.43, abs=0.01)


def test_the_hard_ceiling_holds_with_admission_off() -> None:
    p = policy(enabled=False)
    hot = calm(final_p95_s=9.0)
    assert p.decide("call", hot, active_calls=49, active_synthesize=0) is None
    refusal = p.decide("call", hot, active_calls=50, active_synthesize=0)
    assert refusal is not None and refusal.reason == "max_concurrent_calls"
    assert "max_concurrent_calls=50" in refusal.message


@pytest.mark.parametrize(
    ("snap", "reason"),
    [
        (calm(final_p95_s=0.71), "latency"),  # over refuse_at 0.7 x budget 1.0
        (calm(final_p95_s=math.inf), "latency"),
        (calm(queue_wait_p95_s=0.31), "queue_wait"),
    ],
)
def test_recognition_pressure_refuses_before_the_budget_is_spent(
    snap: LoadSnapshot, reason: str
) -> None:
    p = policy(retry_after_ms=1500)
    refusal = p.decide("call", snap, active_calls=4, active_synthesize=0)
    assert refusal is not None and refusal.reason == reason
    assert refusal.retry_after_ms == 1500 and "retry in 1.5 s" in refusal.message
    assert p.load(snap, active_calls=4) == 1.0
    # Synthesize shares the CPU: it waits too while recognition is past its refusal point.
    assert p.decide("synthesize", snap, active_calls=4, active_synthesize=0) is not None


def test_the_capacity_estimate_refuses_the_call_that_would_not_fit() -> None:
    p = policy()
    snap = calm(calls=10, calls_mean=10.0, asr_utilisation=0.6)  # 0.06 a call: 12 fit
    assert p.capacity(snap) == 12
    assert p.decide("call", snap, active_calls=11, active_synthesize=0) is None
    refusal = p.decide("call", snap, active_calls=12, active_synthesize=0)
    assert refusal is not None and refusal.reason == "engine_capacity"
    assert "holds about 12" in refusal.message
    assert p.load(snap, active_calls=12) == 1.0
    assert p.load(snap, active_calls=6) < 1.0


@pytest.mark.parametrize(
    "snap",
    [
        calm(asr_utilisation=0.05),  # too little work to price a call
        calm(calls_mean=0.5),
        calm(asr_workers=0),  # no recogniser
    ],
)
def test_no_estimate_without_enough_measured_work(snap: LoadSnapshot) -> None:
    assert policy().capacity(snap) is None
    p = policy(ramp_doubling=False)
    assert p.decide("call", snap, active_calls=40, active_synthesize=0) is None


def test_unmeasured_load_may_at_most_double_per_window() -> None:
    """With slow start on, a burst of callers cannot get in before their cost is measured."""
    assert policy().ramp_limit(calm()) is None  # off by default
    p = policy(ramp_doubling=True)
    idle = calm(calls=0, calls_mean=0.0, asr_utilisation=0.0, finals=0, queue_waits=0)
    assert p.ramp_limit(idle) == 2  # one call per worker to start with
    assert p.decide("call", idle, active_calls=1, active_synthesize=0) is None
    refusal = p.decide("call", idle, active_calls=2, active_synthesize=0)
    assert refusal is not None and refusal.reason == "ramp"
    assert "at most double per 10 s" in refusal.message
    grown = calm(calls=3, calls_mean=3.0, asr_utilisation=0.05)  # still unpriced
    assert p.ramp_limit(grown) == 6
    assert p.decide("call", grown, active_calls=5, active_synthesize=0) is None
    assert p.decide("call", grown, active_calls=6, active_synthesize=0) is not None
    assert policy().ramp_limit(idle) is None


def test_no_finals_yet_is_not_pressure() -> None:
    snap = calm(final_p95_s=NAN, finals=0, queue_wait_p95_s=NAN, queue_waits=0)
    assert policy().decide("call", snap, active_calls=4, active_synthesize=0) is None


def test_one_slow_final_is_not_evidence_of_overload() -> None:
    """A lone caller's cold first decode must not lock the replica for a whole window."""
    snap = calm(final_p95_s=2.0, finals=2, queue_wait_p95_s=0.9, queue_waits=2)
    assert policy().decide("call", snap, active_calls=1, active_synthesize=0) is None
    assert policy().load(snap, active_calls=1) < 1.0
    slow = calm(final_p95_s=2.0, finals=3)
    assert policy().decide("call", slow, active_calls=1, active_synthesize=0) is not None


def test_synthesize_leaves_one_tts_thread_for_calls() -> None:
    p = policy()
    assert p.max_synthesize(calm(tts_threads=4)) == 3
    assert p.max_synthesize(calm(tts_threads=1)) == 1
    assert p.decide("synthesize", calm(), active_calls=0, active_synthesize=2) is None
    refusal = p.decide("synthesize", calm(), active_calls=0, active_synthesize=3)
    assert refusal is not None and refusal.reason == "synthesis"
    assert policy(max_synthesize_streams=8).max_synthesize(calm()) == 8


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
        "admission": {"window_s": 2.0, "sample_interval_s": 0.05, "retry_after_ms": 1500},
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
        await wait_for(lambda: servicer.active_synthesize == 1, "one Synthesize stream active")
        second = stub.Synthesize(pb.SynthesizeRequest(text="another"))
        assert await second.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert "max_synthesize_streams=1" in (await second.details() or "")
        assert srv.metrics.value("voxgate_synthesize_refused_total", reason="synthesis") == 1
        # A call is not a Synthesize stream: it is admitted beside it.
        events = await _collect(stub.Converse(requests(call_audio(speech_dir))))
        assert len([e for e in events if e.WhichOneof("event") == "transcript"]) == 4
        held.cancel()
        await wait_for(lambda: servicer.active_synthesize == 0, "the held stream ended")
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
        engine, degrade=degrade, admission={"enabled": False, "window_s": 1.0, "min_samples": 1}
    ) as (srv, ch):
        stub = pb_grpc.VoiceGatewayStub(ch)
        assert srv.servicer is not None
        servicer = srv.servicer
        task = asyncio.create_task(_collect(stub.Converse(requests(call_audio(speech_dir)))))
        await wait_for(lambda: servicer.quality.level == len(LADDER), "every step shed")
        assert srv.metrics.value("voxgate_degrade_level") == len(LADDER)
        for step in (s.name for s in LADDER):
            assert srv.metrics.value("voxgate_degrade_steps_total", direction="shed", step=step)
        await asyncio.wait_for(task, HANG_S)
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
