"""A real grpc.aio server on a loopback port: health, reflection, speech events, bad input."""

from __future__ import annotations

import asyncio
import re
from pathlib import Path

import grpc
import pytest
from calls import chunks, config, encode_wav, requests, truth
from google.rpc import error_details_pb2, status_pb2
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

from voxgate.gateway.testing.server import running_server
from voxgate.v1 import voxgate_pb2 as pb
from voxgate.v1 import voxgate_pb2_grpc as pb_grpc

pytestmark = pytest.mark.e2e

FAST = {"limits": {"max_realtime_factor": 1000.0}}


async def collect(stub_call: grpc.aio.StreamStreamCall) -> list[pb.ConverseResponse]:
    return [r async for r in stub_call]


async def expect_error(call: grpc.aio.StreamStreamCall) -> grpc.aio.AioRpcError:
    with pytest.raises(grpc.aio.AioRpcError) as info:
        while await call.read() is not grpc.aio.EOF:
            pass
    return info.value


async def read_all(call: grpc.aio.StreamStreamCall) -> list[pb.ConverseResponse]:
    out = []
    while (msg := await call.read()) is not grpc.aio.EOF:
        out.append(msg)
    return out


async def test_health_and_reflection_see_the_service() -> None:
    async with running_server() as srv, grpc.aio.insecure_channel(srv.target) as ch:
        health = health_pb2_grpc.HealthStub(ch)
        for name in ("", "voxgate.v1.VoiceGateway"):
            resp = await health.Check(health_pb2.HealthCheckRequest(service=name))
            assert resp.status == health_pb2.HealthCheckResponse.SERVING
        refl = reflection_pb2_grpc.ServerReflectionStub(ch)

        async def one() -> AsyncIterator_:
            yield reflection_pb2.ServerReflectionRequest(list_services="")

        services = set()
        async for r in refl.ServerReflectionInfo(one()):
            services |= {s.name for s in r.list_services_response.service}
        assert "voxgate.v1.VoiceGateway" in services
        assert "grpc.health.v1.Health" in services


AsyncIterator_ = object  # annotation helper for the nested generator above


@pytest.mark.parametrize(
    ("encoding", "rate", "chunk_ms"),
    [(pb.LINEAR16, 16000, 20), (pb.MULAW, 8000, 20)],
    ids=["linear16_16k", "mulaw_8k"],
)
async def test_calls_yield_one_begin_end_pair_per_utterance(
    speech_dir: Path, encoding: int, rate: int, chunk_ms: int
) -> None:
    wavs = sorted((speech_dir / "calls").glob("call_0*.wav"))
    assert len(wavs) == 3
    width = 2 if encoding == pb.LINEAR16 else 1
    size = rate * width * chunk_ms // 1000
    async with running_server(**FAST) as srv, grpc.aio.insecure_channel(srv.target) as ch:
        stub = pb_grpc.VoiceGatewayStub(ch)

        async def run(wav: Path) -> list[pb.ConverseResponse]:
            msgs = [config(encoding, rate), *chunks(encode_wav(wav, encoding, rate), size)]
            return await collect(stub.Converse(requests(msgs)))

        # The three calls run concurrently on one server: calls are isolated.
        results = await asyncio.gather(*(run(w) for w in wavs))
    for wav, resp in zip(wavs, results, strict=True):
        assert resp[0].WhichOneof("event") == "started"
        speech = [r.speech for r in resp if r.WhichOneof("event") == "speech"]
        begins = [s for s in speech if s.type == pb.SpeechEvent.SPEECH_BEGIN]
        ends = [s for s in speech if s.type == pb.SpeechEvent.SPEECH_END]
        gt = truth(wav)
        assert len(begins) == len(ends) == len(gt), (wav.name, speech)
        # Strict alternation begin/end with matching utterance indexes.
        assert [s.type for s in speech] == [
            pb.SpeechEvent.SPEECH_BEGIN,
            pb.SpeechEvent.SPEECH_END,
        ] * len(gt)
        for i, (t, b, e) in enumerate(zip(gt, begins, ends, strict=True)):
            assert b.utterance_index == e.utterance_index == i
            # The default model's measured worst (benchmarks/ear.py): begin 81 ms, end 304 ms
            # (a μ-law call whose truth is its excerpt edge minus 0.15 s); one frame of margin.
            assert abs(b.offset_ms - 1000 * t["speech_start_s"]) <= 250, (wav.name, i, b)
            assert abs(e.offset_ms - 1000 * t["speech_end_s"]) <= 325, (wav.name, i, e)


