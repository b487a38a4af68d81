"""The baseline of benchmarks/framework_latency.py: voxgate's own client, no framework.

Imported by the framework workers (each runs in its framework's environment, so both paths
of a comparison share one process, one client library and one protobuf runtime). Only
voxgate_client and numpy here: no server, no framework.

Latency on the audio clock: audio is paced at ``speed`` x real time from ``t0``; the audio a
transcript covers ends at ``t0 + end_ms / speed``; its latency is its arrival minus that.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from voxgate_client import CallConfig, Pacing, Transcript, VoxgateClient, WireAudio, stream_audio

#: Silence appended to every clip so the server's VAD ends the utterance on its own.
TAIL_S = 1.5


def with_tail(pcm: np.ndarray, rate: int) -> np.ndarray:
    return np.concatenate([pcm, np.zeros(int(TAIL_S * rate), np.int16)])


def stt_config(rate: int) -> CallConfig:
    return CallConfig(
        sample_rate_hz=rate, interim_results=True, word_timestamps=True, language="en"
    )


def rows_from_transcripts(
    path: str, clip: str, seen: list[tuple[float, Transcript]], t0: float, speed: float
) -> list[dict[str, Any]]:
    """One row per utterance: first transcript (interim or final) and final latency, ms."""
    rows: dict[int, dict[str, Any]] = {}
    for arrived, t in seen:
        due = t0 + t.end_ms / 1000 / speed
        row = rows.setdefault(
            t.utterance_index, {"path": path, "clip": clip, "utt": t.utterance_index}
        )
        if "first_ms" not in row:
            row["first_ms"] = (arrived - due) * 1000
        if t.is_final:
            row["final_ms"] = (arrived - due) * 1000
            row["adapter_ms"] = (arrived - t.received_s) * 1000
    return [r for r in rows.values() if "final_ms" in r]


async def direct_stt(target: str, clip: str, pcm: np.ndarray, rate: int, speed: float) -> list:
    loop = asyncio.get_running_loop()
    seen: list[tuple[float, Transcript]] = []
    async with VoxgateClient(target) as client:
        call = await client.recognize(stt_config(rate))

        async def read() -> None:
            async for ev in call:
                if isinstance(ev, Transcript) and ev.text.strip():
                    seen.append((loop.time(), ev))

        reader = asyncio.create_task(read())
        t0 = loop.time()
        audio = WireAudio(with_tail(pcm, rate).tobytes(), "linear16", rate)
        await stream_audio(call, audio, Pacing(speed, 0.0), chunk_ms=100)
        await call.hangup()
        await reader
    return rows_from_transcripts("client", clip, seen, t0, speed)


async def direct_tts(client: VoxgateClient, text: str, rate: int) -> float:
    """Synthesize request sent -> first audio chunk, ms (read to the end, as a player would)."""
    t0 = time.perf_counter()
    first = None
    async for chunk in client.synthesize(text, sample_rate_hz=rate):
        if chunk.data and first is None:
            first = time.perf_counter() - t0
    assert first is not None
    return first * 1000


#: perf_counter() of the first audio chunk of each Synthesize, as the client library yields it
#: (filled once :func:`record_first_chunks` has wrapped the client).
FIRST_CHUNKS: list[float] = []


def record_first_chunks() -> None:
    """Wrap ``VoxgateClient.synthesize`` so each stream notes when its first audio arrived.

    The adapters call the same method, so a framework's first frame minus this instant is the
    adapter's and the framework's own share of time to first audio, free of the server's noise.
    """
    original = VoxgateClient.synthesize

    async def synthesize(self: VoxgateClient, *args: Any, **kwargs: Any) -> Any:
        first = True
        async for chunk in original(self, *args, **kwargs):
            if first and chunk.data:
                FIRST_CHUNKS.append(time.perf_counter())
                first = False
            yield chunk

    VoxgateClient.synthesize = synthesize  # type: ignore[method-assign]


async def paced(frames: list[Any], speed: float, chunk_s: float, push: Callable) -> float:
    """Push frames on an absolute clock at ``speed``; returns t0 (the loop time of the first)."""
    loop = asyncio.get_running_loop()
    t0 = loop.time()
    for i, f in enumerate(frames):
        delay = t0 + i * chunk_s / speed - loop.time()
        if delay > 0:
            await asyncio.sleep(delay)
        await push(f)
    return t0
