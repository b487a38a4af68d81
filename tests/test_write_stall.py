"""A client that stops reading is ended by ``limits.write_stall_timeout_s``, and only it.

The peer is a raw HTTP/2 client (tests/h2peer.py) with a 1 KiB window that reads nothing, against
a real server speaking a long reply with the bundled voice; grpc's own client would buffer the
reply for it and never stall the server.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Callable

import grpc
import pytest
from h2peer import H2Peer

from voxgate.gateway.config import load_config
from voxgate.gateway.runtime import build_hub
from voxgate.gateway.server import GatewayServer
from voxgate.gateway.testing.server import running_server
from voxgate.v1 import voxgate_pb2 as pb
from voxgate.v1 import voxgate_pb2_grpc as pb_grpc

pytestmark = [pytest.mark.e2e, pytest.mark.model]

STALL_S = 0.5
LONG_REPLY = " ".join(
    ["Thank you for calling; this reply is long on purpose, so that it fills any window."] * 6
)
#: 48 kHz LINEAR16 out: about 96 KB a second, past the peer's window within a second of audio.
HI_FI = pb.AudioFormat(encoding=pb.LINEAR16, sample_rate_hertz=48000)


@pytest.fixture
async def server() -> AsyncIterator[GatewayServer]:
    hub = build_hub(load_config(None, {"engines": "tts"}))
    async with running_server(hub, limits={"write_stall_timeout_s": STALL_S}) as srv:
        yield srv


async def until(check: Callable[[], bool], timeout_s: float = 30.0) -> None:
    end = time.monotonic() + timeout_s
    while not check():
        if time.monotonic() > end:
            raise AssertionError("condition not met in time")
        await asyncio.sleep(0.02)


async def well_behaved_speak(target: str) -> list[pb.ConverseResponse]:
    """A normal Converse call that says something short and hangs up after hearing it."""
    async with grpc.aio.insecure_channel(target) as ch:
        rpc = pb_grpc.VoiceGatewayStub(ch).Converse()
        await rpc.write(pb.ConverseRequest(config=pb.SessionConfig(input_audio=HI_FI)))
        await rpc.write(pb.ConverseRequest(speak=pb.Speak(text="Hello there.", speak_id="ok")))
        got: list[pb.ConverseResponse] = []
        while (msg := await rpc.read()) is not grpc.aio.EOF:
            got.append(msg)
            if msg.WhichOneof("event") == "playback_finished":
                await rpc.write(pb.ConverseRequest(hangup=pb.Hangup()))
                await rpc.done_writing()
        assert await rpc.code() == grpc.StatusCode.OK
        return got


async def test_converse_client_that_stops_reading_ends_deadline_exceeded(
    server: GatewayServer,
) -> None:
    servicer = server.servicer
    assert servicer is not None
    peer = await asyncio.to_thread(H2Peer, server.port, 1024)
    try:
        await asyncio.to_thread(
            peer.call,
            "Converse",
            [
                pb.ConverseRequest(config=pb.SessionConfig(input_audio=HI_FI)),
                pb.ConverseRequest(speak=pb.Speak(text=LONG_REPLY, speak_id="long")),
            ],
            False,  # the request stream stays open, as a live caller's does
        )
        await until(lambda: servicer.calls.active_calls == 1)
        # Another caller on its own connection is served while the stalled one waits.
        other = await well_behaved_speak(server.target)
        assert [m for m in other if m.WhichOneof("event") == "audio"]
        await until(lambda: servicer.calls.outcomes["deadline_exceeded"] == 1)
        await until(lambda: servicer.calls.active_calls == 0)
        assert server.metrics.value("voxgate_calls_active") == 0
        # Once the peer reads again, what it finds at the end is the deliberate status.
        end = await asyncio.to_thread(peer.drain)
    finally:
        peer.close()
    assert end.status == grpc.StatusCode.DEADLINE_EXCEEDED.value[0], end
    assert "write_stall_timeout_s=0.5" in end.details
    assert len(end.messages) >= 2  # SessionStarted and the audio sent before the stall
    first = pb.ConverseResponse.FromString(end.messages[0])
    assert first.WhichOneof("event") == "started"


async def test_synthesize_client_that_stops_reading_ends_deadline_exceeded(
    server: GatewayServer, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="voxgate.service")
    peer = await asyncio.to_thread(H2Peer, server.port, 1024)
    try:
        request = pb.SynthesizeRequest(text=LONG_REPLY, output_audio=HI_FI)
        await asyncio.to_thread(peer.call, "Synthesize", [request], True)
        await until(lambda: "write_stall_timeout_s" in caplog.text)
        end = await asyncio.to_thread(peer.drain)
    finally:
        peer.close()
    assert end.status == grpc.StatusCode.DEADLINE_EXCEEDED.value[0], end
    assert "write_stall_timeout_s=0.5" in end.details
    chunks = [pb.SynthesizeResponse.FromString(m) for m in end.messages]
    assert chunks and not chunks[-1].is_last  # cut mid-reply, not finished
    assert [c.sequence_number for c in chunks] == list(range(1, len(chunks) + 1))
