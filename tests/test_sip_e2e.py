"""SIPp as the real caller against the SIP bridge and a real in-process gateway (VAD only).

The gateway has no voice here, except where a test swaps in the tone synthesizer below to see
reply audio flow (the fake proves the bridge's RTP path, never a model feature).
"""

from __future__ import annotations

import asyncio
import logging
import random
from collections import defaultdict
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
from calls import encode_wav

from voxgate.bridges.bots import TurnBot
from voxgate.bridges.sip import BridgeConfig, SilentBot, SipBridge
from voxgate.bridges.sip.testing import RtpPeer, SippResult, run_sipp
from voxgate.gateway.testing.batched import FakeBatchedAsrHub, fake_result
from voxgate.gateway.testing.fake_engines import (
    FakeBatchEngine,
    FakeToneHub,
    FakeToneSynthesizer,
)
from voxgate.gateway.testing.server import running_server
from voxgate.v1 import voxgate_pb2 as pb
from voxgate_client import (
    PlaybackInterrupted,
    ServerEvent,
    SessionStarted,
    SpeechBegin,
    SpeechEnd,
    VoiceCall,
)

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.usefixtures("sipp"),
]


SIPP_DIR = Path(__file__).parent / "sipp"
CLIP = "cmu_goforward.wav"  # 2.8 s, one utterance


class RecordingBot(TurnBot):
    """Records what reaches the bot (an in-process handler on the bot contract); may greet."""

    def __init__(self, log: list[tuple[str, str]], greeting: str | None = None) -> None:
        self.log = log
        self.greeting = greeting

    def reply(self, text: str) -> str | None:
        self.log.append(("transcript", text))
        return None

    def on_dtmf(self, digit: str) -> str | None:
        self.log.append(("dtmf", digit))
        return None


class Events:
    """The observation channel: every gateway event per SIP call."""

    def __init__(self) -> None:
        self.by_call: dict[str, list[ServerEvent]] = defaultdict(list)
        self.loop_time: dict[tuple[str, str], float] = {}
        self.server: Any = None  # the in-process GatewayServer
        self.bridge: Any = None
        #: RTP packets the bridge had sent to the caller when `interrupted` arrived.
        self.sent_at_interrupt: dict[str, int] = {}

    def __call__(self, call_id: str, msg: ServerEvent) -> None:
        self.by_call[call_id].append(msg)
        kind = "interrupted" if isinstance(msg, PlaybackInterrupted) else type(msg).__name__
        self.loop_time.setdefault((call_id, kind), asyncio.get_running_loop().time())
        if kind == "interrupted" and self.bridge is not None:
            # Called before the bridge handles the event (and clears its queue), synchronously.
            self.sent_at_interrupt[call_id] = self.bridge.calls[call_id].media.stats.sent

    def speech(self, call_id: str) -> list[int]:
        return [
            pb.SpeechEvent.SPEECH_BEGIN if isinstance(m, SpeechBegin) else pb.SpeechEvent.SPEECH_END
            for m in self.by_call[call_id]
            if isinstance(m, SpeechBegin | SpeechEnd)
        ]


@asynccontextmanager
async def bridge_and_gateway(
    bot: Callable[[], Any] = SilentBot, hub: Any = None, **cfg: Any
) -> AsyncIterator[tuple[SipBridge, Events]]:
    events = Events()
    async with running_server(hub=hub) as srv:
        events.server = srv
        config = BridgeConfig(
            listen_host="127.0.0.1",
            listen_port=0,
            gateway=srv.target,
            rtp_port_min=30000,
            rtp_port_max=39999,
            **cfg,
        )
        bridge = SipBridge(config, bot(), on_event=events)
        events.bridge = bridge
        await bridge.start()
        try:
            yield bridge, events
        finally:
            await bridge.aclose()


@pytest.fixture
def caller_audio(speech_dir: Path, tmp_path: Path) -> Path:
    """The clip as raw mu-law 8 kHz, plus 1 s of silence, where SIPp's rtp_stream finds it."""
    data = encode_wav(speech_dir / CLIP, pb.MULAW, 8000) + b"\xff" * 8000
    (tmp_path / "caller.ulaw").write_bytes(data)
    return tmp_path


def ok(result: SippResult) -> None:
    assert result.returncode == 0, result.explain()


async def wait_for(pred: Callable[[], bool], what: str, limit: int = 200) -> None:
    """Poll a condition every 50 ms, at most ``limit`` times (no timed assertion: a bound)."""
    for _ in range(limit):
        if pred():
            return
        await asyncio.sleep(0.05)
    raise AssertionError(f"never happened: {what}")


