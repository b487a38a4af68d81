"""Client library pieces that need no server: typed events, config, errors, pacing, WAV I/O."""

from __future__ import annotations

import wave
from pathlib import Path

import grpc
import numpy as np
import pytest
from google.protobuf import any_pb2
from google.rpc import code_pb2, error_details_pb2, status_pb2

from voxgate.v1 import voxgate_pb2 as pb
from voxgate_client import (
    AS_FAST_AS_ALLOWED,
    REALTIME,
    UNPACED,
    Alternative,
    AudioOut,
    CallConfig,
    Dtmf,
    ErrorEvent,
    MarkReached,
    PlaybackFinished,
    PlaybackInterrupted,
    ReplyRecorder,
    SpeechBegin,
    SpeechEnd,
    Transcript,
    VadOptions,
    Word,
    decode_pcm16,
    encode_pcm16,
    event_from_proto,
    load_audio,
    read_wav,
    sample_call_path,
    write_wav,
)
from voxgate_client._errors import quota_from_trailers

pytestmark = pytest.mark.unit


def test_every_response_case_converts_to_its_typed_event() -> None:
    R = pb.ConverseResponse
    cases = [
        (
            R(
                speech=pb.SpeechEvent(
                    type=pb.SpeechEvent.SPEECH_BEGIN, offset_ms=5, utterance_index=1
                )
            ),
            SpeechBegin(5, 1),
        ),
        (
            R(
                speech=pb.SpeechEvent(
                    type=pb.SpeechEvent.SPEECH_END, offset_ms=9, utterance_index=1
                )
            ),
            SpeechEnd(9, 1),
        ),
        (
            R(
                transcript=pb.Transcript(
                    text="hi there",
                    is_final=True,
                    start_ms=1,
                    end_ms=2,
                    confidence=0.5,
                    words=[pb.Word(word="hi", start_ms=1, end_ms=2, probability=0.9)],
                    alternatives=[pb.Alternative(text="high there", confidence=0.2)],
                    language="en",
                    utterance_index=3,
                    latency_ms=40,
                )
            ),
            Transcript(
                "hi there",
                True,
                1,
                2,
                3,
                confidence=0.5,
                language="en",
                latency_ms=40,
                words=(Word("hi", 1, 2, pytest.approx(0.9)),),
                alternatives=(Alternative("high there", pytest.approx(0.2)),),
            ),
        ),
        (
            R(
                audio=pb.AudioOut(
                    data=b"ab", sequence_number=7, speak_id="s", offset_ms=20, is_last=True
                )
            ),
            AudioOut(b"ab", 7, "s", 20, True),
        ),
        (R(mark=pb.MarkReached(name="m")), MarkReached("m")),
        (
            R(
                interrupted=pb.PlaybackInterrupted(
                    speak_id="s", played_ms=300, words_played=["a", "b"], at_offset_ms=1200
                )
            ),
            PlaybackInterrupted("s", 300, ("a", "b"), 1200),
        ),
        (
            R(playback_finished=pb.PlaybackFinished(speak_id="s", duration_ms=900)),
            PlaybackFinished("s", 900),
        ),
        (
            R(
                error=pb.ErrorEvent(
                    code=code_pb2.RESOURCE_EXHAUSTED,
                    message="full",
                    scope="utterance",
                    utterance_index=2,
                )
            ),
            ErrorEvent(grpc.StatusCode.RESOURCE_EXHAUSTED, "full", "utterance", 2),
        ),
        (R(dtmf=pb.Dtmf(digit="#", duration_ms=100)), Dtmf("#", 100)),
    ]
    for msg, expected in cases:
        event = event_from_proto(msg, received_s=12.5)
        assert event == expected
        assert event.received_s == 12.5
    assert event_from_proto(R()) is None  # an unknown/empty case is skipped, not raised
    interrupted = event_from_proto(cases[5][0])
    assert isinstance(interrupted, PlaybackInterrupted) and interrupted.barge_in
    assert not PlaybackInterrupted("s", 0, (), -1).barge_in
    assert Transcript("x", False, 0, 0, 0).interim


