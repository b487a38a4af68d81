"""The reply's cheap first unit: what cutting the first sentence after a few words buys and costs.

Run (alone on the machine)::

    .venv/bin/python -m benchmarks.tts_first_unit                 # k = 2, 3, 4 words
    .venv/bin/python -m benchmarks.tts_first_unit --tiny          # seconds; what the test runs

For every sentence of ``benchmarks/tts_concurrency.py`` that has no clause cut in its first
40 characters (the existing first-clause split already makes those cheap), the first sentence
is cut after ``k`` words (``TtsConfig.first_unit_words``), in three ways:

- ``whole``: not cut (today's default): the first audio waits for the whole sentence's front
  end;
- ``naive``: the first ``k`` words are a unit of their own and so is the rest (each its own
  front end, as a sentence of its own);
- ``lookahead L``: the streamer's cut: the first unit's front end reads ``L`` words more than
  it speaks, and the rest is spoken from the whole sentence's front end (``TextUnit.lead``).

Noise off (deterministic), so the cut version can be compared sample by sample with the
whole sentence. Per method, medians over the sentences:

- first-unit front end ms and first audio ms (front end + first decoder window, the streamer
  called directly, interleaved with the other methods);
- ``dur ms``: how far the cut moves the words after it (the cut point's time in the cut
  version minus in the whole sentence; the duration predictor's doing);
- ``last word ms``: the duration predictor's output near the cut: the last spoken word's
  length in the first unit minus in the whole sentence (phrase-final lengthening shows here);
- ``pause ms``: silence added at the join (frames below -50 dBFS there, minus the whole
  sentence's at the same word boundary);
- ``mel dB``: how different the first unit sounds from the same words inside the whole
  sentence: the mean absolute log-mel difference (40 bands, dB) along a time-warped (DTW)
  alignment of the two, so that a few milliseconds of duration change alone cost little;
  0 is the same audio. For scale, the ``noise on`` row: the same words, uncut, with the
  voice's own sampling noise (what the gateway speaks by default) against noise off: how
  much two renditions of the words differ anyway.

The rest of the sentence is the whole sentence's own audio from the cut on (``lookahead``;
``tests/test_tts_stream.py`` checks it to 60 dB), so the difference is all before the join.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks._stats import median, percentile  # noqa: E402
from benchmarks.tts_concurrency import SENTENCES  # noqa: E402
from voxgate.engines.base import FloatArray  # noqa: E402
from voxgate.engines.tts import SpeakOptions, TtsConfig, VitsStreamer  # noqa: E402
from voxgate.engines.tts._text import TextUnit, TextWord, prepare_text  # noqa: E402
from voxgate.engines.tts._voice import phonemize_unit  # noqa: E402

QUIET = SpeakOptions(noise_scale=0.0, noise_w=0.0)


@dataclass
class Cut:
    """One sentence cut one way: its units, and the measured figures."""

    front_ms: float
    first_ms: float
    shift_ms: float
    last_word_ms: float
    pause_ms: float
    mel_db: float


def log_mel(audio: FloatArray, rate: int, bands: int = 40) -> FloatArray:
    """Log-mel spectrogram (dB), 1024-sample frames every 256 samples."""
    n, hop = 1024, 256
    if len(audio) < n:
        audio = np.pad(audio, (0, n - len(audio)))
    frames = np.lib.stride_tricks.sliding_window_view(audio, n)[::hop] * np.hanning(n)
    power = np.abs(np.fft.rfft(frames, axis=1)) ** 2
    mel = lambda f: 2595 * np.log10(1 + f / 700)  # noqa: E731
    edges = 700 * (10 ** (np.linspace(mel(60.0), mel(rate / 2 - 1000), bands + 2) / 2595) - 1)
    freqs = np.fft.rfftfreq(n, 1 / rate)
    bank = np.zeros((bands, len(freqs)))
    for b in range(bands):
        lo, mid, hi = edges[b], edges[b + 1], edges[b + 2]
        bank[b] = np.clip(np.minimum((freqs - lo) / (mid - lo), (hi - freqs) / (hi - mid)), 0, 1)
    out: FloatArray = (10 * np.log10(np.maximum(power @ bank.T, 1e-10))).astype(np.float32)
    return out


def dtw_mel_db(a: FloatArray, b: FloatArray, rate: int) -> float:
    """Mean |log-mel difference| (dB) along the best monotonic alignment of ``a`` and ``b``."""
    x, y = log_mel(a, rate), log_mel(b, rate)
    cost = np.mean(np.abs(x[:, None, :] - y[None, :, :]), axis=2)
    acc = np.full((len(x) + 1, len(y) + 1), np.inf)
    steps = np.zeros_like(acc)
    acc[0, 0] = 0.0
    for i in range(1, len(x) + 1):
        for j in range(1, len(y) + 1):
            best = min((acc[i - 1, j - 1], 0), (acc[i - 1, j], 1), (acc[i, j - 1], 2))
            prev = (i - 1, j - 1) if best[1] == 0 else (i - 1, j) if best[1] == 1 else (i, j - 1)
            acc[i, j] = best[0] + cost[i - 1, j - 1]
            steps[i, j] = steps[prev] + 1
    return float(acc[-1, -1] / steps[-1, -1])


def quiet_frames(audio: FloatArray, hop: int, around: int, span: int = 12) -> int:
    """Frames below -50 dBFS within ``span`` frames either side of sample ``around``."""
    frame = around // hop
    lo, hi = max(0, frame - span), frame + span
    n = 0
    for f in range(lo, hi):
        piece = audio[f * hop : (f + 1) * hop]
        if len(piece) and 20 * np.log10(float(np.sqrt(np.mean(piece**2))) + 1e-12) < -50:
            n += 1
    return n


class Bench:
    def __init__(self) -> None:
        self.streamer = VitsStreamer.load(TtsConfig(cache_bytes=0, first_unit_max_chars=0))
        self.streamer.warmup()
        self.hop = self.streamer.hop_length
        self.rate = self.streamer.sample_rate_hz

    def run_unit(
        self, unit: TextUnit, options: SpeakOptions = QUIET
    ) -> tuple[FloatArray, list[tuple[int, int]], float, float]:
        """Front end + every window of one unit through a job: audio, word spans (samples,
        from the spoken start), front-end ms, first audio ms (front end + first window)."""
        s = self.streamer
        job = s.open("x", options)  # a job for its settings; its units are replaced
        job._units = [unit]
        t0 = time.perf_counter()
        job.run_front_end()
        front = time.perf_counter() - t0
        chunks = []
        first = 0.0
        while not job.planned_all:
            plan = job.plan(job.scheduled_frames())
            (audio,) = s.decode_windows([(job, plan)])
            chunks.append(job.finish_window(plan, audio))
            if len(chunks) == 1:
                first = time.perf_counter() - t0
        audio = np.concatenate([c.samples for c in chunks])
        spans = [
            (round(w.start_ms * self.rate / 1000), round(w.end_ms * self.rate / 1000))
            for c in chunks
            for w in c.words
        ]
        return audio, spans, 1000 * front, 1000 * first

    def durations(self, unit: TextUnit) -> list[tuple[int, int]]:
        """Word spans in frames over every word the unit's front end reads."""
        s = self.streamer
        ph = phonemize_unit(unit, s._voice)
        _, _, durations = s._run_front_end(ph, s._resolve(QUIET))
        return [
            (a // self.hop, b // self.hop) for a, b in ph.word_sample_spans(durations, self.hop)
        ]

    def measure(
        self,
        words: tuple[TextWord, ...],
        k: int,
        method: str,
        ref: tuple[FloatArray, list[tuple[int, int]], float, float],
    ) -> Cut:
        """``method``'s figures for ``words`` cut after ``k``; ``ref``: the whole sentence run."""
        whole = TextUnit(words)
        ref_audio, ref_spans, ref_front, ref_first = ref
        # The cut point: where word k starts (the pause before it stays with word k - 1).
        ref_cut = ref_spans[k][0]
        ref_pause = quiet_frames(ref_audio, self.hop, ref_cut)
        if method == "whole":
            return Cut(ref_front, ref_first, 0.0, 0.0, 0.0, 0.0)
        if method == "noise on":
            audio, spans, front, first = self.run_unit(whole, SpeakOptions())
            return Cut(
                front_ms=front,
                first_ms=first,
                shift_ms=1000 * (spans[k][0] - ref_cut) / self.rate,
                last_word_ms=1000
                * (
                    (spans[k - 1][1] - spans[k - 1][0])
                    - (ref_spans[k - 1][1] - ref_spans[k - 1][0])
                )
                / self.rate,
                pause_ms=0.0,
                mel_db=dtw_mel_db(ref_audio[:ref_cut], audio[: spans[k][0]], self.rate),
            )
        if method == "naive":
            head, rest = TextUnit(words[:k]), TextUnit(words[k:])
        else:
            look = int(method.split()[1])
            head, rest = (
                TextUnit(words[:k], tail=words[k : k + look]),
                TextUnit(words[k:], lead=words[:k]),
            )
        a, a_spans, front, first = self.run_unit(head)
        b, _, _, _ = self.run_unit(rest)
        cut_audio = np.concatenate([a, b])
        join = len(a)
        # The last spoken word's length, cut vs whole (the duration predictor near the cut).
        head_spans = self.durations(head)
        whole_spans = self.durations(whole)
        last_word = (head_spans[k - 1][1] - head_spans[k - 1][0]) - (
            whole_spans[k - 1][1] - whole_spans[k - 1][0]
        )
        return Cut(
            front_ms=front,
            first_ms=first,
            shift_ms=1000 * (join - ref_cut) / self.rate,
            last_word_ms=1000 * last_word * self.hop / self.rate,
            pause_ms=1000
            * (quiet_frames(cut_audio, self.hop, join) - ref_pause)
            * self.hop
            / self.rate,
            mel_db=dtw_mel_db(ref_audio[:ref_cut], a, self.rate),
        )


def eligible_sentences(limit: int) -> list[tuple[TextWord, ...]]:
    """The benchmark sentences that the first-clause split leaves whole (no early comma)."""
    out = []
    for text in SENTENCES:
        units = prepare_text(text, max_chars=1000, max_unit_chars=300, first_unit_max_chars=40)
        if len(units) == 1 and len(units[0].words) >= 6:
            out.append(units[0].words)
    return out[:limit]


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--ks", type=lambda s: tuple(int(x) for x in s.split(",")), default=(2, 3, 4)
    )
    parser.add_argument("--lookaheads", default="1,2,3")
    parser.add_argument("--sentences", type=int, default=99)
    parser.add_argument("--repeats", type=int, default=3, help="timing runs per sentence")
    parser.add_argument("--tiny", action="store_true", help="k = 3, two sentences, one run")
    parser.add_argument("--json", type=Path, default=None, help="write the rows here")
    args = parser.parse_args(argv)
    if args.tiny:
        args.ks, args.lookaheads, args.sentences, args.repeats = (3,), "2", 2, 1
    bench = Bench()
    methods = [
        "whole",
        "noise on",
        "naive",
        *(f"lookahead {x}" for x in args.lookaheads.split(",")),
    ]
    sentences = eligible_sentences(args.sentences)
    print(f"{len(sentences)} sentences with no clause cut in their first 40 characters; noise off")
    header = (
        f"{'k':>2} {'method':<12}{'front ms':>9}{'first med':>10}{'first p95':>10}"
        f"{'dur ms':>8}{'last word ms':>13}{'pause ms':>9}{'mel dB':>8}"
    )
    print(header)
    print("-" * len(header))
    rows: dict[str, dict[str, float]] = {}
    for k in args.ks:
        cuts: dict[str, list[Cut]] = {m: [] for m in methods}
        for words in sentences:
            for _ in range(args.repeats):
                ref = bench.run_unit(TextUnit(words))
                for method in methods:  # interleaved: the machine is shared
                    cuts[method].append(bench.measure(words, k, method, ref))
        for method in methods:
            c = cuts[method]
            row = {
                "front_ms": median(x.front_ms for x in c),
                "first_med_ms": median(x.first_ms for x in c),
                "first_p95_ms": percentile([x.first_ms for x in c], 95),
                "shift_ms": median(abs(x.shift_ms) for x in c),
                "last_word_ms": median(x.last_word_ms for x in c),
                "pause_ms": median(x.pause_ms for x in c),
                "mel_db": median(x.mel_db for x in c),
                "mel_max_db": max(x.mel_db for x in c),
            }
            rows[f"{k}/{method}"] = row
            print(
                f"{k:>2} {method:<12}{row['front_ms']:>9.1f}{row['first_med_ms']:>10.1f}"
                f"{row['first_p95_ms']:>10.1f}{row['shift_ms']:>8.1f}{row['last_word_ms']:>13.1f}"
                f"{row['pause_ms']:>9.1f}{row['mel_db']:>8.2f}",
                flush=True,
            )
    print(
        "dur ms: |shift of the words after the cut|, median; last word ms: its length cut minus "
        "whole, median; pause ms: silence added at the join, median; mel dB: the first unit "
        "vs the same words in the whole sentence (time-warped), median"
    )
    bench.streamer.close()
    if args.json is not None:
        args.json.write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
