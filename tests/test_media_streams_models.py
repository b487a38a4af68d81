"""The media-streams adapter with the real engines: Whisper hears the caller, Piper answers.

A replayed Twilio stream (real speech from the shared set, μ-law 8 kHz in real time) through
the adapter and a loopback gateway with the bundled Whisper and Piper voice:

* the bot hears the caller's words (WER of its finals against the clip's reference);
* the caller's recording of the reply is intelligible (the played audio, as the replayer's
  playback clock played it, transcribed by the same Whisper through ``StreamingRecognize``);
* a caller talking over a long reply is a barge-in: the adapter sends ``clear``, the replayer
  drops its buffer, the bot learns what was heard, and the bot's mark queued behind the cut
  reply still comes back.
"""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import jiwer
import pytest

from voxgate.bridges.media_streams import MediaStreamsConfig, MediaStreamServer
from voxgate.bridges.media_streams.testing import ReplayClient
from voxgate.gateway.config import load_config
from voxgate.gateway.runtime import build_hub
from voxgate.gateway.server import GatewayServer
from voxgate.gateway.testing.server import running_server
from voxgate_client import (
    AS_FAST_AS_ALLOWED,
    CallConfig,
    PlaybackInterrupted,
    Transcript,
    VoiceCall,
    VoxgateClient,
    WireAudio,
    stream_audio,
)

pytestmark = pytest.mark.model

CLIP = "librispeech_1988-24833-0000.wav"
REPLY = "Thank you for calling. Your message has been received, and we will call you back."
LONG = (
    "Hello, and thank you for calling the voxgate test line. This greeting is long on purpose, "
    "so that the caller has plenty of time to interrupt it while it is still playing."
)


def normalise(text: str) -> str:
    return " ".join(re.sub(r"[^\w\s']", " ", text.lower()).split())


def reference(speech_dir: Path, name: str) -> str:
    rows = [json.loads(line) for line in (speech_dir / "manifest.jsonl").read_text().splitlines()]
    return str(next(r["text"] for r in rows if r["file"] == name))


@pytest.fixture
async def gateway() -> AsyncIterator[GatewayServer]:
    hub = build_hub(load_config(None, {"engines": "asr,tts"}))
    assert hub is not None
    async with running_server(hub=hub) as srv:
        yield srv


def url(adapter: MediaStreamServer) -> str:
    host, port = adapter.address
    return f"ws://{host}:{port}/twilio"


async def until(pred: Any, what: str, timeout_s: float = 120.0) -> None:
    for _ in range(int(timeout_s / 0.05)):
        if pred():
            return
        await asyncio.sleep(0.05)
    raise AssertionError(f"never happened: {what}")


async def transcribe_mulaw(target: str, audio: bytes) -> str:
    """What Whisper (through the gateway) hears in 8 kHz μ-law audio."""
    async with (
        VoxgateClient(target) as client,
        await client.recognize(CallConfig(encoding="mulaw", sample_rate_hz=8000)) as call,
    ):
        await stream_audio(
            call, WireAudio(audio + b"\xff" * 8000, "mulaw", 8000), AS_FAST_AS_ALLOWED
        )
        await call.flush()
        await call.done_sending()
        finals = [e.text async for e in call if isinstance(e, Transcript) and e.is_final]
    return " ".join(finals)


async def test_the_bot_hears_the_caller_and_the_caller_hears_the_reply(
    gateway: GatewayServer, speech_dir: Path
) -> None:
    heard: list[str] = []
    answered = asyncio.Event()

    async def bot(call: VoiceCall) -> None:
        async for event in call:
            if isinstance(event, Transcript) and event.is_final and event.text.strip():
                heard.append(event.text)
                if not answered.is_set():
                    answered.set()
                    await call.speak(REPLY)

    config = MediaStreamsConfig(host="127.0.0.1", port=0, gateway=gateway.target, language="en")
    async with MediaStreamServer(config, bot) as adapter, ReplayClient(url(adapter)) as peer:
        await peer.begin()
        await peer.send_wav(speech_dir / CLIP)
        # The caller listens while the reply plays (on the replayer's own playback clock).
        listening = asyncio.create_task(peer.send_silence(30_000))
        await until(
            lambda: any(m.name.startswith("voxgate-reply-end:") for m in peer.returned),
            "the reply was played and its mark returned",
        )
        listening.cancel()
        await asyncio.wait([listening])
        await peer.send_stop()
        assert (await peer.wait_closed())[0] == 1000
    assert peer.violations == []
    ref = normalise(reference(speech_dir, CLIP))
    assert jiwer.wer(ref, normalise(" ".join(heard))) <= 0.15, (ref, heard)
    reply_heard = await transcribe_mulaw(gateway.target, bytes(peer.played))
    assert jiwer.wer(normalise(REPLY), normalise(reply_heard)) <= 0.2, reply_heard
    assert not any(m.cleared for m in peer.returned)


async def test_barge_in_clears_the_providers_buffer_and_returns_its_marks(
    gateway: GatewayServer, speech_dir: Path
) -> None:
    interrupted: list[PlaybackInterrupted] = []

    async def bot(call: VoiceCall) -> None:
        await call.speak(LONG)
        await call.mark("after-greeting")
        async for event in call:
            if isinstance(event, PlaybackInterrupted):
                interrupted.append(event)

    config = MediaStreamsConfig(host="127.0.0.1", port=0, gateway=gateway.target, language="en")
    async with MediaStreamServer(config, bot) as adapter, ReplayClient(url(adapter)) as peer:
        await peer.begin()
        # Let the greeting start playing, then talk over it.
        listening = asyncio.create_task(peer.send_silence(30_000))
        await until(lambda: len(peer.played) >= 8000, "a second of the greeting was heard")
        listening.cancel()
        await asyncio.wait([listening])
        await peer.send_wav(speech_dir / CLIP)
        await until(lambda: peer.clears, "the adapter sent clear")
        await until(lambda: interrupted, "the bot learnt of the barge-in")
        # The bot's mark behind the cut greeting is still reached, and the provider confirms it.
        await until(
            lambda: any(m.name == "voxgate-mark:after-greeting" for m in peer.returned),
            "the bot's mark came back after the barge-in",
        )
        await peer.send_silence(500)
        await peer.send_stop()
        await peer.wait_closed()
    assert peer.violations == []
    reply_end = [m for m in peer.returned if m.name.startswith("voxgate-reply-end:")]
    # The greeting never played to its end: no reply-end mark came back as played.
    assert not [m for m in reply_end if not m.cleared]
    assert adapter.records[-1].clears >= 1
    cut = interrupted[0]
    assert cut.barge_in and 1000 <= cut.played_ms < 12_000
    # What the caller heard stops soon after the barge-in (whole reply would be ~10 s).
    assert len(peer.played) / 8000 < cut.played_ms / 1000 + 1.0
