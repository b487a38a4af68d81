"""livekit-plugins-voxgate driven through LiveKit Agents' own stream API (no LiveKit server),
against a real voxgate server with the bundled models (see conftest.py).

The streams are what an ``AgentSession`` drives: ``STT.stream()`` (push_frame / flush /
end_input, then SpeechEvents), ``TTS.synthesize()`` (a ChunkedStream) and ``TTS.stream()``
(push_text / flush / end_input, then SynthesizedAudio); an interruption is LiveKit closing
the stream mid-reply.
"""

from __future__ import annotations

import asyncio
import difflib
import re
import subprocess
import sys
import time
import wave
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from conftest import IDLE_TIMEOUT_S, FlakyNetwork, frames
from livekit.agents import APIConnectOptions, APIStatusError, stt, tts
from livekit.agents.metrics import STTMetrics, TTSMetrics
from livekit.agents.stt import STTError
from livekit.agents.types import USERDATA_TIMED_TRANSCRIPT
from livekit.agents.voice.keyterm_detection import KeytermDetector
from livekit.plugins import voxgate

from voxgate_client import VoxgateClient
from voxgate_client.testing import LocalServer, name_heard_otherwise

WAIT_S = 120.0  # a bound on waiting for an event, never a speed requirement
NO_RETRY = APIConnectOptions(max_retry=0, timeout=30.0)
EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "answer_a_recording.py"
DOC = Path(__file__).resolve().parents[3] / "docs" / "livekit.md"


def plain(text: str) -> str:
    return re.sub(r"[^a-z ]", "", text.lower())


async def feed(stream: stt.SpeechStream, pcm: np.ndarray, rate: int, speed: float = 2.0) -> None:
    """Push 100 ms frames at ``speed`` x real time (the gateway refuses > 4x)."""
    for f in frames(pcm, rate):
        stream.push_frame(f)
        await asyncio.sleep(f.duration / speed)


async def test_stt_stream_gives_start_interims_usage_final_end_in_order(
    server: LocalServer, sample_call: tuple[np.ndarray, int]
) -> None:
    pcm, rate = sample_call
    # Real time and a 2 s VAD hangover: Kennedy's pauses (and the 1.5 s gap before the second
    # speaker) no longer end the utterance, so it grows for 18 s and its interims (best-effort
    # re-decodes, which a busy machine makes slow) have time to come back.
    engine = voxgate.STT(target=server.target, language="en", end_silence_ms=2000)
    assert engine.capabilities.streaming and engine.capabilities.interim_results
    assert engine.capabilities.aligned_transcript == "word" and engine.capabilities.manual_flush
    metrics: list[Any] = []
    engine.on("metrics_collected", metrics.append)
    stream = engine.stream(conn_options=NO_RETRY)

    async def pump() -> None:
        await feed(stream, pcm, rate, speed=1.0)
        stream.end_input()

    pusher = asyncio.create_task(pump())
    events = [ev async for ev in stream]
    await pusher
    await engine.aclose()

    T = stt.SpeechEventType
    seq: list[T] = []
    for ev in events:  # consecutive interims collapsed
        if not (seq and seq[-1] == ev.type == T.INTERIM_TRANSCRIPT):
            seq.append(ev.type)
    # Per utterance: START, interims, USAGE, FINAL, END; never a transcript outside one.
    speaking = False
    for k in seq:
        if k == T.START_OF_SPEECH:
            assert not speaking, seq
            speaking = True
        elif k == T.END_OF_SPEECH:
            assert speaking, seq
            speaking = False
        else:
            assert speaking, seq
    assert not speaking and seq[0] == T.START_OF_SPEECH, seq
    assert T.INTERIM_TRANSCRIPT in seq, seq
    for i, k in enumerate(seq):
        if k == T.FINAL_TRANSCRIPT:
            assert seq[i - 1] == T.RECOGNITION_USAGE and seq[i + 1] == T.END_OF_SPEECH, seq
    finals = [ev.alternatives[0] for ev in events if ev.type == T.FINAL_TRANSCRIPT]
    heard = plain(" ".join(f.text for f in finals))
    assert "ask not what your country can do for you" in heard, heard
    assert heard.endswith("predecessors of the true printed book"), heard
    for f in finals:
        assert f.language == "en" and 0.0 < f.confidence <= 1.0
        assert f.words and f.start_time <= f.words[0].start_time
        starts = [w.start_time for w in f.words]
        assert starts == sorted(starts) and all(w.end_time >= w.start_time for w in f.words)
        assert plain(" ".join(f.words)).split() == plain(f.text).split()
    assert finals[-1].end_time > 17.0  # the LJ sentence ends 18.1 s into the call
    usage = [m for m in metrics if isinstance(m, STTMetrics)]
    assert usage and 15.0 < sum(m.audio_duration for m in usage) < 20.0


