"""A Pipecat pipeline that hears a recording through voxgate and answers it in voxgate's voice.

    python examples/answer_a_recording.py --target 127.0.0.1:50051 [IN.wav] [--out reply.wav]

Input audio (default: the client's bundled two-sentence sample call) is fed at real time, as a
transport would; each final transcript is answered with a ``TTSSpeakFrame``; the replies are
written to ``--out``. In a real bot a transport (Daily, WebRTC, Twilio) takes the place of the
file, and an LLM the place of ``Answer``.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import wave

from loguru import logger

# Pipecat logs at DEBUG to stderr (every link and frame); this example shows warnings and
# errors only. Set before Pipecat is imported, which logs its banner then.
logger.remove()
logger.add(sys.stderr, level="WARNING")

from pipecat.frames.frames import (  # noqa: E402
    EndFrame,
    Frame,
    InputAudioRawFrame,
    TranscriptionFrame,
    TTSAudioRawFrame,
    TTSSpeakFrame,
)
from pipecat.pipeline.pipeline import Pipeline  # noqa: E402
from pipecat.pipeline.worker import PipelineParams, PipelineWorker  # noqa: E402
from pipecat.processors.frame_processor import FrameDirection, FrameProcessor  # noqa: E402
from pipecat.workers.runner import WorkerRunner  # noqa: E402
from pipecat_voxgate import VoxgateSTTService, VoxgateSTTSettings, VoxgateTTSService  # noqa: E402

from voxgate_client import read_wav, sample_call_path  # noqa: E402


class Answer(FrameProcessor):
    """Stands in for the LLM: answers every final transcript."""

    async def process_frame(self, frame: Frame, direction: FrameDirection) -> None:
        """Pass every frame on; after a final transcript, ask the TTS for a reply."""
        await super().process_frame(frame, direction)
        await self.push_frame(frame, direction)
        if isinstance(frame, TranscriptionFrame):
            print(f"caller: {frame.text}", flush=True)
            await self.push_frame(TTSSpeakFrame(f"You said: {frame.text}"))


class Recorder(FrameProcessor):
    """Stands in for the output transport: keeps the bot's audio."""

    def __init__(self) -> None:
        super().__init__()
        self.audio = bytearray()
        self.rate = 0

    async def process_frame(self, frame: Frame, direction: FrameDirection) -> None:
        """Keep the reply audio and pass every frame on."""
        await super().process_frame(frame, direction)
        if isinstance(frame, TTSAudioRawFrame):
            self.audio += frame.audio
            self.rate = frame.sample_rate
        await self.push_frame(frame, direction)


async def main() -> None:
    """Run the pipeline over the recording, then write the replies."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("wav", nargs="?", default=sample_call_path())
    ap.add_argument("--target", default="127.0.0.1:50051", help="voxgate host:port")
    ap.add_argument("--out", default="reply.wav")
    args = ap.parse_args()

    pcm, rate = read_wav(args.wav)
    stt = VoxgateSTTService(
        target=args.target, settings=VoxgateSTTSettings(language="en"), audio_passthrough=False
    )
    tts = VoxgateTTSService(target=args.target)
    recorder = Recorder()
    pipeline = Pipeline([stt, Answer(), tts, recorder])
    worker = PipelineWorker(
        pipeline,
        params=PipelineParams(audio_in_sample_rate=rate, audio_out_sample_rate=24000),
        cancel_on_idle_timeout=False,
    )
    started = asyncio.Event()

    @worker.event_handler("on_pipeline_started")
    async def _started(worker: PipelineWorker, frame: Frame) -> None:
        started.set()

    async def feed() -> None:
        await started.wait()
        step = rate // 10  # 100 ms frames, at real time
        for i in range(0, len(pcm), step):
            await worker.queue_frame(InputAudioRawFrame(pcm[i : i + step].tobytes(), rate, 1))
            await asyncio.sleep(0.1)
        await worker.queue_frame(EndFrame())

    runner = WorkerRunner()
    await runner.add_workers(worker)
    await asyncio.gather(runner.run(), feed())

    with wave.open(args.out, "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(recorder.rate or 24000)
        w.writeframes(bytes(recorder.audio))
    seconds = len(recorder.audio) / 2 / (recorder.rate or 24000)
    print(f"bot: {seconds:.1f} s of reply audio in {args.out}")


if __name__ == "__main__":
    asyncio.run(main())
