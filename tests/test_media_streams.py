"""The media-streams adapter over real sockets: a real grpc.aio gateway on loopback (with the
FAKE tone voice and no recogniser: transport logic only), the adapter's real WebSocket server,
and the replay client playing the provider's side to the published schemas.

What the real models prove (the bot hears the words, the reply is intelligible, barge-in) is in
``test_media_streams_models.py``.
"""

from __future__ import annotations

import asyncio
import logging
import signal
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest

from voxgate.bridges.media_streams import DialectName, MediaStreamsConfig, MediaStreamServer
from voxgate.bridges.media_streams.testing import ReplayClient
from voxgate.gateway.testing.batched import FakeBatchedAsrHub, fake_result
from voxgate.gateway.testing.fake_engines import (
    FakeBatchEngine,
    FakeToneHub,
    FakeToneSynthesizer,
)
from voxgate.gateway.testing.server import running_server
from voxgate_client import (
    Dtmf,
    MarkReached,
    PlaybackFinished,
    TransferError,
    VoiceCall,
)

pytestmark = pytest.mark.e2e

GREETING = "Hello there."  # 12 characters of tone: 1.2 s


class Recorder:
    """An in-process bot that greets, marks after the greeting, and records what it saw."""

    def __init__(self, greeting: str = GREETING, *, mark: bool = True) -> None:
        self.greeting = greeting
        self.mark = mark
        self.events: list[Any] = []
        self.info: Any = None
        self.transfer_error: TransferError | None = None
        self.ended = asyncio.Event()

    async def __call__(self, call: VoiceCall) -> None:
        self.info = call.info
        try:
            if self.greeting:
                await call.speak(self.greeting)
            if self.mark:
                await call.mark("after-greeting")
            async for event in call:
                self.events.append(event)
                if isinstance(event, Dtmf) and event.digit == "9":
                    try:
                        await call.transfer("sip:agent@example.com")
                    except TransferError as exc:
                        self.transfer_error = exc
        finally:
            self.ended.set()

    def of(self, kind: type) -> list[Any]:
        return [e for e in self.events if isinstance(e, kind)]


@asynccontextmanager
async def stack(bot: Any, hub: Any = None, **cfg: Any) -> AsyncIterator[MediaStreamServer]:
    async with running_server(hub=hub or FakeToneHub()) as srv:
        config = MediaStreamsConfig(host="127.0.0.1", port=0, gateway=srv.target, **cfg)
        async with MediaStreamServer(config, bot) as adapter:
            yield adapter


def url(adapter: MediaStreamServer, path: str = "/media") -> str:
    host, port = adapter.address
    return f"ws://{host}:{port}{path}"


async def until(pred: Any, what: str, timeout_s: float = 30.0) -> None:
    """Wait for state other tasks own (an event-based wait with a generous bound)."""
    for _ in range(int(timeout_s / 0.02)):
        if pred():
            return
        await asyncio.sleep(0.02)
    raise AssertionError(f"never happened: {what}")


async def test_a_twilio_stream_plays_the_reply_paced_and_confirms_it_with_marks() -> None:
    bot = Recorder()
    params = {"from": "+15550199"}
    async with stack(bot) as adapter, ReplayClient(url(adapter), custom_parameters=params) as peer:
        await peer.begin()
        # The caller listens (silence) while the greeting plays out on its clock.
        await peer.send_silence(200)
        await until(
            lambda: any(m.name == "voxgate-mark:after-greeting" for m in peer.returned),
            "the bot's mark came back after the greeting",
        )
        await until(lambda: bot.of(MarkReached), "the bot got its mark")
        await peer.send_stop()
        assert await peer.wait_closed() == (1000, "stopped")
        await asyncio.wait_for(bot.ended.wait(), 10)
    assert peer.violations == []
    media = peer.outbound("media")
    # 1.2 s of tone as exact 20 ms chunks, each for this stream.
    assert len(media) == 60
    names = [m["mark"]["name"] for m in peer.outbound("mark")]
    reply_end = next(n for n in names if n.startswith("voxgate-reply-end:"))
    # The reply-end mark follows the reply's last chunk; the bot's mark follows it.
    kinds = [m["event"] for m in peer.received]
    assert kinds.index("mark") == len(media)
    assert names.index(reply_end) < names.index("voxgate-mark:after-greeting")
    # Marks were answered only once all audio before them had played (the replayer's clock).
    answered = {m.name: m for m in peer.returned}
    assert answered[reply_end].played_bytes == 60 * 160
    assert not answered[reply_end].cleared
    # Never more than the lead (100 ms) plus the gateway's own 60 ms ahead of playout.
    assert peer.max_queued_ms <= 100 + 60 + 20
    assert bot.of(PlaybackFinished) and bot.info.channel == "media_stream"
    assert bot.info.call_id == peer.call_id and bot.info.from_uri == "+15550199"
    assert bot.info.headers["stream_id"] == peer.stream_id
    record = adapter.records[-1]
    assert record.marks_played >= 2 and record.media_out == 60 and record.close_code == 1000