async def test_stt_manual_flush_finalises_the_utterance_without_trailing_silence(
    server: LocalServer, sample_call: tuple[np.ndarray, int]
) -> None:
    """The JFK sentence cut after its last word and a 3 s VAD hangover: only the flush can end
    the last utterance while the input is still open."""
    pcm, rate = sample_call
    engine = voxgate.STT(target=server.target, end_silence_ms=3000)
    stream = engine.stream(conn_options=NO_RETRY)
    await feed(stream, pcm[: int(9.3 * rate)], rate)
    stream.flush()

    async def last_final() -> stt.SpeechEvent:
        # Pauses inside the sentence may end earlier utterances; the flushed one is the one
        # that reaches the end of the audio.
        async for ev in stream:
            if (
                ev.type == stt.SpeechEventType.FINAL_TRANSCRIPT
                and ev.alternatives[0].end_time > 8.4
            ):
                return ev
        raise AssertionError("the stream ended without the flushed final")

    ev = await asyncio.wait_for(last_final(), WAIT_S)  # input still open: no hangup yet
    assert plain(ev.alternatives[0].text).endswith("ask what you can do for your country")
    await stream.aclose()
    await engine.aclose()


async def test_stt_offline_recognize(
    server: LocalServer, sample_call: tuple[np.ndarray, int]
) -> None:
    pcm, rate = sample_call
    engine = voxgate.STT(target=server.target)
    ev = await engine.recognize(frames(pcm[: 12 * rate], rate), conn_options=NO_RETRY)
    await engine.aclose()
    assert ev.type == stt.SpeechEventType.FINAL_TRANSCRIPT
    assert "ask not what your country" in plain(ev.alternatives[0].text)


REPLY = "Sure. Your table for two is booked at seven tonight."


def timed_words(audio: list[tts.SynthesizedAudio]) -> list[Any]:
    return [w for a in audio for w in a.frame.userdata.get(USERDATA_TIMED_TRANSCRIPT, [])]


async def test_tts_chunked_synthesis_with_word_times_and_metrics(server: LocalServer) -> None:
    engine = voxgate.TTS(target=server.target, sample_rate=24000)
    assert engine.capabilities.streaming and engine.capabilities.aligned_transcript
    metrics: list[Any] = []
    engine.on("metrics_collected", metrics.append)
    async with engine.synthesize(REPLY, conn_options=NO_RETRY) as chunked:
        audio = [a async for a in chunked]
    await engine.aclose()
    assert {(a.frame.sample_rate, a.frame.num_channels) for a in audio} == {(24000, 1)}
    assert audio[-1].is_final
    seconds = sum(a.frame.duration for a in audio)
    assert 2.0 < seconds < 8.0, seconds
    pcm = np.frombuffer(b"".join(bytes(a.frame.data) for a in audio), np.int16)
    assert np.abs(pcm).max() > 3000
    words = timed_words(audio)
    assert plain(" ".join(words)).split() == plain(REPLY).split()
    assert [w.start_time for w in words] == sorted(w.start_time for w in words)
    assert words[-1].end_time <= seconds + 0.05
    (m,) = [m for m in metrics if isinstance(m, TTSMetrics)]
    assert m.characters_count == len(REPLY) and 0 < m.ttfb < m.duration
    assert abs(m.audio_duration - seconds) < 0.05


