"""ModelRouter on the step path (``batcher.join_running``): add / step / abort reach the engine.

The engine is a FAKE step engine over recognition requests (each takes as many steps as its
audio has tenths of a second, and answers with its engine's name); what is real is the batcher
and the router the production hub builds: a run's requests go to one engine, results come
back as they finish, the run's closing abort frees the router for the next run.
"""

from __future__ import annotations

import asyncio
from collections.abc import Hashable, Iterable, Sequence

import numpy as np
import pytest

from voxgate.engines.asr.base import AsrOptions, AsrRequest, AsrResult
from voxgate.engines.base import UtteranceStats
from voxgate.gateway.runtime import ModelRouter
from voxgate.gateway.scheduling import Batcher, BatchPolicy

pytestmark = pytest.mark.unit

HANG_S = 10.0


class FakeStepAsrEngine:
    """A FAKE recogniser with add / step / abort: no decoding; records what it was given."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.capacity = 4
        self.live: dict[Hashable, list[int]] = {}
        self.added: list[Hashable] = []
        self.aborts: list[list[Hashable]] = []
        self.steps = 0

    @property
    def open_count(self) -> int:
        return len(self.live)

    def has_unfinished(self) -> bool:
        return bool(self.live)

    def add(self, items: Sequence[tuple[Hashable, AsrRequest]]) -> None:
        for key, req in items:
            self.added.append(key)
            self.live[key] = [max(1, len(req.audio) // 1600)]

    def step(self) -> list[tuple[Hashable, AsrResult]]:
        self.steps += 1
        done = []
        for key, left in list(self.live.items()):
            left[0] -= 1
            if left[0] == 0:
                del self.live[key]
                done.append((key, AsrResult(text=self.name)))
        return done

    def abort(self, keys: Iterable[Hashable]) -> None:
        gone = list(keys)
        self.aborts.append(gone)
        for key in gone:
            self.live.pop(key, None)

    def infer_batch(self, items: Sequence[AsrRequest]) -> list[AsrResult]:
        raise AssertionError("join_running never calls infer_batch")

    def sibling(self) -> FakeStepAsrEngine:
        return self


def request(seconds: float) -> AsrRequest:
    stats = UtteranceStats(1000, 1000, 1.0, 0, 0, -30.0, -30.0, -20.0)
    return AsrRequest(np.zeros(int(16000 * seconds), np.float32), stats, AsrOptions())


async def test_a_run_goes_to_the_models_engine_and_each_result_comes_when_done() -> None:
    engine = FakeStepAsrEngine("base")
    router = ModelRouter(0, engine)  # type: ignore[arg-type]
    async with Batcher([router], BatchPolicy(max_batch_size=4), join_running=True) as batcher:
        results = await asyncio.wait_for(
            asyncio.gather(batcher.submit(request(0.3)), batcher.submit(request(0.1))), HANG_S
        )
        assert [r.text for r in results] == ["base", "base"]
        assert not router.has_unfinished() and router.open_count == 0
        # A second run starts afresh on the same engine.
        again = await asyncio.wait_for(batcher.submit(request(0.2)), HANG_S)
        assert again.text == "base"
    assert len(engine.added) == 3 and engine.steps >= 3
    assert engine.aborts and all(a == [] for a in engine.aborts)  # each run ended clean


def test_join_running_over_an_engine_without_steps_is_refused_when_a_run_starts() -> None:
    class BatchOnly:
        name = "generate-only"

    router = ModelRouter(0, BatchOnly())  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="add / step / abort"):
        router.add([(0, request(0.1))])
    assert not router.has_unfinished() and router.step() == []