async def test_dtmf_reaches_the_bot_and_transfer_is_refused_precisely() -> None:
    bot = Recorder(greeting="", mark=False)
    async with stack(bot) as adapter, ReplayClient(url(adapter)) as peer:
        await peer.begin()
        await peer.send_silence(100)
        await peer.send_dtmf("5")
        await peer.send_dtmf("9")
        await until(lambda: bot.transfer_error is not None, "the transfer was answered")
        await peer.send_stop()
        await peer.wait_closed()
    assert [d.digit for d in bot.of(Dtmf)] == ["5", "9"]
    err = bot.transfer_error
    assert err is not None and err.code.name == "UNIMPLEMENTED"
    assert "media_stream" in err.message


async def test_telnyx_dialect_by_path_with_a_law_straight_through() -> None:
    bot = Recorder(mark=False)
    telnyx = {"dialect": "telnyx", "encoding": "PCMA"}
    async with stack(bot) as adapter, ReplayClient(url(adapter, "/x/telnyx"), **telnyx) as peer:
        await peer.begin()
        await peer.send_silence(200)
        await until(lambda: peer.returned, "the reply-end mark came back")
        await peer.send_dtmf("7")
        await peer.send_event("error", None, payload={"code": 100002, "title": "Unknown error"})
        await until(lambda: bot.of(Dtmf), "the key press reached the bot")
        await peer.send_stop()
        assert (await peer.wait_closed())[0] == 1000
    assert peer.violations == []  # no streamSid in any frame to Telnyx
    assert len(peer.outbound("media")) == 60
    assert bot.info.from_uri == "+15550100001" and bot.info.call_id.startswith("v3:")
    assert [d.digit for d in bot.of(Dtmf)] == ["7"]
    assert adapter.records[-1].close_code == 1000  # a provider error frame is logged, not fatal


async def test_shutdown_closes_every_stream_with_1001_and_ends_its_call() -> None:
    bot = Recorder(greeting="", mark=False)
    async with running_server(hub=FakeToneHub()) as srv:
        config = MediaStreamsConfig(host="127.0.0.1", port=0, gateway=srv.target)
        adapter = MediaStreamServer(config, bot)
        await adapter.start()
        async with ReplayClient(url(adapter)) as peer:
            await peer.begin()
            await until(lambda: bot.info is not None, "the call is up")
            await adapter.aclose()
            code, reason = await peer.wait_closed()
        await asyncio.wait_for(bot.ended.wait(), 10)
    assert (code, reason) == (1001, "adapter shutting down")
    assert adapter.active == 0


async def test_the_bot_hanging_up_lets_its_last_words_play_then_closes() -> None:
    async def goodbye(call: VoiceCall) -> None:
        await call.speak("Bye now.")
        async for event in call:
            if isinstance(event, PlaybackFinished):
                await call.hangup()

    async with stack(goodbye) as adapter, ReplayClient(url(adapter)) as peer:
        await peer.begin()
        sender = asyncio.create_task(peer.send_silence(5000))
        code, reason = await peer.wait_closed()
        sender.cancel()
        await asyncio.wait([sender])
    assert (code, reason) == (1000, "call ended")
    # The whole reply was played before the socket closed (0.8 s of tone).
    assert len(peer.played) == 40 * 160
    assert any(m.name == "voxgate-reply-end:final" and not m.cleared for m in peer.returned)