async def test_tts_stream_speaks_text_as_it_is_written(server: LocalServer) -> None:
    engine = voxgate.TTS(target=server.target, sample_rate=16000)
    stream = engine.stream(conn_options=NO_RETRY)
    for token in ["Sure", ". Your table", " for two is", " booked at seven", " tonight."]:
        stream.push_text(token)
    stream.flush()
    stream.end_input()
    audio = [a async for a in stream]
    await engine.aclose()
    assert audio and {a.frame.sample_rate for a in audio} == {16000}
    assert audio[-1].is_final
    words = timed_words(audio)
    assert plain(" ".join(words)).split() == plain(REPLY).split()
    # Word times run on across the sentences of the segment.
    starts = [w.start_time for w in words]
    assert starts == sorted(starts) and starts[-1] > 1.0


LONG_REPLY = " ".join(
    [
        "Thank you for calling the city library, where every card holder may borrow up to",
        "twenty books, ten films and five games at a time, for three weeks each, and renew",
        "them twice online unless another reader has placed a hold on the same title.",
    ]
    * 30
)


async def test_closing_the_stream_mid_reply_stops_the_server_at_once(server: LocalServer) -> None:
    """What an AgentSession does on a barge-in: close the TTS stream mid-reply."""
    engine = voxgate.TTS(target=server.target)
    stream = engine.stream(conn_options=NO_RETRY)
    stream.push_text(LONG_REPLY)
    stream.end_input()
    heard = 0.0
    async for a in stream:
        heard += a.frame.duration
        if heard > 1.0:
            break
    assert engine.open_rpcs == 1
    await asyncio.wait_for(stream.aclose(), 10.0)
    assert engine.open_rpcs == 0
    loop = asyncio.get_running_loop()
    deadline = loop.time() + WAIT_S
    while server.metric("voxgate_synthesize_active") != 0.0:
        assert loop.time() < deadline, "the server still synthesises after the close"
        await asyncio.sleep(0.05)
    await engine.aclose()


async def test_a_refused_request_is_a_non_retryable_api_status_error(
    server: LocalServer,
) -> None:
    engine = voxgate.TTS(target=server.target, voice="no-such-voice")
    with pytest.raises(APIStatusError) as err:
        async with engine.synthesize("Hello.", conn_options=APIConnectOptions(max_retry=2)) as c:
            async for _ in c:
                pass
    await engine.aclose()
    assert err.value.status_code == 400 and not err.value.retryable
    assert "INVALID_ARGUMENT" in err.value.message


async def test_an_unreachable_gateway_is_a_connection_error_after_the_retries() -> None:
    from livekit.agents import APIConnectionError

    engine = voxgate.TTS(target="127.0.0.1:9")  # nothing listens on the discard port
    with pytest.raises(APIConnectionError):
        opts = APIConnectOptions(max_retry=1, retry_interval=0.1, timeout=5.0)
        async with engine.synthesize("Hello.", conn_options=opts) as c:
            async for _ in c:
                pass
    await engine.aclose()


def test_the_documented_example_runs(server: LocalServer, tmp_path: Path) -> None:
    """docs/livekit.md's example, as written, against the real server."""
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


async def test_a_refused_stt_stream_raises_a_non_retryable_error_from_the_stream(
    server: LocalServer,
) -> None:
    engine = voxgate.STT(target=server.target, model="no-such-model")
    errors: list[Any] = []
    engine.on("error", errors.append)
    stream = engine.stream(conn_options=APIConnectOptions(max_retry=3, retry_interval=0.1))
    with pytest.raises(APIStatusError) as err:
        async for _ in stream:
            pass
    await engine.aclose()
    assert err.value.status_code == 400 and not err.value.retryable
    assert "model" in err.value.message
    assert len(errors) == 1 and not errors[0].recoverable  # given up at once, no retries


# -- retries, reconnects and the audio clock ----------------------------------------------------

#: Where the sample call is cut in two: after Kennedy's sentence (its last word ends near
#: 10 s) and its trailing silence, before the second speaker (from about 12.7 s).
CUT_S = 11.5
#: Retries enough for gRPC's own reconnect backoff (about a second) to pass.
RETRYING = APIConnectOptions(max_retry=8, retry_interval=0.5, timeout=30.0)


async def finals_of(stream: stt.SpeechStream, push: Any) -> list[stt.SpeechData]:
    """Run ``push(stream)`` beside the stream; the final transcripts, in order."""
    pusher = asyncio.create_task(push(stream))
    events = [ev async for ev in stream]
    await pusher
    return [ev.alternatives[0] for ev in events if ev.type == stt.SpeechEventType.FINAL_TRANSCRIPT]


