"""benchmarks/overload.py: its bookkeeping exactly, and a tiny real run so that it never rots.

The tiny run starts the real server (bundled Whisper) twice, with two real-time callers each;
it checks that the run completes and reports both modes, never how fast anything was (speed is
what the benchmark itself reports).
"""

from __future__ import annotations

import json
import math
from collections import Counter
from pathlib import Path

import pytest

from benchmarks.overload import (
    CallerResult,
    Utt,
    degrade_steps,
    main,
    offered_at,
    phase_of,
    refusal_reason,
    summarise,
)

pytestmark = [pytest.mark.e2e, pytest.mark.model]


def test_phases_follow_the_offered_load() -> None:
    starts = [0.0, 1.0, 2.0, 3.0]
    assert [offered_at(starts, t) for t in (-0.1, 0.0, 1.5, 9.0)] == [0, 1, 2, 4]
    assert [phase_of(k, 2, 4) for k in (1, 2, 3, 4)] == ["<=1x", "<=1x", "1-2x", "2x"]


def test_refusals_are_classified_by_their_text() -> None:
    assert refusal_reason("server is at capacity: recent p95 end of speech -> final is") == (
        "latency"
    )
    assert refusal_reason("... it holds about 12 at target_utilisation=0.75") == "engine_capacity"
    assert refusal_reason("server is at max_concurrent_calls=200; retry") == "max_concurrent_calls"


def test_degrade_steps_are_read_from_the_log() -> None:
    log = (
        "WARNING degrade: shed interim_results (...), level 1\n"
        "WARNING degrade: shed mbr (...), level 2\n"
        "WARNING degrade: restore mbr (...), level 1\n"
    )
    assert degrade_steps(log) == Counter(
        {"shed": 2, "shed:interim_results": 1, "shed:mbr": 1, "restore": 1, "restore:mbr": 1}
    )


def test_summary_rows_split_admitted_calls_by_phase_and_count_missing_finals() -> None:
    starts = [0.0, 1.0, 2.0]
    results = [
        CallerResult(0, 0.0, True, utts=[Utt(0, 0.5, 1, 0.4, 200.0), Utt(0, 2.5, 3, 1.0, 900.0)]),
        CallerResult(1, 1.0, False, refusal="latency"),
        CallerResult(2, 2.0, True, utts=[Utt(2, 2.6, 3)]),  # no final: infinite latency
    ]
    rows = {r.phase: r for r in summarise("m", results, starts, capacity=1)}
    assert (rows["<=1x"].admitted, rows["<=1x"].utterances, rows["<=1x"].server_p95_ms) == (
        1,
        1,
        200.0,
    )
    assert (rows["1-2x"].admitted, rows["1-2x"].refused) == (0, 1)
    assert rows["2x"].utterances == 2 and rows["2x"].missing == 1
    assert math.isinf(rows["2x"].server_p95_ms) and math.isinf(rows["2x"].client_p95_s)


def test_tiny_run_reports_both_modes(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "overload.json"
    main(["--tiny", "--out", str(out)])
    printed = capsys.readouterr().out
    assert "srv p95 ms" in printed and "degradation steps taken" in printed
    report = json.loads(out.read_text())
    runs = {r["mode"]: r for r in report["runs"]}
    assert set(runs) == {"admission", "static"}
    for run in runs.values():
        assert len(run["callers"]) == 2 and [r["phase"] for r in run["rows"]] == [
            "<=1x",
            "1-2x",
            "2x",
        ]
    # Without admission nothing is refused (the static ceiling is 200 calls).
    assert all(c["admitted"] for c in runs["static"]["callers"])
