"""End of turn through a real server with the bundled models: the JFK clip at real time.

Smart turn detection on the server's default configuration (silence, the words and the audio
model where the ``turn`` extra brought it): every final carries its turn, each turn's EndOfTurn
comes after its last final, and the clip, one sentence with dramatic pauses, is one turn whose
text holds "ask not what your country can do for you" (issue 38's goal). Its shouted "ask",
0.4 s alone between crowd noise, often comes back with no text on its own; the turn decoded
whole then hears it (docs/turns.md, "A turn that lost words"). benchmarks/turn_taking makes the
same calls and measures them.
"""

from __future__ import annotations

import asyncio
import json
import wave
from pathlib import Path

import numpy as np
import pytest

from benchmarks._wer import normalize
from voxgate.gateway.config import load_config
from voxgate.gateway.runtime import build_hub
from voxgate.gateway.testing.server import running_server
from voxgate_client import CallConfig, EndOfTurn, Transcript, TurnOptions, VoxgateClient

pytestmark = pytest.mark.e2e


def test_the_jfk_clip_is_one_turn_that_holds_ask_not(speech_dir: Path) -> None:
    with wave.open(str(speech_dir / "jfk_inaugural_1961.wav")) as w:
        pcm = np.frombuffer(w.readframes(w.getnframes()), "<i2")
    # The recording as `voxgate call` sends it, then the caller quiet on the line for 3 s.
    data = np.concatenate([pcm, np.zeros(48_000, np.int16)]).tobytes()
    events: list[object] = []

    async def main() -> None:
        cfg = load_config(None, {"server": {"host": "127.0.0.1", "port": 0, "grace_s": 1.0}})
        async with (
            running_server(hub=build_hub(cfg), config=cfg) as srv,
            VoxgateClient(srv.target) as client,
        ):
            call = await client.converse(
                CallConfig(interim_results=True, turns=TurnOptions(mode="smart"))
            )
            assert call.session is not None and call.session.turn_detection == "smart"

            async def send() -> None:
                loop = asyncio.get_running_loop()
                start = loop.time()
                for k, i in enumerate(range(0, len(data), 640)):
                    await asyncio.sleep(max(0.0, start + 0.02 * k - loop.time()))
                    await call.send_audio(data[i : i + 640])
                await call.hangup()

            async with call:
                sender = asyncio.create_task(send())
                async for event in call:
                    if isinstance(event, EndOfTurn) or (
                        isinstance(event, Transcript) and event.is_final
                    ):
                        events.append(event)
                await sender

    asyncio.run(asyncio.wait_for(main(), 120))  # a hang guard
    finals = [e for e in events if isinstance(e, Transcript)]
    ends = [e for e in events if isinstance(e, EndOfTurn)]
    assert finals and ends
    assert all(f.turn_index is not None for f in finals)
    for end in ends:
        mine = [f for f in finals if f.turn_index == end.turn_index]
        assert events.index(end) > max(events.index(f) for f in mine)
    said = [normalize(e.text) for e in ends]
    assert len(ends) == 1, json.dumps(said)
    assert "ask not what your country can do for you" in said[0], json.dumps(said)
