"""ASR quality/cost benchmark: WER and encoder cost of the encoder-window policy and of MBR.

Runs every clip of the shared speech set (../shared/data/speech) through ``WhisperEngine``, one
utterance per ``infer_batch`` call (on a small CPU, concurrent single calls beat batching), at
16 kHz and after a μ-law 8 kHz round trip (soxr 16k->8k, μ-law, soxr 8k->16k), plus the
hallucination set. Prints one row per configuration; every row name says its beam.

"policy beam1 (default)" is the gateway's default decoding: greedy (beam 1), the encoder-window
policy, no word timestamps, language detected.

    .venv/bin/python -m benchmarks.asr_quality                 # all 40 clips, main table
    .venv/bin/python -m benchmarks.asr_quality --default-only  # just the default configuration
    .venv/bin/python -m benchmarks.asr_quality --sweep         # also the encoder-window sweep
    .venv/bin/python -m benchmarks.asr_quality --quick         # 10 clips, for a smoke run
    .venv/bin/python -m benchmarks.asr_quality --buckets 5,10,15,20,30 --buckets 7,10,15,20,30
        # the default decoding with the default encoder windows and with each --buckets setting
        # (the default margin), side by side; also the WER of the clips short enough for the
        # setting's smallest bucket (the ones it changes)
"""

from __future__ import annotations

import argparse
import json
import time
import wave
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import soxr

from benchmarks._stats import median
from benchmarks._wer import corpus_wer, wer
from voxgate.engines.asr._whisper import WhisperEngine
from voxgate.engines.asr.base import AsrOptions, AsrRequest
from voxgate.engines.asr.config import EncoderWindowConfig, WhisperConfig
from voxgate.gateway.testing.signals import hallucination_set, mulaw_decode, mulaw_encode, stats_for

REPO = Path(__file__).resolve().parents[1]
SPEECH = REPO.parent / "shared" / "data" / "speech"

FULL = EncoderWindowConfig(buckets_s=(30.0,))
DEFAULT = EncoderWindowConfig()


@dataclass
class Row:
    name: str
    audio: str
    wer: float
    median_wer: float
    worst: str
    enc_frames: int
    encode_s: float
    total_s: float
    median_item_s: float
    window_fallbacks: int
    temp_fallbacks: int
    hallucinated_words: int


def load_clips(quick: bool) -> list[tuple[str, str, np.ndarray]]:
    rows = [json.loads(x) for x in (SPEECH / "manifest.jsonl").read_text().splitlines() if x]
    if quick:
        rows = rows[::4]
    out = []
    for r in rows:
        with wave.open(str(SPEECH / r["file"]), "rb") as w:
            pcm = np.frombuffer(w.readframes(w.getnframes()), dtype="<i2")
        out.append((r["file"], r["text"], (pcm.astype(np.float32) / 32768.0)))
    return out


def mulaw_8k(x: np.ndarray) -> np.ndarray:
    low = soxr.resample(x, 16000, 8000).astype(np.float32)
    return np.asarray(soxr.resample(mulaw_decode(mulaw_encode(low)), 8000, 16000), np.float32)


def run(
    engine: WhisperEngine,
    name: str,
    audio_name: str,
    clips: list[tuple[str, str, np.ndarray]],
    options: AsrOptions,
    halluc: bool,
) -> Row:
    engine.counters.reset()
    refs, hyps, per, times = [], [], [], []
    t_all = time.perf_counter()
    for fname, ref, x in clips:
        t0 = time.perf_counter()
        res = engine.infer_batch([AsrRequest(x, stats_for(x), options)])[0]
        times.append(time.perf_counter() - t0)
        refs.append(ref)
        hyps.append(res.text)
        per.append((wer(ref, res.text), fname))
    total = time.perf_counter() - t_all
    c = engine.counters
    row = Row(
        name,
        audio_name,
        corpus_wer(refs, hyps),
        median(w for w, _ in per),
        "{1}={0:.2f}".format(*max(per)),
        c.encoded_frames,
        c.encode_s,
        total,
        median(times),
        c.window_fallbacks,
        c.temperature_fallbacks,
        -1,
    )
    print(f"  done: {name} [{audio_name}] WER={100 * row.wer:.2f}%", flush=True)
    if halluc:
        sigs = hallucination_set()
        reqs = [AsrRequest(s.samples, stats_for(s.samples), options) for s in sigs]
        results = engine.infer_batch(reqs)
        row.hallucinated_words = sum(len(r.text.split()) for r in results)
    return row


