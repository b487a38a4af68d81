"""End of turn in CallSession, on a virtual clock with FAKE engines (voxgate.gateway.testing).

A turn spans utterances: a pause inside an unfinished sentence ends an utterance (its final
comes) but not the turn, the next part is decoded with the turn's earlier words as its prompt,
and EndOfTurn follows the turn's last final with the whole text. Every timestamp is exact.
"""

from __future__ import annotations

import asyncio
import inspect
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np
import pytest

from voxgate.common.pcm import WireEncoding
from voxgate.engines.asr.base import AsrRequest
from voxgate.engines.asr.config import DecodingPolicyConfig
from voxgate.gateway.call.options import (
    IngressOptions,
    PlaybackOptions,
    RecognitionOptions,
)
from voxgate.gateway.config import LimitsConfig, VadConfig
from voxgate.gateway.events import AudioIn, EndOfTurnOut, InboundEvent, OutboundEvent, TranscriptOut
from voxgate.gateway.metrics import GatewayMetrics
from voxgate.gateway.session import CallConfig, CallSession
from voxgate.gateway.testing.fake_engines import EnergyVoiceDetector, FakeTranscriber
from voxgate.gateway.testing.virtual_time import run_virtual
from voxgate.gateway.turns import TurnOptions

pytestmark = pytest.mark.component


def tone(ms: int) -> bytes:
    t = np.arange(16 * ms) / 16000.0
    return (0.3 * 32767 * np.sin(2 * np.pi * 300 * t)).astype("<i2").tobytes()


def silence(ms: int) -> bytes:
    return bytes(32 * ms)


SMART = TurnOptions(mode="smart", min_silence_ms=200, max_pause_ms=1600, end_silence_ms=600)


@dataclass
class FakeTurnModel:
    """A FAKE audio end-of-turn model: scripted probabilities, one per utterance end.

    ``transcriber``, when given, is read at each run: how many decodes were in flight then.
    """

    answers: list[float]
    seen: list[int] = field(default_factory=list)
    transcriber: FakeTranscriber | None = None
    decodes_in_flight: list[int] = field(default_factory=list)

    def probability(self, audio: np.ndarray) -> float:
        self.seen.append(len(audio))
        if self.transcriber is not None:
            # The utterances' decodes (the turn decoded whole is spare-capacity work after them).
            running = self.transcriber.running
            self.decodes_in_flight.append(sum(1 for r in running if not r.whole_turn))
        return self.answers[len(self.seen) - 1]


@dataclass
class Call:
    transcriber: FakeTranscriber
    turns: TurnOptions = SMART
    hangover_ms: int = 200
    turn_model: FakeTurnModel | None = None
    alone: bool = False
    #: The server's asr.policy.decode_budget_s, where a test sets one (else the session's own).
    decode_budget_s: float | None = None
    out: list[tuple[float, OutboundEvent]] = field(default_factory=list)

    def __post_init__(self) -> None:
        cfg = CallConfig(
            ingress=IngressOptions(WireEncoding.LINEAR16, 16000),
            playback=PlaybackOptions(WireEncoding.LINEAR16, 16000),
            vad=VadConfig(end_silence_ms=self.hangover_ms),
            recognition=RecognitionOptions(turns=self.turns),
        )
        self.inbox: asyncio.Queue[InboundEvent | None] = asyncio.Queue()
        self.session = CallSession(
            cfg,
            LimitsConfig(),
            self.transcriber,
            None,
            metrics=GatewayMetrics(),
            detector=EnergyVoiceDetector(),
            turn_model=self.turn_model,
            alone=lambda: self.alone,
            **({} if self.decode_budget_s is None else {"decode_budget_s": self.decode_budget_s}),
        )

    def run(self, pcm: bytes) -> None:
        async def main() -> None:
            loop = asyncio.get_running_loop()

            async def sink(event: OutboundEvent) -> None:
                self.out.append((loop.time(), event))

            runner = asyncio.create_task(self.session.run(self.inbox.get, sink))

            for i in range(0, len(pcm), 640):
                await self.inbox.put(AudioIn(pcm[i : i + 640]))
                await asyncio.sleep(0.02)
            await self.inbox.put(None)
            await asyncio.wait_for(runner, 600)  # virtual seconds: a hang guard

        run_virtual(main())

    def of(self, kind: type[Any]) -> list[Any]:
        return [e for _, e in self.out if isinstance(e, kind)]