async def test_clear_returns_the_marks_the_provider_still_held() -> None:
    async def clearing(call: VoiceCall) -> None:
        await call.speak("Hi.")
        await call.mark("m1")
        await call.speak("This reply is cut before it is heard.")
        async for event in call:
            if isinstance(event, MarkReached):
                await call.clear()  # the bot changes its mind (as on its own barge-in logic)

    # A provider with a 1 s jitter buffer: when the bot clears, nothing has been heard yet.
    async with (
        stack(clearing) as adapter,
        ReplayClient(url(adapter), playout_delay_ms=1000) as peer,
    ):
        await peer.begin()
        await peer.send_silence(300)
        await until(lambda: peer.clears, "the adapter sent clear")
        await until(lambda: len(peer.returned) >= 2, "the held marks came back")
        await peer.send_silence(300)
        await peer.send_stop()
        await peer.wait_closed()
    assert peer.violations == []
    returned = {m.name: m for m in peer.returned}
    assert returned["voxgate-reply-end:" + _first_speak_id(peer)].cleared
    assert returned["voxgate-mark:m1"].cleared
    assert len(peer.played) == 0  # the clear came before the jitter buffer let anything out
    record = adapter.records[-1]
    assert record.clears == 1 and record.marks_cleared == 2 and record.marks_played == 0


def _first_speak_id(peer: ReplayClient) -> str:
    names = [m["mark"]["name"] for m in peer.outbound("mark")]
    return next(n for n in names if n.startswith("voxgate-reply-end:")).split(":", 1)[1]


def _media(peer: ReplayClient) -> dict[str, Any]:
    return peer.media_message(b"\xff" * 160)


@pytest.mark.parametrize(
    ("before_start", "code", "words"),
    [
        (b"\x00binary", 1003, "binary"),
        ("{oops", 1007, "not JSON"),
        (None, 1008, "media before start"),
    ],
)
async def test_bad_input_before_start_closes_that_stream_only(
    before_start: Any, code: int, words: str, caplog: pytest.LogCaptureFixture
) -> None:
    bot = Recorder(mark=False)
    async with stack(bot) as adapter:
        async with ReplayClient(url(adapter)) as good, ReplayClient(url(adapter)) as bad:
            await good.begin()
            await bad.send_connected()
            await bad.send_raw(before_start if before_start is not None else _media(bad))
            got_code, reason = await bad.wait_closed()
            assert got_code == code and words in reason
            # The other stream is untouched: its greeting plays and is confirmed.
            await good.send_silence(200)
            await until(lambda: good.returned, "the good stream's reply played")
            await good.send_stop()
            assert (await good.wait_closed())[0] == 1000
        await until(lambda: adapter.active == 0, "no stream left open")
    assert any(words in r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING)


async def test_wrong_stream_id_second_start_and_bad_fields_close_with_a_reason() -> None:
    async with stack(Recorder(greeting="", mark=False)) as adapter:
        cases: list[tuple[Any, int, str]] = []
        for make, code, words in (
            (lambda p: {**_media(p), "streamSid": "MZother"}, 1008, "not this one"),
            # Quoted in the close reason, bounded to a control frame's 123 bytes of UTF-8.
            (lambda p: {**_media(p), "streamSid": "é" * 500}, 1008, "for stream"),
            (lambda p: None, 1008, "second start"),
            (lambda p: {"event": "media", "sequenceNumber": "99", "media": 5}, 1007, "object"),
            (lambda p: {"event": "dtmf", "sequenceNumber": "99", "dtmf": {}}, 1007, "digit"),
        ):
            async with ReplayClient(url(adapter)) as peer:
                await peer.begin()
                await peer.send_silence(40, realtime=False)
                msg = make(peer)
                if msg is None:
                    await peer.send_start()
                else:
                    await peer.send_raw(msg)
                cases.append((await peer.wait_closed(), code, words))
        await until(lambda: adapter.active == 0, "no stream left open")
        for (got, reason), code, words in cases:
            assert got == code and words in reason, (got, reason, words)
        # Every one of those gateway calls was ended, not left to time out.
        assert all(r.close_code in (1007, 1008) for r in list(adapter.records)[-5:])


