"""Time to first audio: the VITS streamer vs Piper's own per-sentence streaming vs one-shot.

Run:  .venv/bin/python benchmarks/tts_first_audio.py [--repeats 7] [--threads 1]
      .venv/bin/python -m benchmarks.tts_first_audio --paths [--repeats 15]

``--paths``: one reply at a time, the same voice, interleaved: the streamer called directly
(what the table below measures) against the gateway's synthesis path
(``voxgate.gateway.runtime.TtsSynthesizer``) with the deadline scheduler, with the FIFO pool, and
with the deadline scheduler on a voice that cuts the first sentence after ``--first-unit-words``
words (``TtsConfig.first_unit_words``); each reply is played to its end before the next starts.

``--converse``: one reply at a time from outside, through a real gateway's ``Converse`` on
loopback (a gRPC client per call, mu-law 8 kHz out): first audio is from writing the
``Speak`` to the first audio frame of it read back, for the default gateway (the deadline
scheduler) and one on the earlier FIFO pool (``benchmarks/_fifo_pool.py``), interleaved; each reply
is cleared after its first frame (what is measured is first audio, not playback).

For 1- and 4-sentence replies and 1 and 4 concurrent speakers (threads started together), each
method synthesises the reply and we record, per stream:

- first audio: from the call to the first audio chunk in hand;
- RTF: wall time to the last chunk / audio duration;
- underruns: playback starting at first audio, how many chunks arrive after their play time
  (and how many ms the player would starve in total).

All sessions get the same ONNX Runtime thread count; the streamer's phrase cache is off so that
repeats measure synthesis. Noise is on (the voices' defaults), as in production.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import threading
import time
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import onnxruntime as ort
from piper import PiperVoice
from piper.config import PiperConfig, SynthesisConfig

if __package__ in (None, ""):
    # Run as a script: make the repository root importable (benchmarks._stats).
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks._fifo_pool import FifoHub, FifoSynthesizer  # noqa: E402
from benchmarks._stats import median, percentile  # noqa: E402
from benchmarks.tts_concurrency import play, rotate  # noqa: E402
from voxgate.engines.tts import SpeakOptions, TtsConfig, VitsStreamer  # noqa: E402
from voxgate.engines.tts._session import make_session  # noqa: E402
from voxgate.engines.tts._voice import resolve_voice  # noqa: E402

TEXTS = {
    "1 sentence": "Sure, I can help you with that right away.",
    "4 sentences": (
        "Thanks for calling, your order has shipped. It should arrive on Tuesday, March 3rd. "
        "The total came to $42.50, including tax. Is there anything else I can help you with?"
    ),
}

T = TypeVar("T")

# An audio source yields (samples_available_time_s, n_samples) as chunks arrive.
Source = Callable[[str], Iterator[int]]


@dataclass
class Run:
    first_s: float
    total_s: float
    audio_s: float
    late_chunks: int
    starve_ms: float


def measure(source: Source, text: str, rate: int) -> Run:
    start = time.perf_counter()
    arrivals: list[tuple[float, int]] = []
    for n in source(text):
        arrivals.append((time.perf_counter() - start, n))
    return _played(arrivals, rate)


def run_concurrent(source: Source, text: str, rate: int, speakers: int) -> list[Run]:
    barrier = threading.Barrier(speakers)
    results: list[Run] = []
    lock = threading.Lock()

    def worker() -> None:
        barrier.wait()
        r = measure(source, text, rate)
        with lock:
            results.append(r)

    threads = [threading.Thread(target=worker) for _ in range(speakers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return results


def p95(xs: list[float]) -> float:
    return percentile(xs, 95)


async def _interleaved(
    methods: list[str], repeats: int, pause_s: float, once: Callable[[str], Awaitable[T]]
) -> dict[str, list[T]]:
    """``repeats`` rounds of ``once(method)`` for every method, each round in another order
    (the machine is shared), after one more round first that warms every path and is dropped;
    ``pause_s`` before each run lets the one before it settle."""
    import asyncio  # noqa: PLC0415

    got: dict[str, list[T]] = {m: [] for m in methods}
    for r in range(repeats + 1):
        for m in rotate(methods, r):
            await asyncio.sleep(pause_s)
            result = await once(m)
            if r:
                got[m].append(result)
    return got


async def _paths(args: argparse.Namespace) -> dict[str, dict[str, float]]:
    """Single-reply first audio: the streamer directly vs the gateway's synthesis paths."""
    import asyncio  # noqa: PLC0415
    import os  # noqa: PLC0415

    from voxgate.gateway.events import SpeakIn  # noqa: PLC0415
    from voxgate.gateway.metrics import GatewayMetrics  # noqa: PLC0415
    from voxgate.gateway.runtime import TtsSynthesizer  # noqa: PLC0415

    streamer = VitsStreamer.load(TtsConfig(onnx_threads=args.threads, cache_bytes=0))
    streamer.warmup()
    cut = VitsStreamer.load(
        TtsConfig(onnx_threads=args.threads, cache_bytes=0, first_unit_words=args.first_unit_words)
    )
    cut.warmup()
    rate = streamer.sample_rate_hz
    cores = os.cpu_count() or 1
    synths = {
        "deadline": TtsSynthesizer(streamer, cores, GatewayMetrics()),
        "fifo": FifoSynthesizer(streamer, min(4, cores)),
        f"deadline, cut {args.first_unit_words}": TtsSynthesizer(cut, cores, GatewayMetrics()),
    }

    async def through(synth: TtsSynthesizer | FifoSynthesizer, text: str) -> Run:
        start = time.perf_counter()
        arrivals = []
        async for piece in synth.stream(SpeakIn(text=text, speak_id="r")):
            arrivals.append((time.perf_counter() - start, len(piece.samples)))
        return _played(arrivals, rate)

    def direct(text: str) -> Run:
        def chunks(t: str) -> Iterator[int]:
            for chunk in streamer.stream(t, SpeakOptions()):
                yield len(chunk.samples)

        return measure(chunks, text, rate)

    methods = ["streamer", *synths]
    raw: dict[str, dict[str, float]] = {}
    print(
        f"one reply at a time, {args.repeats} repeats, interleaved; load average "
        f"{os.getloadavg()[0]:.2f}"
    )
    print(f"{'reply':<12} {'method':<18}{'first med':>10}{'first p95':>10}{'late':>6}")
    for label, text in TEXTS.items():

        async def once(m: str, text: str = text) -> Run:
            if m == "streamer":
                return await asyncio.to_thread(direct, text)
            return await through(synths[m], text)

        runs = await _interleaved(methods, args.repeats, 0.1, once)
        for m in methods:
            first = [1000 * x.first_s for x in runs[m]]
            row = {
                "first_med_ms": median(first),
                "first_p95_ms": p95(first),
                "late": sum(x.late_chunks for x in runs[m]) / len(runs[m]),
            }
            raw[f"{label}/{m}"] = row
            print(
                f"{label:<12} {m:<18}{row['first_med_ms']:>10.1f}{row['first_p95_ms']:>10.1f}"
                f"{row['late']:>6.2f}",
                flush=True,
            )
    for synth in synths.values():
        await synth.aclose()
    streamer.close()
    cut.close()
    return raw