def test_a_pause_inside_an_unfinished_sentence_does_not_end_the_turn() -> None:
    texts = {0: "And so, my fellow Americans,", 1: "ask not what your country can do for you."}
    asr = FakeTranscriber(lambda r: texts[int(len(r.options.initial_prompt) > 0)], delay_s=0.05)
    call = Call(asr)
    call.run(silence(200) + tone(1000) + silence(900) + tone(1200) + silence(1500))
    finals = call.of(TranscriptOut)
    assert [f.turn_index for f in finals] == [0, 0]
    (end,) = call.of(EndOfTurnOut)
    assert end.turn_index == 0 and end.reason == "words"
    assert end.text == "And so, my fellow Americans, ask not what your country can do for you."
    assert (end.first_utterance_index, end.last_utterance_index) == (0, 1)
    # The second part was decoded with the first part's words as its prompt.
    prompts = {r.options.initial_prompt for r in asr.requests}
    assert "And so, my fellow Americans," in prompts
    # EndOfTurn comes after the turn's last final.
    assert call.out.index(next(x for x in call.out if x[1] is end)) > max(
        call.out.index(x) for x in call.out if isinstance(x[1], TranscriptOut)
    )


def test_a_finished_sentence_ends_the_turn_soon_after_its_final() -> None:
    asr = FakeTranscriber(["I would like to book a table."], delay_s=0.05)
    call = Call(asr)
    call.run(silence(200) + tone(1000) + silence(1500))
    (final,) = call.of(TranscriptOut)
    (end,) = call.of(EndOfTurnOut)
    assert final.turn_index == 0 and end.text == "I would like to book a table."
    # The final decode started at the first silence, so the final is out with the hangover.
    assert final.latency_ms == 0
    assert 200 <= end.silence_ms <= 400 and end.reason == "words"


def test_an_unfinished_clause_is_held_until_max_pause() -> None:
    asr = FakeTranscriber(["I want to go to the"], delay_s=0.05)
    call = Call(asr)
    call.run(silence(200) + tone(1000) + silence(2500))
    (end,) = call.of(EndOfTurnOut)
    # Held over pauses of up to 1.4 s (p = 0.1 earns 90 % of the span), never past max_pause.
    assert 1400 <= end.silence_ms <= 1600 and end.reason in {"words", "max_pause"}


def test_two_turns_are_numbered_and_their_finals_carry_the_index() -> None:
    asr = FakeTranscriber(["Hello there.", "Goodbye."], delay_s=0.05)
    call = Call(asr)
    call.run(tone(800) + silence(1200) + tone(800) + silence(1200))
    assert [f.turn_index for f in call.of(TranscriptOut)] == [0, 1]
    assert [(e.turn_index, e.text) for e in call.of(EndOfTurnOut)] == [
        (0, "Hello there."),
        (1, "Goodbye."),
    ]


def test_silence_mode_makes_every_utterance_a_turn() -> None:
    asr = FakeTranscriber(["one and", "two"], delay_s=0.05)
    call = Call(asr, turns=TurnOptions(mode="silence", end_silence_ms=600), hangover_ms=600)
    call.run(tone(800) + silence(900) + tone(800) + silence(900))
    assert [(e.turn_index, e.text, e.reason) for e in call.of(EndOfTurnOut)] == [
        (0, "one and", "silence"),
        (1, "two", "silence"),
    ]


def test_hangup_ends_the_open_turn_after_its_final() -> None:
    asr = FakeTranscriber(["I want to go to the"], delay_s=0.05)
    call = Call(asr)
    call.run(tone(1000) + silence(300))
    (end,) = call.of(EndOfTurnOut)
    assert end.reason == "hangup" and end.text == "I want to go to the"


def test_turn_detection_off_sends_no_turns() -> None:
    asr = FakeTranscriber(["Hello."], delay_s=0.05)
    call = Call(asr, turns=TurnOptions(), hangover_ms=600)
    call.run(tone(800) + silence(1200))
    assert call.of(EndOfTurnOut) == []
    assert [f.turn_index for f in call.of(TranscriptOut)] == [None]


def test_the_audio_model_holds_a_turn_over_a_pause_after_a_closed_fragment() -> None:
    texts = ["Go forward.", "ten meters."]
    words_only = Call(FakeTranscriber(texts, delay_s=0.05))
    words_only.run(tone(800) + silence(900) + tone(800) + silence(1500))
    assert len(words_only.of(EndOfTurnOut)) == 2  # the full stop ended the turn too soon

    model = FakeTurnModel([0.05, 0.95])
    # The third request is the turn decoded whole (both utterances as one).
    call = Call(FakeTranscriber([*texts, "Go forward ten meters."], delay_s=0.05), turn_model=model)
    call.run(tone(800) + silence(900) + tone(800) + silence(1500))
    (end,) = call.of(EndOfTurnOut)
    assert end.text == "Go forward ten meters." and end.reason == "audio"
    assert [f.result.text for f in call.of(TranscriptOut)] == texts
    # It read the caller's audio up to each utterance's end (8 s at most).
    assert len(model.seen) == 2 and 0 < model.seen[0] < model.seen[1] <= 8 * 16000