async def hear(target: str, pcm: np.ndarray, rate: int) -> list[stt.SpeechData]:
    """The finals of ``pcm`` through a fresh stream (one gRPC stream from its first sample)."""
    engine = voxgate.STT(target=target, language="en")

    async def push(stream: stt.SpeechStream) -> None:
        await feed(stream, pcm, rate)
        stream.end_input()

    try:
        return await finals_of(engine.stream(conn_options=NO_RETRY), push)
    finally:
        await engine.aclose()


def assert_same_words_shifted(
    got: list[stt.SpeechData], ref: list[stt.SpeechData], shift_s: float
) -> None:
    """``got`` says the words of ``ref`` at ``ref``'s times plus ``shift_s``.

    The same audio from the first sample of a fresh stream gets the same word times, give or
    take the aligner's 20 ms steps and a decode that batches differently.
    """
    got_words = [w for f in got for w in f.words]
    ref_words = [w for f in ref for w in f.words]
    assert plain(" ".join(got_words)).split() == plain(" ".join(ref_words)).split()
    for g, r in zip(got_words, ref_words, strict=True):
        assert abs(g.start_time - (r.start_time + shift_s)) <= 0.1, (g, r, shift_s)
        assert abs(g.end_time - (r.end_time + shift_s)) <= 0.1, (g, r, shift_s)
    for g, r in zip(got, ref, strict=True):
        assert abs(g.start_time - (r.start_time + shift_s)) <= 0.1, (g.text, r.text, shift_s)


async def test_retries_leave_every_time_on_the_audio_clock(
    server: LocalServer, sample_call: tuple[np.ndarray, int]
) -> None:
    """The network fails as the stream starts: LiveKit retries while the audio keeps coming
    (it waits in the stream's input), and the words come out at the times a stream that never
    failed gives them, not shifted by the seconds the retries took."""
    pcm, rate = sample_call
    reference = await hear(server.target, pcm, rate)
    async with FlakyNetwork(server.target, drop=1) as net:
        engine = voxgate.STT(target=net.target, language="en")
        errors: list[STTError] = []
        engine.on("error", errors.append)

        async def push(stream: stt.SpeechStream) -> None:
            await feed(stream, pcm, rate)
            stream.end_input()

        stream = engine.stream(conn_options=RETRYING)
        finals = await finals_of(stream, push)
        await engine.aclose()
    assert net.dropped == 1 and errors and all(e.recoverable for e in errors), errors
    assert len(stream.sessions) == 1, "one gRPC stream: the failed attempts never opened one"
    assert_same_words_shifted(finals, reference, 0.0)


async def test_a_stream_the_server_ends_is_reopened_and_later_speech_keeps_the_audio_clock(
    server: LocalServer, short_idle_server: LocalServer, sample_call: tuple[np.ndarray, int]
) -> None:
    """Kennedy, then no audio at all for longer than the server's idle timeout: the server
    ends the gRPC stream (DEADLINE_EXCEEDED), LiveKit retries, the next audio opens a new one,
    and the second speaker is heard at the times the stream's audio puts them at. (Keepalive
    off: with it, the stream survives, see the next test.)"""
    pcm, rate = sample_call
    cut = int(CUT_S * rate)
    first, second = pcm[:cut], pcm[cut:]
    reference = await hear(server.target, second, rate)
    engine = voxgate.STT(target=short_idle_server.target, language="en", keepalive_interval_s=None)
    errors: list[STTError] = []
    engine.on("error", errors.append)

    async def push(stream: stt.SpeechStream) -> None:
        await feed(stream, first, rate)
        await asyncio.sleep(IDLE_TIMEOUT_S + 3.0)
        await feed(stream, second, rate)
        stream.end_input()

    stream = engine.stream()  # LiveKit's default retries
    finals = await finals_of(stream, push)
    await engine.aclose()
    assert len(errors) == 1 and errors[0].recoverable, errors
    assert "DEADLINE_EXCEEDED" in str(errors[0].error), errors
    assert len(stream.sessions) == 2
    heard = plain(" ".join(f.text for f in finals))
    assert "ask not what your country can do for you" in heard, heard
    assert heard.endswith("predecessors of the true printed book"), heard
    later = [f for f in finals if f.start_time >= CUT_S]
    assert_same_words_shifted(later, reference, CUT_S)
    indexes = [f.metadata["utterance_index"] for f in finals]
    assert indexes == sorted(set(indexes)), "utterance indexes keep counting across streams"


