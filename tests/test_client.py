"""The Python client against a real VAD-only server on a loopback port.

Everything a VAD-only server can produce (SessionStarted, SpeechBegin/End, MarkReached, Dtmf)
round-trips into typed events; server errors surface as VoxgateError with code, message and
quota; cancelling leaves no task behind; the blocking wrapper and the CLI/demo run end to end.
Transcript/AudioOut/barge-in paths need the real engines: see test_client_models.py.
"""

from __future__ import annotations

import argparse
import asyncio
import io
import struct
import subprocess
import sys
import threading
import wave
from collections.abc import Callable
from pathlib import Path

import grpc
import pytest
from calls import truth

from voxgate.cli.call import CallOptions, play_call, run_call
from voxgate.cli.demo import run_demo
from voxgate.cli.timeline import build_timeline
from voxgate.gateway.testing.server import running_server
from voxgate_client import (
    AS_FAST_AS_ALLOWED,
    UNPACED,
    CallConfig,
    CallEndedError,
    Dtmf,
    MarkReached,
    SessionStarted,
    SpeechBegin,
    SpeechEnd,
    VoxgateClient,
    VoxgateError,
    VoxgateSyncClient,
    load_audio,
    sample_call_path,
    stream_audio,
)

pytestmark = pytest.mark.e2e

FAST = {"limits": {"max_realtime_factor": 1000.0}}


def call_wav(speech_dir: Path, prefix: str = "call_02") -> Path:
    return sorted((speech_dir / "calls").glob(f"{prefix}*.wav"))[0]


async def wait_idle(srv) -> None:
    assert srv.servicer is not None
    for _ in range(500):  # the server notices the cancellation within a few loop turns
        if srv.servicer.calls.active_calls == 0:
            return
        await asyncio.sleep(0.01)


async def test_vad_only_events_round_trip_as_typed_events(speech_dir: Path) -> None:
    wav = call_wav(speech_dir)
    audio = load_audio(wav)
    async with running_server(**FAST) as srv, VoxgateClient(srv.target) as client:
        assert await client.health() == "SERVING"
        assert await client.list_models() == []
        assert await client.list_voices() == []
        call = await client.converse(CallConfig(call_id="typed-events"))
        assert isinstance(call.session, SessionStarted)
        assert not call.session.has_asr and not call.session.has_tts

        async def send() -> None:
            await stream_audio(call, audio, UNPACED)
            await call.dtmf("5", duration_ms=80)
            await call.mark("after-audio")
            await call.hangup()

        sender = asyncio.create_task(send())
        events = [e async for e in call]
        await sender
        assert await call.error() is None
        with pytest.raises(CallEndedError):
            await call.send_audio(b"\0\0")
        await call.aclose()

    assert events[0] == call.session
    speech = [e for e in events if isinstance(e, SpeechBegin | SpeechEnd)]
    gt = truth(wav)
    assert len(speech) == 2 * len(gt)
    for i, t in enumerate(gt):
        begin, end = speech[2 * i], speech[2 * i + 1]
        assert isinstance(begin, SpeechBegin) and isinstance(end, SpeechEnd)
        assert begin.utterance_index == end.utterance_index == i
        assert abs(begin.offset_ms - 1000 * t["speech_start_s"]) <= 250
        assert abs(end.offset_ms - 1000 * t["speech_end_s"]) <= 250
    assert Dtmf("5", 80) in events
    assert events[-1] == MarkReached("after-audio")
    # received_s is the client clock, excluded from equality, and never decreases.
    times = [e.received_s for e in events]
    assert times == sorted(times) and times[0] > 0


async def test_recognize_call_yields_speech_events(speech_dir: Path) -> None:
    audio = load_audio(call_wav(speech_dir), mulaw=True)
    assert (audio.encoding, audio.sample_rate_hz) == ("mulaw", 8000)
    async with running_server(**FAST) as srv, VoxgateClient(srv.target) as client:
        call = await client.recognize(CallConfig(encoding="mulaw", sample_rate_hz=8000))
        async with call:
            await stream_audio(call, audio, UNPACED)
            await call.done_sending()
            events = [e async for e in call]
    assert len([e for e in events if isinstance(e, SpeechEnd)]) == len(truth(call_wav(speech_dir)))


async def test_bad_config_raises_from_converse_with_code_and_message() -> None:
    async with running_server() as srv, VoxgateClient(srv.target) as client:
        with pytest.raises(VoxgateError) as info:
            await client.converse(CallConfig(sample_rate_hz=44100))
        assert info.value.code == grpc.StatusCode.INVALID_ARGUMENT
        assert "sample_rate_hertz=44100 is not supported" in info.value.message
        assert info.value.quota is None
        await wait_idle(srv)
        assert srv.servicer is not None and srv.servicer.calls.active_calls == 0