def test_the_audio_model_runs_after_the_final_decode_it_would_slow_down() -> None:
    """The final is what the caller waits for: the model's run never overlaps its decode."""
    texts = ["Go forward.", "ten meters."]
    transcriber = FakeTranscriber(texts, delay_s=0.4)  # still decoding when the speech ends
    model = FakeTurnModel([0.05, 0.95], transcriber=transcriber)
    call = Call(transcriber, turn_model=model)
    call.run(tone(800) + silence(900) + tone(800) + silence(1500))
    (end,) = call.of(EndOfTurnOut)
    # The whole-turn decode (0.4 s) was not back when the turn ended: the finals joined.
    assert end.text == "Go forward. ten meters." and end.reason == "audio"
    assert model.decodes_in_flight == [0, 0]


# -- the turn decoded whole ---------------------------------------------------------------------

#: Two parts of one sentence with a pause between them (held: the first part is unfinished).
TWO_PARTS = silence(200) + tone(1000) + silence(900) + tone(1200) + silence(1500)
PARTS = ["The cut on his", "chest is still dripping blood."]
WHOLE = "The cut on his chest is still dripping blood."


def _whole_requests(asr: FakeTranscriber) -> list[Any]:
    return [r for r in asr.requests if r.whole_turn]


def test_a_turn_of_two_utterances_is_decoded_whole_and_that_is_its_text() -> None:
    """The finals are sent as decoded; EndOfTurn's text is the turn decoded as one: both
    utterances' audio in one request, from spare capacity (bulk), without the turn's words as
    a prompt and without word times; the end of the turn came when it would have anyway."""
    asr = FakeTranscriber([*PARTS, WHOLE], delay_s=0.05)
    call = Call(asr)
    call.run(TWO_PARTS)
    assert [f.result.text for f in call.of(TranscriptOut)] == PARTS
    (end,) = call.of(EndOfTurnOut)
    assert end.text == WHOLE and end.reason == "words"
    first, second = (r for r in asr.requests if not r.whole_turn)
    (whole,) = _whole_requests(asr)
    # Both utterances as they ended (the finals' decodes started before their hangovers ran
    # out, on less of the audio): the first one's audio first, then the second's.
    assert whole.is_final and len(whole.audio) >= len(first.audio) + len(second.audio)
    # Named as a turn's second pass, so the gateway's metrics do not count it as an utterance.
    assert whole.whole_turn and not first.whole_turn and not second.whole_turn
    assert whole.bulk and not first.bulk and not second.bulk
    assert np.array_equal(whole.audio[: len(first.audio)], first.audio)
    assert whole.options.initial_prompt == "" and not whole.options.word_timestamps
    assert whole.stats.speech_ms == first.stats.speech_ms + second.stats.speech_ms

    # The same call, the whole decode off: the same end of turn, at the same time.
    off = Call(FakeTranscriber(PARTS, delay_s=0.05), turns=replace(SMART, whole_text=False))
    off.run(TWO_PARTS)
    (end_off,) = off.of(EndOfTurnOut)
    assert end_off.text == "The cut on his chest is still dripping blood."  # the finals joined
    assert not _whole_requests(off.transcriber)
    at = next(t for t, e in call.out if e is end)
    assert at == pytest.approx(next(t for t, e in off.out if e is end_off), abs=1e-9)


def test_a_whole_decode_not_back_when_the_turn_ends_is_not_waited_for() -> None:
    """The end of the turn never waits for it: a slow one leaves the finals joined."""
    asr = FakeTranscriber([*PARTS, "never shown"], delay_s=lambda i: 5.0 if i == 2 else 0.05)
    call = Call(asr)
    call.run(TWO_PARTS + silence(6000))
    (end,) = call.of(EndOfTurnOut)
    assert end.text == "The cut on his chest is still dripping blood."
    assert len(_whole_requests(asr)) == 1
    assert 2 in asr.cancelled  # it was stopped once the turn ended


