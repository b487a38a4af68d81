"""The call timeline PNG, drawn from a synthetic event log (no server, no models)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from clients.timeline import CallLog, draw_timeline
from clients.voxgate_client import (
    AudioOut,
    PlaybackInterrupted,
    SpeechBegin,
    SpeechEnd,
    Transcript,
    encode_pcm16,
)

pytestmark = pytest.mark.unit


def synthetic_log() -> CallLog:
    rate = 16000
    t = np.arange(6 * rate) / rate
    voiced = ((t > 0.5) & (t < 2.5)) | ((t > 3.5) & (t < 5.0))
    pcm = (voiced * 0.4 * 32767 * np.sin(2 * np.pi * 180 * t)).astype(np.int16)
    t0 = 100.0
    log = CallLog(
        t0_s=t0, caller_pcm=pcm, caller_rate_hz=rate, reply_encoding="mulaw", reply_rate_hz=8000
    )
    # Audio sent twice as fast as real time: wall time = offset / 2.
    log.sent = [(t0 + ms / 2000.0, float(ms)) for ms in range(0, 6001, 20)]
    reply = encode_pcm16(
        (0.3 * 32767 * np.sin(np.arange(8000) / 5)).astype(np.int16), 8000, "mulaw"
    ).data
    log.events = [
        SpeechBegin(500, 0, received_s=t0 + 0.3),
        Transcript("hello the", False, 500, 1500, 0, received_s=t0 + 0.9),
        SpeechEnd(2500, 0, received_s=t0 + 1.3),
        Transcript("hello there", True, 500, 2500, 0, latency_ms=200, received_s=t0 + 1.5),
        *[
            AudioOut(
                reply[i : i + 160],
                i // 160 + 1,
                "s1",
                i // 8,
                False,
                received_s=t0 + 1.7 + i / 8000,
            )
            for i in range(0, 8000, 160)
        ],
        SpeechBegin(3500, 1, received_s=t0 + 1.8),
        PlaybackInterrupted("s1", 100, ("hi",), 3500, received_s=t0 + 1.85),
        SpeechEnd(5000, 1, received_s=t0 + 2.6),
    ]
    log.speaks = [(t0 + 1.55, "s1", "hi, how can I help?")]
    return log


def test_timeline_png_is_written_and_not_blank(tmp_path: Path) -> None:
    matplotlib = pytest.importorskip("matplotlib")  # the `viz` extra; installed in dev
    assert matplotlib
    from matplotlib.image import imread

    path = draw_timeline(synthetic_log(), tmp_path / "sub" / "call.png", title="synthetic")
    assert path.stat().st_size > 20_000
    img = imread(str(path))
    assert img.shape[0] >= 600 and img.shape[1] >= 1200
    rgb = img[..., :3]
    assert float(rgb.std()) > 0.05  # not a blank canvas
    # The barge-in line is drawn in red somewhere.
    red = (rgb[..., 0] > 0.7) & (rgb[..., 1] < 0.2) & (rgb[..., 2] < 0.2)
    assert red.sum() > 100


def test_offsets_map_to_wall_time_through_the_send_log() -> None:
    log = synthetic_log()
    assert log.wall_of_offset(3000.0) == pytest.approx(1.5)
    bare = CallLog(t0_s=0.0, caller_pcm=np.zeros(10, np.int16), caller_rate_hz=16000)
    assert bare.wall_of_offset(2500.0) == pytest.approx(2.5)


def test_an_empty_call_still_draws(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    log = CallLog(t0_s=0.0, caller_pcm=np.zeros(1600, np.int16), caller_rate_hz=16000)
    assert draw_timeline(log, tmp_path / "empty.png").stat().st_size > 5_000