async def test_too_fast_audio_is_resource_exhausted_with_quota_from_iteration_and_send() -> None:
    limits = {"limits": {"max_realtime_factor": 2.0, "burst_allowance_ms": 1000}}
    async with running_server(**limits) as srv, VoxgateClient(srv.target) as client:
        call = await client.converse(CallConfig())
        audio = load_audio(sample_call_path())
        sender = asyncio.create_task(stream_audio(call, audio, UNPACED))
        with pytest.raises(VoxgateError) as info:
            async for _ in call:
                pass
        err = info.value
        assert err.code == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert "max_realtime_factor=2x" in err.message
        assert err.quota == "max_realtime_factor"
        # The sender fails with the same status (not grpc's local INTERNAL), or finished first.
        await asyncio.wait([sender])
        if sender.exception() is not None:
            send_err = sender.exception()
            assert isinstance(send_err, VoxgateError)
            assert send_err.code == grpc.StatusCode.RESOURCE_EXHAUSTED
            assert send_err.quota == "max_realtime_factor"
        assert await call.error() is err
        await call.aclose()


async def test_as_fast_as_allowed_pacing_passes_the_default_limits(speech_dir: Path) -> None:
    audio = load_audio(speech_dir / "jfk_inaugural_1961.wav")
    async with (
        running_server() as srv,
        VoxgateClient(srv.target) as client,
        await client.converse(CallConfig()) as call,
    ):
        await stream_audio(call, audio, AS_FAST_AS_ALLOWED)
        # flush first: the server drops the SPEECH_END of an utterance cut by a bare hangup
        # (gateway/session.py returns from recv without flushing pending emits).
        await call.flush()
        await call.hangup()
        events = [e async for e in call]
        assert await call.error() is None
    assert any(isinstance(e, SpeechEnd) for e in events)


async def test_speak_without_voice_and_synthesize_surface_typed_errors() -> None:
    async with running_server() as srv, VoxgateClient(srv.target) as client:
        call = await client.converse(CallConfig())
        await call.speak("hello")
        with pytest.raises(VoxgateError) as info:
            async for _ in call:
                pass
        assert info.value.code == grpc.StatusCode.FAILED_PRECONDITION
        assert "without a voice" in info.value.message
        with pytest.raises(VoxgateError) as syn:
            async for _ in client.synthesize("hello"):
                pass
        assert syn.value.code == grpc.StatusCode.UNIMPLEMENTED


@pytest.mark.parametrize("how", ["aclose", "async-with", "cancel-consumer", "client-exit"])
async def test_cancelling_mid_call_leaves_no_task_and_no_server_call(
    speech_dir: Path, how: str
) -> None:
    audio = load_audio(call_wav(speech_dir))
    async with running_server(**FAST) as srv:
        before = asyncio.all_tasks()
        async with VoxgateClient(srv.target) as client:
            call = await client.converse(CallConfig())
            sender = asyncio.create_task(stream_audio(call, audio, AS_FAST_AS_ALLOWED))
            first_speech = asyncio.Event()

            async def consume() -> None:
                async for ev in call:
                    if isinstance(ev, SpeechBegin):
                        first_speech.set()

            consumer = asyncio.create_task(consume())
            await first_speech.wait()
            assert srv.servicer is not None and srv.servicer.calls.active_calls == 1
            if how == "aclose":
                await call.aclose()
            elif how == "async-with":
                async with call:
                    pass
            elif how == "cancel-consumer":
                consumer.cancel()
                await asyncio.wait([consumer])
                await call.aclose()
            if how != "client-exit":
                assert call.done
                with pytest.raises(CallEndedError):
                    await call.send_audio(b"\0\0")
        # client-exit: leaving the client closes the open call.
        await asyncio.wait([sender, consumer])
        assert call.done
        assert sender.cancelled() or isinstance(sender.exception(), CallEndedError | type(None))
        await wait_idle(srv)
        assert srv.servicer.calls.active_calls == 0
        # Tasks the grpc server itself keeps (waiting for the next RPC) are not the client's.
        leftover = {
            t for t in asyncio.all_tasks() - before if "_request_registered_call" not in repr(t)
        }
        assert leftover == set()