async def test_call_streams_real_speech_to_the_gateway(caller_audio: Path) -> None:
    async with bridge_and_gateway() as (bridge, events):
        res = await run_sipp(
            SIPP_DIR / "uac_stream.xml", bridge.address, cwd=caller_audio, duration_ms=4500
        )
        ok(res)
        await wait_for(lambda: not bridge.calls, "call torn down")
    [(call_id, reason)] = list(bridge.ended)
    assert "BYE" in reason
    speech = events.speech(call_id)
    assert speech[:2] == [pb.SpeechEvent.SPEECH_BEGIN, pb.SpeechEvent.SPEECH_END], speech
    assert isinstance(events.by_call[call_id][0], SessionStarted)


@pytest.mark.parametrize(
    ("asked", "runs"), [("", pb.ECHO_HANDLING_GATE_AEC3), ("aec3", pb.ECHO_HANDLING_AEC3)]
)
async def test_the_trunks_echo_handling_reaches_the_gateway(
    caller_audio: Path, asked: str, runs: int
) -> None:
    """A bridge set for a trunk that echoes through a hybrid asks the gateway for AEC3 on each
    of its calls (the call's effective config says what runs); unset, the gateway's default."""
    async with bridge_and_gateway(echo_handling=asked) as (bridge, events):
        ok(
            await run_sipp(
                SIPP_DIR / "uac_stream.xml", bridge.address, cwd=caller_audio, duration_ms=1000
            )
        )
        await wait_for(lambda: not bridge.calls, "call torn down")
    [(call_id, _)] = list(bridge.ended)
    started = events.by_call[call_id][0]
    assert isinstance(started, SessionStarted)
    assert started.effective_config.barge_in.echo_handling == runs


@pytest.mark.parametrize(
    ("asked", "runs"),
    [({}, pb.TURN_DETECTION_UNSPECIFIED), ({"turns": "smart"}, pb.TURN_DETECTION_SMART)],
)
async def test_the_bridges_turn_detection_reaches_the_gateway(
    caller_audio: Path, asked: dict[str, Any], runs: int
) -> None:
    """A bridge set for turn detection (``voxgate sip --turns smart --turn-eagerness 0.8``)
    asks the gateway for it on each call, so its bot answers turns; unset, the call has the
    gateway's default (off: nothing in the effective config)."""
    if asked:
        asked = {**asked, "turn_eagerness": 0.8}
    # Turns need a recogniser (a gateway without one refuses them): a FAKE one.
    hub = FakeBatchedAsrHub([FakeBatchEngine(fake_result)], synthesizer=FakeToneSynthesizer())
    async with bridge_and_gateway(hub=hub, **asked) as (bridge, events):
        ok(
            await run_sipp(
                SIPP_DIR / "uac_stream.xml", bridge.address, cwd=caller_audio, duration_ms=1000
            )
        )
        await wait_for(lambda: not bridge.calls, "call torn down")
    [(call_id, _)] = list(bridge.ended)
    started = events.by_call[call_id][0]
    assert isinstance(started, SessionStarted)
    assert started.effective_config.turn_detection.mode == runs
    assert started.turn_detection == ("smart" if asked else "off")
    if asked:
        assert started.effective_config.turn_detection.eagerness == pytest.approx(0.8)


async def test_ten_concurrent_calls_are_isolated(caller_audio: Path) -> None:
    async with bridge_and_gateway() as (bridge, events):
        res = await run_sipp(
            SIPP_DIR / "uac_stream.xml",
            bridge.address,
            cwd=caller_audio,
            calls=10,
            rate=20,
            duration_ms=4500,
        )
        ok(res)
        await wait_for(lambda: not bridge.calls, "calls torn down")
    assert len(bridge.ended) == 10
    assert len({c for c, _ in bridge.ended}) == 10
    for call_id, reason in bridge.ended:
        assert "BYE" in reason
        # Each call heard exactly its own caller: one utterance, begin then end.
        assert events.speech(call_id)[:2] == [1, 2], (call_id, events.speech(call_id))


async def test_caller_hangs_up_mid_call_ends_the_gateway_stream(caller_audio: Path) -> None:
    async with bridge_and_gateway() as (bridge, events):
        res = await run_sipp(
            SIPP_DIR / "uac_stream.xml", bridge.address, cwd=caller_audio, duration_ms=1200
        )
        ok(res)
        await wait_for(lambda: not bridge.calls, "call torn down")
        [(call_id, reason)] = list(bridge.ended)
        assert reason == "caller hung up (BYE)"
        assert events.speech(call_id)[:1] == [pb.SpeechEvent.SPEECH_BEGIN]  # hung up mid-speech
        # The gateway's session is gone too (bounded wait, not a timing assertion).
        await asyncio.wait_for(events.server.servicer.wait_idle(), 10)
        assert bridge.stats["bye_sent"] == 0


