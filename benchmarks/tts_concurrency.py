"""Many replies at once: the deadline scheduler vs the FIFO pool vs piper, side by side.

Run (alone on the machine: other benchmarks would share its cores)::

    .venv/bin/python -m benchmarks.tts_concurrency --rtf --batch-gain
    .venv/bin/python -m benchmarks.tts_concurrency --ns 1,2,4,8 --repeats 2 --no-bisect
    .venv/bin/python -m benchmarks.tts_concurrency --previous --kinds 4 --ns 1,4,8 --max-n 16
    .venv/bin/python -m benchmarks.tts_concurrency --tiny        # seconds; what the test runs

For N concurrent replies (N = 1, 2, 4, 8, 12, 16; starts ``--stagger-ms`` apart, as calls
arrive; distinct texts so nothing is a cache hit) of a one-sentence and of a four-sentence
text, each method synthesises every reply and we record per stream, with a player that starts
at the first chunk and then plays in real time:

- first audio: from the request to the first chunk in hand;
- late chunks: chunks that arrive after the player needs them, and starvation (ms of silence
  inside the reply);
- RTF: wall time to the last chunk / audio duration.

Methods, all in this one process and in rotating order per probe (the machine is shared):

- ``deadline``: the gateway's synthesis path (``voxgate.gateway.runtime.TtsSynthesizer``) with the
  deadline scheduler, its default workers and batch size for this device;
- ``fifo``: the earlier plain thread pool (``benchmarks/_fifo_pool.py``; production code runs
  the scheduler only since v0.3) (min(4,
  cores) threads) advancing each reply's fixed-schedule generator, on a voice with the
  earlier 28 frames of context (the gateway as it was);
- ``piper``: piper's own ``PiperVoice.synthesize`` per reply, in a thread per call (what a
  gateway without a streamer would do);
- ``deadline-prev`` (``--previous``): the deadline scheduler with the policy as it was before
  the rules for many replies at once (see :func:`previous_policy`);
- ``deadline-cutK`` (``--first-unit-words K``): the deadline scheduler on a voice that cuts
  each reply's first sentence after K words (``TtsConfig.first_unit_words``).

``--kinds 1``, ``--kinds 4`` run one reply length only.

Then, unless ``--no-bisect``, the largest N with **zero** late chunks over ``--repeats``
probes of the four-sentence text, per method, by doubling then bisection (the methods'
searches interleaved step by step). ``--rtf`` adds the single-stream RTF (wall and CPU) of
the streamer before (fixed windows) and after (the scheduler's windows), and
``--batch-gain`` the decoder's batched-call speed-up on this device (what sets the batch size
per device). Each probe line also says how many cores other processes used meanwhile.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import statistics
import sys
import time
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, TypeVar

import numpy as np

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks._fifo_pool import FifoSynthesizer  # noqa: E402
from benchmarks._stats import median, percentile  # noqa: E402
from voxgate.engines.tts import SpeakOptions, TtsConfig, VitsStreamer, WindowPlan  # noqa: E402
from voxgate.engines.tts._session import make_session  # noqa: E402
from voxgate.engines.tts._voice import resolve_voice  # noqa: E402
from voxgate.gateway.events import SpeakIn  # noqa: E402
from voxgate.gateway.metrics import GatewayMetrics  # noqa: E402
from voxgate.gateway.runtime import TtsSynthesizer  # noqa: E402
from voxgate.gateway.scheduling.synthesis_policy import SynthPolicy  # noqa: E402

T = TypeVar("T")
NS = (1, 2, 4, 8, 12, 16)
# Distinct sentences (no phrase-cache hits across replies); reply i uses rotations of them.
SENTENCES = (
    "Sure, I can help you with that right away.",
    "Thanks for calling, your order has shipped.",
    "It should arrive on Tuesday, March 3rd.",
    "The total came to $42.50, including tax.",
    "Is there anything else I can help you with?",
    "Your appointment is confirmed for nine thirty tomorrow.",
    "Please hold while I look up your account.",
    "I have sent a confirmation to your email address.",
    "The technician will call you an hour before arriving.",
    "Your balance is due on the fifteenth of the month.",
    "We are open from eight until six on weekdays.",
    "I can transfer you to billing if you like.",
    "That item is back in stock at the downtown store.",
    "Your refund should show up within five days.",
    "Let me repeat that back to make sure I have it right.",
    "Thank you for your patience while I check.",
    "The next available slot is Friday afternoon.",
)
KINDS = ("1 sentence", "4 sentences")


def reply_text(kind: str, index: int, probe: int) -> str:
    """A text of ``kind`` for reply ``index``, different for every reply of a probe."""
    n = 1 if kind == "1 sentence" else 4
    start = (index * n + probe * 7) % len(SENTENCES)
    picked = [SENTENCES[(start + k) % len(SENTENCES)] for k in range(n)]
    # A number makes every reply's text unique even when the rotation repeats.
    return " ".join(picked) + f" Reference {index + 1 + 20 * probe}."


def player_waits(arrivals: Sequence[tuple[float, int]], rate: int) -> list[float]:
    """How long the player waited for each chunk, s (0 for one on time).

    Playback starts when the first chunk arrives; a chunk is late when it arrives after the
    audio before it has played out, and the player then waits for it and resumes from its
    arrival.
    """
    first = arrivals[0][0]
    waits, played, clock = [], 0, first
    for t, n in arrivals:
        # The player needs this chunk when the audio before it has played out.
        need = max(first + played / rate, clock)
        late = t > need + 1e-4
        waits.append(t - need if late else 0.0)
        clock = (t if late else need) + n / rate
        played += n
    return waits


def play(arrivals: Sequence[tuple[float, int]], rate: int) -> tuple[int, float, int]:
    """The player every TTS benchmark counts underruns with: (late chunks, starved s, samples).

    See :func:`player_waits` for the player.
    """
    waits = player_waits(arrivals, rate)
    late = [w for w in waits if w > 0.0]
    return len(late), sum(late), sum(n for _, n in arrivals)


@dataclass
class Stream:
    """Chunk arrivals of one reply: (seconds since its request, samples)."""

    arrivals: list[tuple[float, int]] = field(default_factory=list)

    def summary(self, rate: int) -> dict[str, float]:
        """First audio, late chunks, starvation and RTF for a player started at chunk one."""
        first = self.arrivals[0][0]
        late, starve, played = play(self.arrivals, rate)
        audio = played / rate
        return {
            "first_ms": 1000 * first,
            "late": late,
            "starve_ms": 1000 * starve,
            "rtf": self.arrivals[-1][0] / audio if audio else 0.0,
        }


class OtherCpu:
    """Cores used by other processes between start and stop (/proc/stat minus this process)."""

    def __init__(self) -> None:
        self._t0 = 0.0
        self._busy0 = 0.0
        self._self0 = 0.0

    @staticmethod
    def _busy() -> float:
        from voxgate.gateway.neighbours import proc_busy_s  # noqa: PLC0415

        return proc_busy_s() or 0.0

    def start(self) -> None:
        self._t0, self._busy0, self._self0 = time.monotonic(), self._busy(), _own_cpu()

    def stop(self) -> float:
        wall = max(1e-6, time.monotonic() - self._t0)
        others = (self._busy() - self._busy0) - (_own_cpu() - self._self0)
        return max(0.0, others / wall)


def _own_cpu() -> float:
    t = os.times()
    return t.user + t.system


async def run_synthesizer(
    synth: TtsSynthesizer, texts: Sequence[str], stagger_s: float
) -> list[Stream]:
    """Every text as a Speak through the gateway's synthesis path, starts staggered."""

    async def one(i: int, text: str) -> Stream:
        await asyncio.sleep(i * stagger_s)
        stream = Stream()
        t0 = time.perf_counter()
        async for piece in synth.stream(SpeakIn(text=text, speak_id=f"r{i}")):
            stream.arrivals.append((time.perf_counter() - t0, len(piece.samples)))
        return stream

    return list(await asyncio.gather(*(one(i, t) for i, t in enumerate(texts))))