def print_table(rows: list[Row], base: Row) -> None:
    hdr = (
        f"{'config':34s} {'audio':8s} {'WER%':>6s} {'medWER%':>7s} {'encFrames':>9s} "
        f"{'enc_s':>6s} {'enc×':>5s} {'total_s':>7s} {'tot×':>5s} {'med_item_s':>10s} "
        f"{'winFB':>5s} {'tFB':>4s} {'hallucW':>7s}  worst"
    )
    print(hdr)
    print("-" * len(hdr))
    for r in rows:
        print(
            f"{r.name:34s} {r.audio:8s} {100 * r.wer:6.2f} {100 * r.median_wer:7.2f} "
            f"{r.enc_frames:9d} {r.encode_s:6.1f} {base.encode_s / max(r.encode_s, 1e-9):5.2f} "
            f"{r.total_s:7.1f} {base.total_s / max(r.total_s, 1e-9):5.2f} {r.median_item_s:10.2f} "
            f"{r.window_fallbacks:5d} {r.temp_fallbacks:4d} "
            f"{r.hallucinated_words if r.hallucinated_words >= 0 else '-':>7}  {r.worst}"
        )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="every 4th clip only")
    ap.add_argument("--sweep", action="store_true", help="also sweep encoder-window settings")
    ap.add_argument(
        "--default-only",
        action="store_true",
        help="only the gateway's default configuration (beam 1, window policy)",
    )
    ap.add_argument("--no-mulaw", action="store_true", help="skip the μ-law 8 kHz runs")
    ap.add_argument("--beam", type=int, default=5, help="beam size of the main runs")
    ap.add_argument("--inter-threads", type=int, default=1)
    ap.add_argument("--intra-threads", type=int, default=2)
    ap.add_argument(
        "--buckets",
        action="append",
        default=[],
        type=lambda v: tuple(float(x) for x in v.split(",")),
        metavar="S,S,...",
        help="compare the default decoding on these encoder buckets (asr.encoder.buckets_s, "
        "default margin) with the default ones; repeatable",
    )
    args = ap.parse_args()

    clips = load_clips(args.quick)
    print(f"{len(clips)} clips, {sum(len(x) for *_, x in clips) / 16000:.1f} s of audio")
    engines: dict[str, WhisperEngine] = {}

    def engine(window: EncoderWindowConfig) -> WhisperEngine:
        key = window.model_dump_json()
        if key not in engines:
            cfg = WhisperConfig(
                inter_threads=args.inter_threads,
                intra_threads=args.intra_threads,
                encoder=window,
            )
            engines[key] = WhisperEngine.load(cfg)
            engines[key].warmup()
        return engines[key]

    default = AsrOptions(beam_size=1, word_timestamps=False)  # what a call gets by default
    beam = AsrOptions(beam_size=args.beam, word_timestamps=False)
    mbr = AsrOptions(beam_size=args.beam, mbr_candidates=5, word_timestamps=False)
    rows: list[Row] = []
    audios = [("16k", clips)]
    if not args.no_mulaw:
        audios.append(("mulaw8k", [(f, t, mulaw_8k(x)) for f, t, x in clips]))
    for audio_name, data in audios:
        if args.buckets:
            for window in [DEFAULT, *(EncoderWindowConfig(buckets_s=b) for b in args.buckets)]:
                name = "b" + "/".join(f"{b:g}" for b in window.buckets_s) + " beam1"
                row = run(engine(window), name, audio_name, data, default, True)
                rows.append(row)
                # The clips this setting's smallest bucket takes (and the default's does not).
                fit = window.buckets_s[0] - window.margin_ms / 1000
                short = [(t, x) for _, t, x in data if len(x) / 16000 <= fit]
                if short and window is not DEFAULT:
                    for w, tag in ((DEFAULT, "default"), (window, name)):
                        hyps = [
                            engine(w).infer_batch([AsrRequest(x, stats_for(x), default)])[0].text
                            for _, x in short
                        ]
                        short_wer = corpus_wer([t for t, _ in short], hyps)
                        print(
                            f"  short clips (<= {fit:g} s, {len(short)}) [{audio_name}] "
                            f"{tag}: WER={100 * short_wer:.2f}%",
                            flush=True,
                        )
            continue
        if args.default_only:
            rows.append(
                run(engine(DEFAULT), "policy beam1 (default)", audio_name, data, default, True)
            )
            continue
        rows.append(run(engine(FULL), f"full30s beam{args.beam}", audio_name, data, beam, True))
        rows.append(run(engine(DEFAULT), f"policy beam{args.beam}", audio_name, data, beam, True))
        rows.append(
            run(engine(DEFAULT), f"policy beam{args.beam} mbr5", audio_name, data, mbr, True)
        )
        rows.append(run(engine(DEFAULT), "policy beam1 (default)", audio_name, data, default, True))
        rows.append(
            run(engine(FULL), "full30s beam1 +words", audio_name, data, AsrOptions(), False)
        )
        rows.append(
            run(engine(DEFAULT), "policy beam1 +words", audio_name, data, AsrOptions(), False)
        )
    if args.sweep:
        sweep = {
            "b10/15/20/30 m1000": EncoderWindowConfig(margin_ms=1000),
            "b10/15/20/30 m2000 no-fallback": EncoderWindowConfig(fallback_to_full_window=False),
            "b5/10/15/20/30 m1000": EncoderWindowConfig(
                buckets_s=(5, 10, 15, 20, 30), margin_ms=1000
            ),
            "b8/10/15/20/30 m1000": EncoderWindowConfig(
                buckets_s=(8, 10, 15, 20, 30), margin_ms=1000
            ),
            "b15/20/30 m2000": EncoderWindowConfig(buckets_s=(15, 20, 30)),
            "b20/30 m2000": EncoderWindowConfig(buckets_s=(20, 30)),
        }
        for name, window in sweep.items():
            rows.append(run(engine(window), f"{name} beam{args.beam}", "16k", clips, beam, True))
    print()
    print_table(rows, rows[0])
    for e in engines.values():
        e.close()


if __name__ == "__main__":
    main()