async def test_keepalive_silence_keeps_the_stream_and_stays_off_the_audio_clock(
    server: LocalServer, short_idle_server: LocalServer, sample_call: tuple[np.ndarray, int]
) -> None:
    """The same silent gap with keepalive at a quarter of the idle timeout: the one gRPC stream
    survives, and the ten or so silences it sent (a second of audio the server counted) do
    not move the second speaker's words."""
    pcm, rate = sample_call
    cut = int(CUT_S * rate)
    first, second = pcm[:cut], pcm[cut:]
    reference = await hear(server.target, second, rate)
    engine = voxgate.STT(
        target=short_idle_server.target, language="en", keepalive_interval_s=IDLE_TIMEOUT_S / 4
    )
    errors: list[STTError] = []
    engine.on("error", errors.append)

    async def push(stream: stt.SpeechStream) -> None:
        await feed(stream, first, rate)
        await asyncio.sleep(IDLE_TIMEOUT_S + 3.0)
        await feed(stream, second, rate)
        stream.end_input()

    stream = engine.stream(conn_options=NO_RETRY)
    finals = await finals_of(stream, push)
    await engine.aclose()
    assert not errors, errors
    assert len(stream.sessions) == 1, "no reconnect"
    later = [f for f in finals if f.start_time >= CUT_S]
    assert_same_words_shifted(later, reference, CUT_S)


#: Where the connection is cut: inside the second speaker's sentence (12.7 s to 18.1 s).
LOST_AT_S = 14.5


async def test_audio_in_flight_when_the_stream_dies_is_heard_on_the_next_one(
    server: LocalServer, sample_call: tuple[np.ndarray, int]
) -> None:
    """The connection dies mid-sentence (the relay cuts it): the server never finalises the
    open utterance and drops what was still on the wire. The audio sent since Kennedy's final
    is sent again on the next gRPC stream, so the second speaker's sentence is heard whole,
    at the times a stream that never failed gives it."""
    pcm, rate = sample_call
    reference = await hear(server.target, pcm[int(CUT_S * rate) :], rate)
    lost_at = round(LOST_AT_S * 10)  # in 100 ms frames
    async with FlakyNetwork(server.target) as net:
        engine = voxgate.STT(target=net.target, language="en")
        errors: list[STTError] = []
        engine.on("error", errors.append)

        async def push(stream: stt.SpeechStream) -> None:
            for i, f in enumerate(frames(pcm, rate)):
                if i == lost_at:
                    net.cut()
                stream.push_frame(f)
                await asyncio.sleep(f.duration)  # real time, as a room sends it
            stream.end_input()

        stream = engine.stream(conn_options=RETRYING)
        finals = await finals_of(stream, push)
        await engine.aclose()
    assert errors and all(e.recoverable for e in errors), errors
    assert "UNAVAILABLE" in str(errors[0].error), errors
    assert len(stream.sessions) == 2
    heard = plain(" ".join(f.text for f in finals))
    assert "ask not what your country can do for you" in heard, heard
    later = [f for f in finals if f.start_time >= CUT_S]
    assert_same_words_shifted(later, reference, CUT_S)


# -- end of turn ----------------------------------------------------------------------------------


