"""The gateway's recognition metrics count one final per utterance.

With smart turns a turn of two or more utterances is decoded again as one
(``session.turns.whole_text``, gateway/call/turn_taking.py): a bulk final over speech whose
utterances already had their finals. Counted as a final it made ``voxgate_utterances_total``
read one utterance more per such turn and mixed a long spare-capacity decode into the finals'
latency histogram. It is counted as kind ``turn``. A FAKE engine behind the real batcher and
transcriber; the session's side (that the request is named so) is in tests/test_turns_session.py.

The recogniser counts model requests, not utterances: it cannot tell whether the call used a
final decode (a speculation done before the caller went on is decoded again). The call counts
each utterance once, from the decode its final came from (tests/test_session.py).
"""

from __future__ import annotations

import numpy as np
import pytest

from voxgate.engines.asr.base import AsrOptions, AsrRequest, AsrResult
from voxgate.gateway.metrics import GatewayMetrics
from voxgate.gateway.testing.batched import FakeBatchedAsrHub, fake_result
from voxgate.gateway.testing.fake_engines import FakeBatchEngine
from voxgate.gateway.testing.signals import stats_for

pytestmark = pytest.mark.unit


async def test_a_turn_decoded_whole_is_counted_apart_from_finals_and_utterances() -> None:
    metrics = GatewayMetrics()
    hub = FakeBatchedAsrHub([FakeBatchEngine[AsrRequest, AsrResult](fake_result)])
    await hub.start(metrics)
    assert hub.transcriber is not None
    audio = np.zeros(16000, np.float32)
    stats = stats_for(audio)
    try:
        for request in (
            AsrRequest(audio, stats, AsrOptions(), is_final=False, utterance=0),
            AsrRequest(audio, stats, AsrOptions(), utterance=0),
            AsrRequest(audio, stats, AsrOptions(), utterance=1),
            AsrRequest(audio, stats, AsrOptions(), bulk=True, utterance="turn", whole_turn=True),
        ):
            await hub.transcriber.transcribe(request)
    finally:
        await hub.aclose()

    def requests(kind: str) -> float:
        return metrics.value("voxgate_asr_model_requests_total", model="", kind=kind, outcome="ok")

    def decodes_timed(kind: str) -> float:
        return metrics.value("voxgate_asr_model_latency_seconds_count", model="", kind=kind)

    assert (requests("interim"), requests("final"), requests("turn")) == (1, 2, 1)
    assert (decodes_timed("final"), decodes_timed("turn")) == (2, 1)
    utterances = sum(
        s.value
        for m in metrics.registry.collect()
        if m.name == "voxgate_utterances"
        for s in m.samples
        if s.name == "voxgate_utterances_total"
    )
    assert utterances == 0  # the call counts them, where it sends the final
