"""Our own Whisper decode loop vs CTranslate2 ``generate``: equality, quality, phrases, speed.

Sections (all by default; pick with flags):

* ``--equality``: on the 40 shared clips, greedy and beam 5, the loop's tokens against
  ``generate``'s: float32 loop vs ``compute_type="float32"`` and the int8 loop vs ``"int8"``
  (the engine's default). Counts identical token sequences.
* ``--quality``: WER on the 40 clips (16 kHz and μ-law 8 kHz) and words on the hallucination
  set, through ``WhisperEngine`` with each processor off and on, plus an unrelated boost list.
* ``--phrases``: sentences with domain words Whisper base gets wrong, spoken by the bundled
  Piper voice: term recall and WER without hotwords, with prompt-only hotwords, with boosts.
* ``--speed``: ms per decoder step and per utterance at batch 1, 2, 8, 16 (greedy, int8),
  interleaved with ``generate`` on the same encoder outputs.
* ``--join``: iteration-level batching in isolation, through the real batcher with one worker:
  a long utterance is submitted, a short one ``--join-after`` of the long one's solo decode time
  later; each one's latency (submission to result) with ``generate`` and batch-at-a-time
  (today's default), with the loop and batch-at-a-time, and with the loop and
  ``join_running``, interleaved, median over ``--reps`` and the clip pairs. (Not in the default
  set of sections: run it by name.)

Set ``OPENBLAS_NUM_THREADS=1`` (measured best on shared cores; the script sets it when unset).

    OPENBLAS_NUM_THREADS=1 .venv/bin/python -m benchmarks.decode_loop
    .venv/bin/python -m benchmarks.decode_loop --tiny     # seconds: the CI smoke run
"""

from __future__ import annotations

import os

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import argparse  # noqa: E402
import asyncio  # noqa: E402
import json  # noqa: E402
import time  # noqa: E402
import wave  # noqa: E402
from dataclasses import dataclass  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any  # noqa: E402

import ctranslate2  # noqa: E402
import numpy as np  # noqa: E402
import soxr  # noqa: E402

from benchmarks._stats import median  # noqa: E402
from benchmarks._wer import corpus_wer, normalize  # noqa: E402
from voxgate.engines.asr._ct2_weights import load_decoder_weights  # noqa: E402
from voxgate.engines.asr._decode import DecodeItem, DecodeLoop, WhisperDecoder  # noqa: E402
from voxgate.engines.asr._model_files import resolve_model_dir  # noqa: E402
from voxgate.engines.asr._processors import SuppressBlank, SuppressTokens  # noqa: E402
from voxgate.engines.asr._whisper import WhisperEngine  # noqa: E402
from voxgate.engines.asr.base import AsrOptions, AsrRequest, AsrResult  # noqa: E402
from voxgate.gateway.scheduling import Batcher, BatchPolicy  # noqa: E402
from voxgate.gateway.testing.signals import (  # noqa: E402
    hallucination_set,
    mulaw_decode,
    mulaw_encode,
    stats_for,
)

REPO = Path(__file__).resolve().parents[1]
SPEECH = REPO.parent / "shared" / "data" / "speech"

#: Sentences with words Whisper base does not know; (text, terms that must appear).
PHRASE_SET: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("Welcome to the voxgate test line.", ("voxgate",)),
    ("Please call voxgate support after six.", ("voxgate",)),
    ("Your ticket was assigned to Siobhan Oyelaran.", ("Siobhan", "Oyelaran")),
    ("Mister Kowalczyk will phone you tomorrow.", ("Kowalczyk",)),
    ("The parcel is with Dagny Szczepanik now.", ("Dagny", "Szczepanik")),
    ("Our router is the Zentrivo nine hundred.", ("Zentrivo",)),
    ("Ask Quorvia billing about the refund.", ("Quorvia",)),
    ("Doctor Nwachukwu is on call tonight.", ("Nwachukwu",)),
)
#: The boosted hotwords of the phrase set, in the ``phrase^boost`` syntax.
PHRASE_TERMS = tuple(sorted({t for _, terms in PHRASE_SET for t in terms}))
#: A boost list that has nothing to do with the 40 clips (must not hurt them).
UNRELATED = ("voxgate^6", "Oyelaran^6", "Kowalczyk^6", "Zentrivo^6", "Quorvia^6", "Nwachukwu^6")


