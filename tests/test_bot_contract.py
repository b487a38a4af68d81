"""The bot contract: serve_bot, BotLink and the bad-bot policy, over real gRPC on loopback.

Every test runs a real in-process gateway (grpc.aio on a loopback port) with the FAKE tone
voice (FakeToneHub: 100 ms of tone per character, so replies have exact, short durations; it
is never evidence that speech synthesis works), a real gateway call opened with
``VoxgateClient.converse`` as a bridge opens it, and bots served by ``serve_bot`` on loopback
(or, where the test says so, in-process handlers). The misbehaving bots are real gRPC servers
that misbehave: a closed port, a handler that never answers, one that raises mid-call, one that
sends an absurd speak or an empty action.
"""

from __future__ import annotations

import asyncio
import contextlib
import io
import logging
import socket
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import grpc
import pytest

from voxgate.bridges.bots import EchoBot, RuleBot, load_bot
from voxgate.bridges.sip import BridgeConfig, SipBridge
from voxgate.bridges.sip.testing import RtpPeer, run_sipp
from voxgate.cli.call import CallOptions, play_call
from voxgate.gateway.testing.fake_engines import FakeToneHub
from voxgate.gateway.testing.server import running_server
from voxgate_client import (
    AudioOut,
    BotLink,
    BotPolicy,
    Call,
    CallConfig,
    CallInfo,
    Dtmf,
    LinkOutcome,
    MarkReached,
    PlaybackFinished,
    ServedCall,
    ServerEvent,
    SessionStarted,
    TransferError,
    TransferResult,
    VoiceCall,
    VoxgateClient,
    sample_call_path,
    serve_bot,
)
from voxgate_client._proto import voxgate_pb2 as pb

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(120)]

SIPP_DIR = Path(__file__).parent / "sipp"

#: Short fallback: 0.6 s of fake tone.
POLICY = BotPolicy(answer_timeout_s=1.0, fallback_speech="sorry!", fallback_timeout_s=10.0)


@asynccontextmanager
async def gateway() -> AsyncIterator[VoxgateClient]:
    async with (
        running_server(hub=FakeToneHub()) as srv,
        VoxgateClient(srv.target) as client,
    ):
        yield client


async def open_call(client: VoxgateClient, call_id: str) -> Call:
    return await client.converse(CallConfig(encoding="mulaw", sample_rate_hz=8000, call_id=call_id))


class Tee:
    """The bridge's view: every gateway event the link tees out, in order."""

    def __init__(self) -> None:
        self.events: list[ServerEvent] = []
        self.changed = asyncio.Event()

    def __call__(self, ev: ServerEvent) -> None:
        self.events.append(ev)
        self.changed.set()

    async def until(self, pred: Any) -> None:
        while not pred():
            self.changed.clear()
            await self.changed.wait()

    def finished(self) -> list[str]:
        return [e.speak_id for e in self.events if isinstance(e, PlaybackFinished)]

    def audio_ids(self) -> set[str]:
        return {e.speak_id for e in self.events if isinstance(e, AudioOut)}


async def link_call(
    client: VoxgateClient,
    bot: Any,
    *,
    call_id: str = "c1",
    info: CallInfo | None = None,
    policy: BotPolicy = POLICY,
    transfer: Any = None,
) -> tuple[LinkOutcome, Tee]:
    call = await open_call(client, call_id)
    tee = Tee()
    async with call:
        link = BotLink(
            call,
            bot,
            info or CallInfo(call_id=call_id, channel="sip", transfer_supported=True),
            on_event=tee,
            policy=policy,
            transfer=transfer,
        )
        outcome = await asyncio.wait_for(link.run(), 60)
    return outcome, tee


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def greet_and_leave(call: VoiceCall) -> None:
    """The same handler for every door: greet, wait for the greeting to play, hang up."""
    sid = await call.speak("hi there")
    async for ev in call:
        if isinstance(ev, PlaybackFinished) and ev.speak_id == sid:
            await call.hangup()


def bot_warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [
        r.getMessage()
        for r in caplog.records
        if r.name == "voxgate.bot" and r.levelno >= logging.WARNING
    ]


