"""Training windows: the same LoRA run on served buckets, on 30 s windows, on utterance windows.

The gateway encodes each utterance on the smallest bucket that holds it plus a margin (10/15/20/
30 s), not on Whisper's 30 s. ``voxgate adapt`` trains on those served windows by default; this
measures what that choice is worth against 30 s padding (``full``) and, for the audio-context
experiment, against windows sized to the clip (``utterance``: the clip plus 0.5 s).

Every run trains the same adapters on the same data with the same seed and steps: the pharmacy
example's phrases spoken by the bundled Piper voice (phone-line augmented). Scoring is on audio
the training never heard: the benchmark's held-out sentences spoken by the Debian flite voices
(as benchmarks/adapt_quality), and a sample of the 40 shared clips for general speech. Each
merged model is transcribed by the serving engine as the gateway runs it (served buckets), and
the ``utterance`` model also with utterance-sized buckets (1 s steps, 0.5 s margin), which is
how it would have to be served to save encoder time (``voxgate.adapt.train.UTTERANCE_WINDOWS``: a
bucket every second, 0.5 s margin).

``--train-on speakers`` is the audio-context fine-tuning (ACFT) experiment on real speech: train
on the shared clips of the speakers that have three or more (27 clips, 6 speakers, about three
minutes), score on the 13 clips of the 12 speakers the training never heard. That is far too
little audio to teach Whisper a new input regime in general; the run shows whether the
direction holds, not a deployable model.

Speed figures (s/step, encode time) are measured one run after another on a shared machine and
are indicative only; the accuracy figures do not depend on load.

    .venv/bin/python -m benchmarks.adapt_windows --steps 80
    .venv/bin/python -m benchmarks.adapt_windows \
        --train-on speakers --windows utterance,served --encoder-too --steps 60
    .venv/bin/python -m benchmarks.adapt_windows --windows utterance --encoder-too \
        --replay 157 --general 40 --voices slt     # ACFT held to the base as served
    .venv/bin/python -m benchmarks.adapt_windows --windows utterance --encoder-too \
        --replay 157 --general 40 --voices slt --keep MODELS   # then serve MODELS/utterance
    .venv/bin/python -m benchmarks.adapt_windows --tiny        # smoke run

``--keep DIR`` keeps each merged model as ``DIR/<windows>`` (refused before training if that
directory exists), so the capacity it buys can be measured on a real gateway:
``benchmarks.asr_capacity --alt-model DIR/utterance --alt-encoder-buckets utterance``.
"""

from __future__ import annotations

import argparse
import io
import json
import math
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks.adapt_quality import (
    EXAMPLE,
    HELDOUT,
    SPEECH,
    flite_cache,
    flite_pairs,
    general_pairs,
)
from voxgate.adapt.convert import read_base, write_ct2_dir
from voxgate.adapt.data import (
    Pair,
    general_sentences,
    load_pairs,
    read_phrases,
    split,
    synthesize_phrases,
)
from voxgate.adapt.evaluate import Scores, evaluate, load_engine
from voxgate.adapt.progress import Progress
from voxgate.adapt.train import UTTERANCE_WINDOWS, TrainConfig, make_examples, merge, train
from voxgate.engines.asr._model_files import resolve_model_dir


def _fmt(x: float) -> str:
    return "-" if math.isnan(x) else f"{100 * x:.1f}"


def _row(name: str, serving: str, s: Scores, extra: dict[str, Any]) -> dict[str, Any]:
    return {
        "model": name,
        "served on": serving,
        "clips": len(s.per_item),
        "wer": s.wer,
        "term_recall": s.term_recall,
        **extra,
    }


def speaker_split(min_clips: int) -> tuple[list[Pair], list[Pair]]:
    """The shared clips of speakers with at least ``min_clips`` clips, and all the others."""
    rows = [json.loads(line) for line in (SPEECH / "manifest.jsonl").read_text().splitlines()]
    counts: dict[str, int] = {}
    for r in rows:
        counts[r["speaker"]] = counts.get(r["speaker"], 0) + 1
    pairs = load_pairs(SPEECH / "manifest.jsonl")
    trained = [p for p, r in zip(pairs, rows, strict=True) if counts[r["speaker"]] >= min_clips]
    held = [p for p, r in zip(pairs, rows, strict=True) if counts[r["speaker"]] < min_clips]
    return trained, held


