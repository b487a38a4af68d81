"""A FAKE recogniser behind the REAL batcher: for admission, overload and hung-engine tests.

:class:`FakeBatchedAsrHub` runs :class:`~voxgate.gateway.testing.fake_engines.FakeBatchEngine`
workers through the production :class:`~voxgate.gateway.scheduling.Batcher` and
:class:`~voxgate.gateway.runtime.AsrTranscriber` with the production metrics observer, so queueing,
batch timeouts, worker replacement and the measurements admission reads are all real; only the
model is fake (its latency is whatever the test sets). Never evidence that recognition works.
"""

from __future__ import annotations

from collections.abc import Sequence

from voxgate.engines.asr.base import AsrRequest, AsrResult
from voxgate.gateway.base import EngineInfo, ModelDescription, Synthesizer, Transcriber
from voxgate.gateway.metrics import GatewayMetrics
from voxgate.gateway.runtime import AsrTranscriber, BatchMetrics
from voxgate.gateway.scheduling import Batcher, BatchPolicy
from voxgate.gateway.testing.fake_engines import FakeBatchEngine

__all__ = ["FakeBatchedAsrHub", "fake_result"]


def fake_result(request: AsrRequest) -> AsrResult:
    """What the fake engine says for every utterance: its length, so results are tellable."""
    return AsrResult(
        text=f"fake transcript of {len(request.audio) / 16000:.1f} s",
        confidence=0.9,
        language=request.options.language or "en",
        language_probability=1.0,
    )


class FakeBatchedAsrHub:
    """An engine hub: fake engine workers, the real batcher and transcriber, no voice.

    Args:
        engines: one per batcher worker (the same object twice = two threads over one).
        batch_timeout_s: the batcher's hung-engine limit (None = never).
        max_batch_size: the batch policy's limit.
        synthesizer: an optional (fake) voice to serve beside the recogniser.
    """

    def __init__(
        self,
        engines: Sequence[FakeBatchEngine[AsrRequest, AsrResult]],
        *,
        batch_timeout_s: float | None = None,
        max_batch_size: int = 1,
        synthesizer: Synthesizer | None = None,
    ) -> None:
        self.engines = list(engines)
        self._timeout_s = batch_timeout_s
        self._max_batch = max_batch_size
        self.transcriber: Transcriber | None = None
        self.synthesizer: Synthesizer | None = synthesizer
        self.batcher: Batcher[AsrRequest, AsrResult] | None = None
        self.info = EngineInfo(models=[ModelDescription(name="fake", family="fake")])

    async def start(self, metrics: GatewayMetrics) -> None:
        """Start the batcher over the fake workers, counting into ``metrics``."""
        batcher: Batcher[AsrRequest, AsrResult] = Batcher(
            self.engines,
            BatchPolicy(max_batch_size=self._max_batch),
            observer=BatchMetrics(metrics),
            name="fake-asr",
            batch_timeout_s=self._timeout_s,
            replace=lambda worker: self.engines[worker].sibling(),
        )
        metrics.engine_workers.labels("asr").set(len(self.engines))
        await batcher.start()
        self.batcher = batcher
        self.transcriber = AsrTranscriber(
            batcher, len(self.engines), lambda prompt, words: (), metrics
        )

    async def aclose(self) -> None:
        """Stop the batcher; hung fake calls are released so their threads can exit."""
        for engine in self.engines:
            engine.release()
        if self.batcher is not None:
            await self.batcher.aclose()
