"""The call timeline, from synthetic event logs (no server, no models).

What is drawn is tested as data (:func:`build_timeline`, in call-time seconds) and the PNG only
for being a real picture with a legend. The calls that produce these logs for real are in
test_client.py (any send pace) and test_client_models.py (the demo).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from voxgate.cli.timeline import CallClock, CallLog, build_timeline, draw_timeline, render_timeline
from voxgate_client import (
    AudioOut,
    PlaybackInterrupted,
    SpeechBegin,
    SpeechEnd,
    Transcript,
    encode_pcm16,
)

pytestmark = pytest.mark.unit

RATE = 16000
T0 = 100.0


def caller_pcm(seconds: float = 6.0) -> np.ndarray:
    t = np.arange(int(seconds * RATE)) / RATE
    voiced = ((t > 0.5) & (t < 2.5)) | ((t > 3.5) & (t < 5.0))
    return (voiced * 0.4 * 32767 * np.sin(2 * np.pi * 180 * t)).astype(np.int16)


def reply_frames(sid: str, first_at: float, seconds: float = 1.0) -> list[AudioOut]:
    """A reply of ``seconds`` in 20 ms mu-law frames, arriving at real time from ``first_at``."""
    n = int(8000 * seconds)
    data = encode_pcm16(
        (0.3 * 32767 * np.sin(np.arange(n) / 5)).astype(np.int16), 8000, "mulaw"
    ).data
    return [
        AudioOut(data[i : i + 160], i // 160 + 1, sid, i // 8, i + 160 >= n, first_at + i / 8000)
        for i in range(0, n, 160)
    ]


def synthetic_log(pace: float = 2.0) -> CallLog:
    """Six seconds of caller audio sent at ``pace`` x real time, with a barge-in."""
    log = CallLog(
        t0_s=T0,
        caller_pcm=caller_pcm(),
        caller_rate_hz=RATE,
        reply_encoding="mulaw",
        reply_rate_hz=8000,
    )
    log.sent = [(T0 + ms / 1000.0 / pace, float(ms)) for ms in range(0, 6001, 20)]
    log.events = [
        SpeechBegin(500, 0, received_s=T0 + 0.3),
        Transcript("hello the", False, 500, 1500, 0, received_s=T0 + 0.9),
        SpeechEnd(2500, 0, received_s=T0 + 1.3),
        Transcript("hello there", True, 500, 2500, 0, latency_ms=200, received_s=T0 + 1.5),
        *reply_frames("s1", T0 + 1.7),
        SpeechBegin(3500, 1, received_s=T0 + 1.8),
        PlaybackInterrupted("s1", 100, ("hi",), 3500, received_s=T0 + 1.85),
        SpeechEnd(5000, 1, received_s=T0 + 2.6),
    ]
    log.speaks = [(T0 + 1.55, "s1", "hi, how can I help?")]
    return log


@pytest.mark.parametrize("pace", [1.0, 2.0, 3.5, 1000.0])
def test_caller_audio_keeps_its_true_length_at_any_send_pace(pace: float) -> None:
    # Drawn on the send time, 6 s sent at 2x spanned 3 s and each utterance half its length.
    tl = build_timeline(synthetic_log(pace))
    assert tl.caller_span_s == pytest.approx(6.0)
    assert [s.end_s - s.start_s for s in tl.speech] == pytest.approx([2.0, 1.5])
    # Every offset lands where its audio sample is drawn.
    for span, begin_ms in zip(tl.speech, (500, 3500), strict=True):
        assert span.start_s == pytest.approx(tl.caller_x[begin_ms * RATE // 1000])
    # The final transcript spans the audio it covers (500-2500 ms), on the same axis.
    (final,) = tl.finals
    assert final.end_s - final.start_s == pytest.approx(2.0)
    assert final.start_s == pytest.approx(tl.speech[0].start_s)
    assert tl.speech[0].label == "utt 0: 0.50-2.50 s"


def test_reply_audio_keeps_its_length_and_stops_where_it_was_cut() -> None:
    log = synthetic_log(3.5)
    log.events += reply_frames("s2", T0 + 4.0, seconds=0.6)
    tl = build_timeline(log)
    cut, full = tl.replies
    # Interrupted after 100 ms: the frames sent ahead of the cut were never heard.
    assert cut.interrupted is not None and cut.speak_id == "s1"
    assert cut.end_s - cut.start_s == pytest.approx(0.1, abs=1 / 8000 + 1e-9)
    assert full.interrupted is None
    assert full.end_s - full.start_s == pytest.approx(0.6 - 1 / 8000)
    (barge,) = tl.interruptions
    assert barge.at_s == pytest.approx(cut.end_s)
    assert barge.label == "barge-in (100 ms played)"
    # After the caller's audio has ended (6 s at 3.5x: 1.71 s after t0), call time runs 1:1.
    assert full.start_s == pytest.approx(6.0 + (4.0 - 6.0 / 3.5))


def test_a_wait_for_the_bot_is_a_gap_in_the_caller_audio() -> None:
    # Real time, but the sender waits 1.5 s after 2 s of audio (wait_for_bot): the audio
    # keeps its length, the wait is a gap, and the reply played in the gap stays in the gap.
    log = CallLog(t0_s=T0, caller_pcm=caller_pcm(4.0), caller_rate_hz=RATE)
    log.sent = [(T0 + ms / 1000.0, float(ms)) for ms in range(0, 2001, 20)]
    log.pauses = [(T0 + 2.0, T0 + 3.5)]
    log.sent += [(T0 + 1.5 + ms / 1000.0, float(ms)) for ms in range(2020, 4001, 20)]
    log.reply_encoding, log.reply_rate_hz = "mulaw", 8000
    log.events = [*reply_frames("s1", T0 + 2.2, seconds=1.0)]
    tl = build_timeline(log)
    assert tl.caller_span_s == pytest.approx(4.0 + 1.5, abs=0.021)
    (wait,) = tl.waits
    assert (wait.start_s, wait.end_s) == pytest.approx((2.0, 3.5), abs=0.021)
    # The chunk sent before the wait (2000-2020 ms) is drawn before it, the next one after it.
    assert tl.caller_x[2 * RATE + 319] < wait.start_s
    assert tl.caller_x[2 * RATE + 320] == pytest.approx(wait.end_s)
    (reply,) = tl.replies
    assert wait.start_s < reply.start_s and reply.end_s < wait.end_s


def test_the_clock_without_any_audio_sent_is_the_wall_clock() -> None:
    bare = CallClock(T0, [])
    assert bare.offset(2500.0) == pytest.approx(2.5)
    assert bare.wall(T0 + 1.25) == pytest.approx(1.25)
    # Before the first chunk (a greeting heard out), call time is the wall clock too.
    clock = CallClock(T0, [(T0 + 3.0, 0.0), (T0 + 3.0, 20.0)], [(T0 + 0.1, T0 + 3.0)])
    assert clock.wall(T0 + 1.0) == pytest.approx(1.0)
    assert clock.offset(0.0) == pytest.approx(3.0)


def test_timeline_png_is_written_with_a_legend(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")  # the `viz` extra; installed in dev
    from matplotlib.image import imread

    log = synthetic_log()
    fig = render_timeline(log, title="synthetic")
    (legend,) = fig.legends
    labels = {t.get_text() for t in legend.get_texts()}
    assert {
        "caller audio",
        "VAD speech (utterance)",
        "final transcript",
        "bot audio",
        "barge-in / cleared",
    } <= labels
    path = draw_timeline(log, tmp_path / "sub" / "call.png", title="synthetic")
    img = imread(str(path))
    assert img.shape[0] >= 600 and img.shape[1] >= 1200
    rgb = img[..., :3]
    assert float(rgb.std()) > 0.05  # not a blank canvas
    # The barge-in line is drawn in red somewhere.
    red = (rgb[..., 0] > 0.7) & (rgb[..., 1] < 0.2) & (rgb[..., 2] < 0.2)
    assert red.sum() > 100


def test_an_empty_call_still_draws(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    log = CallLog(t0_s=0.0, caller_pcm=np.zeros(1600, np.int16), caller_rate_hz=16000)
    assert draw_timeline(log, tmp_path / "empty.png").stat().st_size > 5_000
