"""Speak, Synthesize, pacing, marks, Clear and barge-in on a real server with the bundled voice."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import grpc
import numpy as np
import pytest
from calls import config, encode_wav

from voxgate.common.pcm import MULAW_DECODE
from voxgate.gateway.config import load_config
from voxgate.gateway.runtime import build_hub
from voxgate.gateway.server import GatewayServer
from voxgate.gateway.testing.server import running_server
from voxgate.v1 import voxgate_pb2 as pb
from voxgate.v1 import voxgate_pb2_grpc as pb_grpc

pytestmark = [pytest.mark.e2e, pytest.mark.model]

REPLY = "Thanks for calling. Your order ships tomorrow morning."


@asynccontextmanager
async def tts_server(
    **overrides: object,
) -> AsyncIterator[tuple[GatewayServer, pb_grpc.VoiceGatewayStub]]:
    hub = build_hub(load_config(None, {"engines": "tts"}))
    async with (
        running_server(hub=hub, **overrides) as srv,  # type: ignore[arg-type]
        grpc.aio.insecure_channel(srv.target) as ch,
    ):
        yield srv, pb_grpc.VoiceGatewayStub(ch)


class Call:
    """A Converse call driven with explicit writes and a concurrent reader that timestamps."""

    def __init__(self, stub: pb_grpc.VoiceGatewayStub) -> None:
        self.rpc = stub.Converse()
        self.events: list[tuple[float, pb.ConverseResponse]] = []
        self.reader = asyncio.create_task(self._read())

    async def _read(self) -> None:
        while (msg := await self.rpc.read()) is not grpc.aio.EOF:
            self.events.append((time.monotonic(), msg))

    async def send(self, **kw: object) -> None:
        await self.rpc.write(pb.ConverseRequest(**kw))

    async def wait_for(self, kind: str, timeout_s: float = 30.0) -> pb.ConverseResponse:
        end = time.monotonic() + timeout_s
        while time.monotonic() < end:
            for _, m in self.events:
                if m.WhichOneof("event") == kind:
                    return m
            if self.reader.done():
                self.reader.result()
                break
            await asyncio.sleep(0.01)
        raise AssertionError(
            f"no {kind} event; got {[m.WhichOneof('event') for _, m in self.events]}"
        )

    def of(self, kind: str) -> list[pb.ConverseResponse]:
        return [m for _, m in self.events if m.WhichOneof("event") == kind]

    async def close(self) -> None:
        await self.rpc.done_writing()
        await asyncio.wait_for(self.reader, 60)


async def test_speak_streams_mulaw_frames_in_order_then_finishes_and_reaches_the_mark() -> None:
    async with tts_server() as (_, stub):
        call = Call(stub)
        await call.send(config=config(pb.MULAW, 8000).config)
        await call.send(speak=pb.Speak(text=REPLY, speak_id="a"))
        await call.send(speak=pb.Speak(text="Goodbye.", speak_id="b"))
        await call.send(mark=pb.Mark(name="after-b"))
        await call.wait_for("mark")
        await call.close()
    kinds = [m.WhichOneof("event") for _, m in call.events]
    audio = call.of("audio")
    assert [a.audio.sequence_number for a in audio] == list(range(1, len(audio) + 1))
    for sid in ("a", "b"):
        frames = [a.audio for a in audio if a.audio.speak_id == sid]
        assert all(len(f.data) == 160 for f in frames[:-1])  # 20 ms of 8 kHz mu-law
        assert frames[-1].is_last and not any(f.is_last for f in frames[:-1])
    ids = [a.audio.speak_id for a in audio]
    assert ids == sorted(ids)  # queued Speaks play in order: all of "a", then "b"
    assert {"a", "b"} == set(ids)
    finished = [m.playback_finished.speak_id for m in call.of("playback_finished")]
    assert finished == ["a", "b"]
    assert kinds.index("mark") > max(i for i, k in enumerate(kinds) if k == "playback_finished")
    # mu-law output round-trips: decodes to a non-silent signal of the right length.
    a_bytes = b"".join(m.audio.data for m in audio if m.audio.speak_id == "a")
    pcm = MULAW_DECODE[np.frombuffer(a_bytes, np.uint8)].astype(np.float64) / 32768
    duration_s = len(pcm) / 8000
    assert 2.0 < duration_s < 6.0
    assert 20 * np.log10(np.sqrt(np.mean(pcm**2))) > -35
    fin_a = next(m for m in call.of("playback_finished") if m.playback_finished.speak_id == "a")
    assert abs(fin_a.playback_finished.duration_ms - 1000 * duration_s) <= 20


async def test_clear_stops_playback_and_drops_the_queue() -> None:
    async with tts_server() as (_, stub):
        call = Call(stub)
        await call.send(config=config().config)
        await call.send(speak=pb.Speak(text=REPLY, speak_id="a"))
        await call.send(speak=pb.Speak(text="This should never play.", speak_id="b"))
        await call.wait_for("audio")
        await asyncio.sleep(0.5)
        await call.send(clear=pb.Clear())
        interrupted = await call.wait_for("interrupted")
        await asyncio.sleep(0.3)
        await call.close()
    assert interrupted.interrupted.speak_id == "a"
    sent_ms = sum(len(m.audio.data) for m in call.of("audio") if m.audio.speak_id == "a") / 32
    assert 0 < interrupted.interrupted.played_ms <= sent_ms  # heard, and never more than sent
    assert not [m for m in call.of("audio") if m.audio.speak_id == "b"]
    assert not call.of("playback_finished")


async def test_barge_in_cuts_the_reply_and_reports_the_words_heard(speech_dir: Path) -> None:
    caller = encode_wav(speech_dir / "jfk_inaugural_1961.wav", pb.LINEAR16, 16000)
    text = "Let me read your full order back to you, item by item, before we confirm it today."
    async with tts_server() as (_, stub):
        call = Call(stub)
        await call.send(config=config(pb.LINEAR16, 16000).config)
        await call.send(speak=pb.Speak(text=text, speak_id="reply"))
        await call.wait_for("audio")
        # The caller stays silent for 1 s of the reply, then talks over it (real time).
        silence = bytes(640)
        loop = asyncio.get_running_loop()
        t0 = loop.time()
        chunks = [silence] * 50 + [caller[i : i + 640] for i in range(0, 640 * 100, 640)]
        for k, chunk in enumerate(chunks):
            await asyncio.sleep(max(0.0, t0 + 0.02 * k - loop.time()))
            await call.send(audio=pb.AudioChunk(data=chunk))
        interrupted = await call.wait_for("interrupted")
        await call.close()
    kinds = [m.WhichOneof("event") for _, m in call.events]
    cut = kinds.index("interrupted")
    assert kinds.index("speech") < cut and "audio" not in kinds[cut:]  # nothing after it
    info = interrupted.interrupted
    assert info.speak_id == "reply"
    sent_ms = sum(len(m.audio.data) for m in call.of("audio")) / 32
    assert 0 < info.played_ms <= sent_ms
    words = [w.strip(".,") for w in text.split()]
    played = list(info.words_played)
    assert played == words[: len(played)]  # a prefix of what was sent, in order
    assert 1 <= len(played) < len(words)
    assert not call.of("playback_finished")


async def test_synthesize_streams_audio_with_word_times() -> None:
    async with tts_server() as (_, stub):
        chunks = [
            r
            async for r in stub.Synthesize(
                pb.SynthesizeRequest(
                    text=REPLY,
                    output_audio=pb.AudioFormat(encoding=pb.LINEAR16, sample_rate_hertz=24000),
                )
            )
        ]
    assert chunks[-1].is_last and not any(c.is_last for c in chunks[:-1])
    assert [c.sequence_number for c in chunks] == list(range(1, len(chunks) + 1))
    words = [w.word for c in chunks for w in c.words]
    assert [w.lower() for w in words] == [w.strip(".").lower() for w in REPLY.split()]
    pcm = np.frombuffer(b"".join(c.data for c in chunks), "<i2")
    assert 2.0 < len(pcm) / 24000 < 6.0


@pytest.mark.parametrize(
    ("speak", "expect"),
    [
        (pb.Speak(text="   ", speak_id="x"), "speak.text is empty"),
        (pb.Speak(text="a" * 100_000, speak_id="x"), "over tts.max_chars=10000"),
        # One limit: what the servicer accepts, the voice speaks (v0.1: 20,000 vs 10,000).
        (pb.Speak(text="a " * 5_001, speak_id="x"), "over tts.max_chars=10000"),
        # v0.1: int() raised ValueError past 4,300 digits and the call ended with INTERNAL.
        (pb.Speak(text="7" * 5000, speak_id="x"), "speak.text: text: has a run of 5000 digits"),
        (pb.Speak(text="hi", voice="nobody", speak_id="x"), "speak.voice='nobody' is not loaded"),
        (pb.Speak(text="hi", voice="n" * 300_000, speak_id="x"), "(300000 characters) is not"),
        (pb.Speak(text="hi", rate=9.0, speak_id="x"), "speak.rate=9 is outside 0.5..2.0"),
    ],
    ids=["empty", "100kB", "one-limit", "long-number", "unknown-voice", "huge-voice", "rate"],
)
async def test_bad_speak_is_an_error_event_and_the_call_goes_on(
    speak: pb.Speak, expect: str
) -> None:
    async with tts_server() as (_, stub):
        call = Call(stub)
        await call.send(config=config().config)
        await call.send(speak=speak)
        await call.send(speak=pb.Speak(text="Still here.", speak_id="ok"))
        await call.wait_for("playback_finished")
        await call.close()
    (err,) = call.of("error")
    assert err.error.code == grpc.StatusCode.INVALID_ARGUMENT.value[0]
    assert expect in err.error.message and err.error.scope == "speak"
    assert err.error.speak_id == "x"
    assert len(err.error.message) < 300  # client input is never echoed without bound


async def test_synthesize_of_an_absurd_number_is_invalid_argument() -> None:
    async with tts_server() as (_, stub):
        with pytest.raises(grpc.aio.AioRpcError) as info:
            async for _ in stub.Synthesize(pb.SynthesizeRequest(text="7" * 5000)):
                pass
        assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "run of 5000 digits" in (info.value.details() or "")
        # ... and the server still speaks.
        got = [c async for c in stub.Synthesize(pb.SynthesizeRequest(text="Fine."))]
        assert got and got[-1].is_last


async def test_markup_is_spoken_not_read_out() -> None:
    async with tts_server() as (_, stub):
        call = Call(stub)
        await call.send(config=config().config)
        await call.send(
            speak=pb.Speak(text="<speak>Hello <b>there</b><break/></speak>", speak_id="m")
        )
        fin = await call.wait_for("playback_finished")
        await call.close()
    assert 300 < fin.playback_finished.duration_ms < 2500
    assert not call.of("error")


async def test_list_voices_reports_the_loaded_voice() -> None:
    async with tts_server() as (_, stub):
        resp = await stub.ListVoices(pb.ListVoicesRequest())
    (voice,) = resp.voices
    assert voice.sample_rate_hertz == 22050 and voice.is_default and voice.language.startswith("en")