async def _converse(args: argparse.Namespace) -> dict[str, dict[str, float]]:
    """Single-reply first audio through Converse: a deadline gateway vs a FIFO one."""
    import contextlib  # noqa: PLC0415
    import os  # noqa: PLC0415

    import grpc  # noqa: PLC0415

    from voxgate.gateway.config import load_config  # noqa: PLC0415
    from voxgate.gateway.runtime import build_hub  # noqa: PLC0415
    from voxgate.gateway.testing.server import running_server  # noqa: PLC0415
    from voxgate.v1 import voxgate_pb2 as pb  # noqa: PLC0415
    from voxgate.v1 import voxgate_pb2_grpc as pb_grpc  # noqa: PLC0415

    methods = {"converse deadline": "deadline", "converse fifo": "fifo"}
    stubs: dict[str, Any] = {}
    async with contextlib.AsyncExitStack() as stack:
        for name, scheduling in methods.items():
            # No phrase cache: every repeat synthesises (the warm-up round would be replayed).
            overrides = {"engines": "tts", "tts": {"cache_bytes": 0}}
            cfg = load_config(None, overrides)
            # The FIFO gateway: the same engines with the earlier pool in place of the scheduler.
            hub = (
                FifoHub(cfg, threads=min(4, os.cpu_count() or 1)) if scheduling == "fifo" else None
            )
            srv = await stack.enter_async_context(running_server(hub=hub or build_hub(cfg)))
            channel = await stack.enter_async_context(grpc.aio.insecure_channel(srv.target))
            stubs[name] = pb_grpc.VoiceGatewayStub(channel)

        async def first_audio(stub: Any, text: str) -> float:
            call = stub.Converse()
            fmt = pb.AudioFormat(encoding=pb.MULAW, sample_rate_hertz=8000)
            await call.write(pb.ConverseRequest(config=pb.SessionConfig(input_audio=fmt)))
            t0 = time.perf_counter()
            await call.write(pb.ConverseRequest(speak=pb.Speak(text=text, speak_id="r")))
            first = None
            while (msg := await call.read()) is not grpc.aio.EOF:
                if msg.WhichOneof("event") == "audio" and first is None:
                    first = time.perf_counter() - t0
                    await call.write(pb.ConverseRequest(clear=pb.Clear()))
                    await call.done_writing()
            assert first is not None, "no audio came back"
            return first

        raw: dict[str, dict[str, float]] = {}
        names = list(stubs)
        print(
            f"one reply at a time through Converse, {args.repeats} repeats, interleaved; "
            f"load average {os.getloadavg()[0]:.2f}"
        )
        print(f"{'reply':<12} {'method':<18}{'first med':>10}{'first p95':>10}")
        for label, text in TEXTS.items():

            async def once(m: str, text: str = text) -> float:
                return 1000 * await first_audio(stubs[m], text)

            # 0.3 s between replies: the cleared reply's last step settles.
            got = await _interleaved(names, args.repeats, 0.3, once)
            for m in names:
                row = {"first_med_ms": median(got[m]), "first_p95_ms": p95(got[m])}
                raw[f"{label}/{m}"] = row
                print(
                    f"{label:<12} {m:<18}{row['first_med_ms']:>10.1f}{row['first_p95_ms']:>10.1f}",
                    flush=True,
                )
    return raw