def test_call_config_renders_the_session_config() -> None:
    cfg = CallConfig(
        encoding="mulaw",
        sample_rate_hz=8000,
        output_encoding="linear16",
        output_sample_rate_hz=16000,
        interim_results=True,
        language="en",
        barge_in=False,
        hotwords=("voxgate",),
        boosted_phrases=(("Oyelaran", 4.5),),
        echo_handling="aec3",
        vad=VadOptions(aggressiveness=0, end_silence_ms=800),
    ).to_proto()
    assert cfg.barge_in.echo_handling == pb.ECHO_HANDLING_AEC3
    assert cfg.input_audio.encoding == pb.MULAW and cfg.input_audio.sample_rate_hertz == 8000
    assert cfg.output_audio.encoding == pb.LINEAR16
    assert cfg.output_audio.sample_rate_hertz == 16000
    assert cfg.barge_in.disabled and cfg.interim_results
    assert list(cfg.decoding.hotwords) == ["voxgate"]
    ((boosted),) = cfg.decoding.boosted_phrases
    assert boosted.phrase == "Oyelaran" and boosted.boost == pytest.approx(4.5)
    assert cfg.vad.HasField("aggressiveness") and cfg.vad.aggressiveness == 0
    assert cfg.vad.end_silence_ms == 800
    default = CallConfig().to_proto()
    assert not default.vad.HasField("aggressiveness")
    assert default.output_audio.encoding == pb.ENCODING_UNSPECIFIED
    assert default.barge_in.echo_handling == pb.ECHO_HANDLING_UNSPECIFIED  # the server's
    with pytest.raises(ValueError, match="encoding='opus'"):
        CallConfig(encoding="opus").to_proto()  # type: ignore[arg-type]
    both = CallConfig(echo_handling="gate_aec3").to_proto()
    assert both.barge_in.echo_handling == pb.ECHO_HANDLING_GATE_AEC3
    with pytest.raises(ValueError, match="echo_handling='nlms'"):
        CallConfig(echo_handling="nlms").to_proto()  # type: ignore[arg-type]


def test_quota_is_parsed_from_the_rich_status_trailer() -> None:
    detail = any_pb2.Any()
    detail.Pack(
        error_details_pb2.QuotaFailure(
            violations=[error_details_pb2.QuotaFailure.Violation(subject="max_queued_speaks")]
        )
    )
    raw = status_pb2.Status(code=8, message="m", details=[detail]).SerializeToString()
    assert quota_from_trailers((("grpc-status-details-bin", raw),)) == "max_queued_speaks"
    assert quota_from_trailers((("other", "x"),)) is None
    assert quota_from_trailers((("grpc-status-details-bin", b"\xff\xff"),)) is None
    assert quota_from_trailers(None) is None


def test_pacing_is_a_pure_schedule() -> None:
    assert [REALTIME.due_s(ms) for ms in (0, 20, 1000)] == [0.0, 0.02, 1.0]
    assert UNPACED.due_s(10_000) == 0.0
    assert AS_FAST_AS_ALLOWED.due_s(3_000) == 0.0  # inside the burst
    assert AS_FAST_AS_ALLOWED.due_s(11_000) == pytest.approx(2.0)  # 7 s at 3.5x
    # Stays within the server's default limit (5 s burst + 4x) at every chunk, with margin.
    for sent_ms in range(0, 120_000, 20):
        elapsed_ms = 1000 * AS_FAST_AS_ALLOWED.due_s(sent_ms)
        assert sent_ms + 20 <= 5_000 + 4.0 * elapsed_ms - 500


def tone(rate: int, seconds: float = 0.5) -> np.ndarray:
    t = np.arange(int(rate * seconds)) / rate
    return (0.3 * 32767 * np.sin(2 * np.pi * 440 * t)).astype(np.int16)


@pytest.mark.parametrize("rate", [8000, 16000, 24000, 48000])
def test_wav_round_trip_and_wire_encoding(tmp_path: Path, rate: int) -> None:
    pcm = tone(rate)
    path = write_wav(tmp_path / "a.wav", pcm, rate)
    back, back_rate = read_wav(path)
    assert back_rate == rate and np.array_equal(back, pcm)
    lin = load_audio(path)
    assert (lin.encoding, lin.sample_rate_hz) == ("linear16", rate)
    assert lin.duration_ms == pytest.approx(500)
    assert np.array_equal(decode_pcm16(lin.data, "linear16"), pcm)
    mu = load_audio(path, mulaw=True)
    assert (mu.encoding, mu.sample_rate_hz, len(mu.data)) == ("mulaw", 8000, 4000)
    # mu-law at 8 kHz keeps the tone: correlate against a clean 8 kHz tone.
    dec = decode_pcm16(mu.data, "mulaw").astype(np.float64)
    ref = tone(8000).astype(np.float64)
    core = slice(200, 3800)  # resampler edges aside
    corr = np.corrcoef(dec[core], ref[core])[0, 1]
    assert corr > 0.99
    assert all(len(c) == 160 for c in mu.chunks(20)[:-1])
    assert all(len(c) % 2 == 0 for c in lin.chunks(15))


