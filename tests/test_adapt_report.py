"""voxgate.adapt.scoring, voxgate.adapt.evaluate and voxgate.adapt.report: the numbers and the files
a run leaves."""

from __future__ import annotations

import json
import random
import time
from pathlib import Path
from typing import Any

import jiwer
import numpy as np
import pytest

from voxgate.adapt.data import Pair, read_audio
from voxgate.adapt.evaluate import evaluate, load_engine, score, transcribe
from voxgate.adapt.report import write_report
from voxgate.adapt.scoring import corpus_wer, term_hits, wer

SILENCE = np.zeros(16000, np.float32)


def pairs(*texts: str) -> list[Pair]:
    return [Pair(SILENCE, t, f"c{i}.wav") for i, t in enumerate(texts)]


@pytest.mark.unit
def test_wer_counts_the_same_edits_as_jiwer() -> None:
    rng = random.Random(0)
    vocab = ["refill", "my", "xarelto", "please", "is", "it", "covered"]
    refs, hyps = [], []
    for _ in range(500):
        r = " ".join(rng.choice(vocab) for _ in range(rng.randint(1, 9)))
        h = " ".join(rng.choice(vocab) for _ in range(rng.randint(0, 9)))
        o = jiwer.process_words(r, h)
        assert wer(r, h) == pytest.approx(
            (o.substitutions + o.deletions + o.insertions) / len(r.split())
        )
        refs.append(r)
        hyps.append(h)
    o = jiwer.process_words(refs, hyps)
    total = sum(len(r.split()) for r in refs)
    assert corpus_wer(refs, hyps) == pytest.approx(
        (o.substitutions + o.deletions + o.insertions) / total
    )


@pytest.mark.unit
def test_term_hits_are_normalised_whole_words_counted_once() -> None:
    terms = ["Xarelto", "Eliquis", "Mounjaro"]
    got = term_hits(
        "Refill my XARELTO, and Xarelto again.", "refill my xarelto, my Xarel toe", terms
    )
    assert got == {"Xarelto": (1, 2)}
    assert term_hits("Is Eliquis covered?", "Is eliquis covered? Eliquis!", terms) == {
        "Eliquis": (1, 1)
    }
    assert term_hits("Is Eliquis covered?", "Is the liquid covered?", terms) == {"Eliquis": (0, 1)}
    assert term_hits("no terms here", "Mounjaro", terms) == {}


@pytest.mark.unit
def test_score_sums_words_edits_and_terms() -> None:
    ps = pairs("Refill my Xarelto please", "Is Eliquis covered")
    s = score(ps, ["refill my zero please", "is eliquis covered"], terms=["Xarelto", "Eliquis"])
    assert s.n_words == 7 and s.wer == pytest.approx(1 / 7)
    assert s.term_recall == 0.5 and s.n_terms == 2
    assert s.recall_by_term() == {"Xarelto": (0, 1), "Eliquis": (1, 1)}
    assert [i.wer for i in s.per_item] == [0.25, 0.0]
    assert np.isnan(score(ps, ["", ""], terms=[]).term_recall)
    # Each clip keeps its own measured time (the benchmark's latency percentiles read them).
    timed = score(ps, ["x", "y"], terms=[], seconds=[0.25, 0.5])
    assert [i.seconds for i in timed.per_item] == [0.25, 0.5]
    assert [i.seconds for i in s.per_item] == [0.0, 0.0]
    with pytest.raises(ValueError, match="2 pairs but 1 hypotheses"):
        score(ps, ["x"], terms=[])


def run_report(tmp_path: Path, before_hyps: list[str], after_hyps: list[str], **kw: Any) -> Path:
    ps = pairs("Refill my Xarelto please", "Is Eliquis covered", "the weather is nice")
    terms = ["Xarelto", "Eliquis"]
    before = {"held-out voices": score(ps, before_hyps, terms=terms)}
    after = {"held-out voices": score(ps, after_hyps, terms=terms)}
    return write_report(
        tmp_path,
        losses=kw.get("losses", [(1, 2.5), (2, 1.9), (3, 1.2)]),
        held_out_losses=[(3, 1.5)],
        scores_before=before,
        scores_after=after,
        meta=kw.get("meta", {"name": "pharmacy", "steps": 3, "rank": 8}),
    )


