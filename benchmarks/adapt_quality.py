"""Domain adaptation, base vs adapted side by side: domain-term recall, WER, model size, speed.

The domain is the pharmacy example (examples/adapt/: 20 drug brand names, 50 training
phrases). The held-out audio is benchmarks/data/adapt_heldout.txt: 40 *other* sentences with the
same terms, spoken by the Debian ``flite`` voices (slt, rms, awb, kal16), which the training never
hears (it hears only the bundled Piper voice). No recordings of real people saying these names
exist here, so this measures adaptation to the vocabulary across synthetic voices, not to real
callers. Held-out voices are scored at 16 kHz and after a mu-law 8 kHz round trip (a call).

General speech: the 40 shared clips (../shared/data/speech) at 16 kHz, as benchmarks/asr_quality.

Both models run in one process on the same engine settings (the gateway's defaults: encoder
buckets, greedy, English), clip by clip, the order alternating per clip, so the machine's load
falls on both alike; latency is the wall time of one ``infer_batch`` per clip.

    .venv/bin/python -m benchmarks.adapt_quality --model MODELS/pharmacy   # an adapted model
    .venv/bin/python -m benchmarks.adapt_quality --train --steps 120       # voxgate adapt first
    .venv/bin/python -m benchmarks.adapt_quality --model DIR --sets general  # one part of a run
    .venv/bin/python -m benchmarks.adapt_quality --tiny --model DIR        # smoke run

The full run decodes 720 clips (about 8 minutes on 2 cores); ``--sets`` splits it in parts.

``voxgate adapt --replay-audio`` holds the model to the base on recordings of real speech; the
only real speech here is the 40 clips, so they are split into two halves with no speaker in both
(``--write-half H PATH`` writes half H as an audio-only manifest), a model is held on one half
and scored on the other (``--sets general --general-half 1-H``), and the two halves' edits add
up to a WER over all 40 clips in which no clip was scored by a model that heard it.
"""

from __future__ import annotations

import argparse
import json
import math
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import soxr

from benchmarks._stats import median, percentile
from voxgate.adapt.data import Pair, load_pairs, read_audio, read_phrases
from voxgate.adapt.evaluate import Scores, load_engine, score, transcribe
from voxgate.common.pcm import MULAW_DECODE, MULAW_ENCODE, float_to_pcm16, pcm16_to_float
from voxgate.engines.asr import WhisperEngine
from voxgate.engines.asr._model_files import resolve_model_dir

REPO = Path(__file__).resolve().parents[1]
SPEECH = REPO.parent / "shared" / "data" / "speech"
EXAMPLE = REPO / "examples" / "adapt"
HELDOUT = REPO / "benchmarks" / "data" / "adapt_heldout.txt"
VOICES = ("slt", "rms", "awb", "kal16")


def flite_cache() -> Path:
    """Where flite renderings are kept between runs (both adapt benchmarks share them)."""
    return Path(tempfile.gettempdir()) / "voxgate-adapt-flite"


@dataclass
class Row:
    set: str
    model: str
    clips: int
    words: int
    wer: float
    terms_said: int
    term_recall: float
    median_s: float
    p95_s: float


def flite_pairs(sentences: list[str], voices: tuple[str, ...], cache: Path) -> list[Pair]:
    """Speak each sentence with each flite voice (cached by voice and line number)."""
    flite = shutil.which("flite")
    if flite is None:
        sys.exit("flite not found: apt-get install -y flite (the held-out voices)")
    cache.mkdir(parents=True, exist_ok=True)
    out = []
    for voice in voices:
        for i, text in enumerate(sentences, start=1):
            wav = cache / f"{voice}-{i:03d}.wav"
            if not wav.exists():
                tmp = wav.with_suffix(".part.wav")
                subprocess.run([flite, "-voice", voice, "-t", text, "-o", str(tmp)], check=True)
                tmp.rename(wav)
            out.append(Pair(read_audio(wav), text, f"{voice}:{i}"))
    return out


def mulaw_8k(x: np.ndarray) -> np.ndarray:
    """16 kHz -> 8 kHz -> G.711 mu-law -> 16 kHz: what the gateway hears from a phone call."""
    low = soxr.resample(x, 16000, 8000).astype(np.float32)
    pcm = float_to_pcm16(np.clip(low, -1, 1).astype(np.float32)).astype(np.int64)
    back = pcm16_to_float(MULAW_DECODE[MULAW_ENCODE[pcm + 32768]])
    return soxr.resample(back, 8000, 16000).astype(np.float32)


