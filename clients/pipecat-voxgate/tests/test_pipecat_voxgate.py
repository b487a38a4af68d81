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
import warnings
import wave
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import soxr
from conftest import IDLE_TIMEOUT_S, audio_frames
from pipecat.frames.frames import (
    ErrorFrame,
    Frame,
    InputAudioRawFrame,
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
from pipecat.turns.user_turn_strategies import ExternalUserTurnStrategies
from pipecat.utils import deprecation
from pipecat.utils.errors import ErrorCategory
from pipecat_voxgate import (
    VoxgateSTTService,
    VoxgateSTTSettings,
    VoxgateTTSService,
    VoxgateTTSSettings,
)

from voxgate_client import EndOfTurn, Transcript, VoxgateClient
from voxgate_client.testing import FlakyNetwork, LocalServer, name_heard_otherwise

START_TIMEOUT_S = 60.0
EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "answer_a_recording.py"
DOC = Path(__file__).resolve().parents[3] / "docs" / "pipecat.md"


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
    # What the page shows it printing (how the speech is cut into lines aside).
    said, shown = (
        " ".join(line.removeprefix("caller:") for line in text if line.startswith("caller:"))
        for text in (done.stdout.splitlines(), DOC.read_text().splitlines())
    )
    assert plain(said) == plain(shown), (done.stdout, shown)
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


async def test_a_refused_stream_is_a_permanent_error_without_a_deprecation_warning(
    server: LocalServer,
) -> None:
    """Pipecat 1.8's way (``force_treat_as_permanent``, a permanent category), not the
    deprecated ``fatal=True``: the service is unusable and the worker's policy decides."""
    stt = VoxgateSTTService(
        target=server.target, settings=VoxgateSTTSettings(model="no-such-model")
    )
    deprecation._warned_sites.clear()  # Pipecat warns once per call site and process
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        down, up = await run_test(stt, frames_to_send=[], start_timeout=START_TIMEOUT_S)
    errors = [f for f in up if isinstance(f, ErrorFrame)]
    assert len(errors) == 1, errors  # no retry: a bad model stays bad
    assert "INVALID_ARGUMENT" in errors[0].error and "model" in errors[0].error, errors
    assert errors[0].category == ErrorCategory.INVALID_REQUEST
    assert not stt.is_usable
    deprecated = [str(w.message) for w in caught if issubclass(w.category, DeprecationWarning)]
    assert not any("fatal" in m for m in deprecated), deprecated


async def test_an_unreachable_gateway_is_retried_with_backoff_then_given_up() -> None:
    stt = VoxgateSTTService(
        target="127.0.0.1:9",  # nothing listens on the discard port
        reconnect_attempts=2,
        reconnect_backoff_min_wait=0.1,
        reconnect_backoff_max_wait=0.1,
    )
    _, up = await run_test(stt, frames_to_send=[SleepFrame(sleep=5.0)])
    errors = [f for f in up if isinstance(f, ErrorFrame)]
    assert len(errors) == 2, [e.error for e in errors]
    assert all("UNAVAILABLE" in e.error for e in errors)
    assert [e.category for e in errors] == [ErrorCategory.CONNECTIVITY] * 2
    assert "retrying" in errors[0].error and "retrying" not in errors[1].error
    assert not stt.is_usable  # the last attempt gives up for good


# -- reconnection and the audio clock ----------------------------------------------------------

#: Where the sample call is cut in two: after Kennedy's sentence (its last word ends near
#: 10 s) and its trailing silence, before the second speaker (from about 12.7 s).
CUT_S = 11.5


def final_results(frames: Sequence[Frame]) -> list[Transcript]:
    return [f.result for f in frames if isinstance(f, TranscriptionFrame)]


async def hear(target: str, pcm: np.ndarray, rate: int, **kwargs: Any) -> list[Transcript]:
    """The finals of ``pcm`` through a fresh service (one stream from its first sample)."""
    stt = VoxgateSTTService(target=target, audio_passthrough=False, sample_rate=rate, **kwargs)
    down, _ = await run_test(
        stt, frames_to_send=audio_frames(pcm, rate), start_timeout=START_TIMEOUT_S
    )
    return final_results(down)


def assert_same_words_shifted(got: list[Transcript], ref: list[Transcript], shift_ms: int) -> None:
    """``got`` says the words of ``ref`` at ``ref``'s times plus ``shift_ms``.

    The same audio from the first sample of a fresh stream gets the same word times, give or
    take the aligner's 20 ms steps and a decode that batches differently.
    """
    got_words = [w for t in got for w in t.words]
    ref_words = [w for t in ref for w in t.words]
    assert [plain(w.word) for w in got_words] == [plain(w.word) for w in ref_words]
    for g, r in zip(got_words, ref_words, strict=True):
        assert abs(g.start_ms - (r.start_ms + shift_ms)) <= 100, (g, r, shift_ms)
        assert abs(g.end_ms - (r.end_ms + shift_ms)) <= 100, (g, r, shift_ms)
    for g, r in zip(got, ref, strict=True):
        assert abs(g.start_ms - (r.start_ms + shift_ms)) <= 100, (g, r, shift_ms)


async def test_a_stream_the_server_ends_is_reopened_and_later_speech_keeps_the_audio_clock(
    server: LocalServer, short_idle_server: LocalServer, sample_call: tuple[np.ndarray, int]
) -> None:
    """Kennedy, then a silent pipeline (no audio frames at all, as before a user joins) for
    longer than the server's idle timeout: the server ends the stream with
    DEADLINE_EXCEEDED. The service says so, opens a new stream when audio comes again, and
    the second speaker is heard at the times the pipeline's audio puts them at."""
    pcm, rate = sample_call
    cut = int(CUT_S * rate)
    first, second = pcm[:cut], pcm[cut:]
    reference = await hear(server.target, second, rate)
    stt = VoxgateSTTService(
        target=short_idle_server.target, audio_passthrough=False, sample_rate=rate
    )
    dropped: list[str] = []

    @stt.event_handler("on_connection_error")
    async def on_connection_error(_: VoxgateSTTService, error: str) -> None:
        dropped.append(error)

    frames = [
        *audio_frames(first, rate),
        SleepFrame(sleep=IDLE_TIMEOUT_S + 3.0),
        *audio_frames(second, rate),
    ]
    down, up = await run_test(stt, frames_to_send=frames, start_timeout=START_TIMEOUT_S)
    assert len(dropped) == 1 and "DEADLINE_EXCEEDED" in dropped[0], dropped
    # A drop the service recovers from is no ErrorFrame (Pipecat's websocket services warn).
    assert not [f.error for f in up if isinstance(f, ErrorFrame)] and stt.is_usable
    assert len(stt.sessions) == 2, "one reconnect, when the audio came back"
    finals = final_results(down)
    heard = plain(" ".join(t.text for t in finals))
    assert "ask not what your country can do for you" in heard, heard
    assert heard.endswith("predecessors of the true printed book"), heard
    shift_ms = round(CUT_S * 1000)
    assert_same_words_shifted([t for t in finals if t.start_ms >= shift_ms], reference, shift_ms)
    indexes = [t.utterance_index for t in finals]
    assert indexes == sorted(set(indexes)), "utterance indexes keep counting across streams"


async def test_keepalive_silence_keeps_the_stream_and_stays_off_the_audio_clock(
    server: LocalServer, short_idle_server: LocalServer, sample_call: tuple[np.ndarray, int]
) -> None:
    """The same silent gap with Pipecat's keepalive on: the stream survives, and the silence
    the service sent is not counted on the pipeline's audio clock."""
    pcm, rate = sample_call
    cut = int(CUT_S * rate)
    first, second = pcm[:cut], pcm[cut:]
    reference = await hear(server.target, second, rate)
    stt = VoxgateSTTService(
        target=short_idle_server.target,
        audio_passthrough=False,
        sample_rate=rate,
        keepalive_timeout=IDLE_TIMEOUT_S / 4,
        keepalive_interval=IDLE_TIMEOUT_S / 8,
    )
    frames = [
        *audio_frames(first, rate),
        SleepFrame(sleep=IDLE_TIMEOUT_S + 3.0),
        *audio_frames(second, rate),
    ]
    down, up = await run_test(stt, frames_to_send=frames, start_timeout=START_TIMEOUT_S)
    assert not [f.error for f in up if isinstance(f, ErrorFrame)]
    assert len(stt.sessions) == 1, "no reconnect"
    shift_ms = round(CUT_S * 1000)
    finals = final_results(down)
    assert_same_words_shifted([t for t in finals if t.start_ms >= shift_ms], reference, shift_ms)


#: Where the connection is cut: inside the second speaker's sentence (12.7 s to 18.1 s).
LOST_AT_S = 14.5


async def test_audio_in_flight_when_the_stream_dies_is_heard_on_the_next_one(
    server: LocalServer, sample_call: tuple[np.ndarray, int]
) -> None:
    """The connection dies mid-sentence (the relay cuts it as that frame enters the service):
    the server never finalises the open utterance and drops what was still on the wire. The
    audio sent since Kennedy's final is heard again on the next stream, so the second
    speaker's sentence comes back whole, at the times a stream that never failed gives it."""
    pcm, rate = sample_call
    cut = int(CUT_S * rate)
    reference = await hear(server.target, pcm[cut:], rate)
    frames = audio_frames(pcm, rate, speed=1.0)  # real time, as a transport delivers it
    audio = [f for f in frames if isinstance(f, InputAudioRawFrame)]
    marker = audio[round(LOST_AT_S * 10)]  # 100 ms frames

    async with FlakyNetwork(server.target) as net:

        class CutAtMarker(BaseObserver):
            async def on_push_frame(self, data: FramePushed) -> None:
                if data.frame is marker and not net.cuts:
                    net.cut()

        stt = VoxgateSTTService(target=net.target, audio_passthrough=False, sample_rate=rate)
        dropped: list[str] = []

        @stt.event_handler("on_connection_error")
        async def on_connection_error(_: VoxgateSTTService, error: str) -> None:
            dropped.append(error)

        down, _ = await run_test(
            stt, frames_to_send=frames, observers=[CutAtMarker()], start_timeout=START_TIMEOUT_S
        )
    assert net.cuts == 1 and dropped and "UNAVAILABLE" in dropped[0], dropped
    assert stt.is_usable and len(stt.sessions) >= 2
    finals = final_results(down)
    heard = plain(" ".join(t.text for t in finals))
    assert "ask not what your country can do for you" in heard, heard
    shift_ms = round(CUT_S * 1000)
    assert_same_words_shifted([t for t in finals if t.start_ms >= shift_ms], reference, shift_ms)


# -- end of turn ---------------------------------------------------------------------------------


async def test_turn_detection_proposes_the_turns_stop_on_the_servers_end_of_turn(
    server: LocalServer, sample_call: tuple[np.ndarray, int]
) -> None:
    """Kennedy's sentence with the server's smart turn detection: its pauses end utterances
    (each with its final), and the proposed turn (what ExternalUserTurnStrategies, which the
    service asks for, turns into the user's turn) stops once per EndOfTurn, after the turn's
    one TranscriptionFrame: the EndOfTurn's text, marked finalized, as Flux's turn transcript.
    Meanwhile the interims hold the turn so far: its finals, then the utterance's interim."""
    pcm, rate = sample_call
    stt = VoxgateSTTService(
        target=server.target, audio_passthrough=False, sample_rate=rate, turn_detection="smart"
    )
    assert isinstance(stt.service_metadata_frame().user_turn_strategies, ExternalUserTurnStrategies)
    turns: list[EndOfTurn] = []

    @stt.event_handler("on_end_of_turn")
    async def on_end_of_turn(_: VoxgateSTTService, eot: EndOfTurn) -> None:
        turns.append(eot)

    speech = audio_frames(pcm[: int(CUT_S * rate)], rate)
    down, up = await run_test(stt, frames_to_send=speech, start_timeout=START_TIMEOUT_S)
    open_turn: list[Transcript] | None = None
    texts: list[TranscriptionFrame] = []
    ended: list[list[Transcript]] = []
    for f in down:
        if isinstance(f, ProposedUserStartedSpeakingFrame):
            assert open_turn is None
            open_turn, texts = [], []
        elif isinstance(f, InterimTranscriptionFrame):
            assert open_turn is not None, "an interim outside a turn"
            so_far = plain(" ".join(t.text for t in open_turn)).split()
            assert plain(f.text).split()[: len(so_far)] == so_far, (f.text, so_far)
            if f.result.is_final:  # a final of the turn, shown as the turn so far
                open_turn.append(f.result)
        elif isinstance(f, TranscriptionFrame):
            assert open_turn is not None, "a transcript outside a turn"
            texts.append(f)
        elif isinstance(f, ProposedUserStoppedSpeakingFrame):
            assert open_turn, "a turn stops after its finals"
            assert len(texts) == 1 and texts[0].finalized, texts
            ended.append(open_turn)
            open_turn = None
            assert isinstance(texts[0].result, EndOfTurn)
            assert texts[0].text == texts[0].result.text.strip()
    assert open_turn is None and ended
    assert [e.turn_index for e in turns] == list(range(len(ended)))
    for eot, finals in zip(turns, ended, strict=True):
        assert {t.turn_index for t in finals} == {eot.turn_index}
        assert eot.first_utterance_index == finals[0].utterance_index
        assert abs(eot.offset_ms - finals[-1].end_ms) <= 500, (eot, finals[-1])
    assert any(len(finals) > 1 for finals in ended), "turns span pauses that end utterances"
    heard = plain(" ".join(e.text for e in turns))
    assert "ask not what your country can do for you" in heard, heard
    proposals = (ProposedUserStartedSpeakingFrame, ProposedUserStoppedSpeakingFrame)
    assert kinds(list(up), *proposals) == kinds(list(down), *proposals)


async def test_a_turn_the_connection_cuts_short_keeps_its_finals(
    server: LocalServer, sample_call: tuple[np.ndarray, int]
) -> None:
    """Smart turns, and the connection dies inside Kennedy's turn, right after its first final
    ("And so my fellow Americans") came: no EndOfTurn will come for that turn, so its finals
    are pushed as its transcript, not finalized (as Flux's service does for a turn its
    connection cut short), and its stop is proposed; the rest of the sentence, heard again on
    the next stream, comes as a turn of its own, finalized on its EndOfTurn."""
    pcm, rate = sample_call
    frames = audio_frames(pcm[: int(CUT_S * rate)], rate, speed=1.0)

    async with FlakyNetwork(server.target) as net:

        class CutAfterFirstFinal(BaseObserver):
            async def on_push_frame(self, data: FramePushed) -> None:
                f = data.frame
                if isinstance(f, InterimTranscriptionFrame) and f.result.is_final and not net.cuts:
                    net.cut()

        stt = VoxgateSTTService(
            target=net.target, audio_passthrough=False, sample_rate=rate, turn_detection="smart"
        )
        down, _ = await run_test(
            stt,
            frames_to_send=frames,
            observers=[CutAfterFirstFinal()],
            start_timeout=START_TIMEOUT_S,
        )
    assert net.cuts == 1 and len(stt.sessions) >= 2
    shown = [f for f in down if isinstance(f, InterimTranscriptionFrame) and f.result.is_final]
    texts = [f for f in down if isinstance(f, TranscriptionFrame)]
    assert texts and not texts[0].finalized, texts
    first = plain(shown[0].text)
    assert plain(texts[0].text).startswith(first), (texts[0].text, first)
    assert texts[-1].finalized and isinstance(texts[-1].result, EndOfTurn), texts[-1]
    # One transcript per proposed turn, before its stop.
    in_turn = 0
    for f in down:
        if isinstance(f, ProposedUserStartedSpeakingFrame):
            in_turn = 0
        elif isinstance(f, TranscriptionFrame):
            in_turn += 1
        elif isinstance(f, ProposedUserStoppedSpeakingFrame):
            assert in_turn <= 1, "one transcript per turn"
    # The sentence goes on after the cut. (Its one-word fragments "Ask" and "not", replayed
    # into the new stream as a backlog, may miss their decode budget, as on a loaded machine:
    # docs/turns.md, "A loaded machine and JFK's 'Ask'".)
    heard = plain(" ".join(f.text for f in texts))
    assert heard.startswith(first) and "what your country can do for you" in heard, heard
    assert heard.endswith("ask what you can do for your country"), heard


# -- keyterms and voices -------------------------------------------------------------------------


async def test_keyterms_are_sent_as_boosted_hotwords_and_recognised(server: LocalServer) -> None:
    """A name Whisper spells otherwise, spoken by the server's own voice: heard only when it
    is a keyterm (the server boosts ``term^6`` in its decode loop)."""
    rate = 16000

    async def unboosted(speech: np.ndarray) -> str:
        return " ".join(t.text for t in await hear(server.target, speech, rate))

    name, speech = await name_heard_otherwise(server.target, rate, unboosted)
    stt_settings = VoxgateSTTSettings(keyterms=[name], hotwords=["support"])
    stt = VoxgateSTTService(
        target=server.target, audio_passthrough=False, sample_rate=rate, settings=stt_settings
    )
    down, _ = await run_test(
        stt, frames_to_send=audio_frames(speech, rate), start_timeout=START_TIMEOUT_S
    )
    decoding = stt.sessions[0].effective_config.decoding
    assert list(decoding.hotwords) == ["support", f"{name}^6"]
    with_keyterm = plain(" ".join(t.text for t in final_results(down)))
    assert plain(name) in with_keyterm.split(), with_keyterm


async def test_the_tts_service_lists_the_gateways_voices(server: LocalServer) -> None:
    async with VoxgateClient(server.target) as client:
        served = [v.name for v in await client.list_voices()]
    tts = VoxgateTTSService(target=server.target)
    voices = await tts.list_voices()  # before the pipeline starts
    assert [v.name for v in voices] == served and any(v.is_default for v in voices)
    down, _ = await run_test(
        tts,
        frames_to_send=[TTSSpeakFrame("Hello.")],
        start_timeout=START_TIMEOUT_S,
    )
    assert any(isinstance(f, TTSAudioRawFrame) for f in down)
    assert [v.name for v in await tts.list_voices()] == served  # and after it ends
