"""benchmarks/calls (the product path under load): its pure parts exactly, and a tiny real run.

The tiny run starts ``voxgate serve`` with its default configuration as a subprocess and puts
one real-time caller (with the bot replying) and the fast file client through it; it checks that
both were admitted and served, never how fast (speed is what the benchmark itself reports).
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest

from benchmarks.calls.__main__ import Caller, Probe, fmt, main, speech_end_ms

pytestmark = pytest.mark.e2e


def test_speech_ends_at_the_last_loud_frame_not_the_file() -> None:
    tone = (0.3 * 32767 * np.sin(np.arange(16_000) / 5.0)).astype(np.int16)  # 1 s
    pcm = np.concatenate([np.zeros(3_200, np.int16), tone, np.zeros(16_000, np.int16)])
    assert speech_end_ms(pcm) == 1_200  # 200 ms lead-in + 1 s, not 2.2 s
    assert speech_end_ms(np.zeros(8_000, np.int16)) == 500  # silence: the whole clip


def test_a_probe_passes_only_with_nothing_refused_late_or_lost() -> None:
    good = Caller(admitted=True, finals_ms=[400.0, 900.0, 1400.0], first_audio_ms=[60.0])
    probe = Probe("this", 1, [good], {"files": 2})
    assert probe.passes(1.5)
    s = probe.summary()
    assert (s["admitted"], s["refused"], s["finals"], s["final_p95_ms"]) == (1, 0, 3, 1400.0)
    assert not Probe("this", 1, [good], {}).passes(1.3)  # p95 over the goal
    for bad in (
        Caller(refused="server is at capacity"),
        Caller(admitted=True, finals_ms=[400.0], late=1),
        Caller(admitted=True, finals_ms=[400.0], lost=1),
        Caller(admitted=True, error="INTERNAL: boom"),
    ):
        assert not Probe("this", 2, [good, bad], {}).passes(1.5)
    empty = Probe("this", 1, [Caller(refused="x")], {}).summary()
    assert math.isnan(empty["final_p95_ms"])


def test_a_probe_without_the_fast_client_says_so() -> None:
    good = Caller(admitted=True, finals_ms=[400.0], first_audio_ms=[60.0])
    with_it = Probe("this", 1, [good], {"files": 3}).summary()
    without = Probe("this", 1, [good], {"off": True}).summary()
    assert with_it["fast_client"] and not without["fast_client"]
    assert fmt(with_it).split()[-3:-1] == ["3", "0"]
    assert fmt(without).split()[-3:-1] == ["-", "-"]
    assert Probe("this", 1, [good], {"off": True}).passes(1.5)  # no fast client is no failure


@pytest.mark.timeout(300)
def test_tiny_run_admits_the_caller_and_the_fast_client(tmp_path: Path) -> None:
    out = tmp_path / "calls.json"
    assert main(["--tiny", "--json", str(out)]) == 0
    (row,) = json.loads(out.read_text())
    assert row["admitted"] == 1 and row["refused"] == 0 and row["errors"] == 0
    assert row["finals"] >= 1 and row["lost"] == 0
    assert row["fast_files"] >= 1 and row["fast_refused"] == 0