async def test_sync_client_runs_a_call_in_its_private_loop(speech_dir: Path) -> None:
    wav = call_wav(speech_dir)
    async with running_server(**FAST) as srv:

        def script() -> tuple[str, list, list]:
            with VoxgateSyncClient(srv.target) as c:
                return c.health(), c.list_voices(), c.call_file(wav)

        health, voices, events = await asyncio.to_thread(script)
    assert health == "SERVING" and voices == []
    assert isinstance(events[0], SessionStarted)
    assert len([e for e in events if isinstance(e, SpeechEnd)]) == len(truth(wav))
    assert not [t for t in threading.enumerate() if t.name == "voxgate-sync-loop"]


async def test_sync_client_raises_typed_errors() -> None:
    async with running_server() as srv:

        def script() -> None:
            with VoxgateSyncClient(srv.target) as c:
                c.synthesize_to_wav("hello", "unused.wav")

        with pytest.raises(VoxgateError) as info:
            await asyncio.to_thread(script)
    assert info.value.code == grpc.StatusCode.UNIMPLEMENTED


async def test_cli_call_prints_events_and_draws_the_timeline(tmp_path: Path) -> None:
    out = io.StringIO()
    async with running_server() as srv:
        result = await play_call(
            CallOptions(
                file=Path(sample_call_path()),
                target=srv.target,
                bot="echo",
                out=tmp_path / "reply.wav",
                timeline=tmp_path / "call.png",
                mulaw=True,
            ),
            stream=out,
        )
    text = out.getvalue()
    assert result.exit_code == 0, text
    # 8 kHz mu-law may split the first sentence at its pause: at least the two utterances.
    assert text.count("caller starts speaking") == text.count("caller stops speaking") >= 2
    assert "no ASR" in text and "latency" in text and "p50 ms" in text
    assert (tmp_path / "call.png").stat().st_size > 10_000
    assert not (tmp_path / "reply.wav").exists()  # no voice on a VAD-only server


async def test_run_call_reports_bad_input_and_server_errors(tmp_path: Path) -> None:
    bad = tmp_path / "stereo.wav"
    with wave.open(str(bad), "wb") as w:
        w.setnchannels(2)
        w.setsampwidth(2)
        w.setframerate(16000)
        w.writeframes(b"\0" * 640)
    ns = argparse.Namespace(
        file=bad,
        target="127.0.0.1:1",
        realtime=False,
        say=[],
        bot="",
        out=None,
        timeline=None,
        mulaw=False,
    )
    assert await run_call(ns) == 2
    async with running_server(limits={"max_concurrent_calls": 1}) as srv:
        ns.file, ns.target, ns.say = Path(sample_call_path()), srv.target, ["hello"]
        # speak on a server without a voice is printed, never sent, so the call succeeds...
        assert await run_call(ns) == 0


async def test_demo_runs_vad_only(tmp_path: Path) -> None:
    ns = argparse.Namespace(
        audio=None,
        out=tmp_path / "reply.wav",
        timeline=tmp_path / "call.png",
        engines="none",
        fast=True,
    )
    assert await run_demo(ns) == 0
    assert (tmp_path / "call.png").stat().st_size > 10_000


def _wav(path: Path, *, channels: int = 1, width: int = 2, rate: int = 16000) -> Path:
    with wave.open(str(path), "wb") as w:
        w.setnchannels(channels)
        w.setsampwidth(width)
        w.setframerate(rate)
        w.writeframes(b"\0" * channels * width * 160)
    return path


def _float_wav(path: Path) -> Path:
    """A 32-bit float WAV (format tag 3), as many editors export; not PCM16."""
    data = b"\0" * 4 * 160
    fmt = struct.pack("<HHIIHH", 3, 1, 16000, 16000 * 4, 4, 32)
    body = b"WAVE" + b"fmt " + struct.pack("<I", len(fmt)) + fmt
    body += b"data" + struct.pack("<I", len(data)) + data
    path.write_bytes(b"RIFF" + struct.pack("<I", len(body)) + body)
    return path


def _file(path: Path, data: bytes) -> Path:
    path.write_bytes(data)
    return path


BAD_INPUTS: dict[str, tuple[Callable[[Path], Path], str]] = {
    # case: (make the argument in a temp dir, what the one line must say)
    "text file": (
        lambda d: _file(d / "notes.txt", b"not audio\n"),
        "notes.txt: not a readable WAV file",
    ),
    "empty file": (lambda d: _file(d / "empty.wav", b""), "empty.wav: not a readable WAV file"),
    "float wav": (lambda d: _float_wav(d / "float.wav"), "float.wav: not a readable WAV file"),
    "missing file": (lambda d: d / "missing.wav", "missing.wav: no such file"),
    "directory": (lambda d: d, "is a directory"),
    "stereo wav": (lambda d: _wav(d / "stereo.wav", channels=2), "stereo.wav: 2 channel(s)"),
    "24-bit wav": (lambda d: _wav(d / "24bit.wav", width=3), "24bit.wav: 1 channel(s) of 24-bit"),
    "44.1 kHz wav": (
        lambda d: _wav(d / "cd.wav", rate=44100),
        "cd.wav: 44100 Hz is not a wire rate",
    ),
}


