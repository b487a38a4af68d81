"""A final never waits behind an interim of its own utterance (issue 38).

When an utterance's final decode is submitted (at ``decode_after_ms`` of silence under smart
turns, at the end of speech otherwise), its interims still queued leave the queue (their
futures fail with ``WithdrawnError``; the session takes that as "no interim"), so none runs
before the final or shares its batch; one already running finishes on its worker, and the
final goes to another. FAKE engines behind the real batcher and transcriber, each batch held
at its engine's gate until the test releases it (no wall-clock timing); the session's part on
a virtual clock with the FAKE recogniser.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator

import numpy as np
import pytest

from voxgate.common.pcm import WireEncoding
from voxgate.engines.asr.base import AsrOptions, AsrRequest, AsrResult
from voxgate.gateway.call.options import (
    IngressOptions,
    InterimOptions,
    PlaybackOptions,
    RecognitionOptions,
)
from voxgate.gateway.config import LimitsConfig, VadConfig
from voxgate.gateway.events import AudioIn, InboundEvent, OutboundEvent, TranscriptOut
from voxgate.gateway.metrics import GatewayMetrics
from voxgate.gateway.runtime import AsrTranscriber, BatchMetrics
from voxgate.gateway.scheduling import Batcher, BatchPolicy, WithdrawnError
from voxgate.gateway.session import CallConfig, CallSession
from voxgate.gateway.testing.batched import fake_result
from voxgate.gateway.testing.fake_engines import (
    EnergyVoiceDetector,
    FakeBatchEngine,
    FakeTranscriber,
)
from voxgate.gateway.testing.signals import stats_for
from voxgate.gateway.testing.virtual_time import run_virtual
from voxgate.gateway.turns import TurnOptions

pytestmark = pytest.mark.unit

#: Only bounds how long a broken test hangs; never part of what is asserted.
HANG_S = 10.0


def request(seconds: float, utterance: object, *, final: bool = False, urgent: bool = False):
    audio = np.zeros(int(16000 * seconds), np.float32)
    return AsrRequest(
        audio, stats_for(audio), AsrOptions(), is_final=final, urgent=urgent, utterance=utterance
    )


def seconds(req: AsrRequest) -> float:
    return len(req.audio) / 16000


async def settle(rounds: int = 20) -> None:
    """Let every ready callback and task run (no time passes)."""
    for _ in range(rounds):
        await asyncio.sleep(0)


@pytest.fixture
def gates() -> Iterator[list[threading.Event]]:
    events = [threading.Event() for _ in range(2)]
    yield events
    for e in events:
        e.set()


def two_workers(
    gates: list[threading.Event],
) -> tuple[list[FakeBatchEngine[AsrRequest, AsrResult]], Batcher[AsrRequest, AsrResult]]:
    """The default CPU plan's shape: two workers, batches of up to two."""
    engines = [
        FakeBatchEngine[AsrRequest, AsrResult](fake_result, gate=g, gate_timeout_s=HANG_S)
        for g in gates
    ]
    metrics = GatewayMetrics()
    batcher: Batcher[AsrRequest, AsrResult] = Batcher(
        engines, BatchPolicy(max_batch_size=2), observer=BatchMetrics(metrics), name="t"
    )
    return engines, batcher


async def test_a_final_takes_its_utterances_queued_interims_off_the_queue(
    gates: list[threading.Event],
) -> None:
    engines, batcher = two_workers(gates)
    async with batcher:
        asr = AsrTranscriber(batcher, len(engines), lambda prompt, words: (), GatewayMetrics())
        # Both workers busy with other calls' finals.
        busy = [
            asyncio.ensure_future(asr.transcribe(request(s, ("other", s), final=True)))
            for s in (1.1, 1.2)
        ]
        for e in engines:
            assert await asyncio.to_thread(e.wait_for_calls, 1, HANG_S)
        # Utterance U's interim (and a barge-in one, ranked as a final) wait; so does another
        # utterance's interim.
        interim = asyncio.ensure_future(asr.transcribe(request(2.0, "U")))
        await settle()
        urgent = asyncio.ensure_future(asr.transcribe(request(2.1, "U", urgent=True)))
        other = asyncio.ensure_future(asr.transcribe(request(0.5, "V", urgent=True)))
        await settle()
        assert batcher.queue_depth == 3
        # U's final is submitted: U's interims leave the queue unrun, V's stays.
        final = asyncio.ensure_future(asr.transcribe(request(3.0, "U", final=True)))
        await settle()
        for waiting in (interim, urgent):
            with pytest.raises(WithdrawnError):
                await waiting
        assert batcher.queue_depth == 2
        assert batcher.stats.withdrawn == 2 and batcher.stats.dropped == 0
        # A worker comes free: the final runs first (beside V's urgent interim, of its rank),
        # never in one batch with its own interims, which a batch of two would have taken.
        gates[0].set()
        assert (await final).text == fake_result(request(3.0, "U")).text
        assert sorted(seconds(r) for r in engines[0].batches[1]) == [0.5, 3.0]
        gates[1].set()
        await asyncio.gather(*busy, other)
        seen = sorted(seconds(r) for e in engines for b in e.batches for r in b)
        assert seen == [0.5, 1.1, 1.2, 3.0]  # the withdrawn interims never reached an engine