# -- the contract ----------------------------------------------------------------------------------


async def test_a_served_bot_greets_hears_events_and_hangs_up() -> None:
    seen: list[Any] = []

    async def bot(call: VoiceCall) -> None:
        seen.append(call.info)
        seen.append(call.session)
        assert isinstance(call, ServedCall)
        await call.dtmf("7")  # into the call; the gateway echoes it back as an event
        await call.mark("m1")
        sid = await call.speak("hello")
        async for ev in call:
            seen.append(ev)
            if isinstance(ev, PlaybackFinished) and ev.speak_id == sid:
                await call.hangup()

    async with gateway() as client, await serve_bot(bot) as server:
        info = CallInfo(
            call_id="sip-1",
            from_uri="sip:alice@example.com",
            to_uri="sip:bot@example.com",
            channel="sip",
            headers={"User-Agent": "test"},
            transfer_supported=True,
        )
        outcome, tee = await link_call(client, server.address, info=info)
    assert outcome == LinkOutcome("bot hung up")
    got_info = seen[0]
    assert got_info.from_uri == "sip:alice@example.com" and got_info.channel == "sip"
    assert dict(got_info.headers) == {"User-Agent": "test"}
    assert isinstance(seen[1], SessionStarted) and seen[1].voice == "tone"
    events = seen[2:]
    assert isinstance(events[0], SessionStarted)  # iteration starts with it, as on converse()
    assert any(isinstance(e, MarkReached) and e.name == "m1" for e in events)
    assert any(isinstance(e, Dtmf) and e.digit == "7" for e in events)
    assert not any(isinstance(e, AudioOut) for e in events)  # only the bridge plays audio
    # The bridge saw everything, the audio included, and the reply played to its end.
    assert len(tee.finished()) == 1 and tee.audio_ids() == set(tee.finished())
    assert server.calls == 1


async def test_the_same_handler_answers_a_direct_converse_call() -> None:
    async with gateway() as client:
        call = await open_call(client, "direct")
        async with call:
            await asyncio.wait_for(greet_and_leave(call), 30)
            assert call.info.channel == "converse" and call.info.call_id == "direct"
            assert await call.error() is None


async def test_transfer_is_precisely_unsupported_on_converse_and_media_streams() -> None:
    results: list[Any] = []

    async def bot(call: VoiceCall) -> None:
        try:
            await call.transfer("sip:agent@example.com")
        except TransferError as exc:
            results.append((exc.code, exc.message))
        await call.hangup()

    async with gateway() as client:
        call = await open_call(client, "direct")
        async with call:
            await bot(call)
        async with await serve_bot(bot) as server:
            info = CallInfo(call_id="ms", channel="media_stream", transfer_supported=False)
            outcome, _ = await link_call(client, server.address, info=info)
    assert outcome.reason == "bot hung up"
    assert results == [
        (grpc.StatusCode.UNIMPLEMENTED, "transfer is not supported on a converse call"),
        (grpc.StatusCode.UNIMPLEMENTED, "transfer is not supported on a media_stream call"),
    ]


async def test_a_transfer_goes_through_the_bridge_hook_and_ends_the_bot_leg() -> None:
    asked: list[str] = []
    got: list[TransferResult] = []

    async def hook(uri: str) -> TransferResult:
        asked.append(uri)
        if uri.startswith("sip:busy"):
            return TransferResult("", grpc.StatusCode.FAILED_PRECONDITION, "Busy Here", 486)
        return TransferResult("", grpc.StatusCode.OK, "OK", 200)

    async def bot(call: VoiceCall) -> None:
        try:
            await call.transfer("sip:busy@example.com")
        except TransferError as exc:
            got.append(exc.result)
        got.append(await call.transfer("sip:agent@example.com"))
        async for _ in call:
            pass

    async with gateway() as client, await serve_bot(bot) as server:
        outcome, _ = await link_call(client, server.address, transfer=hook)
    assert asked == ["sip:busy@example.com", "sip:agent@example.com"]
    assert [(r.code, r.sip_status) for r in got] == [
        (grpc.StatusCode.FAILED_PRECONDITION, 486),
        (grpc.StatusCode.OK, 200),
    ]
    assert outcome == LinkOutcome("transferred", None, "sip:agent@example.com")