async def run_piper(piper: Any, texts: Sequence[str], stagger_s: float) -> list[Stream]:
    """Piper's own synthesis per reply, each in a thread of its own (a thread per call)."""
    from piper.config import SynthesisConfig

    syn = SynthesisConfig()
    loop = asyncio.get_running_loop()

    def synth(text: str) -> Stream:
        stream = Stream()
        t0 = time.perf_counter()
        for chunk in piper.synthesize(text, syn):
            stream.arrivals.append((time.perf_counter() - t0, len(chunk.audio_float_array)))
        return stream

    with ThreadPoolExecutor(max_workers=max(1, len(texts))) as threads:

        async def one(i: int, text: str) -> Stream:
            await asyncio.sleep(i * stagger_s)
            return await loop.run_in_executor(threads, synth, text)

        return list(await asyncio.gather(*(one(i, t) for i, t in enumerate(texts))))


@dataclass
class Probe:
    method: str
    kind: str
    n: int
    streams: list[dict[str, float]]
    other_cores: float

    @property
    def late(self) -> int:
        return int(sum(s["late"] for s in self.streams))


def aggregate(probes: Iterable[Probe]) -> dict[str, float]:
    streams = [s for p in probes for s in p.streams]
    first = [s["first_ms"] for s in streams]
    return {
        "first_p50_ms": median(first),
        "first_p95_ms": percentile(first, 95),
        "late_per_stream": statistics.mean(s["late"] for s in streams),
        "late_total": float(sum(s["late"] for s in streams)),
        "starve_ms_per_stream": statistics.mean(s["starve_ms"] for s in streams),
        "rtf_med": median(s["rtf"] for s in streams),
        "streams": float(len(streams)),
    }