async def test_turn_detection_ends_speech_on_the_end_of_turn_not_each_final(
    server: LocalServer, sample_call: tuple[np.ndarray, int]
) -> None:
    """Kennedy's sentence with the server's smart turn detection: its pauses end utterances
    (each with its final), and END_OF_SPEECH, what LiveKit's ``turn_detection="stt"`` takes
    as the end of the user's turn, comes once per turn, after the turn's last final, carrying
    the turn's text (its finals joined, or the turn decoded whole) and where its speech ended,
    on the audio clock and on the wall clock (``speech_end_time``, which LiveKit's endpointing
    counts from)."""
    pcm, rate = sample_call
    engine = voxgate.STT(target=server.target, language="en", turn_detection="smart")
    pushed: list[tuple[float, float]] = []  # (audio pushed so far, s; wall clock then)

    async def push(stream: stt.SpeechStream) -> None:
        audio_s = 0.0
        for f in frames(pcm[: int(CUT_S * rate)], rate):
            stream.push_frame(f)
            audio_s += f.duration
            pushed.append((audio_s, time.time()))
            await asyncio.sleep(f.duration / 2.0)
        stream.end_input()

    stream = engine.stream(conn_options=NO_RETRY)
    pusher = asyncio.create_task(push(stream))
    events = [ev async for ev in stream]
    await pusher
    await engine.aclose()
    T = stt.SpeechEventType
    speaking = False
    turn: list[stt.SpeechData] = []
    ends: list[stt.SpeechData] = []
    for ev in events:
        if ev.type == T.START_OF_SPEECH:
            assert not speaking
            speaking, turn = True, []
        elif ev.type == T.FINAL_TRANSCRIPT:
            assert speaking
            turn.append(ev.alternatives[0])
        elif ev.type == T.END_OF_SPEECH:
            assert speaking and turn, "a turn ends after its finals"
            speaking = False
            (end,) = ev.alternatives
            assert {f.metadata["turn_index"] for f in turn} == {end.metadata["turn_index"]}
            # The turn's text is its finals joined, or the turn decoded whole (the server's
            # EndOfTurn.text, docs/turns.md "The turn decoded whole"): then the same sentence,
            # with a word a final lost put back ("ask" of "ASK NOT!") or a split word mended.
            said = plain(end.text).split()
            joined = plain(" ".join(f.text for f in turn)).split()
            same = difflib.SequenceMatcher(a=said, b=joined, autojunk=False).ratio()
            assert said == joined or same >= 0.8, (said, joined)
            assert end.start_time == turn[0].start_time
            assert abs(end.end_time - turn[-1].end_time) <= 0.5, (end, turn[-1])
            # speech_end_time: the wall-clock time that audio went out (within a frame of
            # when it was pushed, 100 ms here, plus the sender's pacing).
            assert ev.speech_end_time is not None and ev.speech_end_time <= ev.created_at
            when = next(at - (a - end.end_time) for a, at in pushed if a >= end.end_time)
            assert abs(ev.speech_end_time - when) <= 0.25, (ev.speech_end_time, when)
            ends.append(end)
    assert not speaking and ends
    finals = [ev.alternatives[0] for ev in events if ev.type == T.FINAL_TRANSCRIPT]
    assert [e.metadata["turn_index"] for e in ends] == list(range(len(ends)))
    utterances = {f.metadata["utterance_index"] for f in finals}
    assert len(ends) < len(utterances), "turns span pauses that end utterances"
    # The turns carry the clip's words across its pauses (Whisper may drop the lone "ask" of
    # "ASK NOT!", a fragment of its own: the words around it are what a turn must hold).
    heard = plain(" ".join(e.text for e in ends))
    assert "fellow americans" in heard and "what your country can do for you" in heard, heard


# -- keyterms, options, voices --------------------------------------------------------------------


async def test_session_keyterms_reach_a_running_stream_and_are_recognised(
    server: LocalServer,
) -> None:
    """LiveKit's own keyterm machinery (what ``AgentSession(stt_context_options=...)`` and
    ``session.update_options(keyterms=...)`` drive) sets a name Whisper spells otherwise
    while a stream runs: the stream moves to a gRPC stream that boosts it, and the
    name is heard, on the same audio clock."""
    rate = 16000

    async def unboosted(speech: np.ndarray) -> str:
        return " ".join(f.text for f in await hear(server.target, speech, rate))

    name, speech = await name_heard_otherwise(server.target, rate, unboosted)
    engine = voxgate.STT(target=server.target, language="en", hotwords=["support"])
    assert engine.capabilities.keyterms
    detector = KeytermDetector()
    detector.swap_stt(engine)
    lead = np.zeros(rate, np.int16)  # a second of silence on the first gRPC stream

    async def push(stream: stt.SpeechStream) -> None:
        await feed(stream, lead, rate)
        detector.set_static_keyterms([name])
        await feed(stream, speech, rate)
        stream.end_input()

    stream = engine.stream(conn_options=NO_RETRY)
    finals = await finals_of(stream, push)
    await engine.aclose()
    first, second = stream.sessions
    assert list(first.effective_config.decoding.hotwords) == ["support"]
    assert list(second.effective_config.decoding.hotwords) == ["support", f"{name}^6"]
    heard = plain(" ".join(f.text for f in finals))
    assert plain(name) in heard.split(), heard
    assert finals[0].start_time >= 1.0, "the second gRPC stream starts after the lead's second"


