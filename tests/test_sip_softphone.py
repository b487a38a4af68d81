"""A real softphone (baresip) calls through Kamailio into two bridges and the real engines.

The phone plays a recorded sentence as its microphone and records what it hears. The bot (an
in-process handler on the bot contract) repeats each final transcript and hangs up on ``#``, so:
the bot hears the words (Whisper over G.711), the phone's recording contains the reply (Piper,
then Whisper again for the WER), a key press arrives as RFC 4733, hold and resume are
re-INVITEs through the proxy, the caller hangs up one call and the bridge the other, and the two
calls land on different bridges. Binaries come from Debian packages CI installs (``baresip``,
``kamailio``); a missing one fails the test with the package name.
"""

from __future__ import annotations

import asyncio
import json
import wave
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from calls import encode_wav

from benchmarks import _wer
from voxgate.bridges.sip import BridgeConfig, SipBridge
from voxgate.bridges.sip.testing import Baresip, running_kamailio, write_wav_8k
from voxgate.common.pcm import MULAW_DECODE
from voxgate.gateway.config import load_config
from voxgate.gateway.testing.server import running_server
from voxgate.v1 import voxgate_pb2 as pb
from voxgate_client import (
    CallConfig,
    Dtmf,
    PlaybackFinished,
    ServerEvent,
    Transcript,
    VoiceCall,
    VoxgateSyncClient,
)

pytestmark = [pytest.mark.e2e, pytest.mark.model]

CLIP = "librispeech_1988-24833-0000.wav"  # 3.3 s, nine words


async def echo_until_hash(call: VoiceCall) -> None:
    """Repeat each final transcript; hang up on ``#`` (an ordinary bot on the contract)."""
    async for event in call:
        if isinstance(event, Transcript) and event.is_final and event.text.strip():
            await call.speak(event.text)
        elif isinstance(event, Dtmf) and event.digit == "#":
            await call.hangup()
            return


async def wait_for(pred: Callable[[], bool], what: str, limit: int = 1200) -> None:
    """Poll every 50 ms, at most ``limit`` times (a bound on waiting, never a timing check)."""
    for _ in range(limit):
        if pred():
            return
        await asyncio.sleep(0.05)
    raise AssertionError(f"never happened: {what}")


def caller_wav(speech_dir: Path, path: Path) -> None:
    """The clip at 8 kHz after 0.5 s of silence, then 60 s of silence.

    baresip's file source ends the call when the file ends, so the silence keeps the line open
    for the rest of the test (which hangs up long before).
    """
    pcm = MULAW_DECODE[np.frombuffer(encode_wav(speech_dir / CLIP, pb.MULAW, 8000), np.uint8)]
    silence = np.zeros(8000, np.int16)
    audio = np.concatenate([silence[:4000], pcm.astype(np.int16), np.tile(silence, 60)])
    write_wav_8k(path, audio.astype("<i2").tobytes())


def read_wav(path: Path) -> tuple[bytes, int]:
    with wave.open(str(path), "rb") as w:
        assert w.getnchannels() == 1 and w.getsampwidth() == 2
        return w.readframes(w.getnframes()), w.getframerate()


def transcribe(target: str, wav: Path) -> list[Transcript]:
    """Final transcripts of a WAV through the gateway (the real Whisper)."""
    client = VoxgateSyncClient(target)
    try:
        return client.transcribe_file(wav, config=CallConfig(sample_rate_hz=8000, language="en"))
    finally:
        client.close()


async def test_softphone_through_kamailio(speech_dir: Path, tmp_path: Path) -> None:
    from voxgate.gateway.runtime import build_hub

    rows = [json.loads(x) for x in (speech_dir / "manifest.jsonl").read_text().splitlines()]
    reference = next(r["text"] for r in rows if r["file"] == CLIP)
    caller_wav(speech_dir, tmp_path / "caller.wav")
    overrides: dict[str, Any] = {"engines": "asr,tts"}
    hub = build_hub(load_config(None, overrides))
    events: dict[str, list[ServerEvent]] = defaultdict(list)

    def kinds(cid: str, kind: type) -> list[Any]:
        return [e for e in events[cid] if isinstance(e, kind)]

    async with running_server(hub=hub, **overrides) as srv:
        bridges = [
            SipBridge(
                BridgeConfig(
                    listen_host="127.0.0.1",
                    listen_port=0,
                    gateway=srv.target,
                    rtp_port_min=30000 + 5000 * i,
                    rtp_port_max=34999 + 5000 * i,
                    language="en",
                ),
                echo_until_hash,
                on_event=lambda cid, ev: events[cid].append(ev),
            )
            for i in range(2)
        ]
        for b in bridges:
            await b.start()
        try:
            async with (
                running_kamailio([b.address for b in bridges], tmp_path / "kamailio") as kam,
                Baresip(tmp_path / "phone", tmp_path / "caller.wav") as phone,
            ):
                uri = f"sip:bot@{kam.address[0]}:{kam.address[1]}"

                def only_call() -> tuple[SipBridge, str]:
                    [(b, c)] = [(b, c) for b in bridges for c in b.calls]
                    return b, c

                # Call 1: speech in, the echo out, a key, hold/resume, the caller hangs up.
                assert (await phone.command("dial", uri))["ok"], phone.log()[-2000:]
                await phone.wait_event("CALL_ESTABLISHED")
                first, cid = only_call()
                await wait_for(
                    lambda: any(t.is_final and t.text for t in kinds(cid, Transcript)),
                    "the bot heard the caller",
                )
                await wait_for(lambda: bool(kinds(cid, PlaybackFinished)), "the echo played out")
                assert (await phone.command("sndcode", "1"))["ok"]
                await wait_for(lambda: [d.digit for d in kinds(cid, Dtmf)] == ["1"], "key 1")
                assert (await phone.command("hold"))["ok"]
                await wait_for(
                    lambda: first.calls[cid].choice.direction == "recvonly", "hold re-INVITE"
                )
                assert (await phone.command("resume"))["ok"]
                await wait_for(
                    lambda: first.calls[cid].choice.direction == "sendrecv", "resume re-INVITE"
                )
                assert (await phone.command("hangup"))["ok"]
                await wait_for(lambda: not first.calls, "caller hang-up reached the bridge")
                await phone.wait_event("CALL_CLOSED")

                # Call 2 (the other bridge): '#' makes the bot hang up; the BYE reaches the phone.
                phone.events.clear()
                assert (await phone.command("dial", uri))["ok"]
                await phone.wait_event("CALL_ESTABLISHED")
                second, cid2 = only_call()
                assert second is not first
                assert (await phone.command("sndcode", "#"))["ok"]
                await phone.wait_event("CALL_CLOSED")
                await wait_for(lambda: not second.calls, "bridge hang-up torn down")
                recordings = phone.recordings()
        finally:
            for b in bridges:
                await b.aclose()
        heard = " ".join(t.text for t in kinds(cid, Transcript) if t.is_final)
        assert [r for c, r in first.ended if c == cid] == ["caller hung up (BYE)"]
        assert first.stats["bye_sent"] == 0 and second.stats["bye_sent"] == 1
        assert _wer.wer(reference, heard) <= 0.15, (reference, heard)
        # What the phone heard on call 1, through Whisper again.
        assert recordings, phone.log()[-2000:]
        pcm, rate = read_wav(recordings[0])
        assert rate == 8000 and len(pcm) > 16000, (rate, len(pcm))
        finals = await asyncio.to_thread(transcribe, srv.target, recordings[0])
    reply = " ".join(t.text for t in finals)
    assert _wer.wer(reference, reply) <= 0.3, (reference, heard, reply)