async def test_in_process_handlers_run_on_the_same_contract() -> None:
    rules = RuleBot.from_dict({"greeting": "hey", "dtmf": {"5": "five"}})
    async with gateway() as client:
        call = await open_call(client, "local")
        tee = Tee()
        async with call:
            link = BotLink(call, rules, CallInfo(call_id="local"), on_event=tee, policy=POLICY)
            task = asyncio.create_task(link.run())
            await call.dtmf("5")  # the bridge sends the key; the gateway echoes it to the bot
            await asyncio.wait_for(tee.until(lambda: len(tee.finished()) >= 2), 30)
            await call.hangup()
            outcome = await asyncio.wait_for(task, 30)
    assert outcome == LinkOutcome("gateway ended")
    assert len(tee.audio_ids()) == 2
    assert isinstance(load_bot("echo"), EchoBot)


# -- bad bots --------------------------------------------------------------------------------------


async def _with_a_good_call_beside(client: VoxgateClient, bad: Any, **kw: Any) -> LinkOutcome:
    """The bad bot's call and a good bot's call at once: the good one must be untouched."""
    async with await serve_bot(greet_and_leave) as good:
        (outcome, tee), (good_outcome, good_tee) = await asyncio.gather(
            link_call(client, bad, call_id="bad", **kw),
            link_call(client, good.address, call_id="good"),
        )
    assert good_outcome == LinkOutcome("bot hung up")
    assert len(good_tee.finished()) == 1
    # The caller of the bad bot heard the fallback speech to its end, then was hung up.
    assert any(s.startswith("fallback-") for s in tee.finished()), tee.finished()
    return outcome


async def test_a_bot_that_is_down(caplog: pytest.LogCaptureFixture) -> None:
    async with gateway() as client:
        outcome = await _with_a_good_call_beside(client, f"127.0.0.1:{free_port()}")
    assert outcome.bot_fault == "down"
    [line] = bot_warnings(caplog)
    assert "call bad: bot 127.0.0.1:" in line and " down: UNAVAILABLE" in line
    assert "fallback speech, then hangup" in line


async def test_a_bot_that_never_answers(caplog: pytest.LogCaptureFixture) -> None:
    async def stuck(call: VoiceCall) -> None:
        await asyncio.Event().wait()  # e.g. a cold LLM: never listens, never speaks

    async with gateway() as client, await serve_bot(stuck) as server:
        outcome = await _with_a_good_call_beside(client, server.address)
    assert outcome.bot_fault == "slow"
    [line] = bot_warnings(caplog)
    assert "slow: no answer within 1 s" in line


async def test_a_bot_that_crashes_mid_call(caplog: pytest.LogCaptureFixture) -> None:
    async def crashes(call: VoiceCall) -> None:
        await call.speak("ok")
        async for ev in call:
            if isinstance(ev, PlaybackFinished):
                raise RuntimeError("bug in the bot")

    async with gateway() as client, await serve_bot(crashes) as server:
        outcome = await _with_a_good_call_beside(client, server.address)
    assert outcome.bot_fault == "crashed"
    [line] = bot_warnings(caplog)
    assert "crashed: INTERNAL: the bot's handler failed (RuntimeError)" in line


async def test_a_bot_process_that_dies_mid_call(caplog: pytest.LogCaptureFixture) -> None:
    server_box: list[Any] = []

    async def dies(call: VoiceCall) -> None:
        await call.speak("ok")
        async for ev in call:
            if isinstance(ev, PlaybackFinished):
                asyncio.get_running_loop().create_task(server_box[0].aclose(0))

    async with gateway() as client:
        server = await serve_bot(dies)
        server_box.append(server)
        outcome = await _with_a_good_call_beside(client, server.address)
    assert outcome.bot_fault == "crashed"
    assert len(bot_warnings(caplog)) == 1


