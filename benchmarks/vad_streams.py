"""How many real-time telephone streams one gateway process segments on one core.

N concurrent Converse streams each send 20 ms μ-law 8 kHz frames of a real call on an absolute
clock to a VAD-only server (``voxgate serve --engines none``) running in its own process, over
loopback. Reported per N:

* server CPU seconds per stream-minute (from /proc, the server process only);
* the server's share of one core;
* the worst frame lateness on the sending side (how far behind its real-time slot a frame left);
* the worst endpointing lag: SPEECH_END received minus (its offset + hangover), i.e. how late the
  server's speech events come compared with an infinitely fast server.

"Held" means: server ≤ 1 core, no frame late by more than 100 ms and endpointing lag ≤ 100 ms
(with ``vad.end_refine: off``, which moves the reported end and so the lag's reference; see
:func:`start_server`).

Both voice models run side by side in one run, one server process each (``vad.model: webrtc``
and ``silero``), probes alternating between them so that both see the same machine load:

1. CPU per stream-minute at the same N (``--cpu-n``), ``--repeats`` times each: median, and the
   silero/webrtc ratio;
2. the largest N each model holds, by doubling and then bisection down to ``--resolution``
   streams (probes alternate between the two searches).

Usage: python -m benchmarks.vad_streams [--seconds 15] [--models webrtc,silero] [--max-n 256]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import grpc
import numpy as np
import soxr

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
sys.path.insert(1, str(Path(__file__).resolve().parents[1]))  # benchmarks._stats as a script
from conftest import SPEECH_DIR, read_wav_int16  # noqa: E402

from benchmarks._stats import median  # noqa: E402
from voxgate.common.pcm import MULAW_ENCODE, float_to_pcm16, pcm16_to_float  # noqa: E402
from voxgate.v1 import voxgate_pb2 as pb  # noqa: E402
from voxgate.v1 import voxgate_pb2_grpc as pb_grpc  # noqa: E402

FRAME_BYTES = 160  # 20 ms of 8 kHz mu-law
END_SILENCE_MS = 600  # server default hangover


def call_audio() -> bytes:
    wav = sorted((SPEECH_DIR / "calls").glob("call_01*.wav"))[0]
    pcm, sr = read_wav_int16(wav)
    x8 = soxr.resample(pcm16_to_float(pcm), sr, 8000)
    return MULAW_ENCODE[float_to_pcm16(x8).astype(np.int64) + 32768].tobytes()


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    ticks = os.sysconf("SC_CLK_TCK")
    return (int(fields[11]) + int(fields[12])) / ticks  # utime + stime


async def one_stream(
    stub: pb_grpc.VoiceGatewayStub, audio: bytes, seconds: float, start_at: float
) -> tuple[float, float]:
    """Stream real-time frames; return (worst send lateness, worst endpointing lag) in ms."""
    loop = asyncio.get_running_loop()
    n_frames = int(seconds * 50)
    worst_late = 0.0
    worst_lag = 0.0
    t0 = start_at

    async def gen():  # type: ignore[no-untyped-def]
        nonlocal worst_late
        yield pb.ConverseRequest(
            config=pb.SessionConfig(
                input_audio=pb.AudioFormat(encoding=pb.MULAW, sample_rate_hertz=8000)
            )
        )
        for k in range(n_frames):
            due = t0 + k * 0.02
            delay = due - loop.time()
            if delay > 0:
                await asyncio.sleep(delay)
            worst_late = max(worst_late, (loop.time() - due) * 1000)
            i = (k * FRAME_BYTES) % (len(audio) - FRAME_BYTES)
            yield pb.ConverseRequest(audio=pb.AudioChunk(data=audio[i : i + FRAME_BYTES]))

    async for r in stub.Converse(gen()):
        if r.WhichOneof("event") == "speech" and r.speech.type == pb.SpeechEvent.SPEECH_END:
            ideal = t0 + (r.speech.offset_ms + END_SILENCE_MS) / 1000
            worst_lag = max(worst_lag, (loop.time() - ideal) * 1000)
    return worst_late, worst_lag


async def run_n(target: str, pid: int, n: int, audio: bytes, seconds: float) -> dict[str, float]:
    async with grpc.aio.insecure_channel(target) as ch:
        stub = pb_grpc.VoiceGatewayStub(ch)
        loop = asyncio.get_running_loop()
        start_at = loop.time() + 0.5
        cpu0, wall0 = cpu_seconds(pid), time.monotonic()
        results = await asyncio.gather(
            *(one_stream(stub, audio, seconds, start_at + (i % 50) * 0.0004) for i in range(n))
        )
        cpu1, wall1 = cpu_seconds(pid), time.monotonic()
    cpu = cpu1 - cpu0
    return {
        "n": n,
        "cpu_s_per_stream_min": cpu / (n * seconds / 60),
        "server_cores": cpu / (wall1 - wall0),
        "late_ms": max(r[0] for r in results),
        "lag_ms": max(r[1] for r in results),
        "median_lag_ms": median(r[1] for r in results),
    }


class Bisection:
    """Largest N a model holds: double from ``start`` while it holds, then bisect."""

    def __init__(self, start: int, max_n: int, resolution: int) -> None:
        self.good = 0  # largest N held so far
        self.bad: int | None = None  # smallest N not held
        self.start, self.max_n, self.resolution = start, max_n, resolution

    def next_n(self) -> int | None:
        """The next N to probe, or None when the search is over."""
        if self.bad is None:
            if self.good >= self.max_n:
                return None
            return min(self.max_n, self.start if self.good == 0 else 2 * self.good)
        if self.bad - self.good <= self.resolution:
            return None
        return (self.good + self.bad) // 2

    def record(self, n: int, held: bool) -> None:
        if held:
            self.good = max(self.good, n)
        else:
            self.bad = n if self.bad is None else min(self.bad, n)


def start_server(model: str) -> tuple[subprocess.Popen[str], str]:
    """A VAD-only ``voxgate serve`` with ``vad.model`` set; returns it and its address.

    The end refinement is off: it moves the *reported* SPEECH_END back over Silero's trailing
    noise frames (up to 160 ms) without sending the event any earlier, and the lag below is
    measured from that reported offset, so with it on a server that keeps up reads as ~100 ms
    late on every utterance (silero, 2 streams on 0.1 of a core: worst lag 128 ms with it on,
    28 ms off), and the bisection stopped at 0. Its cost is a scan of at most 8 frames once
    per utterance.
    """
    env = {**os.environ, "VOXGATE_VAD__MODEL": model, "VOXGATE_VAD__END_REFINE": "off"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "voxgate.cli", "serve", "--port", "0", "--engines", "none"],
        stdout=subprocess.PIPE,
        text=True,
        env=env,
    )
    assert proc.stdout is not None
    m = re.fullmatch(r"listening on (\S+)\n", proc.stdout.readline())
    assert m, f"server ({model}) did not start"
    return proc, m.group(1)


def probe(target: str, pid: int, n: int, audio: bytes, seconds: float) -> dict[str, float]:
    row = asyncio.run(run_n(target, pid, n, audio, seconds))
    row["held"] = float(
        row["server_cores"] <= 1.0 and row["late_ms"] <= 100 and row["lag_ms"] <= 100
    )
    return row


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seconds", type=float, default=15.0)
    ap.add_argument("--models", default="webrtc,silero")
    ap.add_argument("--cpu-n", type=int, default=16, help="N for the CPU-per-stream comparison")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--start-n", type=int, default=8)
    ap.add_argument("--max-n", type=int, default=256)
    ap.add_argument("--resolution", type=int, default=4, help="bisection stops this close")
    args = ap.parse_args()
    audio = call_audio()
    # A SIGTERM (timeout, Ctrl-C in a pipeline) still stops the servers in `finally`.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    models = [m for m in args.models.split(",") if m]
    servers = {m: start_server(m) for m in models}
    cpu: dict[str, list[float]] = {m: [] for m in models}
    rows: dict[str, list[dict[str, float]]] = {m: [] for m in models}

    def show(model: str, row: dict[str, float]) -> None:
        print(
            f"{model:7s} N={row['n']:4.0f}  cpu/stream-min={row['cpu_s_per_stream_min']:.3f}s  "
            f"server={row['server_cores']:.2f} cores  late={row['late_ms']:.0f}ms  "
            f"lag={row['lag_ms']:.0f}ms (median {row['median_lag_ms']:.0f})  "
            f"{'held' if row['held'] else 'NOT held'}",
            flush=True,
        )

    try:
        for _ in range(args.repeats):
            for m in models:
                proc, target = servers[m]
                row = probe(target, proc.pid, args.cpu_n, audio, args.seconds)
                cpu[m].append(row["cpu_s_per_stream_min"])
                show(m, row)
        searches = {m: Bisection(args.start_n, args.max_n, args.resolution) for m in models}
        while any(s.next_n() is not None for s in searches.values()):
            for m in models:
                n = searches[m].next_n()
                if n is None:
                    continue
                proc, target = servers[m]
                row = probe(target, proc.pid, n, audio, args.seconds)
                searches[m].record(n, bool(row["held"]))
                rows[m].append(row)
                show(m, row)
    finally:
        for proc, _ in servers.values():
            proc.send_signal(signal.SIGTERM)
            proc.communicate(timeout=30)
    base = median(cpu[models[0]])
    print()
    print(
        f"| model | server CPU s / stream-min at N={args.cpu_n} (median of {args.repeats}) "
        f"| ratio to {models[0]} | streams one core's CPU covers (60 / CPU) "
        "| largest N held (bisection) | bisection bracket |"
    )
    print("|---|---:|---:|---:|---:|---|")
    for m in models:
        s = searches[m]
        c = median(cpu[m])
        bracket = f"{s.good} held, {s.bad} not" if s.bad is not None else f"{s.good} held"
        print(f"| {m} | {c:.3f} | {c / base:.2f}x | {60 / c:.0f} | {s.good} | {bracket} |")
    print("\nprobes (N, CPU s / stream-min, server cores, worst late ms, worst lag ms, held):")
    for m in models:
        for r in rows[m]:
            print(
                f"  {m:7s} {r['n']:4.0f}  {r['cpu_s_per_stream_min']:.3f}  "
                f"{r['server_cores']:.2f}  {r['late_ms']:.0f}  {r['lag_ms']:.0f}  "
                f"{'held' if r['held'] else 'NOT held'}"
            )


if __name__ == "__main__":
    main()
