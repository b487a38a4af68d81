"""``voxgate_asr_fallbacks_total``: the engine's retry steps, counted per model by the gateway.

Each retry (a re-encode on the full window, a hotter sample, the runner-up language) costs about
one more decode, and a model adapted to short windows should need fewer ``window`` steps: the
metric is how an operator sees it. The steps come from the engine's result
(``AsrResult.fallbacks``; tests/test_asr_utterance_windows.py shows the real engine filling
it); here a FAKE engine behind the real batcher and transcriber reports them, and the counter
must follow, by model and kind.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from voxgate.engines.asr.base import AsrOptions, AsrRequest, AsrResult
from voxgate.gateway.metrics import GatewayMetrics
from voxgate.gateway.runtime import AsrTranscriber, BatchMetrics
from voxgate.gateway.scheduling import Batcher, BatchPolicy
from voxgate.gateway.testing.batched import fake_result
from voxgate.gateway.testing.fake_engines import FakeBatchEngine
from voxgate.gateway.testing.signals import stats_for

pytestmark = pytest.mark.unit


def retried(request: AsrRequest) -> AsrResult:
    """The fake's result, with the retries a final of a named model took."""
    steps = ("window", "temperature", "temperature") if request.is_final else ()
    return replace(fake_result(request), fallbacks=steps)


async def test_every_retry_step_is_counted_by_model_and_kind() -> None:
    metrics = GatewayMetrics()
    engine = FakeBatchEngine[AsrRequest, AsrResult](retried)
    batcher: Batcher[AsrRequest, AsrResult] = Batcher(
        [engine], BatchPolicy(max_batch_size=1), observer=BatchMetrics(metrics), name="t"
    )
    audio = np.zeros(16000, np.float32)
    async with batcher:
        asr = AsrTranscriber(batcher, 1, lambda prompt, words: (), metrics, default_model="base")
        for model, final in (("support@2", True), ("support@2", True), ("", True), ("", False)):
            options = AsrOptions(model=model)
            await asr.transcribe(AsrRequest(audio, stats_for(audio), options, is_final=final))

    def count(model: str, kind: str, step: str) -> float:
        return metrics.value("voxgate_asr_fallbacks_total", model=model, kind=kind, step=step)

    assert count("support", "final", "window") == 2  # by name: generations share it
    assert count("support", "final", "temperature") == 4
    assert count("base", "final", "window") == 1
    assert count("base", "interim", "window") == 0
    assert count("support", "final", "language") == 0
