"""Media-streams adapter under concurrent streams: its CPU per stream and the caller's playout.

The adapter runs as its own process (``voxgate media-streams``), so its CPU is measured alone
(``/proc/<pid>/stat``); the gateway runs in this process with the FAKE tone voice and no
recogniser, so the figures are the adapter's transport work, not speech synthesis. Each of N
replayed Twilio streams (``voxgate.bridges.media_streams.testing.ReplayClient``: real-time μ-law in,
playout on its own clock) gets a greeting of ``--reply-s`` seconds; rows:

* ``cpu ms/stream-s``: adapter CPU per second of stream (in and out both flowing);
* ``underruns``: times a stream's playout ran dry inside its one reply (each is a gap the
  caller hears), behind a jitter buffer of ``--jitter-ms`` (providers keep one);
* ``lead p95 ms``: the most audio queued ahead of playout, p95 over streams (the pacing bound
  is ``--lead-ms`` plus the jitter buffer);
* ``mark wait p50/p95 ms``: how long the reply-end mark waited in the replayer's buffer (the
  adapter's lead at the reply's end);
* ``complete``: streams whose whole reply was played and whose mark came back.

Side by side, interleaved per level: the adapter as shipped (``--gateway-chunk-ms 40``: two
provider chunks per gRPC write to the gateway) against the plain bridge a user would write first
(20: every provider chunk its own write), same settings otherwise.

Run: ``.venv/bin/python -m benchmarks.media_streams``
(``--streams 1,10,25,50`` by default; a few minutes).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks._stats import median, percentile
from voxgate.bridges.media_streams.testing import ReplayClient
from voxgate.gateway.testing.fake_engines import FakeToneHub
from voxgate.gateway.testing.server import running_server

TICKS = os.sysconf("SC_CLK_TCK")


def cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICKS  # utime + stime


async def one_stream(
    address: str, reply_s: float, listen_s: float, jitter_ms: int
) -> dict[str, Any]:
    async with ReplayClient(f"ws://{address}/twilio", playout_delay_ms=jitter_ms) as peer:
        await peer.begin()
        listening = asyncio.create_task(peer.send_silence(int(listen_s * 1000)))
        for _ in range(int(listen_s / 0.05)):
            if peer.returned:
                break
            await asyncio.sleep(0.05)
        listening.cancel()
        await asyncio.wait([listening])
        await peer.send_stop()
        await peer.wait_closed(30)
    mark = next((m for m in peer.returned if m.name.startswith("voxgate-reply-end:")), None)
    return {
        "complete": mark is not None
        and not mark.cleared
        and len(peer.played) >= int(reply_s * 8000),
        "underruns": max(0, peer.spurts - 1),
        "lead_ms": peer.max_queued_ms,
        "mark_wait_ms": mark.waited_s * 1000.0 if mark is not None else None,
        "violations": len(peer.violations),
    }


async def run_level(
    address: str, pid: int, n: int, reply_s: float, jitter_ms: int
) -> dict[str, Any]:
    listen_s = reply_s + 5.0
    cpu0, t0 = cpu_s(pid), time.monotonic()
    results = await asyncio.gather(
        *(one_stream(address, reply_s, listen_s, jitter_ms) for _ in range(n))
    )
    cpu1, t1 = cpu_s(pid), time.monotonic()
    waits = [r["mark_wait_ms"] for r in results if r["mark_wait_ms"] is not None]
    return {
        "streams": n,
        "complete": sum(r["complete"] for r in results),
        "cpu_ms_per_stream_s": 1000.0 * (cpu1 - cpu0) / (n * (t1 - t0)),
        "underruns": sum(r["underruns"] for r in results),
        "lead_p95_ms": percentile([r["lead_ms"] for r in results], 95),
        "mark_wait_p50_ms": median(waits) if waits else float("nan"),
        "mark_wait_p95_ms": percentile(waits, 95) if waits else float("nan"),
        "violations": sum(r["violations"] for r in results),
        "wall_s": t1 - t0,
    }


async def start_adapter(target: str, rules: Path, lead_ms: int, chunk_ms: int) -> Any:
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "voxgate.cli",
        "media-streams",
        "--listen",
        "127.0.0.1:0",
        "--gateway",
        target,
        "--bot",
        str(rules),
        "--lead-ms",
        str(lead_ms),
        "--gateway-chunk-ms",
        str(chunk_ms),
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.DEVNULL,
    )
    assert proc.stdout is not None
    line = (await asyncio.wait_for(proc.stdout.readline(), 120)).decode()
    return proc, line.split("ws://", 1)[1].strip()


async def main(argv: list[str] | None = None) -> list[dict[str, Any]]:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--streams", default="1,10,25,50", help="concurrent streams per row")
    ap.add_argument("--reply-s", type=float, default=8.0, help="greeting length, s (<= 10)")
    ap.add_argument("--lead-ms", type=int, default=100)
    ap.add_argument(
        "--jitter-ms",
        type=int,
        default=60,
        help="the replayer's jitter buffer: each talk spurt plays this long after it arrives",
    )
    ap.add_argument(
        "--chunk-ms",
        default="20,40",
        help="adapters to compare, by --gateway-chunk-ms (20: each provider chunk its own "
        "gRPC write, the plain bridge; 40: the default)",
    )
    args = ap.parse_args(argv)
    levels = [int(x) for x in args.streams.split(",")]
    variants = [int(x) for x in args.chunk_ms.split(",")]
    chars = max(1, min(100, round(args.reply_s * 10)))  # the fake voice: 100 ms per character
    reply_s = chars / 10
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory() as tmp:
        rules = Path(tmp) / "bot.yaml"
        rules.write_text(f"greeting: {'a' * chars}\n")
        # webrtcvad keeps the gateway's share of this machine small (transport is measured).
        async with running_server(hub=FakeToneHub(), vad={"model": "webrtc"}) as srv:
            adapters = [await start_adapter(srv.target, rules, args.lead_ms, ms) for ms in variants]
            try:
                for i, n in enumerate(levels):
                    # Interleaved, the order flipped per level: the machine is noisy.
                    order = list(range(len(variants)))
                    if i % 2:
                        order.reverse()
                    for k in order:
                        proc, address = adapters[k]
                        row = await run_level(address, proc.pid, n, reply_s, args.jitter_ms)
                        row["chunk_ms"] = variants[k]
                        rows.append(row)
            finally:
                for proc, _ in adapters:
                    proc.terminate()
                    await proc.wait()
    rows.sort(key=lambda r: (r["streams"], r["chunk_ms"]))
    print(
        f"adapter --lead-ms {args.lead_ms}; reply {reply_s:g} s of the fake tone voice; "
        f"replayer jitter buffer {args.jitter_ms} ms"
    )
    print(
        "| streams | gateway chunk ms | complete | adapter cpu ms/stream-s | underruns "
        "| lead p95 ms | mark wait p50 / p95 ms | violations |"
    )
    print("|---:|---:|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        print(
            f"| {r['streams']} | {r['chunk_ms']} | {r['complete']} | "
            f"{r['cpu_ms_per_stream_s']:.2f} | {r['underruns']} | {r['lead_p95_ms']:.0f} | "
            f"{r['mark_wait_p50_ms']:.0f} / {r['mark_wait_p95_ms']:.0f} | {r['violations']} |"
        )
    return rows


if __name__ == "__main__":
    asyncio.run(main())