def load_clips(limit: int | None) -> list[tuple[str, str, np.ndarray]]:
    rows = [json.loads(x) for x in (SPEECH / "manifest.jsonl").read_text().splitlines() if x]
    if limit is not None:
        rows = rows[:limit]
    out = []
    for r in rows:
        with wave.open(str(SPEECH / r["file"]), "rb") as w:
            pcm = np.frombuffer(w.readframes(w.getnframes()), dtype="<i2")
        out.append((r["file"], r["text"], pcm.astype(np.float32) / 32768.0))
    return out


def mulaw_8k(x: np.ndarray) -> np.ndarray:
    low = soxr.resample(x, 16000, 8000).astype(np.float32)
    return soxr.resample(mulaw_decode(mulaw_encode(low)), 8000, 16000).astype(np.float32)


# ---------------------------------------------------------------------------------- equality


class _Pair:
    """A CTranslate2 model and our loop over the same weights, both at one precision."""

    def __init__(self, compute_type: str) -> None:
        self.engine = WhisperEngine.load({"compute_type": compute_type, "intra_threads": 1})
        model_dir = resolve_model_dir("base", None)
        self.cfg = json.loads((model_dir / "config.json").read_text())
        quant = "int8" if compute_type == "int8" else "none"
        self.decoder = WhisperDecoder(load_decoder_weights(model_dir, quant))
        self.tok = self.engine._tokenizer("en", "transcribe")
        self.prompt = [*self.tok.sot_sequence, self.tok.no_timestamps]
        self.suppress = self.engine._suppress_tokens(self.tok)

    def loop(self) -> DecodeLoop:
        t = self.tok
        return DecodeLoop(
            self.decoder,
            sot=t.sot,
            eot=t.eot,
            no_timestamps=t.no_timestamps,
            no_speech=t.no_speech,
        )

    def encode(self, audio: np.ndarray, frames: int = 3000) -> Any:
        return self.engine._model.encode(
            self.engine._storage([self.engine._feature(audio, frames)])
        )

    def item(self, memory: np.ndarray, beam: int, steps: int) -> DecodeItem:
        ids: list[int] = []
        for t in self.suppress:
            ids.extend(self.cfg["suppress_ids"] if t == -1 else [t])
        procs = [SuppressTokens.of(ids), SuppressBlank(tuple(self.cfg["suppress_ids_begin"]))]
        return DecodeItem(memory, self.prompt, max_length=steps, beam_size=beam, processors=procs)

    def generate(self, enc: Any, beam: int, steps: int, n: int = 1) -> list[list[int]]:
        max_len = self.engine.max_length(len(self.prompt), steps)
        res = self.engine._model.generate(
            enc,
            [self.prompt] * n,
            beam_size=beam,
            max_length=max_len,
            suppress_blank=True,
            suppress_tokens=self.suppress,
        )
        return [r.sequences_ids[0] for r in res]


def equality(
    clips: list[tuple[str, str, np.ndarray]],
    beams: tuple[int, ...],
    precisions: tuple[str, ...] = ("float32", "int8"),
) -> int:
    """Print identical-token counts; returns how many (clip, beam, precision) differed."""
    print("\n== equality: tokens of our loop vs CTranslate2 generate (full 30 s window)")
    print(f"{'precision':10s} {'beam':>4s} {'identical':>10s} {'clips':>5s}  differing clips")
    differing = 0
    for ct in precisions:
        pair = _Pair(ct)
        pair.engine._calibrate_max_length()
        for beam in beams:
            same, diff = 0, []
            for name, _, audio in clips:
                enc = pair.encode(audio)
                ref = pair.generate(enc, beam, 224)[0]
                got = pair.loop().run([pair.item(np.array(enc)[0], beam, 224)])[0]
                if got.sequences_ids[0] == ref:
                    same += 1
                else:
                    diff.append(name)
            print(f"{ct:10s} {beam:4d} {same:10d} {len(clips):5d}  {' '.join(diff)[:120]}")
            differing += len(diff) if ct == "float32" else 0
        pair.engine.close()
    return differing


