"""benchmarks/adapt_windows.py in its tiny mode, so that it never rots.

Three training phrases, two decoder-only steps on utterance windows, one held-out sentence in
one flite voice and one general clip, each model scored on the served buckets and on the
utterance buckets. Checked: the shape of the result and what the windows mean (utterance windows
are whole seconds and encode less than the served buckets) and that ``--keep`` leaves a model
directory the server would load; never the speed or the accuracy.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from benchmarks.adapt_windows import kept_dirs, main
from voxgate.engines.asr._model_files import resolve_model_dir

pytestmark = pytest.mark.model


def test_tiny_run_trains_on_utterance_windows_and_scores_both_servings(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], flite: str
) -> None:
    out = tmp_path / "result.json"
    args = ["--tiny", "--windows", "utterance", "--json", str(out), "--cache", str(tmp_path)]
    args += ["--replay", "2"]  # two general sentences held to the base as served
    args += ["--keep", str(tmp_path / "models")]
    assert main(args) == 0
    data = json.loads(out.read_text())
    (run,) = data["runs"]
    # --keep: the merged model stays, a complete model directory the server would accept
    kept = tmp_path / "models" / "utterance"
    assert run["kept"] == str(kept) and resolve_model_dir(str(kept)) == kept
    assert run["windows"] == "utterance" and run["final_loss"] > 0
    assert data["settings"]["replay_clips"] == 2 and data["settings"]["replay_weight"] == 3.0
    assert all(int(f) % 100 == 0 and int(f) < 1000 for f in run["frames"])  # short phrases
    got = {(r["model"], r["served on"], r["set"]) for r in data["rows"]}
    assert got == {
        (m, s, k)
        for m in ("base", "adapted (utterance)")
        for s in ("served buckets", "utterance buckets")
        for k in ("held-out voices", "general")
    }
    for r in data["rows"]:
        assert r["clips"] == 1 and r["wer"] >= 0.0
    frames = {(r["model"], r["served on"]): r["encoded_frames"] for r in data["rows"]}
    assert frames[("base", "utterance buckets")] < frames[("base", "served buckets")]
    text = capsys.readouterr().out
    assert "| windows |" in text and "| model | served on |" in text


def test_keep_refuses_a_model_directory_already_there(tmp_path: Path) -> None:
    assert kept_dirs(None, ["utterance"]) == {}
    assert kept_dirs(tmp_path, ["utterance", "served"]) == {
        "utterance": tmp_path / "utterance",
        "served": tmp_path / "served",
    }
    (tmp_path / "served").mkdir()
    with pytest.raises(SystemExit, match="already exists.*served"):
        kept_dirs(tmp_path, ["utterance", "served"])