def general_pairs(quick: int, half: int | None = None) -> list[Pair]:
    """The 40 shared clips (every n-th with ``quick``), or one of :func:`general_halves`."""
    manifest = SPEECH / "manifest.jsonl"
    if not manifest.is_file():
        sys.exit(f"shared speech set not found at {SPEECH}")
    pairs = load_pairs(manifest)
    if half is not None:
        keep = set(general_halves()[half])
        files = [json.loads(line)["file"] for line in manifest.read_text().splitlines() if line]
        pairs = [p for p, f in zip(pairs, files, strict=True) if f in keep]
    return pairs[:: max(1, len(pairs) // quick)][:quick] if quick else pairs


def _speaker(file: str) -> str:
    """Who speaks a shared clip, as far as its name says (LibriSpeech: the reader's id)."""
    if file.startswith("librispeech_"):
        return file.split("-", 1)[0]
    if file.startswith(("ljspeech_", "librivox_")):  # one reader each
        return file.split("_", 1)[0]
    return file


def general_halves() -> tuple[list[str], list[str]]:
    """The 40 shared clips in two halves with no speaker in both, about equal in words.

    For ``--replay-audio``: a model held to the base on one half's recordings is scored on the
    other half, so no clip is scored by a model that heard it (or its speaker). Deterministic:
    speakers by falling word count, each to the half with fewer words so far.
    """
    rows = [json.loads(line) for line in (SPEECH / "manifest.jsonl").read_text().splitlines()]
    by_speaker: dict[str, list[dict[str, str]]] = {}
    for r in rows:
        by_speaker.setdefault(_speaker(r["file"]), []).append(r)
    halves: tuple[list[str], list[str]] = ([], [])
    words = [0, 0]
    # Stable sort: speakers with equal word counts keep the manifest's order.
    for _, clips in sorted(
        by_speaker.items(), key=lambda kv: -sum(len(r["text"].split()) for r in kv[1])
    ):
        side = 0 if words[0] <= words[1] else 1
        halves[side].extend(r["file"] for r in clips)
        words[side] += sum(len(r["text"].split()) for r in clips)
    return halves


def write_half(half: int, path: Path) -> None:
    """Write one half's clips as an audio-only manifest (the input of ``--replay-audio``)."""
    with path.open("w") as f:
        for file in general_halves()[half]:
            f.write(json.dumps({"audio": str(SPEECH / file)}) + "\n")


def side_by_side(
    engines: dict[str, WhisperEngine], pairs: list[Pair], terms: list[str]
) -> dict[str, Scores]:
    """Transcribe every clip with every model, alternating which goes first per clip."""
    names = list(engines)
    texts: dict[str, list[str]] = {n: [] for n in names}
    secs: dict[str, list[float]] = {n: [] for n in names}
    for k, pair in enumerate(pairs):
        for name in names if k % 2 == 0 else names[::-1]:
            text, s = transcribe(engines[name], pair.audio)
            texts[name].append(text)
            secs[name].append(s)
    return {n: score(pairs, texts[n], terms=terms, seconds=secs[n]) for n in names}


def row(set_name: str, model: str, s: Scores) -> Row:
    times = [i.seconds for i in s.per_item]
    return Row(
        set_name,
        model,
        len(s.per_item),
        s.n_words,
        s.wer,
        s.n_terms,
        s.term_recall,
        median(times),
        percentile(times, 95),
    )


def train(args: argparse.Namespace, models_dir: Path) -> tuple[Path, float]:
    """Run ``voxgate adapt`` on the example; (model directory, wall seconds)."""
    cmd = [
        sys.executable,
        "-m",
        "voxgate.cli",
        "adapt",
        "--phrases",
        str(EXAMPLE / "phrases.txt"),
        "--terms",
        str(EXAMPLE / "terms.txt"),
        "--name",
        "pharmacy",
        "--models-dir",
        str(models_dir),
        "--steps",
        str(args.steps),
        "--seed",
        str(args.seed),
        "--threads",
        str(args.threads),
        "--no-evaluate",
        "--progress",
        "json",
        *args.adapt_arg,
    ]
    print("training:", " ".join(cmd[2:]), flush=True)
    t0 = time.perf_counter()
    subprocess.run(cmd, check=True, cwd=REPO)
    return models_dir / "pharmacy", time.perf_counter() - t0


def model_bytes(path: Path) -> int:
    return (path / "model.bin").stat().st_size


def print_tables(rows: list[Row], sizes: dict[str, int], train_s: float | None) -> None:
    hdr = (
        f"{'set':22s} {'model':8s} {'clips':>5s} {'words':>5s} {'WER%':>6s} {'terms':>5s} "
        f"{'recall%':>7s} {'med_s':>6s} {'p95_s':>6s}"
    )
    print(hdr)
    print("-" * len(hdr))
    for r in rows:
        rec = "-" if math.isnan(r.term_recall) else f"{100 * r.term_recall:.1f}"
        print(
            f"{r.set:22s} {r.model:8s} {r.clips:5d} {r.words:5d} {100 * r.wer:6.2f} "
            f"{r.terms_said:5d} {rec:>7s} {r.median_s:6.3f} {r.p95_s:6.3f}"
        )
    print()
    by = {(r.set, r.model): r for r in rows}
    for set_name in dict.fromkeys(r.set for r in rows):
        b, a = by.get((set_name, "base")), by.get((set_name, "adapted"))
        if b is None or a is None:
            continue
        rec = ""
        if not math.isnan(b.term_recall):
            rec = f"term recall {100 * b.term_recall:.1f} -> {100 * a.term_recall:.1f} %, "
        print(
            f"{set_name}: {rec}WER {100 * b.wer:.2f} -> {100 * a.wer:.2f} % "
            f"({100 * (a.wer - b.wer):+.2f} points); latency adapted/base median "
            f"{a.median_s / b.median_s:.3f}x, p95 {a.p95_s / b.p95_s:.3f}x"
        )
    print(
        "model.bin: "
        + ", ".join(f"{k} {v / 1e6:.1f} MB" for k, v in sizes.items())
        + (f"; training {train_s:.0f} s" if train_s is not None else "")
    )


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--model", type=Path, help="an adapted CTranslate2 model directory")
    ap.add_argument("--train", action="store_true", help="run voxgate adapt on the example first")
    ap.add_argument("--steps", type=int, default=120, help="training steps with --train")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=2, help="training threads with --train")
    ap.add_argument(
        "--adapt-arg", action="append", default=[], help="extra voxgate adapt flag (repeat)"
    )
    ap.add_argument("--voices", default=",".join(VOICES), help="flite voices for held-out audio")
    ap.add_argument(
        "--sets",
        default="held16k,heldmulaw,general",
        help="which sets to run, comma-separated: held16k (held-out voices at 16 kHz), heldmulaw "
        "(the same after mu-law 8 kHz), general (the 40 shared clips); split a long run in parts",
    )
    ap.add_argument(
        "--general-half",
        type=int,
        choices=(0, 1),
        help="score general speech on one half of the 40 clips (speakers disjoint; see "
        "--write-half)",
    )
    ap.add_argument(
        "--write-half",
        nargs=2,
        metavar=("HALF", "PATH"),
        help="write half 0 or 1 of the 40 clips as an audio-only manifest for voxgate adapt "
        "--replay-audio, and exit",
    )
    ap.add_argument("--tiny", action="store_true", help="3 sentences, 1 voice, 2 general clips")
    ap.add_argument("--json", type=Path, help="also write the rows here")
    ap.add_argument("--cache", type=Path, help="where flite renderings are kept")
    ap.add_argument(
        "--models-dir", type=Path, help="with --train: keep the model here (default: discarded)"
    )
    args = ap.parse_args(argv)
    if args.write_half is not None:
        if args.write_half[0] not in ("0", "1"):
            ap.error("--write-half: the half is 0 or 1")
        write_half(int(args.write_half[0]), Path(args.write_half[1]))
        return
    if args.train == (args.model is not None):
        ap.error("give exactly one of --model DIR or --train")

    terms = read_phrases(EXAMPLE / "terms.txt")
    sentences = read_phrases(HELDOUT)
    voices = tuple(v for v in args.voices.split(",") if v)
    if args.tiny:
        sentences, voices = sentences[:3], voices[:1]
    work = Path(tempfile.mkdtemp(prefix="adapt-bench-"))
    train_s: float | None = None
    try:
        model = args.model
        if args.train:
            model, train_s = train(args, args.models_dir or work / "models")
        elif (args.model / "voxgate-model.json").is_file():
            meta = json.loads((args.model / "voxgate-model.json").read_text())
            train_s = meta.get("training", {}).get("train_seconds")
        cache = args.cache or flite_cache()
        wanted = {x for x in args.sets.split(",") if x}
        unknown = wanted - {"held16k", "heldmulaw", "general"}
        if unknown:
            ap.error(f"unknown --sets {sorted(unknown)}")
        held = flite_pairs(sentences, voices, cache) if wanted - {"general"} else []
        sets: list[tuple[str, list[Pair], list[str]]] = []
        if "held16k" in wanted:
            sets.append(("held-out voices 16k", held, terms))
        if "heldmulaw" in wanted:
            phone = [Pair(mulaw_8k(p.audio), p.text, p.origin) for p in held]
            sets.append(("held-out voices mulaw", phone, terms))
        if "general" in wanted:
            half = args.general_half
            label = "general 16k" if half is None else f"general 16k, half {half}"
            sets.append((label, general_pairs(2 if args.tiny else 0, half), []))
        print(
            f"held-out: {len(sentences)} sentences x {len(voices)} voices; terms: {len(terms)}; "
            f"model: {model}",
            flush=True,
        )
        engines = {"base": load_engine("base"), "adapted": load_engine(model)}
        rows = []
        try:
            for name, pairs, set_terms in sets:
                t0 = time.perf_counter()
                scores = side_by_side(engines, pairs, set_terms)
                for m, s in scores.items():
                    rows.append(row(name, m, s))
                print(f"  done: {name} ({time.perf_counter() - t0:.0f} s)", flush=True)
        finally:
            for e in engines.values():
                e.close()
        print()
        sizes = {"base": model_bytes(resolve_model_dir("base")), "adapted": model_bytes(model)}
        print_tables(rows, sizes, train_s)
        if args.json:
            args.json.write_text(
                json.dumps(
                    {"rows": [asdict(r) for r in rows], "model_bytes": sizes, "train_s": train_s},
                    indent=1,
                )
            )
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