async def test_oversized_frame_is_refused_with_1009() -> None:
    async with stack(Recorder(mark=False), max_message_bytes=4096) as adapter:
        async with ReplayClient(url(adapter)) as peer:
            await peer.begin()
            await peer.send_raw(peer.media_message(b"\xff" * 8000))
            code, _ = await peer.wait_closed()
        await until(lambda: adapter.active == 0, "the stream was torn down")
    assert code == 1009


@pytest.mark.parametrize("dialect", ["twilio", "telnyx"])
async def test_out_of_order_and_repeated_messages_are_dropped_and_counted(
    dialect: DialectName,
) -> None:
    bot = Recorder(greeting="", mark=False)
    path = f"/{dialect}"
    async with stack(bot) as adapter, ReplayClient(url(adapter, path), dialect) as peer:
        await peer.begin()
        m1, m2, m3, m4 = (_media(peer) for _ in range(4))
        for msg in (m1, m3, m2, m4, m4):  # a swap, then a repeat
            await peer.send_raw(msg)
        await peer.send_dtmf("1")
        seq_key, sid_key = ("sequenceNumber", "streamSid")
        if dialect == "telnyx":
            seq_key, sid_key = ("sequence_number", "stream_id")
        # An old number: a replayed message.
        dup = {"event": "dtmf", seq_key: "2", sid_key: peer.stream_id, "dtmf": {"digit": "2"}}
        await peer.send_raw(dup)
        await peer.send_dtmf("3")
        await until(lambda: len(bot.of(Dtmf)) >= 2, "the in-order digits arrived")
        await peer.send_stop()
        assert (await peer.wait_closed())[0] == 1000
    assert [d.digit for d in bot.of(Dtmf)] == ["1", "3"]
    record = adapter.records[-1]
    assert record.out_of_order == 3  # m2 after m3, the repeated m4, the old dtmf
    assert record.reordered_chunks == 1 and record.late_chunks == 1
    assert record.lost_chunks == 0 and record.media_in == 5


async def test_a_vanished_socket_ends_the_gateway_call(caplog: pytest.LogCaptureFixture) -> None:
    bot = Recorder(mark=False)
    async with stack(bot) as adapter:
        peer = ReplayClient(url(adapter))
        await peer.connect()
        await peer.begin()
        await peer.send_silence(100)
        assert peer._ws is not None
        peer._ws.transport.abort()  # no close frame, no stop: the provider's host died
        await asyncio.wait_for(bot.ended.wait(), 15)
        await until(lambda: adapter.active == 0, "the stream was torn down")
        await peer.aclose()
    assert "socket closed without stop" in adapter.records[-1].end
    assert any("without stop" in r.getMessage() for r in caplog.records)


async def test_no_start_within_the_timeout_closes_with_1008() -> None:
    async with (
        stack(Recorder(), start_timeout_s=0.5) as adapter,
        ReplayClient(url(adapter)) as peer,
    ):
        await peer.send_connected()
        code, reason = await peer.wait_closed(10)
    assert code == 1008 and "no start" in reason


async def test_unknown_events_are_ignored_and_logged_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    bot = Recorder(greeting="", mark=False)
    async with stack(bot) as adapter, ReplayClient(url(adapter)) as peer:
        await peer.begin()
        for _ in range(3):
            await peer.send_event("newfangled", {"x": 1})
        await peer.send_dtmf("4")
        await until(lambda: bot.of(Dtmf), "the call went on")
        await peer.send_stop()
        await peer.wait_closed()
    assert adapter.records[-1].unknown_events == 3
    lines = [r.getMessage() for r in caplog.records if "newfangled" in r.getMessage()]
    assert len(lines) == 1


