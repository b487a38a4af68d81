"""pipecat-voxgate driven by Pipecat's own ``run_test`` against a real server (real models).

Each test builds a one-processor pipeline with ``pipecat.tests.utils.run_test``, sends real
frames (recorded speech, a TTSSpeakFrame, an InterruptionFrame) and checks what came out, in
order. The server is a real ``voxgate serve`` on a loopback port (see conftest.py).
"""

from __future__ import annotations

import asyncio
import re
import subprocess
import sys
import time
import wave
from pathlib import Path

import numpy as np
import soxr
from conftest import audio_frames
from pipecat.frames.frames import (
    ErrorFrame,
    Frame,
    InterimTranscriptionFrame,
    InterruptionFrame,
    ProposedUserStartedSpeakingFrame,
    ProposedUserStoppedSpeakingFrame,
    STTUpdateSettingsFrame,
    TranscriptionFrame,
    TTSAudioRawFrame,
    TTSSpeakFrame,
    TTSStartedFrame,
    TTSStoppedFrame,
    TTSTextFrame,
    VADUserStartedSpeakingFrame,
    VADUserStoppedSpeakingFrame,
)
from pipecat.observers.base_observer import BaseObserver, FramePushed
from pipecat.pipeline.worker import PipelineParams
from pipecat.tests.utils import SleepFrame, run_test
from pipecat.transcriptions.language import Language
from pipecat_voxgate import (
    VoxgateSTTService,
    VoxgateSTTSettings,
    VoxgateTTSService,
    VoxgateTTSSettings,
)
from voxgate_client import Transcript
from voxgate_client.testing import LocalServer

START_TIMEOUT_S = 60.0
EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "answer_a_recording.py"


def plain(text: str) -> str:
    return re.sub(r"[^a-z ]", "", text.lower())


def kinds(frames: list[Frame], *types: type) -> list[str]:
    """Class names of the frames of ``types``, consecutive interims collapsed into one."""
    out: list[str] = []
    for f in frames:
        if isinstance(f, types):
            name = type(f).__name__
            if not (out and out[-1] == name == "InterimTranscriptionFrame"):
                out.append(name)
    return out


class Timeline(BaseObserver):
    """When each frame passed, by the monotonic clock (Pipecat's own observer interface)."""

    def __init__(self) -> None:
        super().__init__()
        self.events: list[tuple[float, str, Frame]] = []

    async def on_push_frame(self, data: FramePushed) -> None:
        self.events.append((time.monotonic(), data.destination.name, data.frame))


# -- STT ----------------------------------------------------------------------------------------


async def test_server_turns_give_each_utterance_start_interims_final_stop_in_order(
    server: LocalServer, sample_call: tuple[np.ndarray, int]
) -> None:
    pcm, rate = sample_call
    # Real time, as a transport delivers it, and a 2 s VAD hangover: Kennedy's pauses (and the
    # 1.5 s gap before the second speaker) no longer end the utterance, so it grows for 18 s
    # and its interims (best-effort re-decodes, slow on a busy machine) have time to come back.
    stt = VoxgateSTTService(
        target=server.target,
        server_turns=True,
        audio_passthrough=False,
        sample_rate=rate,
        settings=VoxgateSTTSettings(end_silence_ms=2000),
    )
    down, up = await run_test(
        stt, frames_to_send=audio_frames(pcm, rate, speed=1.0), start_timeout=START_TIMEOUT_S
    )
    seq = kinds(
        list(down),
        ProposedUserStartedSpeakingFrame,
        InterimTranscriptionFrame,
        TranscriptionFrame,
        ProposedUserStoppedSpeakingFrame,
    )
    # The server's VAD may cut a sentence at a pause, and the next utterance may begin before
    # the previous final is decoded, so how many turns there are depends on timing; what
    # never does: turns open and close alternately, and every transcript lies inside one.
    depth = 0
    for k in seq:
        if k == "ProposedUserStartedSpeakingFrame":
            assert depth == 0, seq
            depth = 1
        elif k == "ProposedUserStoppedSpeakingFrame":
            assert depth == 1, seq
            depth = 0
        else:
            assert depth == 1, seq
    assert depth == 0 and seq[0] == "ProposedUserStartedSpeakingFrame", seq
    assert "InterimTranscriptionFrame" in seq, seq
    finals = [f for f in down if isinstance(f, TranscriptionFrame)]
    heard = plain(" ".join(f.text for f in finals))
    assert "ask not what your country can do for you" in heard, heard
    assert heard.endswith("predecessors of the true printed book"), heard
    for f in finals:
        t = f.result
        assert isinstance(t, Transcript) and t.is_final
        assert t.words and all(w.start_ms <= w.end_ms for w in t.words)
        assert [w.start_ms for w in t.words] == sorted(w.start_ms for w in t.words)
        assert 0.0 < t.confidence <= 1.0
        assert f.language == Language.EN
    assert all(
        a.result.end_ms <= b.result.start_ms for a, b in zip(finals, finals[1:], strict=False)
    )
    # Broadcast: the same turn proposals also travel upstream.
    proposals = (ProposedUserStartedSpeakingFrame, ProposedUserStoppedSpeakingFrame)
    assert kinds(list(up), *proposals) == kinds(list(down), *proposals)


