"""benchmarks/model_sharing.py in a tiny mode, so that it never rots.

A tiny random-weight Whisper (benchmarks/gpu_check builds it with NumPy in a second) stands in
for the bundled base: no timing and no accuracy is checked here, only that every arrangement
runs both models' utterances to a result and the table comes out; the real figures are what
the benchmark itself prints (docs/adapt.md).
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

import benchmarks.gpu_check as gc
from benchmarks import model_sharing

pytestmark = pytest.mark.model


def test_model_sharing_runs_every_arrangement_and_prints_its_table(
    tmp_path: Path, speech_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    tiny = gc.build_random_spec(gc.TINY, tmp_path / "tiny", "int8")
    model_sharing.main(
        [
            "--model-a",
            str(tiny),
            "--utterances",
            "2",
            "--backlog",
            "1",
            "--rounds",
            "1",
            "--speech-dir",
            str(speech_dir),
            "--clip-seconds",
            "1.5",
            "--no-policy",
        ]
    )
    out = capsys.readouterr().out
    rows = [line for line in out.splitlines() if line.startswith("| ") and "---" not in line]
    assert [r.split(" | ")[0].strip("| ") for r in rows[1:]] == list(model_sharing.ARRANGEMENTS)
    assert "| shared | " in out and "1.00x" in out
    # Random weights decode noise, so only the count's form is checked here; with the real
    # base every transcript matches (tests/test_models_serving.py checks that through a server).
    assert re.search(r"B's transcripts equal to the default model's \(same files\): \d/1", out)
