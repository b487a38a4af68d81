"""Client, CLI and demo against a server with the real engines (Whisper base + the bundled voice).

Marked ``model``: these need ``voxgate.gateway.runtime.build_hub`` to load the engines (no network).
They fail, never skip, while the hub is unavailable, so that enabling them is a visible step.
"""

from __future__ import annotations

import argparse
import asyncio
import io
import re
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import jiwer
import numpy as np
import pytest

from voxgate.cli.call import CallOptions, play_call
from voxgate.cli.demo import demo_call
from voxgate.cli.timeline import build_timeline
from voxgate.gateway.config import load_config
from voxgate.gateway.runtime import build_hub
from voxgate.gateway.server import GatewayServer
from voxgate.gateway.testing.server import running_server
from voxgate_client import (
    AS_FAST_AS_ALLOWED,
    REALTIME,
    AudioOut,
    CallConfig,
    PlaybackFinished,
    PlaybackInterrupted,
    SpeechBegin,
    Transcript,
    VoxgateClient,
    VoxgateSyncClient,
    decode_pcm16,
    load_audio,
    read_wav,
    sample_call_path,
    stream_audio,
)

pytestmark = pytest.mark.model

CLIP = "jfk_inaugural_1961.wav"


def normalise(text: str) -> str:
    return " ".join(re.sub(r"[^\w\s']", " ", text.lower()).split())


@pytest.fixture
async def server() -> AsyncIterator[GatewayServer]:
    """A loopback server with the real engines (the hub the engine work provides)."""
    hub = build_hub(load_config(None, {"engines": "asr,tts"}))
    assert hub is not None
    async with running_server(hub=hub) as srv:
        yield srv


def reference(manifest: list[dict[str, Any]], name: str) -> str:
    return next(row["text"] for row in manifest if row["file"] == name)


async def test_cli_transcribes_a_shared_clip_within_15_percent_wer(
    server: GatewayServer, speech_dir: Path, manifest: list[dict[str, Any]], tmp_path: Path
) -> None:
    out = io.StringIO()
    result = await play_call(
        CallOptions(
            file=speech_dir / CLIP,
            target=server.target,
            bot="echo",
            out=tmp_path / "reply.wav",
            timeline=tmp_path / "call.png",
        ),
        stream=out,
    )
    assert result.exit_code == 0, out.getvalue()
    hyp = normalise(" ".join(t.text for t in result.finals))
    ref = normalise(reference(manifest, CLIP))
    assert jiwer.wer(ref, hyp) <= 0.15, (ref, hyp)
    # The echo bot spoke back and its audio was saved.
    pcm, _ = read_wav(tmp_path / "reply.wav")
    assert len(pcm) > 0 and int(np.abs(pcm).max()) > 1000
    assert "final -> first reply audio" in out.getvalue()


async def test_speak_streams_audio_out_and_finishes(server: GatewayServer) -> None:
    async with VoxgateClient(server.target) as client:
        assert await client.list_voices()
        async with await client.converse(CallConfig()) as call:
            sid = await call.speak("Hello, this is a test of the voice gateway.")
            frames: list[AudioOut] = []
            async for ev in call:
                if isinstance(ev, AudioOut):
                    frames.append(ev)
                if isinstance(ev, PlaybackFinished):
                    assert ev.speak_id == sid
                    break
    assert frames and all(f.speak_id == sid for f in frames) and frames[-1].is_last
    seqs = [f.sequence_number for f in frames]
    assert seqs == sorted(seqs)
    pcm = decode_pcm16(b"".join(f.data for f in frames), "linear16")
    assert len(pcm) > 16000 * 0.8 and int(np.abs(pcm).max()) > 1000


async def test_caller_speech_barges_in_as_a_typed_event(
    server: GatewayServer, speech_dir: Path
) -> None:
    caller = load_audio(speech_dir / CLIP)
    async with (
        VoxgateClient(server.target) as client,
        await client.converse(CallConfig()) as call,
    ):
        long_text = "Let me read you our full opening hours and every holiday exception. " * 4
        sid = await call.speak(long_text)
        sender: asyncio.Task[None] | None = None
        interrupted: PlaybackInterrupted | None = None
        async for ev in call:
            if isinstance(ev, AudioOut) and sender is None:
                sender = asyncio.create_task(stream_audio(call, caller, REALTIME))
            if isinstance(ev, PlaybackInterrupted):
                interrupted = ev
                break
        assert sender is not None
        sender.cancel()
        await asyncio.wait([sender])
    assert interrupted is not None and interrupted.speak_id == sid
    assert interrupted.barge_in and interrupted.played_ms > 0