@pytest.mark.unit
def test_report_writes_tables_png_and_json_without_transcripts(tmp_path: Path) -> None:
    md = run_report(
        tmp_path,
        ["refill my zero please", "is the liquid covered", "the weather is nice"],
        ["refill my xarelto please", "is eliquis covered", "the weather is ice"],
    )
    text = md.read_text()
    assert text.startswith("# Adaptation report: pharmacy")
    assert "| rank | 8 |" in text
    # before: 1 + 2 edits of 11 words; after: 1 edit; recall 0 -> 100 %
    assert "| held-out voices | 3 | 11 | 27.3 % | 9.1 % | -18.2 | 0.0 % | 100.0 % | 2 |" in text
    assert "| Xarelto | 1 | 0 | 1 |" in text and "| Eliquis | 1 | 0 | 1 |" in text
    assert "| held-out voices | c1.wav | 66.7 % | 0.0 % |" in text
    assert "![loss per step](loss.png)" in text and "step 3: 1.200" in text
    assert (tmp_path / "loss.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "liquid" not in text and "weather" not in text  # no transcript leaves the run
    numbers = json.loads((tmp_path / "report.json").read_text())
    assert numbers["meta"] == {"name": "pharmacy", "steps": 3, "rank": 8}
    assert numbers["losses"] == [[1, 2.5], [2, 1.9], [3, 1.2]]
    assert numbers["held_out_losses"] == [[3, 1.5]]
    assert numbers["after"]["held-out voices"]["term_recall"] == 1.0
    assert numbers["before"]["held-out voices"]["by_term"]["Xarelto"] == [0, 1]


@pytest.mark.unit
def test_report_without_steps_and_with_mismatched_sets(tmp_path: Path) -> None:
    same = ["refill my xarelto please", "is eliquis covered", "the weather is nice"]
    meta = {"name": "m", "train_seconds": 12.5, "base": Path("models") / "base", "ok": True}
    md = run_report(tmp_path, same, same, losses=[], meta=meta)
    assert "No training steps were recorded." in md.read_text()
    # Every fact of the run is printed as given; report.json keeps JSON values and names the
    # rest as text.
    for key, value in meta.items():
        assert f"| {key} | {value} |" in md.read_text()
    numbers = json.loads((tmp_path / "report.json").read_text())
    assert numbers["meta"] == {**meta, "base": str(Path("models") / "base")}
    assert "(no clip changed)" in md.read_text()
    assert not (tmp_path / "loss.png").exists()
    s = score(pairs("a b"), ["a b"], terms=[])
    with pytest.raises(ValueError, match="before/after sets differ"):
        write_report(tmp_path, losses=[], scores_before={"x": s}, scores_after={"y": s}, meta={})
    other = score([Pair(SILENCE, "a b", "other.wav")], ["a b"], terms=[])
    with pytest.raises(ValueError, match="scored different clips"):
        write_report(
            tmp_path, losses=[], scores_before={"x": s}, scores_after={"x": other}, meta={}
        )


@pytest.mark.model
def test_evaluate_transcribes_with_the_serving_engine(
    speech_dir: Path, manifest: list[dict[str, Any]]
) -> None:
    rows = [r for r in manifest if r["file"].startswith(("jfk_", "ljspeech_"))][:3]
    ps = [Pair(read_audio(speech_dir / r["file"]), r["text"], r["file"]) for r in rows]
    engine = load_engine("base")
    try:
        t0 = time.perf_counter()
        s = evaluate("ignored when an engine is given", ps, terms=["country"], engine=engine)
        wall = time.perf_counter() - t0
        # Each clip's time is its own decode: together they are the run, never more than it.
        secs = [i.seconds for i in s.per_item]
        assert len(secs) == 3 and all(x > 0 for x in secs)
        assert 0.5 * wall <= sum(secs) <= wall, (secs, wall)
        assert s.wer < 0.15, [i.hypothesis for i in s.per_item]
        assert all(i.hypothesis for i in s.per_item)
        # The caller's engine is left open for the caller.
        assert transcribe(engine, ps[0].audio)[0] == s.per_item[0].hypothesis
    finally:
        engine.close()
