"""No utterance with text is lost: a final with no text of its own carries its last interim's.

Component tests of ``CallSession`` with FAKE recognisers (voxgate.gateway.testing): on the virtual
clock for the decode outcomes, and on a real loop behind the REAL batcher for a hung final decode
(``batch_timeout_s``), whose worker threads take real time.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Sequence

import pytest
from test_session import Call, drive, silence, tone

from voxgate.engines.asr.base import AsrRequest, AsrResult
from voxgate.gateway.call.options import InterimOptions, RecognitionOptions
from voxgate.gateway.errors import CallError, ErrorKind
from voxgate.gateway.events import ErrorOut, TranscriptOut
from voxgate.gateway.metrics import GatewayMetrics
from voxgate.gateway.runtime import AsrTranscriber, BatchMetrics
from voxgate.gateway.scheduling import Batcher, BatchPolicy
from voxgate.gateway.testing.fake_engines import FakeTranscriber

pytestmark = pytest.mark.component

INTERIM = "ask not what your"


class FinalOutcome:
    """A fake recogniser whose interims hear the words and whose finals go wrong as told.

    Args:
        final: the final's result, or the exception its decode raises.
    """

    def __init__(self, final: AsrResult | Exception) -> None:
        self._final = final
        self.inner = FakeTranscriber(lambda r: INTERIM, speculate=False)

    def can_speculate(self) -> bool:
        return self.inner.can_speculate()

    def spare_worker(self) -> bool:
        return self.inner.spare_worker()

    def encode_context(self, initial_prompt: str, hotwords: Sequence[str]) -> tuple[int, ...]:
        return self.inner.encode_context(initial_prompt, hotwords)

    async def transcribe(self, request: AsrRequest) -> AsrResult:
        result = await self.inner.transcribe(request)
        if not request.is_final:
            return result
        if isinstance(self._final, Exception):
            raise self._final
        return self._final


def run_call(asr: object, *, interims: bool = True) -> Call:
    call = Call(
        transcriber=asr,  # type: ignore[arg-type]
        synth=None,
        options={"interims": InterimOptions(results=interims, interval_ms=300)},
    )

    async def script(c: Call) -> None:
        await c.say(tone(1500) + silence(1500))
        await c.inbox.put(None)

    drive(call, script)
    return call


def finals(call: Call) -> list[TranscriptOut]:
    return [e for _, e in call.of(TranscriptOut) if e.is_final]


@pytest.mark.parametrize(
    ("error", "reason"),
    [
        (RuntimeError("engine fault"), "internal"),
        (CallError(ErrorKind.DEADLINE_EXCEEDED, "batch_timeout_s=30"), "deadline_exceeded"),
        (CallError.exhausted("queue full", quota="batcher.max_queue_size"), "resource_exhausted"),
    ],
)
def test_a_failed_final_carries_the_interim_text(error: Exception, reason: str) -> None:
    call = run_call(FinalOutcome(error))
    (final,) = finals(call)
    assert final.result.text == INTERIM and final.utterance_index == 0
    assert final.result.fallbacks == ("interim",)
    assert not call.of(ErrorOut)
    assert call.metrics.value("voxgate_asr_finals_from_interim_total", reason=reason) == 1


@pytest.mark.parametrize("gate", ["repetition", "low_logprob"])
def test_a_final_whose_ladder_kept_no_text_carries_the_interim_text(gate: str) -> None:
    dropped = AsrResult(text="", dropped_reason=gate, fallbacks=("window", "budget"))
    call = run_call(FinalOutcome(dropped))
    (final,) = finals(call)
    assert final.result.text == INTERIM
    assert final.result.fallbacks == ("window", "budget", "interim")
    assert call.metrics.value("voxgate_asr_finals_from_interim_total", reason=gate) == 1


@pytest.mark.parametrize("verdict", ["no_speech", "hallucination"])
def test_a_final_that_heard_no_speech_stands(verdict: str) -> None:
    call = run_call(FinalOutcome(AsrResult(text="", dropped_reason=verdict)))
    (final,) = finals(call)
    assert final.result.text == "" and final.result.dropped_reason == verdict
    assert call.metrics.value("voxgate_asr_finals_from_interim_total", reason=verdict) == 0


def test_a_final_with_text_wins_over_the_interim() -> None:
    call = run_call(FinalOutcome(AsrResult(text="ask not what your country can do")))
    (final,) = finals(call)
    assert final.result.text == "ask not what your country can do"


def test_without_an_interim_a_failed_final_is_still_an_error() -> None:
    call = run_call(FinalOutcome(RuntimeError("engine fault")), interims=False)
    assert not finals(call)
    ((_, err),) = call.of(ErrorOut)
    assert err.kind is ErrorKind.INTERNAL and err.utterance_index == 0


class HungFinals:
    """An engine whose interims answer at once and whose finals hang until released."""

    def __init__(self) -> None:
        self.released = threading.Event()
        self.finals = 0

    def infer_batch(self, items: Sequence[AsrRequest]) -> list[AsrResult]:
        if any(item.is_final for item in items):
            self.finals += 1
            self.released.wait(30.0)
        return [AsrResult(text="late" if i.is_final else INTERIM) for i in items]


async def test_a_final_that_times_out_in_the_batcher_carries_the_interim_text() -> None:
    metrics = GatewayMetrics()
    engine = HungFinals()
    batcher: Batcher[AsrRequest, AsrResult] = Batcher(
        [engine],
        BatchPolicy(max_batch_size=1),
        observer=BatchMetrics(metrics),
        name="hung",
        batch_timeout_s=0.3,
    )
    try:
        async with batcher:
            asr = AsrTranscriber(batcher, 1, lambda prompt, words: (), metrics)
            call = Call(
                transcriber=asr,  # type: ignore[arg-type]
                synth=None,
                options={
                    "interims": InterimOptions(results=True, interval_ms=300),
                    "recognition": RecognitionOptions(speculative_finals=False),
                },
                metrics=metrics,
            )
            runner = asyncio.create_task(call.run())
            await call.say(tone(1500) + silence(1500))
            await call.inbox.put(None)
            await asyncio.wait_for(runner, 20.0)
    finally:
        engine.released.set()
    interims = [e for _, e in call.of(TranscriptOut) if not e.is_final]
    assert interims and engine.finals == 1
    (final,) = finals(call)
    assert final.result.text == INTERIM and final.result.fallbacks == ("interim",)
    assert not call.of(ErrorOut)
    assert metrics.value("voxgate_asr_batch_timeouts_total") == 1
    assert metrics.value("voxgate_asr_finals_from_interim_total", reason="deadline_exceeded") == 1


def test_an_interim_of_a_later_prefix_is_the_one_kept() -> None:
    # Interims of a growing utterance: the longest prefix's text is the stand-in.
    seen: list[int] = []

    def words(request: AsrRequest) -> str:
        seen.append(len(request.audio))
        return f"prefix of {len(request.audio)}"

    class Numbered(FinalOutcome):
        def __init__(self) -> None:
            super().__init__(RuntimeError("engine fault"))
            self.inner = FakeTranscriber(words, speculate=False)

    call = run_call(Numbered())
    (final,) = finals(call)
    assert len(seen) >= 3  # several interims, then the final
    interim_lengths = seen[:-1]
    assert final.result.text == f"prefix of {max(interim_lengths)}"
    assert final.result.fallbacks == ("interim",)