@pytest.mark.parametrize("case", list(BAD_INPUTS))
def test_voxgate_call_rejects_bad_audio_in_one_line_with_exit_2(tmp_path: Path, case: str) -> None:
    make, expected = BAD_INPUTS[case]
    arg = make(tmp_path)
    # The real command, as a user runs it; nothing listens on the target: the file is checked
    # before any connection is made.
    proc = subprocess.run(
        [sys.executable, "-m", "voxgate.cli", "call", str(arg), "--target", "127.0.0.1:1"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr and proc.stdout == ""
    lines = proc.stderr.splitlines()
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith("voxgate call: ") and expected in lines[0], lines[0]


def test_voxgate_call_rejects_a_bad_bot_file_in_one_line_with_exit_2(tmp_path: Path) -> None:
    rules = tmp_path / "rules.yaml"
    rules.write_text("rules: [\n  - if_says: hi\n")
    proc = subprocess.run(
        [sys.executable, "-m", "voxgate.cli", "call", str(sample_call_path()), "--bot", str(rules)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.splitlines()
    assert len(lines) == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert lines[0].startswith(f"voxgate call: {rules}: not valid YAML"), lines[0]


@pytest.mark.parametrize("realtime", [False, True], ids=["fast", "realtime"])
async def test_the_timeline_keeps_the_caller_audio_length_at_any_send_pace(
    speech_dir: Path, realtime: bool
) -> None:
    # Fast, 5 s of audio leave in about 0.3 s (4 s burst, then 3.5x): drawn on the send time,
    # the caller waveform was squashed to that. On the call's audio clock it keeps 5 s.
    wav = speech_dir / "librispeech_61-70968-0000.wav"
    audio = load_audio(wav)
    async with running_server() as srv:
        result = await play_call(
            CallOptions(file=wav, target=srv.target, realtime=realtime), stream=io.StringIO()
        )
    assert result.exit_code == 0 and result.log is not None
    tl = build_timeline(result.log)
    assert tl.waits == ()
    assert tl.caller_span_s == pytest.approx(audio.duration_ms / 1000.0, abs=1e-6)
    begins = {e.utterance_index: e for e in result.events if isinstance(e, SpeechBegin)}
    ends = [e for e in result.events if isinstance(e, SpeechEnd)]
    assert ends and len(tl.speech) == len(ends)
    for span, end in zip(tl.speech, ends, strict=True):
        begin = begins[end.utterance_index]
        # Each VAD segment is as long as the server says, and sits on its waveform.
        assert span.end_s - span.start_s == pytest.approx((end.offset_ms - begin.offset_ms) / 1000)
        sample = begin.offset_ms * audio.sample_rate_hz // 1000
        assert span.start_s == pytest.approx(float(tl.caller_x[sample]), abs=1e-6)


async def test_a_file_client_says_bulk_and_is_admitted_where_a_live_caller_is_not(
    tmp_path: Path,
) -> None:
    """At capacity (``capacity_calls=1``, one live call in): ``converse()`` is refused,
    ``converse(bulk=True)`` and ``voxgate call`` sending a file fast (the README's first
    usage line) are admitted; ``voxgate call --realtime`` is a live caller and is refused."""
    over = {**FAST, "admission": {"capacity_calls": 1, "realtime_slack_ms": 600_000}}
    async with running_server(**over) as srv, VoxgateClient(srv.target) as client:
        live = await client.converse(CallConfig(call_id="live"))
        with pytest.raises(VoxgateError) as refused:
            await client.converse(CallConfig())
        assert refused.value.code == grpc.StatusCode.RESOURCE_EXHAUSTED
        async with await client.converse(CallConfig(), bulk=True) as bulk:
            assert isinstance(bulk.session, SessionStarted)
            await bulk.hangup()
            _ = [e async for e in bulk]

        def cli(realtime: bool) -> CallOptions:
            return CallOptions(file=Path(sample_call_path()), target=srv.target, realtime=realtime)

        fast = await play_call(cli(False), stream=io.StringIO())
        assert fast.exit_code == 0
        out = io.StringIO()
        assert (await play_call(cli(True), stream=out)).exit_code != 0
        assert "RESOURCE_EXHAUSTED" in out.getvalue()
        await live.hangup()
        await live.aclose()
