"""Fake engines for scheduler, session and transport tests: never evidence that a model works.

:class:`FakeBatchEngine` stands in for any engine with ``infer_batch`` so that the batcher can be
tested without a model: it can be slowed, held at a gate until the test releases it, made to
raise on a chosen call or return the wrong number of results, and it records what it saw.
:class:`FakeStepEngine` stands in for a step engine (``add`` / ``step`` / ``abort``, the
batcher's ``join_running``), with step-by-step gating and the same kind of knobs.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import (
    AsyncIterator,
    Callable,
    Collection,
    Container,
    Hashable,
    Iterable,
    Mapping,
    Sequence,
)
from typing import Any, Generic, TypeVar

import numpy as np
import numpy.typing as npt

from voxgate.engines.asr.base import AsrRequest, AsrResult
from voxgate.gateway.base import EngineInfo, Synthesizer, Transcriber, TtsPiece, VoiceDescription
from voxgate.gateway.events import SpeakIn
from voxgate.gateway.metrics import GatewayMetrics

__all__ = [
    "EnergyVoiceDetector",
    "FakeBatchEngine",
    "FakeEngineError",
    "FakeStepEngine",
    "FakeToneHub",
    "FakeToneSynthesizer",
    "FakeTranscriber",
]

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
            prefer ``gate`` so that they never depend on timing). The attribute of the same
            name may be changed while the engine runs (a latency the test controls).
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
        hang_calls: call numbers that block until :meth:`release` (a hung engine; release it
            when the test ends, since Python waits for every executor thread at exit).
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
        hang_calls: Container[int] = (),
        name: str = "fake-batch-engine",
    ) -> None:
        self.name = name
        self._fn = fn
        self.delay_s = delay_s
        self._hang_calls = hang_calls
        self._released = threading.Event()
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

    def release(self) -> None:
        """Let every hung call (``hang_calls``) return."""
        self._released.set()

    def sibling(self) -> FakeBatchEngine[T, R]:
        """This engine again (a real engine returns another object over the same model)."""
        return self

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
            if index in self._hang_calls:
                self._released.wait()
            if self.delay_s > 0.0:
                time.sleep(self.delay_s)
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


class _StepBatch:
    """One worker thread's open batch in a :class:`FakeStepEngine`."""

    def __init__(self) -> None:
        #: [key, item, steps left, rounds left] per open item.
        self.live: list[list[Any]] = []
        self.open = False


