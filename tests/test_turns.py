"""The end-of-turn policy (gateway/turns.py): words, silence and the audio model, step by step."""

from __future__ import annotations

from dataclasses import replace

import pytest

from voxgate.gateway import wire
from voxgate.gateway.config import TurnsConfig, VadConfig
from voxgate.gateway.turns import (
    END_MARK_SURE,
    END_MARK_UNSURE,
    TurnDetector,
    TurnInput,
    TurnOptions,
    text_completion,
)
from voxgate.v1 import voxgate_pb2 as pb

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


def test_words_not_decoded_yet_wait_up_to_the_max_pause() -> None:
    detector = TurnDetector(SMART)
    assert not detector.decide(TurnInput(1000, None)).end
    decision = detector.decide(TurnInput(1600, None))
    assert decision.end and decision.reason == "silence"


def test_the_audio_model_holds_what_the_words_would_end_too_soon() -> None:
    detector = TurnDetector(SMART)
    words = detector.decide(TurnInput(0, "Go forward.")).hold_ms
    # Whisper closed the fragment with a full stop; the voice says the sentence goes on.
    held = detector.decide(TurnInput(0, "Go forward.", audio_probability=0.04)).hold_ms
    assert held > 1000 > words
    # Both say done: the words' hold, and the audio model is named.
    done = detector.decide(TurnInput(words, "Thank you.", audio_probability=0.97))
    assert done.end and done.reason == "audio"
    # A finished-sounding voice never ends an unfinished clause sooner.
    assert not detector.decide(TurnInput(1000, "and the", audio_probability=1.0)).end


def test_no_punctuation_holds_longer_than_a_full_stop() -> None:
    detector = TurnDetector(SMART)
    open_hold = detector.decide(TurnInput(0, "And so my fellow Americans")).hold_ms
    assert open_hold > 900 > detector.decide(TurnInput(0, "My fellow Americans.")).hold_ms


def test_a_full_stop_counts_as_far_as_whisper_was_sure_of_it() -> None:
    closed = "He was not."
    assert text_completion(closed, END_MARK_SURE) == text_completion(closed) == 0.9
    assert text_completion(closed, 0.99) == 0.9
    assert text_completion(closed, END_MARK_UNSURE) == text_completion("He was not")
    assert text_completion(closed, 0.1) == text_completion("He was not")
    between = text_completion(closed, (END_MARK_SURE + END_MARK_UNSURE) / 2)
    assert text_completion("He was not") < between < 0.9
    assert text_completion("Can you hear me?", 0.6) < text_completion("Can you hear me?") == 0.95
    # The mark's probability speaks only of a mark: an unfinished clause stays unfinished.
    assert text_completion("I would like to book a table for the", 0.99) == 0.1
    assert text_completion("okay", 0.99) == text_completion("okay")


def test_a_fragment_whisper_closed_unsurely_is_held_over_a_pause() -> None:
    """How sure Whisper base was that "He was not" (cut where its pause began) and "He was not
    an ill disposed young man." end at their full stops, and "ASK WHAT YOU CAN DO FOR YOUR
    COUNTRY!" (the demo's): a 600 ms pause after the fragment no longer ends the turn, and the
    sentences are answered sooner than the fragment would be."""
    detector = TurnDetector(SMART)
    fragment = detector.decide(TurnInput(650, "He was not.", end_mark=0.79))
    assert not fragment.end and fragment.hold_ms > 1000
    sentence = detector.decide(TurnInput(0, "He was not an ill-disposed young man.", end_mark=0.88))
    assert sentence.hold_ms < fragment.hold_ms - 250
    shout = detector.decide(TurnInput(340, "ASK WHAT YOU CAN DO FOR YOUR COUNTRY!", end_mark=0.97))
    assert shout.end and shout.reason == "words"
    # Unreported (another engine, beam search), the full stop counts as before.
    assert detector.decide(TurnInput(340, "He was not.")).end


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


def test_without_the_words_the_audio_model_decides_alone() -> None:
    """words=False (the benchmark's audio-only variant): the model's probability is the turn's,
    an unfinished clause no longer holds it, and with no model the probability is 0.5."""
    detector = TurnDetector(replace(SMART, words=False))
    assert detector.probability("and the", 0.97) == 0.97
    assert detector.probability("Thank you.", 0.04) == 0.04
    assert detector.probability("Thank you.", None) == 0.5
    done = detector.decide(TurnInput(detector.hold_ms(0.97), "I was going to the", 0.97))
    assert done.end and done.reason == "audio"


def test_the_servers_words_setting_reaches_each_smart_call() -> None:
    """session.turns.words is the server's (the call's config has no such field)."""
    defaults = TurnsConfig(mode="smart", words=False)
    options = wire._turn_options(pb.TurnDetectionOptions(), defaults, VadConfig())
    assert options.mode == "smart" and options.words is False
    assert wire._turn_options(pb.TurnDetectionOptions(), TurnsConfig(), VadConfig()).words
