"""Worker of benchmarks/framework_latency.py, run with the LiveKit Agents environment's python.

Prints one JSON object per line, like framework_latency_pipecat.py: STT rows per utterance and
TTS time to first audio, through the plugin's streams and through voxgate's own client,
alternating.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
from typing import Any

from _framework_direct import (
    FIRST_CHUNKS,
    direct_stt,
    direct_tts,
    paced,
    record_first_chunks,
    with_tail,
)
from livekit import rtc
from livekit.agents import stt
from livekit.plugins import voxgate

from voxgate_client import VoxgateClient, read_wav


async def livekit_stt(target: str, clip: str, pcm: Any, rate: int, speed: float) -> list:
    loop = asyncio.get_running_loop()
    engine = voxgate.STT(target=target, language="en", sample_rate=rate)
    stream = engine.stream()
    audio = with_tail(pcm, rate)
    step = rate // 10
    frames = [
        rtc.AudioFrame(audio[i : i + step].tobytes(), rate, 1, len(audio[i : i + step]))
        for i in range(0, len(audio), step)
    ]
    seen: list[tuple[float, Any]] = []
    t0 = 0.0

    async def push() -> None:
        nonlocal t0

        async def one(f: rtc.AudioFrame) -> None:
            stream.push_frame(f)

        t0 = await paced(frames, speed, 0.1, one)
        stream.end_input()

    pusher = asyncio.create_task(push())
    async for ev in stream:
        if ev.type in (
            stt.SpeechEventType.INTERIM_TRANSCRIPT,
            stt.SpeechEventType.FINAL_TRANSCRIPT,
        ):
            seen.append((loop.time(), ev))
    await pusher
    await engine.aclose()
    rows: dict[int, dict[str, Any]] = {}
    for arrived, ev in seen:
        data = ev.alternatives[0]
        meta = data.metadata or {}
        due = t0 + data.end_time / speed
        row = rows.setdefault(
            meta["utterance_index"],
            {"path": "livekit", "clip": clip, "utt": meta["utterance_index"]},
        )
        row.setdefault("first_ms", (arrived - due) * 1000)
        if ev.type == stt.SpeechEventType.FINAL_TRANSCRIPT:
            row["final_ms"] = (arrived - due) * 1000
            row["adapter_ms"] = (arrived - meta["received_s"]) * 1000
    return [r for r in rows.values() if "final_ms" in r]


async def tts_rows(target: str, texts: list[str], rate: int) -> list[dict[str, Any]]:
    """Time to first audio through ``TTS.stream()`` and directly, alternating; both warmed."""
    engine = voxgate.TTS(target=target, sample_rate=rate)
    shares: list[float] = []

    async def via_plugin(text: str) -> float:
        t0 = time.perf_counter()
        first = None
        stream = engine.stream()
        stream.push_text(text)
        stream.end_input()
        async for _ in stream:
            if first is None:
                first = time.perf_counter() - t0
                shares.append((t0 + first - FIRST_CHUNKS[-1]) * 1000)
        assert first is not None
        return first * 1000

    rows: list[dict[str, Any]] = []
    async with VoxgateClient(target) as client:
        await via_plugin("Hello.")
        await direct_tts(client, "Hello.", rate)
        for i, text in enumerate(texts):
            order = ["livekit", "client"] if i % 2 == 0 else ["client", "livekit"]
            for path in order:
                row: dict[str, Any] = {"path": path, "chars": len(text)}
                if path == "livekit":
                    row["ttfa_ms"] = await via_plugin(text)
                    row["adapter_ms"] = shares[-1]
                else:
                    row["ttfa_ms"] = await direct_tts(client, text, rate)
                rows.append(row)
    await engine.aclose()
    return rows


async def main() -> None:
    record_first_chunks()
    ap = argparse.ArgumentParser()
    ap.add_argument("--target", required=True)
    ap.add_argument("--speed", type=float, default=2.0)
    ap.add_argument("--clips", nargs="+", required=True)
    ap.add_argument("--texts", nargs="+", required=True)
    ap.add_argument("--repeats", type=int, default=1)
    args = ap.parse_args()
    for _ in range(args.repeats):
        for i, path in enumerate(args.clips):
            pcm, rate = read_wav(path)
            clip = path.rsplit("/", 1)[-1]
            order = [direct_stt, livekit_stt] if i % 2 == 0 else [livekit_stt, direct_stt]
            for fn in order:
                for row in await fn(args.target, clip, pcm, rate, args.speed):
                    print(json.dumps({"kind": "stt", "framework": "livekit", **row}), flush=True)
        for row in await tts_rows(args.target, args.texts, 24000):
            print(json.dumps({"kind": "tts", "framework": "livekit", **row}), flush=True)


if __name__ == "__main__":
    asyncio.run(main())