async def test_late_ack_gets_the_200_retransmitted(caller_audio: Path) -> None:
    async with bridge_and_gateway() as (bridge, _):
        res = await run_sipp(SIPP_DIR / "uac_late_ack.xml", bridge.address, cwd=caller_audio)
        ok(res)
        await wait_for(lambda: not bridge.calls, "call torn down")
        assert bridge.stats["retransmitted"] >= 2  # at +0.5 s and +1.5 s
        assert bridge.stats["ack_timeout"] == 0
        assert [r for _, r in bridge.ended] == ["caller hung up (BYE)"]


async def test_cancel_while_ringing(caller_audio: Path) -> None:
    async with bridge_and_gateway(ring_ms=3000) as (bridge, events):
        res = await run_sipp(SIPP_DIR / "uac_cancel.xml", bridge.address, cwd=caller_audio)
        ok(res)
        await wait_for(lambda: not bridge.calls, "call torn down")
        [(call_id, reason)] = list(bridge.ended)
        assert reason == "caller cancelled (CANCEL)"
        assert bridge.stats["bye_sent"] == 0


async def test_g729_only_offer_gets_488(caller_audio: Path) -> None:
    async with bridge_and_gateway() as (bridge, _):
        res = await run_sipp(SIPP_DIR / "uac_g729.xml", bridge.address, cwd=caller_audio)
        ok(res)
        assert bridge.stats["calls"] == 0


async def test_gateway_stopping_ends_the_call_with_bye(caller_audio: Path) -> None:
    async with bridge_and_gateway() as (bridge, events):
        sipp = asyncio.create_task(
            run_sipp(SIPP_DIR / "uac_wait_bye.xml", bridge.address, cwd=caller_audio)
        )
        await wait_for(lambda: any(c.state == "confirmed" for c in bridge.calls.values()), "ACK")
        await events.server.stop(grace_s=0.0)  # the gRPC stream ends under the call
        ok(await sipp)
        await wait_for(lambda: not bridge.calls, "call torn down")
    [(_, reason)] = list(bridge.ended)
    assert reason.startswith("gateway"), reason
    assert bridge.stats["bye_sent"] == 1


async def test_bridge_shutdown_ends_calls_with_bye(caller_audio: Path) -> None:
    async with bridge_and_gateway() as (bridge, events):
        sipp = asyncio.create_task(
            run_sipp(SIPP_DIR / "uac_wait_bye.xml", bridge.address, cwd=caller_audio, calls=2)
        )
        await wait_for(
            lambda: (
                len(bridge.calls) == 2
                and all(c.state == "confirmed" for c in bridge.calls.values())
            ),
            "two calls ACKed",
        )
        await bridge.aclose()
        ok(await sipp)
        await asyncio.wait_for(events.server.servicer.wait_idle(), 10)
    assert [r for _, r in bridge.ended] == ["bridge shutting down"] * 2
    assert bridge.stats["bye_sent"] == 2


async def test_dtmf_digits_reach_the_bot() -> None:
    heard: list[tuple[str, str]] = []
    async with RtpPeer() as peer, bridge_and_gateway(lambda: RecordingBot(heard)) as (bridge, _):
        sipp = asyncio.create_task(
            run_sipp(
                SIPP_DIR / "uac_peer.xml",
                bridge.address,
                cwd=SIPP_DIR,
                duration_ms=3000,
                variables={"rtpport": str(peer.port)},
            )
        )
        await wait_for(lambda: any(c.media for c in bridge.calls.values()), "call answered")
        [call] = bridge.calls.values()
        assert call.media is not None
        await peer.send_dtmf("12#", ("127.0.0.1", call.media.local_port))
        ok(await sipp)
    assert [d for kind, d in heard if kind == "dtmf"] == ["1", "2", "#"]