async def test_the_pipelines_end_of_turn_flushes_the_utterance(
    server: LocalServer, sample_call: tuple[np.ndarray, int]
) -> None:
    """The JFK sentence cut right after its last word, and a server VAD that waits 3 s of
    silence: only the pipeline's VADUserStoppedSpeakingFrame (a Flush) can end the last
    utterance before the pipeline ends (earlier pauses may end earlier utterances)."""
    pcm, rate = sample_call
    speech = pcm[: int(9.3 * rate)]
    stt = VoxgateSTTService(
        target=server.target,
        audio_passthrough=False,
        sample_rate=rate,
        settings=VoxgateSTTSettings(end_silence_ms=3000),
    )
    timeline = Timeline()
    frames = [
        VADUserStartedSpeakingFrame(),
        *audio_frames(speech, rate),
        VADUserStoppedSpeakingFrame(stop_secs=0.2, timestamp=time.time()),
        # How long the final may take to come back before the EndFrame follows: a bound on
        # waiting only (the measured latency is the benchmark's business).
        SleepFrame(sleep=20.0),
    ]
    down, _ = await run_test(
        stt, frames_to_send=frames, observers=[timeline], start_timeout=START_TIMEOUT_S
    )
    finals = [f for f in down if isinstance(f, TranscriptionFrame)]
    heard = plain(" ".join(f.text for f in finals))
    assert heard.endswith("ask what you can do for your country"), heard
    assert finals[-1].finalized, "the final of a Flush is marked finalized for Pipecat's TTFB"
    assert not any(f.finalized for f in finals[:-1])
    pushed = max(t for t, _, f in timeline.events if isinstance(f, TranscriptionFrame))
    end = next(t for t, dst, f in timeline.events if type(f).__name__ == "EndFrame")
    assert pushed < end, "the final came from the Flush, not from the hangup at the end"


async def test_language_and_hotwords_come_from_settings_and_a_change_restarts_the_stream(
    server: LocalServer, sample_call: tuple[np.ndarray, int]
) -> None:
    pcm, rate = sample_call
    stt = VoxgateSTTService(
        target=server.target,
        audio_passthrough=False,
        sample_rate=rate,
        settings=VoxgateSTTSettings(language=Language.EN_US, hotwords=["Kennedy", "voxgate"]),
    )
    frames = [
        *audio_frames(pcm[: 2 * rate], rate),
        STTUpdateSettingsFrame(delta=VoxgateSTTSettings(language=Language.DE)),
        *audio_frames(pcm[2 * rate : 3 * rate], rate),
    ]
    await run_test(stt, frames_to_send=frames, start_timeout=START_TIMEOUT_S)
    first, second = stt.sessions
    assert first.effective_config.language == "en"
    assert list(first.effective_config.decoding.hotwords) == ["Kennedy", "voxgate"]
    assert second.effective_config.language == "de"
    assert second.session_id != first.session_id


# -- TTS ----------------------------------------------------------------------------------------

REPLY = "Sure. Your table for two is booked at seven tonight."


async def test_a_reply_comes_out_at_the_pipeline_rate_with_word_timestamps(
    server: LocalServer,
) -> None:
    for out_rate in (24000, 22050):  # one the gateway serves, one Pipecat must resample to
        tts = VoxgateTTSService(target=server.target)
        down, _ = await run_test(
            tts,
            frames_to_send=[TTSSpeakFrame(REPLY)],
            pipeline_params=PipelineParams(audio_out_sample_rate=out_rate),
            start_timeout=START_TIMEOUT_S,
        )
        seq = kinds(list(down), TTSStartedFrame, TTSStoppedFrame)
        assert seq == ["TTSStartedFrame", "TTSStoppedFrame"], seq
        audio = [f for f in down if isinstance(f, TTSAudioRawFrame)]
        assert audio and {(f.sample_rate, f.num_channels) for f in audio} == {(out_rate, 1)}
        seconds = sum(len(f.audio) for f in audio) / (2 * out_rate)
        assert 2.0 < seconds < 8.0, seconds
        samples = np.frombuffer(b"".join(f.audio for f in audio), np.int16)
        assert np.abs(samples).max() > 3000  # speech, not silence
        words = [f for f in down if isinstance(f, TTSTextFrame)]
        spoken = plain(" ".join(f.text for f in words)).split()
        assert spoken == plain(REPLY).split()
        pts = [f.pts for f in words]
        assert pts == sorted(pts) and pts[-1] > pts[0]
        # The last word starts within the audio's length (ns on Pipecat's clock).
        assert (pts[-1] - pts[0]) / 1e9 < seconds


LONG_REPLY = " ".join(
    [
        "Thank you for calling the city library, where every card holder may borrow up to",
        "twenty books, ten films and five games at a time, for three weeks each, and renew",
        "them twice online unless another reader has placed a hold on the same title.",
    ]
    * 30
)
#: About 7 minutes of speech (the voice speaks ~15 characters a second), far more than the
#: server can synthesise before the interruption on any machine this runs on.
LONG_REPLY_S = len(LONG_REPLY) / 15


