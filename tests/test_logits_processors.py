"""Each logits processor alone, on small hand-made logits (pure logic, no model).

A toy vocabulary keeps the expectations readable: ids 0-9 are text, 10 is <|endoftext|>, 11 is
<|notimestamps|>, 12.. are timestamps (one per 20 ms).
"""

from __future__ import annotations

import numpy as np
import pytest

from voxgate.engines.asr._phrases import MAX_BOOST, PhraseBoost, PhraseTree, parse_hotwords
from voxgate.engines.asr._processors import (
    HallucinationBias,
    RepetitionPenalty,
    SilenceAwareEnd,
    SuppressBlank,
    SuppressTokens,
    TimestampRules,
    hallucination_strength,
)

EOT, NO_TS, TS0 = 10, 11, 12
VOCAB = 12 + 200  # 200 timestamps = 4 s


def flat(rows: int = 1) -> np.ndarray:
    return np.zeros((rows, VOCAB), np.float32)


@pytest.mark.unit
def test_suppress_tokens_forbids_only_its_ids() -> None:
    x = flat(2)
    SuppressTokens.of([3, 5, 3]).apply(4, x, [[1], [2]])
    assert np.isneginf(x[:, [3, 5]]).all()
    assert np.isfinite(np.delete(x, [3, 5], axis=1)).all()


@pytest.mark.unit
def test_suppress_blank_acts_on_the_first_step_only() -> None:
    x = flat()
    SuppressBlank((0, EOT)).apply(1, x, [[4]])
    assert np.isfinite(x).all()
    SuppressBlank((0, EOT)).apply(0, x, [[]])
    assert np.isneginf(x[0, [0, EOT]]).all() and np.isfinite(x[0, 1])


@pytest.mark.unit
def test_repetition_penalty_lowers_seen_tokens_both_signs() -> None:
    x = flat()
    x[0, 2], x[0, 3], x[0, 4] = 2.0, -2.0, 2.0
    RepetitionPenalty(2.0).apply(2, x, [[2, 3]])
    assert x[0, 2] == 1.0 and x[0, 3] == -4.0 and x[0, 4] == 2.0


RULES = TimestampRules(EOT, NO_TS, TS0, VOCAB - 1, TS0 + 50)


@pytest.mark.unit
def test_timestamps_first_token_is_a_timestamp_within_max_initial() -> None:
    x = flat()
    RULES.apply(0, x, [[]])
    assert np.isneginf(x[0, :TS0]).all()
    assert np.isfinite(x[0, TS0 : TS0 + 51]).all() and np.isneginf(x[0, TS0 + 51 :]).all()


@pytest.mark.unit
def test_timestamps_pair_then_text_and_never_decrease() -> None:
    x = flat()
    x[0, 1] = 5.0  # text clearly wins, so the sum rule does not force a timestamp
    RULES.apply(3, x, [[TS0 + 5, 4, TS0 + 9]])  # an opening timestamp after text: close it
    assert np.isneginf(x[0, :EOT]).all(), "after a lone timestamp text is not allowed"
    y = flat()
    y[0, 1] = 5.0
    RULES.apply(4, y, [[TS0 + 5, 4, TS0 + 9, TS0 + 9]])  # a pair: next must be text
    assert np.isneginf(y[0, TS0:]).all() and np.isfinite(y[0, 1])
    z = flat()
    z[0, 1] = 5.0
    RULES.apply(2, z, [[TS0 + 5, 4]])
    assert np.isneginf(z[0, TS0 : TS0 + 5]).all() and np.isfinite(z[0, TS0 + 5])
    assert np.isneginf(z[0, NO_TS])


@pytest.mark.unit
def test_timestamps_forced_when_their_total_probability_beats_any_text_token() -> None:
    x = flat()  # 200 equal timestamps vs 10 equal text tokens: timestamps' sum wins
    RULES.apply(2, x, [[TS0, 3]])
    assert np.isneginf(x[0, :TS0]).all()


@pytest.mark.unit
def test_silence_end_pushes_eot_once_past_the_last_speech() -> None:
    proc = SilenceAwareEnd(EOT, TS0, speech_end_ms=1000, grace_ms=200)
    before = flat()
    proc.apply(3, before, [[TS0, 2, TS0 + 50]])  # last timestamp 1.0 s < 1.2 s
    assert not before.any()
    after = flat()
    proc.apply(3, after, [[TS0, 2, TS0 + 60]])  # 1.2 s: past speech end + grace
    assert after[0, EOT] == pytest.approx(4.0) and after[0, 3] == pytest.approx(-8.0)
    assert after[0, TS0 + 70] == 0.0, "timestamps themselves are not pushed"