async def test_streaming_recognize_emits_speech_events_too(speech_dir: Path) -> None:
    wav = sorted((speech_dir / "calls").glob("call_02*.wav"))[0]
    async with running_server(**FAST) as srv, grpc.aio.insecure_channel(srv.target) as ch:
        stub = pb_grpc.VoiceGatewayStub(ch)
        msgs = [config(pb.ALAW, 8000), *chunks(encode_wav(wav, pb.ALAW, 8000), 160)]
        resp = await collect(stub.StreamingRecognize(requests(msgs)))
    speech = [r.speech for r in resp if r.WhichOneof("event") == "speech"]
    assert len(speech) == 2 * len(truth(wav))


# --- bad input ---------------------------------------------------------------------------------

BAD_CASES = [
    pytest.param(
        [pb.ConverseRequest(audio=pb.AudioChunk(data=b"\0\0"))],
        grpc.StatusCode.INVALID_ARGUMENT,
        "first ConverseRequest must carry `config`; got `audio`",
        id="first-not-config",
    ),
    pytest.param(
        [config(), config()],
        grpc.StatusCode.INVALID_ARGUMENT,
        "second `config`",
        id="second-config",
    ),
    pytest.param(
        [config(encoding=pb.ENCODING_UNSPECIFIED)],
        grpc.StatusCode.INVALID_ARGUMENT,
        "config.input_audio.encoding=ENCODING_UNSPECIFIED is not supported",
        id="unspecified-encoding",
    ),
    pytest.param(
        [config(encoding=42)],
        grpc.StatusCode.INVALID_ARGUMENT,
        "config.input_audio.encoding=42 is not supported",
        id="unknown-encoding",
    ),
    pytest.param(
        [config(rate=44100)],
        grpc.StatusCode.INVALID_ARGUMENT,
        "config.input_audio.sample_rate_hertz=44100 is not supported",
        id="unsupported-rate",
    ),
    pytest.param(
        [config(), pb.ConverseRequest(audio=pb.AudioChunk(data=b"\0\0\0"))],
        grpc.StatusCode.INVALID_ARGUMENT,
        "audio.data has 3 bytes; LINEAR16 needs an even byte count",
        id="odd-bytes",
    ),
    pytest.param(
        [config(), pb.ConverseRequest(audio=pb.AudioChunk(data=bytes(64_002)))],
        grpc.StatusCode.INVALID_ARGUMENT,
        "audio.data has 64002 bytes, over max_chunk_bytes=64000",
        id="oversized-chunk",
    ),
    pytest.param(
        [config(vad=pb.VadConfig(frame_ms=25))],
        grpc.StatusCode.INVALID_ARGUMENT,
        "frame_ms=25 is not supported",
        id="bad-vad-frame",
    ),
    pytest.param(
        [config(barge_in=pb.BargeInConfig(echo_handling=9))],  # type: ignore[arg-type]
        grpc.StatusCode.INVALID_ARGUMENT,
        "config.barge_in.echo_handling=9 is not an EchoHandling value",
        id="unknown-echo-handling",
    ),
    pytest.param(
        [config(), pb.ConverseRequest(speak=pb.Speak(text="hello"))],
        grpc.StatusCode.FAILED_PRECONDITION,
        "runs without a voice",
        id="speak-without-tts",
    ),
    pytest.param(
        [config(), pb.ConverseRequest(dtmf=pb.Dtmf(digit="x"))],
        grpc.StatusCode.INVALID_ARGUMENT,
        "dtmf.digit='x'",
        id="bad-dtmf",
    ),
    pytest.param(
        [config(), pb.ConverseRequest()],
        grpc.StatusCode.INVALID_ARGUMENT,
        "no event set",
        id="empty-request",
    ),
    pytest.param(
        [],
        grpc.StatusCode.INVALID_ARGUMENT,
        "ended before its first ConverseRequest",
        id="empty-stream",
    ),
]