async def test_an_interruption_stops_the_reply_and_the_server_stream_at_once(
    server: LocalServer,
) -> None:
    """An InterruptionFrame half a second into the reply's audio (sent when the first audio
    frame is seen, as the user aggregator would on a barge-in)."""
    tts = VoxgateTTSService(target=server.target)
    interrupted = asyncio.Event()

    class BargeIn(BaseObserver):
        started = False

        async def on_push_frame(self, data: FramePushed) -> None:
            if isinstance(data.frame, TTSAudioRawFrame) and not self.started:
                self.started = True

                async def interrupt() -> None:
                    await asyncio.sleep(0.5)
                    await tts.queue_frame(InterruptionFrame())
                    interrupted.set()

                asyncio.get_running_loop().create_task(interrupt())

    frames = [
        TTSSpeakFrame(LONG_REPLY),
        # A bound on waiting for the first audio and the interruption, not a speed check.
        SleepFrame(sleep=10.0),
    ]
    down, _ = await run_test(
        tts, frames_to_send=frames, observers=[BargeIn()], start_timeout=START_TIMEOUT_S
    )
    assert interrupted.is_set(), "no audio within 9.5 s, so nothing was interrupted"
    assert tts.open_streams == 0
    # Nothing more of the reply after the interruption passed the service...
    names = [type(f).__name__ for f in down]
    assert "InterruptionFrame" in names
    cut = names.index("InterruptionFrame")
    assert "TTSAudioRawFrame" not in names[cut + 1 :], names[cut:]
    # ...far less than the whole reply was produced...
    out_rate = next(f.sample_rate for f in down if isinstance(f, TTSAudioRawFrame))
    seconds = sum(len(f.audio) for f in down if isinstance(f, TTSAudioRawFrame)) / (2 * out_rate)
    assert 0.0 < seconds < LONG_REPLY_S / 4, seconds
    # ...and the server is no longer synthesising it.
    assert server.metric("voxgate_synthesize_active") == 0.0


def test_the_documented_example_runs(server: LocalServer, tmp_path: Path) -> None:
    """docs/pipecat.md's example, as written, against the real server."""
    out = tmp_path / "reply.wav"
    done = subprocess.run(
        [sys.executable, str(EXAMPLE), "--target", server.target, "--out", str(out)],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    heard = plain(" ".join(line for line in done.stdout.splitlines() if line.startswith("caller:")))
    assert "ask not" in heard and "block books" in heard, done.stdout
    with wave.open(str(out)) as w:
        assert w.getframerate() == 24000 and w.getnframes() > 24000 * 3


async def test_a_pipeline_rate_the_gateway_does_not_serve_is_resampled(
    server: LocalServer, sample_call: tuple[np.ndarray, int]
) -> None:
    """A 44.1 kHz pipeline: the service sends 16 kHz, and the words still come through."""
    pcm, rate = sample_call
    hi = np.round(soxr.resample(pcm[: 4 * rate].astype(np.float32), rate, 44100)).astype(np.int16)
    stt = VoxgateSTTService(target=server.target, audio_passthrough=False)
    frames = [
        *audio_frames(hi, 44100),
        VADUserStoppedSpeakingFrame(stop_secs=0.2, timestamp=time.time()),
        SleepFrame(sleep=10.0),
    ]
    down, _ = await run_test(
        stt,
        frames_to_send=frames,
        pipeline_params=PipelineParams(audio_in_sample_rate=44100),
        start_timeout=START_TIMEOUT_S,
    )
    assert stt.sessions[0].effective_config.input_audio.sample_rate_hertz == 16000
    heard = plain(" ".join(f.text for f in down if isinstance(f, TranscriptionFrame)))
    assert "my fellow americans" in heard, heard


async def test_a_refused_voice_is_an_error_frame_naming_the_status(server: LocalServer) -> None:
    tts = VoxgateTTSService(
        target=server.target, settings=VoxgateTTSSettings(voice="no-such-voice")
    )
    down, up = await run_test(
        tts, frames_to_send=[TTSSpeakFrame("Hello.")], start_timeout=START_TIMEOUT_S
    )
    errors = [f.error for f in up if isinstance(f, ErrorFrame)]
    assert any("INVALID_ARGUMENT" in e and "voice" in e for e in errors), errors
    assert not any(isinstance(f, TTSAudioRawFrame) for f in down)


async def test_a_refused_stream_is_a_fatal_error_frame(server: LocalServer) -> None:
    stt = VoxgateSTTService(
        target=server.target, settings=VoxgateSTTSettings(model="no-such-model")
    )
    down, up = await run_test(stt, frames_to_send=[], start_timeout=START_TIMEOUT_S)
    errors = [f for f in up if isinstance(f, ErrorFrame)]
    assert errors and errors[0].fatal, errors
    assert "INVALID_ARGUMENT" in errors[0].error and "model" in errors[0].error, errors