@pytest.mark.parametrize("garbage", ["absurd speak", "empty action", "config request"])
async def test_a_bot_that_sends_garbage(caplog: pytest.LogCaptureFixture, garbage: str) -> None:
    async def sends_garbage(call: VoiceCall) -> None:
        assert isinstance(call, ServedCall)
        if garbage == "absurd speak":
            await call.speak("la " * 100_000)
        elif garbage == "empty action":
            await call._send(pb.BotAction())
        else:
            await call._request(pb.ConverseRequest(config=pb.SessionConfig()))
        async for _ in call:
            pass

    async with gateway() as client, await serve_bot(sends_garbage) as server:
        outcome = await _with_a_good_call_beside(client, server.address)
    assert outcome.bot_fault == "garbage"
    [line] = bot_warnings(caplog)
    assert "garbage: " in line
    assert "la la" not in line and len(line) < 300  # never the bot's text itself


async def test_the_fallback_can_transfer_instead_of_hanging_up() -> None:
    asked: list[str] = []

    async def hook(uri: str) -> TransferResult:
        asked.append(uri)
        return TransferResult("", grpc.StatusCode.OK, "OK", 200)

    policy = BotPolicy(
        answer_timeout_s=1.0,
        fallback_speech="one moment",
        then="transfer",
        transfer_to="sip:queue@example.com",
    )
    async with gateway() as client:
        outcome, tee = await link_call(
            client, f"127.0.0.1:{free_port()}", policy=policy, transfer=hook
        )
    assert outcome.bot_fault == "down"
    assert asked == ["sip:queue@example.com"]
    assert any(s.startswith("fallback-") for s in tee.finished())


async def test_voxgate_call_hands_its_call_to_an_external_bot(tmp_path: Path) -> None:
    """``voxgate call --bot grpc://…``: the CLI is one more door on the same link."""
    out = io.StringIO()
    async with gateway() as client, await serve_bot(greet_and_leave) as server:
        result = await play_call(
            CallOptions(
                file=Path(sample_call_path()),
                target=client.target,
                bot=f"grpc://{server.address}",
                mulaw=True,
                wait_for_bot="end",
            ),
            stream=out,
        )
    text = out.getvalue()
    assert result.exit_code == 0, text
    assert [t for _, t in result.replies] == ["hi there"]
    assert 'bot: "hi there"' in text and "bot finished speaking" in text
    # The caller waited for the greeting before it spoke (--wait-for-bot end).
    first_audio = next(t for t, _ in result.log.sent) if result.log else 0.0
    finished = next(e.received_s for e in result.events if isinstance(e, PlaybackFinished))
    assert first_audio >= finished


