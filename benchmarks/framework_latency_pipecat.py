"""Worker of benchmarks/framework_latency.py, run with the Pipecat environment's python.

Prints one JSON object per line: STT rows (path client|pipecat, per utterance) and TTS rows
(path client|pipecat, time to first audio). The two paths alternate clip by clip.
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
    rows_from_transcripts,
    with_tail,
)
from pipecat.frames.frames import (
    EndFrame,
    Frame,
    InputAudioRawFrame,
    TTSAudioRawFrame,
    TTSSpeakFrame,
    TTSStoppedFrame,
)
from pipecat.pipeline.pipeline import Pipeline
from pipecat.pipeline.worker import PipelineParams, PipelineWorker
from pipecat.processors.frame_processor import FrameDirection, FrameProcessor
from pipecat.workers.runner import WorkerRunner
from pipecat_voxgate import VoxgateSTTService, VoxgateSTTSettings, VoxgateTTSService

from voxgate_client import Transcript, VoxgateClient, read_wav


class Sink(FrameProcessor):
    """The pipeline's last processor: notes when each frame of interest reaches it."""

    def __init__(self) -> None:
        super().__init__()
        self.transcripts: list[tuple[float, Transcript]] = []
        self.first_audio: float | None = None
        self.stopped = asyncio.Event()

    async def process_frame(self, frame: Frame, direction: FrameDirection) -> None:
        await super().process_frame(frame, direction)
        now = asyncio.get_running_loop().time()
        result = getattr(frame, "result", None)
        if isinstance(result, Transcript) and result.text.strip():
            self.transcripts.append((now, result))
        if isinstance(frame, TTSAudioRawFrame) and self.first_audio is None:
            self.first_audio = time.perf_counter()
        if isinstance(frame, TTSStoppedFrame):
            self.stopped.set()
        await self.push_frame(frame, direction)


async def run_pipeline(processors: list[FrameProcessor], rate: int, body: Any) -> None:
    worker = PipelineWorker(
        Pipeline(processors),
        params=PipelineParams(audio_in_sample_rate=rate, audio_out_sample_rate=rate),
        cancel_on_idle_timeout=False,
    )
    started = asyncio.Event()

    @worker.event_handler("on_pipeline_started")
    async def _started(worker: PipelineWorker, frame: Frame) -> None:
        started.set()

    async def drive() -> None:
        await started.wait()
        await body(worker)
        await worker.queue_frame(EndFrame())

    runner = WorkerRunner()
    await runner.add_workers(worker)
    await asyncio.gather(runner.run(), drive())


async def pipecat_stt(target: str, clip: str, pcm: Any, rate: int, speed: float) -> list:
    stt = VoxgateSTTService(
        target=target,
        audio_passthrough=False,
        sample_rate=rate,
        settings=VoxgateSTTSettings(language="en"),
    )
    sink = Sink()
    audio = with_tail(pcm, rate)
    step = rate // 10
    frames = [
        InputAudioRawFrame(audio[i : i + step].tobytes(), rate, 1)
        for i in range(0, len(audio), step)
    ]
    t0 = 0.0

    async def body(worker: PipelineWorker) -> None:
        nonlocal t0
        t0 = await paced(frames, speed, 0.1, worker.queue_frame)

    await run_pipeline([stt, sink], rate, body)
    return rows_from_transcripts("pipecat", clip, sink.transcripts, t0, speed)


async def tts_rows(target: str, texts: list[str], rate: int) -> list[dict[str, Any]]:
    """Time to first audio, through the pipeline and directly, alternating text by text.

    Both paths use a channel that has already carried one request (a warm-up sentence), so
    neither pays the connection set-up.
    """
    tts = VoxgateTTSService(target=target)
    sink = Sink()
    rows: list[dict[str, Any]] = []
    shares: list[float] = []

    async def via_pipeline(worker: PipelineWorker, text: str) -> float:
        sink.first_audio = None
        sink.stopped.clear()
        t0 = time.perf_counter()
        await worker.queue_frame(TTSSpeakFrame(text))
        await asyncio.wait_for(sink.stopped.wait(), 120)
        assert sink.first_audio is not None
        shares.append((sink.first_audio - FIRST_CHUNKS[-1]) * 1000)
        return (sink.first_audio - t0) * 1000

    async def body(worker: PipelineWorker) -> None:
        async with VoxgateClient(target) as client:
            await via_pipeline(worker, "Hello.")
            await direct_tts(client, "Hello.", rate)
            for i, text in enumerate(texts):
                pair = [("pipecat", via_pipeline(worker, text)), ("client", None)]
                if i % 2:
                    pair.reverse()
                for path, coro in pair:
                    ms = await coro if coro is not None else await direct_tts(client, text, rate)
                    row = {"path": path, "ttfa_ms": ms, "chars": len(text)}
                    if path == "pipecat":
                        row["adapter_ms"] = shares[-1]
                    rows.append(row)

    await run_pipeline([tts, sink], rate, body)
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
            # Alternate which path goes first, so neither always meets a warmer server.
            order = [direct_stt, pipecat_stt] if i % 2 == 0 else [pipecat_stt, direct_stt]
            for fn in order:
                for row in await fn(args.target, clip, pcm, rate, args.speed):
                    print(json.dumps({"kind": "stt", "framework": "pipecat", **row}), flush=True)
        for row in await tts_rows(args.target, args.texts, 24000):
            print(json.dumps({"kind": "tts", "framework": "pipecat", **row}), flush=True)


if __name__ == "__main__":
    asyncio.run(main())
