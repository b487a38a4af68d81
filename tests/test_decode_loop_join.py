"""Iteration-level batching on the real bundled Whisper model, through the real batcher.

A second utterance submitted while the first is decoding joins the running decode batch (the
engine's ``loop_joined`` and its step/row counters show it shared steps) and both transcripts
are right. The only test shim is a pause: the engine is held once, after its third decode step,
until the test has submitted the second utterance, so "while the first decodes" never depends
on the machine's speed.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Hashable, Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from benchmarks import _wer
from tests.conftest import read_wav_int16
from voxgate.engines.asr._whisper import WhisperEngine
from voxgate.engines.asr.base import AsrOptions, AsrRequest, AsrResult
from voxgate.gateway.scheduling import Batcher, BatchPolicy
from voxgate.gateway.testing.signals import stats_for

pytestmark = pytest.mark.model

HANG_S = 120.0
LONG, SHORT = "jfk_inaugural_1961.wav", "ljspeech_LJ001-0004.wav"


class HeldAfterStep:
    """The real engine; after its decode step ``step`` it waits for :attr:`go` once.

    The batcher's step loop takes what was handed over right after a step returns, so what
    the test submits while this waits joins before the next step.
    """

    def __init__(self, engine: WhisperEngine, step: int) -> None:
        self.engine = engine
        self.step_no = step
        self.steps = 0
        self.reached = threading.Event()
        self.go = threading.Event()

    @property
    def capacity(self) -> int:
        return self.engine.capacity

    @property
    def open_count(self) -> int:
        return self.engine.open_count

    def has_unfinished(self) -> bool:
        return self.engine.has_unfinished()

    def add(self, items: Sequence[tuple[Hashable, AsrRequest]]) -> None:
        self.engine.add(items)

    def abort(self, keys: Iterable[Hashable]) -> None:
        self.engine.abort(keys)

    def step(self) -> list[tuple[Hashable, AsrResult]]:
        done = self.engine.step()
        self.steps += 1
        if self.steps == self.step_no and not self.reached.is_set():
            self.reached.set()
            self.go.wait(HANG_S)
        return done


@pytest.fixture(scope="module")
def engine() -> Iterator[WhisperEngine]:
    e = WhisperEngine.load({"intra_threads": 1, "decode_loop": {"always": True}})
    e.warmup()
    yield e
    e.close()


def request(speech_dir: Path, name: str) -> AsrRequest:
    pcm, _ = read_wav_int16(speech_dir / name)
    audio = pcm.astype(np.float32) / 32768.0
    return AsrRequest(audio, stats_for(audio), AsrOptions(language="en"))


async def test_an_utterance_submitted_mid_decode_joins_the_running_batch(
    engine: WhisperEngine, speech_dir: Path, manifest: list[dict[str, Any]]
) -> None:
    assert engine.continuous
    refs = {m["file"]: m["text"] for m in manifest}
    shim = HeldAfterStep(engine, step=3)
    engine.counters.reset()
    async with Batcher([shim], BatchPolicy(max_batch_size=4), join_running=True) as batcher:
        first = batcher.submit(request(speech_dir, LONG))
        assert await asyncio.to_thread(shim.reached.wait, HANG_S)  # 3 steps of LONG done
        second = batcher.submit(request(speech_dir, SHORT))
        for _ in range(100):
            await asyncio.sleep(0)
        assert batcher.queue_depth == 0  # handed to the running batch
        shim.go.set()
        long_res, short_res = await asyncio.wait_for(asyncio.gather(first, second), HANG_S)
        assert batcher.stats.batches == 1 and batcher.stats.joined == 1
        assert batcher.stats.max_batch_seen == 2
    c = engine.counters
    assert c.loop_joined == 1 and c.loop_items == 2
    # Steps both utterances shared = rows - steps (one row each, greedy): it really joined.
    assert c.loop_rows - c.loop_steps >= 10, (c.loop_rows, c.loop_steps)
    for name, res in ((LONG, long_res), (SHORT, short_res)):
        assert _wer.wer(refs[name], res.text) <= 0.05, (name, res.text)
        assert res.words  # aligned as in infer_batch