def kept_dirs(keep: Path | None, windows: list[str]) -> dict[str, Path]:
    """Where ``--keep`` puts each run's merged model: ``keep/<windows>``; empty without it.

    Checked before any training starts: a directory already there is an error rather than a
    model silently mixed with an older run's files after minutes of training.
    """
    if keep is None:
        return {}
    dirs = {w: keep / w for w in windows}
    there = [str(d) for d in dirs.values() if d.exists()]
    if there:
        raise SystemExit(f"--keep: already exists, remove it or pick another: {', '.join(there)}")
    return dirs


def run(args: argparse.Namespace) -> dict[str, Any]:
    kept = kept_dirs(args.keep, args.windows.split(","))
    base_dir = resolve_model_dir("base")
    base = read_base(base_dir)
    t0 = time.monotonic()
    if args.train_on == "speakers":
        # Real speech, speakers apart: train on the speakers with several clips, score on the
        # ones the training never heard (the audio-context experiment's held-out speakers).
        train_pairs, others = speaker_split(3)
        if args.tiny:
            train_pairs, others = train_pairs[:2], others[:1]
        sets: dict[str, tuple[list[Pair], list[str]]] = {"held-out speakers": (others, [])}
        held: list[Pair] = others
        voices: tuple[str, ...] = ()
    else:
        phrases = read_phrases(EXAMPLE / "phrases.txt")
        terms = read_phrases(EXAMPLE / "terms.txt")
        sentences = read_phrases(HELDOUT)
        voices = tuple(args.voices.split(","))
        if args.tiny:
            phrases, sentences, voices = phrases[:3], sentences[:1], voices[:1]
        pairs = synthesize_phrases(phrases, variants=args.variants, seed=args.seed)
        train_pairs, _ = split(pairs, held_out=0.0, seed=args.seed)
        cache = args.cache or flite_cache()
        held = flite_pairs(sentences, voices, cache)
        general = general_pairs(args.general) if args.general > 0 else []
        sets = {"held-out voices": (held, terms), "general": (general, [])}
        sets = {k: v for k, v in sets.items() if v[0]}
    replay: list[Pair] = []
    if args.replay:
        # The general sentences voxgate adapt replays, held to the base as served (KL).
        text = general_sentences(args.replay, seed=args.seed)
        replay = synthesize_phrases(text, variants=1, seed=args.seed + 1, label="general")
    synth_s = time.monotonic() - t0

    utt_cfg = {"encoder": UTTERANCE_WINDOWS.model_dump()}
    rows: list[dict[str, Any]] = []
    runs: list[dict[str, Any]] = []

    def score_model(name: str, model_dir: Path, utterance: bool, extra: dict[str, Any]) -> None:
        servings = [("served buckets", {})]
        if utterance:
            servings.append(("utterance buckets", utt_cfg))
        for serving, cfg in servings:
            engine = load_engine(model_dir, **cfg)
            try:
                for set_name, (set_pairs, set_terms) in sets.items():
                    s = evaluate(model_dir, set_pairs, terms=set_terms, engine=engine)
                    enc = engine.counters.encoded_frames
                    rows.append(
                        {**_row(name, serving, s, extra), "set": set_name, "encoded_frames": enc}
                    )
                    print(f"scored: {json.dumps(rows[-1], default=float)}", file=sys.stderr)
                    engine.counters.reset()
            finally:
                engine.close()

    score_model("base", base_dir, "utterance" in args.windows.split(","), {})
    with tempfile.TemporaryDirectory(prefix="adapt-windows-") as tmp:
        for windows in args.windows.split(","):
            cfg = TrainConfig(
                steps=args.steps,
                rank=args.rank,
                learning_rate=args.learning_rate,
                batch_size=args.batch_size,
                decoder_only=args.decoder_only,
                windows=windows,  # type: ignore[arg-type]
                checkpoint_every=args.steps,
                seed=args.seed,
                threads=args.threads,
                replay_weight=args.replay_weight,
            )
            t1 = time.monotonic()
            examples = make_examples(base, train_pairs, windows=cfg.windows)
            examples += make_examples(base, replay, windows=cfg.windows, replay=True)
            prep_s = time.monotonic() - t1
            result = train(
                base,
                examples,
                cfg,
                Path(tmp) / f"work-{windows}",
                progress=Progress(io.StringIO(), tty=False),
            )
            tail = [v for _, v in result.losses[-max(1, args.steps // 5) :]]
            out = kept.get(windows, Path(tmp) / windows)
            out.parent.mkdir(parents=True, exist_ok=True)
            write_ct2_dir(merge(base.state, result.adapters), base, out)
            info = {
                "windows": windows,
                "train_s": round(result.seconds, 1),
                "s_per_step": round(result.seconds / max(1, result.steps), 3),
                "final_loss": sum(tail) / len(tail),
                "frames": result.windows,
                "prep_s": round(prep_s, 1),
                "kept": str(out) if windows in kept else None,
            }
            runs.append(info)
            print(f"trained {windows}: {json.dumps(info)}", file=sys.stderr)
            score_model(f"adapted ({windows})", out, windows == "utterance", {})
    return {
        "settings": {
            "steps": args.steps,
            "rank": args.rank,
            "decoder_only": args.decoder_only,
            "learning_rate": args.learning_rate,
            "batch_size": args.batch_size,
            "train_on": args.train_on,
            "train_clips": len(train_pairs),
            "replay_clips": len(replay),
            "replay_weight": args.replay_weight if replay else 0.0,
            "train_audio_s": round(sum(len(p.audio) for p in train_pairs) / 16000, 1),
            "synth_s": round(synth_s, 1),
            "held_out_clips": len(held),
            "voices": list(voices),
            "general_clips": len(sets["general"][0]) if "general" in sets else 0,
        },
        "runs": runs,
        "rows": rows,
    }


def print_tables(result: dict[str, Any]) -> None:
    print(f"settings: {json.dumps(result['settings'])}")
    print()
    print("| windows | train s | s/step | final loss (last 20 %) | clips per window (frames) |")
    print("| --- | ---: | ---: | ---: | --- |")
    for r in result["runs"]:
        frames = ", ".join(f"{k}: {v}" for k, v in sorted(r["frames"].items()))
        print(
            f"| {r['windows']} | {r['train_s']} | {r['s_per_step']} | {r['final_loss']:.3f} "
            f"| {frames} |"
        )
    print()
    print("| model | served on | set | clips | WER % | term recall % | encoded s per clip |")
    print("| --- | --- | --- | ---: | ---: | ---: | ---: |")
    for r in result["rows"]:
        per_clip = r["encoded_frames"] / 100 / max(1, r["clips"])
        print(
            f"| {r['model']} | {r['served on']} | {r['set']} | {r['clips']} | {_fmt(r['wer'])} "
            f"| {_fmt(r['term_recall'])} | {per_clip:.1f} |"
        )


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.adapt_windows", description=__doc__)
    ap.add_argument("--windows", default="served,full,utterance", help="runs, comma-separated")
    ap.add_argument("--steps", type=int, default=80)
    ap.add_argument("--rank", type=int, default=8)
    ap.add_argument("--learning-rate", type=float, default=1e-3)
    ap.add_argument("--batch-size", type=int, default=4)
    ap.add_argument("--variants", type=int, default=2, help="renderings per training phrase")
    ap.add_argument(
        "--encoder-too",
        dest="decoder_only",
        action="store_false",
        help="adapters in the encoder as well (default: decoder only, encoder outputs cached)",
    )
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--voices", default="slt,rms,awb,kal16", help="flite voices held out")
    ap.add_argument("--general", type=int, default=10, help="shared clips for general WER")
    ap.add_argument("--cache", type=Path, help="where flite renderings are kept")
    ap.add_argument(
        "--train-on",
        choices=("phrases", "speakers"),
        default="phrases",
        help="phrases: the pharmacy phrases (Piper), scored on flite voices and general clips; "
        "speakers: the shared clips of speakers with 3+ clips, scored on the other speakers",
    )
    ap.add_argument(
        "--replay", type=int, default=0, help="general sentences replayed (voxgate adapt --replay)"
    )
    ap.add_argument("--replay-weight", type=float, default=3.0, help="their KL weight")
    ap.add_argument("--tiny", action="store_true", help="3 phrases, 1 sentence, 1 voice")
    ap.add_argument("--json", type=Path, help="also write the results here")
    ap.add_argument(
        "--keep",
        type=Path,
        metavar="DIR",
        help="keep each merged model as DIR/<windows> (a CTranslate2 directory the gateway can "
        "serve: asr.model=DIR/utterance) instead of a temporary directory",
    )
    args = ap.parse_args(argv)
    if args.tiny:
        args.steps, args.variants, args.general = min(args.steps, 2), 1, min(args.general, 1)
    result = run(args)
    print_tables(result)
    if args.json is not None:
        args.json.write_text(json.dumps(result, indent=2, default=float))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
