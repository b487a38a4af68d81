"""Whisper's probability of the full stop that ends a final, and the turn detector reading it.

Whisper closes a fragment that a pause cut off ("He was not." of "he was not an ill disposed
young man") with a full stop as readily as a finished sentence, but less surely; the engine
reports that probability (``AsrResult.end_mark_probability``) and the turn holds a fragment
it was unsure of over the pause (docs/turns.md).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
from conftest import read_wav_int16

from voxgate.engines.asr._jobs import end_mark_probability, is_end_mark
from voxgate.engines.asr.base import AsrOptions, AsrRequest
from voxgate.gateway.call.turn_taking import Turn
from voxgate.gateway.turns import TurnDetector, TurnInput, TurnOptions

EOT = 100
DOT, QUESTION = 13, 30
MARKS = (DOT, QUESTION)


def scores(chosen: dict[int, float], size: int = 120) -> np.ndarray:
    """Log-probabilities over a toy vocabulary: ``chosen`` token -> probability, rest spread."""
    p = np.full(size, (1.0 - sum(chosen.values())) / (size - len(chosen)))
    for token, prob in chosen.items():
        p[token] = prob
    logp: np.ndarray = np.log(p)
    return logp


@pytest.mark.unit
def test_the_marks_probability_is_read_where_the_closing_mark_was_chosen() -> None:
    ids = [5, 7, DOT, EOT]
    closing = scores({DOT: 0.5, QUESTION: 0.1, EOT: 0.2, 8: 0.15})  # 8: a comma, say
    steps = [scores({5: 0.9}), scores({7: 0.8}), closing, scores({})]
    got = end_mark_probability(ids, steps, MARKS, EOT)
    # Either mark, or ending there without one; the comma and the rest go on.
    spread = (1.0 - 0.95) / (120 - 4)
    assert got == pytest.approx(0.8) and got is not None
    assert 1.0 - got == pytest.approx(0.15 + spread * (120 - 4))


@pytest.mark.unit
@pytest.mark.parametrize(
    ("token", "closes"),
    [(".", True), (" ?", True), ("!!", True), ('."', True), (").", True), ("?!", True)]
    + [("...", False), ("..", False), (",", False), (" and", False), ('"', False), ("", False)],
)
def test_what_closes_a_sentence(token: str, closes: bool) -> None:
    assert is_end_mark(token) is closes


@pytest.mark.unit
def test_no_closing_mark_or_no_scores_reports_nothing() -> None:
    steps = [scores({5: 0.9}), scores({7: 0.8}), scores({})]
    assert end_mark_probability([5, 7, EOT], steps, MARKS, EOT) is None  # ends on a word
    assert end_mark_probability([EOT], [scores({})], MARKS, EOT) is None  # no text
    assert end_mark_probability([5, DOT], steps[:1], MARKS, EOT) is None  # no score for it

    class Empty:
        """What beam search leaves in CTranslate2's per-step scores: an empty StorageView."""

        def __array__(self, *args: Any, **kwargs: Any) -> np.ndarray:
            raise ValueError("data is NULL")

    assert end_mark_probability([5, DOT], [Empty(), Empty()], MARKS, EOT) is None


@pytest.mark.unit
def test_the_turn_reads_the_mark_of_its_last_final_with_text() -> None:
    turn = Turn(0, 0)
    turn.texts.update({0: "He was not.", 1: "an ill disposed young man.", 2: ""})
    turn.end_marks.update({0: 0.6, 1: 0.9})
    assert turn.end_mark() == 0.9
    del turn.end_marks[1]
    assert turn.end_mark() is None  # its last final reported none: the words' own rule
    assert Turn(1, 3).end_mark() is None


@pytest.mark.model
def test_whisper_is_less_sure_of_a_fragments_full_stop_and_the_turn_holds_it(
    speech_dir: Path,
) -> None:
    """The real model on "he was not an ill disposed young man", whole and cut where the
    benchmark's pause goes in (after "he was not", 200 ms of its quiet kept, as the final
    decode starts): Whisper is less sure that the fragment ends at its full stop, and the turn
    outlasts a 600 ms pause (the hangover's) after the fragment and holds the whole sentence's
    end less.

    How much less depends on the CPU: CTranslate2's int8 arithmetic is MKL's on an Intel CPU
    and oneDNN's on an AMD one, and the probabilities differ. On an Intel Xeon 0.79 against
    0.88 (the sentence's end held 770 ms against the fragment's 1,240); on an AMD EPYC (Zen 3)
    0.82 against 0.84 (1,022 against 1,140). So the direction is asserted, not a margin
    that one CPU's numbers set (a 0.05 margin failed on the AMD machine)."""
    from benchmarks.turn_taking import last_word_ms, splice_pause  # noqa: PLC0415
    from voxgate.engines.asr._whisper import WhisperEngine  # noqa: PLC0415
    from voxgate.gateway.testing.signals import stats_for  # noqa: PLC0415

    pcm, _ = read_wav_int16(speech_dir / "librivox_sense_and_sensibility_01_0880.wav")
    spliced = splice_pause(pcm, 600)
    assert spliced is not None
    pause_start_ms = spliced[1] - 600
    cuts = {
        "fragment": spliced[0][: (pause_start_ms + 200) * 16],
        "sentence": pcm[: (last_word_ms(pcm) + 200) * 16],
    }
    eng = WhisperEngine.load(None)
    try:
        got = {}
        for name, cut in cuts.items():
            audio = cut.astype(np.float32) / 32768.0
            req = AsrRequest(audio, stats_for(audio), AsrOptions(end_mark=True))
            got[name] = eng.infer_batch([req])[0]
            plain = eng.infer_batch([AsrRequest(audio, stats_for(audio), AsrOptions())])[0]
            assert plain.end_mark_probability is None and plain.text == got[name].text
    finally:
        eng.close()
    fragment, sentence = got["fragment"], got["sentence"]
    assert fragment.text.lower() == "he was not." and sentence.text.endswith(".")
    assert fragment.end_mark_probability is not None and sentence.end_mark_probability is not None
    assert sentence.end_mark_probability > fragment.end_mark_probability
    detector = TurnDetector(TurnOptions(mode="smart"))
    held = detector.decide(TurnInput(650, fragment.text, None, fragment.end_mark_probability))
    assert not held.end and held.hold_ms > 900
    ended = detector.decide(TurnInput(0, sentence.text, None, sentence.end_mark_probability))
    assert ended.hold_ms < held.hold_ms
