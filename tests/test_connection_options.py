"""The HTTP/2 keepalive and connection-lifetime settings reach the real server and behave.

- ``max_connection_idle_s`` closes a connection without calls (the client's channel goes IDLE);
- ``max_connection_age_s`` sends GOAWAY but, with the default grace, never cuts a call in
  progress, while an explicit short grace does (so the option really is applied);
- ``keepalive_*`` closes the connection of a peer that stops answering pings, and its call ends.

The voice is the fake tone (voxgate.gateway.testing): what is under test is the transport.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

import grpc
import pytest
from h2peer import H2Peer

from voxgate.gateway.config import load_config
from voxgate.gateway.server import connection_options
from voxgate.gateway.testing.fake_engines import FakeToneHub
from voxgate.gateway.testing.server import running_server
from voxgate.v1 import voxgate_pb2 as pb
from voxgate.v1 import voxgate_pb2_grpc as pb_grpc

pytestmark = pytest.mark.e2e

PCM = pb.AudioFormat(encoding=pb.LINEAR16, sample_rate_hertz=16000)
#: 3 s of fake tone (100 ms per character), paced at real time by the session.
THREE_SECONDS = "x" * 30


async def until(check: Callable[[], bool], timeout_s: float = 30.0) -> None:
    end = time.monotonic() + timeout_s
    while not check():
        if time.monotonic() > end:
            raise AssertionError("condition not met in time")
        await asyncio.sleep(0.02)


async def state_after(channel: grpc.aio.Channel, seconds: float) -> grpc.ChannelConnectivity:
    """The channel's state once ``seconds`` have passed, or as soon as it leaves READY."""
    state = channel.get_state()
    end = time.monotonic() + seconds
    while state is grpc.ChannelConnectivity.READY and time.monotonic() < end:
        try:
            await asyncio.wait_for(channel.wait_for_state_change(state), end - time.monotonic())
        except TimeoutError:
            break
        state = channel.get_state()
    return state


async def speak_call(stub: pb_grpc.VoiceGatewayStub) -> tuple[grpc.StatusCode, int]:
    """A Converse call that plays 3 s of audio and hangs up; its status and audio ms."""
    rpc = stub.Converse()
    await rpc.write(pb.ConverseRequest(config=pb.SessionConfig(input_audio=PCM)))
    await rpc.write(pb.ConverseRequest(speak=pb.Speak(text=THREE_SECONDS, speak_id="s")))
    audio_ms = 0
    try:
        while (msg := await rpc.read()) is not grpc.aio.EOF:
            if msg.WhichOneof("event") == "audio":
                audio_ms += len(msg.audio.data) // 32
            if msg.WhichOneof("event") == "playback_finished":
                await rpc.write(pb.ConverseRequest(hangup=pb.Hangup()))
                await rpc.done_writing()
    except grpc.aio.AioRpcError:
        pass
    return await rpc.code(), audio_ms


@pytest.mark.unit
def test_defaults_are_long_call_friendly() -> None:
    opts = dict(connection_options(load_config(None, {})))
    assert opts["grpc.keepalive_time_ms"] == 30_000
    # gRPC core waits for ping acks by ping_timeout_ms; without it keepalive_timeout is moot.
    assert opts["grpc.http2.ping_timeout_ms"] == opts["grpc.keepalive_timeout_ms"] == 20_000
    assert opts["grpc.keepalive_permit_without_calls"] == 1
    assert opts["grpc.http2.max_pings_without_data"] == 0
    # The age grace outlasts the longest call (4 h by default) so age never cuts a call.
    assert opts["grpc.max_connection_age_grace_ms"] > 4 * 3600 * 1000
    unlimited = load_config(None, {"limits": {"max_call_duration_s": 0}})
    assert dict(connection_options(unlimited))["grpc.max_connection_age_grace_ms"] == 2**31 - 1
    off = load_config(None, {"server": {"max_connection_age_s": 0, "max_connection_idle_s": 0}})
    assert dict(connection_options(off))["grpc.max_connection_age_ms"] == 2**31 - 1


async def test_an_idle_connection_is_closed_after_max_connection_idle() -> None:
    async with (
        running_server(FakeToneHub(), server={"max_connection_idle_s": 0.5}) as short,
        running_server(FakeToneHub()) as default,
        grpc.aio.insecure_channel(short.target) as a,
        grpc.aio.insecure_channel(default.target) as b,
    ):
        await pb_grpc.VoiceGatewayStub(a).ListVoices(pb.ListVoicesRequest())
        await pb_grpc.VoiceGatewayStub(b).ListVoices(pb.ListVoicesRequest())
        assert a.get_state() is grpc.ChannelConnectivity.READY
        # The GOAWAY for idleness sends the channel back to IDLE (it reconnects on use).
        assert await state_after(a, 20.0) is grpc.ChannelConnectivity.IDLE
        assert await state_after(b, 1.5) is grpc.ChannelConnectivity.READY
        reply = await pb_grpc.VoiceGatewayStub(a).ListVoices(pb.ListVoicesRequest())
        assert reply.voices


async def test_connection_age_never_cuts_a_call_with_the_default_grace() -> None:
    async with (
        running_server(FakeToneHub(), server={"max_connection_age_s": 0.5}) as srv,
        grpc.aio.insecure_channel(srv.target) as ch,
    ):
        stub = pb_grpc.VoiceGatewayStub(ch)
        long_call = asyncio.create_task(speak_call(stub))
        await asyncio.sleep(1.5)  # past the age (and its jitter): GOAWAY has been sent
        # New calls still work meanwhile (on a new connection).
        assert (await stub.ListVoices(pb.ListVoicesRequest())).voices
        code, audio_ms = await long_call
    assert code is grpc.StatusCode.OK
    assert audio_ms >= 2980  # every frame of the 3 s reply arrived


async def test_a_short_age_grace_does_cut_the_call_so_the_options_are_applied() -> None:
    server = {"max_connection_age_s": 0.5, "max_connection_age_grace_s": 0.5}
    async with running_server(FakeToneHub(), server=server) as srv:
        async with grpc.aio.insecure_channel(srv.target) as ch:
            code, audio_ms = await speak_call(pb_grpc.VoiceGatewayStub(ch))
        assert srv.servicer is not None
        await until(lambda: srv.servicer is not None and srv.servicer.calls.active_calls == 0)
    assert code is grpc.StatusCode.UNAVAILABLE
    assert audio_ms < 2980


async def test_keepalive_closes_the_connection_of_a_peer_that_stopped_answering() -> None:
    server = {"keepalive_time_s": 1.0, "keepalive_timeout_s": 1.0}
    limits = {"idle_timeout_s": 0, "write_stall_timeout_s": 0}
    async with running_server(FakeToneHub(), server=server, limits=limits) as srv:
        servicer = srv.servicer
        assert servicer is not None
        peer = await asyncio.to_thread(H2Peer, srv.port)
        try:
            config = pb.ConverseRequest(config=pb.SessionConfig(input_audio=PCM))
            await asyncio.to_thread(peer.call, "Converse", [config], False)
            await until(lambda: servicer.calls.active_calls == 1)
            # The peer never reads, so it never answers the server's pings: after about
            # keepalive_time + keepalive_timeout the server drops the connection and the call.
            await until(lambda: servicer.calls.active_calls == 0)
        finally:
            peer.close()
        assert servicer.calls.outcomes["cancelled"] == 1