async def test_stt_update_options_reach_streams_opened_later(server: LocalServer) -> None:
    engine = voxgate.STT(target=server.target, keyterms=["Zorblax"], keyterm_boost=4)
    engine.update_options(language="de", interim_interval_ms=500)
    stream = engine.stream(conn_options=NO_RETRY)
    stream.push_frame(frames(np.zeros(1600, np.int16), 16000)[0])
    stream.end_input()
    _ = [ev async for ev in stream]
    await engine.aclose()
    cfg = stream.sessions[0].effective_config
    assert cfg.language == "de" and cfg.interim_interval_ms == 500
    assert list(cfg.decoding.hotwords) == ["Zorblax^4"]


async def test_the_gateways_voices_and_models_are_listed(server: LocalServer) -> None:
    async with VoxgateClient(server.target) as client:
        voices = [v.name for v in await client.list_voices()]
        models = [m.name for m in await client.list_models()]
    voice, ears = voxgate.TTS(target=server.target), voxgate.STT(target=server.target)
    assert [v.name for v in await voice.list_voices()] == voices
    assert [m.name for m in await ears.list_models()] == models
    await voice.aclose()
    await ears.aclose()


async def speak(engine: voxgate.TTS, text: str) -> list[tts.SynthesizedAudio]:
    async with engine.synthesize(text, conn_options=NO_RETRY) as chunked:
        return [a async for a in chunked]


async def test_tts_update_options_change_the_next_synthesis(server: LocalServer) -> None:
    engine = voxgate.TTS(target=server.target, sample_rate=16000, rate=1.6)
    fast = sum(a.frame.duration for a in await speak(engine, REPLY))
    engine.update_options(rate=0.6)
    slow = sum(a.frame.duration for a in await speak(engine, REPLY))
    assert slow > 1.5 * fast, (slow, fast)
    engine.update_options(voice="no-such-voice")
    with pytest.raises(APIStatusError) as err:
        await speak(engine, REPLY)
    assert "voice" in err.value.message
    await engine.aclose()


@pytest.mark.parametrize("rate", [22050, 44100])
async def test_tts_at_a_rate_the_gateway_does_not_serve_is_resampled(
    server: LocalServer, rate: int
) -> None:
    engine = voxgate.TTS(target=server.target, sample_rate=rate)
    stream = engine.stream(conn_options=NO_RETRY)
    stream.push_text(REPLY)
    stream.end_input()
    audio = [a async for a in stream]
    await engine.aclose()
    assert {(a.frame.sample_rate, a.frame.num_channels) for a in audio} == {(rate, 1)}
    seconds = sum(a.frame.duration for a in audio)
    assert 2.0 < seconds < 8.0, seconds
    pcm = np.frombuffer(b"".join(bytes(a.frame.data) for a in audio), np.int16)
    assert np.abs(pcm).max() > 3000  # speech, not silence
    words = timed_words(audio)
    assert plain(" ".join(words)).split() == plain(REPLY).split()
    assert words[-1].end_time <= seconds + 0.05


async def test_a_connection_error_names_its_cause_once() -> None:
    """LiveKit's APIConnectionError appends "(caused by ...)" itself: the plugin's own message
    must not say the status again."""
    engine = voxgate.STT(target="127.0.0.1:9")  # nothing listens on the discard port
    errors: list[STTError] = []
    engine.on("error", errors.append)
    stream = engine.stream(conn_options=APIConnectOptions(max_retry=1, retry_interval=0.1))
    stream.push_frame(frames(np.zeros(1600, np.int16), 16000)[0])
    with pytest.raises(Exception) as err:
        async for _ in stream:
            pass
    await engine.aclose()
    for text in [str(err.value), *(str(e.error) for e in errors)]:
        assert text.count("UNAVAILABLE") == 1, text
        assert text.count("Connection refused") <= 1, text