@pytest.mark.usefixtures("sipp")
async def test_a_phone_call_to_a_bot_that_is_down_hears_the_fallback_then_gets_bye(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The SIP bridge's side of the policy: the caller hears the fallback, then our BYE."""
    async with running_server(hub=FakeToneHub()) as srv, RtpPeer() as peer:
        config = BridgeConfig(
            listen_host="127.0.0.1",
            listen_port=0,
            gateway=srv.target,
            rtp_port_min=30000,
            rtp_port_max=39999,
        )
        bridge = SipBridge(config, f"127.0.0.1:{free_port()}", bot_policy=POLICY)
        await bridge.start()
        try:
            res = await run_sipp(
                SIPP_DIR / "uac_peer_wait_bye.xml",
                bridge.address,
                cwd=SIPP_DIR,
                variables={"rtpport": str(peer.port)},
                timeout_s=60,
            )
        finally:
            await bridge.aclose()
    assert res.returncode == 0, res.explain()  # the BYE came
    assert [r for _, r in bridge.ended] == ["bot failed (down)"]
    assert bridge.stats["bye_sent"] == 1
    assert len(peer.received) >= 25  # the 0.6 s fallback, as 20 ms RTP packets
    [line] = bot_warnings(caplog)
    assert " down: " in line


class TalkingPeer(RtpPeer):
    """A phone that sends 20 ms of silence back, every 20 ms, once the bridge's RTP arrives
    (to where it came from), as a real phone's microphone keeps sending."""

    def __init__(self) -> None:
        super().__init__()
        self._talker: asyncio.Task[None] | None = None

    def datagram_received(self, data: bytes, addr: tuple[str | int, ...]) -> None:
        super().datagram_received(data, addr)
        if self._talker is None and self.received:
            dest = (str(addr[0]), int(addr[1]))
            self._talker = asyncio.get_running_loop().create_task(self._talk(dest))

    async def _talk(self, dest: tuple[str, int]) -> None:
        while True:  # 10 s at a time until the test leaves
            await self.send_audio(b"\xff" * 80_000, dest)

    async def __aexit__(self, *exc: object) -> None:
        if self._talker is not None:
            self._talker.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._talker
        await super().__aexit__(*exc)


@pytest.mark.usefixtures("sipp")
async def test_a_phone_call_to_a_bot_that_is_down_ends_for_the_bot_while_the_caller_talks(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The caller's audio still flows when the fallback ends and the link hangs up the gateway
    call: the next write found the call half-closed, and that ("gateway write failed: the call
    is half-closed") used to be the call's end reason instead of the bot's fault."""
    async with running_server(hub=FakeToneHub()) as srv, TalkingPeer() as peer:
        config = BridgeConfig(
            listen_host="127.0.0.1",
            listen_port=0,
            gateway=srv.target,
            rtp_port_min=30000,
            rtp_port_max=39999,
        )
        bridge = SipBridge(config, f"127.0.0.1:{free_port()}", bot_policy=POLICY)
        await bridge.start()
        try:
            res = await run_sipp(
                SIPP_DIR / "uac_peer_wait_bye.xml",
                bridge.address,
                cwd=SIPP_DIR,
                variables={"rtpport": str(peer.port)},
                timeout_s=60,
            )
        finally:
            await bridge.aclose()
    assert res.returncode == 0, res.explain()  # the BYE came
    assert [r for _, r in bridge.ended] == ["bot failed (down)"]
    assert len(peer.received) >= 25  # the fallback played while the caller's audio flowed
    [line] = bot_warnings(caplog)
    assert " down: " in line


@pytest.mark.timeout(30)
async def test_serve_bot_refuses_a_malformed_call_and_calls_over_its_limit() -> None:
    """A bridge that breaks the contract gets a precise status, for that call alone."""
    release = asyncio.Event()

    async def waits(call: VoiceCall) -> None:
        async for _ in call:
            await release.wait()

    started = pb.BotEvent(converse=pb.ConverseResponse(started=pb.SessionStarted()))
    async with await serve_bot(waits, max_calls=1, start_timeout_s=0.5) as server:
        channel = grpc.aio.insecure_channel(server.address)
        handle = channel.stream_stream(
            "/voxgate.v1.VoxgateBot/HandleCall",
            request_serializer=pb.BotEvent.SerializeToString,
            response_deserializer=pb.BotAction.FromString,
        )
        bad = handle()
        await bad.write(started)  # CallInfo must come first
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await bad.read()
        assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "starts with BotEvent.call" in (info.value.details() or "")
        silent = handle()
        await silent.write(pb.BotEvent(call=pb.CallInfo(call_id="s")))  # and then nothing
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await silent.read()
        assert info.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
        good = handle()
        await good.write(pb.BotEvent(call=pb.CallInfo(call_id="a")))
        await good.write(started)
        assert (await good.read()).WhichOneof("action") == "answer"
        over = handle()
        await over.write(pb.BotEvent(call=pb.CallInfo(call_id="b")))
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await over.read()
        assert info.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        release.set()
        await good.done_writing()
        assert await good.read() is grpc.aio.EOF
        assert await good.code() == grpc.StatusCode.OK
        await channel.close()


async def test_a_bot_that_returns_leaves_the_call_and_the_bridge_hangs_up(
    caplog: pytest.LogCaptureFixture,
) -> None:
    async def says_one_thing(call: VoiceCall) -> None:
        await call.speak("bye")  # and returns: its part of the call is over

    async with gateway() as client, await serve_bot(says_one_thing) as server:
        outcome, tee = await link_call(client, server.address)
    assert outcome == LinkOutcome("bot left")
    assert not bot_warnings(caplog)  # leaving is not a fault
    # Leaving is a hang-up, as on Converse: what is still queued is not played (a bot that wants
    # its goodbye heard waits for its PlaybackFinished first, as greet_and_leave does).
    assert not tee.finished()