@pytest.mark.parametrize(("msgs", "code", "text"), BAD_CASES)
async def test_bad_input_ends_only_that_call(
    speech_dir: Path, msgs: list[pb.ConverseRequest], code: grpc.StatusCode, text: str
) -> None:
    wav = sorted((speech_dir / "calls").glob("call_02*.wav"))[0]
    good_msgs = [config(pb.MULAW, 8000), *chunks(encode_wav(wav, pb.MULAW, 8000), 160)]
    async with running_server(**FAST) as srv, grpc.aio.insecure_channel(srv.target) as ch:
        stub = pb_grpc.VoiceGatewayStub(ch)
        good = asyncio.create_task(collect(stub.Converse(requests(good_msgs, 0.0005))))
        err = await expect_error(stub.Converse(requests(msgs)))
        assert err.code() == code
        assert text in (err.details() or "")
        good_resp = await good  # the concurrent call is unaffected
        speech = [r for r in good_resp if r.WhichOneof("event") == "speech"]
        assert len(speech) == 2 * len(truth(wav))
        # ... and the server still serves new calls.
        again = await collect(stub.Converse(requests([config()])))
        assert again[0].WhichOneof("event") == "started"


async def test_speak_on_streaming_recognize_is_refused() -> None:
    async with running_server() as srv, grpc.aio.insecure_channel(srv.target) as ch:
        stub = pb_grpc.VoiceGatewayStub(ch)
        msgs = [config(), pb.ConverseRequest(speak=pb.Speak(text="hi"))]
        err = await expect_error(stub.StreamingRecognize(requests(msgs)))
        assert err.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "not accepted on StreamingRecognize" in (err.details() or "")


async def test_audio_faster_than_real_time_is_resource_exhausted_with_quota_detail() -> None:
    async with (
        running_server(limits={"max_realtime_factor": 2.0, "burst_allowance_ms": 1000}) as srv,
        grpc.aio.insecure_channel(srv.target) as ch,
    ):
        stub = pb_grpc.VoiceGatewayStub(ch)
        # 2 s of audio in the first chunk: twice the 1 s burst allowance at once, so the quota
        # trips on that message whatever the machine's load. The client then writes nothing
        # more and reads the status: a write still in flight when the server's status arrives
        # fails locally with grpc core's INTERNAL and hides it (grpc/grpc#36066), which made a
        # stream of small writes racing the server's close flaky on a loaded machine.
        call = stub.Converse()
        reader = asyncio.create_task(expect_error(call))
        await call.write(config())
        (burst,) = chunks(bytes(64_000), 64_000)
        await call.write(burst)
        err = await reader
        assert err.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert "max_realtime_factor=2x" in (err.details() or "")
        trailers = await call.trailing_metadata()
        raw = dict(trailers or ())["grpc-status-details-bin"]
        status = status_pb2.Status.FromString(raw)
        quota = error_details_pb2.QuotaFailure()
        assert status.details[0].Unpack(quota)
        assert quota.violations[0].subject == "max_realtime_factor"


async def test_synthesize_without_a_voice_is_unimplemented_with_a_sentence() -> None:
    async with running_server() as srv, grpc.aio.insecure_channel(srv.target) as ch:
        stub = pb_grpc.VoiceGatewayStub(ch)
        with pytest.raises(grpc.aio.AioRpcError) as info:
            async for _ in stub.Synthesize(pb.SynthesizeRequest(text="hello")):
                pass
        assert info.value.code() == grpc.StatusCode.UNIMPLEMENTED
        assert "runs without a voice" in (info.value.details() or "")


