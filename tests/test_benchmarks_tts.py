"""benchmarks/tts_concurrency.py: its player model and search, and a tiny real run.

The tiny run uses the bundled voice and piper itself (N = 1, 2, one sentence) so the benchmark
never rots; it checks the shape of the results, not speed (speed is what the full run reports).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from benchmarks.tts_concurrency import KINDS, Search, Stream, main, reply_text


@pytest.mark.unit
def test_player_counts_late_chunks_and_the_silence_they_leave() -> None:
    rate = 1000  # one sample per ms, for readable numbers
    on_time = Stream([(0.1, 200), (0.25, 200), (0.49, 200)])
    assert on_time.summary(rate)["late"] == 0
    # Chunk 2 is needed at 0.3 s, arrives at 0.4 s: 100 ms of silence; the player resumes
    # then, so chunk 3 is needed at 0.6 s and 0.59 s is in time.
    late = Stream([(0.1, 200), (0.4, 200), (0.59, 200)]).summary(rate)
    assert (late["late"], round(late["starve_ms"])) == (1, 100)
    assert late["first_ms"] == pytest.approx(100.0)
    assert late["rtf"] == pytest.approx(0.59 / 0.6)


@pytest.mark.unit
def test_single_reply_benchmark_counts_with_the_same_player() -> None:
    from benchmarks.tts_first_audio import _played

    run = _played([(0.1, 200), (0.4, 200), (0.59, 200)], 1000)
    assert (run.first_s, run.total_s, run.audio_s) == (0.1, 0.59, 0.6)
    assert run.late_chunks == 1 and round(run.starve_ms) == 100


@pytest.mark.unit
@pytest.mark.parametrize(("capacity", "max_n"), [(0, 16), (1, 16), (5, 16), (12, 16), (16, 16)])
def test_search_finds_the_largest_zero_underrun_n(capacity: int, max_n: int) -> None:
    search = Search("m", max_n)
    probes = []
    while (n := search.next_n()) is not None:
        probes.append(n)
        search.record(n, n <= capacity)
    assert search.good == capacity
    assert len(probes) == len(set(probes)) <= 9


@pytest.mark.unit
def test_every_reply_of_a_probe_has_its_own_text() -> None:
    for kind in KINDS:
        texts = {reply_text(kind, i, 0) for i in range(16)}
        assert len(texts) == 16


@pytest.mark.model
def test_tiny_run_reports_every_method(tmp_path: Path) -> None:
    out = tmp_path / "tts.json"
    assert main(["--tiny", "--json", str(out)]) == 0
    result = json.loads(out.read_text())
    methods = {"deadline", "fifo", "piper"}
    assert {key.split("/")[2] for key in result["table"]} == methods
    for key, row in result["table"].items():
        assert row["streams"] == int(key.split("/")[1])
        assert row["first_p50_ms"] > 0 and row["rtf_med"] > 0
        assert row["late_total"] >= 0 and row["starve_ms_per_stream"] >= 0
    assert set(result["largest_zero_underrun_n"]) == methods
    assert all(0 <= n <= 2 for n in result["largest_zero_underrun_n"].values())


@pytest.mark.unit
def test_schedule_simulator_tiny_run_prints_every_policy(
    capsys: pytest.CaptureFixture[str],
) -> None:
    from benchmarks import tts_schedule_sim

    assert tts_schedule_sim.main(["--tiny"]) == 0
    out = capsys.readouterr().out
    for name in tts_schedule_sim.policy_table():
        assert f"{name} " in out
    assert "largest N with zero late chunks" in out


@pytest.mark.unit
def test_the_policy_keeps_eight_replies_fed_where_the_previous_one_fell_behind() -> None:
    """On the virtual clock with the measured cost model (a model of 2 idle cores, not proof:
    the real voice's figures come from the full benchmark): eight four-sentence replies 100 ms
    apart play without a gap under today's policy; the policy before it fell behind (windows
    shrank together until they needed more than the cores), for first audio about as soon."""
    from benchmarks.tts_concurrency import previous_policy
    from benchmarks.tts_schedule_sim import FOUR_SENTENCES, simulate
    from voxgate.gateway.scheduling.synthesis_policy import SynthPolicy

    now = simulate(SynthPolicy(), n=8, units=FOUR_SENTENCES)
    before = simulate(previous_policy(SynthPolicy()), n=8, units=FOUR_SENTENCES)
    assert now.late == 0 < before.late
    first = [s["first_ms"] for s in now.streams]
    first_before = [s["first_ms"] for s in before.streams]
    assert max(first) <= 1.25 * max(first_before)


@pytest.mark.model
def test_first_unit_benchmark_tiny_run_reports_every_method(tmp_path: Path) -> None:
    from benchmarks import tts_first_unit

    out = tmp_path / "cut.json"
    assert tts_first_unit.main(["--tiny", "--json", str(out)]) == 0
    rows = json.loads(out.read_text())
    assert set(rows) == {"3/whole", "3/noise on", "3/naive", "3/lookahead 2"}
    assert rows["3/whole"]["mel_db"] == 0.0 and rows["3/whole"]["shift_ms"] == 0.0
    for row in rows.values():
        assert row["front_ms"] > 0 and row["first_med_ms"] >= row["front_ms"]
    # The plain cut ends its words as a sentence ends (a pause, a lengthened last word);
    # the measured figures, not a bound on them, are the benchmark's to report.
    assert rows["3/naive"]["mel_db"] > 0.0


@pytest.mark.model
@pytest.mark.parametrize(
    ("flag", "methods"),
    [
        ("--paths", ("streamer", "deadline", "fifo", "deadline, cut 3")),
        ("--converse", ("converse deadline", "converse fifo")),
    ],
)
def test_single_reply_paths_tiny_run_reports_every_method(
    capsys: pytest.CaptureFixture[str], flag: str, methods: tuple[str, ...]
) -> None:
    from benchmarks import tts_first_audio

    tts_first_audio.main([flag, "--repeats", "1", "--json"])
    out = capsys.readouterr().out
    rows = json.loads(out[out.index("{") :])
    assert set(rows) == {f"{kind}/{m}" for kind in tts_first_audio.TEXTS for m in methods}
    assert all(row["first_med_ms"] > 0 for row in rows.values())
