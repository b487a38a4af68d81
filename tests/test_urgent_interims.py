"""Barge-in interims are scheduled as finals: no interim slot to wait for, ahead of other interims.

``after_words`` stops the bot's reply on an interim transcript of the caller's words; until that
interim comes back the caller and the bot talk at once. The transcriber keeps one worker free for
finals by letting interims share ``workers - 1`` slots and yield to finals; an urgent interim
(``AsrRequest.urgent``, what the session sets while the caller talks over an ``after_words``
reply) skips both. Fake engines behind the real batcher and transcriber; no wall-clock timing:
every batch is held at its engine's gate until the test releases it.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator

import numpy as np
import pytest

from voxgate.engines.asr.base import AsrOptions, AsrRequest, AsrResult
from voxgate.gateway.errors import CallError, ErrorKind
from voxgate.gateway.metrics import GatewayMetrics
from voxgate.gateway.runtime import AsrTranscriber, BatchMetrics
from voxgate.gateway.scheduling import Batcher, BatchPolicy
from voxgate.gateway.testing.batched import fake_result
from voxgate.gateway.testing.fake_engines import FakeBatchEngine
from voxgate.gateway.testing.signals import stats_for

pytestmark = pytest.mark.unit

#: Only bounds how long a broken test hangs; never part of what is asserted.
HANG_S = 10.0


def request(seconds: float, *, final: bool = False, urgent: bool = False) -> AsrRequest:
    audio = np.zeros(int(16000 * seconds), np.float32)
    return AsrRequest(audio, stats_for(audio), AsrOptions(), is_final=final, urgent=urgent)


@pytest.fixture
def gates() -> Iterator[list[threading.Event]]:
    events = [threading.Event() for _ in range(3)]
    yield events
    for e in events:
        e.set()


async def test_an_urgent_interim_needs_no_slot_and_goes_before_waiting_interims(
    gates: list[threading.Event],
) -> None:
    engines = [
        FakeBatchEngine[AsrRequest, AsrResult](fake_result, gate=g, gate_timeout_s=HANG_S)
        for g in gates
    ]
    metrics = GatewayMetrics()
    batcher: Batcher[AsrRequest, AsrResult] = Batcher(
        engines, BatchPolicy(max_batch_size=1), observer=BatchMetrics(metrics), name="t"
    )
    async with batcher:
        asr = AsrTranscriber(batcher, len(engines), lambda prompt, words: (), metrics)
        # Three workers, all busy: an interim (one of the two interim slots) and two finals.
        running = [asyncio.ensure_future(asr.transcribe(request(1.0)))]
        running += [
            asyncio.ensure_future(asr.transcribe(request(s, final=True))) for s in (1.1, 1.2)
        ]
        for e in engines:
            assert await asyncio.to_thread(e.wait_for_calls, 1, HANG_S)
        # Another call's display interim takes the second slot and waits for a worker; a third
        # has no slot: skipped, as before.
        waiting = asyncio.ensure_future(asr.transcribe(request(2.0)))
        await settle()
        with pytest.raises(CallError) as refused:
            await asr.transcribe(request(2.5))
        assert refused.value.kind is ErrorKind.RESOURCE_EXHAUSTED
        # A barge-in interim is queued all the same, with a final's rank and deadline.
        urgent = asyncio.ensure_future(asr.transcribe(request(3.0, urgent=True)))
        await settle()
        assert batcher.queue_depth == 2
        # The first interim's worker comes free: the urgent interim runs there, not the one
        # that was queued before it.
        (free,) = [i for i, e in enumerate(engines) if seconds(e.batches[0][0]) == 1.0]
        gates[free].set()
        assert (await urgent).text == fake_result(request(3.0)).text
        assert [seconds(b[0]) for b in engines[free].batches] == [1.0, 3.0]
        assert not waiting.done()
        for g in gates:
            g.set()
        await asyncio.gather(*running, waiting)
        assert sorted(seconds(b[0]) for e in engines for b in e.batches) == [
            1.0,
            1.1,
            1.2,
            2.0,
            3.0,
        ]


def seconds(req: AsrRequest) -> float:
    return len(req.audio) / 16000


async def settle(rounds: int = 20) -> None:
    """Let every ready callback and task run (no time passes)."""
    for _ in range(rounds):
        await asyncio.sleep(0)