def test_a_whole_decode_that_lost_words_is_not_the_turns_text() -> None:
    """A whole decode with under half the finals' words (it lost a clause) is not used."""
    call = Call(FakeTranscriber([*PARTS, "The cut."], delay_s=0.05))
    call.run(TWO_PARTS)
    (end,) = call.of(EndOfTurnOut)
    assert end.text == "The cut on his chest is still dripping blood."


def test_the_caller_going_on_starts_the_whole_decode_again_with_every_part() -> None:
    """Three parts: the decode of the first two is stopped when the third begins, and the one
    that is the turn's text holds all three."""
    # In arrival order: two finals, their whole decode (slow: the caller goes on before it is
    # back), the third final, the whole decode of all three.
    texts = ["The cut on his", "chest is still", "stale", "dripping blood.", WHOLE]
    asr = FakeTranscriber(texts, delay_s=lambda i: 1.5 if i == 2 else 0.05)
    call = Call(asr)
    call.run(
        silence(200)
        + tone(1000)
        + silence(900)
        + tone(700)
        + silence(900)
        + tone(900)
        + silence(1500)
    )
    (end,) = call.of(EndOfTurnOut)
    assert end.text == WHOLE
    assert [f.result.text for f in call.of(TranscriptOut)] == [texts[0], texts[1], texts[3]]
    parts = [r for r in asr.requests if not r.whole_turn]
    wholes = _whole_requests(asr)
    assert len(parts) == 3 and len(wholes) == 2
    assert len(wholes[0].audio) < sum(len(r.audio) for r in parts) <= len(wholes[-1].audio)
    first_whole = next(k for k, r in enumerate(asr.requests) if r is wholes[0])
    assert first_whole in asr.cancelled  # the caller went on


def test_a_single_utterance_turn_is_not_decoded_again() -> None:
    asr = FakeTranscriber(["I would like to book a table."], delay_s=0.05)
    call = Call(asr)
    call.run(silence(200) + tone(1000) + silence(1500))
    (end,) = call.of(EndOfTurnOut)
    assert end.text == "I would like to book a table." and not _whole_requests(asr)


def test_an_engine_fault_in_the_whole_decode_leaves_the_finals_joined() -> None:
    """A fault in the turn's whole decode (request 2) costs that text only: the turn ends on
    time with its finals joined, and the call goes on to its next turn."""
    asr = FakeTranscriber([*PARTS], delay_s=0.05, fail={2})
    call = Call(asr)
    call.run(TWO_PARTS + tone(1000) + silence(1500))
    first, second = call.of(EndOfTurnOut)
    assert first.text == "The cut on his chest is still dripping blood."
    assert second.turn_index == 1 and second.text == "utterance 3"


#: JFK's shape: a clause, a short word alone between pauses, the rest of the sentence.
JFK_PARTS = ["And so my fellow Americans,", "", "what your country can do for you."]
JFK_WHOLE = "And so my fellow Americans, ask not what your country can do for you."


def _three_part_call(
    *, unsure: bool, whole_s: float, alone: bool = False, decode_budget_s: float | None = None
) -> tuple[Call, FakeTranscriber]:
    """The middle part's final (request 1) has no text: the recogniser unsure of it (its words
    lost), or hearing no speech in it; each decode of the turn whole takes ``whole_s``.
    ``alone``: the call has the server to itself. ``decode_budget_s``: the server's (else the
    session's default)."""

    def text(request: AsrRequest) -> str:
        parts = [r for r in asr.requests if not r.whole_turn]
        return (
            JFK_WHOLE
            if request.whole_turn
            else JFK_PARTS[next(k for k, r in enumerate(parts) if r is request)]
        )

    asr = FakeTranscriber(
        text,
        delay_s=lambda i: whole_s if asr.requests[i].whole_turn else 0.05,
        unsure={1} if unsure else (),
    )
    call = Call(asr, alone=alone, decode_budget_s=decode_budget_s)
    call.run(
        silence(200)
        + tone(1000)
        + silence(700)
        + tone(400)
        + silence(700)
        + tone(1200)
        + silence(2500)
    )
    return call, asr


