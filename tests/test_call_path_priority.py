"""Who gets the cores on the call path: the loop, then first audio, then windows, then finals.

Issue 35: eight paced replies through ``Converse`` stalled where the in-process synthesis
benchmark did not, because on the call path the synthesis workers share two cores with the
event loop (every call's frame pacing, VAD and echo canceller) and with the recogniser's
threads (the callers' finals), and the kernel shared them evenly: the loop waited for a core
as long as it ran and the workers got a third of a core each (``benchmarks/calls/replies.py``;
docs/tts-scheduling.md, "On the call path"). These tests check the order that fixes it on the
real engines, by thread priority and by which thread runs what, never by timing:

* a reply's first audio runs on the first-audio thread at the loop's priority, its later
  windows on workers ``tts_nice`` levels below;
* on a served default gateway, the synthesis workers, the first-audio thread and the
  recogniser's CTranslate2 threads have the nice values of the configuration, and the loop's
  own thread is untouched;
* a served default gateway keeps NumPy's BLAS to one thread: OpenBLAS's helper threads, at the
  loop's priority, spin after each call (a decode's features) and took the cores from the
  finals (``limit_blas_threads``).
"""

from __future__ import annotations

import asyncio
import os
import sys
import threading
import time
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np
import pytest
from threadpoolctl import threadpool_info, threadpool_limits

from voxgate.engines.tts import (
    ReplyJob,
    SpeakOptions,
    TtsChunk,
    TtsConfig,
    VitsStreamer,
    WindowPlan,
)
from voxgate.gateway.config import load_config
from voxgate.gateway.priority import limit_blas_threads, thread_nice
from voxgate.gateway.runtime import build_hub
from voxgate.gateway.scheduling.synthesis import SynthesisScheduler, policy_for
from voxgate.gateway.testing.server import running_server
from voxgate_client import CallConfig, PlaybackFinished, VoxgateClient

pytestmark = pytest.mark.model

linux = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="per-thread nice")

REPLY = (
    "Thanks for calling, your order has shipped. It should arrive on Tuesday, March 3rd. "
    "The total came to $42.50, including tax. Is there anything else I can help you with?"
)


@pytest.fixture(scope="module")
def streamer() -> Iterator[VitsStreamer]:
    engine = VitsStreamer.load(TtsConfig(cache_bytes=0))
    engine.warmup()
    yield engine
    engine.close()