async def test_an_interim_already_running_does_not_hold_its_final_on_two_workers(
    gates: list[threading.Event],
) -> None:
    engines, batcher = two_workers(gates)
    async with batcher:
        asr = AsrTranscriber(batcher, len(engines), lambda prompt, words: (), GatewayMetrics())
        gates[1].set()  # worker 1 decodes at once; worker 0 is held
        interim = asyncio.ensure_future(asr.transcribe(request(2.0, "U")))
        assert await asyncio.to_thread(engines[0].wait_for_calls, 1, HANG_S)
        # U's interim is decoding on worker 0 (held): the final runs on worker 1 meanwhile.
        final = await asyncio.wait_for(
            asr.transcribe(request(3.0, "U", final=True)), HANG_S
        )  # a hang guard: without a free worker this would wait for gate 0
        assert final.text == fake_result(request(3.0, "U")).text
        assert not interim.done()
        assert batcher.stats.withdrawn == 0
        gates[0].set()
        # It was not withdrawn: its words may still stand in for an empty final.
        assert (await interim).text == fake_result(request(2.0, "U")).text


async def test_withdraw_leaves_other_groups_and_unnamed_items_alone(
    gates: list[threading.Event],
) -> None:
    engine = FakeBatchEngine[int, int](lambda x: x, gate=gates[0], gate_timeout_s=HANG_S)
    batcher: Batcher[int, int] = Batcher([engine], BatchPolicy(max_batch_size=1))
    async with batcher:
        running = batcher.submit(0, group="A")
        assert await asyncio.to_thread(engine.wait_for_calls, 1, HANG_S)
        waiting = {
            n: batcher.submit(n, is_final=False, group=g)
            for n, g in ((1, "A"), (2, "B"), (3, None), (4, "A"))
        }
        assert batcher.withdraw(None) == 0
        assert batcher.withdraw("A") == 2  # the queued ones; the running one stays
        assert batcher.withdraw("A") == 0
        gates[0].set()
        assert await running == 0
        assert [await waiting[n] for n in (2, 3)] == [2, 3]
        for n in (1, 4):
            with pytest.raises(WithdrawnError):
                await waiting[n]
    assert engine.items_seen == [0, 2, 3]


def tone(ms: int) -> bytes:
    t = np.arange(16 * ms) / 16000.0
    return (0.3 * 32767 * np.sin(2 * np.pi * 300 * t)).astype("<i2").tobytes()


def silence(ms: int) -> bytes:
    return bytes(32 * ms)


@pytest.mark.parametrize("turns", ["smart", "off"])
def test_the_session_names_each_utterance_and_stops_its_interims_once_its_final_runs(
    turns: str,
) -> None:
    """Interims and the final of one utterance carry one name, another utterance another;
    once the final decode has started no interim of that utterance follows it (smart: at
    decode_after_ms of silence, before the utterance ends; off: the speculative final)."""
    asr = FakeTranscriber(delay_s=0.15)
    cfg = CallConfig(
        ingress=IngressOptions(WireEncoding.LINEAR16, 16000),
        playback=PlaybackOptions(WireEncoding.LINEAR16, 16000),
        vad=VadConfig(end_silence_ms=600 if turns == "off" else 200),
        interims=InterimOptions(results=True, interval_ms=200),
        recognition=RecognitionOptions(
            turns=TurnOptions(mode="smart", min_silence_ms=200, max_pause_ms=1600)
            if turns == "smart"
            else TurnOptions()
        ),
    )
    session = CallSession(
        cfg,
        LimitsConfig(),
        asr,
        None,
        metrics=GatewayMetrics(),
        detector=EnergyVoiceDetector(),
    )
    out: list[OutboundEvent] = []
    pcm = silence(200) + tone(1500) + silence(1000) + tone(1500) + silence(1500)

    async def main() -> None:
        inbox: asyncio.Queue[InboundEvent | None] = asyncio.Queue()

        async def sink(event: OutboundEvent) -> None:
            out.append(event)

        runner = asyncio.create_task(session.run(inbox.get, sink))
        for i in range(0, len(pcm), 640):
            await inbox.put(AudioIn(pcm[i : i + 640]))
            await asyncio.sleep(0.02)
        await inbox.put(None)
        await asyncio.wait_for(runner, 600)  # virtual seconds: a hang guard

    run_virtual(main())
    finals = [e for e in out if isinstance(e, TranscriptOut) and e.is_final]
    assert len(finals) == 2
    names = [r.utterance for r in asr.requests]
    assert None not in names
    first_final: dict[object, int] = {}
    for k, r in enumerate(asr.requests):
        if r.is_final and not r.bulk:  # not the turn decoded whole (it has no interims)
            first_final.setdefault(r.utterance, k)
    assert len(first_final) == 2  # two utterances, two names
    for k, r in enumerate(asr.requests):
        if not r.is_final:
            # Every interim names one of the two utterances, and none comes after its final.
            assert r.utterance in first_final
            assert k < first_final[r.utterance]
    # Interims did run for each utterance (the check above is not vacuous).
    assert {r.utterance for r in asr.requests if not r.is_final} == set(first_final)