class FakeStepEngine:
    """A FAKE step engine (``add`` / ``step`` / ``abort``): item n takes n steps, result n * 10.

    Thread-safe. Each worker thread has its own open batch, as if each had its own engine
    object: a hung worker's replacement thread starts empty while the stuck one keeps its own.

    Args:
        gated: each step waits for a permit from :meth:`allow` (the test paces the steps).
        capacity: the most items it decodes at once (what the driver may fill).
        delay_s: sleep per step (only for a "long run that keeps stepping" test).
        hang_at_step: block at this step (counting from 1, across threads) until
            :meth:`release`.
        fail_at_step: raise :class:`FakeEngineError` at this step.
        forget: items it never returns (a contract breach).
        rounds: item -> extra rounds (a fallback re-decode: the item runs again for n steps
            before its one result).
        hang_s: how long a gated step waits for its permit before raising (a broken test then
            ends instead of hanging).

    Attributes:
        steps: the live items of every step, in order.
        seen: every item that reached the engine, in order.
        runs: how many batches started (an ``add`` into a closed batch; the driver closes one
            with the ``abort`` that ends each run).
        thread_ids: the thread that started each batch.
    """

    def __init__(
        self,
        *,
        gated: bool = False,
        capacity: int = 64,
        delay_s: float = 0.0,
        hang_at_step: int | None = None,
        fail_at_step: int | None = None,
        forget: Collection[int] = (),
        rounds: dict[int, int] | None = None,
        hang_s: float = 10.0,
    ) -> None:
        self._gated = gated
        self._permits = threading.Semaphore(0)
        self._capacity = capacity
        self._delay_s = delay_s
        self._hang_at = hang_at_step
        self._fail_at = fail_at_step
        self._forget = set(forget)
        self._rounds = dict(rounds or {})
        self._hang_s = hang_s
        self._released = threading.Event()
        self._cond = threading.Condition()
        self._batches: dict[int, _StepBatch] = {}
        self._waiting = 0
        self.steps: list[tuple[int, ...]] = []
        self.seen: list[int] = []
        self.runs = 0
        self.thread_ids: list[int] = []

    def _mine(self) -> _StepBatch:
        with self._cond:
            return self._batches.setdefault(threading.get_ident(), _StepBatch())

    def allow(self, steps: int = 1) -> None:
        """Let ``steps`` more steps run."""
        for _ in range(steps):
            self._permits.release()

    def release(self) -> None:
        """Unblock a hung step (call at the end of a test)."""
        self._released.set()
        self.allow(1000)

    def wait_for_waiting(self, n: int, timeout_s: float = 10.0) -> bool:
        """Block until the engine has waited for a step permit ``n`` times in all."""
        with self._cond:
            return self._cond.wait_for(lambda: self._waiting >= n, timeout_s)

    @property
    def capacity(self) -> int:
        """The ``capacity`` knob."""
        return self._capacity

    @property
    def open_count(self) -> int:
        """Items open in this thread's batch."""
        return len(self._mine().live)

    def has_unfinished(self) -> bool:
        """Whether this thread's batch has open items."""
        return bool(self._mine().live)

    def add(self, items: Sequence[tuple[Hashable, int]]) -> None:
        """Open the items; the first add after a close starts a new batch (a run)."""
        batch = self._mine()
        with self._cond:
            if not batch.open:
                batch.open = True
                self.runs += 1
                self.thread_ids.append(threading.get_ident())
            self.seen.extend(x for _, x in items)
        batch.live += [[key, x, x, self._rounds.get(x, 0)] for key, x in items]

    def step(self) -> list[tuple[Hashable, int]]:
        """One step of every open item of this thread's batch; (key, n * 10) of those done."""
        batch = self._mine()
        if self._gated:
            with self._cond:
                self._waiting += 1
                self._cond.notify_all()
            if not self._permits.acquire(timeout=self._hang_s):
                raise FakeEngineError("the test never allowed the next step")
        with self._cond:
            self.steps.append(tuple(e[1] for e in batch.live))
            step = len(self.steps)
        if step == self._hang_at:
            self._released.wait()
        if step == self._fail_at:
            raise FakeEngineError(f"scripted failure at step {step}")
        if self._delay_s:
            time.sleep(self._delay_s)
        keep, done = [], []
        for e in batch.live:
            e[2] -= 1
            if e[2] > 0:
                keep.append(e)
            elif e[3] > 0:  # another round of the same item, still one result at the end
                e[2], e[3] = e[1], e[3] - 1
                keep.append(e)
            elif e[1] not in self._forget:
                done.append((e[0], e[1] * 10))
        batch.live = keep
        return done

    def abort(self, keys: Iterable[Hashable]) -> None:
        """Drop the items of ``keys``; a batch left empty closes (the next add is a new run)."""
        batch = self._mine()
        gone = set(keys)
        batch.live = [e for e in batch.live if e[0] not in gone]
        if not batch.live:
            batch.open = False


