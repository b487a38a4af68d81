"""benchmarks/tts_concurrency.py: its player model and search, and a tiny real run.

The tiny run uses the bundled voice and piper itself (N = 1, 2, one sentence) so the benchmark
never rots; it checks the shape of the results, not speed (speed is what the full run reports).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from benchmarks.tts_concurrency import KINDS, Search, Stream, main, reply_text


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


@pytest.mark.parametrize(("capacity", "max_n"), [(0, 16), (1, 16), (5, 16), (12, 16), (16, 16)])
def test_search_finds_the_largest_zero_underrun_n(capacity: int, max_n: int) -> None:
    search = Search("m", max_n)
    probes = []
    while (n := search.next_n()) is not None:
        probes.append(n)
        search.record(n, n <= capacity)
    assert search.good == capacity
    assert len(probes) == len(set(probes)) <= 9


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
