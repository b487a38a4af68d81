"""Two recognition models in one process: how the batcher's workers are shared between them.

The gateway serves named models (``asr.models_dir``) beside the default through ONE batcher
whose workers route each batch to its model (``voxgate.gateway.runtime.ModelRouter``; the model is
part of the batch key, so a batch never mixes models). This benchmark compares that arrangement with
the two a user would otherwise pick, on the same two loaded models and the same utterances, in
interleaved rounds (the machine is shared, so every arrangement sees the same noise):

* ``shared``: one batcher, ``W`` workers (the device's default plan: 2 on 2 cores), each worker
  able to run either model (what the gateway does);
* ``per-model``: a batcher per model, each with ``W`` workers (``2 W`` engine threads compete for
  the cores when both models are busy);
* ``split``: a batcher per model with ``W / 2`` workers each (a static partition of the cores:
  a model's utterances never use the other model's idle worker).

And, as the baseline the merged model must equal, ``one-model``: the default model alone on one
batcher of ``W`` workers, given the same utterances (all for that model).

Two workloads per arrangement and round:

* ``burst``: ``--utterances`` utterances queued at once, alternating the two models. Reported:
  the wall time to finish all (throughput) and each utterance's latency (submit -> result).
* ``lone``: ``--backlog`` utterances of model A queued at once, then, 50 ms later, one utterance
  of model B. Reported: B's latency, i.e. how long a lone request of one model waits behind
  another model's queue (the batcher's rule is that it waits at most for one running batch).

The models: A is the bundled base (``--model-a``), B is by default the same files under another
name (hard links in a temporary directory: same cost by construction, which is what a merged
LoRA adapter has, since merging does not change the architecture); ``--model-b DIR`` measures
an adapted model instead. CTranslate2 threads as the gateway sets them: ``inter_threads = W``,
``intra_threads = cores // W`` for each model.

Run::

    python -m benchmarks.model_sharing
    python -m benchmarks.model_sharing --utterances 12 --backlog 6 --rounds 3

It prints the command line, then one table: per arrangement and workload, the median and p95
latency (nearest rank, ``benchmarks/_stats.py``), the median burst wall time and the
throughput relative to ``shared``.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import os
import resource
import shlex
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from benchmarks._stats import median, percentile
from benchmarks.asr_capacity import SPEECH, _busy_cpu_s, load_clips
from voxgate.engines.asr import resolve_model_dir
from voxgate.engines.asr._whisper import WhisperEngine
from voxgate.engines.asr.base import AsrOptions, AsrRequest, AsrResult
from voxgate.engines.asr.config import WhisperConfig
from voxgate.gateway.base import ModelDescription
from voxgate.gateway.config import BatcherConfig
from voxgate.gateway.models import LoadedModel, ModelRegistry
from voxgate.gateway.runtime import ModelRouter
from voxgate.gateway.scheduling import Batcher, BatchPolicy, default_plan
from voxgate.gateway.testing.signals import stats_for

ARRANGEMENTS = ("shared", "per-model", "split", "one-model")


@dataclass
class Samples:
    """What one arrangement measured over all rounds."""

    burst_latency_s: list[float] = field(default_factory=list)
    burst_wall_s: list[float] = field(default_factory=list)
    lone_latency_s: list[float] = field(default_factory=list)
    texts: dict[tuple[str, int], str] = field(default_factory=dict)
    other_cpu_share: list[float] = field(default_factory=list)


def _own_cpu_s() -> float:
    ru = resource.getrusage(resource.RUSAGE_SELF)
    return ru.ru_utime + ru.ru_stime


def link_copy(src: Path, dst: Path) -> Path:
    """``src``'s model files under ``dst`` (hard links when possible, else a copy)."""
    dst.mkdir(parents=True)
    for path in src.iterdir():
        if path.is_file():
            try:
                os.link(path, dst / path.name)
            except OSError:
                (dst / path.name).write_bytes(path.read_bytes())
    return dst


