"""Shutdown loses no speech: calls open at the end of the grace period get their last final.

A real server with the bundled Whisper; a real `voxgate serve` process for the second signal.
"""

from __future__ import annotations

import asyncio
import json
import signal
from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import pytest
from calls import config, encode_wav
from test_cli_serve import start

from voxgate.gateway.config import load_config
from voxgate.gateway.runtime import build_hub
from voxgate.gateway.testing.server import running_server
from voxgate.v1 import voxgate_pb2 as pb
from voxgate.v1 import voxgate_pb2_grpc as pb_grpc

pytestmark = [pytest.mark.e2e, pytest.mark.model]

HANG_S = 60.0  # hang guard only


async def test_calls_open_when_the_grace_period_ends_deliver_their_in_progress_final(
    speech_dir: Path,
) -> None:
    """v0.1: the calls still running at the end of the grace period lost their utterance."""
    wav = sorted((speech_dir / "calls").glob("call_02*.wav"))[0]
    first = json.loads(wav.with_suffix(".json").read_text())["segments"][0]
    pcm = encode_wav(wav, pb.LINEAR16, 16000)
    # Audio up to the middle of the first utterance's speech: the caller is mid-sentence.
    cut = int((first["speech_start_s"] + first["speech_end_s"]) / 2 * 16000) * 2
    hub = build_hub(load_config(None, {"engines": "asr"}))
    calls = 4
    async with (
        running_server(hub=hub, limits={"max_realtime_factor": 1000.0}) as srv,  # type: ignore[arg-type]
        grpc.aio.insecure_channel(srv.target) as ch,
    ):
        stub = pb_grpc.VoiceGatewayStub(ch)
        began = [asyncio.Event() for _ in range(calls)]

        async def caller(i: int) -> tuple[list[pb.ConverseResponse], grpc.aio.AioRpcError]:
            hold = asyncio.Event()  # the caller never hangs up by itself

            async def gen() -> AsyncIterator[pb.ConverseRequest]:
                yield config()
                for k in range(0, cut, 640):
                    yield pb.ConverseRequest(audio=pb.AudioChunk(data=pcm[k : k + 640]))
                await hold.wait()

            got: list[pb.ConverseResponse] = []
            with pytest.raises(grpc.aio.AioRpcError) as info:
                async for msg in stub.Converse(gen()):
                    got.append(msg)
                    if msg.WhichOneof("event") == "speech":
                        began[i].set()
            return got, info.value

        tasks = [asyncio.create_task(caller(i)) for i in range(calls)]
        await asyncio.wait_for(asyncio.gather(*(b.wait() for b in began)), HANG_S)
        await asyncio.sleep(0.3)  # the rest of the half utterance reaches the segmenters
        await asyncio.wait_for(srv.stop(grace_s=0.1), HANG_S)
        results = await asyncio.wait_for(asyncio.gather(*tasks), HANG_S)
    for got, err in results:
        kinds = [m.WhichOneof("event") for m in got]
        assert err.code() == grpc.StatusCode.UNAVAILABLE, kinds
        assert "shutting down" in (err.details() or "")
        speech = [m.speech.type for m in got if m.WhichOneof("event") == "speech"]
        assert speech == [pb.SpeechEvent.SPEECH_BEGIN, pb.SpeechEvent.SPEECH_END], kinds
        finals = [m.transcript for m in got if m.WhichOneof("event") == "transcript"]
        assert len(finals) == 1 and finals[0].is_final and finals[0].text.strip(), kinds


def test_a_second_sigterm_during_the_drain_ends_the_server_at_once() -> None:
    proc, target = start(
        "--host", "127.0.0.1", "--port", "0", "--engines", "none", "--grace-s", "300"
    )

    async def hold_a_call() -> None:
        async with grpc.aio.insecure_channel(target) as ch:
            stub = pb_grpc.VoiceGatewayStub(ch)
            call = stub.Converse()
            await call.write(config())
            assert (await call.read()).WhichOneof("event") == "started"
            proc.send_signal(signal.SIGTERM)  # draining now, for up to 300 s
            await asyncio.sleep(0.5)
            assert proc.poll() is None  # still draining
            proc.send_signal(signal.SIGTERM)

            async def until_ended() -> None:
                with pytest.raises(grpc.aio.AioRpcError):
                    while await call.read() is not grpc.aio.EOF:
                        pass

            # v0.1 ignored the second signal and drained the whole 300 s.
            await asyncio.wait_for(until_ended(), HANG_S)

    try:
        asyncio.run(hold_a_call())
        proc.communicate(timeout=HANG_S)  # far less than the 300 s grace period
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 0
