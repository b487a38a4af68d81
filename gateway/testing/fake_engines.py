"""Fake engines for scheduler and transport tests: never evidence that a model feature works.

:class:`FakeBatchEngine` stands in for any engine with ``infer_batch`` so that the batcher can be
tested without a model: it can be slowed, held at a gate until the test releases it, made to
raise on a chosen call or return the wrong number of results, and it records what it saw.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import AsyncIterator, Callable, Container, Mapping, Sequence
from typing import Generic, TypeVar

import numpy as np

from gateway.base import EngineInfo, Synthesizer, Transcriber, TtsPiece, VoiceDescription
from gateway.events import SpeakIn
from gateway.metrics import GatewayMetrics

__all__ = ["FakeBatchEngine", "FakeEngineError", "FakeToneHub", "FakeToneSynthesizer"]

T = TypeVar("T")
R = TypeVar("R")


class FakeEngineError(RuntimeError):
    """The error a :class:`FakeBatchEngine` raises on a scripted call unless given another."""


class FakeBatchEngine(Generic[T, R]):
    """A scriptable stand-in for an engine's ``infer_batch``; thread-safe.

    Calls are numbered from 0 in the order they start (across threads). Knobs apply per call
    number, so a test can say "the second batch fails" without knowing which items it holds.

    Args:
        fn: maps one item to its result when no output is scripted for a call.
        delay_s: sleep in the worker thread per call (for benchmarks and demos; tests should
            prefer ``gate`` so that they never depend on timing).
        gate: when given, every call blocks until it is set (the test decides when batches
            finish). Use :meth:`wait_for_calls` to know a call has started.
        gate_timeout_s: a hang guard for ``gate``: a call still waiting after this long raises
            :class:`FakeEngineError`, so that a failing test ends instead of hanging on a gate
            it never opened. ``None`` waits forever.
        barrier: when given, every call waits on it first; a test with ``parties=2`` proves two
            calls overlap (a serial run breaks the barrier after ``barrier``'s timeout and
            the call raises ``threading.BrokenBarrierError``).
        fail_calls: call number -> exception to raise (instead of returning).
        outputs: call number -> exact list to return (may be the wrong length on purpose).
        short_calls: call numbers that return one result fewer than items (contract breach).
        name: shown in ``repr`` and used as the engine's ``name`` attribute.

    Attributes:
        batches: the items of every call, in start order.
        thread_ids: ``threading.get_ident()`` of the thread that ran each call.
        max_concurrent: the most calls that were inside ``infer_batch`` at the same time.
        warmups: how often :meth:`warmup` ran.
        closed: whether :meth:`close` ran.
    """

    def __init__(
        self,
        fn: Callable[[T], R],
        *,
        delay_s: float = 0.0,
        gate: threading.Event | None = None,
        gate_timeout_s: float | None = None,
        barrier: threading.Barrier | None = None,
        fail_calls: Mapping[int, BaseException] | None = None,
        outputs: Mapping[int, list[R]] | None = None,
        short_calls: Container[int] = (),
        name: str = "fake-batch-engine",
    ) -> None:
        self.name = name
        self._fn = fn
        self._delay_s = delay_s
        self._gate = gate
        self._gate_timeout_s = gate_timeout_s
        self._barrier = barrier
        self._fail_calls = dict(fail_calls or {})
        self._outputs = dict(outputs or {})
        self._short_calls = short_calls
        self._cond = threading.Condition()
        self._active = 0
        self.batches: list[tuple[T, ...]] = []
        self.thread_ids: list[int] = []
        self.max_concurrent = 0
        self.warmups = 0
        self.closed = False

    def __repr__(self) -> str:
        return f"FakeBatchEngine(name={self.name!r}, calls={self.calls})"

    @property
    def calls(self) -> int:
        """How many ``infer_batch`` calls have started."""
        with self._cond:
            return len(self.batches)

    @property
    def items_seen(self) -> list[T]:
        """Every item handed to the engine, flattened in call order."""
        with self._cond:
            return [item for batch in self.batches for item in batch]

    def warmup(self) -> None:
        """Count the warm-up; a real engine runs a tiny inference here."""
        self.warmups += 1

    def close(self) -> None:
        """Mark the engine closed."""
        self.closed = True

    def wait_for_calls(self, n: int, timeout_s: float) -> bool:
        """Block until at least ``n`` calls have started; False if ``timeout_s`` passed first.

        Call it off the event loop (``await asyncio.to_thread(engine.wait_for_calls, n, 5)``).
        """
        with self._cond:
            return self._cond.wait_for(lambda: len(self.batches) >= n, timeout=timeout_s)

    def infer_batch(self, items: Sequence[T]) -> list[R]:
        """Record the call, apply its knobs, then return one ``fn(item)`` per item."""
        with self._cond:
            index = len(self.batches)
            self.batches.append(tuple(items))
            self.thread_ids.append(threading.get_ident())
            self._active += 1
            self.max_concurrent = max(self.max_concurrent, self._active)
            self._cond.notify_all()
        try:
            if self._barrier is not None:
                self._barrier.wait()
            if self._gate is not None and not self._gate.wait(self._gate_timeout_s):
                raise FakeEngineError(f"gate not opened within {self._gate_timeout_s} s")
            if self._delay_s > 0.0:
                time.sleep(self._delay_s)
            if index in self._fail_calls:
                raise self._fail_calls[index]
            if index in self._outputs:
                return list(self._outputs[index])
            results = [self._fn(item) for item in items]
            if index in self._short_calls:
                return results[:-1]
            return results
        finally:
            with self._cond:
                self._active -= 1


class FakeToneSynthesizer:
    """A FAKE voice for transport tests (SIP/RTP pacing, barge-in plumbing): no model.

    100 ms of a 440 Hz tone per character of text, in 200 ms pieces at 16 kHz. Never evidence
    that speech synthesis works.

    Args:
        first_piece_delay_s: wait this long before the first piece (a reply still being
            synthesized when something else happens to the call).
        fail_after_pieces: raise :class:`FakeEngineError` after this many pieces (an engine
            fault in the middle of a reply); None never fails.
    """

    sample_rate_hz = 16000
    max_text_chars = 10_000

    def __init__(
        self, first_piece_delay_s: float = 0.0, fail_after_pieces: int | None = None
    ) -> None:
        self._first_delay_s = first_piece_delay_s
        self._fail_after = fail_after_pieces

    async def stream(self, speak: SpeakIn) -> AsyncIterator[TtsPiece]:
        """Yield the tone for ``speak.text``."""
        if self._first_delay_s:
            await asyncio.sleep(self._first_delay_s)
        n = min(len(speak.text), 100) * 1600
        t = np.arange(n, dtype=np.float32) / self.sample_rate_hz
        audio = (0.3 * np.sin(2 * np.pi * 440 * t)).astype(np.float32)
        for k, i in enumerate(range(0, n, 3200)):
            if self._fail_after is not None and k >= self._fail_after:
                raise FakeEngineError("fake voice fault (scripted)")
            yield TtsPiece(audio[i : i + 3200], (), i + 3200 >= n)


class FakeToneHub:
    """An engine hub with the fake tone voice and no recogniser (see FakeToneSynthesizer)."""

    transcriber: Transcriber | None = None

    def __init__(self, synthesizer: FakeToneSynthesizer | None = None) -> None:
        self.synthesizer: Synthesizer | None = synthesizer or FakeToneSynthesizer()
        self.info = EngineInfo(
            voices=[VoiceDescription(name="tone", language="", sample_rate_hz=16000)]
        )

    async def start(self, metrics: GatewayMetrics) -> None:
        """Nothing to load."""

    async def aclose(self) -> None:
        """Nothing to close."""
