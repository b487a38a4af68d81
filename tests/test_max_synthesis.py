"""``limits.max_synthesis_s``: a reply longer than the limit is cut exactly there, and said so.

The cut itself is checked on scripted pieces (unit); the two RPCs are checked on a real server
with the bundled voice (Synthesize: the audio then INVALID_ARGUMENT; Converse: the audio, an
ErrorEvent for that Speak, PlaybackFinished at the limit, and the call goes on).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import grpc
import numpy as np
import pytest

from voxgate.gateway.base import TtsPiece
from voxgate.gateway.config import load_config
from voxgate.gateway.runtime import build_hub
from voxgate.gateway.server import GatewayServer
from voxgate.gateway.session import SynthesisCap
from voxgate.gateway.testing.server import running_server
from voxgate.v1 import voxgate_pb2 as pb
from voxgate.v1 import voxgate_pb2_grpc as pb_grpc

MAX_S = 1.5
LONG = "This answer goes on for much longer than the server lets one reply play. " * 3
PCM16K = pb.AudioFormat(encoding=pb.LINEAR16, sample_rate_hertz=16000)


async def pieces(sizes: list[int]) -> AsyncIterator[TtsPiece]:
    """Pieces of a 1 kHz "voice" (one sample a millisecond) with a word ending every 100 ms."""
    at = 0
    for i, n in enumerate(sizes):
        lo, at = at, at + n
        words = tuple((f"w{ms}", ms) for ms in range(100, at + 1, 100) if ms > lo)
        yield TtsPiece(np.zeros(n, np.float32), words, i == len(sizes) - 1)


async def take(cap: SynthesisCap, sizes: list[int]) -> list[TtsPiece]:
    return [p async for p in cap.apply(pieces(sizes))]


@pytest.mark.unit
async def test_cap_cuts_at_the_exact_sample_and_keeps_only_words_that_ended() -> None:
    cap = SynthesisCap(0.25, 1000)  # 250 samples at a 1 kHz "voice"
    got = await take(cap, [100, 100, 100, 100])
    assert [len(p.samples) for p in got] == [100, 100, 50]
    assert got[-1].is_last and cap.cut
    assert [w for p in got for w in p.words] == [("w100", 100), ("w200", 200)]
    assert "max_synthesis_s=0.25" in cap.message("text")


@pytest.mark.unit
async def test_cap_leaves_a_reply_that_ends_on_the_limit_alone() -> None:
    exact = SynthesisCap(0.2, 1000)
    got = await take(exact, [100, 100])
    assert [len(p.samples) for p in got] == [100, 100] and not exact.cut
    # Reaching the limit with more to come is a cut, though nothing more of it is played.
    more = SynthesisCap(0.2, 1000)
    got = await take(more, [100, 100, 100])
    assert [len(p.samples) for p in got] == [100, 100] and got[-1].is_last and more.cut


@pytest.mark.unit
async def test_cap_closes_the_voice_stream_at_the_cut() -> None:
    closed = asyncio.Event()

    async def endless() -> AsyncIterator[TtsPiece]:
        try:
            while True:
                yield TtsPiece(np.zeros(100, np.float32), (), False)
        finally:
            closed.set()

    cap = SynthesisCap(0.35, 1000)
    got = [p async for p in cap.apply(endless())]
    assert sum(len(p.samples) for p in got) == 350 and cap.cut
    assert closed.is_set()  # no synthesis goes on past the cut


@pytest.fixture
async def server() -> AsyncIterator[GatewayServer]:
    hub = build_hub(load_config(None, {"engines": "tts"}))
    async with running_server(hub, limits={"max_synthesis_s": MAX_S}) as srv:
        yield srv


@pytest.mark.e2e
@pytest.mark.model
async def test_synthesize_past_the_limit_gives_the_audio_up_to_it_then_invalid_argument(
    server: GatewayServer,
) -> None:
    async with grpc.aio.insecure_channel(server.target) as ch:
        stub = pb_grpc.VoiceGatewayStub(ch)
        rpc = stub.Synthesize(pb.SynthesizeRequest(text=LONG, output_audio=PCM16K))
        chunks = [m async for m in _read_until_error(rpc)]
        assert await rpc.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "max_synthesis_s=1.5" in (await rpc.details() or "")
        samples = sum(len(c.data) for c in chunks) // 2
        assert abs(samples - MAX_S * 16000) <= 16, samples  # within 1 ms (resampler edge)
        assert chunks[-1].is_last and not any(c.is_last for c in chunks[:-1])
        # A reply within the limit is untouched.
        short = stub.Synthesize(pb.SynthesizeRequest(text="Hello.", output_audio=PCM16K))
        ok = [m async for m in short]
        assert await short.code() == grpc.StatusCode.OK and ok[-1].is_last


@pytest.mark.e2e
@pytest.mark.model
async def test_converse_speak_past_the_limit_is_cut_with_an_error_event_and_the_call_goes_on(
    server: GatewayServer,
) -> None:
    async with grpc.aio.insecure_channel(server.target) as ch:
        rpc = pb_grpc.VoiceGatewayStub(ch).Converse()
        await rpc.write(pb.ConverseRequest(config=pb.SessionConfig(input_audio=PCM16K)))
        await rpc.write(pb.ConverseRequest(speak=pb.Speak(text=LONG, speak_id="long")))
        await rpc.write(pb.ConverseRequest(speak=pb.Speak(text="Bye.", speak_id="bye")))
        got: list[pb.ConverseResponse] = []
        while (msg := await rpc.read()) is not grpc.aio.EOF:
            got.append(msg)
            if msg.WhichOneof("event") == "playback_finished" and (
                msg.playback_finished.speak_id == "bye"
            ):
                await rpc.write(pb.ConverseRequest(hangup=pb.Hangup()))
                await rpc.done_writing()
        assert await rpc.code() == grpc.StatusCode.OK
    kinds = [m.WhichOneof("event") for m in got]
    long_audio = [m.audio for m in got if m.WhichOneof("event") == "audio"]
    long_audio = [a for a in long_audio if a.speak_id == "long"]
    assert abs(sum(len(a.data) for a in long_audio) // 2 - MAX_S * 16000) <= 16
    assert long_audio[-1].is_last
    errors = [m.error for m in got if m.WhichOneof("event") == "error"]
    assert [(e.code, e.scope, e.speak_id) for e in errors] == [(3, "speak", "long")]
    assert "max_synthesis_s=1.5" in errors[0].message
    finished = {
        m.playback_finished.speak_id: m.playback_finished.duration_ms
        for m in got
        if m.WhichOneof("event") == "playback_finished"
    }
    assert abs(finished["long"] - 1500) <= 20 and "bye" in finished
    # The error comes after the cut reply's audio and before its PlaybackFinished.
    error_at = kinds.index("error")
    assert got[error_at - 1].audio.is_last


async def _read_until_error(
    rpc: grpc.aio.UnaryStreamCall,  # type: ignore[type-arg]
) -> AsyncIterator[pb.SynthesizeResponse]:
    try:
        async for m in rpc:
            yield m
    except grpc.aio.AioRpcError:
        return