def _played(arrivals: list[tuple[float, int]], rate: int) -> Run:
    """The player model of :func:`measure` (tts_concurrency's) over already timed arrivals."""
    late, starve, played = play(arrivals, rate)
    return Run(arrivals[0][0], arrivals[-1][0], played / rate, late, 1000 * starve)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--threads", type=int, default=1, help="ONNX Runtime threads per session")
    parser.add_argument("--json", action="store_true", help="also print raw results as JSON")
    parser.add_argument(
        "--paths", action="store_true", help="one reply: streamer vs the gateway's paths"
    )
    parser.add_argument(
        "--converse", action="store_true", help="one reply through Converse: deadline vs fifo"
    )
    parser.add_argument("--first-unit-words", type=int, default=3)
    args = parser.parse_args(argv)
    if args.paths or args.converse:
        import asyncio  # noqa: PLC0415

        result = asyncio.run(_paths(args) if args.paths else _converse(args))
        if args.json:
            print(json.dumps(result, indent=1))
        return

    streamer = VitsStreamer.load(TtsConfig(onnx_threads=args.threads, cache_bytes=0))
    streamer.warmup()
    rate = streamer.sample_rate_hz
    files = resolve_voice("joe")
    piper_config = PiperConfig.from_dict(json.loads(files.config_path.read_text()))
    piper = PiperVoice(
        session=make_session(files.model_path.read_bytes(), ["CPUExecutionProvider"], args.threads),
        config=piper_config,
    )
    options = SpeakOptions()
    syn = SynthesisConfig()

    def ours(text: str) -> Iterator[int]:
        for chunk in streamer.stream(text, options):
            yield len(chunk.samples)

    def piper_stream(text: str) -> Iterator[int]:
        for chunk in piper.synthesize(text, syn):
            yield len(chunk.audio_float_array)

    def oneshot(text: str) -> Iterator[int]:
        yield len(streamer.synthesize_oneshot(text, options).samples)

    methods: dict[str, Source] = {"streamer": ours, "piper": piper_stream, "one-shot": oneshot}
    for source in methods.values():  # warm every session at the shapes used
        for text in TEXTS.values():
            measure(source, text, rate)

    print(f"ORT {ort.__version__}, {args.threads} ORT thread(s)/session, repeats={args.repeats}")
    header = (
        f"{'reply':<12}{'spk':>4} {'method':<10}{'first med':>10}{'first p95':>10}"
        f"{'RTF med':>9}{'late':>6}{'starve ms':>10}{'x sooner':>9}"
    )
    print(header)
    print("-" * len(header))
    raw: dict[str, dict[str, float]] = {}
    for label, text in TEXTS.items():
        for speakers in (1, 4):
            firsts: dict[str, float] = {}
            rows = []
            for name, source in methods.items():
                runs: list[Run] = []
                for _ in range(args.repeats):
                    runs.extend(run_concurrent(source, text, rate, speakers))
                first = [1000 * r.first_s for r in runs]
                rtf = [r.total_s / r.audio_s for r in runs]
                firsts[name] = median(first)
                rows.append(
                    (
                        name,
                        median(first),
                        p95(first),
                        median(rtf),
                        sum(r.late_chunks for r in runs) / len(runs),
                        statistics.mean(r.starve_ms for r in runs),
                    )
                )
            for name, med, hi, rtf_med, late, starve in rows:
                ratio = firsts[name] / firsts["streamer"]
                print(
                    f"{label:<12}{speakers:>4} {name:<10}{med:>10.1f}{hi:>10.1f}{rtf_med:>9.3f}"
                    f"{late:>6.2f}{starve:>10.1f}{ratio:>8.1f}x"
                )
                raw[f"{label}/{speakers}/{name}"] = {
                    "first_med_ms": med,
                    "first_p95_ms": hi,
                    "rtf": rtf_med,
                    "late": late,
                    "starve_ms": starve,
                }
    print("x sooner = method's median first audio / streamer's (piper row: how much sooner we are)")
    print("late = chunks per stream arriving after their play time; starve = ms of silence")
    if args.json:
        print(json.dumps(raw, indent=1))
    streamer.close()


if __name__ == "__main__":
    main()
