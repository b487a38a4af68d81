"""The end-of-turn policy (gateway/turns.py): words, silence and the audio model, step by step."""

from __future__ import annotations

import pytest

from gateway.turns import TurnDetector, TurnInput, TurnOptions, text_completion

pytestmark = pytest.mark.unit

SMART = TurnOptions(mode="smart", min_silence_ms=200, max_pause_ms=1600, end_silence_ms=600)


@pytest.mark.parametrize(
    ("text", "finished"),
    [
        ("I would like to book a table.", True),
        ("Can you hear me?", True),
        ("I would like to book a table and", False),
        ("I would like to book a table for the", False),
        ("My number is 0 7 7 0 0,", False),
        ("My number is seven seven oh", False),
        ("It costs 12", False),
        ("I was thinking, um", False),
        ("And so, my fellow Americans,", False),
        ("because", False),
        ("well...", False),
    ],
)
def test_the_words_say_whether_a_clause_is_finished(text: str, finished: bool) -> None:
    assert (text_completion(text) >= 0.8) is finished
    assert (text_completion(text) <= 0.3) is not finished


def test_a_finished_sentence_ends_the_turn_at_a_short_silence() -> None:
    detector = TurnDetector(SMART)
    text = "I would like to book a table."
    hold = detector.decide(TurnInput(0, text)).hold_ms
    assert 200 <= hold <= 400
    assert not detector.decide(TurnInput(hold - 20, text)).end
    decision = detector.decide(TurnInput(hold, text))
    assert decision.end and decision.reason == "words" and decision.probability >= 0.9


def test_an_unfinished_clause_holds_the_turn_up_to_the_max_pause() -> None:
    detector = TurnDetector(SMART)
    text = "I would like to book a table for the"
    assert not detector.decide(TurnInput(1000, text)).end
    assert not detector.decide(TurnInput(1200, text)).end
    decision = detector.decide(TurnInput(1600, text))
    assert decision.end and decision.reason == "max_pause"


def test_words_not_decoded_yet_wait_up_to_the_plain_hangover() -> None:
    detector = TurnDetector(SMART)
    assert not detector.decide(TurnInput(400, None)).end
    decision = detector.decide(TurnInput(600, None))
    assert decision.end and decision.reason == "silence"


def test_the_audio_model_moves_the_hold_both_ways() -> None:
    detector = TurnDetector(SMART)
    plain = detector.decide(TurnInput(0, "okay")).hold_ms
    done = detector.decide(TurnInput(0, "okay", audio_probability=0.98)).hold_ms
    unsure = detector.decide(TurnInput(0, "okay", audio_probability=0.05)).hold_ms
    assert done < plain < unsure
    assert detector.decide(TurnInput(done, "okay", audio_probability=0.98)).reason == "audio"
    # The audio model cannot end a clause that the words say is unfinished at a short pause.
    assert not detector.decide(TurnInput(400, "and the", audio_probability=1.0)).end


def test_eagerness_scales_the_hold() -> None:
    text = "okay"
    holds = [
        TurnDetector(TurnOptions(mode="smart", eagerness=e)).decide(TurnInput(0, text)).hold_ms
        for e in (0.0, 0.5, 1.0)
    ]
    assert holds[0] > holds[1] > holds[2] == TurnOptions().min_silence_ms


def test_silence_mode_ends_every_utterance_at_its_hangover() -> None:
    detector = TurnDetector(TurnOptions(mode="silence", end_silence_ms=600))
    assert not detector.decide(TurnInput(580, "and the")).end
    decision = detector.decide(TurnInput(600, None))
    assert decision.end and decision.reason == "silence"