async def test_over_capacity_is_resource_exhausted() -> None:
    async with (
        running_server(limits={"max_concurrent_calls": 1}) as srv,
        grpc.aio.insecure_channel(srv.target) as ch,
    ):
        stub = pb_grpc.VoiceGatewayStub(ch)
        hold = asyncio.Event()

        async def held() -> AsyncIterator_:
            yield config()
            await hold.wait()

        first = stub.Converse(held())
        assert (await first.read()).WhichOneof("event") == "started"
        err = await expect_error(stub.Converse(requests([config()])))
        assert err.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert "max_concurrent_calls=1" in (err.details() or "")
        hold.set()
        await read_all(first)


async def test_client_vanishing_mid_stream_cancels_only_its_call(speech_dir: Path) -> None:
    wav = sorted((speech_dir / "calls").glob("call_01*.wav"))[0]
    data = encode_wav(wav, pb.LINEAR16, 16000)
    async with running_server(**FAST) as srv, grpc.aio.insecure_channel(srv.target) as ch:
        stub = pb_grpc.VoiceGatewayStub(ch)
        other = asyncio.create_task(
            collect(stub.Converse(requests([config(), *chunks(data, 640)], 0.0005)))
        )
        doomed = stub.Converse(requests([config(), *chunks(data, 640)], 0.01))
        assert (await doomed.read()).WhichOneof("event") == "started"
        await asyncio.sleep(0.2)
        doomed.cancel()
        assert srv.servicer is not None
        for _ in range(200):  # the server notices the cancellation and tears the call down
            if srv.servicer.calls.active_calls <= 1:
                break
            await asyncio.sleep(0.01)
        resp = await other
        assert len([r for r in resp if r.WhichOneof("event") == "speech"]) == 12
        assert srv.servicer.calls.active_calls == 0
        assert srv.metrics.value("voxgate_calls_ended_total", outcome="cancelled") == 1


async def test_graceful_stop_refuses_new_calls_and_cancels_the_rest() -> None:
    async with running_server() as srv, grpc.aio.insecure_channel(srv.target) as ch:
        stub = pb_grpc.VoiceGatewayStub(ch)
        hold = asyncio.Event()

        async def held() -> AsyncIterator_:
            yield config()
            await hold.wait()

        call = stub.Converse(held())
        assert (await call.read()).WhichOneof("event") == "started"
        stopping = asyncio.create_task(srv.stop(grace_s=0.3))
        await asyncio.sleep(0.05)
        health = health_pb2_grpc.HealthStub(ch)
        resp = await health.Check(health_pb2.HealthCheckRequest(service=""))
        assert resp.status == health_pb2.HealthCheckResponse.NOT_SERVING
        refused = await expect_error(stub.Converse(requests([config()])))
        assert refused.code() == grpc.StatusCode.UNAVAILABLE
        assert "shutting down" in (refused.details() or "")
        # After the grace period the held call is cancelled server-side; clients see the
        # retryable UNAVAILABLE that grpc uses for calls cut by a server shutdown.
        err = await expect_error(call)
        assert err.code() == grpc.StatusCode.UNAVAILABLE
        await stopping
        hold.set()


def test_every_metric_is_documented_and_every_documented_metric_exists() -> None:
    """v0.1: deploy/README.md omitted two metrics and described utterances wrongly."""
    from voxgate.gateway.metrics import GatewayMetrics

    doc = (Path(__file__).resolve().parents[1] / "deploy" / "README.md").read_text()
    documented = {
        m.group(1): m.group(2)
        for m in re.finditer(r"^\| `(voxgate_\w+)(?:\{[^}]*\})?` \| (\w+) \|", doc, re.M)
    }
    exported = {}
    for family in GatewayMetrics().registry.collect():
        name = family.name + ("_total" if family.type == "counter" else "")
        exported[name] = family.type
    assert documented == exported
