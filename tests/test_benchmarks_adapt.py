"""benchmarks/adapt_quality.py in its tiny mode, so that it never rots.

Three held-out sentences in one flite voice (16 kHz and mu-law), two general clips, the bundled
base model on both sides: the same model must give the same transcripts, so every WER and recall
pair is equal. Speed is what the benchmark reports, never checked here.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from benchmarks.adapt_quality import main
from voxgate.engines.asr._model_files import resolve_model_dir

pytestmark = pytest.mark.model


def test_tiny_run_scores_both_sides_of_every_set(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], flite: str
) -> None:
    out = tmp_path / "rows.json"
    base = resolve_model_dir("base")
    main(["--tiny", "--model", str(base), "--json", str(out), "--cache", str(tmp_path / "tts")])
    data = json.loads(out.read_text())
    rows = {(r["set"], r["model"]): r for r in data["rows"]}
    sets = ["held-out voices 16k", "held-out voices mulaw", "general 16k"]
    assert sorted(rows) == sorted((s, m) for s in sets for m in ("base", "adapted"))
    for s in sets:
        b, a = rows[(s, "base")], rows[(s, "adapted")]
        assert b["clips"] == a["clips"] > 0 and b["words"] == a["words"] > 0
        assert b["wer"] == a["wer"] and a["median_s"] > 0
    held = rows[("held-out voices 16k", "base")]
    assert held["clips"] == 3 and held["terms_said"] == 3
    assert rows[("general 16k", "base")]["wer"] < 0.2
    assert data["model_bytes"]["base"] == data["model_bytes"]["adapted"] > 100e6
    text = capsys.readouterr().out
    assert "held-out voices 16k: term recall" in text and "latency adapted/base" in text


def test_exactly_one_model_source_is_required() -> None:
    with pytest.raises(SystemExit):
        main(["--tiny"])


def test_the_general_halves_share_no_clip_and_no_speaker(tmp_path: Path) -> None:
    from benchmarks.adapt_quality import SPEECH, _speaker, general_halves, general_pairs
    from voxgate.adapt.data import load_recordings

    a, b = general_halves()
    rows = [json.loads(line) for line in (SPEECH / "manifest.jsonl").read_text().splitlines()]
    assert sorted(a + b) == sorted(r["file"] for r in rows) and len(rows) == 40
    assert not {_speaker(f) for f in a} & {_speaker(f) for f in b}
    assert {_speaker(f) for f in a if f.startswith("librispeech_")} != set()  # speakers grouped
    words = {r["file"]: len(r["text"].split()) for r in rows}
    wa, wb = sum(words[f] for f in a), sum(words[f] for f in b)
    assert abs(wa - wb) <= 0.05 * (wa + wb)
    assert general_halves() == (a, b)  # deterministic
    main(["--write-half", "1", str(tmp_path / "half1.jsonl")])
    recordings = load_recordings(tmp_path / "half1.jsonl")
    assert len(recordings) == len(b)
    assert [p.text for p in general_pairs(0, 1)] == [
        r["text"].strip() for r in rows if r["file"] in set(b)
    ]
