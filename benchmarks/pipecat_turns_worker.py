"""Worker of benchmarks/pipecat_turns.py, run with the Pipecat environment's python.

Each clip goes at real time through a pipeline of the voxgate STT service (smart turns) and
Pipecat's own user aggregator (``LLMUserAggregator``, which takes its turn strategies from the
service's metadata); one JSON line per clip: the user messages the aggregator wrote to the
LLM context (what a bot's LLM reads), the server's EndOfTurn texts, and the turn's finals as
they came (what the service pushed as the turn's text before 2026-12-06).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import wave
from typing import Any

import numpy as np
from _framework_direct import paced
from framework_latency_pipecat import run_pipeline
from pipecat.frames.frames import Frame, InputAudioRawFrame, InterimTranscriptionFrame
from pipecat.pipeline.worker import PipelineWorker
from pipecat.processors.aggregators.llm_context import LLMContext
from pipecat.processors.aggregators.llm_response_universal import LLMUserAggregator
from pipecat.processors.frame_processor import FrameDirection, FrameProcessor
from pipecat_voxgate import VoxgateSTTService, VoxgateSTTSettings

from voxgate_client import EndOfTurn, Transcript

#: Silence after each clip, s: room for the last turn's end (the server holds a turn up to
#: its longest pause, then decides).
TAIL_S = 3.0


class Finals(FrameProcessor):
    """Between the service and the aggregator: notes the finals the service shows as interims."""

    def __init__(self) -> None:
        super().__init__()
        self.finals: list[Transcript] = []

    async def process_frame(self, frame: Frame, direction: FrameDirection) -> None:
        await super().process_frame(frame, direction)
        if isinstance(frame, InterimTranscriptionFrame):
            result = frame.result
            if isinstance(result, Transcript) and result.is_final and result.text.strip():
                self.finals.append(result)
        await self.push_frame(frame, direction)


async def one_clip(target: str, path: str) -> dict[str, Any]:
    with wave.open(path) as w:
        rate = w.getframerate()
        pcm = np.frombuffer(w.readframes(w.getnframes()), "<i2")
    audio = np.concatenate([pcm, np.zeros(int(TAIL_S * rate), np.int16)])
    stt = VoxgateSTTService(
        target=target,
        audio_passthrough=False,
        sample_rate=rate,
        settings=VoxgateSTTSettings(language="en"),
        turn_detection="smart",
    )
    finals = Finals()
    user = LLMUserAggregator(LLMContext())
    messages: list[str] = []
    turns: list[EndOfTurn] = []

    @user.event_handler("on_user_turn_stopped")
    async def _stopped(_: Any, __: Any, message: Any) -> None:
        messages.append(message.content or "")

    @stt.event_handler("on_end_of_turn")
    async def _eot(_: Any, eot: EndOfTurn) -> None:
        turns.append(eot)

    step = rate // 10
    frames = [
        InputAudioRawFrame(audio[i : i + step].tobytes(), rate, 1)
        for i in range(0, len(audio), step)
    ]

    async def body(worker: PipelineWorker) -> None:
        await paced(frames, 1.0, 0.1, worker.queue_frame)

    await run_pipeline([stt, finals, user], rate, body)
    return {
        "messages": messages,
        "turn_texts": [t.text for t in turns],
        "finals": [t.text for t in finals.finals],
    }


async def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--target", required=True)
    ap.add_argument("--clips", nargs="+", required=True)
    args = ap.parse_args()
    for path in args.clips:
        row = await one_clip(args.target, path)
        print(json.dumps({"clip": path, **row}), flush=True)


if __name__ == "__main__":
    asyncio.run(main())
