"""A call alone on the server says so in its finals' requests (issue 38).

On the CPU a final of a call that has the server to itself may encode on both cores
(``AsrRequest.alone``, ``WhisperConfig.lone_encode_threads``; the engine's side is in
``tests/test_lone_encode.py``). "Alone" is the servicer's to say: no other call in progress and
no reply being synthesized (``VoiceGatewayServicer.alone``: its calls, and the voice's own count
of the replies it is synthesizing, the gauge admission reads). A call asks when it requests each
final; interims, and finals of calls sending faster than real time, never ask for every core.

The session's part runs on a virtual clock with the FAKE recogniser; the served part on a
real grpc.aio server, default configuration, a FAKE engine behind the real batcher that only
records what it was asked (never evidence that recognition works), real speech at real time.
"""

from __future__ import annotations

import asyncio
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from voxgate.engines.asr.base import AsrRequest, AsrResult
from voxgate.gateway.config import load_config
from voxgate.gateway.neighbours import Neighbours
from voxgate.gateway.service import VoiceGatewayServicer
from voxgate.gateway.testing.batched import FakeBatchedAsrHub, fake_result
from voxgate.gateway.testing.fake_engines import (
    FakeBatchEngine,
    FakeToneSynthesizer,
    FakeTranscriber,
)
from voxgate.gateway.testing.server import running_server
from voxgate.gateway.testing.sessions import pcm_silence as silence
from voxgate.gateway.testing.sessions import pcm_tone as tone
from voxgate.gateway.testing.sessions import play_virtual, smart_session
from voxgate_client import REALTIME, Transcript, VoxgateClient, load_audio, stream_audio
from voxgate_client import CallConfig as ClientCallConfig

#: A 3.3 s LibriSpeech clip of the shared set: two calls of it overlap from start to end.
CLIP = "librispeech_1988-24833-0000.wav"
#: Only bounds how long a broken test hangs; never part of what is asserted.
HANG_S = 60.0


# -- the servicer's answer ------------------------------------------------------------------------


@pytest.mark.unit
def test_a_call_is_alone_without_another_call_or_a_reply_being_synthesized() -> None:
    servicer = VoiceGatewayServicer(load_config(None, {}), synthesizer=FakeToneSynthesizer())
    calls, streams = servicer.calls, servicer.metrics.tts_streams_active
    calls.opened()
    assert servicer.alone()
    calls.opened()
    assert not servicer.alone()  # another call's decodes would share the cores
    calls.closed("b", "ok")
    assert servicer.alone()
    streams.inc()  # a reply (or a Synthesize stream) is being synthesized: its windows would
    assert not servicer.alone()
    streams.dec()
    assert servicer.alone()


# -- the session asks for each final ---------------------------------------------------------------


@pytest.mark.unit
@pytest.mark.parametrize(
    ("alone", "bulk", "wide"),
    [(True, False, True), (False, False, False), (True, True, False)],
    ids=["alone", "not alone", "bulk"],
)
def test_a_real_time_calls_finals_carry_whether_it_is_alone_and_interims_never_do(
    alone: bool, bulk: bool, wide: bool
) -> None:
    asr = FakeTranscriber(delay_s=0.15)
    session = smart_session(asr, declared_bulk=bulk, alone=lambda: alone)
    pcm = silence(200) + tone(1500, -10) + silence(1000) + tone(1500, -10) + silence(1500)
    # A file sent as fast as the limits allow runs ahead of the call's clock.
    play_virtual(session, pcm, speed=3.5 if bulk else 1.0)
    finals = [r for r in asr.requests if r.is_final and not r.whole_turn]
    interims = [r for r in asr.requests if not r.is_final]
    assert len(finals) >= 2 and interims
    assert {r.alone for r in finals} == {wide}
    assert not any(r.alone for r in interims)


# -- through a served gateway ---------------------------------------------------------------------


class _Recording(FakeBatchEngine[AsrRequest, AsrResult]):
    """FAKE engine: answers every request with its length and keeps what each final asked."""

    def __init__(self) -> None:
        super().__init__(self._answer)
        self.finals: list[AsrRequest] = []

    def _answer(self, request: AsrRequest) -> AsrResult:
        if request.is_final and not request.whole_turn:
            self.finals.append(request)
        return fake_result(request)


async def _call(target: str, audio_path: Path) -> list[Transcript]:
    audio = load_audio(audio_path)
    finals: list[Transcript] = []
    async with VoxgateClient(target) as client:
        cfg = ClientCallConfig(encoding=audio.encoding, sample_rate_hz=audio.sample_rate_hz)
        async with await client.converse(cfg) as call:

            async def send() -> None:
                await stream_audio(call, audio, REALTIME)
                await call.hangup()

            sender = asyncio.create_task(send())
            async for event in call:
                if isinstance(event, Transcript) and event.is_final:
                    finals.append(event)
            await sender
    return finals


@pytest.fixture
async def served() -> AsyncIterator[tuple[str, _Recording]]:
    """The served gateway with the machine read as quiet (FAKE readings: what other processes
    do beside a test is not the test's to choose; the real reading is the next fixture's)."""
    engine = _Recording()
    hub = FakeBatchedAsrHub([engine, engine], synthesizer=FakeToneSynthesizer())
    async with running_server(hub=hub) as srv:  # type: ignore[arg-type]
        assert srv.servicer is not None
        srv.servicer.neighbours = Neighbours(lambda: None)  # FAKE: nothing known, quiet
        yield srv.target, engine


@pytest.fixture
async def served_beside_a_busy_process() -> AsyncIterator[tuple[str, _Recording]]:
    """The served gateway as it comes, and a real process keeping a core busy beside it."""
    engine = _Recording()
    hub = FakeBatchedAsrHub([engine, engine], synthesizer=FakeToneSynthesizer())
    busy = await asyncio.create_subprocess_exec(sys.executable, "-c", "while True: pass")
    try:
        async with running_server(hub=hub) as srv:  # type: ignore[arg-type]
            yield srv.target, engine
    finally:
        busy.kill()
        await busy.wait()


@pytest.mark.e2e
async def test_a_lone_callers_finals_ask_for_every_core_and_beside_another_call_never(
    served: tuple[str, _Recording], speech_dir: Path
) -> None:
    target, engine = served
    got = await asyncio.wait_for(_call(target, speech_dir / CLIP), HANG_S)
    assert got and engine.finals
    assert all(r.alone for r in engine.finals)
    engine.finals.clear()
    # The same caller again, while another call is open (it says nothing) from before its
    # first word until after its last final.
    async with (
        VoxgateClient(target) as client,
        await client.converse(ClientCallConfig()) as other,
    ):
        got = await asyncio.wait_for(_call(target, speech_dir / CLIP), HANG_S)
        await other.hangup()
        async for _ in other:
            pass
    assert got and engine.finals
    assert not any(r.alone for r in engine.finals)


@pytest.mark.e2e
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/stat")
async def test_a_lone_callers_finals_beside_a_busy_process_never_ask_for_every_core(
    served_beside_a_busy_process: tuple[str, _Recording], speech_dir: Path
) -> None:
    """A core another process keeps busy would hold the wide encode's thread team back to its
    share of that core (docs/turns.md, "A busy neighbour and the lone call's wide encode")."""
    target, engine = served_beside_a_busy_process
    got = await asyncio.wait_for(_call(target, speech_dir / CLIP), HANG_S)
    assert got and engine.finals
    assert not any(r.alone for r in engine.finals)
