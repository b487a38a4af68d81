"""A caller already talking when the bot's reply starts: the reply stops, on a real server.

A real grpc.aio server on a loopback port with the default configuration and engines (the
bundled Whisper and voice, the default voice detector and echo handling), a recorded caller on
a μ-law 8 kHz call, and a Speak sent 0.5 s after their first word: a bot answering while the
caller is still talking. Before speech in progress counted, the reply played on until the
caller's next utterance (2.6 s of it over this caller's words; 1.3-1.6 s on SIP and media
streams). How much of the reply the caller heard is measured on the call's audio clock (the
inbound audio sent when each reply frame arrived), not on wall time.
"""

from __future__ import annotations

import asyncio

import grpc
import pytest

from benchmarks.barge_in import CallResult, load_caller, run_call
from voxgate.gateway.config import load_config
from voxgate.gateway.runtime import build_hub
from voxgate.gateway.testing.server import running_server
from voxgate.v1 import voxgate_pb2 as pb
from voxgate.v1 import voxgate_pb2_grpc as pb_grpc

pytestmark = pytest.mark.e2e

#: Reply audio a caller talking when it starts may hear before it stops, ms. The cut comes
#: with the caller's first 20 ms after the reply's first frame, unless that falls in a pause
#: between their words: then once they have said 100 ms more.
OVERLAP_BOUND_MS = 400


def test_a_reply_that_starts_while_the_caller_talks_stops_within_the_bound() -> None:
    caller = load_caller("librispeech_1272-128104-0000.wav")  # 5.3 s of talk, short pauses

    async def main() -> list[CallResult]:
        hub = build_hub(load_config(None))
        async with (
            running_server(hub=hub) as srv,
            grpc.aio.insecure_channel(srv.target) as ch,
        ):
            stub = pb_grpc.VoiceGatewayStub(ch)
            return [
                await run_call(
                    stub,
                    guard=True,
                    policy=pb.BARGE_IN_UNSPECIFIED,  # the server's: immediate
                    level_db=level,
                    caller=caller,
                    speak_after_s=0.5,
                )
                for level in (None, -20.0)  # a line without echo, and one that echoes
            ]

    for res in asyncio.run(main()):
        assert res.interrupted_at is not None, res.events
        assert res.at_offset_ms is not None and res.speak_sent_ms is not None
        # Cut by the speech in progress (it began before the Speak), not by a later one.
        assert res.at_offset_ms < res.speak_sent_ms
        assert res.overlap_ms is not None and res.overlap_ms <= OVERLAP_BOUND_MS, res.overlap_ms
        assert res.played_ms is not None and res.played_ms <= OVERLAP_BOUND_MS