class Bench:
    """The methods, loaded once, and how to probe one of them at (kind, N)."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.cores = os.cpu_count() or 1
        self.streamer = VitsStreamer.load(TtsConfig(cache_bytes=0))
        self.streamer.warmup()
        # Today's pool as it was: the fixed window schedule with 28 frames of context.
        self.old_streamer = VitsStreamer.load(TtsConfig(cache_bytes=0, context_frames=28))
        self.old_streamer.warmup()
        self.cut_streamer: VitsStreamer | None = None
        if args.first_unit_words:
            self.cut_streamer = VitsStreamer.load(
                TtsConfig(cache_bytes=0, first_unit_words=args.first_unit_words)
            )
            self.cut_streamer.warmup()
        self.rate = self.streamer.sample_rate_hz
        self.synths: dict[str, TtsSynthesizer | FifoSynthesizer] = {}
        self.piper: Any = None

    async def start(self) -> None:
        workers = self.args.workers or self.cores
        self.synths["deadline"] = TtsSynthesizer(self.streamer, workers, GatewayMetrics())
        if self.args.previous:
            prev = TtsSynthesizer(self.streamer, workers, GatewayMetrics())
            assert prev.scheduler is not None
            prev.scheduler.policy = previous_policy(prev.scheduler.policy)
            self.synths["deadline-prev"] = prev
        if self.cut_streamer is not None:
            self.synths[f"deadline-cut{self.args.first_unit_words}"] = TtsSynthesizer(
                self.cut_streamer, workers, GatewayMetrics()
            )
        if self.args.batch > 1:
            self.synths[f"deadline-b{self.args.batch}"] = TtsSynthesizer(
                self.streamer, workers, GatewayMetrics(), max_batch_size=self.args.batch
            )
        self.synths["fifo"] = FifoSynthesizer(self.old_streamer, max(1, min(4, self.cores)))
        if not self.args.no_piper:
            from piper import PiperVoice
            from piper.config import PiperConfig

            files = resolve_voice("joe")
            config = PiperConfig.from_dict(json.loads(files.config_path.read_text()))
            session = make_session(files.model_path.read_bytes(), ["CPUExecutionProvider"], 1)
            self.piper = PiperVoice(session=session, config=config)
        for name in self.methods:  # warm every path at the reply kinds used
            for kind in self.args.kinds:
                await self.probe(name, kind, 1, probe_index=99)

    async def aclose(self) -> None:
        for synth in self.synths.values():
            await synth.aclose()
        self.streamer.close()
        self.old_streamer.close()
        if self.cut_streamer is not None:
            self.cut_streamer.close()

    @property
    def methods(self) -> list[str]:
        return [*self.synths, *(["piper"] if self.piper is not None else [])]

    async def probe(self, method: str, kind: str, n: int, probe_index: int) -> Probe:
        texts = [reply_text(kind, i, probe_index) for i in range(n)]
        stagger = self.args.stagger_ms / 1000.0
        cpu = OtherCpu()
        cpu.start()
        if method == "piper":
            streams = await run_piper(self.piper, texts, stagger)
        else:
            streams = await run_synthesizer(self.synths[method], texts, stagger)
        other = cpu.stop()
        return Probe(method, kind, n, [s.summary(self.rate) for s in streams], other)


def previous_policy(policy: SynthPolicy) -> SynthPolicy:
    """``policy`` without the rules added for many replies at once (the policy as it was).

    No compute-share floor on window sizes, a reply far ahead may take a second worker, the
    first-audio lane takes replies that have not started only, and a reply starting while
    every worker is busy gets the same small first window as one starting on an idle device.
    """
    return replace(
        policy,
        share_ratio=math.inf,
        parallel_slack_s=math.inf,
        urgent_slack_s=0.0,
        busy_first_window_frames=policy.first_window_frames,
    )


def rotate(items: Sequence[T], k: int) -> list[T]:
    k %= max(1, len(items))
    return [*items[k:], *items[:k]]


async def table(
    bench: Bench, kinds: Sequence[str], ns: Sequence[int], repeats: int
) -> dict[str, dict[str, float]]:
    rows: dict[str, dict[str, float]] = {}
    others: list[float] = []
    print(
        f"\n{'reply':<12}{'N':>3} {'method':<12}{'first p50':>10}{'first p95':>10}"
        f"{'late/str':>9}{'starve ms':>10}{'RTF med':>8}{'late tot':>9}"
    )
    print("-" * 83)
    step = 0
    for kind in kinds:
        for n in ns:
            probes: dict[str, list[Probe]] = {m: [] for m in bench.methods}
            # At least min_streams replies per row, so that N = 1 has a median too.
            for r in range(max(repeats, -(-bench.args.min_streams // n))):
                for method in rotate(bench.methods, step):
                    p = await bench.probe(method, kind, n, probe_index=r)
                    probes[method].append(p)
                    others.append(p.other_cores)
                step += 1
            for method in bench.methods:
                agg = aggregate(probes[method])
                rows[f"{kind}/{n}/{method}"] = agg
                print(
                    f"{kind:<12}{n:>3} {method:<12}{agg['first_p50_ms']:>10.1f}"
                    f"{agg['first_p95_ms']:>10.1f}{agg['late_per_stream']:>9.2f}"
                    f"{agg['starve_ms_per_stream']:>10.1f}{agg['rtf_med']:>8.3f}"
                    f"{int(agg['late_total']):>9d}",
                    flush=True,
                )
    if others:
        print(
            f"other processes used {median(others):.2f} cores (median over probes, "
            f"max {max(others):.2f}) of {bench.cores}"
        )
    return rows


@dataclass
class Search:
    """Largest N with zero late chunks: double until a failure, then bisect."""

    method: str
    max_n: int
    good: int = 0
    bad: int | None = None

    def next_n(self) -> int | None:
        if self.bad is None:
            n = max(1, 2 * self.good)
            return n if n <= self.max_n and self.good < self.max_n else None
        if self.bad - self.good <= 1:
            return None
        return (self.good + self.bad) // 2

    def record(self, n: int, ok: bool) -> None:
        if ok:
            self.good = max(self.good, n)
            if self.bad is None and 2 * n > self.max_n and n < self.max_n:
                self.bad = self.max_n + 1
        else:
            self.bad = n if self.bad is None else min(self.bad, n)


async def bisect(bench: Bench, repeats: int, max_n: int, kind: str) -> dict[str, int]:
    searches = [Search(m, max_n) for m in bench.methods]
    print(f"\nlargest N with zero late chunks ({kind}, {repeats} probe(s) per N, max {max_n})")
    step = 0
    while True:
        todo = [(s, n) for s in searches if (n := s.next_n()) is not None]
        if not todo:
            break
        for s, n in rotate(todo, step):
            late, other = 0, []
            for r in range(repeats):
                p = await bench.probe(s.method, kind, n, probe_index=10 + r)
                late += p.late
                other.append(p.other_cores)
                if late:
                    break
            s.record(n, late == 0)
            print(
                f"  {s.method:<12} N={n:>3}: {late:>4} late  (others used {max(other):.2f} cores)",
                flush=True,
            )
        step += 1
    result = {s.method: s.good for s in searches}
    for method, n in result.items():
        print(f"  {method:<12} largest zero-underrun N = {n}")
    return result


def batch_gain(streamer: VitsStreamer, sizes: Sequence[int], lengths: Sequence[int]) -> None:
    """Decoder time for B windows in one call vs B calls, per input length."""
    job = streamer.open(" ".join(SENTENCES[:3]), SpeakOptions())
    job.run_front_end()
    total = job.unit_frames
    print(f"\ndecoder batch gain on this device (one unit of {total} frames)")
    print(f"{'input frames':>13}" + "".join(f"{'B=' + str(b):>9}" for b in sizes))
    for length in lengths:
        if length > total:
            continue
        plans = [WindowPlan(0, length, 0, length) for _ in range(max(sizes))]
        cells = []
        for b in sizes:
            items = [(job, plans[i]) for i in range(b)]

            def batched(items: list[Any] = items) -> None:
                streamer.decode_windows(items)

            def singles(items: list[Any] = items) -> None:
                for item in items:
                    streamer.decode_windows([item])

            tb = _best(batched)
            ts = _best(singles)
            cells.append(f"{ts / tb:>8.2f}x")
        print(f"{length:>13}" + "".join(f"{c:>9}" for c in cells))
    print("(B windows as separate calls / as one call: > 1 means batching pays)")


def _best(fn: Callable[[], None], n: int = 3) -> float:
    fn()
    times = []
    for _ in range(n):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return min(times)


async def amain(args: argparse.Namespace) -> dict[str, Any]:
    bench = Bench(args)
    await bench.start()
    out: dict[str, Any] = {}
    try:
        cores = bench.cores
        print(
            f"{cores} core(s); deadline: {bench.synths['deadline'].scheduler.workers} "  # type: ignore[union-attr]
            f"worker(s); fifo: {max(1, min(4, cores))} thread(s); stagger {args.stagger_ms} ms; "
            f"load average {os.getloadavg()[0]:.2f}"
        )
        out["table"] = await table(bench, args.kinds, args.ns, args.repeats)
        if not args.no_bisect:
            out["largest_zero_underrun_n"] = await bisect(
                bench, args.repeats, args.max_n, args.kinds[-1]
            )
        if args.rtf:
            out["rtf"] = await rtf(bench, args.repeats)
        if args.batch_gain:
            batch_gain(bench.streamer, (1, 2, 4, 8), (32, 56, 88, 120, 216))
    finally:
        await bench.aclose()
    return out


async def rtf(bench: Bench, repeats: int) -> dict[str, float]:
    """Single-stream RTF, before (fixed windows) and after (the deadline scheduler).

    Two figures per way: wall time to the last chunk over the audio's duration (the scheduler
    runs a reply's windows on two workers and sizes them from its lead), and the CPU it took
    (all threads of this process) over the audio's duration: the compute a reply costs.
    """
    text = reply_text("4 sentences", 0, 0)
    old = bench.old_streamer
    ctx_old, ctx_new = old.config.context_frames, bench.streamer.config.context_frames

    def fixed(streamer: VitsStreamer) -> tuple[float, float]:
        t0, c0 = time.perf_counter(), _own_cpu()
        n = sum(len(c.samples) for c in streamer.stream(text, SpeakOptions()))
        audio = n / bench.rate
        return (time.perf_counter() - t0) / audio, (_own_cpu() - c0) / audio

    synth = bench.synths["deadline"]
    names = (
        f"fixed windows, context {ctx_old} (before)",
        f"deadline scheduler, context {ctx_new} (after)",
    )
    rows: dict[str, list[tuple[float, float]]] = {k: [] for k in names}
    for _ in range(repeats):
        rows[names[0]].append(await asyncio.to_thread(fixed, old))
        t0, c0 = time.perf_counter(), _own_cpu()
        n = 0
        async for piece in synth.stream(SpeakIn(text=text, speak_id="rtf")):
            n += len(piece.samples)
        audio = n / bench.rate
        rows[names[1]].append(((time.perf_counter() - t0) / audio, (_own_cpu() - c0) / audio))
    print("\nsingle-stream RTF of the streamer (4 sentences, 1 ORT thread): wall, CPU")
    result: dict[str, float] = {}
    for k, v in rows.items():
        wall, cpu = median(w for w, _ in v), median(c for _, c in v)
        result[f"{k} wall"], result[f"{k} cpu"] = wall, cpu
        print(f"  {k:<42}{wall:.3f}  {cpu:.3f}")
    return result


def parse(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ns", type=lambda s: tuple(int(x) for x in s.split(",")), default=NS)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--stagger-ms", type=float, default=100.0)
    parser.add_argument("--workers", type=int, default=0, help="deadline workers; 0 = cores")
    parser.add_argument("--batch", type=int, default=0, help="also run deadline at this batch")
    parser.add_argument("--max-n", type=int, default=32)
    parser.add_argument("--min-streams", type=int, default=5, help="replies per table row")
    parser.add_argument("--no-bisect", action="store_true")
    parser.add_argument("--no-piper", action="store_true")
    parser.add_argument(
        "--previous",
        action="store_true",
        help="also run the deadline scheduler with the policy before the many-replies rules",
    )
    parser.add_argument(
        "--first-unit-words",
        type=int,
        default=0,
        help="also run the deadline scheduler on a voice that cuts the first sentence here",
    )
    parser.add_argument("--rtf", action="store_true")
    parser.add_argument("--batch-gain", action="store_true")
    parser.add_argument(
        "--tiny", action="store_true", help="N=1,2, one sentence, one probe, search to 2"
    )
    parser.add_argument("--json", type=Path, default=None, help="write the results here")
    parser.add_argument(
        "--kinds", default="1,4", help="reply lengths to run: 1 (one sentence), 4, or both"
    )
    args = parser.parse_args(argv)
    args.kinds = tuple(k for k in KINDS if k.split()[0] in args.kinds.split(","))
    if args.tiny:
        args.ns, args.repeats, args.max_n, args.kinds = (1, 2), 1, 2, KINDS[:1]
        args.min_streams = 1
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse(argv)
    np.seterr(all="ignore")
    out = asyncio.run(amain(args))
    if args.json is not None:
        args.json.write_text(json.dumps(out, indent=1))
    print("late = chunks arriving after the player needs them; starve = ms of silence inside")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