async def test_a_full_gateway_closes_with_1013() -> None:
    async with running_server(hub=FakeToneHub(), limits={"max_concurrent_calls": 1}) as srv:
        config = MediaStreamsConfig(host="127.0.0.1", port=0, gateway=srv.target)
        bot = Recorder(greeting="", mark=False)
        async with (
            MediaStreamServer(config, bot) as adapter,
            ReplayClient(url(adapter)) as first,
            ReplayClient(url(adapter)) as second,
        ):
            await first.begin()
            await until(lambda: bot.info is not None, "the first call is up")
            await second.begin()
            code, reason = await second.wait_closed()
            assert code == 1013 and "RESOURCE_EXHAUSTED" in reason
            await first.send_stop()
            assert (await first.wait_closed())[0] == 1000


def test_the_cli_lists_the_command() -> None:
    from voxgate.cli import build_parser

    args = build_parser().parse_args(
        ["media-streams", "--listen", "127.0.0.1:0", "--bot", "echo", "--dialect", "telnyx"]
    )
    assert args.listen == ("127.0.0.1", 0) and args.dialect == "telnyx" and args.bot == "echo"


async def test_the_command_serves_a_stream_and_stops_on_sigterm(tmp_path: Path) -> None:
    rules = tmp_path / "bot.yaml"
    rules.write_text("greeting: Hi there.\n")  # 9 characters of the fake tone: 0.9 s
    async with running_server(hub=FakeToneHub()) as srv:
        proc = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "voxgate.cli",
            "media-streams",
            "--listen",
            "127.0.0.1:0",
            "--gateway",
            srv.target,
            "--bot",
            str(rules),
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )
        try:
            assert proc.stdout is not None
            line = (await asyncio.wait_for(proc.stdout.readline(), 120)).decode()
            assert line.startswith("media streams listening on ws://"), line
            address = line.split("ws://", 1)[1].strip()
            async with ReplayClient(f"ws://{address}/twilio") as peer:
                await peer.begin()
                listening = asyncio.create_task(peer.send_silence(10_000))
                await until(lambda: peer.returned, "the greeting played and its mark returned")
                listening.cancel()
                await asyncio.wait([listening])
                await peer.send_stop()
                assert (await peer.wait_closed())[0] == 1000
            assert len(peer.played) == 45 * 160 and peer.violations == []
        finally:
            if proc.returncode is None:
                proc.send_signal(signal.SIGTERM)
            _, err = await asyncio.wait_for(proc.communicate(), 60)
    assert proc.returncode == 0, err.decode()
    assert "stream MZ" in err.decode()  # the one line per stream


async def test_with_a_stream_token_only_streams_that_carry_it_get_in(
    caplog: pytest.LogCaptureFixture,
) -> None:
    from websockets.exceptions import InvalidStatus

    token = "s3cret-Stream-Token_0123"
    bot = Recorder(greeting="", mark=False)
    async with stack(bot, stream_token=token) as adapter:
        for path in ("/twilio", "/wrong-token-0123456789/twilio", f"/{token[:-1]}/twilio"):
            with pytest.raises(InvalidStatus) as err:
                await ReplayClient(url(adapter, path)).connect()
            assert err.value.response.status_code == 401
        async with ReplayClient(url(adapter, f"/{token}/twilio")) as peer:
            await peer.begin()
            await peer.send_dtmf("1")
            await until(lambda: bot.of(Dtmf), "the call is up")
            await peer.send_stop()
            assert (await peer.wait_closed())[0] == 1000
        # Telnyx sends its streaming auth token as a header.
        host, port = adapter.address
        telnyx = ReplayClient(f"ws://{host}:{port}/telnyx", "telnyx")
        from websockets.asyncio.client import connect

        telnyx._ws = await connect(
            telnyx.url,
            additional_headers={"x-telnyx-streaming-auth-token": token},
            compression=None,
        )
        await telnyx.aclose()
        await until(lambda: len(adapter.records) == 2, "both accepted streams ended")
    twilio_record, telnyx_record = adapter.records
    assert twilio_record.close_code == 1000
    assert telnyx_record.dialect == "telnyx" and telnyx_record.end == "socket closed before start"
    logged = "\n".join(r.getMessage() for r in caplog.records)
    assert "no valid stream token" in logged and token not in logged and token[:-1] not in logged