# ---------------------------------------------------------------------------------- speed


def speed(clips: list[tuple[str, str, np.ndarray]], batches: tuple[int, ...], reps: int) -> None:
    print("\n== speed: greedy, int8, 30 s window; loop vs generate on the same encoder outputs")
    pair = _Pair("int8")
    pair.engine._calibrate_max_length()
    encs = [np.array(pair.encode(a))[0] for _, _, a in clips]
    print(
        f"{'batch':>5s} {'ct2 ms/step':>11s} {'loop ms/step':>12s} {'ratio':>6s} "
        f"{'ct2 ms/utt':>10s} {'loop ms/utt':>11s} {'ratio':>6s} {'steps':>5s}"
    )
    for b in batches:
        mem = [encs[i % len(encs)] for i in range(b)]
        enc = ctranslate2.StorageView.from_array(np.ascontiguousarray(np.stack(mem)))
        ct, lp, steps = [], [], 0
        for _ in range(reps):  # interleaved
            t0 = time.perf_counter()
            pair.generate(enc, 1, 224, n=b)
            ct.append(time.perf_counter() - t0)
            loop = pair.loop()
            t0 = time.perf_counter()
            loop.run([pair.item(m, 1, 224) for m in mem])
            lp.append(time.perf_counter() - t0)
            steps = loop.steps
        c, m = median(ct), median(lp)
        print(
            f"{b:5d} {1000 * c / steps:11.1f} {1000 * m / steps:12.1f} {m / c:6.2f} "
            f"{1000 * c / b:10.0f} {1000 * m / b:11.0f} {m / c:6.2f} {steps:5d}"
        )
    pair.engine.close()


# ---------------------------------------------------------------------------------- join


async def _pair_latency(
    engine: WhisperEngine, join: bool, long_req: AsrRequest, short_req: AsrRequest, gap_s: float
) -> tuple[float, float, int]:
    """Latency of the long and the short request (short submitted ``gap_s`` later), s."""
    batcher: Batcher[AsrRequest, AsrResult] = Batcher(
        [engine], BatchPolicy(max_batch_size=8), join_running=join
    )
    loop = asyncio.get_running_loop()
    async with batcher:
        t_long = loop.time()
        first = batcher.submit(long_req)
        await asyncio.sleep(gap_s)
        t_short = loop.time()
        second = batcher.submit(short_req)
        done: dict[str, float] = {}
        first.add_done_callback(lambda _f: done.setdefault("long", loop.time()))
        second.add_done_callback(lambda _f: done.setdefault("short", loop.time()))
        await asyncio.gather(first, second)
    return done["long"] - t_long, done["short"] - t_short, batcher.stats.joined


