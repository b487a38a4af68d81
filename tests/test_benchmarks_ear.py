"""benchmarks/ear.py and benchmarks/vad_streams.py in tiny modes, so that they never rot."""

from __future__ import annotations

import subprocess
import sys

import pytest
import telephony as tel

from benchmarks.ear import CallResult, main, report
from benchmarks.vad_streams import Bisection

pytestmark = pytest.mark.e2e


def test_ear_tiny_run_reports_every_variant_and_silero_hears_no_line_noise() -> None:
    text = main(["--tiny", "--no-asr"])
    assert "| webrtc | mulaw8k |" in text and "| silero | linear16k |" in text
    goal_row = next(line for line in text.splitlines() if "files with any event" in line)
    cells = [c.strip() for c in goal_row.split("|")[3:-1]]
    webrtc, silero = int(cells[0]), int(cells[1])
    assert silero == 0 and webrtc > 0  # the default hears no line noise; webrtcvad does


def test_ear_wer_table_from_results() -> None:
    """The WER half of the report, from known transcripts (the tiny run has no recogniser)."""
    clip = tel.Clip("a.wav", tel.hiss(160, 0), "hello there general kenobi")
    good = CallResult([100], [900], ["hello there general kenobi"])
    bad = CallResult([100], [900], ["hello there"])
    missed = CallResult()
    res = {
        "variants": ["webrtc", "silero"],
        "wer_variants": ["webrtc", "silero"],
        "grid": [("clean", float("inf")), ("hum", 10.0)],
        "minutes": {},
        "false_begins": {"webrtc": {}, "silero": {}},
        "calls": {},
        "clips": {
            ("webrtc", "clean", float("inf")): [(clip, bad)],
            ("silero", "clean", float("inf")): [(clip, good)],
            ("webrtc", "hum", 10.0): [(clip, good)],
            ("silero", "hum", 10.0): [(clip, missed)],
        },
        "wall_s": 1.0,
    }
    text = report(res)
    assert "| clean | - | 0/1 | 0.500 | 0/1 | 0.000 | 0.00 |" in text
    assert "| hum | 10 | 0/1 | 0.000 | 1/1 | 1.000 | - |" in text
    # Per clip, where the variants differ (the corpus figure hides which clip it was).
    assert "* clean, a.wav: webrtc 0.500 'hello there'; silero 0.000" in text
    assert "* hum 10 dB, a.wav: webrtc 0.000" in text


def test_bisection_finds_the_largest_held_n() -> None:
    for limit in (1, 7, 48, 100, 300):
        s = Bisection(start=8, max_n=256, resolution=4)
        while (n := s.next_n()) is not None:
            s.record(n, n <= limit)
        assert s.good <= limit
        assert s.bad is None and s.good == 256 if limit >= 256 else limit - s.good < 4


def test_vad_streams_tiny_run_compares_both_models() -> None:
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "benchmarks.vad_streams",
            "--seconds",
            "1",
            "--repeats",
            "1",
            "--cpu-n",
            "2",
            "--start-n",
            "2",
            "--max-n",
            "2",
        ],
        capture_output=True,
        text=True,
        timeout=300,
        check=True,
    ).stdout
    assert "| webrtc |" in out and "| silero |" in out
    assert "largest N held" in out