async def test_a_bot_served_over_grpc_answers_a_stream() -> None:
    from voxgate_client import serve_bot

    bot = Recorder()
    async with await serve_bot(bot) as served, stack(served.address) as adapter:
        async with ReplayClient(url(adapter)) as peer:
            await peer.begin()
            listening = asyncio.create_task(peer.send_silence(10_000))
            await until(
                lambda: any(m.name == "voxgate-mark:after-greeting" for m in peer.returned),
                "the served bot's greeting and mark came back",
            )
            listening.cancel()
            await asyncio.wait([listening])
            await peer.send_dtmf("9")  # the bot tries to transfer
            await until(lambda: bot.transfer_error is not None, "the transfer was answered")
            await peer.send_stop()
            assert (await peer.wait_closed())[0] == 1000
        await asyncio.wait_for(bot.ended.wait(), 10)
    assert len(peer.outbound("media")) == 60 and peer.violations == []
    assert bot.info.channel == "media_stream" and not bot.info.transfer_supported
    err = bot.transfer_error
    assert err is not None and err.code.name == "UNIMPLEMENTED"


class SessionSpy:
    """An in-process bot that only keeps the gateway's SessionStarted of its call."""

    def __init__(self) -> None:
        self.session: Any = None
        self.started = asyncio.Event()

    async def __call__(self, call: VoiceCall) -> None:
        self.session = call.session
        self.started.set()
        async for _ in call:
            pass


@pytest.mark.parametrize(
    ("asked", "runs"), [(None, "GATE_AEC3"), ("gate", "GATE"), ("aec3", "AEC3")]
)
async def test_the_adapters_echo_handling_reaches_the_gateway(asked: Any, runs: str) -> None:
    """What the operator set for the provider's leg is what the gateway's call runs (its
    effective config); unset, the gateway's own default (``gate_aec3``)."""
    from voxgate.v1 import voxgate_pb2 as pb

    bot = SessionSpy()
    async with stack(bot, echo_handling=asked) as adapter, ReplayClient(url(adapter)) as peer:
        await peer.begin()
        await asyncio.wait_for(bot.started.wait(), 30)
        await peer.send_stop()
        await peer.wait_closed()
    effective = bot.session.effective_config.barge_in.echo_handling
    assert effective == pb.EchoHandling.Value(f"ECHO_HANDLING_{runs}")


@pytest.mark.parametrize("asked", [None, "smart"])
async def test_the_adapters_turn_detection_reaches_the_gateway(asked: Any) -> None:
    """An adapter set for turn detection (``voxgate media-streams --turns smart
    --turn-eagerness 0.8``) asks the gateway for it on each stream's call, so its bot answers
    turns; unset, the call has the gateway's default (off: nothing in the effective config)."""
    from voxgate.v1 import voxgate_pb2 as pb
    from voxgate_client import TurnOptions

    turns = TurnOptions(mode=asked, eagerness=0.8) if asked else TurnOptions()
    bot = SessionSpy()
    # Turns need a recogniser (a gateway without one refuses them): a FAKE one.
    hub = FakeBatchedAsrHub([FakeBatchEngine(fake_result)], synthesizer=FakeToneSynthesizer())
    async with stack(bot, hub, turns=turns) as adapter, ReplayClient(url(adapter)) as peer:
        await peer.begin()
        await asyncio.wait_for(bot.started.wait(), 30)
        await peer.send_stop()
        await peer.wait_closed()
    effective = bot.session.effective_config.turn_detection
    assert bot.session.turn_detection == (asked or "off")
    if asked:
        assert effective.mode == pb.TURN_DETECTION_SMART
        assert effective.eagerness == pytest.approx(0.8)
    else:
        assert effective.mode == pb.TURN_DETECTION_UNSPECIFIED