async def test_reply_audio_reaches_the_caller_as_rtp_and_barge_in_stops_it(
    speech_dir: Path,
) -> None:
    """Greeting → 20 ms PCMU packets to the caller; caller speech → barge-in clears the queue."""
    heard: list[tuple[str, str]] = []
    speech = encode_wav(speech_dir / CLIP, pb.MULAW, 8000)
    greeting = "x" * 60  # 6 s of tone
    async with (
        RtpPeer() as peer,
        bridge_and_gateway(lambda: RecordingBot(heard, greeting), hub=FakeToneHub()) as (
            bridge,
            ev,
        ),
    ):
        sipp = asyncio.create_task(
            run_sipp(
                SIPP_DIR / "uac_peer.xml",
                bridge.address,
                cwd=SIPP_DIR,
                duration_ms=5000,
                variables={"rtpport": str(peer.port)},
            )
        )
        await wait_for(lambda: len(peer.received) >= 25, "half a second of reply audio")
        [call] = bridge.calls.values()
        assert call.media is not None
        await peer.send_audio(speech, ("127.0.0.1", call.media.local_port))
        await wait_for(lambda: (call.call_id, "interrupted") in ev.loop_time, "barge-in")
        ok(await sipp)
        sent_in_all = call.media.stats.sent
    pkts = [r.packet for r in peer.received]
    assert all(p.payload_type == 0 and len(p.payload) == 160 for p in pkts)
    assert pkts[0].marker
    first_spurt = pkts[: next((i for i, p in enumerate(pkts[1:], 1) if p.marker), len(pkts))]
    for a, b in zip(first_spurt, first_spurt[1:], strict=False):
        assert (b.sequence - a.sequence) % 65536 == 1
        assert (b.timestamp - a.timestamp) % 2**32 == 160
    # Once the bridge got `interrupted`, not one more reply packet left for the caller
    # (v0.1 checked "at most 5 packets within 100 ms" on the wall clock).
    assert sent_in_all == ev.sent_at_interrupt[call.call_id] > 0


async def test_the_callers_bye_during_a_reply_is_logged_once_and_not_as_a_barge_in(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A BYE while three sentences are queued: the gateway reports each unplayed reply as it
    closes the call, and the bridge logged "barge-in, N ms of queued reply dropped" for each."""

    async def three_sentences(call: VoiceCall) -> None:
        for _ in range(3):
            await call.speak("x" * 30)  # 3 s of tone each
        async for _ in call:
            pass

    caplog.set_level(logging.INFO, logger="voxgate.sip")
    async with (
        RtpPeer() as peer,
        bridge_and_gateway(lambda: three_sentences, hub=FakeToneHub()) as (bridge, ev),
    ):
        sipp = asyncio.create_task(
            run_sipp(
                SIPP_DIR / "uac_peer.xml",
                bridge.address,
                cwd=SIPP_DIR,
                duration_ms=1500,  # then BYE, in the first sentence
                variables={"rtpport": str(peer.port)},
            )
        )
        ok(await sipp)
        await wait_for(lambda: bool(bridge.ended), "the call's end")
        [call_id] = ev.by_call
        # The gateway did report the replies cut by the hang-up (what used to be logged).
        await wait_for(
            lambda: any(isinstance(e, PlaybackInterrupted) for e in ev.by_call[call_id]),
            "the cut replies reported",
        )
    assert [r for _, r in bridge.ended] == ["caller hung up (BYE)"]
    assert peer.received  # the first sentence was playing
    interrupted = [e for e in ev.by_call[call_id] if isinstance(e, PlaybackInterrupted)]
    assert interrupted and not any(e.barge_in for e in interrupted)
    lines = [r.getMessage() for r in caplog.records if r.name == "voxgate.sip"]
    assert not [ln for ln in lines if "barge-in" in ln], lines
    [cut] = [ln for ln in lines if "reply" in ln and "ms" in ln]
    assert "call ended during a reply" in cut, cut


async def test_fuzzed_datagrams_then_a_normal_call_works(caller_audio: Path) -> None:
    rng = random.Random(7)
    options = (
        "OPTIONS sip:bot@127.0.0.1 SIP/2.0\r\nVia: SIP/2.0/UDP 127.0.0.1:9;branch=z9hG4bKf{n}\r\n"
        "From: <sip:f@x>;tag=1\r\nTo: <sip:bot@x>\r\nCall-ID: fuzz{n}\r\nCSeq: 1 OPTIONS\r\n"
        "Content-Length: 0\r\n\r\n"
    )
    async with RtpPeer() as junk, bridge_and_gateway() as (bridge, _):
        for n in range(500):
            data = bytearray(options.format(n=n).encode())
            for _ in range(rng.randint(1, 8)):
                data[rng.randrange(len(data))] = rng.randrange(256)
            if n % 5 == 0:
                data = bytearray(rng.randbytes(rng.randint(0, 300)))
            junk.send_raw(bytes(data), bridge.address)
            if n % 50 == 0:
                await asyncio.sleep(0)
        await asyncio.sleep(0.2)
        assert bridge.stats["internal_error"] == 0
        res = await run_sipp(
            SIPP_DIR / "uac_stream.xml", bridge.address, cwd=caller_audio, duration_ms=3000
        )
        ok(res)
        await wait_for(lambda: not bridge.calls, "call torn down")
        assert [r for _, r in bridge.ended] == ["caller hung up (BYE)"]
