"""benchmarks/turn_taking: its bookkeeping (pause splice, last word, summary) and one real run."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from benchmarks.turn_taking import (
    LEAD_MS,
    Outcome,
    frame_rms,
    last_word_ms,
    lead_in,
    main,
    merge_setting,
    splice_pause,
    summarise,
)

pytestmark = pytest.mark.unit

RATE = 16_000


def words(*spans_ms: tuple[int, int], total_ms: int) -> np.ndarray:
    """Loud tone over each (start, end) span, quiet noise elsewhere."""
    t = np.arange(total_ms * 16)
    pcm = (30 * np.sin(t)).astype(np.int16)
    for a, b in spans_ms:
        pcm[a * 16 : b * 16] = (8000 * np.sin(2 * np.pi * 200 * t[a * 16 : b * 16] / RATE)).astype(
            np.int16
        )
    return pcm


def test_a_setting_lands_in_the_servers_overrides_beside_the_others() -> None:
    """``--setting KEY=VALUE``: dotted names nest, values read as JSON (else text), and the
    benchmark's own overrides stay."""
    overrides: dict[str, object] = {"session": {"turns": {"smart_turn_model": ""}}}
    merge_setting(overrides, "session.turns.decode_after_ms=40")
    merge_setting(overrides, "asr.decode_loop.always=true")
    merge_setting(overrides, "asr.model=tiny.en")
    assert overrides == {
        "session": {"turns": {"smart_turn_model": "", "decode_after_ms": 40}},
        "asr": {"decode_loop": {"always": True}, "model": "tiny.en"},
    }
    with pytest.raises(SystemExit, match="KEY=VALUE"):
        merge_setting(overrides, "session.turns.decode_after_ms")


def test_the_pause_goes_into_the_quietest_mid_sentence_gap() -> None:
    pcm = words((200, 1000), (1100, 3000), total_ms=3600)
    assert last_word_ms(pcm) == 3000
    spliced = splice_pause(pcm, 600)
    assert spliced is not None
    audio, pause_end = spliced
    assert len(audio) == len(pcm) + 600 * 16
    # The gap at 1000-1100 ms is inside the middle half; the pause lands in it.
    assert 1000 + 600 <= pause_end <= 1100 + 600
    assert last_word_ms(audio) == 3600


def test_a_noisy_recordings_noise_is_not_its_last_word() -> None:
    """Noise at -43 dBFS that swings over -40 (a FLEURS recording's) after the last word."""
    rng = np.random.default_rng(0)
    pcm = words((200, 2000), total_ms=4000).astype(np.float64)
    noise = rng.normal(0.0, 32768 * 10 ** (-43 / 20), len(pcm))
    noise[2500 * 16 : 2600 * 16] *= 2.0  # a swing to -37 dBFS, after the speech
    noisy = np.clip(pcm + noise, -32768, 32767).astype(np.int16)
    assert 2000 <= last_word_ms(noisy) <= 2020
    assert last_word_ms(words((200, 2000), total_ms=4000)) == 2000  # a clean one as before


def test_the_noise_lead_in_is_the_recordings_own_line_noise_not_its_zeros() -> None:
    """``--lead noise``: the quietest 60 ms of real audio, repeated; never the digital silence
    a recording opens with, never a word; zeros where the recording has no line noise."""
    rng = np.random.default_rng(1)
    pcm = words((600, 1500), total_ms=2000).astype(np.float64)
    pcm += rng.normal(0.0, 32768 * 10 ** (-50 / 20), len(pcm))
    pcm[: 200 * 16] = 0.0  # the recording opens on 200 ms of digital silence
    rec = np.clip(pcm, -32768, 32767).astype(np.int16)
    lead = lead_in(rec, "noise")
    assert lead.dtype == np.int16 and len(lead) == LEAD_MS * 16
    level = 20 * np.log10(np.sqrt(np.mean(lead.astype(np.float64) ** 2)) / 32768)
    assert -53 < level < -47, level  # the line's noise: not its zeros, not the 200 Hz word
    assert (frame_rms(lead) > 10 ** (-80 / 20)).all()  # no frame of digital silence
    assert not lead_in(rec, "zeros").any() and len(lead_in(rec, "zeros")) == LEAD_MS * 16
    assert not lead_in(np.zeros(16_000, np.int16), "noise").any()
    with pytest.raises(ValueError, match="zeros or noise"):
        lead_in(rec, "hum")


def test_a_clip_with_no_gap_is_not_spliced() -> None:
    assert splice_pause(np.zeros(16_000, np.int16), 300) is None


def test_the_summary_counts_premature_ends_per_pause() -> None:
    calls = [
        Outcome("words", "pauses", 1, "a", eot_ms=300, final_ms=200, premature=1, pauses=1),
        Outcome("words", "pauses", 1, "b", eot_ms=2500, final_ms=250, pauses=1, not_ended=True),
    ]
    s = summarise(calls)
    assert s["premature"] == 1 and s["premature_per_unit"] == 0.5
    assert s["not_ended_2s"] == 1 and s["final_p50_ms"] is not None


def test_the_summary_splits_the_finals_time_at_speech_end() -> None:
    calls = [
        Outcome("words", "real", 1, "a", final_ms=400, speech_end_ms=300, final_server_ms=90),
        Outcome("words", "real", 1, "b", final_ms=500, speech_end_ms=320, final_server_ms=170),
        Outcome("words", "real", 1, "c", final_ms=450, speech_end_ms=310, final_server_ms=130),
        Outcome("words", "real", 1, "d"),  # no final covered its last word
    ]
    s = summarise(calls)
    assert s["speech_end_p50_ms"] == 310 and s["final_after_speech_end_p50_ms"] == 130


@pytest.mark.e2e
@pytest.mark.parametrize(
    ("placement", "leads"), [("inprocess", ["zeros", "noise"]), ("process", [])]
)
def test_a_real_call_reports_where_its_final_time_went(
    tmp_path: Path, placement: str, leads: list[str]
) -> None:
    """Through Converse on the default server (smart turns, the bundled model): the final of
    the last word comes after its SPEECH_END, and the server's latency is the difference's
    upper bound (it counts from the server's SPEECH_END, before the client received it).
    Whether the server shares the callers' interpreter or runs as ``voxgate serve``, and
    whichever lead-in the calls open with (each its own cell)."""
    out = tmp_path / "tt.json"
    argv = ["--tiny", "--callers", "1", "--variants", "words", "--sets", "real"]
    argv += [arg for lead in leads for arg in ("--lead", lead)]
    assert main([*argv, "--server", placement, "--json", str(out)]) == 0
    report = json.loads(out.read_text())
    calls = report["calls"]
    assert len(calls) == 2 * max(1, len(leads)) and not any(c["error"] for c in calls)
    labels = [c["variant"] for c in report["cells"]]
    assert labels == ([f"words lead {lead}" for lead in leads] if leads else ["words"])
    timed = [c for c in calls if c["final_ms"] is not None]
    assert timed, calls
    for c in timed:
        assert c["speech_end_ms"] is not None and c["final_server_ms"] is not None
        assert c["speech_end_ms"] <= c["final_ms"] + 1
        assert 0 <= c["final_server_ms"] <= c["final_ms"] - c["speech_end_ms"] + 50