def join_section(
    clips: list[tuple[str, str, np.ndarray]], pairs: int, reps: int, after: float, tiny: bool
) -> None:
    print(
        "\n== join: one worker; a short utterance submitted while a long one decodes "
        f"({100 * after:.0f} % into the long one's solo decode); latency = submit -> result"
    )
    ranked = sorted(clips, key=lambda c: len(c[2]))
    chosen = [(ranked[-1 - i], ranked[i]) for i in range(min(pairs, len(ranked) // 2))]
    if tiny:  # the two shortest clips, so that the smoke run takes seconds
        chosen = [(ranked[1], ranked[0])]
    engines = {"generate": _engine({}), "loop": _engine({"always": True})}
    configs = (
        ("generate, batch at a time", "generate", False),
        ("loop, batch at a time", "loop", False),
        ("loop + join_running", "loop", True),
    )
    lat: dict[str, tuple[list[float], list[float]]] = {c[0]: ([], []) for c in configs}
    joins: dict[str, int] = dict.fromkeys(lat, 0)
    for (ln, _, la), (sn, _, sa) in chosen:
        long_req = AsrRequest(la, stats_for(la), AsrOptions())
        short_req = AsrRequest(sa, stats_for(sa), AsrOptions())
        solo: dict[str, float] = {}
        for key, engine in engines.items():
            t0 = time.perf_counter()
            engine.infer_batch([long_req])
            solo[key] = time.perf_counter() - t0
        for _ in range(reps):  # interleaved
            for name, key, join in configs:
                gap = after * solo[key]
                a, b, j = asyncio.run(_pair_latency(engines[key], join, long_req, short_req, gap))
                lat[name][0].append(a)
                lat[name][1].append(b)
                joins[name] += j
        print(
            f"  pair {ln} ({len(la) / 16000:.1f} s) + {sn} ({len(sa) / 16000:.1f} s): "
            f"solo long decode generate {solo['generate']:.2f} s, loop {solo['loop']:.2f} s",
            flush=True,
        )
    print(
        f"{'config':28s} {'long p50 s':>10s} {'short p50 s':>11s} {'short max s':>11s} "
        f"{'joined':>6s} {'runs':>4s}"
    )
    for name, _, _ in configs:
        longs, shorts = lat[name]
        print(
            f"{name:28s} {median(longs):10.2f} {median(shorts):11.2f} {max(shorts):11.2f} "
            f"{joins[name]:6d} {len(shorts):4d}"
        )
    for e in engines.values():
        e.close()


# ---------------------------------------------------------------------------------- quality


@dataclass
class QRow:
    name: str
    audio: str
    wer: float
    halluc_words: int
    tail_words: int
    med_item_s: float
    loop_items: int


def _engine(loop_cfg: dict[str, Any]) -> WhisperEngine:
    e = WhisperEngine.load({"intra_threads": 1, "decode_loop": loop_cfg})
    e.warmup()
    return e


def quality_run(
    engine: WhisperEngine,
    name: str,
    audio_name: str,
    clips: list[tuple[str, str, np.ndarray]],
    options: AsrOptions,
) -> QRow:
    engine.counters.reset()
    refs, hyps, times = [], [], []
    for _, ref, x in clips:
        t0 = time.perf_counter()
        res = engine.infer_batch([AsrRequest(x, stats_for(x), options)])[0]
        times.append(time.perf_counter() - t0)
        refs.append(ref)
        hyps.append(res.text)
    sigs = hallucination_set()
    results = engine.infer_batch(
        [AsrRequest(s.samples, stats_for(s.samples), options) for s in sigs]
    )
    halluc = sum(len(r.text.split()) for r in results)
    # Trailing silence: each clip followed by 3 s of faint noise; words beyond the reference.
    rng = np.random.default_rng(7)
    tail = 0
    for _, ref, x in clips[:10]:
        pad = (rng.standard_normal(48000) * 10 ** (-65 / 20)).astype(np.float32)
        y = np.concatenate([x, pad])
        res = engine.infer_batch([AsrRequest(y, stats_for(y), options)])[0]
        tail += max(0, len(normalize(res.text).split()) - len(normalize(ref).split()))
    row = QRow(
        name,
        audio_name,
        corpus_wer(refs, hyps),
        halluc,
        tail,
        median(times),
        engine.counters.loop_items,
    )
    print(f"  done: {name} [{audio_name}] WER={100 * row.wer:.2f}%", flush=True)
    return row


def quality(clips: list[tuple[str, str, np.ndarray]], mulaw: bool) -> None:
    print("\n== quality: WER on the clips, words on the hallucination set, trailing-silence words")
    configs: list[tuple[str, dict[str, Any], AsrOptions]] = [
        ("generate (today)", {}, AsrOptions()),
        ("loop + silence end", {"silence_end": True}, AsrOptions()),
        ("loop + hallucination bias", {"hallucination_bias": 4.0}, AsrOptions()),
        ("loop + unrelated boosts", {}, AsrOptions(hotwords=UNRELATED)),
    ]
    audios = [("16k", clips)]
    if mulaw:
        audios.append(("mulaw8k", [(f, t, mulaw_8k(x)) for f, t, x in clips]))
    rows: list[QRow] = []
    for name, cfg, opts in configs:
        e = _engine(cfg)
        for audio_name, data in audios:
            rows.append(quality_run(e, name, audio_name, data, opts))
        e.close()
    print(
        f"{'config':28s} {'audio':8s} {'WER%':>6s} {'ΔWER':>6s} {'hallucW':>7s} {'tailW':>5s} "
        f"{'med_item_s':>10s} {'looped':>6s}"
    )
    base = {r.audio: r for r in rows if r.name == configs[0][0]}
    for r in rows:
        print(
            f"{r.name:28s} {r.audio:8s} {100 * r.wer:6.2f} "
            f"{100 * (r.wer - base[r.audio].wer):+6.2f} "
            f"{r.halluc_words:7d} {r.tail_words:5d} {r.med_item_s:10.2f} {r.loop_items:6d}"
        )


# ---------------------------------------------------------------------------------- phrases


def phrase_clips() -> list[tuple[str, tuple[str, ...], np.ndarray]]:
    """The phrase set spoken by the bundled Piper voice, at 16 kHz."""
    from voxgate.engines.tts import SpeakOptions, TtsConfig, VitsStreamer

    tts = VitsStreamer.load(TtsConfig())
    out = []
    for text, terms in PHRASE_SET:
        chunk = tts.synthesize_oneshot(text, SpeakOptions(noise_scale=0.0, noise_w=0.0))
        audio = soxr.resample(chunk.samples, chunk.sample_rate_hz, 16000).astype(np.float32)
        lead = np.zeros(8000, np.float32)
        out.append((text, terms, np.concatenate([lead, audio, lead])))
    return out


def phrases(boost: float, limit: int | None) -> None:
    print("\n== phrase boosting: Piper-spoken sentences with domain words")
    data = phrase_clips()[:limit]
    e = _engine({})
    variants = [
        ("no hotwords", ()),
        ("hotwords in prompt only", PHRASE_TERMS),
        (f"boosted ^{boost:g}", tuple(f"{t}^{boost:g}" for t in PHRASE_TERMS)),
    ]
    print(f"{'variant':26s} {'term recall':>11s} {'WER%':>6s}  sample")
    for name, hot in variants:
        hits = total = 0
        refs, hyps = [], []
        sample = ""
        for text, terms, audio in data:
            res = e.infer_batch([AsrRequest(audio, stats_for(audio), AsrOptions(hotwords=hot))])[0]
            refs.append(text)
            hyps.append(res.text)
            words = normalize(res.text).split()
            for t in terms:
                total += 1
                hits += normalize(t) in words
            if not sample:
                sample = res.text
        print(
            f"{name:26s} {hits:5d}/{total:<5d} {100 * corpus_wer(refs, hyps):6.2f}  {sample[:60]}"
        )
    e.close()


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--equality", action="store_true")
    ap.add_argument("--quality", action="store_true")
    ap.add_argument("--phrases", action="store_true")
    ap.add_argument("--speed", action="store_true")
    ap.add_argument("--join", action="store_true", help="iteration-level batching section")
    ap.add_argument("--join-pairs", type=int, default=3, help="clip pairs in --join")
    ap.add_argument(
        "--join-after", type=float, default=0.25, help="when the short one arrives (fraction)"
    )
    ap.add_argument("--no-mulaw", action="store_true")
    ap.add_argument("--boost", type=float, default=6.0)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument(
        "--tiny", action="store_true", help="1 clip, float32 greedy, batch 1, one rep (CI)"
    )
    args = ap.parse_args(argv)
    every = not (args.equality or args.quality or args.phrases or args.speed or args.join)
    limit = 1 if args.tiny else None
    clips = load_clips(limit)
    print(f"{len(clips)} clips; OPENBLAS_NUM_THREADS={os.environ.get('OPENBLAS_NUM_THREADS')}")
    if every or args.equality:
        beams, precisions = ((1,), ("float32",)) if args.tiny else ((1, 5), ("float32", "int8"))
        differing = equality(clips, beams, precisions)
        if differing:
            raise SystemExit(f"{differing} float32 decodes differ from generate")
    if every or args.speed:
        speed(clips[:16], (1,) if args.tiny else (1, 2, 8, 16), 1 if args.tiny else args.reps)
    if args.join:
        all_clips = clips if not args.tiny else load_clips(None)
        pairs = 1 if args.tiny else args.join_pairs
        join_section(all_clips, pairs, 1 if args.tiny else args.reps, args.join_after, args.tiny)
    if every or args.phrases:
        phrases(args.boost, 1 if args.tiny else None)
    if (every and not args.tiny) or args.quality:
        quality(clips, not args.no_mulaw)


if __name__ == "__main__":
    main()