async def test_interim_and_final_transcripts_are_typed(
    server: GatewayServer, speech_dir: Path
) -> None:
    audio = load_audio(speech_dir / CLIP)
    async with (
        VoxgateClient(server.target) as client,
        await client.converse(CallConfig(interim_results=True, word_timestamps=True)) as call,
    ):
        await stream_audio(call, audio, AS_FAST_AS_ALLOWED)
        await call.flush()
        await call.hangup()
        events = [e async for e in call]
    finals = [e for e in events if isinstance(e, Transcript) and e.is_final]
    assert finals and all(f.words for f in finals)
    assert any(isinstance(e, SpeechBegin) for e in events)


async def test_sync_client_transcribes_and_synthesizes(
    server: GatewayServer, speech_dir: Path, tmp_path: Path
) -> None:
    def script() -> tuple[list[Transcript], Path]:
        with VoxgateSyncClient(server.target) as c:
            return (
                c.transcribe_file(speech_dir / CLIP),
                c.synthesize_to_wav("Good morning.", tmp_path / "tts.wav"),
            )

    finals, wav = await asyncio.to_thread(script)
    assert "country" in " ".join(t.text for t in finals).lower()
    pcm, rate = read_wav(wav)
    assert rate == 16000 and len(pcm) > 0


async def test_demo_has_one_barge_in_both_transcripts_and_a_true_timeline(
    tmp_path: Path,
) -> None:
    # --fast: the real-time default runs in tests/test_readme.py (the README's first command,
    # with the same barge-in and transcript checks on its output); one 30 s demo is enough.
    ns = argparse.Namespace(
        audio=None,
        out=tmp_path / "reply.wav",
        timeline=tmp_path / "call.png",
        engines="asr,tts",
        fast=True,
    )
    result = await demo_call(ns)
    assert result.exit_code == 0
    finals = result.finals
    assert [f.utterance_index for f in finals] == [0, 1]
    assert "your country" in finals[0].text.lower()
    assert "block books" in finals[1].text.lower()
    # The greeting is heard out, the answer to the first sentence is cut by the second one
    # (barge-in), the answer to the second plays to its end.
    greeting, first_answer, second_answer = (sid for sid, _ in result.replies)
    interrupted = [e for e in result.events if isinstance(e, PlaybackInterrupted)]
    assert len(interrupted) == 1
    (cut,) = interrupted
    assert cut.barge_in and cut.speak_id == first_answer and cut.played_ms > 0
    finished = {e.speak_id for e in result.events if isinstance(e, PlaybackFinished)}
    assert finished == {greeting, second_answer}
    pcm, _ = read_wav(tmp_path / "reply.wav")
    assert len(pcm) > 16000  # the greeting, a cut answer and a whole one
    assert (tmp_path / "call.png").stat().st_size > 20_000

    # The picture's data: the caller's 19.1 s keep their length on the call clock (plus the
    # waits for the bot inside the audio), and the cut reply ends at the barge-in line.
    assert result.log is not None
    tl = build_timeline(result.log)
    caller, rate = read_wav(sample_call_path())
    inner_waits = sum(w.end_s - w.start_s for w in tl.waits if w.start_s >= tl.caller_x[0])
    assert tl.caller_span_s == pytest.approx(len(caller) / rate + inner_waits, abs=1e-6)
    assert [s.label.split(":")[0] for s in tl.speech] == ["utt 0", "utt 1"]
    (barge,) = tl.interruptions
    (track,) = [r for r in tl.replies if r.speak_id == first_answer]
    assert barge.at_s == pytest.approx(track.end_s)
    assert track.end_s - track.start_s == pytest.approx(cut.played_ms / 1000, abs=0.021)
