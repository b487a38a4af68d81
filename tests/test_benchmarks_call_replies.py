"""benchmarks/calls/replies.py: its callers' plans, and a tiny real run through ``Converse``.

The tiny run (N = 1, 2, short replies, the default gateway with the bundled models, callers
that take a turn and get answered) keeps the benchmark from rotting; it checks the shape of
the results, never speed (speed is what the full run reports, on a machine left to it).
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest

from benchmarks.calls.replies import CHUNK_MS, RATE_HZ, main, plan_callers, reply_text

pytestmark = pytest.mark.model


def test_every_reply_is_distinct_so_none_is_a_phrase_cache_hit() -> None:
    texts = [reply_text(run, call) for run in range(3) for call in range(16)]
    sentences = [s for t in texts for s in t.split(". ")]
    assert len(set(sentences)) == len(sentences)


def test_turns_end_together_and_their_tracks_carry_the_reply_time(speech_dir: Path) -> None:
    plans = plan_callers("turn", speech_dir, 4, lead_in_s=1.0, stagger_s=0.1, reply_s=2.0)
    assert [round(p.turn_end_s - plans[0].turn_end_s, 3) for p in plans] == [0, 0.1, 0.2, 0.3]
    frame = RATE_HZ * CHUNK_MS // 1000
    for p in plans:
        # Speech ends at turn_end_s: its last 20 ms frame is above -40 dBFS, none after it.
        pcm = np.frombuffer(p.track, "<i2").astype(np.float64) / 32768
        end = round(p.turn_end_s * RATE_HZ)
        frames = pcm[end - frame : end + RATE_HZ].reshape(-1, frame)
        loud = np.sqrt((frames**2).mean(axis=1)) > 10 ** (-40 / 20)
        assert loud[0] and not loud[1:].any()
        assert len(pcm) / RATE_HZ >= p.turn_end_s + 2.0
    silent = plan_callers("none", speech_dir, 2, lead_in_s=1.0, stagger_s=0.1, reply_s=2.0)
    assert [(p.track, p.speak_at_s) for p in silent] == [(b"", 1.0), (b"", 1.1)]


def test_a_tiny_run_answers_every_turn_through_converse(
    tmp_path: Path, speech_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "rows.json"
    main(["--tiny", "--speech-dir", str(speech_dir), "--json", str(out)])
    (rows,) = json.loads(out.read_text()).values()
    assert [r["n"] for r in rows] == [1, 2]
    for row in rows:
        assert row["failed"] == 0
        assert math.isfinite(row["first_p95_ms"]) and row["first_p95_ms"] > 0
        assert 1.0 < row["audio_s"] < 5.0  # the short reply, played to its end
        assert row["late_buffered"] <= row["late"]
    assert "first p95" in capsys.readouterr().out
