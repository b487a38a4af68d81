"""The earlier synthesis path, a plain FIFO thread pool, kept here as a benchmark baseline only.

Until v0.3 the gateway could run replies this way (``session.tts_scheduling: fifo``): each
reply's fixed-schedule generator advanced a window at a time on a thread pool, in the order
the ``next()`` calls arrived, with no deadlines. Production code runs the deadline scheduler
only; the TTS benchmarks still set it beside this pool to show what the scheduler buys.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from voxgate.engines.tts import SpeakOptions, TtsChunk
from voxgate.gateway.base import TtsPiece
from voxgate.gateway.events import SpeakIn
from voxgate.gateway.metrics import GatewayMetrics
from voxgate.gateway.runtime import EngineHubImpl

_END = object()


class FifoSynthesizer:
    """The gateway's Synthesizer contract over a FIFO pool of ``threads`` threads."""

    def __init__(self, streamer: Any, threads: int) -> None:
        self.streamer = streamer
        self.sample_rate_hz: int = streamer.sample_rate_hz
        self.max_text_chars: int = streamer.max_text_chars
        self.scheduler = None  # no deadline scheduler here (benchmarks read it)
        self._pool = ThreadPoolExecutor(max_workers=threads, thread_name_prefix="tts-fifo")

    async def stream(self, speak: SpeakIn, stats: object = None) -> AsyncIterator[TtsPiece]:
        """Each ``next()`` of the reply's generator on a pool thread, in arrival order."""
        options = SpeakOptions(
            length_scale=1.0 / speak.rate if speak.rate else None,
            speaker_id=speak.speaker_id or None,
            voice=speak.voice or None,
        )
        loop = asyncio.get_running_loop()
        it = await loop.run_in_executor(self._pool, self.streamer.stream, speak.text, options)
        while True:
            chunk = await loop.run_in_executor(self._pool, next, it, _END)
            if chunk is _END:
                return
            assert isinstance(chunk, TtsChunk)
            yield TtsPiece(
                samples=chunk.samples,
                words=tuple((w.text, round(w.end_ms)) for w in chunk.words),
                is_last=chunk.is_last,
            )

    async def aclose(self) -> None:
        """Stop the threads."""
        await asyncio.to_thread(self._pool.shutdown, wait=True, cancel_futures=True)


class FifoHub(EngineHubImpl):
    """The gateway's engines with the FIFO pool in place of the deadline scheduler."""

    def __init__(self, *args: Any, threads: int, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._fifo_threads = threads
        self._fifo: FifoSynthesizer | None = None

    async def start(self, metrics: GatewayMetrics) -> None:
        """Load as the gateway does, then serve replies through the pool."""
        await super().start(metrics)
        assert self._streamer is not None
        self._fifo = FifoSynthesizer(self._streamer, self._fifo_threads)
        self.synthesizer = self._fifo

    async def aclose(self) -> None:
        """Stop the pool, then the engines."""
        if self._fifo is not None:
            await self._fifo.aclose()
        await super().aclose()