def test_a_turn_that_lost_words_waits_for_its_whole_decode() -> None:
    """A short word alone came back unsure (no text): the turn decoded whole hears it with its
    sentence, and EndOfTurn waits for that decode, its text whole. A part that was no speech
    is left out of the whole decode, and that turn ends without waiting (finals joined)."""
    lost, asr = _three_part_call(unsure=True, whole_s=0.4)
    heard_nothing, asr_nothing = _three_part_call(unsure=False, whole_s=0.4)
    (end,) = lost.of(EndOfTurnOut)
    (end_nothing,) = heard_nothing.of(EndOfTurnOut)
    assert end.text == JFK_WHOLE
    assert end_nothing.text == "And so my fellow Americans, what your country can do for you."
    parts = [r for r in asr.requests if not r.whole_turn]
    # The first two parts were decoded whole too, until the caller went on.
    *_, whole = _whole_requests(asr)
    (whole_nothing,) = _whole_requests(asr_nothing)
    # Each part as it ended (its final's decode started before its hangover ran out, on less).
    assert len(parts) == 3 and len(whole.audio) >= sum(len(r.audio) for r in parts)
    assert np.array_equal(whole.audio[: len(parts[0].audio)], parts[0].audio)
    # Without the part that was no speech: shorter by that part at least.
    assert len(whole_nothing.audio) + len(parts[1].audio) <= len(whole.audio)
    # The same turn ends at the same point of the call; the one that lost words waits for
    # its whole decode (requested 0.4 s before it came back).
    at = next(t for t, e in lost.out if e is end)
    at_nothing = next(t for t, e in heard_nothing.out if e is end_nothing)
    assert end.offset_ms == end_nothing.offset_ms and end.silence_ms == end_nothing.silence_ms
    assert at_nothing < at <= at_nothing + 0.4


def test_the_session_waits_as_long_as_the_servers_default_decode_budget() -> None:
    """A session made without a budget (tests, embedders) waits what a default server's does."""
    default = inspect.signature(CallSession).parameters["decode_budget_s"].default
    assert default == DecodingPolicyConfig().decode_budget_s == 2.0


@pytest.mark.parametrize(("budget_s", "waited_s"), [(None, 2.0), (3.0, 3.0), (0.0, 1.0)])
def test_a_turn_that_lost_words_waits_for_its_whole_decode_the_decode_budget_at_most(
    budget_s: float | None, waited_s: float
) -> None:
    """A whole decode still running the recogniser's decode budget after the turn ended (the
    default 2 s; never less than a second, though a budget of 0 only stops retries) is given
    up (and stopped): the finals joined are the text."""
    lost, asr = _three_part_call(unsure=True, whole_s=5.0, decode_budget_s=budget_s)
    no_wait, _ = _three_part_call(unsure=False, whole_s=5.0, decode_budget_s=budget_s)
    (end,) = lost.of(EndOfTurnOut)
    (end_no_wait,) = no_wait.of(EndOfTurnOut)
    assert end.text == "And so my fellow Americans, what your country can do for you."
    at = next(t for t, e in lost.out if e is end)
    at_no_wait = next(t for t, e in no_wait.out if e is end_no_wait)
    assert at - at_no_wait == pytest.approx(waited_s, abs=1e-6)
    last_whole = max(k for k, r in enumerate(asr.requests) if r.whole_turn)
    assert last_whole in asr.cancelled


def test_a_whole_decode_slower_than_a_second_is_still_the_text_of_a_turn_that_lost_words() -> None:
    """On a machine whose cores other work holds, the whole decode took 1.1-1.6 s (JFK's turn
    beside one busy process, through Converse); waited for within the budget, the turn's text
    has its words back (a fixed second sent "...Americans, what your country...")."""
    lost, _ = _three_part_call(unsure=True, whole_s=1.5)
    no_wait, _ = _three_part_call(unsure=False, whole_s=1.5)
    (end,) = lost.of(EndOfTurnOut)
    (end_no_wait,) = no_wait.of(EndOfTurnOut)
    assert end.text == JFK_WHOLE
    at = next(t for t, e in lost.out if e is end)
    at_no_wait = next(t for t, e in no_wait.out if e is end_no_wait)
    assert 1.0 < at - at_no_wait <= 1.5


def test_the_whole_decode_a_turn_that_lost_words_waits_for_is_a_real_time_final() -> None:
    """The turn's end waits for it, so it is requested as the parts' finals were: not from
    spare capacity, and alone on the server (every core) when they were."""
    lost, asr = _three_part_call(unsure=True, whole_s=0.4, alone=True)
    _, asr_nothing = _three_part_call(unsure=False, whole_s=0.4, alone=True)
    (end,) = lost.of(EndOfTurnOut)
    assert end.text == JFK_WHOLE
    parts = [r for r in asr.requests if not r.whole_turn]
    assert all(not r.bulk and r.alone for r in parts)
    *_, whole = _whole_requests(asr)
    assert not whole.bulk and whole.alone
    # A turn that lost nothing keeps its whole decode as spare-capacity work on one core.
    (whole_nothing,) = _whole_requests(asr_nothing)
    assert whole_nothing.bulk and not whole_nothing.alone