@pytest.mark.unit
def test_silence_end_forbids_timestamps_inside_long_silences_only() -> None:
    proc = SilenceAwareEnd(EOT, TS0, speech_end_ms=4000, silences=((1000, 2500), (3000, 3500)))
    x = flat()
    proc.apply(1, x, [[TS0]])
    inside = np.isneginf(x[0, TS0:])
    # (1000, 2500) is long: 1.2 s .. 2.3 s forbidden, the edges (speech on/offsets) allowed.
    assert inside[(1200 // 20) + 1 : 2300 // 20].all()
    assert not inside[1000 // 20] and not inside[2500 // 20]
    # (3000, 3500) is shorter than min_silence_ms: untouched.
    assert not inside[3000 // 20 : 3500 // 20].any()


@pytest.mark.unit
def test_hallucination_strength_follows_the_statistics() -> None:
    clear = hallucination_strength(0.9, -20.0, 0.01)
    sparse = hallucination_strength(0.1, -20.0, 0.01)
    faint = hallucination_strength(0.9, -58.0, 0.01)
    likely_silence = hallucination_strength(0.9, -20.0, 0.9)
    assert clear == 0.0
    assert sparse > 0.7 and faint == 1.0 and likely_silence == 1.0
    assert hallucination_strength(0.9, -20.0, float("nan")) == 0.0


@pytest.mark.unit
def test_hallucination_bias_acts_on_the_first_text_token_per_row() -> None:
    proc = HallucinationBias(np.array([4, 6]), 3.0, TS0)
    x = flat(2)
    proc.apply(1, x, [[TS0], [TS0, 2]])  # row 0 has no text yet, row 1 has
    assert x[0, 4] == -3.0 and x[0, 6] == -3.0 and x[0, 5] == 0.0
    assert not x[1].any()
    y = flat()
    HallucinationBias(np.array([4]), 0.0, TS0).apply(0, y, [[]])
    assert not y.any()


@pytest.mark.unit
def test_parse_hotwords_syntax() -> None:
    words, phrases = parse_hotwords(["voxgate^6", " Oyelaran ^ 2.5", "plain", "big^99", "zero^0"])
    assert words == ("voxgate", "Oyelaran ^ 2.5", "plain", "big", "zero")
    assert phrases == (("voxgate", 6.0), ("big", MAX_BOOST))


# Toy encoder: " ab" -> [1, 2], " Ab" -> [5, 2], " cd" -> [3, 4]
_TOY = {" ab": [1, 2], " Ab": [5, 2], " cd": [3, 4], " Cd": [6, 4]}


def toy_tree(boost: float = 4.0) -> PhraseTree:
    return PhraseTree([("ab", boost), ("cd", 2.0)], lambda t: _TOY[t])


@pytest.mark.unit
def test_phrase_tree_starts_and_continuations() -> None:
    tree = toy_tree()
    assert tree.next_boosts([]) == {1: 2.0, 5: 2.0, 3: 1.0, 6: 1.0}
    after_start = tree.next_boosts([7, 1])
    assert after_start[2] == 4.0, "the continuation gets the full boost"
    assert 1 not in tree.next_boosts([1, 2]), "a phrase already said is not started again"
    assert 3 in tree.next_boosts([1, 2])


@pytest.mark.unit
def test_phrase_boost_only_lifts_plausible_tokens() -> None:
    proc = PhraseBoost(toy_tree(), EOT, floor=-8.0)
    x = flat(2)
    x[:, 0] = 20.0  # the audio says token 0 very clearly
    x[0, 2] = 15.0  # row 0: the continuation is plausible (-5 nats)
    proc.apply(2, x, [[1], [1]])
    assert x[0, 2] == pytest.approx(19.0)
    assert x[1, 2] == 0.0, "-20 nats is below the floor: no boost, the phrase is not forced"
    assert x[0, 0] == 20.0


@pytest.mark.unit
def test_phrase_boost_skips_timestamps_when_locating_the_phrase() -> None:
    proc = PhraseBoost(toy_tree(), EOT, floor=-100.0)
    x = flat()
    proc.apply(3, x, [[TS0, 1, TS0 + 3]])
    assert x[0, 2] == 4.0


@pytest.mark.unit
def test_phrase_start_needs_a_stricter_floor_than_a_continuation() -> None:
    proc = PhraseBoost(toy_tree(), EOT, floor=-8.0, start_floor=-2.0)
    x = flat(2)
    x[:, 0] = 10.0
    x[:, 1] = 5.0  # a phrase start at about -5 nats: below the start floor
    x[:, 2] = 5.0  # the continuation of " ab" at about -5 nats: above the floor
    proc.apply(1, x, [[7], [1]])
    assert x[0, 1] == 5.0, "an implausible first piece is not boosted"
    assert x[1, 2] == pytest.approx(9.0), "a continuation within the floor is"


@pytest.mark.unit
def test_a_transcript_of_only_hotwords_on_silent_looking_audio_is_recited() -> None:
    from voxgate.engines.asr._jobs import Attempt as _Attempt
    from voxgate.engines.asr._whisper import WhisperEngine

    silent = _Attempt(1000, "en", 0.0, [], no_speech_prob=0.6, degenerate=False)
    clear = _Attempt(1000, "en", 0.0, [], no_speech_prob=0.05, degenerate=False)
    hot = ("Kowalczyk^6", "voxgate")
    assert WhisperEngine._recites_hotwords("Kowalczyk,", hot, silent)
    assert not WhisperEngine._recites_hotwords("Kowalczyk,", hot, clear)
    assert not WhisperEngine._recites_hotwords("Call Kowalczyk.", hot, silent)
    assert not WhisperEngine._recites_hotwords("Kowalczyk", (), silent)