def test_raw_mulaw_files_and_bad_wavs(tmp_path: Path) -> None:
    raw = tmp_path / "caller.ulaw"
    raw.write_bytes(encode_pcm16(tone(8000), 8000, "mulaw").data)
    audio = load_audio(raw)
    assert (audio.encoding, audio.sample_rate_hz, len(audio.data)) == ("mulaw", 8000, 4000)
    stereo = tmp_path / "stereo.wav"
    with wave.open(str(stereo), "wb") as w:
        w.setnchannels(2)
        w.setsampwidth(2)
        w.setframerate(16000)
        w.writeframes(b"\0" * 64)
    with pytest.raises(ValueError, match="mono"):
        read_wav(stereo)
    odd = write_wav(tmp_path / "odd.wav", tone(16000), 16000)
    with wave.open(str(odd), "rb") as r:
        frames = r.readframes(r.getnframes())
    with wave.open(str(tmp_path / "44k.wav"), "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(44100)
        w.writeframes(frames)
    with pytest.raises(ValueError, match="44100 Hz is not a wire rate"):
        load_audio(tmp_path / "44k.wav")


@pytest.mark.parametrize(
    ("data", "why"),
    [
        (b"", "the header is empty or cut off"),
        (b"RIFF", "the header is empty or cut off"),
        (b"ID3\x03\x00 an mp3 file", "file does not start with RIFF id"),
    ],
)
def test_a_file_that_is_not_a_wav_is_a_value_error_naming_it(
    tmp_path: Path, data: bytes, why: str
) -> None:
    # wave.open raises wave.Error or a bare EOFError, which name no file; callers (the CLI)
    # report ValueError as one line, so read_wav must turn them into one.
    path = tmp_path / "caller.wav"
    path.write_bytes(data)
    with pytest.raises(ValueError) as info:
        load_audio(path)
    message = str(info.value)
    assert message.startswith(f"{path}: not a readable WAV file ({why})")
    assert "\n" not in message and "mono 16-bit PCM" in message


@pytest.mark.parametrize("encoding", ["linear16", "mulaw", "alaw"])
def test_reply_recorder_writes_the_frames_as_pcm16(tmp_path: Path, encoding: str) -> None:
    pcm = tone(8000, 0.2)
    wire = encode_pcm16(pcm, 8000, encoding).data  # type: ignore[arg-type]
    width = 2 if encoding == "linear16" else 1
    frame = 160 * width
    rec = ReplyRecorder(encoding, 8000)  # type: ignore[arg-type]
    frames = [wire[i : i + frame] for i in range(0, len(wire), frame)]
    for seq, data in reversed(list(enumerate(frames, 1))):  # out of order on purpose
        rec.add(AudioOut(data, seq, "s1", 20 * (seq - 1), seq == len(frames)))
    out, rate = read_wav(rec.write_wav(tmp_path / "reply.wav"))
    assert rate == 8000 and len(out) == len(pcm)
    assert np.corrcoef(out.astype(float), pcm.astype(float))[0, 1] > 0.999
    assert rec.duration_ms == pytest.approx(200)


def test_bundled_sample_call_is_a_short_16k_mono_wav() -> None:
    pcm, rate = read_wav(sample_call_path())
    assert rate == 16000 and 10 < len(pcm) / rate <= 25
    assert (Path(sample_call_path()).parent / "ATTRIBUTION.md").is_file()


def test_the_moment_a_caller_said_an_offset_is_read_from_the_send_log() -> None:
    """``voxgate call``'s voice-to-voice row: audio sent at real time is spoken as it leaves,
    so offset X was said when its chunk left plus X's place in the chunk."""
    from voxgate.cli.call import _sent_at

    sent = [(100.0, 0.0), (100.02, 20.0), (100.04, 40.0), (100.05, 50.0)]  # the last: the end
    assert _sent_at(sent, 0) == pytest.approx(100.0)
    assert _sent_at(sent, 30) == pytest.approx(100.03)
    assert _sent_at(sent, 45) == pytest.approx(100.045)
    assert _sent_at(sent, 50) is None and _sent_at(sent, -1) is None  # never sent
