"""The recogniser's open decode batch: requests are added, stepped together, finished one by one.

This is the engine side of iteration-level batching, shaped like vLLM's ``EngineCore``
(``add_request`` / ``step`` / ``abort_requests``): the gateway's scheduler decides which
requests run and when one joins; the engine only adds, steps and aborts what it is given, and
never calls back into the scheduler.

* ``add`` plans each request's jobs (one per 30 s chunk), encodes the newcomers together and
  puts their decodes into the running step loop (the prompt runs at once; they join the next
  step). A request the policy refuses (too short, unsupported language) is finished at once.
* ``step`` runs one decode step for every open decode. A decode that ends is recorded and the
  retry ladder decides what next (:func:`voxgate.engines.asr._jobs.next_step`): a fallback
  (runner-up language, full window, hotter temperature) re-enters the loop as the job's next
  round, inside the engine, so a request is finished once, when its last round is done. The
  ladder's budget, gates, MBR and word alignment are the batch path's (``infer_batch``).
* ``abort`` drops requests (their decodes leave the loop, their pending results are
  forgotten). A batch with nothing left open after an abort is closed: the next ``add`` starts
  a new one (a fresh loop; request numbers, which seed sampling, from 0), as a new run did when
  the engine ran the whole loop itself.

Why the fallback rounds stay in the engine: the ladder is Whisper's (its gates, its encoder
windows, its temperatures, each job's latency budget measured on the engine's clock), the
scheduler knows nothing of Whisper, and a retry keeps the slot its request already holds, so
the batch the scheduler sized is the batch that runs.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Hashable, Iterable, Sequence
from typing import Protocol

from voxgate.engines.asr._decode import DecodeItem, DecodeResult, StepLoop
from voxgate.engines.asr._jobs import EngineCounters, Job
from voxgate.engines.asr.base import AsrRequest, AsrResult

__all__ = ["StepBatch"]


class _Rounds(Protocol):
    """What the step batch needs from the engine (``WhisperEngine`` and its torch subclass)."""

    counters: EngineCounters
    _clock: Callable[[], float]

    def _refusal(self, req: AsrRequest) -> AsrResult | None: ...

    def _plan_jobs(self, index: int, req: AsrRequest, started: float) -> list[Job]: ...

    def _encode(self, jobs: list[Job]) -> None: ...

    def _wants_loop(self, job: Job) -> bool: ...

    def _run_rounds(self, jobs: list[Job]) -> None: ...

    def _loop_item(self, job: Job) -> tuple[float, DecodeItem]: ...

    def _loop_record(self, job: Job, temp: float, res: DecodeResult) -> None: ...

    def _after_decode(self, job: Job, now: float) -> None: ...

    def _finish_request(self, jobs: list[Job]) -> AsrResult: ...


class StepBatch:
    """One open decode batch of an engine; see the module docstring for the rules.

    Threading: not thread-safe; the engine's worker thread calls every method.

    Args:
        engine: the engine whose rounds (encode, plan, record, finish) this batch runs.
        loop: an empty step loop (the engine's ``_new_loop()``).
    """

    def __init__(self, engine: _Rounds, loop: StepLoop) -> None:
        self._engine = engine
        self._loop = loop
        #: id(decode item) -> (job, its temperature, the item), for decodes in the loop.
        self._live: dict[int, tuple[Job, float, DecodeItem]] = {}
        #: request number -> (its key, its jobs), until the request is finished.
        self._open: dict[int, tuple[Hashable, list[Job]]] = {}
        #: Results finished since the last ``step`` returned, in the order they finished.
        self._finished: list[tuple[Hashable, AsrResult]] = []
        self._next_index = 0
        self._steps = 0

    @property
    def open_count(self) -> int:
        """Requests added and not yet finished (decoding, or between two rounds)."""
        return len(self._open)

    def has_unfinished(self) -> bool:
        """Whether a request is open or a finished one has not been returned by ``step``."""
        return bool(self._open or self._finished)

    def add(self, requests: Sequence[tuple[Hashable, AsrRequest]]) -> None:
        """Start decoding ``requests`` (key, request); each one's budget starts now.

        Raises:
            ValueError: a key that is already open in this batch.
        """
        engine = self._engine
        open_keys = {key for key, _ in self._open.values()}
        jobs: list[Job] = []
        started = engine._clock()
        for key, req in requests:
            if key in open_keys:
                raise ValueError(f"request key {key!r} is already decoding in this batch")
            refused = engine._refusal(req)
            if refused is not None:
                self._finished.append((key, refused))
                continue
            index = self._next_index
            self._next_index += 1
            planned = engine._plan_jobs(index, req, started)
            self._open[index] = (key, planned)
            open_keys.add(key)
            jobs.extend(planned)
        engine._encode(jobs)  # the newcomers' encodes are batched
        for job in jobs:
            self._advance(job)

    def step(self) -> list[tuple[Hashable, AsrResult]]:
        """Run one decode step; the requests that finished since the last call, with results.

        Results that finished outside a decode step (a refusal, a decode ``generate`` ran at
        once) are returned without running one, so that they are not held back by a step.
        """
        if not self._finished and self._loop.active:
            self._decode_step()
        done, self._finished = self._finished, []
        return done

    def abort(self, keys: Iterable[Hashable]) -> None:
        """Drop the requests of ``keys`` (unknown keys are ignored); no result comes for them."""
        gone = set(keys)
        if not gone:
            return
        for index, (key, _) in list(self._open.items()):
            if key in gone:
                del self._open[index]
        for item_id, (job, _, item) in list(self._live.items()):
            if job.req not in self._open:
                self._loop.abort(item)
                del self._live[item_id]
        self._finished = [(k, r) for k, r in self._finished if k not in gone]

    def _decode_step(self) -> None:
        engine, loop, counters = self._engine, self._loop, self._engine.counters
        rows = loop.rows
        t0 = time.perf_counter()
        done = loop.step()
        counters.loop_s += time.perf_counter() - t0
        counters.loop_steps += 1
        counters.loop_rows += loop.rows - rows
        self._steps += 1
        for item in done:
            job, temp, _ = self._live.pop(id(item))
            assert item.result is not None
            engine._loop_record(job, temp, item.result)
            now = engine._clock()
            job.decode_s = now - job.round_started
            engine._after_decode(job, now)
            self._advance(job)

    def _advance(self, job: Job) -> None:
        """Finish ``job``'s request if every job of it is done, else start its next round."""
        engine = self._engine
        if not job.done and not engine._wants_loop(job):
            engine._run_rounds([job])  # a decode the loop cannot run: generate, at once
        if job.done:
            key, jobs = self._open[job.req]
            if all(j.done for j in jobs):
                del self._open[job.req]
                self._finished.append((key, engine._finish_request(jobs)))
            return
        engine._encode([job])  # a window fallback needs the full-window encoding
        temp, item = engine._loop_item(job)
        job.round_started = engine._clock()
        if self._steps and self._loop.active:
            engine.counters.loop_joined += 1
        self._loop.add(item)
        self._live[id(item)] = (job, temp, item)
        engine.counters.loop_items += 1