@linux
async def test_first_audio_runs_at_the_loops_priority_and_later_windows_below_it(
    streamer: VitsStreamer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With both workers idle, the first front end and window still go to the first-audio
    thread (they run in one step); every window on a worker runs ``nice`` levels lower."""
    base = thread_nice()
    assert base is not None
    nice = min(3, 19 - base)
    fronts: list[tuple[str, int | None]] = []
    windows: list[tuple[str, int | None]] = []
    run_front_end, decode = ReplyJob.run_front_end, streamer.decode_windows

    def front_recorded(job: ReplyJob, **kw: Any) -> list[TtsChunk]:
        fronts.append((threading.current_thread().name, thread_nice()))
        return run_front_end(job, **kw)

    def decode_recorded(
        items: Sequence[tuple[ReplyJob, WindowPlan]], **kw: Any
    ) -> list[np.ndarray]:
        windows.append((threading.current_thread().name, thread_nice()))
        return decode(items, **kw)

    monkeypatch.setattr(ReplyJob, "run_front_end", front_recorded)
    monkeypatch.setattr(streamer, "decode_windows", decode_recorded)
    scheduler = SynthesisScheduler(streamer, 2, policy_for(streamer), nice=nice)
    try:
        chunks = [c async for c in scheduler.stream(REPLY, SpeakOptions())]
    finally:
        await scheduler.aclose()
    assert chunks and len(windows) > 2
    first_thread, first_nice = fronts[0]
    assert first_thread.startswith("tts-first") and first_nice == base
    on_workers = [n for name, n in windows if name.startswith("tts_")]
    assert on_workers and set(on_workers) == {base + nice}
    assert thread_nice() == base  # the loop's thread


async def test_a_paced_reply_waits_max_lead_ahead_of_its_player_an_unpaced_one_never(
    streamer: VitsStreamer,
) -> None:
    """On a clock that stands still, a paced reply stops about ``max_lead_s`` ahead of its
    player (the cores go to finals due now); an unpaced one (Synthesize) runs to its end.
    Once the clock moves (here 50 times real time), the paced reply goes on to its end."""
    stopped_at: list[float | None] = [0.0]  # None: the clock runs
    started = time.perf_counter()

    def clock() -> float:
        if stopped_at[0] is not None:
            return stopped_at[0]
        return 1000.0 + 50.0 * (time.perf_counter() - started)

    lead_s = 0.5
    scheduler = SynthesisScheduler(
        streamer, 2, policy_for(streamer), max_lead_s=lead_s, clock=clock
    )
    rate = streamer.sample_rate_hz
    try:
        whole = [c async for c in scheduler.stream(REPLY, SpeakOptions())]
        assert whole[-1].is_last

        stream = scheduler.stream(REPLY, SpeakOptions(), paced=True)
        got = [await anext(stream)]
        # Until nothing more comes (a held reply's workers stay idle); the pending read is
        # not cancelled (that would cancel the reply).
        pending = asyncio.ensure_future(anext(stream))
        while (await asyncio.wait({pending}, timeout=2.0))[0]:
            got.append(pending.result())
            pending = asyncio.ensure_future(anext(stream))
        ahead_s = sum(len(c.samples) for c in got) / rate
        largest_s = 2 * scheduler.policy.max_window_frames * scheduler.policy.frame_s
        assert ahead_s < lead_s + largest_s
        assert not got[-1].is_last and ahead_s < sum(len(c.samples) for c in whole) / rate
        assert scheduler.queue_depth == 0  # held, not waiting for a worker

        started = time.perf_counter()
        stopped_at[0] = None  # the player plays on: the rest follows
        rest = [await asyncio.wait_for(pending, 30.0)]
        rest += [c async for c in stream]
        assert rest[-1].is_last
        # All of it: about as long as the unpaced run (the voice's durations are sampled,
        # so not to the sample).
        total = sum(len(c.samples) for c in got + rest)
        assert abs(total / sum(len(c.samples) for c in whole) - 1.0) < 0.2
    finally:
        await scheduler.aclose()


def _nice_of(tid: int) -> int:
    """A thread's nice value from /proc (field 19 of its stat line)."""
    with open(f"/proc/self/task/{tid}/stat") as f:
        stat = f.read()
    return int(stat[stat.rindex(")") + 2 :].split()[16])


@linux
async def test_a_served_gateway_puts_its_engine_threads_below_the_loop() -> None:
    """Default configuration, one reply through Converse, then every thread's nice value."""
    base = thread_nice()
    assert base is not None
    before = set(os.listdir("/proc/self/task"))
    cfg = load_config(None, {"server": {"host": "127.0.0.1", "port": 0}})
    tts_nice, asr_nice = cfg.session.tts_nice, cfg.batcher.engine_nice
    assert 0 < tts_nice < asr_nice  # finals yield to windows, windows to the loop
    async with running_server(hub=build_hub(cfg), config=cfg) as srv:
        async with VoxgateClient(srv.target) as client:
            call = await client.converse(CallConfig())
            speak_id = await call.speak("Okay, one moment.")
            async for event in call:
                if isinstance(event, PlaybackFinished) and event.speak_id == speak_id:
                    break
            await call.hangup()
        python = {t.native_id: t.name for t in threading.enumerate()}
        workers = [tid for tid, name in python.items() if name.startswith("tts_")]
        lane = [tid for tid, name in python.items() if name.startswith("tts-first")]
        assert workers and lane
        assert {_nice_of(t) for t in workers if t is not None} == {min(19, base + tts_nice)}
        assert {_nice_of(t) for t in lane if t is not None} == {base}
        # CTranslate2's own threads (not Python's), started while the model loaded.
        started = {int(t) for t in os.listdir("/proc/self/task")} - {int(t) for t in before}
        lowered = [t for t in started if t not in python and _nice_of(t) == base + asr_nice]
        assert lowered
        assert thread_nice() == base


def _blas_threads() -> set[int]:
    return {int(i["num_threads"]) for i in threadpool_info() if i["user_api"] == "blas"}


def test_blas_threads_are_capped_process_wide_and_zero_leaves_them() -> None:
    """The cap applies to NumPy's own BLAS (what threadpoolctl reports for it); 0 is a no-op."""
    assert _blas_threads(), "NumPy's BLAS reports no thread pool"
    with threadpool_limits(limits=2, user_api="blas"):
        assert limit_blas_threads(0) is None
        assert _blas_threads() == {2}
        assert limit_blas_threads(1) == 2
        assert _blas_threads() == {1}
        assert np.allclose(np.ones((64, 64)) @ np.ones((64, 64)), 64.0)


async def test_a_served_default_gateway_keeps_numpy_blas_to_one_thread() -> None:
    """Default configuration: after the engines load, NumPy's BLAS has one thread, from two."""
    cfg = load_config(None, {"server": {"host": "127.0.0.1", "port": 0}})
    assert cfg.batcher.numpy_blas_threads == 1
    with threadpool_limits(limits=2, user_api="blas"):
        assert _blas_threads() == {2}
        async with running_server(hub=build_hub(cfg), config=cfg):
            assert _blas_threads() == {1}