def load(path: Path, workers: int, cores: int) -> WhisperEngine:
    """One model with the gateway's thread split, warmed."""
    cfg = WhisperConfig(
        model=str(path), inter_threads=workers, intra_threads=max(1, cores // workers)
    )
    engine = WhisperEngine.load(cfg)
    engine.warmup()
    return engine


def engines_of(engine: WhisperEngine, n: int) -> list[Any]:
    """``n`` worker engine objects over one model (as the hub makes them)."""
    return [engine, *(engine.sibling() for _ in range(n - 1))]


class Setup:
    """One arrangement: which batcher an utterance of model A or B goes to, under what key."""

    def __init__(
        self,
        name: str,
        a: WhisperEngine,
        b: WhisperEngine,
        workers: int,
        registry: ModelRegistry,
        b_key: str,
    ) -> None:
        self.name = name
        self.batchers: dict[str, Batcher[AsrRequest, AsrResult]] = {}
        self.keys = {"A": "", "B": ""}
        # The gateway's batcher settings: the device plan's batch size, batcher.max_wait_ms.
        plan = default_plan("cpu", cpu_cores=os.cpu_count() or 1)
        policy = BatchPolicy(
            max_batch_size=plan.max_batch_size,
            max_wait_ms=BatcherConfig.model_validate({}).max_wait_ms,
            max_queue_size=512,
        )
        if name == "shared":
            self.keys["B"] = b_key
            routers = [ModelRouter(i, e, registry) for i, e in enumerate(engines_of(a, workers))]
            shared: Batcher[AsrRequest, AsrResult] = Batcher(routers, policy, name="shared")
            self.batchers = {"A": shared, "B": shared}
        elif name == "per-model":
            self.batchers = {
                "A": Batcher(engines_of(a, workers), policy, name="a"),
                "B": Batcher(engines_of(b, workers), policy, name="b"),
            }
        elif name == "split":
            half = max(1, workers // 2)
            self.batchers = {
                "A": Batcher(engines_of(a, half), policy, name="a"),
                "B": Batcher(engines_of(b, half), policy, name="b"),
            }
        elif name == "one-model":
            only = Batcher(engines_of(a, workers), policy, name="one")
            self.batchers = {"A": only, "B": only}
        else:
            raise ValueError(name)

    async def start(self) -> None:
        for batcher in {id(b): b for b in self.batchers.values()}.values():
            await batcher.start()

    async def aclose(self) -> None:
        for batcher in {id(b): b for b in self.batchers.values()}.values():
            await batcher.aclose()

    def submit(self, model: str, request: AsrRequest) -> asyncio.Future[AsrResult]:
        if self.name == "one-model":
            model = "A"
        key = self.keys[model]
        req = AsrRequest(
            request.audio, request.stats, dataclasses.replace(request.options, model=key)
        )
        return self.batchers[model].submit(req, key=req.batch_key)


async def timed(fut: asyncio.Future[AsrResult], t0: float) -> tuple[float, AsrResult]:
    result = await fut
    return time.perf_counter() - t0, result


async def burst(setup: Setup, reqs: Sequence[AsrRequest], out: Samples) -> None:
    t0 = time.perf_counter()
    jobs = [timed(setup.submit("A" if i % 2 == 0 else "B", r), t0) for i, r in enumerate(reqs)]
    done = await asyncio.gather(*jobs)
    out.burst_wall_s.append(time.perf_counter() - t0)
    for i, (lat, res) in enumerate(done):
        out.burst_latency_s.append(lat)
        out.texts[("A" if i % 2 == 0 else "B", i)] = res.text


async def lone(setup: Setup, backlog: Sequence[AsrRequest], one: AsrRequest, out: Samples) -> None:
    behind = [setup.submit("A", r) for r in backlog]
    await asyncio.sleep(0.05)
    lat, _ = await timed(setup.submit("B", one), time.perf_counter())
    out.lone_latency_s.append(lat)
    await asyncio.gather(*behind)


async def run(args: argparse.Namespace) -> dict[str, Samples]:
    cores = os.cpu_count() or 1
    workers = args.workers or default_plan("cpu", cpu_cores=cores).workers
    clips = load_clips(args.speech_dir)
    picked = [clips[i % len(clips)] for i in range(args.utterances)]
    # What a gateway call with language "en" and default decoding sends (greedy, no words).
    opts = AsrOptions(
        language="en", beam_size=1, word_timestamps=False, silence_aware=not args.no_policy
    )
    audio = [
        c.audio[: int(args.clip_seconds * 16000)] if args.clip_seconds else c.audio for c in picked
    ]
    reqs = [AsrRequest(x, stats_for(x), opts) for x in audio]
    backlog = reqs[: args.backlog]
    one = reqs[-1]
    with tempfile.TemporaryDirectory(prefix="model-sharing-") as tmp:
        a_dir = Path(args.model_a) if args.model_a else resolve_model_dir("base")
        # B sits in a models directory of its own, as asr.models_dir would hold it.
        b_dir = link_copy(Path(args.model_b) if args.model_b else a_dir, Path(tmp) / "b")
        print(f"models: A={a_dir}  B={args.model_b or a_dir}  workers={workers} cores={cores}")
        a = load(a_dir, workers, cores)
        b = load(b_dir, workers, cores)
        desc = ModelDescription(name="a", family="whisper")
        # The gateway's registry and router for "shared": B found by a scan, "loaded" by
        # handing over the engine loaded above (so every arrangement runs the same objects).
        registry = ModelRegistry(
            LoadedModel(name="a", description=desc, engine=a),
            Path(tmp),
            lambda entry: LoadedModel(name=entry.name, description=desc, engine=b),
        )
        await registry.rescan()
        lease = await registry.acquire("b")
        samples = {name: Samples() for name in args.arrangements}
        for rnd in range(args.rounds):
            for name in args.arrangements:
                setup = Setup(name, a, b, workers, registry, lease.key)
                await setup.start()
                busy0, own0, t0 = _busy_cpu_s(), _own_cpu_s(), time.perf_counter()
                try:
                    await burst(setup, reqs, samples[name])
                    await lone(setup, backlog, one, samples[name])
                finally:
                    await setup.aclose()
                s = samples[name]
                # CPU that other users of the machine took meanwhile (the noise to read with).
                other = max(0.0, (_busy_cpu_s() - busy0) - (_own_cpu_s() - own0))
                s.other_cpu_share.append(other / (cores * (time.perf_counter() - t0)))
                print(
                    f"round {rnd + 1} {name:>9}: burst {s.burst_wall_s[-1]:.2f} s, "
                    f"lone B behind A's backlog {s.lone_latency_s[-1]:.2f} s, "
                    f"other processes {100 * s.other_cpu_share[-1]:.0f} % of the cores",
                    flush=True,
                )
        lease.release()
        a.close()
        b.close()
    return samples


def print_table(samples: dict[str, Samples], utterances: int, backlog: int) -> None:
    ref = samples.get("shared")
    ref_wall = median(ref.burst_wall_s) if ref and ref.burst_wall_s else float("nan")
    print()
    print(
        f"| arrangement | burst of {utterances}: wall median s | throughput vs shared | "
        f"latency median s | latency p95 s | lone B behind {backlog} of A: median s | p95 s | "
        "other processes' CPU (median share) |"
    )
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    for name, s in samples.items():
        wall = median(s.burst_wall_s)
        print(
            f"| {name} | {wall:.2f} | {ref_wall / wall:.2f}x | {median(s.burst_latency_s):.2f} | "
            f"{percentile(s.burst_latency_s, 95):.2f} | {median(s.lone_latency_s):.2f} | "
            f"{percentile(s.lone_latency_s, 95):.2f} | {100 * median(s.other_cpu_share):.0f} % |"
        )
    if ref is not None and "one-model" in samples:
        same = sum(
            ref.texts.get(k) == v for k, v in samples["one-model"].texts.items() if k[0] == "B"
        )
        total = sum(1 for k in samples["one-model"].texts if k[0] == "B")
        print(f"\nB's transcripts equal to the default model's (same files): {same}/{total}")


def main(argv: Sequence[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--utterances", type=int, default=12, help="burst size (alternating A, B)")
    ap.add_argument("--backlog", type=int, default=6, help="A's queue in front of a lone B")
    ap.add_argument("--rounds", type=int, default=3, help="interleaved rounds")
    ap.add_argument("--workers", type=int, default=0, help="batcher workers (0 = device plan)")
    ap.add_argument("--model-a", help="model A directory (default: the bundled base)")
    ap.add_argument("--model-b", help="model B directory (default: A's files, hard-linked)")
    ap.add_argument("--speech-dir", type=Path, default=SPEECH)
    ap.add_argument("--clip-seconds", type=float, default=0.0, help="cut clips to this (0 = whole)")
    ap.add_argument(
        "--no-policy",
        action="store_true",
        help="no silence-aware gates or fallbacks (the tiny test mode: random weights)",
    )
    ap.add_argument(
        "--arrangements",
        type=lambda s: [x for x in s.split(",") if x],
        default=list(ARRANGEMENTS),
        help=f"comma-separated, of {','.join(ARRANGEMENTS)}",
    )
    args = ap.parse_args(argv)
    for name in args.arrangements:
        if name not in ARRANGEMENTS:
            ap.error(f"unknown arrangement {name!r}")
    print(
        "$ "
        + shlex.join([sys.executable, "-m", "benchmarks.model_sharing", *(argv or sys.argv[1:])])
    )
    samples = asyncio.run(run(args))
    print_table(samples, args.utterances, args.backlog)


if __name__ == "__main__":
    main()