class FakeToneSynthesizer:
    """A FAKE voice for transport tests (SIP/RTP pacing, barge-in plumbing): no model.

    100 ms of a 440 Hz tone per character of text (at most 100 characters), in 200 ms pieces
    at 16 kHz; each space-separated word ends where its last character's tone ends, so playback
    accounting ("which words were heard") can be checked exactly. Never evidence that speech
    synthesis works.

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
        text = speak.text[:100]
        n = len(text) * 1600
        t = np.arange(n, dtype=np.float32) / self.sample_rate_hz
        audio = (0.3 * np.sin(2 * np.pi * 440 * t)).astype(np.float32)
        ends: list[tuple[str, int]] = []
        pos = 0
        for word in text.split(" "):
            pos += len(word)
            if word:
                ends.append((word, pos * 100))
            pos += 1
        for k, i in enumerate(range(0, n, 3200)):
            if self._fail_after is not None and k >= self._fail_after:
                raise FakeEngineError("fake voice fault (scripted)")
            lo_ms, hi_ms = i // 16, (i + 3200) // 16
            words = tuple(w for w in ends if lo_ms < w[1] <= hi_ms)
            yield TtsPiece(audio[i : i + 3200], words, i + 3200 >= n)


class FakeTranscriber:
    """A FAKE recogniser with knobs, for component tests of the session: no model.

    Args:
        texts: what each request (numbered from 0 in arrival order) returns; a callable gets
            the request; past the end of a list, ``"utterance N"``.
        delay_s: ``asyncio.sleep`` per request (virtual time under ``run_virtual``); a
            callable gets the request's number (overlapping requests that end out of order).
        fail: request numbers that raise :class:`FakeEngineError` (an engine fault).
        hang: request numbers that never finish until cancelled (a hung engine).
        unsure: request numbers that come back with no text, dropped as ``low_logprob`` (the
            recogniser heard words it was not sure of).
        speculate: what :meth:`can_speculate` answers.
        workers: how many requests run at once as far as :meth:`spare_worker` tells (the
            fake itself runs any number): a worker is spare while fewer are in flight.
        detected: the (language, detection probability) a request with no language gets;
            a callable gets the request. A request that names its language gets it, at 1.0.

    Attributes:
        requests: every request, in arrival order (the observation channel).
        cancelled: numbers of requests cancelled while running.
        running: the requests in flight now.
    """

    def __init__(
        self,
        texts: Sequence[str] | Callable[[AsrRequest], str] = (),
        *,
        delay_s: float | Callable[[int], float] = 0.0,
        fail: Container[int] = (),
        hang: Container[int] = (),
        unsure: Container[int] = (),
        speculate: bool = True,
        workers: int = 1,
        detected: tuple[str, float] | Callable[[AsrRequest], tuple[str, float]] = ("en", 1.0),
    ) -> None:
        self._texts = texts
        self._delay_s = delay_s
        self._fail = fail
        self._hang = hang
        self._unsure = unsure
        self._speculate = speculate
        self._workers = workers
        self._detected = detected
        self.requests: list[AsrRequest] = []
        self.cancelled: list[int] = []
        self.in_flight = 0
        self.running: list[AsrRequest] = []
        #: The most requests that were in flight at once.
        self.most_in_flight = 0

    def can_speculate(self) -> bool:
        """The scripted answer."""
        return self._speculate

    def spare_worker(self) -> bool:
        """Fewer requests in flight than ``workers``."""
        return self.in_flight < self._workers

    def encode_context(self, initial_prompt: str, hotwords: Sequence[str]) -> tuple[int, ...]:
        """One fake token per word."""
        return tuple(range(len(f"{initial_prompt} {' '.join(hotwords)}".split())))

    async def transcribe(self, request: AsrRequest) -> AsrResult:
        """Record the request, apply its knobs, return its scripted text."""
        index = len(self.requests)
        self.requests.append(request)
        self.in_flight += 1
        self.running.append(request)
        self.most_in_flight = max(self.most_in_flight, self.in_flight)
        try:
            if index in self._hang:
                await asyncio.Event().wait()
            delay = self._delay_s(index) if callable(self._delay_s) else self._delay_s
            if delay:
                await asyncio.sleep(delay)
        except asyncio.CancelledError:
            self.cancelled.append(index)
            raise
        finally:
            self.in_flight -= 1
            # By identity: requests hold arrays, whose == is elementwise.
            self.running = [r for r in self.running if r is not request]
        if index in self._fail:
            raise FakeEngineError(f"fake recogniser fault on request {index} (scripted)")
        if index in self._unsure:
            return AsrResult(text="", dropped_reason="low_logprob")
        if callable(self._texts):
            text = self._texts(request)
        elif index < len(self._texts):
            text = self._texts[index]
        else:
            text = f"utterance {index}"
        if request.options.language is not None:
            language, prob = request.options.language, 1.0
        elif callable(self._detected):
            language, prob = self._detected(request)
        else:
            language, prob = self._detected
        return AsrResult(text=text, confidence=0.9, language=language, language_probability=prob)


class EnergyVoiceDetector:
    """A FAKE voice model for component tests: voiced when the level is above a threshold.

    Lets a test write "speech" as a loud tone and silence as zeros.
    """

    def __init__(self, threshold_dbfs: float = -40.0) -> None:
        self._threshold = 32768.0 * 10.0 ** (threshold_dbfs / 20.0)

    def voice_confidence(self, frame: npt.NDArray[np.int16]) -> float:
        """1.0 above the threshold, else 0.0."""
        rms = float(np.sqrt(np.mean(frame.astype(np.float64) ** 2))) if len(frame) else 0.0
        return 1.0 if rms > self._threshold else 0.0


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
