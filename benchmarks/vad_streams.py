"""How many real-time telephone streams one gateway process segments on one core.

N concurrent Converse streams each send 20 ms μ-law 8 kHz frames of a real call on an absolute
clock to a VAD-only server (``voxgate serve --engines none``) running in its own process, over
loopback. Reported per N:

* server CPU seconds per stream-minute (from /proc, the server process only);
* the server's share of one core;
* the worst frame lateness on the sending side (how far behind its real-time slot a frame left);
* the worst endpointing lag: SPEECH_END received minus (its offset + hangover), i.e. how late the
  server's speech events come compared with an infinitely fast server.

"Held" means: server ≤ 1 core, no frame late by more than 100 ms and endpointing lag ≤ 100 ms.

Usage: python benchmarks/vad_streams.py [--seconds 20] [--max-n 256]
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
from pcmcodec import MULAW_ENCODE, float_to_pcm16, pcm16_to_float  # noqa: E402
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


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seconds", type=float, default=20.0)
    ap.add_argument("--max-n", type=int, default=256)
    ap.add_argument("--ns", default="", help="explicit N list, e.g. 32,48,56 (default: doubling)")
    args = ap.parse_args()
    audio = call_audio()
    proc = subprocess.Popen(
        [sys.executable, "-m", "cli", "serve", "--port", "0", "--engines", "none"],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None
    m = re.fullmatch(r"listening on (\S+)\n", proc.stdout.readline())
    assert m, "server did not start"
    target = m.group(1)
    rows = []
    try:
        ns = [int(x) for x in args.ns.split(",")] if args.ns else []
        n = ns.pop(0) if ns else 1
        while n <= args.max_n:
            row = asyncio.run(run_n(target, proc.pid, n, audio, args.seconds))
            row["held"] = float(
                row["server_cores"] <= 1.0 and row["late_ms"] <= 100 and row["lag_ms"] <= 100
            )
            rows.append(row)
            print(
                f"N={n:4d}  cpu/stream-min={row['cpu_s_per_stream_min']:.3f}s  "
                f"server={row['server_cores']:.2f} cores  late={row['late_ms']:.0f}ms  "
                f"lag={row['lag_ms']:.0f}ms (median {row['median_lag_ms']:.0f})  "
                f"{'held' if row['held'] else 'NOT held'}",
                flush=True,
            )
            if not row["held"] and not ns:
                break
            if args.ns:
                if not ns:
                    break
                n = ns.pop(0)
            else:
                n *= 2
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.communicate(timeout=30)
    held = [r for r in rows if r["held"]]
    print()
    print("| N streams | server CPU s / stream-min | server cores | worst late ms | worst lag ms |")
    print("|---:|---:|---:|---:|---:|")
    for r in rows:
        print(
            f"| {r['n']:.0f} | {r['cpu_s_per_stream_min']:.3f} | {r['server_cores']:.2f} | "
            f"{r['late_ms']:.0f} | {r['lag_ms']:.0f} |"
        )
    print(
        f"\nlargest N held at <= 1 core, nothing late > 100 ms: {held[-1]['n']:.0f}" if held else ""
    )


if __name__ == "__main__":
    main()
