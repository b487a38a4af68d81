"""A hung recogniser: its batch fails with DEADLINE_EXCEEDED as error events, the server goes on.

A real grpc.aio server on loopback; the recogniser is a FAKE engine behind the REAL batcher
(``voxgate.gateway.testing.batched``) whose first batch never returns until the test releases it,
with one worker, so that anything transcribed afterwards proves the worker was replaced.
"""

from __future__ import annotations

from pathlib import Path

import grpc
import pytest
from calls import chunks, config, encode_wav, requests

from voxgate.engines.asr.base import AsrRequest, AsrResult
from voxgate.gateway.testing.batched import FakeBatchedAsrHub, fake_result
from voxgate.gateway.testing.fake_engines import FakeBatchEngine
from voxgate.gateway.testing.server import running_server
from voxgate.v1 import voxgate_pb2 as pb
from voxgate.v1 import voxgate_pb2_grpc as pb_grpc

pytestmark = pytest.mark.e2e

OVERRIDES = {
    "limits": {"max_realtime_factor": 1000.0},
    "session": {"speculative_finals": False},
}


async def test_a_hung_batch_fails_its_utterance_and_the_calls_go_on(speech_dir: Path) -> None:
    engine: FakeBatchEngine[AsrRequest, AsrResult] = FakeBatchEngine(fake_result, hang_calls={0})
    hub = FakeBatchedAsrHub([engine], batch_timeout_s=0.5)
    wav = sorted((speech_dir / "calls").glob("call_02*.wav"))[0]  # four utterances
    audio = [config(), *chunks(encode_wav(wav, pb.LINEAR16, 16000), 640)]
    try:
        async with (
            running_server(hub=hub, **OVERRIDES) as srv,  # type: ignore[arg-type]
            grpc.aio.insecure_channel(srv.target) as ch,
        ):
            stub = pb_grpc.VoiceGatewayStub(ch)
            events = [e async for e in stub.Converse(requests(audio))]
            errors = [e.error for e in events if e.WhichOneof("event") == "error"]
            finals = [e.transcript for e in events if e.WhichOneof("event") == "transcript"]
            assert [(e.code, e.scope, e.utterance_index) for e in errors] == [
                (grpc.StatusCode.DEADLINE_EXCEEDED.value[0], "utterance", 0)
            ]
            assert "batch_timeout_s=0.5" in errors[0].message
            assert [t.utterance_index for t in finals] == [1, 2, 3]
            assert all(t.text.startswith("fake transcript") for t in finals)
            # The stuck call 0 still holds its thread; the later batches ran on another one.
            assert engine.calls == 4 and len(set(engine.thread_ids[1:])) == 1
            assert engine.thread_ids[0] not in engine.thread_ids[1:]
            assert srv.metrics.value("voxgate_asr_batch_timeouts_total") == 1
            assert srv.metrics.value("voxgate_asr_abandoned_threads") == 1
            # The server goes on: a new call is served in full.
            again = [e async for e in stub.Converse(requests(audio))]
            assert len([e for e in again if e.WhichOneof("event") == "transcript"]) == 4
            assert not [e for e in again if e.WhichOneof("event") == "error"]
    finally:
        engine.release()
